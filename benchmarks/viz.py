"""Time to build a timeline figure, for a typical and a 100 000-op program.

Run: python benchmarks/viz.py

For each case prints: ops; ``timeline`` = building the whole figure (op boxes, labels,
memory steps, layout; target under 2 s at 100 000 ops); ``cds`` = the baseline, building
one ColumnDataSource from the events frame's columns and nothing else (a floor no
figure can beat); ``ratio`` = timeline / cds; ``bare`` = one figure with one quad
renderer from that source (a bare Gantt, no colours, labels, hover or memory);
``loop`` = the obvious per-op Python
loop that builds the box columns row by row (what the vectorised code avoids); and
``html`` = writing the standalone page (serialising the data, inline JS), with its size.
``browser s`` = opening that page in headless Chromium until Bokeh reports the render
done, with the default WebGL backend and with ``backend="canvas"``, when Chromium and
Selenium are installed. Headless Chromium has no GPU: its WebGL is software
(SwiftShader), far slower than WebGL on a real GPU, so read the WebGL figure as a worst case.
Best of 3 runs each (1 for the loop, html and browser), all in the same process.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

from bokeh.models import ColumnDataSource
from bokeh.plotting import figure

from sapptk import viz
from sapptk.schedules import build
from sapptk.simulation import simulate

warnings.filterwarnings("ignore", category=DeprecationWarning)


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def cds_only(events) -> ColumnDataSource:
    return ColumnDataSource({c: events[c].to_numpy() for c in events.columns})


def bare_gantt(events) -> figure:
    """Second baseline: one figure with one quad renderer straight from the events."""
    fig = figure(output_backend="webgl")
    src = cds_only(events)
    src.data["top"] = src.data["device"] - 0.4
    src.data["bottom"] = src.data["device"] + 0.4
    fig.quad(left="start_ms", right="end_ms", top="top", bottom="bottom", source=src)
    return fig


def per_op_loop(events) -> ColumnDataSource:
    """Baseline: the box columns built with a Python loop over the ops."""
    cols: dict[str, list] = {k: [] for k in ("left", "right", "top", "bottom", "color", "kind", "mb")}
    for row in events.itertuples(index=False):
        cols["left"].append(row.start_ms)
        cols["right"].append(row.end_ms)
        cols["top"].append(row.device - 0.4)
        cols["bottom"].append(row.device + 0.4)
        cols["color"].append(viz.CATEGORY_COLORS["forward" if row.kind == "F" else "backward"])
        cols["kind"].append(str(row.kind))
        cols["mb"].append(row.micro_batch)
    return ColumnDataSource(cols)


def browser_render(path: Path) -> float | None:
    """Seconds from navigation to Bokeh's idle signal in headless Chromium, or None."""
    try:
        from bokeh.io.export import wait_until_render_complete

        drv = viz.chromium_driver()
    except Exception:
        return None
    try:
        t = time.perf_counter()
        drv.get(path.resolve().as_uri())
        wait_until_render_complete(drv, 120)
        return time.perf_counter() - t
    finally:
        viz._quit(drv)


def main() -> None:
    cases = [("interleaved", 16, 32, 2), ("interleaved", 16, 1600, 2), ("1f1b", 8, 6250, 1)]
    print(f"{'case':<30} {'ops':>8} {'timeline s':>11} {'cds s':>8} {'ratio':>6} {'bare s':>7} {'loop s':>8} "
          f"{'html s':>7} {'html MB':>8} {'browser s webgl/canvas':>23}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, p, m, v in cases:
            sim = simulate(build(name, stages=p, micro_batches=m, chunks=v), forward=1.0, backward=2.0, activation=10.0)
            n = len(sim.events)
            t_fig = best_of(lambda sim=sim: viz.timeline(sim, budget=100.0))
            t_cds = best_of(lambda sim=sim: cds_only(sim.events))
            t_bare = best_of(lambda sim=sim: bare_gantt(sim.events))
            t_loop = best_of(lambda sim=sim: per_op_loop(sim.events), repeat=1)
            fig = viz.timeline(sim, budget=100.0)
            path = Path(tmp) / "t.html"
            canvas_path = viz.save_html(viz.timeline(sim, budget=100.0, backend="canvas"), Path(tmp) / "c.html")
            t_html = best_of(lambda fig=fig, path=path: viz.save_html(fig, path), repeat=1)
            size = path.stat().st_size / 1e6
            shown, shown_canvas = browser_render(path), browser_render(canvas_path)
            browser = "n/a" if shown is None else f"{shown:.1f}/{shown_canvas:.1f}"
            label = f"{name} p={p} v={v} m={m}"
            print(f"{label:<30} {n:>8} {t_fig:>11.3f} {t_cds:>8.4f} {t_fig / t_cds:>6.0f} {t_bare:>7.3f} "
                  f"{t_loop:>8.3f} {t_html:>7.2f} {size:>8.1f} {browser:>23}")


if __name__ == "__main__":
    main()

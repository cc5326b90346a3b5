"""How long figures take to build, as ratios against baselines timed in the same run.

Run: python benchmarks/viz.py [--no-browser]

1. The Explorer's figures, for llama2_70b, interleaved p = 16, v = 2, m = 32, 56000 MB:
   the timeline tab (the plan and the even split on one time scale, memory below) and the
   memory & time tab, each wrapped in the ``jupyter_bokeh`` widget that carries it to the
   notebook. ``before`` is the builder of the figures as they were before the
   ``sapptk/viz/`` package (frozen in ``benchmarks/viz_before.py``: one renderer and one
   source per device for memory, separate label sources, a figure per simulation),
   ``after`` what ``sapptk.viz`` builds now, ``after, timeline tab`` the part the Explorer
   draws before its status line (it draws the other tab when opened), and ``explorer`` the
   time the Explorer itself spends between the plan and its status line
   (``Explorer.draw_seconds``, the search replaced by a plan made beforehand). Ratios are
   before / after, of wall time and of CPU time (CPU time suffers less from machine load).
2. A timeline for a typical and two 100 000-op programs: ``timeline`` = building the whole
   figure; ``bare`` = the baseline, one figure with one quad renderer straight from the
   events frame (no colours, labels, hover or memory); ``ratio`` = timeline / bare;
   ``loop`` = the obvious per-op Python loop building the box columns row by row (what the
   vectorised code avoids); ``html`` = writing the standalone page, with its size.
3. With Chromium and Selenium installed (and without ``--no-browser``): seconds from
   opening the standalone page in headless Chromium to Bokeh's idle signal, for the
   Explorer's figures before and after, and for each timeline with WebGL and with the
   canvas. Headless Chromium has no GPU (its WebGL is software), so read WebGL as a worst
   case; the page includes parsing BokehJS itself (about 1.5 MB of inline JS).

Best of 5 runs for the figures (before and after alternate, so machine load falls on
both alike), best of 3 for the timelines, 1 for the loop, the pages and the browser.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import warnings
from pathlib import Path

from bokeh.layouts import column
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure

from sapptk import viz
from sapptk.config import PipelineConfig
from sapptk.plan import even_split, make_plan
from sapptk.profile import bundled_profile
from sapptk.schedules import build
from sapptk.simulation import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import viz_before  # noqa: E402  (the frozen baseline next to this script)

warnings.filterwarnings("ignore", category=DeprecationWarning)


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


# ------------------------------------------------------------------ the Explorer
def explorer_case():
    profile = bundled_profile("llama2_70b")
    config = PipelineConfig(16, 32, chunks=2, schedule="interleaved", memory_budget=56000)
    split = even_split(profile, config, "select")
    plan = make_plan(profile, config, split.counts, status="optimal", step_time=split.step_time,
                     bound=split.step_time, gap=0.0)
    baseline = even_split(profile, config, "auto")
    plan.simulation, baseline.simulation, plan.devices  # noqa: B018  (computed before timing)
    return profile, config, plan, baseline


def widget(fig):
    from jupyter_bokeh.widgets import BokehModel

    return BokehModel(fig)


def figures_before(plan, baseline, *, wrap: bool = True):
    tl = viz_before.compare(plan.simulation, baseline.simulation, labels=["balanced plan", "even split"],
                            budget=plan.config.memory_budget, memory=True, width=940)
    bars = viz_before.stage_bars(plan, width=860)
    return (widget(tl), widget(bars)) if wrap else (tl, bars)


def figures_after(plan, baseline, *, wrap: bool = True):
    tl = viz.compare(plan, baseline, labels=["balanced plan", "even split"], memory=True, width=940)
    bars = viz.stage_bars(plan, width=860)
    return (widget(tl), widget(bars)) if wrap else (tl, bars)


def explorer_draw_seconds(profile, config, plan) -> float:
    """The Explorer's own time from the plan to its status line (search replaced)."""
    import sapptk.balancer as balancer
    from sapptk.explorer import Explorer

    real = balancer.solve
    balancer.solve = lambda request: plan
    try:
        times = []
        for _ in range(5):
            ex = Explorer(profile, config)
            gc.collect()
            ex.solve()
            times.append(ex.draw_seconds)
        return min(times)
    finally:
        balancer.solve = real


def models(layouts) -> int:
    return sum(len(list(x.references())) for x in layouts)


def timeline_tab_after(plan, baseline, *, wrap: bool = True):
    tl = viz.compare(plan, baseline, labels=["balanced plan", "even split"], memory=True, width=940)
    return (widget(tl),) if wrap else (tl,)


def explorer_section(browser: bool, tmp: Path) -> None:
    profile, config, plan, baseline = explorer_case()
    builders = {"before": figures_before, "after": figures_after, "after, timeline tab": timeline_tab_after}
    for fn in builders.values():
        fn(plan, baseline)  # warm up imports
    wall: dict[str, list[float]] = {k: [] for k in builders}
    cpu: dict[str, list[float]] = {k: [] for k in builders}
    for _ in range(5):
        for name, fn in builders.items():
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fn(plan, baseline)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    drawn = explorer_draw_seconds(profile, config, plan)
    print("Explorer figures, llama2_70b interleaved p=16 v=2 m=32, each figure wrapped in its widget")
    print("(before and after: the timeline tab and the memory & time tab; the Explorer now draws the")
    print(" second when it is opened, so only the timeline tab stands between the plan and the status)")
    print(f"{'':<20} {'best s':>8} {'median s':>9} {'CPU s':>7} {'Bokeh models':>13}")
    for name, fn in builders.items():
        n = models(fn(plan, baseline, wrap=False))
        print(f"{name:<20} {min(wall[name]):>8.3f} {sorted(wall[name])[2]:>9.3f} {min(cpu[name]):>7.3f} {n:>13}")
    print(f"{'explorer':<20} {drawn:>8.3f}   (Explorer.draw_seconds, plan to status line, best of 5)")
    for name in ("after", "after, timeline tab"):
        print(f"ratio before / {name}: {min(wall['before']) / min(wall[name]):.1f}x wall (best), "
              f"{sorted(wall['before'])[2] / sorted(wall[name])[2]:.1f}x (median), "
              f"{min(cpu['before']) / min(cpu[name]):.1f}x CPU")
    if browser:
        shown = []
        for name, fn in (("before", figures_before), ("after", figures_after)):
            page = viz.save_html(column(*fn(plan, baseline, wrap=False)), tmp / f"explorer_{name}.html")
            shown.append(browser_render(page))
        if shown[0] is not None and shown[1] is not None:
            print(f"browser (both tabs on one page): rendered in {shown[0]:.1f} s before, {shown[1]:.1f} s after")
    print()


# ------------------------------------------------------------------ timelines
def cds_only(events) -> ColumnDataSource:
    return ColumnDataSource({c: events[c].to_numpy() for c in events.columns})


def bare_gantt(events) -> figure:
    """The baseline: one figure with one quad renderer straight from the events."""
    fig = figure(output_backend="webgl")
    src = cds_only(events)
    src.data["top"] = src.data["device"] - 0.4
    src.data["bottom"] = src.data["device"] + 0.4
    fig.quad(left="start_ms", right="end_ms", top="top", bottom="bottom", source=src)
    return fig


def per_op_loop(events) -> ColumnDataSource:
    """The box columns built with a Python loop over the ops (what the vectorised code avoids)."""
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
        viz.close_driver(drv)


def timeline_section(browser: bool, tmp: Path) -> None:
    cases = [("interleaved", 16, 32, 2), ("interleaved", 16, 1600, 2), ("1f1b", 8, 6250, 1)]
    print("Timelines (budget line, memory pane)")
    print(f"{'case':<30} {'ops':>8} {'timeline s':>11} {'bare s':>7} {'ratio':>6} {'loop s':>8} "
          f"{'html s':>7} {'html MB':>8} {'browser s webgl/canvas':>23}")
    for name, p, m, v in cases:
        sim = simulate(build(name, stages=p, micro_batches=m, chunks=v), forward=1.0, backward=2.0, activation=10.0)
        n = len(sim.events)
        t_fig = best_of(lambda sim=sim: viz.timeline(sim, budget=100.0))
        t_bare = best_of(lambda sim=sim: bare_gantt(sim.events))
        t_loop = best_of(lambda sim=sim: per_op_loop(sim.events), repeat=1)
        fig = viz.timeline(sim, budget=100.0)
        path = tmp / "t.html"
        t_html = best_of(lambda fig=fig, path=path: viz.save_html(fig, path), repeat=1)
        size = path.stat().st_size / 1e6
        browser_text = "n/a"
        if browser:
            canvas = viz.save_html(viz.timeline(sim, budget=100.0, backend="canvas"), tmp / "c.html")
            shown, shown_canvas = browser_render(path), browser_render(canvas)
            if shown is not None and shown_canvas is not None:
                browser_text = f"{shown:.1f}/{shown_canvas:.1f}"
        label = f"{name} p={p} v={v} m={m}"
        print(f"{label:<30} {n:>8} {t_fig:>11.3f} {t_bare:>7.3f} {t_fig / t_bare:>6.1f} {t_loop:>8.3f} "
              f"{t_html:>7.2f} {size:>8.1f} {browser_text:>23}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-browser", action="store_true", help="skip the headless Chromium timings")
    args = parser.parse_args()
    browser = not args.no_browser and viz.find_chromium() is not None
    with tempfile.TemporaryDirectory() as tmp:
        explorer_section(browser, Path(tmp))
        timeline_section(browser, Path(tmp))


if __name__ == "__main__":
    main()

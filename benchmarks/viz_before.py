"""The figure builders of ``sapptk.viz`` as they were before the ``sapptk/viz/`` package
(commit fc5427b), frozen here as the baseline of ``benchmarks/viz.py``.

Only what the Explorer drew is kept: :func:`compare` (Gantt rows, one step renderer and
one source per device for memory, a separate label source) and :func:`stage_bars`. It is
not part of the package and nothing imports it but the benchmark.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from bokeh.layouts import gridplot, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    FixedTicker,
    HoverTool,
    Label,
    Legend,
    LegendItem,
    NumeralTickFormatter,
    Range1d,
    Span,
)
from bokeh.palettes import Category10_10, Turbo256
from bokeh.plotting import figure

if TYPE_CHECKING:
    from bokeh.models import UIElement

__all__ = ["compare", "stage_bars", "timeline"]

#: Box colour of each op category; later chunks are drawn lighter.
CATEGORY_COLORS: dict[str, str] = {
    "forward": "#3a6ea5",
    "backward": "#d1495b",
    "input-gradient": "#ee8434",
    "weight-gradient": "#3e9b5f",
    "overlapped": "#7b4fa0",
}
_CATEGORIES = tuple(CATEGORY_COLORS)
_KIND_CATEGORY = {"F": 0, "B": 1, "I": 2, "W": 3}  # op kind -> index into _CATEGORIES
_OVERLAPPED = 4

_TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
_WIDTH = 1100
_ROW_PX = 26
_LABEL_PX_PER_CHAR = 7.0
_MAX_LABELS = 4000


# ----------------------------------------------------------------- colours
def _hex_to_rgb(color: str) -> np.ndarray:
    color = color.lstrip("#")
    return np.array([int(color[i : i + 2], 16) for i in (0, 2, 4)], dtype=float)


def _shades(color: str, n: int) -> list[str]:
    """``n`` shades of ``color``: the colour itself, then lighter towards white."""
    rgb = _hex_to_rgb(color)
    out = []
    for c in range(n):
        t = 0.0 if n == 1 else 0.6 * c / (n - 1)
        mixed = np.rint(rgb + (255.0 - rgb) * t).astype(int)
        out.append("#{:02x}{:02x}{:02x}".format(*mixed))
    return out


def _text_color(fill: str) -> str:
    """White on dark fills, near-black on light ones."""
    r, g, b = _hex_to_rgb(fill)
    return "#1a1a1a" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def _device_colors(n: int) -> list[str]:
    if n <= len(Category10_10):
        return list(Category10_10[:n])
    idx = np.linspace(20, 235, n).astype(int)
    return [Turbo256[i] for i in idx]


# ------------------------------------------------------------------ sources
def _fmt_ms(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f} ms"
    return f"{value:,.1f} ms" if value >= 10 else f"{value:.3g} ms"


def _time_axis(fig: figure) -> None:
    fig.xaxis.formatter = NumeralTickFormatter(format="0,0.[000]")


def _sim_title(sim: Any, label: str | None = None) -> str:
    pr = sim.program
    parts = [pr.name, f"p={pr.stages}", f"v={pr.chunks}", f"m={pr.micro_batches}"]
    if pr.splits > 1:
        parts.append(f"k={pr.splits}")
    head = " ".join(parts)
    if label and label != pr.name:
        head = f"{label}: {head}"
    return (
        f"{head} | step time {_fmt_ms(sim.step_time)} | "
        f"bubble {sim.bubble.of_compute:.1%} of compute ({sim.bubble.of_step:.1%} of step)"
    )


def op_source(events: pd.DataFrame, chunks: int | None = None) -> ColumnDataSource:
    """The box data of a timeline: one row per op of ``events`` (``Simulation.events``).

    Columns: the event columns, plus ``category`` (forward, backward, input-gradient,
    weight-gradient, or overlapped for ops of a unit of two or more ops), ``color``,
    ``duration_ms``, ``lower`` and ``upper`` (row extent: device ± 0.4, split into strips
    for overlapped ops) and ``kind_name``.
    """
    ev = events
    n = len(ev)
    kind = ev["kind"].astype(str).to_numpy()
    kind_codes = pd.Series(kind).map(_KIND_CATEGORY).to_numpy(dtype=np.int64) if n else np.zeros(0, np.int64)
    unit = ev["unit"].to_numpy()
    # ops per unit and each op's rank inside its unit (its strip of the row)
    by_unit = pd.Series(unit).groupby(unit, sort=False)
    size = by_unit.transform("size").to_numpy(dtype=np.int64)
    rank = by_unit.cumcount().to_numpy(dtype=np.int64)
    category = np.where(size > 1, _OVERLAPPED, kind_codes)
    chunk = ev["chunk"].to_numpy(dtype=np.int64)
    v = int(chunks if chunks is not None else (chunk.max() + 1 if n else 1))
    table = np.array([_shades(CATEGORY_COLORS[c], max(v, 1)) for c in _CATEGORIES], dtype=object)
    text_table = np.vectorize(_text_color, otypes=[object])(table)
    device = ev["device"].to_numpy(dtype=np.int64)
    height = 0.8 / size
    lower = device - 0.4 + height * rank
    start = ev["start_ms"].to_numpy(dtype=float)
    end = ev["end_ms"].to_numpy(dtype=float)
    names = np.array(["F", "B", "I", "W"], dtype=object)
    kind_names = np.array(["forward", "backward", "input-gradient", "weight-gradient"], dtype=object)
    data = {
        "device": device,
        "kind": names[kind_codes] if n else np.zeros(0, object),
        "kind_name": kind_names[kind_codes] if n else np.zeros(0, object),
        "category": np.asarray(_CATEGORIES, dtype=object)[category] if n else np.zeros(0, object),
        "micro_batch": ev["micro_batch"].to_numpy(dtype=np.int64),
        "virtual_stage": ev["virtual_stage"].to_numpy(dtype=np.int64),
        "chunk": chunk,
        "slice": ev["slice"].to_numpy(dtype=np.int64),
        "unit": unit,
        "start_ms": start,
        "end_ms": end,
        "duration_ms": end - start,
        "lower": lower,
        "upper": lower + height,
        "color": table[category, np.minimum(chunk, v - 1)] if n else np.zeros(0, object),
        "text_color": text_table[category, np.minimum(chunk, v - 1)] if n else np.zeros(0, object),
    }
    return ColumnDataSource(data)


_LABELS_JS = """
const d = ops.data
const xs = x_range.start, xe = x_range.end
const width = fig.inner_width > 0 ? fig.inner_width : fallback_width
const ppm = width / Math.max(xe - xs, 1e-12)
const start = d.start_ms, end = d.end_ms, lo = d.lower, up = d.upper, mb = d.micro_batch, tc = d.text_color
const x = [], y = [], text = [], text_color = []
for (let i = 0; i < start.length; i++) {
  if (end[i] <= xs || start[i] >= xe || up[i] - lo[i] < 0.39) continue
  const s = Math.max(start[i], xs), e = Math.min(end[i], xe)
  const t = String(mb[i])
  if ((e - s) * ppm < t.length * char_px + 4) continue
  x.push((s + e) / 2); y.push((lo[i] + up[i]) / 2); text.push(t); text_color.push(tc[i])
  if (x.length > max_labels) { x.length = 0; y.length = 0; text.length = 0; text_color.length = 0; break }
}
labels.data = {x, y, text, text_color}
"""


def _label_source(src: ColumnDataSource, px_per_ms: float) -> ColumnDataSource:
    """Micro-batch numbers for boxes wide enough (at the initial zoom) to hold them."""
    d = src.data
    mb = np.asarray(d["micro_batch"])
    n = len(mb)
    if n == 0:
        return ColumnDataSource({"x": [], "y": [], "text": [], "text_color": []})
    digits = np.floor(np.log10(np.maximum(mb, 1))).astype(int) + 1
    width_px = np.asarray(d["duration_ms"]) * px_per_ms
    lower, upper = np.asarray(d["lower"]), np.asarray(d["upper"])
    ok = (width_px >= digits * _LABEL_PX_PER_CHAR + 4) & (upper - lower >= 0.39)
    idx = np.flatnonzero(ok)
    if len(idx) > _MAX_LABELS:
        idx = np.array([], dtype=np.int64)
    start, end = np.asarray(d["start_ms"])[idx], np.asarray(d["end_ms"])[idx]
    return ColumnDataSource(
        {
            "x": (start + end) / 2,
            "y": (lower[idx] + upper[idx]) / 2,
            "text": mb[idx].astype(str).astype(object),
            "text_color": np.asarray(d["text_color"], dtype=object)[idx],
        }
    )


# ------------------------------------------------------------------ figures
def _gantt(
    sim: Any, x_range: Range1d, title: str, width: int, *, legend: bool = True, x_axis: bool = True,
    backend: str = "webgl",
) -> figure:
    pr = sim.program
    p = pr.stages
    chunks = int(pr.chunks)
    src = op_source(sim.events, chunks)
    fig = figure(
        title=title,
        width=width,
        frame_height=_ROW_PX * max(p, 3),
        x_range=x_range,
        y_range=Range1d(p - 0.5, -0.5, bounds="auto"),
        tools=_TOOLS,
        active_scroll="xwheel_zoom",
        output_backend=backend,
        x_axis_label="time (ms)" if x_axis else None,
        y_axis_label="device",
    )
    usable_px = max(width - 120, 100)
    span = float(x_range.end - x_range.start) or 1.0
    widths = np.asarray(src.data["duration_ms"]) * usable_px / span
    outline = bool(len(widths)) and float(np.median(widths)) >= 4.0  # thin boxes: no white border to wash them out
    boxes = fig.quad(
        left="start_ms",
        right="end_ms",
        top="lower",
        bottom="upper",
        source=src,
        fill_color="color",
        line_color="white" if outline else None,
        line_width=0.5,
        hover_line_color="black",
        hover_line_width=1.5,
        name="ops",
    )
    fig.add_tools(
        HoverTool(
            renderers=[boxes],
            tooltips=[
                ("device", "@device"),
                ("kind", "@kind_name (@kind)"),
                ("micro-batch", "@micro_batch"),
                ("virtual stage", "@virtual_stage (chunk @chunk)"),
                ("slice", "@slice"),
                ("start", "@start_ms{0,0.000} ms"),
                ("end", "@end_ms{0,0.000} ms"),
                ("duration", "@duration_ms{0,0.000} ms"),
            ],
        )
    )
    labels = _label_source(src, usable_px / span)
    update = CustomJS(
        args={"ops": src, "labels": labels, "x_range": x_range, "fig": fig, "fallback_width": usable_px,
              "char_px": _LABEL_PX_PER_CHAR, "max_labels": _MAX_LABELS},
        code=_LABELS_JS,
    )
    x_range.js_on_change("start", update)
    x_range.js_on_change("end", update)
    fig.text(
        x="x",
        y="y",
        text="text",
        source=labels,
        text_align="center",
        text_baseline="middle",
        text_font_size="8pt",
        text_color="text_color",
        name="labels",
    )
    fig.yaxis.ticker = FixedTicker(ticks=list(range(p)))
    fig.ygrid.grid_line_color = None
    fig.xaxis.visible = x_axis
    if legend and len(src.data["category"]):
        fig.add_layout(_kind_legend(boxes, src, chunks), "above")
    fig.title.text_font_size = "11pt"
    fig.toolbar.logo = None
    _time_axis(fig)
    return fig


def _kind_legend(boxes: Any, src: ColumnDataSource, chunks: int) -> Legend:
    """One swatch per op category present (chunk 0 colour), plus one for later chunks."""
    frame = pd.DataFrame({"category": src.data["category"], "chunk": src.data["chunk"]})
    items = []
    for cat in _CATEGORIES:
        rows = frame.index[(frame["category"] == cat).to_numpy()]
        if len(rows):
            zero = rows[frame["chunk"].to_numpy()[rows] == 0]
            items.append(LegendItem(label=cat, renderers=[boxes], index=int(zero[0] if len(zero) else rows[0])))
    later = frame.index[(frame["chunk"] > 0).to_numpy() & (frame["category"] == "forward").to_numpy()]
    if chunks > 1 and len(later):
        text = "chunk 1 (lighter)" if chunks == 2 else f"chunks 1-{chunks - 1} (lighter)"
        items.append(LegendItem(label=text, renderers=[boxes], index=int(later[-1])))
    return Legend(items=items, orientation="horizontal", location="top_left", padding=2, margin=2,
                  label_text_font_size="9pt", glyph_height=14, glyph_width=18, spacing=8)


def _memory_figure(
    memory: pd.DataFrame, p: int, x_range: Range1d, width: int, budget: float | None, y_end: float | None = None,
    backend: str = "webgl",
) -> figure:
    fig = figure(
        width=width,
        frame_height=170,
        x_range=x_range,
        tools=_TOOLS,
        active_scroll="xwheel_zoom",
        output_backend=backend,
        x_axis_label="time (ms)",
        y_axis_label="memory in use (MB)",
    )
    colors = _device_colors(p)
    items = []
    for d, part in memory.groupby("device", sort=True, observed=True):
        d = int(d)
        src = ColumnDataSource(
            {
                "device": part["device"].to_numpy(dtype=np.int64),
                "time_ms": part["time_ms"].to_numpy(dtype=float),
                "memory_mb": part["memory_mb"].to_numpy(dtype=float),
            }
        )
        line = fig.step(
            x="time_ms", y="memory_mb", source=src, mode="after", line_color=colors[d % len(colors)],
            line_width=1.6, name=f"memory-{d}",
        )
        items.append(LegendItem(label=str(d), renderers=[line]))
    # Step glyphs have no hit testing: invisible points at every change carry the hover
    dev = memory["device"].to_numpy(dtype=np.int64)
    points = ColumnDataSource(
        {
            "device": dev,
            "time_ms": memory["time_ms"].to_numpy(dtype=float),
            "memory_mb": memory["memory_mb"].to_numpy(dtype=float),
            "color": np.asarray(colors, dtype=object)[dev % len(colors)],
        }
    )
    dots = fig.scatter(
        x="time_ms", y="memory_mb", source=points, size=7, fill_alpha=0, line_alpha=0,
        hover_fill_color="color", hover_fill_alpha=1, hover_line_alpha=0, name="memory-points",
    )
    fig.add_tools(
        HoverTool(
            renderers=[dots],
            tooltips=[("device", "@device"), ("time", "@time_ms{0,0.000} ms"), ("memory", "@memory_mb{0,0.0} MB")],
        )
    )
    top = float(memory["memory_mb"].max()) if len(memory) else 1.0
    if budget is not None:
        fig.add_layout(Span(location=float(budget), dimension="width", line_color="black",
                            line_dash="dashed", line_width=1.5, name="budget"))
        fig.add_layout(Label(x=float(x_range.start), y=float(budget), text=f" budget {budget:,.0f} MB",
                             text_font_size="8pt", y_offset=2, name="budget-label"))
        top = max(top, float(budget))
    end = y_end if y_end is not None else top * 1.08 + 1e-9
    fig.y_range = Range1d(0, end, bounds="auto")
    if items and p <= 32:
        legend = Legend(items=items, title="device", click_policy="hide", label_text_font_size="8pt",
                        title_text_font_size="8pt", spacing=0, padding=4, glyph_height=12)
        if p > 8:
            legend.ncols = 2
        fig.add_layout(legend, "right")
    fig.toolbar.logo = None
    _time_axis(fig)
    return fig


def _stack(figs: list[figure], name: str) -> UIElement:
    """Figures one above the other, with one toolbar for all."""
    grid = gridplot([[f] for f in figs], merge_tools=True, toolbar_location="right")
    grid.toolbar.logo = None
    grid.name = name
    return grid


def _check_backend(backend: str) -> None:
    if backend not in ("webgl", "canvas", "svg"):
        raise ValueError(f"backend = {backend!r}: expected 'webgl', 'canvas' or 'svg'")


def _check_sim(sim: Any, name: str = "sim") -> None:
    for attr in ("events", "memory", "program", "step_time", "bubble"):
        if not hasattr(sim, attr):
            raise TypeError(
                f"{name}: expected a sapptk Simulation (with .events, .memory, ...), got {type(sim).__name__}"
            )


def timeline(
    sim: Any,
    *,
    budget: float | None = None,
    title: str | None = None,
    width: int = _WIDTH,
    memory: bool = True,
    backend: str = "webgl",
) -> UIElement:
    """Gantt chart of a :class:`~sapptk.simulation.Simulation` with its memory below.

    One row per device; each op a box from its start to its end, coloured by kind
    (forward, backward, input-gradient, weight-gradient; overlapped pairs share a row
    in strips), lighter for later chunks, with the micro-batch written on boxes wide
    enough. Below, sharing the time axis, memory in use per device as steps, and the
    ``budget`` (MB) as a dashed line when given. ``backend``: Bokeh's output backend,
    "webgl" (default; fast with a GPU) or "canvas". Returns a Bokeh grid layout.
    """
    _check_sim(sim)
    _check_backend(backend)
    end = max(float(sim.step_time), 1e-9)
    x_range = Range1d(0, end * 1.01, bounds=(0, end * 1.01), name="time_range")
    gantt = _gantt(sim, x_range, title or _sim_title(sim), width, x_axis=not memory, backend=backend)
    figs = [gantt]
    if memory:
        figs.append(_memory_figure(sim.memory, sim.program.stages, x_range, width, budget, backend=backend))
    return _stack(figs, "timeline")


def compare(
    *sims: Any,
    labels: Sequence[str] | None = None,
    budget: float | None = None,
    memory: bool = False,
    width: int = _WIDTH,
    backend: str = "webgl",
) -> UIElement:
    """Several simulations stacked on one shared time axis (the shorter one looks shorter).

    ``labels`` name the simulations (default "1", "2", ...). With ``memory=True`` each
    timeline has its memory pane, all on one memory scale with the ``budget`` line.
    A dotted line marks the end of each step. ``backend`` as in :func:`timeline`.
    """
    _check_backend(backend)
    if not sims:
        raise ValueError("compare: give at least one simulation")
    for i, s in enumerate(sims):
        _check_sim(s, f"sims[{i}]")
    if labels is None:
        labels = [str(i + 1) for i in range(len(sims))]
    labels = list(labels)
    if len(labels) != len(sims):
        raise ValueError(f"compare: {len(labels)} labels for {len(sims)} simulations")
    end = max(float(s.step_time) for s in sims) or 1e-9
    x_range = Range1d(0, end * 1.01, bounds=(0, end * 1.01), name="time_range")
    y_end = max(float(s.memory["memory_mb"].max()) for s in sims)
    if budget is not None:
        y_end = max(y_end, float(budget))
    y_end *= 1.08
    children = []
    best = min(float(s.step_time) for s in sims)
    for s, label in zip(sims, labels, strict=True):
        ratio = f" ({float(s.step_time) / best:.2f}x the fastest)" if len(sims) > 1 and best > 0 else ""
        g = _gantt(s, x_range, _sim_title(s, label) + ratio, width, x_axis=True, backend=backend)
        g.add_layout(Span(location=float(s.step_time), dimension="height", line_color="black",
                          line_dash="dotted", line_width=1.5, name="step-end"))
        children.append(g)
        if memory:
            children.append(_memory_figure(s.memory, s.program.stages, x_range, width, budget, y_end, backend))
    return _stack(children, "compare")


def stage_bars(plan: Any, *, width: int = 1100, constant_mb: float | None = None) -> UIElement:
    """Per device: memory (parameters, constant, activations) stacked against the budget,
    and compute time per micro-batch (forward, backward, recompute) stacked.

    ``plan`` is a :class:`~sapptk.plan.Plan` or its ``stages`` DataFrame (columns
    ``device``, ``params_mb``, ``peak_mb``, optional ``budget_mb``, ``forward_ms``,
    ``backward_ms`` (recompute included), optional ``recompute_ms``). Activation memory is
    ``peak_mb - params_mb - constant``; ``constant_mb`` defaults to the plan's
    ``config.constant_memory`` (0 for a bare frame).
    """
    if isinstance(plan, pd.DataFrame):
        stages = plan
        constant = float(constant_mb or 0.0)
    else:
        stages = plan.devices
        if constant_mb is None:
            constant_mb = getattr(getattr(plan, "config", None), "constant_memory", 0.0)
        constant = float(constant_mb or 0.0)
    need = {"device", "params_mb", "peak_mb", "forward_ms", "backward_ms"}
    missing = need - set(stages.columns)
    if missing:
        raise ValueError(f"stage_bars: stages frame lacks columns {sorted(missing)}")
    n = len(stages)
    dev = stages["device"].to_numpy(dtype=np.int64)
    params = stages["params_mb"].to_numpy(dtype=float)
    peak = stages["peak_mb"].to_numpy(dtype=float)
    backward = stages["backward_ms"].to_numpy(dtype=float)
    recompute = stages["recompute_ms"].to_numpy(dtype=float) if "recompute_ms" in stages else np.zeros(n)
    budget = stages["budget_mb"].to_numpy(dtype=float) if "budget_mb" in stages else np.full(n, np.nan)
    src = ColumnDataSource(
        {
            "device": dev.astype(str).astype(object),
            "params_mb": params,
            "constant_mb": np.full(n, constant),
            "activation_mb": np.maximum(peak - params - constant, 0.0),
            "peak_mb": peak,
            "budget_mb": budget,
            "forward_ms": stages["forward_ms"].to_numpy(dtype=float),
            "backward_ms": backward,
            "plain_backward_ms": np.maximum(backward - recompute, 0.0),
            "recompute_ms": recompute,
        }
    )
    factors = [str(d) for d in dev]
    half = max(width // 2, 300)
    mem = figure(
        title="peak memory per device (MB)", x_range=factors, width=half, height=340, tools="hover,save,reset",
        tooltips=[("device", "@device"), ("parameters", "@params_mb{0,0} MB"), ("constant", "@constant_mb{0,0} MB"),
                  ("activations", "@activation_mb{0,0} MB"), ("peak", "@peak_mb{0,0} MB"),
                  ("budget", "@budget_mb{0,0} MB")],
        x_axis_label="device", y_axis_label="MB", output_backend="webgl",
    )
    fields, colors, labels = ["params_mb"], ["#5b6c8f"], ["parameters"]
    if constant > 0:
        fields, colors, labels = [*fields, "constant_mb"], [*colors, "#a0a7b4"], [*labels, "constant"]
    mem_bars = mem.vbar_stack([*fields, "activation_mb"], x="device", width=0.8, source=src,
                              color=[*colors, "#9db4d9"], name="memory")
    mem_items = [LegendItem(label=t, renderers=[r]) for t, r in zip([*labels, "activations"], mem_bars, strict=True)]
    finite = budget[np.isfinite(budget)]
    top = float(peak.max(initial=0.0))
    if len(finite):
        if np.allclose(finite, finite[0]):
            mem.add_layout(Span(location=float(finite[0]), dimension="width", line_color="#d1495b",
                                line_dash="dashed", line_width=2, name="budget"))
            swatch = mem.line(x=factors[:1], y=[np.nan], line_color="#d1495b", line_dash="dashed", line_width=2)
            mem_items.append(LegendItem(label=f"budget {finite[0]:,.0f} MB", renderers=[swatch]))
        else:
            marks = mem.scatter(x="device", y="budget_mb", source=src, marker="dash", size=30, color="#d1495b",
                                line_width=2)
            mem_items.append(LegendItem(label="budget", renderers=[marks]))
        top = max(top, float(finite.max()))
    mem.y_range = Range1d(0, top * 1.08 + 1e-9)
    time = figure(
        title="compute time per device and micro-batch (ms)", x_range=factors, width=half, height=340,
        tools="hover,save,reset",
        tooltips=[("device", "@device"), ("forward", "@forward_ms{0,0.00} ms"),
                  ("backward", "@backward_ms{0,0.00} ms (recompute included)"),
                  ("recompute", "@recompute_ms{0,0.00} ms")],
        x_axis_label="device", y_axis_label="ms", output_backend="webgl",
    )
    time_bars = time.vbar_stack(["forward_ms", "plain_backward_ms", "recompute_ms"], x="device", width=0.8,
                                source=src, color=[CATEGORY_COLORS["forward"], CATEGORY_COLORS["backward"], "#f2b134"],
                                name="time")
    time_items = [LegendItem(label=t, renderers=[r])
                  for t, r in zip(["forward", "backward", "recompute"], time_bars, strict=True)]
    total = src.data["forward_ms"] + src.data["plain_backward_ms"] + recompute
    time.y_range = Range1d(0, float(total.max(initial=0.0)) * 1.08 + 1e-9)
    for f, items in ((mem, mem_items), (time, time_items)):
        f.add_layout(Legend(items=items, orientation="horizontal", location="top_left", padding=2, margin=2,
                            label_text_font_size="9pt", glyph_height=14, glyph_width=18, spacing=8), "above")
        f.xgrid.grid_line_color = None
        f.toolbar.logo = None
    return row(mem, time, name="stage_bars")

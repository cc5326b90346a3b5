"""Timelines: one row per device, one box per op, and memory in use below on the same
time axis.

* :func:`timeline`: one plan or simulation.
* :func:`compare`: several on one shared time scale (the shorter step looks shorter).

Each figure reads one ColumnDataSource of numpy columns. A Gantt's boxes and its
micro-batch labels share the op source (the labels through an ``IndexFilter`` that a zoom
callback updates in the browser). The memory panes below (and the K/V panes of sequence
slices) are :mod:`sapptk.viz.memory_panes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from bokeh.models import (
    BoxAnnotation,
    CDSView,
    ColumnDataSource,
    CustomJS,
    FixedTicker,
    Grid,
    GridPlot,
    HoverTool,
    IndexFilter,
    Label,
    Legend,
    LegendItem,
    Quad,
    Range1d,
    SaveTool,
    Text,
    Toolbar,
    ToolProxy,
    WheelZoomTool,
)
from bokeh.plotting import figure

from sapptk.errors import SapptkError
from sapptk.viz import look
from sapptk.viz.memory_panes import memory_panes, memory_segments
from sapptk.viz.subjects import AUTO, Budget, budget_of, simulation_of

if TYPE_CHECKING:
    from sapptk.simulation import Simulation

__all__ = ["compare", "memory_segments", "op_columns", "op_source", "timeline"]  # memory_segments: re-exported


# ------------------------------------------------------------------ sources
def _title(sim: Simulation, label: str | None = None, ratio: str = "") -> str:
    """The setup, step time and bubble; with a ``label`` (compare's headers) the label, the
    step time and ``ratio`` come first, so a narrow figure cuts off the least telling part."""
    pr = sim.program
    parts = [pr.name, f"p={pr.stages}", f"v={pr.chunks}", f"m={pr.micro_batches}"]
    if pr.splits > 1:
        parts.append(f"k={pr.splits}")
    setup = " ".join(parts)
    bubble = f"bubble {sim.bubble.of_compute:.1%} of compute"
    if label is None:
        return f"{setup} | step time {look.fmt_ms(sim.step_time)} | {bubble} ({sim.bubble.of_step:.1%} of step)"
    return f"{label}: step time {look.fmt_ms(sim.step_time)}{ratio} | {bubble} | {setup}"  # fits ~800 px


def _rank_in_unit(unit: np.ndarray) -> np.ndarray:
    """Each op's position among the ops of its unit, in the order given."""
    order = np.argsort(unit, kind="stable")
    ordered = unit[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]] if len(unit) else np.zeros(0, bool)
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(unit)), 0)) if len(unit) else first
    rank = np.empty(len(unit), dtype=np.int64)
    rank[order] = np.arange(len(unit)) - run_start
    return rank


def op_columns(events: pd.DataFrame, chunks: int | None = None, row_offset: int = 0) -> dict[str, np.ndarray]:
    """The columns of :func:`op_source`, with every row moved down by ``row_offset``."""
    n = len(events)
    kind = events["kind"]
    if not isinstance(kind.dtype, pd.CategoricalDtype):
        kind = kind.astype("category")
    codes = kind.cat.codes.to_numpy()
    try:
        table = np.array([look.KIND_CATEGORY[str(c)] for c in kind.cat.categories], dtype=np.int64)
    except KeyError as exc:
        raise SapptkError(f"op_source: events: kind {exc.args[0]!r}: expected one of F, B, I, W") from None
    kind_codes = table[codes] if n else np.zeros(0, np.int64)
    unit = events["unit"].to_numpy(dtype=np.int64)
    size = np.bincount(unit)[unit] if n else np.zeros(0, np.int64)
    rank = _rank_in_unit(unit)
    category = np.where(size > 1, look.OVERLAPPED, kind_codes)
    chunk = events["chunk"].to_numpy(dtype=np.int64)
    v = max(int(chunks if chunks is not None else (chunk.max() + 1 if n else 1)), 1)
    device = events["device"].to_numpy(dtype=np.int64)
    height = 0.8 / np.maximum(size, 1)
    lower = device + row_offset - 0.4 + height * rank
    start = events["start_ms"].to_numpy(dtype=float)
    end = events["end_ms"].to_numpy(dtype=float)
    letters = np.array(["F", "B", "I", "W"], dtype=object)
    return {
        "device": device,
        "kind": letters[kind_codes],
        "category": np.asarray(look.CATEGORIES, dtype=object)[category],
        "micro_batch": events["micro_batch"].to_numpy(dtype=np.int64),
        "virtual_stage": events["virtual_stage"].to_numpy(dtype=np.int64),
        "chunk": chunk,
        "slice": events["slice"].to_numpy(dtype=np.int64),
        "unit": unit,
        "start_ms": start,
        "end_ms": end,
        "duration_ms": end - start,
        "lower": lower,
        "upper": lower + height,
        "label_x": (start + end) / 2,
        "label_y": lower + height / 2,
        "style": category * v + np.minimum(chunk, v - 1),
    }


def op_source(events: pd.DataFrame, chunks: int | None = None) -> ColumnDataSource:
    """The op data of a timeline: one row per op of ``events`` (``Simulation.events``).

    Columns: the event columns (``kind`` as its letter), ``category`` (forward, backward,
    input-gradient, weight-gradient, or overlapped for the ops of a unit of two or more),
    ``style`` (``category_index · chunks + chunk``: the index into the fill and text
    palettes of :func:`sapptk.viz.look.op_palettes`), ``duration_ms``, ``lower`` and
    ``upper`` (the row extent: device ± 0.4, split into strips for overlapped ops) and
    ``label_x``, ``label_y`` (the box centre, where the micro-batch is written).
    """
    return ColumnDataSource(op_columns(events, chunks))


# the micro-batch labels shown, consistently: every full-height box in view when each of them
# can hold the widest number in view, else none (the hover still names every op)
_LABELS_JS = """
const d = ops.data
const xs = x_range.start, xe = x_range.end
const width = fig.inner_width > 0 ? fig.inner_width : fallback_width
const ppm = width / Math.max(xe - xs, 1e-12)
const x = d.label_x, dur = d.duration_ms, lo = d.lower, up = d.upper, mb = d.micro_batch
const keep = []
let narrowest = Infinity, widest = 0
for (let i = 0; i < x.length; i++) {
  if (x[i] < xs || x[i] > xe || up[i] - lo[i] < 0.39) continue
  keep.push(i)
  narrowest = Math.min(narrowest, dur[i] * ppm)
  widest = Math.max(widest, String(mb[i]).length)
  if (keep.length > max_labels) break
}
const room = keep.length <= max_labels && narrowest >= widest * char_px + 4
labels.indices = room ? keep : []
"""


def _label_indices(data: dict[str, np.ndarray], px_per_ms: float) -> np.ndarray:
    """The ops labelled at the initial zoom: every full-height box when each can hold the
    widest micro-batch number, else none (the browser's rule, :data:`_LABELS_JS`)."""
    mb = data["micro_batch"]
    full = np.flatnonzero(data["upper"] - data["lower"] >= 0.39)
    if len(full) == 0 or len(full) > look.MAX_LABELS:
        return np.zeros(0, dtype=np.int64)
    digits = int(np.floor(np.log10(max(int(mb[full].max()), 1)))) + 1
    room = float(data["duration_ms"][full].min()) * px_per_ms >= digits * look.LABEL_PX_PER_CHAR + 4
    return full if room else np.zeros(0, dtype=np.int64)


# ------------------------------------------------------------------ figures
def _gantt(
    sims: Sequence[Simulation], headers: Sequence[str | None], x_range: Range1d, title: str | None, width: int, *,
    x_axis: bool, backend: str,
) -> figure:
    """One figure, one source: the simulations' device rows one group below the other,
    each group under its header row (when it has a header)."""
    chunks = max(max(int(s.program.chunks) for s in sims), 1)
    offsets, rows, ticks, names = [], 0, [], {}
    for sim, header in zip(sims, headers, strict=True):
        rows += header is not None
        offsets.append(rows)
        p = int(sim.program.stages)
        ticks += range(rows, rows + p)
        names.update({rows + d: str(d) for d in range(p)})
        rows += p
    parts = [op_columns(s.events, chunks, o) for s, o in zip(sims, offsets, strict=True)]
    data = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    src = ColumnDataSource(data)
    fills, texts = look.op_palettes(chunks)
    fig = figure(
        title=title,
        width=width,
        frame_height=look.ROW_PX * max(rows, 3),
        x_range=x_range,
        y_range=Range1d(rows - 0.5, -0.5, bounds="auto"),
        tools="",
        output_backend=backend,
        x_axis_label="time (ms)" if x_axis else None,
        y_axis_label="device",
    )
    usable_px = max(width - 120, 100)
    span = float(x_range.end - x_range.start) or 1.0
    widths = data["duration_ms"] * usable_px / span
    outline = bool(len(widths)) and float(np.median(widths)) >= 4.0  # thin boxes: no border to wash them out
    look.time_tools(fig)
    box = {"left": "start_ms", "right": "end_ms", "top": "lower", "bottom": "upper", "line_width": 0.5,
           "fill_color": {"field": "style", "transform": look.indexed(fills)}}
    boxes = fig.add_glyph(src, Quad(**box, line_color="white" if outline else None),
                          hover_glyph=Quad(**box, line_color="black"), name="ops")
    boxes.hover_glyph.line_width = 1.5
    fig.add_tools(
        HoverTool(
            renderers=[boxes],
            tooltips=[
                ("device", "@device"),
                ("kind", "@category (@kind)"),
                ("micro-batch", "@micro_batch"),
                ("virtual stage", "@virtual_stage (chunk @chunk)"),
                ("slice", "@slice"),
                ("start", "@start_ms{0,0.000} ms"),
                ("end", "@end_ms{0,0.000} ms"),
                ("duration", "@duration_ms{0,0.000} ms"),
            ],
        )
    )
    shown = IndexFilter(indices=_label_indices(data, usable_px / span).tolist())
    fig.add_glyph(
        src,
        Text(x="label_x", y="label_y", text="micro_batch", text_align="center", text_baseline="middle",
             text_font_size="8pt", text_color={"field": "style", "transform": look.indexed(texts)}),
        view=CDSView(filter=shown), name="labels",
    )
    update = CustomJS(
        args={"ops": src, "labels": shown, "x_range": x_range, "fig": fig, "fallback_width": usable_px,
              "char_px": look.LABEL_PX_PER_CHAR, "max_labels": look.MAX_LABELS},
        code=_LABELS_JS,
    )
    x_range.js_on_change("start", update)
    x_range.js_on_change("end", update)
    fig.js_on_change("inner_width", update)  # a stretching figure learns its width in the browser
    for sim, header, o in zip(sims, headers, offsets, strict=True):
        if header is not None:
            fig.add_layout(Label(x=0, y=o - 1, x_units="screen", text=header, text_font_size="10pt",
                                 text_font_style="bold", text_baseline="middle", x_offset=4, name="header"))
            last = o + int(sim.program.stages) - 1
            fig.add_layout(BoxAnnotation(left=float(sim.step_time), top=o - 0.5, bottom=last + 0.5,
                                         fill_color="#888888", fill_alpha=0.12, line_color="black", line_alpha=0.6,
                                         line_dash="dotted", name="step-end"))
    fig.yaxis.ticker = FixedTicker(ticks=ticks)
    fig.yaxis.major_label_overrides = names
    fig.center = [c for c in fig.center if not (isinstance(c, Grid) and c.dimension == 1)]  # rows need no grid
    fig.xaxis.visible = x_axis
    if len(data["style"]):
        fig.add_layout(_kind_legend(boxes, data, chunks), "above")
    if fig.title is not None:
        fig.title.text_font_size = "11pt"
    fig.toolbar.logo = None
    look.time_axis(fig)
    return fig


def _kind_legend(boxes: Any, data: dict[str, np.ndarray], chunks: int) -> Legend:
    """One swatch per op category present (its chunk-0 colour), plus one for later chunks."""
    code = data["style"]
    items = []
    for c, name in enumerate(look.CATEGORIES):
        rows = np.flatnonzero((code >= c * chunks) & (code < (c + 1) * chunks))
        if len(rows):
            zero = rows[code[rows] == c * chunks]
            items.append(LegendItem(label=name, renderers=[boxes], index=int(zero[0] if len(zero) else rows[0])))
    later = np.flatnonzero((code > 0) & (code < chunks))  # forward ops of later chunks
    if chunks > 1 and len(later):
        text = "chunk 1 (lighter)" if chunks == 2 else f"chunks 1-{chunks - 1} (lighter)"
        items.append(LegendItem(label=text, renderers=[boxes], index=int(later[np.argmax(code[later])])))
    return Legend(items=items, orientation="horizontal", location="top_left", padding=2, margin=2,
                  label_text_font_size="9pt", glyph_height=14, glyph_width=18, spacing=8)


def _stack(figs: list[figure], name: str) -> GridPlot:
    """Figures one above the other with one toolbar for all: a tool of each kind drives
    that tool in every figure. (Bokeh's ``gridplot`` does the same, but walks every model
    of every figure to find the tools, a large part of the build.)"""
    by_kind: dict[type, list[Any]] = {}
    for fig in figs:
        for tool in fig.toolbar.tools:
            by_kind.setdefault(type(tool), []).append(tool)
        fig.toolbar_location = None
    tools: list[Any] = []
    for kind, group in by_kind.items():
        if kind is SaveTool:
            tools.append(SaveTool())  # one picture of the whole grid
        else:
            tools.append(group[0] if len(group) == 1 else ToolProxy(tools=group))
    wheel = next((t for t in tools if WheelZoomTool in {type(x) for x in getattr(t, "tools", [t])}), "auto")
    toolbar = Toolbar(tools=tools, logo=None, active_scroll=wheel)
    return GridPlot(children=[(f, i, 0) for i, f in enumerate(figs)], toolbar=toolbar, toolbar_location="right",
                    name=name)


def _width(width: Any, where: str) -> int:
    """The px a figure is built for: ``width``, or the style's (checked)."""
    if width is None:
        return look.current().width
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 200:
        raise SapptkError(f"{where}: width = {width!r}: expected None (stretch) or a number of px >= 200")
    return int(width)


def timeline(
    subject: Any,
    *,
    budget: Budget = AUTO,
    title: str | None = None,
    width: int | None = None,
    memory: bool = True,
    backend: str = "webgl",
) -> GridPlot:
    """Gantt chart of a plan or simulation with its memory below.

    ``subject`` is a :class:`~sapptk.plan.Plan` (its simulation is drawn) or a
    :class:`~sapptk.simulation.Simulation`. One row per device; each op a box from its
    start to its end, coloured by kind (forward, backward, input-gradient,
    weight-gradient; overlapped ops share a row in strips), lighter for later chunks,
    with the micro-batch written on boxes wide enough. Below, sharing the time axis,
    memory in use per device as steps and the memory budget as a dashed line (with sequence
    slices, the K/V each device holds in a pane of its own below):
    ``budget="auto"`` takes the plan's or the simulation's own budget, a number (MB)
    draws that one, None none. ``backend``: Bokeh's output backend, "webgl" (default),
    "canvas" or "svg". ``width``: None (default) stretches to the output width (the paper
    style: its column width); a number of px fixes it. Returns a Bokeh grid layout.
    """
    look.check_backend(backend)
    px = _width(width, "timeline")
    sim = simulation_of(subject, "timeline")
    line = budget_of(subject, budget, "timeline")
    end = max(float(sim.step_time), 1e-9)
    x_range = Range1d(0, end * 1.01, bounds=(0, end * 1.01), name="time_range")
    figs = [_gantt([sim], [None], x_range, title or _title(sim), px, x_axis=not memory, backend=backend)]
    if memory:
        figs += memory_panes([sim], [None], [line], x_range, px, None, backend)
    return look.finish(_stack(figs, "timeline"), width=width)


def compare(
    *subjects: Any,
    labels: Sequence[str] | None = None,
    budget: Budget = AUTO,
    memory: bool = False,
    width: int | None = None,
    backend: str = "webgl",
) -> GridPlot:
    """Several plans or simulations stacked on one shared time axis.

    ``labels`` name them (default "1", "2", ...). With ``memory=True`` each timeline has
    its memory pane, all on one memory scale, each with its budget line (``budget`` as in
    :func:`timeline`: "auto" gives each subject its own; K/V panes for sequence slices,
    on one K/V scale). A dotted line marks the end of each step. ``backend`` and ``width`` as in :func:`timeline`.
    """
    look.check_backend(backend)
    px = _width(width, "compare")
    if not subjects:
        raise SapptkError("compare: give at least one plan or simulation")
    sims = [simulation_of(s, f"compare: subjects[{i}]") for i, s in enumerate(subjects)]
    lines = [budget_of(s, budget, "compare") for s in subjects]
    labels = [str(i + 1) for i in range(len(sims))] if labels is None else [str(x) for x in labels]
    if len(labels) != len(sims):
        raise SapptkError(f"compare: {len(labels)} labels for {len(sims)} plans or simulations")
    end = max(float(s.step_time) for s in sims) or 1e-9
    x_range = Range1d(0, end * 1.01, bounds=(0, end * 1.01), name="time_range")
    y_end = max([float(s.memory["memory_mb"].max()) for s in sims if len(s.memory)] + [b or 0.0 for b in lines])
    y_end = y_end * 1.08 + 1e-9
    best = min(float(s.step_time) for s in sims)
    headers = []
    for sim, label in zip(sims, labels, strict=True):
        ratio = f" ({float(sim.step_time) / best:.2f}x the fastest)" if len(sims) > 1 and best > 0 else ""
        headers.append(_title(sim, label, ratio))
    children = [_gantt(sims, headers, x_range, None, px, x_axis=True, backend=backend)]
    if memory:
        children += memory_panes(sims, labels, lines, x_range, px,
                                  y_end, backend)
    return look.finish(_stack(children, "compare"), width=width)

"""The memory panes under a timeline: memory in use per device as steps against the budget,
and, for sequence slices, the K/V each device holds in a pane of its own (a few hundred MB
would be flat under a memory axis of tens of GB).

Each pane draws every device's steps as the segments of one renderer, coloured by device
through a colour mapper; a click on a device in the first pane's legend dims that device in
every pane. Used by :mod:`sapptk.viz.timelines`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    GlyphRenderer,
    HoverTool,
    Label,
    Legend,
    LegendItem,
    LinearColorMapper,
    Range1d,
    Segment,
    Span,
)
from bokeh.plotting import figure

from sapptk.viz import look

if TYPE_CHECKING:
    from sapptk.simulation import Simulation

__all__ = ["memory_panes", "memory_segments"]


def memory_segments(memory: pd.DataFrame, end_ms: float) -> dict[str, np.ndarray]:
    """Memory in use drawn as segments: per device, one level per row of ``memory``
    (``Simulation.memory``, steps) from its time to the next change (the last one to
    ``end_ms``), then the risers between levels.

    Columns: ``device``, ``start_ms``, ``end_ms``, ``from_mb`` and ``memory_mb`` (level
    rows: both the level; risers: the level before and after), ``alpha`` (1; a legend
    click dims a device). The first ``len(memory)`` rows are the levels, in device order.
    """
    order = np.argsort(memory["device"].to_numpy(dtype=np.int64), kind="stable")
    dev = memory["device"].to_numpy(dtype=np.int64)[order]
    t = memory["time_ms"].to_numpy(dtype=float)[order]
    m = memory["memory_mb"].to_numpy(dtype=float)[order]
    same = np.r_[dev[1:] == dev[:-1], False] if len(dev) else np.zeros(0, bool)
    t_next = np.where(same, np.r_[t[1:], 0.0], np.maximum(t, end_ms))
    m_next = np.r_[m[1:], 0.0] if len(m) else m
    rise = same & (m_next != m)
    return {
        "device": np.r_[dev, dev[rise]],
        "start_ms": np.r_[t, t_next[rise]],
        "end_ms": np.r_[t_next, t_next[rise]],
        "from_mb": np.r_[m, m[rise]],
        "memory_mb": np.r_[m, m_next[rise]],
        "alpha": np.ones(len(dev) + int(rise.sum())),
    }


# a legend click dims (or restores) the clicked device in every memory pane
_DIM_DEVICE_JS = """
const own = cb_obj.item.renderers[0].data_source.data, row = cb_obj.item.index
const dev = own.device[row], dim = own.alpha[row] > 0.5
for (const src of sources) {
  const d = src.data, alpha = Array.from(d.alpha)
  for (let i = 0; i < alpha.length; i++) if (d.device[i] == dev) alpha[i] = dim ? 0.08 : 1
  src.data = {...d, alpha}
}
"""


def _memory_figure(
    sim: Simulation, x_range: Range1d, width: int, budget: float | None, y_end: float | None, backend: str,
    colors: LinearColorMapper, title: str | None = None,
) -> tuple[figure, GlyphRenderer]:
    """A memory pane (without its device legend) and its one renderer."""
    fig = figure(
        title=title, width=width, frame_height=170, x_range=x_range, tools="",
        output_backend=backend, x_axis_label="time (ms)", y_axis_label="memory in use (MB)",
    )
    src = ColumnDataSource(memory_segments(sim.memory, float(sim.step_time)))
    look.time_tools(fig)
    line = {"x0": "start_ms", "x1": "end_ms", "y0": "from_mb", "y1": "memory_mb", "line_alpha": "alpha",
            "line_color": {"field": "device", "transform": colors}}
    lines = fig.add_glyph(src, Segment(**line, line_width=1.6), hover_glyph=Segment(**line, line_width=3),
                          name="memory")
    fig.add_tools(
        HoverTool(
            renderers=[lines],
            tooltips=[("device", "@device"), ("time", "@start_ms{0,0.000} – @end_ms{0,0.000} ms"),
                      ("memory", "@memory_mb{0,0.0} MB")],
        )
    )
    top = float(sim.memory["memory_mb"].max()) if len(sim.memory) else 1.0
    if budget is not None:
        fig.add_layout(Span(location=budget, dimension="width", line_color="black", line_dash="dashed",
                            line_width=1.5, name="budget"))
        fig.add_layout(Label(x=float(x_range.start), y=budget, text=f" budget {budget:,.0f} MB",
                             text_font_size="8pt", y_offset=2, name="budget-label"))
        top = max(top, budget)
    fig.y_range = Range1d(0, y_end if y_end is not None else top * 1.08 + 1e-9, bounds="auto")
    fig.yaxis.formatter = look.thousands()
    fig.toolbar.logo = None
    look.time_axis(fig)
    return fig, lines


def _kv_figure(
    sim: Simulation, x_range: Range1d, width: int, y_end: float, backend: str, colors: LinearColorMapper,
    title: str,
) -> tuple[figure, GlyphRenderer]:
    """A pane of the K/V each device holds (``Simulation.memory["kv_mb"]``, long context) on
    its own scale: a few hundred MB would be flat under a memory axis of tens of GB."""
    fig = figure(title=title, width=width, frame_height=110, x_range=x_range, tools="", output_backend=backend,
                 x_axis_label="time (ms)", y_axis_label="K/V held (MB)")
    src = ColumnDataSource(memory_segments(sim.memory.assign(memory_mb=sim.memory["kv_mb"]), float(sim.step_time)))
    look.time_tools(fig)
    line = {"x0": "start_ms", "x1": "end_ms", "y0": "from_mb", "y1": "memory_mb", "line_alpha": "alpha",
            "line_color": {"field": "device", "transform": colors}}
    lines = fig.add_glyph(src, Segment(**line, line_width=1.4), hover_glyph=Segment(**line, line_width=3), name="kv")
    fig.add_tools(HoverTool(renderers=[lines], tooltips=[("device", "@device"), ("K/V", "@memory_mb{0,0.0} MB")]))
    fig.y_range = Range1d(0, y_end, bounds="auto")
    fig.yaxis.formatter = look.thousands()
    fig.toolbar.logo = None
    look.time_axis(fig)
    return fig, lines


def _has_kv(sim: Simulation) -> bool:
    kv = sim.memory.get("kv_mb")
    return kv is not None and float(kv.to_numpy().max(initial=0.0)) > 0


def memory_panes(
    sims: Sequence[Simulation], labels: Sequence[str | None], lines: Sequence[float | None], x_range: Range1d,
    width: int, y_end: float | None, backend: str,
) -> list[figure]:
    """One memory pane per simulation (titled "<label>: memory in use" when labelled), one
    device colour each, followed by a K/V pane for a simulation with sequence slices (all K/V
    panes on one scale); a device legend on the first pane whose clicks dim that device in
    every pane."""
    p = max(int(s.program.stages) for s in sims)
    colors = look.indexed(look.device_colors(max(p, 1)))
    kv_top = max((float(s.memory["kv_mb"].max()) for s in sims if _has_kv(s)), default=0.0)
    panes: list[tuple[figure, GlyphRenderer]] = []
    for sim, label, budget in zip(sims, labels, lines, strict=True):
        title = None if label is None else f"{label}: memory in use"
        panes.append(_memory_figure(sim, x_range, width, budget, y_end, backend, colors, title))
        if _has_kv(sim):
            kv_title = "K/V of the sequence slices held" if label is None else f"{label}: K/V held"
            panes.append(_kv_figure(sim, x_range, width, kv_top * 1.08, backend, colors, kv_title))
    fig, renderer = panes[0]
    devices = np.asarray(renderer.data_source.data["device"])[: len(sims[0].memory)]
    firsts = np.flatnonzero(np.r_[True, devices[1:] != devices[:-1]]) if len(devices) else []
    if 0 < len(firsts) <= 32:
        legend = Legend(
            items=[LegendItem(label=str(int(devices[i])), renderers=[renderer], index=int(i)) for i in firsts],
            title="device", label_text_font_size="8pt", title_text_font_size="8pt", spacing=0, padding=4,
            glyph_height=12, name="memory-legend",
        )
        if len(firsts) > 8:
            legend.ncols = 2
        sources = [r.data_source for _, r in panes]
        legend.js_on_event("legend_item_click", CustomJS(args={"sources": sources}, code=_DIM_DEVICE_JS))
        fig.add_layout(legend, "right")
    return [f for f, _ in panes]

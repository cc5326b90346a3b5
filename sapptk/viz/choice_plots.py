"""Figures of a choice (:func:`sapptk.choose`), built from ``Choice.frame`` only.

* :func:`choice_ranking`: one horizontal bar per setup, best first: the step time of the
  balanced setups, and the proven bound of the pruned ones (hatched: no setup there can be
  faster than its bar), with the winner's step time as a line; the axis starts near the
  fastest value and each bar says how much slower than the winner it is.
* :func:`choice_pareto`: the balanced setups by peak memory and step time, the Pareto front
  joined by a line.

Hover tooltips name each setup. Nothing in the core imports this module.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.models import ColumnDataSource, HoverTool, Range1d, Span
from bokeh.plotting import figure

from sapptk.errors import SapptkError
from sapptk.viz import look
from sapptk.viz.look import number_axes, thousands

__all__ = ["choice_pareto", "choice_ranking"]

_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
_COLORS = {"balanced": "#1f77b4", "unsolved": "#ff7f0e", "pruned": "#aaaaaa"}
_TIPS = [("setup", "@label"), ("status", "@status"), ("step time", "@step_time_ms{0,0.0} ms"),
         ("bound", "@bound_ms{0,0.0} ms"), ("peak memory", "@peak_mb_max{0,0} MB")]


def _frame(choice: Any) -> pd.DataFrame:
    frame = getattr(choice, "frame", choice)
    if not isinstance(frame, pd.DataFrame) or not {"status", "step_time_ms", "bound_ms", "schedule"} <= set(frame):
        raise SapptkError(f"choice = {type(choice).__name__}: expected a sapptk.Choice or its frame")
    return frame


def _labels(frame: pd.DataFrame) -> list[str]:
    extra = [c for c in ("tp", "cp", "ep") if c in frame]
    out = []
    for row in frame.itertuples():
        text = f"#{row.rank} {row.schedule} p{row.stages} v{row.chunks} dp{row.dp}"
        text += "".join(f" {c}{getattr(row, c)}" for c in extra if getattr(row, c) != 1)
        out.append(text)
    return out


def _value_range(values: pd.Series) -> tuple[float, float]:
    """The x range of a ranking: near the fastest and slowest values, so that differences of a
    few percent show (from 0 when the values spread over more than half the largest), with
    room on the right for the labels at the bar ends."""
    lo, hi = float(values.min()), float(values.max())
    pad = max(0.25 * (hi - lo), 0.01 * hi, 1e-9)
    start = lo - pad
    if start <= 0.5 * hi:
        start = 0.0
    end = hi + pad + 0.16 * (hi + pad - start)  # the "+1.5 %" labels
    return start, end


def choice_ranking(choice: Any, *, top: int = 30, width: int | None = None) -> figure:
    """The first ``top`` setups of the ranking that have a time (balanced: step time; pruned:
    bound), best at the top. The axis starts near the fastest value (so that a few percent
    show; the axis label says where it starts) and each bar is labelled with how much slower
    it is than the winner."""
    frame = _frame(choice)
    rows = frame[frame["status"].isin(["balanced", "unsolved", "pruned"])].head(top).copy()
    rows["value"] = rows["step_time_ms"].where(rows["status"] == "balanced", rows["bound_ms"])
    rows = rows[rows["value"].notna()]
    rows["label"] = _labels(rows)
    rows["status"] = rows["status"].astype(str)
    rows["color"] = [_COLORS.get(s, "#aaaaaa") for s in rows["status"]]
    rows["hatch"] = ["/" if s == "pruned" else " " for s in rows["status"]]
    balanced = frame.loc[frame["status"] == "balanced", "step_time_ms"]
    best = float(balanced.min()) if len(balanced) else None
    if best is not None and best > 0:
        rows["vs_best"] = [("fastest" if v <= best else f"+{100 * (v / best - 1):.1f} %") if s == "balanced"
                           else f"≥ +{100 * max(v / best - 1, 0.0):.1f} %" for v, s in zip(rows["value"],
                                                                                   rows["status"], strict=True)]
    else:
        rows["vs_best"] = ""
    labels = list(rows["label"])[::-1]
    n_pruned = int((frame["status"] == "pruned").sum())
    start, end = _value_range(rows["value"]) if len(rows) else (0.0, 1.0)
    rows["left"] = start
    axis = "ms per step" if start == 0 else f"ms per step (the axis starts at {start:,.0f} ms)"
    fig = figure(y_range=labels, x_range=Range1d(start, end), width=width or look.current().width,
                 height=max(200, 22 * len(labels) + 90), tools=_TOOLS,
                 title=f"setups by step time ({n_pruned} pruned: their proven bound, hatched)",
                 x_axis_label=axis)
    source = ColumnDataSource(rows.drop(columns=[c for c in ("key", "reason") if c in rows]).reset_index(drop=True))
    fig.hbar(y="label", right="value", left="left", height=0.7, color="color", hatch_pattern="hatch",
             hatch_color="white", source=source, legend_field="status")
    fig.text(x="value", y="label", text="vs_best", source=source, x_offset=4, text_baseline="middle",
             text_font_size="8pt", text_color="#333333")
    if best is not None:
        fig.add_layout(Span(location=best, dimension="height", line_color="black", line_dash="dashed"))
    fig.add_tools(HoverTool(tooltips=_TIPS, renderers=fig.renderers[:1]))
    fig.legend.location = "bottom_right"
    fig.xaxis.formatter = thousands()
    fig.xaxis.ticker.desired_num_ticks = 5
    fig.ygrid.grid_line_color = None
    return look.finish(fig, width=width)


def choice_pareto(choice: Any, *, width: int | None = None, height: int = 420) -> figure:
    """Every balanced setup by peak memory (x) and step time (y); the Pareto front in black."""
    frame = _frame(choice)
    done = frame[(frame["status"] == "balanced") & frame["peak_mb_max"].notna()].copy()
    if done.empty:
        raise SapptkError("choice: no balanced setup to draw")
    done["label"] = _labels(done)
    done["status"] = done["status"].astype(str)
    front = choice.pareto if hasattr(choice, "pareto") else None
    fig = figure(width=width or look.current().width, height=height, tools=_TOOLS,
                 title="balanced setups: step time against peak memory",
                 x_axis_label="peak memory of the fullest device (MB)", y_axis_label="ms per step")
    src = ColumnDataSource(done.drop(columns=[c for c in ("key", "reason") if c in done]).reset_index(drop=True))
    fig.scatter("peak_mb_max", "step_time_ms", size=9, alpha=0.7, source=src, legend_label="balanced setup")
    if front is not None and not front.empty:
        ordered = front.sort_values("peak_mb_max")
        fig.step(ordered["peak_mb_max"], ordered["step_time_ms"], mode="after", color="black", line_width=2,
                 legend_label="Pareto front")
    fig.add_tools(HoverTool(tooltips=_TIPS))
    number_axes(fig)
    return look.finish(fig, width=width)

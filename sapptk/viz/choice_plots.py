"""Figures of a choice (:func:`sapptk.choose`), built from ``Choice.frame`` only.

* :func:`choice_ranking`: one horizontal bar per setup, best first: the step time of the
  balanced setups, and the proven bound of the pruned ones (hatched: no setup there can be
  faster than its bar), with the winner's step time as a line.
* :func:`choice_pareto`: the balanced setups by peak memory and step time, the Pareto front
  joined by a line.

Hover tooltips name each setup. Nothing in the core imports this module.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.models import ColumnDataSource, HoverTool, Span
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


def choice_ranking(choice: Any, *, top: int = 30, width: int | None = None) -> figure:
    """The first ``top`` setups of the ranking that have a time (balanced: step time; pruned:
    bound), best at the top."""
    frame = _frame(choice)
    rows = frame[frame["status"].isin(["balanced", "unsolved", "pruned"])].head(top).copy()
    rows["value"] = rows["step_time_ms"].where(rows["status"] == "balanced", rows["bound_ms"])
    rows = rows[rows["value"].notna()]
    rows["label"] = _labels(rows)
    rows["status"] = rows["status"].astype(str)
    rows["color"] = [_COLORS.get(s, "#aaaaaa") for s in rows["status"]]
    rows["hatch"] = ["/" if s == "pruned" else " " for s in rows["status"]]
    labels = list(rows["label"])[::-1]
    n_pruned = int((frame["status"] == "pruned").sum())
    fig = figure(y_range=labels, width=width or look.current().width, height=max(200, 22 * len(labels) + 80),
                 tools=_TOOLS,
                 title=f"setups ranked: step time (balanced) or proven bound (pruned, hatched; {n_pruned} pruned)",
                 x_axis_label="ms per step")
    source = ColumnDataSource(rows.drop(columns=[c for c in ("key", "reason") if c in rows]).reset_index(drop=True))
    fig.hbar(y="label", right="value", left=0, height=0.7, color="color", hatch_pattern="hatch",
             hatch_color="white", source=source, legend_field="status")
    if (frame["status"] == "balanced").any():
        best = float(frame.loc[frame["status"] == "balanced", "step_time_ms"].min())
        fig.add_layout(Span(location=best, dimension="height", line_color="black", line_dash="dashed"))
    fig.add_tools(HoverTool(tooltips=_TIPS))
    fig.legend.location = "bottom_right"
    fig.xaxis.formatter = thousands()
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

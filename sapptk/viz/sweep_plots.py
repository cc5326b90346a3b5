"""Figures of a sweep, built from the frame of :func:`sapptk.sweeps.sweep` only.

* :func:`step_time_by_budget`: the best step time at each memory budget, one line per
  schedule (or any other label column).
* :func:`heatmap`: the best value over two chosen axes, one cell per pair.
* :func:`pareto`: every solved point by peak memory and step time, with the Pareto front.

Every point has hover tooltips naming its setup. Only solved rows (``optimal`` or
``feasible``) are drawn as values; the others are counted in the title. Nothing in the
core imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
from bokeh.plotting import figure

from sapptk.errors import SapptkError
from sapptk.pareto import pareto_front as _front_indices
from sapptk.sweeps import SOLVED
from sapptk.viz import look
from sapptk.viz.look import number_axes, thousands

__all__ = ["heatmap", "pareto", "pareto_front", "step_time_by_budget"]

_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
_SETUP = [
    ("profile", "@profile"),
    ("schedule", "@schedule"),
    ("p × m × v", "@stages × @micro_batches × @chunks"),
    ("budget", "@budget_text"),
    ("recompute", "@recompute"),
    ("step time", "@step_time_ms{0,0.0} ms"),
    ("peak memory", "@peak_mb_max{0,0} MB"),
    ("bubble (of compute)", "@bubble_of_compute{0.000}"),
    ("status", "@status (gap @gap{0.0000})"),
]
_LABELS = ("profile", "schedule", "recompute", "status")


def _check(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SapptkError(f"sweep frame: missing column {missing[0]!r}; expected a frame from sapptk.sweep()")


def _solved(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"].isin(SOLVED) & frame["step_time_ms"].notna()]


def _source(rows: pd.DataFrame, **extra: Any) -> ColumnDataSource:
    """A source of rows for hover: labels as text, the list column dropped, budget as text."""
    data = rows.drop(columns=[c for c in ("peak_mb", "key", "error") if c in rows.columns]).copy()
    for col in _LABELS:
        if col in data.columns:
            data[col] = data[col].astype(str)
    if "memory_budget_mb" in data.columns:
        data["budget_text"] = [
            "unlimited" if pd.isna(b) else f"{b:,.0f} MB" for b in data["memory_budget_mb"]
        ]
    for name, values in extra.items():
        data[name] = values
    return ColumnDataSource(data.reset_index(drop=True))


def _title(what: str, frame: pd.DataFrame) -> str:
    unsolved = int((~frame["status"].isin(SOLVED)).sum())
    return f"{what} ({len(frame) - unsolved} solved, {unsolved} without a plan)"


def _colors(labels: Sequence[Any]) -> dict[Any, str]:
    return dict(zip(labels, look.series_colors(len(labels)), strict=True))


_AXIS_LABELS = {
    "memory_budget_mb": "memory budget per device (MB)",
    "step_time_ms": "step time (ms)",
    "peak_mb_max": "peak memory, fullest device (MB)",
    "chunks": "chunks per device (v)",
    "stages": "stages (p)",
    "micro_batches": "micro-batches (m)",
    "bubble_of_compute": "bubble (of compute)",
}


def _axis_label(column: str) -> str:
    """A column name as an axis label: words, and the unit in parentheses."""
    if column in _AXIS_LABELS:
        return _AXIS_LABELS[column]
    for suffix, unit in (("_ms", " (ms)"), ("_mb", " (MB)")):
        if column.endswith(suffix):
            return column[: -len(suffix)].replace("_", " ") + unit
    return column.replace("_", " ")


_MARKERS = ("circle", "square", "triangle", "diamond", "inverted_triangle", "hex", "star", "plus")
_DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")

def _levels(series: pd.Series, *, missing: bool = False) -> list[Any]:
    """The distinct values of a column in their natural order (categories in category
    order); with ``missing``, NaN last if present."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        present = set(series.dropna())
        levels = [c for c in series.cat.categories if c in present]
    else:
        levels = sorted(series.dropna().unique().tolist())
    if missing and series.isna().any():
        levels.append(math.nan)
    return levels


def step_time_by_budget(
    frame: pd.DataFrame,
    *,
    color: str = "schedule",
    y: str = "step_time_ms",
    width: int | None = None,
    height: int = 400,
) -> figure:
    """The best (least) ``y`` at each memory budget, one line per value of ``color``.

    At each budget the line takes the best solved point over every other swept axis; the
    hover names that point. Rows with an unlimited budget (NaN) are left out.
    """
    _check(frame, ["memory_budget_mb", "status", color, y])
    rows = _solved(frame)
    rows = rows[rows["memory_budget_mb"].notna()]
    fig = figure(
        width=width or look.current().width, height=height, tools=_TOOLS,
        title=_title(f"best {_axis_label(y)} by memory budget", frame),
        x_axis_label=_axis_label("memory_budget_mb"), y_axis_label=_axis_label(y),
    )
    circles = []
    for i, (label, col) in enumerate(_colors(_levels(frame[color])).items()):
        group = rows[rows[color] == label]
        if group.empty:
            continue
        best = group.loc[group.groupby("memory_budget_mb")[y].idxmin()].sort_values("memory_budget_mb")
        src = _source(best)
        # distinct dashes and markers keep coinciding lines visible
        fig.line("memory_budget_mb", y, source=src, color=col, line_width=2, legend_label=str(label),
                 line_dash=_DASHES[i % len(_DASHES)])
        circles.append(fig.scatter("memory_budget_mb", y, source=src, color=col, size=9, legend_label=str(label),
                                   marker=_MARKERS[i % len(_MARKERS)]))
    fig.add_tools(HoverTool(renderers=circles, tooltips=_SETUP))
    number_axes(fig)
    if circles:
        fig.legend.location = "top_right"
        fig.legend.click_policy = "hide"
        fig.legend.title = color
    return look.finish(fig, width=width)


def _factor(value: Any) -> str:
    """An axis label: numbers with thousands separators (whole floats without ``.0``), NaN
    (an unlimited budget) as ``none``."""
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return "none"
        if float(value).is_integer():
            return f"{int(value):,}"
        return f"{value:,g}"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f"{int(value):,}"
    return str(value)


def heatmap(
    frame: pd.DataFrame,
    x: str = "chunks",
    y: str = "schedule",
    *,
    value: str = "step_time_ms",
    width: int | None = None,
    height: int = 400,
) -> figure:
    """One cell per (``x``, ``y``) pair: the best (least) ``value`` over every other axis.

    Cells are coloured by the value and labelled with it; pairs that were swept but have no
    solved point show their best status instead (e.g. ``infeasible``).
    """
    _check(frame, [x, y, value, "status"])
    xs = [_factor(v) for v in _levels(frame[x], missing=True)]
    ys = [_factor(v) for v in _levels(frame[y], missing=True)]
    keyed = frame.assign(_x=frame[x].map(_factor).astype(object), _y=frame[y].map(_factor).astype(object))
    rows = _solved(keyed)
    best = rows.loc[rows.groupby(["_x", "_y"], observed=True)[value].idxmin()] if not rows.empty else rows
    solved_pairs = set(zip(best["_x"], best["_y"], strict=True))
    # swept pairs without a plan: their best status, drawn grey
    rest = keyed[[(a, b) not in solved_pairs for a, b in zip(keyed["_x"], keyed["_y"], strict=True)]]
    rest = rest.sort_values("status").drop_duplicates(["_x", "_y"])
    fig = figure(
        x_range=xs, y_range=list(reversed(ys)), width=width or look.current().width, height=height,
        tools="hover,save,reset",
        title=_title(f"best {_axis_label(value)} by {_axis_label(x)} and {_axis_label(y)}", frame),
        x_axis_label=_axis_label(x), y_axis_label=_axis_label(y),
        toolbar_location="right",
    )
    fig.grid.grid_line_color = None
    vals = best[value].to_numpy(dtype=float)
    low, high = (float(np.nanmin(vals)), float(np.nanmax(vals))) if len(vals) else (0.0, 1.0)
    palette = look.sequential_palette()
    mapper = LinearColorMapper(palette=palette, low=low, high=high if high > low else low + 1)
    # the number on a cell in black on light colours, white on dark ones
    shade = np.clip(((vals - low) / max(high - low, 1e-12) * 255).astype(int), 0, 255) if len(vals) else []
    src = _source(best, cell_text=[f"{v:,.0f}" for v in vals],
                  cell_text_color=[look.text_color(palette[i]) for i in shade])
    src.data["_x"], src.data["_y"] = best["_x"].tolist(), best["_y"].tolist()
    cells = fig.rect("_x", "_y", 1, 1, source=src, fill_color={"field": value, "transform": mapper},
                     line_color="white")
    fig.text("_x", "_y", text="cell_text", source=src, text_align="center", text_baseline="middle",
             text_color="cell_text_color", text_font_size="11px")
    if not rest.empty:
        gsrc = _source(rest, cell_text=rest["status"].astype(str).tolist())
        gsrc.data["_x"], gsrc.data["_y"] = rest["_x"].tolist(), rest["_y"].tolist()
        empty = fig.rect("_x", "_y", 1, 1, source=gsrc, fill_color="#dddddd", line_color="white")
        fig.text("_x", "_y", text="cell_text", source=gsrc, text_align="center", text_baseline="middle",
                 text_color="#555555", text_font_size="10px")
        fig.select_one(HoverTool).renderers = [cells, empty]
    else:
        fig.select_one(HoverTool).renderers = [cells]
    fig.select_one(HoverTool).tooltips = _SETUP
    fig.add_layout(ColorBar(color_mapper=mapper, title=_axis_label(value), width=10, formatter=thousands()), "right")
    return look.finish(fig, width=width)


def pareto_front(frame: pd.DataFrame, x: str = "peak_mb_max", y: str = "step_time_ms") -> pd.DataFrame:
    """The solved rows that no other solved row beats in both ``x`` and ``y`` (least is best),
    sorted by ``x``."""
    rows = _solved(frame).dropna(subset=[x, y])
    keep = _front_indices(rows[[x, y]].to_numpy(dtype=float))
    return rows.iloc[keep].sort_values([x, y], kind="stable")


def pareto(
    frame: pd.DataFrame,
    *,
    x: str = "peak_mb_max",
    y: str = "step_time_ms",
    color: str = "schedule",
    width: int | None = None,
    height: int = 450,
) -> figure:
    """Every solved point by ``x`` (peak memory) and ``y`` (step time), coloured by ``color``,
    with the Pareto front (no point is both lighter and faster) as a step line."""
    _check(frame, [x, y, color, "status"])
    rows = _solved(frame).dropna(subset=[x, y])
    fig = figure(
        width=width or look.current().width, height=height, tools=_TOOLS, title=_title(f"{y} against {x}", frame),
        x_axis_label=_axis_label(x), y_axis_label=_axis_label(y),
    )
    dots = []
    for i, (label, col) in enumerate(_colors(_levels(frame[color])).items()):
        group = rows[rows[color] == label]
        if group.empty:
            continue
        dots.append(fig.scatter(x, y, source=_source(group), color=col, size=8, alpha=0.7, legend_label=str(label),
                                marker=_MARKERS[i % len(_MARKERS)]))
    front = pareto_front(rows, x, y)
    if not front.empty:
        src = _source(front)
        fig.step(x, y, source=src, mode="after", color="black", line_width=2, legend_label="Pareto front")
        dots.append(fig.scatter(x, y, source=src, color="black", size=9, marker="diamond", legend_label="Pareto front"))
    fig.add_tools(HoverTool(renderers=dots, tooltips=_SETUP))
    number_axes(fig)
    if dots:
        fig.legend.location = "top_right"
        fig.legend.click_policy = "hide"
    return look.finish(fig, width=width)

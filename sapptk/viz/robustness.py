"""How sure a plan is, drawn: its step time and peaks under perturbed profiles
(:meth:`~sapptk.plan.Plan.sensitivity`), and where its critical path runs
(:meth:`~sapptk.plan.Plan.critical`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, HoverTool, Span
from bokeh.plotting import figure

from sapptk.errors import SapptkError
from sapptk.plan import Plan
from sapptk.sensitivity import PERTURBATIONS, Sensitivity
from sapptk.viz import look

if TYPE_CHECKING:
    from bokeh.models import UIElement

__all__ = ["critical_plot", "sensitivity_plot", "validation_plot"]

_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"


def _perturbation_colors() -> dict[str, str]:
    colors = look.category_colors()
    return {"independent": colors["forward"], "shared": colors["input-gradient"]}


def _kind_colors() -> dict[str, str]:
    colors = look.category_colors()
    return {"F": colors["forward"], "B": colors["backward"], "W": colors["weight-gradient"]}


def sensitivity_plot(result: Sensitivity, *, bins: int = 40, width: int | None = None) -> UIElement:
    """Two figures: the step-time distribution of each error model (histograms, the
    unperturbed step time as a line), and per device the 99th-percentile peak against the
    budget, with each device's chance of exceeding it in the hover. ``width``: None
    stretches (paper style: the column width), or px."""
    px = width or look.current().width
    if not isinstance(result, Sensitivity):
        raise SapptkError(f"sensitivity_plot: expected the result of plan.sensitivity(), got {type(result).__name__}")
    steps = result.samples[result.samples.device == 0]
    lo, hi = float(steps.step_time_ms.min()), float(steps.step_time_ms.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    left = figure(width=px // 2, height=320, title=f"step time, {len(steps) // len(PERTURBATIONS)} samples "
                  f"per model (time ±{result.time_error:.0%}, memory ±{result.memory_error:.0%})",
                  x_axis_label="step time (ms)", y_axis_label="share of samples", tools=_TOOLS)
    for kind in PERTURBATIONS:
        values = steps.loc[steps.perturbation == kind, "step_time_ms"].to_numpy(float)
        counts, _ = np.histogram(values, edges)
        src = ColumnDataSource({"left": edges[:-1], "right": edges[1:], "share": counts / max(len(values), 1)})
        left.quad(left="left", right="right", bottom=0, top="share", source=src, fill_alpha=0.45,
                  color=_perturbation_colors()[kind], legend_label=kind)
    left.add_layout(Span(location=result.base_step_ms, dimension="height", line_color="#1a1a1a",
                         line_dash="dashed"))
    left.xaxis.formatter = look.thousands()
    left.legend.location = "top_right"

    dev = result.devices
    devices = sorted(dev.device.unique().tolist())
    right = figure(width=px // 2, height=320, title="peak per device (99th percentile) against the budget",
                   x_axis_label="device", y_axis_label="MB", tools=_TOOLS)
    offset = {"independent": -0.2, "shared": 0.2}
    for kind in PERTURBATIONS:
        rows = dev[dev.perturbation == kind]
        src = ColumnDataSource({
            "x": rows.device.to_numpy(float) + offset[kind], "top": rows.peak_mb_q99.to_numpy(float),
            "median": rows.peak_mb_median.to_numpy(float), "p": rows.p_over_budget.to_numpy(float),
            "device": rows.device.to_numpy(),
        })
        bars = right.vbar(x="x", top="top", width=0.38, source=src, color=_perturbation_colors()[kind],
                          legend_label=kind, fill_alpha=0.8)
        right.add_tools(HoverTool(renderers=[bars], tooltips=[
            ("device", "@device"), ("model", kind), ("peak, 99th pct", "@top{0,0} MB"),
            ("peak, median", "@median{0,0} MB"), ("P(over budget)", "@p{0.0%}"),
        ]))
    budget = dev.budget_mb.iloc[0] if len(dev) else np.nan
    if np.isfinite(budget):
        right.add_layout(Span(location=float(budget), dimension="width", line_color=look.budget_color(),
                              line_dash="dashed", line_width=2))
    right.xaxis.ticker = devices
    right.yaxis.formatter = look.thousands()
    right.legend.location = "bottom_right"
    return look.finish(row(left, right), width=width)


def critical_plot(subject: Plan | pd.DataFrame, *, width: int | None = None) -> UIElement:
    """Per virtual stage, how many ms the step time grows per ms of its forward, backward and
    weight costs (stacked bars): where to optimise first. Takes a plan or its
    :meth:`~sapptk.plan.Plan.critical` frame."""
    frame: Any = subject.critical() if isinstance(subject, Plan) else subject
    if not isinstance(frame, pd.DataFrame) or not {"virtual_stage", "kind", "dstep_per_ms"} <= set(frame.columns):
        raise SapptkError("critical_plot: expected a Plan or the frame of plan.critical()")
    wide = frame.pivot_table(index="virtual_stage", columns="kind", values="dstep_per_ms", aggfunc="sum",
                             fill_value=0.0, observed=False)
    kind_colors = _kind_colors()
    kinds = [k for k in kind_colors if k in wide.columns]
    data: dict[str, Any] = {"virtual_stage": wide.index.to_numpy()}
    data.update({k: wide[k].to_numpy(float) for k in kinds})
    unique = bool(frame["unique"].iloc[0]) if "unique" in frame and len(frame) else True
    fig = figure(width=width or look.current().width, height=300, tools=_TOOLS,
                 title="step-time growth per ms of each stage's per-micro-batch cost"
                 + ("" if unique else " (critical paths tie: one of them shown)"),
                 x_axis_label="virtual stage", y_axis_label="ms of step per ms of cost")
    fig.vbar_stack(kinds, x="virtual_stage", width=0.8, source=ColumnDataSource(data),
                   color=[kind_colors[k] for k in kinds], legend_label=kinds)
    fig.add_tools(HoverTool(tooltips=[("virtual stage", "@virtual_stage"), *[(k, f"@{k}") for k in kinds]]))
    fig.legend.location = "top_right"
    return look.finish(fig, width=width)


def validation_plot(frame: pd.DataFrame, *, title: str = "predicted vs observed peak memory",
                    width: int | None = None) -> UIElement:
    """Observed peak MB per device as bars, the predicted peaks as markers, from the frame of
    :func:`sapptk.calibration.validate` (:func:`sapptk.calibration.figures.validation_figure`
    in the style in force). ``width`` as in :func:`sensitivity_plot`."""
    from sapptk.calibration.figures import validation_figure

    fig = validation_figure(frame, title=title)
    for renderer in fig.renderers:
        if type(renderer.glyph).__name__ == "Scatter":
            renderer.glyph.fill_color = renderer.glyph.line_color = look.category_colors()["backward"]
        elif type(renderer.glyph).__name__ == "VBar":
            renderer.glyph.fill_color = look.category_colors()["forward"]
    return look.finish(fig, width=width)

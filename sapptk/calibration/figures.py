"""Figures of calibration results; Bokeh loads only when a figure is drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from sapptk.errors import CalibrationError

if TYPE_CHECKING:
    from bokeh.plotting import figure as Figure

__all__ = ["validation_figure"]


def validation_figure(frame: pd.DataFrame, *, title: str = "predicted vs observed peak memory") -> Figure:
    """Bars of observed peak MB per device with the predicted peaks as markers, from the frame
    :func:`~sapptk.calibration.validate` returns (or a Calibration's ``residuals``); hover
    shows the error in MB and %."""
    needed = {"device", "predicted_mb", "observed_mb"}
    if not isinstance(frame, pd.DataFrame) or not needed <= set(frame.columns):
        raise CalibrationError(f"validation_figure: expected a DataFrame with columns {sorted(needed)}")
    from bokeh.models import ColumnDataSource, HoverTool, NumeralTickFormatter
    from bokeh.plotting import figure

    data = frame.copy()
    if "run" in data.columns:
        data["label"] = [f"{r}/{d}" for r, d in zip(data["run"], data["device"], strict=True)]
    else:
        data["label"] = data["device"].astype(str)
    data["error_mb"] = data["predicted_mb"] - data["observed_mb"]
    data["error_pct"] = 100.0 * data["error_mb"] / data["observed_mb"]
    source = ColumnDataSource(data[["label", "device", "predicted_mb", "observed_mb", "error_mb", "error_pct"]])
    fig = figure(x_range=list(data["label"]), title=title, height=320, width=max(420, 28 * len(data)),
                 x_axis_label="run/device" if "run" in frame.columns else "device",
                 y_axis_label="peak memory (MB)",
                 tools="pan,box_zoom,reset,save")
    fig.vbar(x="label", top="observed_mb", width=0.7, source=source, fill_alpha=0.5, legend_label="observed")
    fig.scatter(x="label", y="predicted_mb", size=9, marker="diamond", color="firebrick", source=source,
                legend_label="predicted")
    fig.add_tools(HoverTool(tooltips=[("device", "@label"), ("observed", "@observed_mb{0,0.0} MB"),
                                      ("predicted", "@predicted_mb{0,0.0} MB"),
                                      ("error", "@error_mb{+0,0.0} MB (@error_pct{+0.00} %)")]))
    legend = fig.legend[0]
    fig.center = [r for r in fig.center if r is not legend]
    fig.add_layout(legend, "right")  # beside the bars: it never covers a device
    legend.click_policy = "hide"
    fig.yaxis.formatter = NumeralTickFormatter(format="0,0")
    fig.sizing_mode = "stretch_width"  # the output's width, at least min_width
    fig.min_width = 420
    fig.toolbar.logo = None
    fig.y_range.start = 0
    return fig

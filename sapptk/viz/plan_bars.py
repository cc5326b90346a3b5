"""Per-device bars of a plan: where the memory goes against the budget, and where the
compute time goes.

:func:`stage_bars` draws two figures side by side, each with one renderer over one
source whose rows are (device, part) boxes stacked in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from bokeh.layouts import row
from bokeh.models import CDSView, ColumnDataSource, IndexFilter, Label, Legend, LegendItem, Range1d, Span
from bokeh.plotting import figure

from sapptk.errors import SapptkError
from sapptk.plan import Plan
from sapptk.simulation import Simulation
from sapptk.viz import look
from sapptk.viz.subjects import AUTO, Budget, check_budget, own_budget

if TYPE_CHECKING:
    from bokeh.models import UIElement

__all__ = ["device_frame", "stage_bars"]

_NEEDED = ("device", "params_mb", "peak_mb", "forward_ms", "backward_ms")
def _memory_parts() -> tuple[tuple[str, str], ...]:
    if look.current().paper:
        return ("parameters", look.OKABE_ITO[0]), ("constant", "#999999"), ("activations", look.OKABE_ITO[5])
    return ("parameters", "#5b6c8f"), ("constant", "#a0a7b4"), ("activations", "#9db4d9")


def _time_parts() -> tuple[tuple[str, str], ...]:
    colors = look.category_colors()
    return ("forward", colors["forward"]), ("backward", colors["backward"]), ("recompute", look.recompute_color())


def device_frame(subject: Any, constant_mb: float | None = None) -> tuple[pd.DataFrame, float]:
    """The per-device frame :func:`stage_bars` draws, and the constant memory (MB).

    A :class:`~sapptk.plan.Plan` gives ``plan.devices`` and its config's constant memory;
    a :class:`~sapptk.simulation.Simulation` gives the same columns from its costs and
    peaks (no ``recompute_ms``: a simulation does not know which part of a backward is
    recompute); a DataFrame is taken as it is (constant 0 unless ``constant_mb``).
    """
    if isinstance(subject, Plan):
        constant = subject.config.constant_memory if constant_mb is None else constant_mb
        return subject.devices, float(constant or 0.0)
    if isinstance(subject, Simulation):
        costs = subject.costs
        placement = np.asarray(subject.program.placement)
        p = int(subject.program.stages)

        def per_device(values: Any) -> np.ndarray:
            return np.bincount(placement, weights=np.asarray(values, dtype=float), minlength=p)

        constant = costs.get("constant", 0.0) if constant_mb is None else constant_mb
        frame = pd.DataFrame({
            "device": np.arange(p),
            "params_mb": per_device(costs["params"]),
            "peak_mb": subject.peak_memory.to_numpy(dtype=float),
            "forward_ms": per_device(costs["forward"]),
            "backward_ms": per_device(np.asarray(costs["backward"]) + np.asarray(costs["weight"])),
        })
        return frame, float(constant or 0.0)
    if isinstance(subject, pd.DataFrame):
        missing = [c for c in _NEEDED if c not in subject.columns]
        if missing:
            raise SapptkError(f"stage_bars: the per-device frame lacks columns {missing}: expected {list(_NEEDED)} "
                              "(as in Plan.devices)")
        return subject, float(constant_mb or 0.0)
    raise SapptkError(f"stage_bars: expected a sapptk Plan, Simulation or per-device DataFrame, "
                      f"got {type(subject).__name__}")


def _budgets(subject: Any, frame: pd.DataFrame, budget: Budget) -> np.ndarray:
    """The budget of every device (NaN: none)."""
    n = len(frame)
    if isinstance(budget, str) and budget == AUTO:
        if isinstance(subject, pd.DataFrame):
            return frame["budget_mb"].to_numpy(dtype=float) if "budget_mb" in frame else np.full(n, np.nan)
        own = own_budget(subject)
        return np.full(n, np.nan if own is None else float(own))
    value = check_budget(budget, "stage_bars")
    return np.full(n, np.nan if value is None else value)


def _stacked(device: np.ndarray, parts: list[np.ndarray], names: list[str], colors: list[str]) -> dict[str, Any]:
    """Rows (part, device) of a stacked bar: bottom and top of each part on each device."""
    values = np.vstack(parts) if parts else np.zeros((0, len(device)))
    tops = np.cumsum(values, axis=0)
    k, n = values.shape
    return {
        "device": np.tile(device.astype(str).astype(object), k),
        "part": np.repeat(np.asarray(names, dtype=object), n),
        "color": np.repeat(np.asarray(colors, dtype=object), n),
        "bottom": (tops - values).ravel(),
        "top": tops.ravel(),
        "value": values.ravel(),
    }


def _bars(title: str, factors: list[str], width: int, unit: str, data: dict[str, Any], tooltips: list,
          name: str) -> tuple[figure, Any, ColumnDataSource]:
    fig = figure(title=title, x_range=factors, width=width, height=340, tools="hover,save,reset",
                 tooltips=tooltips, x_axis_label="device", y_axis_label=unit, output_backend="webgl")
    src = ColumnDataSource(data)
    bars = fig.vbar(x="device", bottom="bottom", top="top", width=0.8, source=src, fill_color="color",
                    line_color="color", name=name)
    fig.xgrid.grid_line_color = None
    fig.yaxis.formatter = look.thousands()
    fig.toolbar.logo = None
    return fig, bars, src


def _legend(fig: figure, items: list[LegendItem]) -> None:
    fig.add_layout(Legend(items=items, orientation="horizontal", location="top_left", padding=2, margin=2,
                          label_text_font_size="9pt", glyph_height=14, glyph_width=18, spacing=8), "above")


def stage_bars(
    subject: Any,
    *,
    budget: Budget = AUTO,
    width: int | None = None,
    constant_mb: float | None = None,
) -> UIElement:
    """Per device: peak memory (parameters, constant, activations) stacked against the
    budget, and compute time per micro-batch (forward, backward, recompute) stacked.

    ``subject`` is a :class:`~sapptk.plan.Plan`, a :class:`~sapptk.simulation.Simulation`
    or a per-device frame with the columns of ``Plan.devices`` (``device``, ``params_mb``,
    ``peak_mb``, ``forward_ms``, ``backward_ms`` with recompute included; optional
    ``recompute_ms`` and ``budget_mb``); see :func:`device_frame`. Activation memory is
    ``peak_mb - params_mb - constant``. ``budget`` as in :func:`sapptk.viz.timeline`
    ("auto": the plan's, the simulation's or the frame's ``budget_mb``). ``width``: None
    (default) stretches to the output width (paper style: the column width), or px.
    """
    frame, constant = device_frame(subject, constant_mb)
    n = len(frame)
    dev = frame["device"].to_numpy(dtype=np.int64)
    params = frame["params_mb"].to_numpy(dtype=float)
    peak = frame["peak_mb"].to_numpy(dtype=float)
    forward = frame["forward_ms"].to_numpy(dtype=float)
    backward = frame["backward_ms"].to_numpy(dtype=float)
    recompute = frame["recompute_ms"].to_numpy(dtype=float) if "recompute_ms" in frame else np.zeros(n)
    budgets = _budgets(subject, frame, budget)
    factors = [str(d) for d in dev]
    half = max((width or look.current().width) // 2, 150)

    mem_parts = [params, np.full(n, constant), np.maximum(peak - params - constant, 0.0)]
    keep = [0, 1, 2] if constant > 0 else [0, 2]
    memory_parts, time_parts = _memory_parts(), _time_parts()
    mem_data = _stacked(dev, [mem_parts[i] for i in keep], [memory_parts[i][0] for i in keep],
                        [memory_parts[i][1] for i in keep])
    k = len(keep)
    mem_data.update(params_mb=np.tile(params, k), constant_mb=np.full(n * k, constant),
                    activation_mb=np.tile(mem_parts[2], k), peak_mb=np.tile(peak, k), budget_mb=np.tile(budgets, k))
    mem, mem_bars, mem_src = _bars(
        "peak memory per device (MB)", factors, half, "MB", mem_data,
        [("device", "@device"), ("part", "@part: @value{0,0} MB"), ("parameters", "@params_mb{0,0} MB"),
         ("constant", "@constant_mb{0,0} MB"), ("activations", "@activation_mb{0,0} MB"),
         ("peak", "@peak_mb{0,0} MB"), ("budget", "@budget_mb{0,0} MB")],
        "memory",
    )
    mem_items = [LegendItem(label=memory_parts[i][0], renderers=[mem_bars], index=j * n)
                 for j, i in enumerate(keep) if n]
    finite = budgets[np.isfinite(budgets)]
    top = float(peak.max(initial=0.0))
    if len(finite):
        if len(finite) == n and np.allclose(finite, finite[0]):
            mem.add_layout(Span(location=float(finite[0]), dimension="width", line_color=look.budget_color(),
                                line_dash="dashed", line_width=2, name="budget"))
            mem.add_layout(Label(x=0, y=float(finite[0]), x_units="screen", text=f" budget {finite[0]:,.0f} MB",
                                 text_font_size="8pt", text_color=look.budget_color(), y_offset=2,
                                 name="budget-label"))
        else:  # budgets that differ by device: a mark on each bar (the first row of each device)
            marks = mem.scatter(x="device", y="budget_mb", source=mem_src, view=CDSView(filter=IndexFilter(
                list(range(n)))), marker="dash", size=30, color=look.budget_color(), line_width=2,
                name="budget-marks")
            mem_items.append(LegendItem(label="budget", renderers=[marks]))
        top = max(top, float(finite.max()))
    mem.y_range = Range1d(0, top * 1.08 + 1e-9)
    _legend(mem, mem_items)

    plain = np.maximum(backward - recompute, 0.0)
    time_data = _stacked(dev, [forward, plain, recompute], [p for p, _ in time_parts], [c for _, c in time_parts])
    time_data.update(forward_ms=np.tile(forward, 3), backward_ms=np.tile(backward, 3),
                     recompute_ms=np.tile(recompute, 3))
    time, time_bars, _ = _bars(
        "compute time per device and micro-batch (ms)", factors, half, "ms", time_data,
        [("device", "@device"), ("part", "@part: @value{0,0.00} ms"), ("forward", "@forward_ms{0,0.00} ms"),
         ("backward", "@backward_ms{0,0.00} ms (recompute included)"), ("recompute", "@recompute_ms{0,0.00} ms")],
        "time",
    )
    time.y_range = Range1d(0, float((forward + plain + recompute).max(initial=0.0)) * 1.08 + 1e-9)
    _legend(time, [LegendItem(label=name, renderers=[time_bars], index=j * n)
                   for j, (name, _) in enumerate(time_parts) if n])
    return look.finish(row(mem, time, name="stage_bars"), width=width)

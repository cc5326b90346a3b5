"""The Explorer's result tabs: a plan's timeline (next to the even split), per-device table,
MindFormers YAML, memory and time per device, and every export format.

:class:`ResultTabs` builds the tabs and knows how to show a plan in each and how to empty
it; a ``lazy`` tab is drawn when it is first opened, so figures out of view do not hold
back the status line. The text helpers (:func:`export_texts`, :func:`result_text`) are
tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from sapptk.errors import SapptkError

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["EXPORT_FORMATS", "ResultTabs", "bokeh_widget", "error_text", "export_texts", "ms", "result_text"]

EXPORT_FORMATS: tuple[str, ...] = ("sapptk plan file", "MindFormers", "Megatron-LM", "torchtitan",
                                   "PyTorch schedule CSV")
"""The formats of the Explorer's export tab."""


def error_text(exc: BaseException) -> str:
    """One line for the status: the message of our own errors, the type and message otherwise."""
    if isinstance(exc, SapptkError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms" if value >= 1000 else f"{value:,.1f} ms"


@dataclass
class Tab:
    """A result tab: its title, its widget, how to show a plan in it and how to empty it."""

    title: str
    widget: w.Widget
    show: Callable[[Plan, Plan | None], None]
    clear: Callable[[], None]
    lazy: bool = False


class ResultTabs:
    """The tabs (``widget``, a ``w.Tab``; ``tabs``, their :class:`Tab` records) and their
    pages: ``timeline``, ``table``, ``yaml``, ``bars`` (Boxes holding a
    ``jupyter_bokeh.BokehModel`` once drawn), ``exports`` (``export_format``, a Dropdown, and
    ``export_text``), then the ``extra`` tabs given (title → widget, shown as they are).
    ``figure`` is the Bokeh layout of the timeline tab."""

    def __init__(self, extra: dict[str, w.Widget] | None = None) -> None:
        self.figure: Any = None
        self.timeline = w.Box(layout=w.Layout(width="100%"))
        self.table = w.HTML()
        self.yaml = w.Textarea(layout=w.Layout(width="100%", height="320px"))  # editable, so it can be copied
        self.bars = w.Box(layout=w.Layout(width="100%"))
        self.export_format = w.Dropdown(options=list(EXPORT_FORMATS), description="format")
        self.export_text = w.Textarea(layout=w.Layout(width="100%", height="320px"))
        self.exports = w.VBox([self.export_format, self.export_text])
        self._exports: dict[str, str] = {}
        self.export_format.observe(lambda _change: self._show_export(), names="value")
        self.tabs = [
            Tab("timeline", self.timeline, self._show_timeline, self._clear_timeline),
            Tab("per device", self.table, lambda plan, _b: setattr(self.table, "value", _device_table(plan)),
                lambda: setattr(self.table, "value", "")),
            Tab("MindFormers YAML", self.yaml, self._show_yaml, lambda: setattr(self.yaml, "value", "")),
            Tab("memory & time", self.bars, self._show_bars, lambda: setattr(self.bars, "children", ()), lazy=True),
            Tab("export", self.exports, self._fill_exports, self._clear_exports, lazy=True),
            *(Tab(title, widget, lambda _plan, _b: None, lambda: None) for title, widget in (extra or {}).items()),
        ]
        self.widget = w.Tab(children=[tab.widget for tab in self.tabs])
        for i, tab in enumerate(self.tabs):
            self.widget.set_title(i, tab.title)

    def _show_timeline(self, plan: Plan, baseline: Plan | None) -> None:
        from sapptk import viz

        subjects, labels = [plan], ["balanced plan"]
        if baseline is not None:
            subjects.append(baseline)
            labels.append(baseline.source.replace("even_split(", "even split (").replace("((", "("))
        self.figure = viz.compare(*subjects, labels=labels, memory=True)  # as wide as the output
        self.timeline.children = (bokeh_widget(self.figure),)

    def _clear_timeline(self) -> None:
        self.figure = None
        self.timeline.children = ()

    def _show_bars(self, plan: Plan, _baseline: Plan | None) -> None:
        from sapptk import viz

        self.bars.children = (bokeh_widget(viz.stage_bars(plan)),)

    def _show_yaml(self, plan: Plan, _baseline: Plan | None) -> None:
        try:
            self.yaml.value = plan.export("mindformers").text
        except Exception as exc:  # e.g. several groups the MindFormers lists cannot express
            self.yaml.value = f"# no MindFormers config: {error_text(exc)}"

    def _show_export(self) -> None:
        self.export_text.value = self._exports.get(self.export_format.value, "")

    def _fill_exports(self, plan: Plan, _baseline: Plan | None) -> None:
        self._exports = export_texts(plan)
        self._show_export()

    def _clear_exports(self) -> None:
        self._exports = {}
        self._show_export()


def result_text(plan: Plan, baseline: Plan | None, seconds: float, *, stopped: str | None) -> str:
    """``"in 0.8 s: step time ..."``: the status after the word for the plan's status."""
    text = f"in {seconds:.1f} s: step time {ms(plan.step_time)}"
    if plan.status == "feasible":
        why = stopped or "time limit reached"
        if plan.bound is not None and plan.gap is not None:
            text += f", bound {ms(plan.bound)}, gap {100 * plan.gap:.1f}% ({why})"
        else:  # offload or per-micro-batch recompute: the search's bound holds for per-stage plans only
            text += f", not proven optimal ({why}; no proven bound for {_unbounded(plan)}: see the plan's message)"
    elif plan.gap:
        text += f", gap {100 * plan.gap:.2f}%"
    if baseline is not None and baseline.step_time and plan.step_time:
        fit = "" if baseline.fits else ", over budget"
        text += (f". Even split ({baseline.source.removeprefix('even_split(').rstrip(')')}{fit}): "
                 f"{ms(baseline.step_time)}, {baseline.step_time / plan.step_time:.2f}x the plan")
    return text


def _unbounded(plan: Plan) -> str:
    """What a plan without a bound does that the search's bound does not cover."""
    if plan.alternative is not None:
        return "recompute per micro-batch"
    if plan.offload is not None and plan.offload.any():
        return "activation offload"
    return "this plan"


def export_texts(plan: Plan) -> dict[str, str]:
    """The plan in every export format, as text; a format that cannot hold the plan says why."""
    makers = {
        "sapptk plan file": lambda: plan.export("sapptk").text,
        "MindFormers": lambda: plan.export("mindformers").text,
        "Megatron-LM": lambda: plan.export("megatron").text,
        "torchtitan": lambda: _torchtitan_text(plan),
        "PyTorch schedule CSV": lambda: plan.export("torch-csv").text,
    }
    out = {}
    for label, make in makers.items():
        try:
            out[label] = make()
        except Exception as exc:  # shown in the tab, never a traceback
            out[label] = f"# no {label} export: {error_text(exc)}"
    return out


def _torchtitan_text(plan: Plan) -> str:
    export = plan.export("torchtitan")
    text = export.text
    if "csv" in export.texts:
        text += f"\n# ---- {export.data.csv_name} ----\n{export.texts['csv']}"
    return text


def bokeh_widget(fig: Any) -> w.Widget:
    """A Bokeh layout as a widget that takes the whole width of its output (a stretching
    figure then fills it instead of shrinking to its minimum width)."""
    from jupyter_bokeh.widgets import BokehModel

    return BokehModel(fig, layout=w.Layout(width="100%"))


def _device_table(plan: Plan) -> str:
    frame = plan.devices.copy()
    for col in frame.columns:
        if col.endswith("_mb"):
            frame[col] = frame[col].map(lambda x: "" if x != x else f"{x:,.0f}")
        elif col.endswith("_ms"):
            frame[col] = frame[col].map(lambda x: f"{x:,.1f}")
    return frame.to_html(index=False, border=0, classes="sapptk-devices")

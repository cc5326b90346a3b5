"""An ipywidgets explorer: pick a schedule and a pipeline setup, solve, look at the plan.

``Explorer(profile)`` shows the controls (schedule, stages, micro-batches, chunks, splits,
memory budget, recompute modes, time limit, Solve and Cancel), a status line, and after
solving the plan in tabs: its timeline next to the even split, its per-device table, its
MindFormers YAML, its memory and time per device (Bokeh inside the widgets through
``jupyter_bokeh``), and the plan in every export format (:data:`EXPORT_FORMATS`). Options
the chosen schedule does not allow are disabled.

Solve runs the search and draws the figures on a background thread, so the kernel stays
free; Cancel asks the search to stop and show its best plan so far. The status line goes
``solving…`` → ``drawing…`` → the result, and Solve is enabled again only once the
figures in view are in the tabs (the memory & time tab is drawn when it is first opened).
When the controls no longer describe the plan shown (another setup, or an invalid one), a
note above the tabs says the tabs are stale. Tests drive it
without a kernel: set ``.value``, call ``.click()``, then :meth:`Explorer.wait`.

(Over 500 lines: the controls, the background solve and the tabs are the state of one
widget; the pure helpers at the end are tested on their own.)
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from sapptk.config import PipelineConfig
from sapptk.errors import SapptkError
from sapptk.explorer_inputs import HOOK, checked_entry
from sapptk.profile import MODES
from sapptk.schedules import get, names

if TYPE_CHECKING:
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["EXPORT_FORMATS", "Explorer", "explorer_from_card", "export_texts"]

_MAX_STAGES = 64
_MAX_MICRO_BATCHES = 512
_MAX_CHUNKS = 8
_MAX_SPLITS = 8
_DESC = {"description_width": "130px"}
_WIDE = w.Layout(width="420px")
_COLORS = {"ready": "#555", "solving…": "#3a6ea5", "cancelling…": "#3a6ea5", "drawing…": "#3a6ea5",
           "optimal": "#2e7d32", "feasible": "#b26a00", "infeasible": "#c62828", "invalid": "#c62828",
           "unknown": "#b26a00", "error": "#c62828", "cancelled": "#b26a00"}
_POLL_S = 0.05  # wait() joins in slices so that a kernel interrupt is seen at once


def _error_text(exc: BaseException) -> str:
    """One line for the status: the message of our own errors, the type and message otherwise."""
    if isinstance(exc, SapptkError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms" if value >= 1000 else f"{value:,.1f} ms"


def _setup_text(config: PipelineConfig) -> str:
    budget = "no budget" if config.memory_budget is None else f"{config.memory_budget:,.0f} MB"
    k = f" k={config.splits}" if config.splits != 1 else ""
    return f"{config.schedule} p={config.stages} v={config.chunks} m={config.micro_batches}{k}, {budget}"


@dataclass
class _Tab:
    """A result tab: its title, its widget, how to show a plan in it and how to empty it.

    A ``lazy`` tab is filled when it is first opened (or at once if it is open), so figures
    out of view do not hold back the status line.
    """

    title: str
    widget: w.Widget
    show: Callable[[Plan, Plan | None], None]
    clear: Callable[[], None]
    lazy: bool = False


class Explorer:
    """Interactive planner for one profile (display it, or its ``.widget``, in Jupyter).

    Attributes (all ipywidgets): ``schedule``, ``stages``, ``micro_batches``, ``chunks``,
    ``splits``, ``budget`` (MB, 0 = no limit), ``recompute`` (``{mode: Checkbox}``),
    ``time_limit``, ``solve_button``, ``cancel_button``, ``status``, ``stale_note``,
    ``entries`` (the box beside each control where a value can be typed: ``"stages"``,
    ``"micro-batches"``, ``"chunks"``, ``"splits"``, ``"memory budget"``, ``"time limit"``;
    a value out of range is corrected and ``input_note`` says how), ``recompute_note``,
    ``results`` (the Tab) and its pages ``timeline``, ``table``, ``yaml``, ``bars`` (Boxes
    holding a ``jupyter_bokeh.BokehModel`` once drawn; ``bars`` when its tab is opened),
    ``exports`` (``export_format``, a Dropdown, and ``export_text``, that format's text; filled
    when the tab is opened). After a solve, ``plan`` and
    ``baseline`` (the even split) hold the :class:`~sapptk.plan.Plan` objects, ``figure``
    the Bokeh layout of the timeline tab (it belongs to that widget's document: to show it
    elsewhere, build a new one with :mod:`sapptk.viz`) and ``draw_seconds`` the time the
    figures took. ``status_text`` is the status line as plain text; ``stale`` says whether
    the tabs show a plan for other settings than the controls'.
    """

    def __init__(
        self,
        profile: Profile,
        config: PipelineConfig | None = None,
        *,
        time_limit: float = 10,
        workers: int = 2,
    ) -> None:
        self.profile = profile
        self.workers = workers
        self.plan: Plan | None = None
        self.baseline: Plan | None = None
        self.figure: Any = None
        self.draw_seconds: float | None = None
        self._shown: PipelineConfig | None = None  # the setup of the plan in the tabs
        self._worker: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._run = 0  # number of the current solve; a thread whose number is older was abandoned
        self._pending: dict[int, tuple[Plan, Plan | None]] = {}  # lazy tabs not yet filled with the plan shown
        self._lock = threading.Lock()
        self._last_result: tuple[str, str] | None = None  # the status of the last solve (kind, text)
        self._interrupted = False  # the running solve was stopped by Kernel -> Interrupt
        cfg = config or PipelineConfig(4, 8)
        body_modes = {m for g in profile.body for m in g.modes}

        self.schedule = w.Dropdown(options=list(names()), value=cfg.schedule, description="schedule",
                                   style=_DESC, layout=_WIDE)
        self.schedule_info = w.HTML()
        self.stages = w.IntSlider(value=cfg.stages, min=1, max=_MAX_STAGES, description="stages (p)",
                                  style=_DESC, layout=_WIDE, continuous_update=False)
        self.micro_batches = w.IntSlider(value=cfg.micro_batches, min=1, max=_MAX_MICRO_BATCHES,
                                         description="micro-batches (m)", style=_DESC, layout=_WIDE,
                                         continuous_update=False)
        self.chunks = w.IntSlider(value=cfg.chunks, min=1, max=_MAX_CHUNKS, description="chunks (v)",
                                  style=_DESC, layout=_WIDE, continuous_update=False)
        self.splits = w.IntSlider(value=cfg.splits, min=1, max=_MAX_SPLITS, description="splits (k)",
                                  style=_DESC, layout=_WIDE, continuous_update=False)
        self.budget = w.BoundedFloatText(value=float(cfg.memory_budget or 0.0), min=0.0, max=1e9, step=1000.0,
                                         description="memory budget", style=_DESC,
                                         layout=w.Layout(width="300px"))
        self.recompute = {
            mode: w.Checkbox(value=mode in cfg.recompute and mode in body_modes, description=mode, indent=False,
                             disabled=mode not in body_modes, layout=w.Layout(width="80px"))
            for mode in MODES
        }
        self.time_limit = w.IntSlider(value=int(time_limit), min=1, max=300, description="time limit (s)",
                                      style=_DESC, layout=_WIDE, continuous_update=False)
        self.solve_button = w.Button(description="Solve", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True,
                                      tooltip="stop the search and show the best plan found so far")
        self.status = w.HTML()
        self.stale_note = w.HTML()
        self.input_note = w.HTML()  # what was changed in a typed value, and why
        missing = [m for m in MODES if m not in body_modes]
        for mode in missing:
            self.recompute[mode].tooltip = f"the profile gives no figures for {mode!r}: it cannot be used"
        self.recompute_note = w.HTML(
            f"<small>greyed: {', '.join(missing)} (the profile has no figures for "
            f"{'it' if len(missing) == 1 else 'them'})</small>" if missing else "")
        self._status_text = ""
        self._constant = float(cfg.constant_memory)
        self._comm = float(cfg.comm)

        self.entries: dict[str, w.Text] = {}  # the typed-value box beside each control, by its name

        def typed(control: w.ValueWidget, name: str, **kw: Any) -> w.Text:
            self.entries[name] = checked_entry(control, name, self._report_input, **kw)
            return self.entries[name]

        for slider in (self.stages, self.micro_batches, self.chunks, self.splits, self.time_limit):
            slider.readout = False  # the box beside it takes typed values, and says what it changed
        budget_box = typed(self.budget, "memory budget", width="110px")
        controls = w.VBox([
            self.schedule, self.schedule_info,
            w.HBox([self.stages, typed(self.stages, "stages")]),
            w.HBox([self.micro_batches, typed(self.micro_batches, "micro-batches")]),
            w.HBox([self.chunks, typed(self.chunks, "chunks")]),
            w.HBox([self.splits, typed(self.splits, "splits")]),
            w.HBox([w.Label("memory budget", layout=w.Layout(width="134px")), budget_box,
                    w.Label("MB per device (0: no limit)")]),
            w.HBox([w.Label("recompute modes", layout=w.Layout(width="134px")), *self.recompute.values(),
                    self.recompute_note]),
            w.HBox([self.time_limit, typed(self.time_limit, "time limit")]),
            w.HBox([self.solve_button, self.cancel_button]), self.input_note,
        ])
        from sapptk.choose_panel import ChoosePanel

        self.chooser = ChoosePanel(self)  # the "choose" tab: which setup to run
        self._tabs = self._build_tabs()
        self.results = w.Tab(children=[tab.widget for tab in self._tabs])
        for i, tab in enumerate(self._tabs):
            self.results.set_title(i, tab.title)
        self.widget = w.VBox([controls, self.status, self.stale_note, self.results])
        self.results.observe(self._on_tab, names="selected_index")

        self.schedule.observe(self._on_schedule, names="value")
        for ctl in (self.stages, self.chunks, self.micro_batches, self.splits, self.budget, self.time_limit,
                    *self.recompute.values()):
            ctl.observe(self._on_change, names="value")
        self.solve_button.on_click(lambda _button: self.start())
        self.cancel_button.on_click(lambda _button: self.cancel())
        self._on_schedule()

    # ------------------------------------------------------------- the tabs
    def _build_tabs(self) -> list[_Tab]:
        """The result tabs, in display order (add a tab here: title, widget, show, clear)."""
        self.timeline = w.Box(layout=w.Layout(width="100%"))
        self.table = w.HTML()
        self.yaml = w.Textarea(layout=w.Layout(width="100%", height="320px"))  # editable, so it can be copied
        self.bars = w.Box(layout=w.Layout(width="100%"))

        def show_timeline(plan: Plan, baseline: Plan | None) -> None:
            from sapptk import viz

            subjects, labels = [plan], ["balanced plan"]
            if baseline is not None:
                subjects.append(baseline)
                labels.append(baseline.source.replace("even_split(", "even split (").replace("((", "("))
            self.figure = viz.compare(*subjects, labels=labels, memory=True)  # as wide as the output
            self.timeline.children = (_bokeh(self.figure),)

        def show_bars(plan: Plan, _baseline: Plan | None) -> None:
            from sapptk import viz

            self.bars.children = (_bokeh(viz.stage_bars(plan)),)

        def show_yaml(plan: Plan, _baseline: Plan | None) -> None:
            try:
                self.yaml.value = plan.export("mindformers").text
            except Exception as exc:  # e.g. several groups the MindFormers lists cannot express
                self.yaml.value = f"# no MindFormers config: {_error_text(exc)}"

        def clear_timeline() -> None:
            self.figure = None
            self.timeline.children = ()

        self.export_format = w.Dropdown(options=list(EXPORT_FORMATS), description="format", style=_DESC)
        self.export_text = w.Textarea(layout=w.Layout(width="100%", height="320px"))
        self.exports = w.VBox([self.export_format, self.export_text])
        self._exports: dict[str, str] = {}

        def show_export() -> None:
            self.export_text.value = self._exports.get(self.export_format.value, "")

        def fill_exports(plan: Plan, _baseline: Plan | None) -> None:
            self._exports = export_texts(plan)
            show_export()

        def clear_exports() -> None:
            self._exports = {}
            show_export()

        self.export_format.observe(lambda _change: show_export(), names="value")

        return [
            _Tab("timeline", self.timeline, show_timeline, clear_timeline),
            _Tab("per device", self.table, lambda plan, _b: setattr(self.table, "value", _device_table(plan)),
                 lambda: setattr(self.table, "value", "")),
            _Tab("MindFormers YAML", self.yaml, show_yaml, lambda: setattr(self.yaml, "value", "")),
            _Tab("memory & time", self.bars, show_bars, lambda: setattr(self.bars, "children", ()), lazy=True),
            _Tab("export", self.exports, fill_exports, clear_exports, lazy=True),
            _Tab("choose", self.chooser.widget, lambda _plan, _b: None, lambda: None),
        ]

    def _on_tab(self, _change: Any = None) -> None:
        """Fill a lazy tab with the plan shown when it is opened."""
        with self._lock:
            pending = self._pending.pop(self.results.selected_index, None)
        if pending is not None:
            self._tabs[self.results.selected_index].show(*pending)

    # ------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # ---------------------------------------------------------- the setup
    def config(self) -> PipelineConfig:
        """The pipeline setup the controls describe (not yet validated)."""
        budget = float(self.budget.value)
        return PipelineConfig(
            stages=int(self.stages.value),
            micro_batches=int(self.micro_batches.value),
            chunks=int(self.chunks.value),
            schedule=self.schedule.value,
            splits=int(self.splits.value),
            memory_budget=budget if budget > 0 else None,
            constant_memory=self._constant,
            comm=self._comm,
            recompute=tuple(m for m, box in self.recompute.items() if box.value),
        )

    def check(self) -> str | None:
        """Why the current setup cannot be solved, or None when it can."""
        if not any(box.value for box in self.recompute.values()):
            return "pick at least one recompute mode"
        try:
            self.config().check(self.profile)
        except Exception as exc:  # a status line, never a traceback
            return _error_text(exc)
        return None

    def _on_schedule(self, _change: Any = None) -> None:
        spec = get(self.schedule.value)
        if spec.chunks is None:
            self.chunks.min, self.chunks.max = 1, _MAX_CHUNKS
            self.chunks.disabled = False
        else:
            self.chunks.max = max(max(spec.chunks), self.chunks.min)
            self.chunks.min = min(spec.chunks)
            self.chunks.max = max(spec.chunks)
            if self.chunks.value not in spec.chunks:
                self.chunks.value = spec.chunks[0]
            self.chunks.disabled = len(spec.chunks) == 1
        if not spec.splits:
            self.splits.value = 1
        self.splits.disabled = not spec.splits
        self.schedule_info.value = (
            f"<small>{html.escape(spec.description)}<br>allows {html.escape(spec.constraints)}</small>"
        )
        self._on_change()

    def _on_change(self, _change: Any = None) -> None:
        spec = get(self.schedule.value)
        need = max(spec.min_micro_batches(int(self.stages.value), int(self.chunks.value)), int(self.stages.value))
        self.micro_batches.min = min(need, self.micro_batches.max)
        self._mark_stale()
        if self.busy:
            return  # the status line belongs to the running solve
        problem = self.check()
        self.solve_button.disabled = problem is not None
        self.solve_button.tooltip = f"cannot solve: {problem}" if problem else "solve this setup"
        if problem:
            self._set_status("invalid", f": {problem}")
        elif self._last_result is not None:  # the last result stays, marked stale while it is
            kind, text = self._last_result
            self._set_status(kind, f"{text} [stale: for other settings; press Solve]" if self.stale else text)
        else:
            self._set_status("ready", ": press Solve")

    def _report_input(self, what: str) -> None:
        """Say what was changed in a typed value (``checked_entry``)."""
        self.input_note.value = f'<small style="color:#b26a00">{html.escape(what)}</small>'


    @property
    def stale(self) -> bool:
        """Whether the tabs show a plan for other settings than the controls' (or none fits them)."""
        if self._shown is None:
            return False
        try:
            return self.check() is not None or self.config() != self._shown
        except Exception:  # settings that do not even make a config
            return True

    def _mark_stale(self) -> None:
        if self.stale:
            self.stale_note.value = (
                '<div style="padding:2px 6px;background:#fff3cd;color:#664d03">The tabs show the plan for '
                f"{html.escape(_setup_text(self._shown))}, not for these settings: press Solve.</div>"
            )
        else:
            self.stale_note.value = ""

    @property
    def status_text(self) -> str:
        """The status line as plain text, e.g. ``"optimal in 0.8 s: step time ..."``."""
        return self._status_text

    def _set_status(self, kind: str, text: str) -> None:
        sep = "" if text.startswith(":") else " "
        self._status_text = f"{kind}{sep}{text}"
        self.status.value = (
            f'<div style="padding:4px 0"><b style="color:{_COLORS.get(kind, "#555")}">{html.escape(kind)}</b>'
            f"{sep}{html.escape(text)}</div>"
        )

    # -------------------------------------------------------------- solve
    @property
    def busy(self) -> bool:
        """Whether a solve (search or drawing) is under way."""
        worker = self._worker
        return worker is not None and worker.is_alive()

    def start(self) -> bool:
        """Start solving the current setup on a background thread (what the Solve button does).

        Returns False, with the reason in the status line, when the setup is invalid or a
        solve is already under way.
        """
        with self._lock:
            if self.busy:
                return False
            problem = self.check()
            if problem:
                self._set_status("invalid", f": {problem}")
                return False
            config = self.config()
            self._run += 1
            self._stop = threading.Event()
            self.solve_button.disabled = True
            self.cancel_button.disabled = False
            limit = float(self.time_limit.value)
            self._interrupted = False
            self.input_note.value = ""
            run = self._run
            HOOK.add(id(self), lambda: self._on_interrupt(run))
            how = "Cancel or Kernel → Interrupt stops it" if HOOK.install() else "Cancel stops it"
            self._set_status("solving…", f"(up to {self.time_limit.value} s; {how})")
            self._worker = threading.Thread(target=self._solve, args=(self._run, config, limit, self._stop),
                                            name="sapptk-explorer-solve", daemon=True)
            self._worker.start()
            return True

    def _on_interrupt(self, run: int) -> None:
        """Kernel → Interrupt while solve ``run`` goes on in the background: as Cancel. (Runs
        in the SIGINT handler on the main thread: takes no lock.)"""
        if run == self._run and self.busy:
            self._interrupted = True
            self.cancel()

    def cancel(self) -> None:
        """Ask the running search to stop; its best plan so far is then shown (what Cancel does)."""
        stop = self._stop
        if self.busy and stop is not None and not stop.is_set():
            stop.set()
            self.cancel_button.disabled = True
            why = "Kernel → Interrupt: " if self._interrupted else ""
            self._set_status("cancelling…", f": {why}stopping the search")

    def wait(self, timeout: float | None = None) -> Plan | None:
        """Block until the running solve has drawn its figures (or ``timeout`` s passed);
        return :attr:`plan`. A kernel interrupt while waiting cancels the solve, puts the
        controls back as they were before it, and is raised again."""
        worker = self._worker
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while worker is not None and worker.is_alive():
                left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                if left <= 0:
                    break
                worker.join(left)
        except KeyboardInterrupt:
            self._abandon(worker, "interrupted")
            raise
        return self.plan

    def solve(self) -> Plan | None:
        """Solve the current setup and wait until its figures are drawn; the plan, or None
        when the setup is invalid or the solve failed (the status line says why)."""
        try:
            if not self.start():
                return None
            return self.wait()
        except KeyboardInterrupt:  # also when it comes before wait() has begun
            self._abandon(self._worker, "interrupted")
            raise

    def _abandon(self, worker: threading.Thread | None, why: str) -> None:
        """Give up on a solve: stop its search, ignore whatever it still returns, and restore
        the controls and the status line."""
        with self._lock:
            if worker is None or worker is not self._worker:
                return
            if self._stop is not None:
                self._stop.set()
            self._run += 1  # the thread's results, if any, are dropped
            self._worker = None
            HOOK.remove(id(self))
            self.solve_button.disabled = False
            self.cancel_button.disabled = True
            note = "; the tabs still show the previous plan" if self._shown is not None else ""
            self._set_status("cancelled", f": {why}{note}")
            self._mark_stale()

    def _current(self, run: int) -> bool:
        return run == self._run

    def _status_of(self, run: int, kind: str, text: str) -> bool:
        """Set the status for solve number ``run`` unless it was abandoned; whether it was set."""
        with self._lock:
            if not self._current(run):
                return False
            self._set_status(kind, text)
            return True

    def _solve(self, run: int, config: PipelineConfig, time_limit: float, stop: threading.Event) -> None:
        """The background thread: search, then draw, then say so; always leaves the
        controls usable."""
        t0 = time.perf_counter()
        try:
            from sapptk.balancer import balance
            from sapptk.plan import even_baseline

            plan = balance(self.profile, config, time_limit=time_limit, workers=self.workers, stop=stop)
            baseline = even_baseline(self.profile, config) if plan.solved else None
            seconds = plan.solve_seconds or (time.perf_counter() - t0)
            stopped = ("stopped by Kernel → Interrupt" if self._interrupted else "stopped by Cancel"
                       ) if stop.is_set() else None
            self._show(run, plan, baseline, config, seconds, stopped=stopped)
        except BaseException as exc:  # the status line says it; the thread never dies silently
            self._status_of(run, "error", f": {_error_text(exc)}")
        finally:
            with self._lock:
                if self._current(run):
                    HOOK.remove(id(self))
                    self.solve_button.disabled = False
                    self.cancel_button.disabled = True

    def _show(self, run: int, plan: Plan, baseline: Plan | None, config: PipelineConfig, seconds: float, *,
              stopped: str | None) -> None:
        """Put a finished search's plan in the tabs (figures first), then in the status line."""
        if not plan.solved:
            with self._lock:
                if not self._current(run):
                    return
                self.plan, self.baseline = plan, baseline
                for tab in self._tabs:
                    tab.clear()
                self._pending.clear()
                self._shown = None
                self._mark_stale()
                why = (plan.message or "no plan").removeprefix(f"{plan.status}: ")
                self._last_result = (plan.status, f"after {seconds:.1f} s: {why}")
                self._set_status(*self._last_result)
            return
        if not self._status_of(run, "drawing…", f"{plan.status} in {seconds:.1f} s: drawing the figures"):
            return
        t0 = time.perf_counter()
        for i, tab in enumerate(self._tabs):
            if not self._current(run):
                return
            if tab.lazy and i != self.results.selected_index:
                tab.clear()
                with self._lock:
                    self._pending[i] = (plan, baseline)
                self._on_tab()  # opened meanwhile: fill it now
            else:
                tab.show(plan, baseline)
        with self._lock:
            if not self._current(run):
                return
            self.plan, self.baseline = plan, baseline
            self.draw_seconds = time.perf_counter() - t0
            self._shown = config
            self._mark_stale()
            self._last_result = (plan.status, _result_text(plan, baseline, seconds, stopped=stopped))
            self._set_status(*self._last_result)


def _result_text(plan: Plan, baseline: Plan | None, seconds: float, *, stopped: str | None) -> str:
    """``"in 0.8 s: step time ..."``: the status after the word for the plan's status."""
    text = f"in {seconds:.1f} s: step time {_ms(plan.step_time)}"
    if plan.status == "feasible":
        why = stopped or "time limit reached"
        text += f", bound {_ms(plan.bound)}, gap {100 * (plan.gap or 0.0):.1f}% ({why})"
    elif plan.gap:
        text += f", gap {100 * plan.gap:.2f}%"
    if baseline is not None and baseline.step_time and plan.step_time:
        fit = "" if baseline.fits else ", over budget"
        text += (f". Even split ({baseline.source.removeprefix('even_split(').rstrip(')')}{fit}): "
                 f"{_ms(baseline.step_time)}, {baseline.step_time / plan.step_time:.2f}x the plan")
    return text


EXPORT_FORMATS: tuple[str, ...] = ("sapptk plan file", "MindFormers", "Megatron-LM", "torchtitan",
                                   "PyTorch schedule CSV")
"""The formats of the Explorer's export tab."""


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
            out[label] = f"# no {label} export: {_error_text(exc)}"
    return out


def _torchtitan_text(plan: Plan) -> str:
    export = plan.export("torchtitan")
    text = export.text
    if "csv" in export.texts:
        text += f"\n# ---- {export.data.csv_name} ----\n{export.texts['csv']}"
    return text


def _bokeh(fig: Any) -> w.Widget:
    from jupyter_bokeh.widgets import BokehModel

    return BokehModel(fig)


def _device_table(plan: Plan) -> str:
    frame = plan.devices.copy()
    for col in frame.columns:
        if col.endswith("_mb"):
            frame[col] = frame[col].map(lambda x: "" if x != x else f"{x:,.0f}")
        elif col.endswith("_ms"):
            frame[col] = frame[col].map(lambda x: f"{x:,.1f}")
    return frame.to_html(index=False, border=0, classes="sapptk-devices")


def explorer_from_card(card: Any, parallel: Any = None, hardware: Any = "h100",
                       config: PipelineConfig | None = None, **options: Any) -> Explorer:
    """An :class:`Explorer` that starts from a model card: ``card`` (a bundled name such as
    ``"llama3.1-70b"`` or a :class:`~sapptk.models.ModelCard`) estimated with ``parallel`` on
    ``hardware`` (:func:`sapptk.estimate_profile`); without ``config``, 4 stages and 8
    micro-batches with the device's memory as the budget and the estimate's constant.
    ``options`` go to :class:`Explorer` (``time_limit``, ``workers``)."""
    from sapptk.models import estimate_profile
    from sapptk.models import hardware as hardware_card

    device = hardware_card(hardware)
    profile = estimate_profile(card, parallel, device)
    if config is None:
        config = PipelineConfig(4, 8, memory_budget=device.memory_mb,
                                constant_memory=float(profile.provenance["constant_mb"]))
    return Explorer(profile, config, **options)

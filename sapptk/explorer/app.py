"""An ipywidgets explorer: pick a schedule, a pipeline setup and the solver's levers, solve,
look at the plan.

``Explorer(profile)`` shows the controls (:mod:`sapptk.explorer.controls`: schedule,
stages, micro-batches, chunks, splits on the left; memory budget, recompute modes,
activation offload with its host bandwidth, recompute per micro-batch, memory margin, OOM
risk with its memory error and time limit on the right; Solve and Cancel), a status line,
and after solving the plan in tabs (:mod:`sapptk.explorer.tabs`): its timeline next to the
even split, its per-device table, its MindFormers YAML, its memory and time per device, and
the plan in every export format (:data:`EXPORT_FORMATS`). Options the chosen schedule does
not allow are disabled.

Solve runs the search and draws the figures on a background thread, so the kernel stays
free; Cancel asks the search to stop and show its best plan so far. The status line goes
``solving…`` → ``drawing…`` → the result, and Solve is enabled again only once the
figures in view are in the tabs (the memory & time tab is drawn when it is first opened).
When the controls no longer describe the plan shown (another setup, other levers, or an
invalid one), a note above the tabs says the tabs are stale. Tests drive it without a
kernel: set ``.value``, call ``.click()``, then :meth:`Explorer.wait`.
"""

from __future__ import annotations

import html
import threading
import time
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from sapptk.config import PipelineConfig
from sapptk.explorer.choose_tab import ChoosePanel
from sapptk.explorer.controls import Controls, Levers
from sapptk.explorer.inputs import HOOK
from sapptk.explorer.tabs import EXPORT_FORMATS, ResultTabs, error_text, export_texts, result_text
from sapptk.request import SolveRequest

if TYPE_CHECKING:
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["EXPORT_FORMATS", "Explorer", "explorer_from_card", "export_texts"]

_COLORS = {"ready": "#555", "solving…": "#3a6ea5", "cancelling…": "#3a6ea5", "drawing…": "#3a6ea5",
           "optimal": "#2e7d32", "feasible": "#b26a00", "infeasible": "#c62828", "invalid": "#c62828",
           "unknown": "#b26a00", "error": "#c62828", "cancelled": "#b26a00"}
_POLL_S = 0.05  # wait() joins in slices so that a kernel interrupt is seen at once


def _setup_text(config: PipelineConfig, levers: Levers) -> str:
    budget = "no budget" if config.memory_budget is None else f"{config.memory_budget:,.0f} MB"
    k = f" k={config.splits}" if config.splits != 1 else ""
    offload = f", offload at {config.host_bandwidth:g} MB/ms" if "offload" in config.recompute else ""
    more = f", {levers.text()}" if levers.text() else ""
    return f"{config.schedule} p={config.stages} v={config.chunks} m={config.micro_batches}{k}, {budget}{offload}{more}"


class Explorer:
    """Interactive planner for one profile (display it, or its ``.widget``, in Jupyter).

    Attributes (all ipywidgets, see :class:`~sapptk.explorer.controls.Controls`):
    ``schedule``, ``stages``, ``micro_batches``, ``chunks``, ``splits``, ``budget`` (MB, 0 =
    no limit), ``recompute`` (``{mode: Checkbox}``), ``offload`` and ``host_bandwidth`` (MB
    per ms), ``per_micro_batch``, ``memory_margin`` (MB when >= 1, a fraction of the budget
    when < 1; 0 = none), ``oom_risk`` (0 = none) and ``memory_error`` (relative),
    ``time_limit``, ``solve_button``, ``cancel_button``, ``status``, ``stale_note``,
    ``entries`` (the box beside each number where a value can be typed: ``"stages"``,
    ``"micro-batches"``, ``"chunks"``, ``"splits"``, ``"memory budget"``, ``"host
    bandwidth"``, ``"memory margin"``, ``"OOM risk"``, ``"memory error"``, ``"time limit"``;
    a value out of range is corrected and ``input_note`` says how), ``recompute_note``,
    ``results`` (the Tab) and its pages ``timeline``, ``table``, ``yaml``, ``bars`` (Boxes
    holding a ``jupyter_bokeh.BokehModel`` once drawn; ``bars`` when its tab is opened),
    ``exports`` (``export_format``, a Dropdown, and ``export_text``, that format's text; filled
    when the tab is opened). Every lever is passed to the solve (``sapptk.balance``'s keywords
    of the same names; offload through the config). After a solve, ``plan`` and ``baseline``
    (the even split) hold the :class:`~sapptk.plan.Plan` objects, ``figure`` the Bokeh layout
    of the timeline tab (it belongs to that widget's document: to show it elsewhere, build a
    new one with :mod:`sapptk.viz`) and ``draw_seconds`` the time the figures took.
    ``status_text`` is the status line as plain text; ``stale`` says whether the tabs show a
    plan for other settings than the controls'.
    """

    def __init__(
        self,
        profile: Profile,
        config: PipelineConfig | None = None,
        *,
        time_limit: float = 10,
        workers: int = 2,
        per_micro_batch: bool = False,
        memory_margin: float | None = None,
        oom_risk: float | None = None,
        memory_error: float | None = None,
    ) -> None:
        self.profile = profile
        self.workers = workers
        self.plan: Plan | None = None
        self.baseline: Plan | None = None
        self.draw_seconds: float | None = None
        self._shown: tuple[PipelineConfig, Levers] | None = None  # the setup of the plan in the tabs
        self._worker: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._run = 0  # number of the current solve; a thread whose number is older was abandoned
        self._pending: dict[int, tuple[Plan, Plan | None]] = {}  # lazy tabs not yet filled with the plan shown
        self._lock = threading.Lock()
        self._last_result: tuple[str, str] | None = None  # the status of the last solve (kind, text)
        self._interrupted = False  # the running solve was stopped by Kernel -> Interrupt
        self._status_text = ""
        levers = Levers(per_micro_batch=per_micro_batch, memory_margin=memory_margin, oom_risk=oom_risk,
                        memory_error=memory_error)
        self.controls = Controls(profile, config or PipelineConfig(4, 8), time_limit=time_limit, levers=levers,
                                 report=self._report_input)
        c = self.controls
        self.schedule, self.schedule_info = c.schedule, c.schedule_info
        self.stages, self.micro_batches, self.chunks, self.splits = c.stages, c.micro_batches, c.chunks, c.splits
        self.budget, self.recompute, self.recompute_note = c.budget, c.recompute, c.recompute_note
        self.offload, self.host_bandwidth, self.per_micro_batch = c.offload, c.host_bandwidth, c.per_micro_batch
        self.memory_margin, self.oom_risk, self.memory_error = c.memory_margin, c.oom_risk, c.memory_error
        self.time_limit, self.solve_button, self.cancel_button = c.time_limit, c.solve_button, c.cancel_button
        self.input_note, self.entries = c.input_note, c.entries
        self.status = w.HTML()
        self.stale_note = w.HTML()

        self.chooser = ChoosePanel(self)  # the "choose" tab: which setup to run
        self.tabs = ResultTabs({"choose": self.chooser.widget})
        t = self.tabs
        self.results, self._tabs = t.widget, t.tabs
        self.timeline, self.table, self.yaml, self.bars = t.timeline, t.table, t.yaml, t.bars
        self.exports, self.export_format, self.export_text = t.exports, t.export_format, t.export_text
        self.widget = w.VBox([c.widget, self.status, self.stale_note, self.results])
        self.results.observe(self._on_tab, names="selected_index")

        self.schedule.observe(self._on_schedule, names="value")
        for ctl in c.value_controls:
            ctl.observe(self._on_change, names="value")
        self.solve_button.on_click(lambda _button: self.start())
        self.cancel_button.on_click(lambda _button: self.cancel())
        self._on_schedule()

    @property
    def figure(self) -> Any:
        """The Bokeh layout of the timeline tab (None before a plan is drawn)."""
        return self.tabs.figure

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
        return self.controls.config()

    def levers(self) -> Levers:
        """The solver's levers the controls describe."""
        return self.controls.levers()

    def check(self) -> str | None:
        """Why the current setup cannot be solved, or None when it can (the request's own
        checks, so the status line says what ``sapptk.solve`` would refuse)."""
        if not any(box.value for box in self.recompute.values()):
            return "pick at least one recompute mode"
        try:
            self.request()
        except Exception as exc:  # a status line, never a traceback
            return error_text(exc)
        return None

    def request(self, stop: threading.Event | None = None) -> SolveRequest:
        """The :class:`~sapptk.request.SolveRequest` the controls describe (checked: raises
        :class:`~sapptk.errors.ConfigError` naming what the solve would refuse)."""
        return SolveRequest(self.profile, self.config(), time_limit=float(self.time_limit.value),
                            workers=self.workers, stop=stop, **self.levers().keywords())

    def _on_schedule(self, _change: Any = None) -> None:
        self.controls.on_schedule()
        self._on_change()

    def _on_change(self, _change: Any = None) -> None:
        self.controls.fit_micro_batches()
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
            return self.check() is not None or (self.config(), self.levers()) != self._shown
        except Exception:  # settings that do not even make a config
            return True

    def _mark_stale(self) -> None:
        if self.stale:
            self.stale_note.value = (
                '<div style="padding:2px 6px;background:#fff3cd;color:#664d03">The tabs show the plan for '
                f"{html.escape(_setup_text(*self._shown))}, not for these settings: press Solve.</div>"
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
            self._stop = threading.Event()
            config, levers, request = self.config(), self.levers(), self.request(self._stop)
            self._run += 1
            self.solve_button.disabled = True
            self.cancel_button.disabled = False
            self._interrupted = False
            self.input_note.value = ""
            run = self._run
            HOOK.add(id(self), lambda: self._on_interrupt(run))
            how = "Cancel or Kernel → Interrupt stops it" if HOOK.install() else "Cancel stops it"
            self._set_status("solving…", f"(up to {self.time_limit.value} s; {how})")
            self._worker = threading.Thread(target=self._solve, args=(self._run, request, (config, levers)),
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

    def _solve(self, run: int, request: SolveRequest, setup: tuple[PipelineConfig, Levers]) -> None:
        """The background thread: search, then draw, then say so; always leaves the
        controls usable."""
        t0 = time.perf_counter()
        try:
            from sapptk import balancer
            from sapptk.plan import even_split

            stop = request.stop
            plan = balancer.solve(request)
            baseline = even_split(self.profile, request.config, "auto") if plan.solved else None
            seconds = plan.solve_seconds or (time.perf_counter() - t0)
            stopped = ("stopped by Kernel → Interrupt" if self._interrupted else "stopped by Cancel"
                       ) if stop.is_set() else None
            self._show(run, plan, baseline, setup, seconds, stopped=stopped)
        except KeyboardInterrupt:  # a SIGINT that reached this thread: the search is lost, the kernel lives
            note = "; the tabs still show the previous plan" if self._shown is not None else ""
            self._status_of(run, "cancelled", ": the search was interrupted (KeyboardInterrupt) before it returned "
                                              f"a plan{note}; press Solve to run it again")
        except BaseException as exc:  # the status line says it; the thread never dies silently
            self._status_of(run, "error", f": {error_text(exc)}")
        finally:
            with self._lock:
                if self._current(run):
                    HOOK.remove(id(self))
                    self.solve_button.disabled = False
                    self.cancel_button.disabled = True

    def _show(self, run: int, plan: Plan, baseline: Plan | None, setup: tuple[PipelineConfig, Levers],
              seconds: float, *, stopped: str | None) -> None:
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
            self._shown = setup
            self._mark_stale()
            self._last_result = (plan.status, result_text(plan, baseline, seconds, stopped=stopped))
            self._set_status(*self._last_result)


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

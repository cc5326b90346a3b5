"""An ipywidgets explorer: pick a schedule and a pipeline setup, solve, look at the plan.

``Explorer(profile)`` shows the controls (schedule, stages, micro-batches, chunks, splits,
memory budget, recompute modes, time limit, Solve), a status line, and after solving the
plan's stage table, its MindFormers YAML and its timeline next to the even split (Bokeh
inside the widgets through ``jupyter_bokeh``). Options the chosen schedule does not
allow are disabled. Everything runs in the click handler, so tests drive it without a
kernel by setting ``.value`` and calling ``.click()``.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from sapptk.config import PipelineConfig
from sapptk.errors import SapptkError
from sapptk.profile import MODES
from sapptk.schedules import get, names

if TYPE_CHECKING:
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["Explorer"]

_MAX_STAGES = 64
_MAX_MICRO_BATCHES = 512
_MAX_CHUNKS = 8
_MAX_SPLITS = 8
_DESC = {"description_width": "130px"}
_WIDE = w.Layout(width="420px")


def _error_text(exc: BaseException) -> str:
    """One line for the status: the message of our own errors, the type and message otherwise."""
    if isinstance(exc, SapptkError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms" if value >= 1000 else f"{value:,.1f} ms"


class Explorer:
    """Interactive planner for one profile (display it, or its ``.widget``, in Jupyter).

    Attributes (all ipywidgets): ``schedule``, ``stages``, ``micro_batches``, ``chunks``,
    ``splits``, ``budget`` (MB, 0 = no limit), ``recompute`` (``{mode: Checkbox}``),
    ``time_limit``, ``solve_button``, ``status``, ``table``, ``yaml``, ``timeline``
    (a Box holding a ``jupyter_bokeh.BokehModel`` after solving), ``bars``. After a solve,
    ``plan`` and ``baseline`` (the even split) hold the :class:`~sapptk.plan.Plan` objects
    and ``figure`` the Bokeh layout shown in the timeline tab (it belongs to that widget's
    document: to show it elsewhere, build a new one with :mod:`sapptk.viz`).
    ``status_text`` is the status line as plain text.
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
        self.status = w.HTML()
        self.table = w.HTML()
        self.yaml = w.Textarea(layout=w.Layout(width="100%", height="320px"))  # editable, so it can be copied
        self.timeline = w.Box(layout=w.Layout(width="100%"))
        self.bars = w.Box(layout=w.Layout(width="100%"))
        self._status_text = ""
        self._constant = float(cfg.constant_memory)
        self._comm = float(cfg.comm)

        controls = w.VBox([
            self.schedule, self.schedule_info, self.stages, self.micro_batches, self.chunks, self.splits,
            w.HBox([self.budget, w.Label("MB per device (0: no limit)")]),
            w.HBox([w.Label("recompute modes", layout=w.Layout(width="134px")), *self.recompute.values()]),
            self.time_limit, self.solve_button,
        ])
        self.results = w.Tab(children=[self.timeline, self.table, self.yaml, self.bars])
        for i, title in enumerate(("timeline", "stages", "MindFormers YAML", "memory & time")):
            self.results.set_title(i, title)
        self.widget = w.VBox([controls, self.status, self.results])

        self.schedule.observe(self._on_schedule, names="value")
        for ctl in (self.stages, self.chunks, self.micro_batches, self.splits, self.budget, self.time_limit,
                    *self.recompute.values()):
            ctl.observe(self._on_change, names="value")
        self.solve_button.on_click(lambda _button: self.solve())
        self._on_schedule()

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
        problem = self.check()
        if problem:
            self._set_status("invalid", f": {problem}")
        else:
            self._set_status("ready", ": press Solve")

    @property
    def status_text(self) -> str:
        """The status line as plain text, e.g. ``"optimal in 0.8 s: step time ..."``."""
        return self._status_text

    def _set_status(self, kind: str, text: str) -> None:
        self._status_text = f"{kind}{'' if text.startswith(':') else ' '}{text}"
        colors = {"ready": "#555", "solving…": "#3a6ea5", "optimal": "#2e7d32", "feasible": "#b26a00",
                  "infeasible": "#c62828", "invalid": "#c62828", "unknown": "#b26a00", "error": "#c62828"}
        self.status.value = (
            f'<div style="padding:4px 0"><b style="color:{colors.get(kind, "#555")}">{html.escape(kind)}</b>'
            f"{'' if text.startswith(':') else ' '}{html.escape(text)}</div>"
        )

    # -------------------------------------------------------------- solve
    def solve(self) -> Plan | None:
        """Solve the current setup and show the result (what the Solve button does)."""
        problem = self.check()
        if problem:
            self._set_status("invalid", f": {problem}")
            return None
        config = self.config()
        self.solve_button.disabled = True
        self._set_status("solving…", f"(up to {self.time_limit.value} s)")
        t0 = time.perf_counter()
        try:
            from sapptk.balancer import balance
            from sapptk.plan import even_baseline

            plan = balance(self.profile, config, time_limit=float(self.time_limit.value), workers=self.workers)
            baseline = even_baseline(self.profile, config)
        except Exception as exc:  # shown in the status line, never a traceback
            self._set_status("error", f": {_error_text(exc)}")
            return None
        finally:
            self.solve_button.disabled = False
        self.plan, self.baseline = plan, baseline
        seconds = plan.solve_seconds or (time.perf_counter() - t0)
        self._show(plan, baseline, config, seconds)
        return plan

    def _show(self, plan: Plan, baseline: Plan, config: PipelineConfig, seconds: float) -> None:
        from sapptk import viz

        if not plan.solved:
            why = (plan.message or "no plan").removeprefix(f"{plan.status}: ")
            self._set_status(plan.status, f"after {seconds:.1f} s: {why}")
            self.table.value = ""
            self.yaml.value = ""
            self.timeline.children = ()
            self.bars.children = ()
            return
        vs_even = ""
        if baseline is not None and baseline.step_time:
            fit = "" if baseline.fits else ", over budget"
            vs_even = (f". Even split ({baseline.source.removeprefix('even_split(').rstrip(')')}{fit}): "
                       f"{_ms(baseline.step_time)}, {baseline.step_time / plan.step_time:.2f}x the plan")
        text = f"in {seconds:.1f} s: step time {_ms(plan.step_time)}"  # "optimal in 0.8 s: ..."
        if plan.status == "feasible":
            text += f", bound {_ms(plan.bound)}, gap {100 * (plan.gap or 0.0):.1f}% (time limit reached)"
        elif plan.gap:
            text += f", gap {100 * plan.gap:.2f}%"
        self._set_status(plan.status, text + vs_even)
        self.table.value = _stage_table(plan)
        try:
            self.yaml.value = plan.to_yaml()
        except Exception as exc:  # e.g. several groups the MindFormers lists cannot express
            self.yaml.value = f"# no MindFormers config: {_error_text(exc)}"
        sims = [plan.simulation]
        labels = ["balanced plan"]
        if baseline is not None:
            sims.append(baseline.simulation)
            labels.append(baseline.source.replace("even_split(", "even split (").replace("((", "("))
        self.figure = viz.compare(*sims, labels=labels, budget=config.memory_budget, memory=True, width=940)
        self.timeline.children = (_bokeh(self.figure),)
        self.bars.children = (_bokeh(viz.stage_bars(plan, width=860)),)


def _bokeh(fig: Any) -> w.Widget:
    from jupyter_bokeh.widgets import BokehModel

    return BokehModel(fig)


def _stage_table(plan: Plan) -> str:
    frame = plan.stages.copy()
    for col in frame.columns:
        if col.endswith("_mb"):
            frame[col] = frame[col].map(lambda x: "" if x != x else f"{x:,.0f}")
        elif col.endswith("_ms"):
            frame[col] = frame[col].map(lambda x: f"{x:,.1f}")
    return frame.to_html(index=False, border=0, classes="sapptk-stages")

"""The Explorer's controls: the pipeline setup and the solver's levers, in two columns.

:class:`Controls` holds the widgets, lays them out compactly (setup on the left; memory,
recompute, offload, per-micro-batch recompute, safety and time limit on the right, so the
panel fits a laptop screen) and reads them back as a :class:`~sapptk.config.PipelineConfig`
(:meth:`Controls.config`) and the levers of the solve (:meth:`Controls.levers`). Options the
chosen schedule does not allow, and lever inputs that do not apply (the host bandwidth
without offload, the memory error without an OOM risk), are disabled.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from sapptk.checks import (
    MAX_EXPLORER_CHUNKS,
    MAX_EXPLORER_MICRO_BATCHES,
    MAX_EXPLORER_SPLITS,
    MAX_EXPLORER_STAGES,
)
from sapptk.config import OFFLOAD, PipelineConfig
from sapptk.explorer.inputs import checked_entry
from sapptk.levers import LEVERS, Control, lever
from sapptk.profile import MODES
from sapptk.schedules import get, names

__all__ = ["DEFAULT_HOST_BANDWIDTH", "DEFAULT_MEMORY_ERROR", "LEVER_CONTROLS", "REQUEST_LEVERS", "Controls", "Levers"]

DEFAULT_HOST_BANDWIDTH: float = lever("offload").controls[1].offered or 0.0
"""MB per ms of the host link offered when the config has none (25 GB/s, a PCIe 4.0 x16 link;
the host-bandwidth control's ``offered`` in :mod:`sapptk.levers`)."""
DEFAULT_MEMORY_ERROR: float = lever("oom_risk").controls[1].offered or 0.0
"""Relative error of the memory figures offered with an OOM risk (5 %; :mod:`sapptk.levers`)."""

_DESC = {"description_width": "120px"}
_SLIDER = w.Layout(width="340px")
_LABEL = w.Layout(width="104px")
_COLUMN = w.Layout(width="440px")


REQUEST_LEVERS: dict[str, Any] = {f.name: f.default for item in LEVERS for c in item.controls
                                  for f in item.fields if f.home == "request" and f.name == c.field}
"""The request fields the Explorer's lever controls set, with their defaults (off)."""
LEVER_CONTROLS: tuple[str, ...] = tuple(c.field for item in LEVERS for c in item.controls)
"""Every lever control's name (a :class:`Controls` attribute each)."""


class Levers:
    """The solver's levers beyond the config (``sapptk.balance`` keywords of the same names: the
    request fields of :mod:`sapptk.levers` with an Explorer control, :data:`REQUEST_LEVERS`);
    offload and its host bandwidth live in the config (``"offload"`` in ``recompute``).
    Immutable; ``Levers(per_micro_batch=True)`` leaves the others off."""

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(REQUEST_LEVERS))
        if unknown:
            raise TypeError(f"Levers: unknown lever {unknown[0]!r}: expected some of {', '.join(REQUEST_LEVERS)}")
        object.__setattr__(self, "_values", {name: values.get(name, off) for name, off in REQUEST_LEVERS.items()})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Levers is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Levers) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return "Levers(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def keywords(self) -> dict[str, Any]:
        """The levers as keyword arguments of a solve."""
        return dict(self._values)

    def text(self) -> str:
        """A short description for the status line ("" when no lever is on)."""
        return ", ".join(item.describe(self._values) for item in LEVERS
                         if any(f.name in self._values for f in item.fields) and item.on(self._values))


class Controls:
    """Every input of the Explorer (ipywidgets attributes): ``schedule``, ``schedule_info``,
    ``stages``, ``micro_batches``, ``chunks``, ``splits``, ``budget`` (MB, 0 = no limit),
    ``recompute`` (``{mode: Checkbox}``), ``offload`` (a Checkbox) with ``host_bandwidth``
    (MB per ms), ``per_micro_batch`` (a Checkbox), ``memory_margin`` (MB when >= 1, a
    fraction of the budget when < 1; 0 = none), ``oom_risk`` (0 = none) with
    ``memory_error`` (relative), ``time_limit``, ``solve_button``, ``cancel_button``,
    ``input_note``, ``recompute_note``, and ``entries`` (the typed-value box beside each
    number, by name). ``widget`` is the laid-out panel. ``report`` receives what a typed
    value's box changed."""

    def __init__(self, profile: Any, config: PipelineConfig, *, time_limit: float, levers: Levers,
                 report: Callable[[str], None]) -> None:
        cfg = config
        body_modes = {m for g in profile.body for m in g.modes}
        self._constant = float(cfg.constant_memory)
        self._comm = float(cfg.comm)
        self.schedule = w.Dropdown(options=list(names()), value=cfg.schedule, description="schedule", style=_DESC,
                                   layout=w.Layout(width="420px"))
        self.schedule_info = w.HTML(layout=w.Layout(width="430px"))
        self.stages = self._slider(cfg.stages, MAX_EXPLORER_STAGES, "stages (p)")
        self.micro_batches = self._slider(cfg.micro_batches, MAX_EXPLORER_MICRO_BATCHES, "micro-batches (m)")
        self.chunks = self._slider(cfg.chunks, MAX_EXPLORER_CHUNKS, "chunks (v)")
        self.splits = self._slider(cfg.splits, MAX_EXPLORER_SPLITS, "splits (k)")
        self.time_limit = w.IntSlider(value=int(time_limit), min=1, max=300, description="time limit (s)",
                                      style=_DESC, layout=_SLIDER, continuous_update=False, readout=False)
        self.budget = w.BoundedFloatText(value=float(cfg.memory_budget or 0.0), min=0.0, max=1e9, step=1000.0)
        self.recompute = {
            mode: w.Checkbox(value=mode in cfg.recompute and mode in body_modes, description=mode, indent=False,
                             disabled=mode not in body_modes, layout=w.Layout(width="auto", margin="0 6px 0 0"))
            for mode in MODES
        }
        missing = [m for m in MODES if m not in body_modes]
        for mode in missing:
            self.recompute[mode].tooltip = f"the profile gives no figures for {mode!r}: it cannot be used"
        self.recompute_note = w.HTML(
            f"<small>greyed: {', '.join(missing)} (the profile has no figures for "
            f"{'it' if len(missing) == 1 else 'them'})</small>" if missing else "")
        for item in LEVERS:  # every lever's controls, from its description (sapptk.levers)
            for control in item.controls:
                setattr(self, control.field, self._lever_widget(control, cfg, levers))
        self.solve_button = w.Button(description="Solve", button_style="primary", icon="play")
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True,
                                      tooltip="stop the search and show the best plan found so far")
        self.input_note = w.HTML()  # what was changed in a typed value, and why

        self.entries: dict[str, w.Text] = {}

        def typed(control: w.ValueWidget, name: str, width: str = "80px") -> w.Text:
            self.entries[name] = checked_entry(control, name, report, width=width)
            return self.entries[name]

        def label(text: str) -> w.Label:
            return w.Label(text, layout=_LABEL)

        def small(text: str) -> w.HTML:
            return w.HTML(f"<small>{html.escape(text)}</small>")

        setup = w.VBox([
            self.schedule, self.schedule_info,
            w.HBox([self.stages, typed(self.stages, "stages")]),
            w.HBox([self.micro_batches, typed(self.micro_batches, "micro-batches")]),
            w.HBox([self.chunks, typed(self.chunks, "chunks")]),
            w.HBox([self.splits, typed(self.splits, "splits")]),
        ], layout=_COLUMN)
        lever_rows = []
        for item in LEVERS:
            if not item.controls:
                continue
            row: list[w.Widget] = [label(item.label)]
            for control in item.controls:
                widget = getattr(self, control.field)
                if control.kind == "checkbox":
                    row.append(widget)
                else:
                    row.append(typed(widget, control.label, control.width))
                if control.note:
                    row.append(small(control.note))
            lever_rows.append(w.HBox(row))
        levers_box = w.VBox([
            w.HBox([label("memory budget"), typed(self.budget, "memory budget", "100px"),
                    small("MB per device (0: no limit)")]),
            w.HBox([label("recompute"), *self.recompute.values()]),
            self.recompute_note,
            *lever_rows,
            w.HBox([self.time_limit, typed(self.time_limit, "time limit")]),
        ], layout=_COLUMN)
        self.widget = w.VBox([w.HBox([setup, levers_box]),
                              w.HBox([self.solve_button, self.cancel_button, self.input_note])])
        self._dependent = [(self.entries[c.label], c.enabled_by) for item in LEVERS for c in item.controls
                           if c.enabled_by is not None]
        for enabler in {by for _, by in self._dependent}:
            getattr(self, enabler).observe(self._on_lever, names="value")
        self._on_lever()

    @staticmethod
    def _lever_widget(control: Control, config: PipelineConfig, levers: Levers) -> w.ValueWidget:
        """The widget of one lever control, set from the config (offload, host bandwidth) or the levers."""
        if control.field == "offload":
            value: Any = OFFLOAD in config.recompute
        elif control.field in REQUEST_LEVERS:
            value = getattr(levers, control.field)
        else:
            value = getattr(config, control.field)
        if control.kind == "checkbox":
            return w.Checkbox(value=bool(value), description=control.label, indent=False,
                              layout=w.Layout(width=control.width),
                              tooltip=control.tooltip)
        shown = value if value is not None else (control.offered if control.offered is not None else 0.0)
        return w.BoundedFloatText(value=float(shown), min=control.low, max=control.high, step=control.step)

    @staticmethod
    def _slider(value: int, high: int, description: str) -> w.IntSlider:
        return w.IntSlider(value=value, min=1, max=high, description=description, style=_DESC, layout=_SLIDER,
                           continuous_update=False, readout=False)  # the box beside it takes typed values

    @property
    def value_controls(self) -> tuple[w.ValueWidget, ...]:
        """Every control whose change may change the setup or the levers."""
        return (self.stages, self.chunks, self.micro_batches, self.splits, self.budget, self.time_limit,
                *self.recompute.values(), *(getattr(self, name) for name in LEVER_CONTROLS))

    def _on_lever(self, _change: Any = None) -> None:
        for box, enabler in self._dependent:  # a lever input that does not apply is disabled
            box.disabled = not getattr(self, enabler).value

    def on_schedule(self) -> None:
        """Fit the chunks and splits controls to the chosen schedule, and describe it."""
        spec = get(self.schedule.value)
        if spec.chunks is None:
            self.chunks.min, self.chunks.max = 1, MAX_EXPLORER_CHUNKS
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

    def fit_micro_batches(self) -> None:
        """Raise the micro-batches' minimum to what the schedule needs at these stages and chunks."""
        spec = get(self.schedule.value)
        need = max(spec.min_micro_batches(int(self.stages.value), int(self.chunks.value)), int(self.stages.value))
        self.micro_batches.min = min(need, self.micro_batches.max)

    def config(self) -> PipelineConfig:
        """The pipeline setup the controls describe (not yet validated)."""
        budget = float(self.budget.value)
        modes = tuple(m for m, box in self.recompute.items() if box.value)
        offload = bool(self.offload.value)
        return PipelineConfig(
            stages=int(self.stages.value),
            micro_batches=int(self.micro_batches.value),
            chunks=int(self.chunks.value),
            schedule=self.schedule.value,
            splits=int(self.splits.value),
            memory_budget=budget if budget > 0 else None,
            constant_memory=self._constant,
            comm=self._comm,
            recompute=(*modes, OFFLOAD) if offload else modes,
            host_bandwidth=float(self.host_bandwidth.value) if offload else None,
        )

    def levers(self) -> Levers:
        """The levers the controls describe (0 in a number box means the lever is off, as does an
        input whose enabling control is off)."""
        values: dict[str, Any] = {}
        for item in LEVERS:
            for control in item.controls:
                if control.field not in REQUEST_LEVERS:
                    continue
                value = getattr(self, control.field).value
                enabled = control.enabled_by is None or bool(getattr(self, control.enabled_by).value)
                if control.kind == "checkbox":
                    values[control.field] = bool(value)
                else:
                    values[control.field] = float(value) if enabled and float(value) > 0 else None
        return Levers(**values)

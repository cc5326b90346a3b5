"""The levers: one description each, registered once, read by every caller.

A *lever* is something the user turns on a solve beyond the pipeline's shape: activation
offload, sequence slices, recompute per micro-batch, a memory margin, an OOM risk. Each is one
:class:`Lever` in :data:`LEVERS`, holding

* its fields (:class:`Field`): the keyword of :class:`~sapptk.request.SolveRequest` /
  :class:`~sapptk.choosing.request.ChooseRequest` (or the :class:`~sapptk.config.PipelineConfig`
  field it lives in), the type, the limits, the default (off), the sweep axis and frame column,
  the command-line flag;
* the phase of a solve that applies it (``phase``);
* what a bound of :func:`sapptk.choose` must assume for it, its best case (``bound``), or why
  ``choose`` refuses it (``choose_refusal``);
* the plan exports that refuse a plan using it, and why (:class:`Refusal`), with the message
  (:meth:`Lever.message`);
* its Explorer controls (:class:`Control`).

The readers: :func:`sapptk.formats.base.refuse_levers` (every export), the sweep's grid, frame
and keys (:data:`SWEPT`), ``ChooseRequest`` (:func:`choose_levers`), the Explorer's controls
and the command line (:func:`cli_fields`). Adding a lever is a new :class:`Lever` here; the
code that applies it (a solver phase) is its own module.

Left out, with the reason: the search's time shares and knobs
(:class:`~sapptk.solver.settings.SearchOptions`) change how long a phase searches, never the
plan's meaning, so no export, bound or frame has to know them; the copy stream is offload's
(its ``host_bandwidth``); the LM head and loss are a profile's layers, not a choice of the user.

This module sits below :mod:`sapptk.formats` (it knows plans only by their public attributes:
``offload``, ``alternative``, ``config``) and imports :mod:`sapptk.checks` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sapptk import checks
from sapptk.errors import ConfigError

__all__ = ["LEVERS", "SWEPT", "Control", "Field", "Lever", "Refusal", "check_exclusions", "choose_levers",
           "cli_fields", "lever", "swept_fields"]

OFFLOAD_MODE = "offload"  # the recompute "mode" that lets a plan offload (sapptk.config.OFFLOAD)


@dataclass(frozen=True)
class Field:
    """One input of a lever.

    ``name`` is the keyword (or config field); ``home`` ``"request"`` (a keyword of the solve
    and choose requests) or ``"config"`` (a :class:`~sapptk.config.PipelineConfig` field);
    ``kind`` ``"flag"`` or ``"number"``; ``default`` the value that means off; ``low`` /
    ``above`` / ``high`` the limits of :func:`sapptk.checks.number`; ``swept``: a sweep axis
    and a frame column of the same name (``column``: another column name); ``cli``: the
    flag of ``sapptk balance``, ``sapptk sweep`` and ``sapptk choose`` (None: none) and its
    ``metavar``; ``needs``: a field that must be on for this one to mean anything; ``choose``:
    whether :func:`sapptk.choose` takes the field; ``help``: one line for ``--help`` and docs.
    """

    name: str
    kind: str
    default: Any = None
    home: str = "request"
    low: float | None = None
    above: float | None = None
    high: float | None = None
    swept: bool = True
    column: str | None = None
    cli: str | None = None
    needs: str | None = None
    help: str = ""
    metavar: str = "X"
    choose: bool = True

    @property
    def frame_column(self) -> str:
        """The sweep frame's column of this field."""
        return self.column or self.name

    def check(self, value: Any, error: type[Exception] = ConfigError) -> Any:
        """``value`` checked against the field's type and limits (the default passes as it is)."""
        if self.kind == "flag":
            return checks.flag(value, self.name, error=error)
        if value is None:
            return None
        return checks.number(value, self.name, error=error, low=self.low, above=self.above, high=self.high)

    def is_off(self, value: Any) -> bool:
        """Whether ``value`` is the field's default (off): ``False == 0`` counts, ``None`` only as itself."""
        if self.default is None:
            return value is None
        return type(value) is type(self.default) and value == self.default


@dataclass(frozen=True)
class Control:
    """One Explorer control of a lever: ``kind`` ``"checkbox"`` or ``"number"`` (a box, 0 = off
    unless ``offered``), the ``field`` it sets, its ``label`` (the checkbox's text, or the
    typed box's name), a ``note`` beside it, a ``tooltip``, the number's ``low`` / ``high`` /
    ``step`` and the value ``offered`` when the lever is off, ``enabled_by`` (a field whose
    control must be on for this one to be enabled), and ``width`` (its, or its typed box's)."""

    kind: str
    field: str
    label: str
    note: str = ""
    tooltip: str = ""
    low: float = 0.0
    high: float = 1.0
    step: float = 0.01
    offered: float | None = None
    enabled_by: str | None = None
    width: str = "80px"


@dataclass(frozen=True)
class Refusal:
    """An export that cannot express a lever: ``fmt`` (a name of
    :data:`sapptk.formats.registry.FORMATS`), ``what`` (how the message names the target) and
    ``why`` (what the target runs instead; "" when the name says it)."""

    fmt: str
    what: str
    why: str = ""


@dataclass(frozen=True)
class Lever:
    """One lever (module docstring). ``uses(plan)``: whether a plan uses it; ``message(plan,
    what, why)``: why ``what`` refuses such a plan; ``on(values)``: whether the request's
    values (field name → value) turn it on; ``shown(values)``: how a message names it;
    ``label``: the Explorer row's label; ``notes``: format → how it expresses the lever in part;
    ``summary(values)``: a status line's words (:meth:`describe`); ``excludes``: another lever's
    name → the message refusing the two together (a template of ``{this}``, ``{other}`` (how
    each is shown) and the request's values, :func:`check_exclusions`)."""

    name: str
    title: str
    fields: tuple[Field, ...]
    phase: str
    bound: str
    uses: Callable[[Any], bool]
    message: Callable[[Any, str, str], str]
    on: Callable[[Mapping[str, Any]], bool]
    shown: Callable[[Mapping[str, Any]], str]
    choose_refusal: str | None = None
    refusals: tuple[Refusal, ...] = ()
    controls: tuple[Control, ...] = ()
    label: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)
    summary: Callable[[Mapping[str, Any]], str] | None = None
    excludes: Mapping[str, str] = field(default_factory=dict)

    def describe(self, values: Mapping[str, Any]) -> str:
        """A few words for a status line when the lever is on (its title unless it has a ``summary``)."""
        return self.title if self.summary is None else self.summary(values)

    def refusal(self, fmt: str) -> Refusal | None:
        """How export ``fmt`` refuses a plan using this lever (None: it expresses it)."""
        return next((r for r in self.refusals if r.fmt == fmt), None)

    def field_named(self, name: str) -> Field:
        """The field called ``name``."""
        return next(f for f in self.fields if f.name == name)


# ------------------------------------------------------------------------------ offload
def _offload_uses(plan: Any) -> bool:
    return getattr(plan, "offload", None) is not None


def _offload_message(plan: Any, what: str, why: str) -> str:
    target = f"{what} ({why})" if why else what
    return (f"{target} cannot express activation offload: this plan offloads {int(plan.offload.sum())} layers' "
            "activations to host memory; simulate or save it with sapptk (plan.simulate(), plan.export('sapptk')), "
            "or balance without 'offload' in recompute for a plan this target can run")


def _offload_on(values: Mapping[str, Any]) -> bool:
    modes = values.get("recompute")
    if isinstance(modes, str):
        return modes == OFFLOAD_MODE
    return modes is not None and OFFLOAD_MODE in tuple(modes)


OFFLOAD = Lever(
    name="offload",
    title="activation offload",
    fields=(
        Field("recompute", "modes", home="config", swept=True, column="recompute", cli="--recompute",
              help="'offload' among the recompute modes lets mode-'none' layers send their activations to host "
                   "memory"),
        Field("host_bandwidth", "number", home="config", above=0.0, high=checks.MAX_BANDWIDTH,
              column="host_bandwidth_mb_per_ms", cli="--host-bandwidth", needs="recompute",
              help="host link per device, MB/ms (the copy stream's bandwidth)"),
    ),
    phase="the offload search (sapptk.solver: after the per-stage layout, a per-layer choice of which "
          "mode-'none' layers copy their activations to host memory over a copy stream)",
    bound="an offloaded activation costs no device memory and no time (its copies hide behind compute): the "
          "bound takes the plan as if every mode-'none' layer's activations were free, which no offloading "
          "plan beats",
    uses=_offload_uses,
    message=_offload_message,
    on=_offload_on,
    shown=lambda values: f"{OFFLOAD_MODE!r} in {values.get('recompute_name', 'recompute')}",
    choose_refusal=("its bounds (sapptk.choosing.bounds) prove a step time from each device's memory, which "
                    "offload changes plan by plan, so no bound valid for offloading plans exists here; choose "
                    "without it, then balance the winner's setup with offload (sapptk.balance)"),
    refusals=(
        Refusal("megatron", "Megatron-LM's arguments",
                "its layer-level --cpu-offloading refuses pipeline parallelism and recompute; "
                "--fine-grained-activation-offloading with --offload-modules offloads the same submodules' inputs "
                "in every layer of every stage, with no per-stage layer count; see docs/offload.md"),
        Refusal("torchtitan", "torchtitan's settings", "activation checkpointing only"),
        Refusal("mindformers", "MindFormers' offset and recompute lists"),
    ),
    controls=(
        Control("checkbox", "offload", "offload activations", width="150px",
                tooltip="let mode-'none' layers send their activations to host memory"),
        Control("number", "host_bandwidth", "host bandwidth", note="MB/ms host link", low=1e-3,
                high=checks.MAX_BANDWIDTH, step=1.0, offered=25.0, enabled_by="offload", width="70px"),
    ),
    label="levers",
)


# ------------------------------------------------------------------------------ slices
def _slices_uses(plan: Any) -> bool:
    return plan.config.splits != 1


def _slices_message(plan: Any, what: str, why: str) -> str:
    lengths = plan.config.slice_lengths
    where = ("keep it as a sapptk plan (plan.export('sapptk')); MindFormers runs equal slices only, and these are "
             f"unequal ({list(lengths)})" if lengths is not None and len(set(lengths)) > 1 else
             "export it to MindFormers (plan.export('mindformers'), parallel_config.seq_split_num) or keep it as a "
             "sapptk plan (plan.export('sapptk'))")
    return (f"{what} cannot express sequence slices: this plan runs {plan.config.schedule!r} with k = "
            f"{plan.config.splits} slices per micro-batch ({why}); {where}")


SLICES = Lever(
    name="slices",
    title="sequence slices",
    fields=(
        Field("splits", "integer", default=1, home="config", swept=True, cli="--splits",
              help="sequence slices per micro-batch, k (a schedule that takes them)"),
        Field("choose_splits", "flag", default=False, swept=False, cli="--choose-splits", choose=False,
              help="long context: choose the slice lengths for the plan (docs/schedules.md)"),
    ),
    phase="the slice search (sapptk.solver.slices: slice lengths chosen after the layout, with choose_splits)",
    bound="choose does not vary k: its setups have one slice per micro-batch",
    uses=_slices_uses,
    message=_slices_message,
    on=lambda values: values.get("splits", 1) != 1 or bool(values.get("choose_splits")),
    shown=lambda values: f"splits = {values.get('splits')!r}",
    refusals=(
        Refusal("megatron", "Megatron-LM arguments",
                "Megatron-LM's pipeline schedules move whole micro-batches; its context parallelism splits the "
                "sequence across devices, not along the pipeline"),
        Refusal("torchtitan", "torchtitan settings",
                "torch.distributed.pipelining's schedules and schedule CSV move whole micro-batches"),
        Refusal("torch-csv", "PyTorch's schedule CSV", "its actions name a stage and a micro-batch, no slice"),
    ),
    notes={"mindformers": "equal slices only (parallel_config.seq_split_num); unequal lengths are refused there"},
    excludes={name: "{other}: not modelled with the sequence slices of a long-context profile (seq_length = "
                    "{seq_length}); expected per-stage recompute without offload"
              for name in ("per_micro_batch", "offload")},
)


# ---------------------------------------------------------------------- per micro-batch
def _per_micro_batch_uses(plan: Any) -> bool:
    return getattr(plan, "alternative", None) is not None


def _per_micro_batch_message(plan: Any, what: str, why: str) -> str:
    cells = int(plan.alternative.mask.sum())
    runtimes = f" ({why})" if why else ""
    return (f"{what}: this plan recomputes per micro-batch ({cells} (virtual stage, micro-batch) cells run its "
            f"alternative layout), which {what} cannot express{runtimes}. Export the per-stage part with "
            "plan.per_stage_plan() (it is slower or needs more memory: simulate it), or write the "
            "per-micro-batch choice from plan.micro_batch_layout")


PER_MICRO_BATCH = Lever(
    name="per_micro_batch",
    title="recompute per micro-batch",
    fields=(Field("per_micro_batch", "flag", default=False, cli="--per-micro-batch",
                  help="let a stage recompute less for the micro-batches not alive at its memory peaks"),),
    phase="the per-micro-batch phase (sapptk.solver: after the per-stage plan, an alternative layout for "
          "chosen (virtual stage, micro-batch) cells)",
    bound="none valid: a plan that recomputes less in some micro-batches mixes modes within a virtual stage, "
          "and choose's bounds assume one mode per layer for every micro-batch",
    uses=_per_micro_batch_uses,
    message=_per_micro_batch_message,
    on=lambda values: bool(values.get("per_micro_batch")),
    shown=lambda values: "per_micro_batch = True",
    choose_refusal=("a plan that recomputes less in some micro-batches mixes modes within a virtual stage, and "
                    "the bounds (one mode per layer for every micro-batch) would not hold for it, so a setup could "
                    "be pruned wrongly; choose without it, then balance the winner's setup with "
                    "per_micro_batch=True (sapptk.balance)"),
    refusals=(
        Refusal("megatron", "Megatron-LM arguments",
                "--recompute-num-layers holds for every micro-batch; FlagScale's "
                "--recompute-num-layers-per-stage-micro-batch can vary full recompute per pipeline rank and "
                "micro-batch, not per chunk or group"),
        Refusal("torchtitan", "torchtitan settings", "activation checkpointing is set per model, for every "
                "micro-batch"),
        Refusal("mindformers", "a MindFormers config", "its recompute lists are per (chunk, stage), for every "
                "micro-batch"),
    ),
    excludes={"offload": "{this} with {other}: expected one of the two (a plan either offloads activations or "
                         "varies its recompute per micro-batch)"},
    controls=(Control("checkbox", "per_micro_batch", "recompute per micro-batch", width="200px",
                      tooltip="let chosen micro-batches of a stage recompute less"),),
    label="",
)


# ---------------------------------------------------------------------- memory safety
def _margin_summary(values: Mapping[str, Any]) -> str:
    margin = values["memory_margin"]
    unit = "of the budget" if margin < 1 else "MB"
    amount = f"{100 * margin:g} %" if margin < 1 else f"{margin:,g}"
    return f"margin {amount} {unit}"


def _risk_summary(values: Mapping[str, Any]) -> str:
    return f"OOM risk {values['oom_risk']:g} at {100 * (values.get('memory_error') or 0):g} % error"


def _never(plan: Any) -> bool:
    return False


def _no_message(plan: Any, what: str, why: str) -> str:  # pragma: no cover - a safe budget is never refused
    return f"{what}: {why}"


MEMORY_MARGIN = Lever(
    name="memory_margin",
    title="memory margin",
    fields=(Field("memory_margin", "number", low=0.0, high=checks.MAX_BUDGET_MB, cli="--memory-margin",
                  metavar="MB", help="keep this many MB free on every device (a value < 1 is a fraction of the "
                  "budget)"),),
    phase="the request (sapptk.request: every phase solves for the safe budget, budget minus margin)",
    bound="the safe budget: a bound under budget minus margin is a bound of every plan that keeps the margin",
    uses=_never,
    message=_no_message,
    on=lambda values: values.get("memory_margin") is not None,
    shown=lambda values: f"memory_margin = {values.get('memory_margin')!r}",
    controls=(Control("number", "memory_margin", "memory margin", note="MB, or a fraction if < 1 (0: none)",
                      high=checks.MAX_BUDGET_MB, step=0.01),),
    label="memory margin",
    summary=_margin_summary,
)

OOM_RISK = Lever(
    name="oom_risk",
    title="OOM risk",
    fields=(
        Field("oom_risk", "number", above=0.0, high=0.5, cli="--oom-risk", needs="memory_error", metavar="P",
              help="largest accepted chance that a device exceeds its budget (with --memory-error)"),
        Field("memory_error", "number", low=0.0, high=1.0, cli="--memory-error", needs="oom_risk", metavar="E",
              help="relative error of the memory figures, e.g. 0.02"),
    ),
    phase="the request (sapptk.request: every phase solves for the safe budget of sapptk.sensitivity."
          "robust_budget)",
    bound="the safe budget: a bound under it is a bound of every plan that keeps the risk",
    uses=_never,
    message=_no_message,
    on=lambda values: values.get("oom_risk") is not None,
    shown=lambda values: f"oom_risk = {values.get('oom_risk')!r}",
    controls=(
        Control("number", "oom_risk", "OOM risk", note="at a memory error of", high=0.499, step=0.001,
                width="60px"),
        Control("number", "memory_error", "memory error", note="(0: none)", high=1.0, step=0.01, offered=0.05,
                enabled_by="oom_risk", width="60px"),
    ),
    label="OOM risk",
    summary=_risk_summary,
)

LEVERS: tuple[Lever, ...] = (OFFLOAD, SLICES, PER_MICRO_BATCH, MEMORY_MARGIN, OOM_RISK)
"""Every lever, in the order refusals are tried and controls are laid out."""


def lever(name: str) -> Lever:
    """The lever called ``name`` (a KeyError naming the registered ones otherwise)."""
    for item in LEVERS:
        if item.name == name:
            return item
    raise KeyError(f"no lever {name!r}: levers are {', '.join(x.name for x in LEVERS)}")


def swept_fields() -> tuple[Field, ...]:
    """The request fields a sweep takes as grid axes besides the config's (each a frame column)."""
    return tuple(f for item in LEVERS for f in item.fields if f.home == "request" and f.swept)


SWEPT: tuple[Field, ...] = swept_fields()
"""The levers' request fields a grid may sweep (a column each), in order."""


def cli_fields(command: str) -> tuple[Field, ...]:
    """The levers' request fields with a flag of ``sapptk COMMAND`` (``"balance"``: every one;
    ``"sweep"``: the swept ones; ``"choose"``: those of levers ``choose`` takes)."""
    fields = [f for item in LEVERS for f in item.fields if f.home == "request" and f.cli is not None
              and (command != "choose" or (item.choose_refusal is None and f.choose))]
    return tuple(f for f in fields if command != "sweep" or f.swept)


def choose_levers(values: Mapping[str, Any]) -> dict[str, Any]:
    """The levers of a choice (request field → value), checked: a lever ``choose`` refuses
    (its ``choose_refusal``) is a ConfigError saying why, a field out of its limits one naming
    the limit, a field given without the one it needs (``needs``) one naming that."""
    out = dict(values)
    for item in LEVERS:
        for f in item.fields:
            if f.home != "request" or f.name not in values:
                continue
            if f.kind == "flag":
                out[f.name] = f.check(values[f.name])
                continue
            if values[f.name] is None:
                continue
            if f.needs is not None and values.get(f.needs) is None:
                raise ConfigError(_needs_message(f))
            if f.name == "memory_error" and not _is_number(values[f.name]):
                continue  # residuals: checked by sapptk.sensitivity.robust_budget
            out[f.name] = f.check(values[f.name])
        if item.choose_refusal is not None and item.on(out):
            raise ConfigError(f"{item.shown(out)}: {item.title} is not offered by choose: {item.choose_refusal}")
    return out


def check_exclusions(values: Mapping[str, Any]) -> None:
    """Refuse two levers that cannot go together (a lever's ``excludes``), with its message.

    ``values``: the request's fields by name (``recompute``, ``per_micro_batch``, ...); ``splits``
    counts only for a profile that slices (its ``seq_length`` also given); ``recompute_name``:
    how messages name the recompute set (``"config.recompute"`` for a solve)."""
    for item in LEVERS:
        if not item.excludes or not item.on(values):
            continue
        for name, template in item.excludes.items():
            other = lever(name)
            if other.on(values):
                raise ConfigError(template.format(**{**values, "this": item.shown(values),
                                                     "other": other.shown(values)}))


def _needs_message(f: Field) -> str:
    if f.name == "memory_error":
        return "memory_error: only used with oom_risk; give oom_risk too"
    return f"{f.name}: give {f.needs} too (a relative error such as 0.02, or residuals)"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value))

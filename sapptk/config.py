"""The pipeline setup a plan is made for: stages, micro-batches, schedule, budget.

:class:`PipelineConfig` is plain, frozen, picklable data (sweeps send it to other
processes). A setup names a registered schedule, or carries a :class:`Program` of its own
(a user's PyTorch schedule CSV, a cost-driven order rebuilt at a plan's costs): then
:meth:`PipelineConfig.program` returns that program, and stages, micro-batches, chunks,
splits and the schedule label must agree with it (:meth:`PipelineConfig.from_program`
fills them in). It is validated at the boundary by :meth:`PipelineConfig.check`, which raises
:class:`~sapptk.errors.ConfigError` naming the field, the value and the rule, before any
program is built or any solver runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from numbers import Real
from typing import TYPE_CHECKING, Any

from sapptk import checks
from sapptk.checks import show
from sapptk.errors import ConfigError, ScheduleError
from sapptk.profile import MODES, mode_set
from sapptk.schedules import Program, build, get, names
from sapptk.schedules.program import I_CODE

if TYPE_CHECKING:
    from sapptk.profile import Profile

__all__ = ["MAX_BANDWIDTH", "MAX_BUDGET_MB", "MAX_COMM_MS", "MAX_PROGRAM_OPS", "OFFLOAD", "PipelineConfig",
           "build_program", "program_ops"]

MAX_PROGRAM_OPS = checks.MAX_PROGRAM_OPS
"""Most ops a schedule's program may have (stages × chunks × micro-batches × splits × 2, or
× 3 with a split backward; :func:`program_ops`). Larger setups are refused before any work,
with an estimate of the time and memory they would need (``docs/limits.md`` gives the
measured cost per op)."""

MAX_BUDGET_MB = checks.MAX_BUDGET_MB
"""Largest memory budget or constant memory accepted, in MB (1 EB)."""

MAX_COMM_MS = checks.MAX_COMM_MS
"""Largest point-to-point latency accepted, in ms."""

MAX_BANDWIDTH = checks.MAX_BANDWIDTH
"""Largest host-link bandwidth accepted, in MB per ms (an exabyte per second)."""

OFFLOAD = "offload"
"""The ``recompute`` entry that allows activation offload (it is not a recompute mode)."""

_MS_PER_OP = 0.02  # the estimate in the refusal: build + simulate, per op (docs/limits.md)
_KB_PER_OP = 1.0


def program_ops(schedule: str, stages: int, micro_batches: int, chunks: int, splits: int) -> int:
    """The most ops the program of a setup can have (an exact Python int, of any size): an
    ``F`` and a backward per micro-batch slice and virtual stage, and a ``W`` for each
    backward a split-backward schedule splits (all of them for ZB-H1 and ZB-V, some for
    DualPipe-V, so there it is an upper bound)."""
    per_micro_batch = 3 if get(schedule).split_backward else 2
    return stages * chunks * micro_batches * splits * per_micro_batch


@lru_cache(maxsize=256)
def build_program(schedule: str, stages: int, micro_batches: int, chunks: int, splits: int) -> Program:
    """The :class:`Program` of a schedule instance, built once per argument tuple.

    Programs are immutable and cache their compiled graph, so sharing them between plans,
    the solver and the simulator is safe and saves the (linear, but not free) build. A setup
    of more than :data:`MAX_PROGRAM_OPS` ops is refused before anything is built.
    """
    if isinstance(schedule, str) and schedule in names() and all(map(_is_int, (stages, micro_batches, chunks, splits))):
        ops = program_ops(schedule, stages, micro_batches, chunks, splits)
        checks.size(ops, f"{schedule} with stages = {stages}, micro_batches = {micro_batches}, chunks = {chunks}, "
                    f"splits = {splits}: the program would have", error=ScheduleError, limit=MAX_PROGRAM_OPS,
                    what="ops", constant="sapptk.config.MAX_PROGRAM_OPS")
    return build(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks, splits=splits)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite real number (not a bool); integers too large for a float are not."""
    if not isinstance(value, Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _estimate(ops: int) -> str:
    if ops >= 10**12:
        return "more time and memory than any machine has"
    seconds = ops * _MS_PER_OP / 1e3
    gigabytes = ops * _KB_PER_OP / 1e6
    return f"about {seconds:,.0f} s and {gigabytes:,.1f} GB"


def _large(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline setup.

    Parameters
    ----------
    stages: devices in the pipeline, ``p``.
    micro_batches: micro-batches per step, ``m`` (at least ``p``).
    chunks: virtual stages (model chunks) per device, ``v``.
    schedule: a name from :func:`sapptk.schedules.names`.
    splits: sequence slices per micro-batch, ``k`` (seq-pipe schedules only), or a list of
        the slices' lengths in tokens (they must sum to the profile's ``seq_length``): then
        ``splits`` is their number and ``slice_lengths`` keeps them.
    memory_budget: MB available on each device; ``None`` means unlimited.
    constant_memory: MB every device holds besides parameters and activations.
    comm: point-to-point latency between devices, ms.
    recompute: the recompute modes the solver may use. A group may only use the modes
        that are both listed here and available in the profile; every group needs at
        least one such mode (``"none"`` is *not* implicitly allowed: listing only
        ``"full"`` forces full recompute everywhere).
    custom_program: a :class:`Program` to run instead of building ``schedule``; ``schedule``
        is then its name (a label) and the sizes are its sizes. Build such setups with
        :meth:`from_program` or :meth:`with_program`.
    host_bandwidth: MB per ms of each device's link to host memory, for activation offload
        (``None``: no host link). Listing ``"offload"`` in ``recompute`` lets the balancer
        send mode-``"none"`` layers' activations to the host (``docs/offload.md``); it
        needs a bandwidth > 0.
    """

    stages: int
    micro_batches: int
    chunks: int = 1
    schedule: str = "1f1b"
    splits: int = 1
    memory_budget: float | None = None
    constant_memory: float = 0
    comm: float = 0
    recompute: tuple[str, ...] = field(default=MODES)
    custom_program: Program | None = None
    host_bandwidth: float | None = None
    slice_lengths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        # one canonical tuple (MODES order), so equal mode sets give equal, hashable configs
        object.__setattr__(self, "recompute", mode_set(self.recompute))
        if isinstance(self.splits, list | tuple):  # splits=[lengths]: k = their number
            if self.slice_lengths is not None:
                raise ConfigError(f"splits = {show(self.splits)}: slice lengths given twice (splits and "
                                  "slice_lengths); give one")
            object.__setattr__(self, "slice_lengths", tuple(self.splits))
            object.__setattr__(self, "splits", len(self.splits))
        elif self.slice_lengths is not None and not isinstance(self.slice_lengths, tuple):
            object.__setattr__(self, "slice_lengths", tuple(self.slice_lengths)
                               if isinstance(self.slice_lengths, list) else self.slice_lengths)

    # ------------------------------------------------------------- derived
    @property
    def num_virtual_stages(self) -> int:
        """Virtual stages in the pipeline: ``stages · chunks``."""
        return self.stages * self.chunks

    def replace(self, **changes: Any) -> PipelineConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def from_program(cls, program: Program, **fields: Any) -> PipelineConfig:
        """A setup running ``program``: stages, micro-batches, chunks, splits and the schedule
        label come from it; ``fields`` give the rest (budget, comm, recompute, ...)."""
        if not isinstance(program, Program):
            raise ConfigError(f"program = {program!r}: expected a sapptk.schedules.Program")
        for name in ("stages", "micro_batches", "chunks", "splits", "schedule", "custom_program"):
            if name in fields:
                raise ConfigError(f"{name} = {fields[name]!r}: from_program takes it from the program; leave it out")
        return cls(stages=program.stages, micro_batches=program.micro_batches, chunks=program.chunks,
                   splits=program.splits, schedule=program.name, custom_program=program, **fields)

    def with_program(self, program: Program) -> PipelineConfig:
        """A copy running ``program`` (sizes and schedule label from it; everything else kept)."""
        fields = {f: getattr(self, f) for f in ("memory_budget", "constant_memory", "comm", "recompute",
                                                "host_bandwidth")}
        if self.slice_lengths is not None and program.splits == self.splits:
            fields["slice_lengths"] = self.slice_lengths
        return PipelineConfig.from_program(program, **fields)

    def program(self) -> Program:
        """The :class:`Program` this setup runs: the carried one, or the schedule's (cached
        per (schedule, p, m, v, k))."""
        self.validate()
        if self.custom_program is not None:
            return self.custom_program
        try:
            return build_program(self.schedule, self.stages, self.micro_batches, self.chunks, self.splits)
        except ScheduleError as exc:
            raise ConfigError(f"schedule = {self.schedule!r}: {exc}") from exc

    @property
    def split_backward(self) -> bool:
        """Whether the schedule splits the backward into input- and weight-gradient ops."""
        if self.custom_program is not None:
            return bool((self.custom_program.graph.op_kind == I_CODE).any())
        return get(self.schedule).split_backward

    # ---------------------------------------------------------- validation
    def validate(self) -> None:
        """Check the fields that do not depend on a profile; raise :class:`ConfigError`."""
        for name in ("stages", "micro_batches", "chunks", "splits"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"{name} = {show(value)}: expected an integer >= 1")
        lengths = self.slice_lengths
        if lengths is not None:
            if not isinstance(lengths, tuple) or not lengths:
                raise ConfigError(f"splits = {show(lengths)}: expected k or a non-empty list of slice lengths "
                                  "(tokens)")
            for j, n in enumerate(lengths):
                if not _is_int(n) or n < 1:
                    raise ConfigError(f"splits[{j}] = {show(n)}: expected a slice length in tokens, an integer >= 1 "
                                      f"(in splits = {show(list(lengths))})")
            if len(lengths) != self.splits:
                raise ConfigError(f"slice_lengths = {show(lengths)}: {len(lengths)} lengths for splits = "
                                  f"{self.splits}: expected one per slice")
        if self.custom_program is not None:
            self._check_program()
        else:
            if not isinstance(self.schedule, str) or self.schedule not in names():
                raise ConfigError(f"schedule = {show(self.schedule)}: unknown schedule; available: "
                                  f"{', '.join(names())}")
            ops = program_ops(self.schedule, self.stages, self.micro_batches, self.chunks, self.splits)
            if ops > MAX_PROGRAM_OPS:
                sizes = ("stages", "micro_batches", "chunks", "splits")
                setup = ", ".join(f"{n} = {show(getattr(self, n))}" for n in sizes)
                raise ConfigError(
                    f"{setup}: the {self.schedule} program would have {_large(ops)} ops, which would need "
                    f"{_estimate(ops)} to build and simulate: expected at most {MAX_PROGRAM_OPS:,} ops "
                    "(sapptk.config.MAX_PROGRAM_OPS)"
                )
            try:
                get(self.schedule).check(self.stages, self.micro_batches, self.chunks, self.splits)
            except ScheduleError as exc:
                raise ConfigError(f"schedule = {self.schedule!r}: {exc}") from exc
        if self.micro_batches < self.stages:
            raise ConfigError(
                f"micro_batches = {self.micro_batches}: expected at least stages = {self.stages} "
                "(fewer micro-batches than stages leaves devices idle for the whole step)"
            )
        if self.memory_budget is not None and (
            not _is_number(self.memory_budget) or not 0 < self.memory_budget <= MAX_BUDGET_MB
        ):
            raise ConfigError(f"memory_budget = {show(self.memory_budget)}: expected MB > 0 and at most "
                              f"{MAX_BUDGET_MB:g}, or None for unlimited")
        if not _is_number(self.constant_memory) or not 0 <= self.constant_memory <= MAX_BUDGET_MB:
            raise ConfigError(f"constant_memory = {show(self.constant_memory)}: expected MB >= 0 and at most "
                              f"{MAX_BUDGET_MB:g}")
        if not _is_number(self.comm) or not 0 <= self.comm <= MAX_COMM_MS:
            raise ConfigError(f"comm = {show(self.comm)}: expected a latency in ms >= 0 and at most {MAX_COMM_MS:g}")
        rec = self.recompute
        if not isinstance(rec, tuple) or not rec or not all(isinstance(r, str) for r in rec):
            raise ConfigError(f"recompute = {rec!r}: expected a non-empty tuple of mode names from {MODES}")
        unknown = [r for r in rec if r not in MODES and r != OFFLOAD]
        if unknown:
            raise ConfigError(f"recompute = {rec!r}: unknown mode {unknown[0]!r}; modes are {', '.join(MODES)} "
                              f"(and {OFFLOAD!r} to allow activation offload)")
        if len(set(rec)) != len(rec):
            raise ConfigError(f"recompute = {rec!r}: a mode is listed twice")
        bw = self.host_bandwidth
        if bw is not None and (not _is_number(bw) or not 0 < bw <= MAX_BANDWIDTH):
            raise ConfigError(f"host_bandwidth = {show(bw)}: expected MB per ms > 0 and at most {MAX_BANDWIDTH:g}, "
                              "or None for no host link")
        if OFFLOAD in rec and bw is None:
            raise ConfigError(f"recompute = {rec!r}: {OFFLOAD!r} needs the host link's bandwidth: expected "
                              "host_bandwidth = MB per ms > 0, got None")

    def _check_program(self) -> None:
        program = self.custom_program
        if not isinstance(program, Program):
            raise ConfigError(f"custom_program = {program!r}: expected a sapptk.schedules.Program or None")
        for name in ("stages", "micro_batches", "chunks", "splits"):
            if getattr(self, name) != getattr(program, name):
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r}: the carried program {program.name!r} has {name} = "
                    f"{getattr(program, name)} (use PipelineConfig.from_program or with_program)"
                )
        if self.schedule != program.name:
            raise ConfigError(f"schedule = {self.schedule!r}: expected the carried program's name {program.name!r}")
        if program.num_virtual_stages != self.stages * self.chunks:
            raise ConfigError(
                f"custom_program {program.name!r}: {program.num_virtual_stages} virtual stages: expected stages · "
                f"chunks = {self.stages * self.chunks}"
            )
        try:
            program.validate()
        except ScheduleError as exc:
            raise ConfigError(f"custom_program {program.name!r}: {exc}") from exc

    def check(self, profile: Profile, *, allow_empty_stages: bool = False) -> None:
        """Validate this setup against a profile; raise :class:`ConfigError` on the first problem.

        Beyond :meth:`validate`: every body group needs an allowed mode that the profile
        provides, and (unless ``allow_empty_stages``) there must be at least one body layer
        for every virtual stage that holds neither the head nor the tail.
        """
        self.validate()
        self.check_slices(profile)
        body = tuple(profile.body)
        rec = self.recompute
        if not body:
            raise ConfigError(f"profile {profile.name!r}: no BODY layer group to distribute")
        for group in body:
            allowed = [r for r in self.recompute if r in group.modes]
            if not allowed:
                lever = f" ({OFFLOAD!r} is a lever on top of the modes, not a mode)" if OFFLOAD in rec else ""
                raise ConfigError(
                    f"recompute = {self.recompute!r}: body group {group.name!r} offers only "
                    f"{tuple(group.modes)}; allow at least one of them{lever}"
                )
        if not allow_empty_stages:
            layers = sum(g.count for g in body)
            ends = {0} if profile.head is not None else set()
            if profile.tail is not None:
                ends.add(self.num_virtual_stages - 1)
            need = self.num_virtual_stages - len(ends)
            if layers < need:
                raise ConfigError(
                    f"stages = {self.stages}, chunks = {self.chunks}: {self.num_virtual_stages} virtual stages "
                    f"need at least {need} body layers (one per stage without head or tail), "
                    f"the profile has {layers}; use fewer stages/chunks or allow empty stages"
                )

    def check_slices(self, profile: Profile) -> None:
        """Slice lengths against the profile's ``seq_length``; K/V sizes for a sliced long-context setup."""
        seq = profile.seq_length
        lengths = self.slice_lengths
        if lengths is not None and self.splits > 1 and seq is None:
            raise ConfigError(f"splits = {list(lengths)}: slice lengths in tokens need the profile's seq_length "
                              f"(profile {profile.name!r} has none); give seq_length or splits = k")
        if seq is not None and lengths is not None and sum(lengths) != seq:  # one slice too: splits=[5]
            raise ConfigError(f"splits = {list(lengths)}: the slice lengths sum to {sum(lengths)} tokens: expected "
                              f"the profile's seq_length = {seq}")
        if seq is None or self.splits == 1:
            return
        if self.splits > seq:
            raise ConfigError(f"splits = {self.splits}: more slices than the profile's seq_length = {seq} tokens: "
                              "expected at most one slice per token")
        for end in (profile.head, profile.tail):
            if end is not None and end.attention_share:
                raise ConfigError(f"profile {profile.name!r}: {end.kind} group {end.name!r} has attention_share = "
                                  f"{end.attention_share:g}: expected 0 (the head and tail are linear in the sequence)")
        missing = [g.name for g in profile.body if g.kv_mb_per_token is None]
        if missing:
            raise ConfigError(
                f"profile {profile.name!r}: body group {missing[0]!r} has no kv_mb_per_token: a sequence-slice "
                f"schedule on a profile with seq_length = {seq} keeps each slice's K/V for the later slices, so "
                "every body group needs kv_mb_per_token (K/V MB per layer per token; the model-card estimator "
                "fills it)"
            )

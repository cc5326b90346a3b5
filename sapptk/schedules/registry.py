"""Names → schedule builders, with the constraints each one places on its arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from sapptk.errors import ScheduleError
from sapptk.schedules.basic import build_1f1b, build_gpipe, build_seq1f1b
from sapptk.schedules.dualpipe import build_dualpipe_v
from sapptk.schedules.interleaved import (
    build_interleaved,
    build_interleaved_lm,
    build_interleaved_lm_rf,
    build_interleaved_megatron,
    build_interleaved_rf,
    build_interleaved_zb,
)
from sapptk.schedules.program import Program
from sapptk.schedules.seq import build_seq_interleaved, build_seq_interleaved_lm
from sapptk.schedules.zerobubble import OpCosts, build_zb_h1, build_zb_v, build_zb_v_greedy

Builder = Callable[..., Program]


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule family: its builder and the arguments it accepts.

    ``chunks``: the allowed chunks per device (None: any >= 1). ``splits``: whether
    sequence slices (splits > 1) are allowed. ``min_micro_batches(p, v)``: the fewest
    micro-batches it needs. ``placement``: "line" (virtual stage c·p + s on device s) or
    "v" (chunk 0 runs devices 0→p−1, chunk 1 back p−1→0). ``grouping``: for interleaved
    schedules, how micro-batches are grouped when p does not divide m
    (:func:`sapptk.schedules.interleaved.micro_batch_groups`); "" otherwise. ``cost_driven``:
    the op order depends on op costs (the builder takes ``costs=``; unit costs without).
    ``pytorch``: the class of ``torch.distributed.pipelining`` that runs the same order, ""
    if none does.
    """

    name: str
    builder: Builder
    description: str
    placement: str = "line"
    chunks: tuple[int, ...] | None = (1,)
    splits: bool = False
    split_backward: bool = False
    min_micro_batches: Callable[[int, int], int] = lambda p, v: 1
    min_micro_batches_text: str = "m >= 1"
    grouping: str = ""
    cost_driven: bool = False
    pytorch: str = ""

    def check(self, stages: int, micro_batches: int, chunks: int, splits: int) -> None:
        """Raise :class:`ScheduleError` naming the first constraint the arguments break."""
        for label, value in (("stages", stages), ("micro_batches", micro_batches),
                             ("chunks", chunks), ("splits", splits)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{self.name}: {label} = {value!r}: expected an integer >= 1")
        if self.chunks is not None and chunks not in self.chunks:
            allowed = " or ".join(map(str, self.chunks))
            raise ScheduleError(f"{self.name}: chunks = {chunks}: this schedule needs chunks = {allowed}")
        if splits != 1 and not self.splits:
            raise ScheduleError(f"{self.name}: splits = {splits}: this schedule has no sequence slices (splits = 1)")
        need = self.min_micro_batches(stages, chunks)
        if micro_batches < need:
            raise ScheduleError(
                f"{self.name}: micro_batches = {micro_batches} with stages = {stages}: "
                f"needs {self.min_micro_batches_text} (at least {need})"
            )

    @property
    def constraints(self) -> str:
        chunks = "any" if self.chunks is None else " or ".join(map(str, self.chunks))
        parts = [f"chunks: {chunks}", self.min_micro_batches_text]
        parts.append("splits >= 1" if self.splits else "splits = 1")
        return "; ".join(parts)


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(spec: ScheduleSpec) -> ScheduleSpec:
    """Add a schedule family to the registry (names are unique: a taken name is a ScheduleError)."""
    if spec.name in _REGISTRY:
        raise ScheduleError(f"register: schedule {spec.name!r} is already registered: expected a new name")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> ScheduleSpec:
    """The spec of a schedule by name; a clear error listing the names otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ScheduleError(f"unknown schedule {name!r}; available: {', '.join(_REGISTRY)}") from None


def names() -> tuple[str, ...]:
    """Registered schedule names, in registration order."""
    return tuple(_REGISTRY)


def available() -> pd.DataFrame:
    """One row per schedule: name, description, placement, constraints, micro-batch grouping
    (interleaved schedules), whether the order depends on costs, and the PyTorch class
    running the same order."""
    rows = [
        {
            "name": s.name,
            "description": s.description,
            "placement": s.placement,
            "chunks": "any" if s.chunks is None else ",".join(map(str, s.chunks)),
            "splits": s.splits,
            "split_backward": s.split_backward,
            "micro_batches": s.min_micro_batches_text,
            "constraints": s.constraints,
            "grouping": s.grouping,
            "cost_driven": s.cost_driven,
            "pytorch": s.pytorch,
        }
        for s in _REGISTRY.values()
    ]
    return pd.DataFrame(rows)


def build(name: str, *, stages: int, micro_batches: int, chunks: int = 1, splits: int = 1,
          costs: OpCosts | None = None) -> Program:
    """Build the :class:`Program` of schedule ``name`` for (p, m, v, k).

    ``costs`` (a :class:`~sapptk.schedules.zerobubble.OpCosts`) is read by cost-driven
    schedules only (``zb-v-greedy``); the others ignore it. Raises :class:`ScheduleError` if
    the arguments break the schedule's constraints.
    """
    spec = get(name)
    spec.check(stages, micro_batches, chunks, splits)
    if spec.cost_driven:
        return spec.builder(stages, micro_batches, chunks, splits, costs=costs)
    return spec.builder(stages, micro_batches, chunks, splits)


_AT_LEAST_P = {"min_micro_batches": lambda p, v: p, "min_micro_batches_text": "m >= p"}
_SEQ_CHUNKS_MIN = {"min_micro_batches": lambda p, v: p if v > 1 else 1, "min_micro_batches_text": "m >= p when v > 1"}

register(ScheduleSpec("gpipe", build_gpipe, "GPipe: all forwards, then all backwards", pytorch="ScheduleGPipe"))
register(ScheduleSpec("1f1b", build_1f1b, "1F1B: p − s − 1 warm-up forwards, then one forward one backward",
                      pytorch="Schedule1F1B"))
register(ScheduleSpec(
    "interleaved", build_interleaved,
    "Interleaved 1F1B (virtual pipeline), micro-batches in equal rounds as PyTorch",
    chunks=None, grouping="equal", pytorch="ScheduleInterleaved1F1B", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "interleaved-rf", build_interleaved_rf,
    "Interleaved 1F1B, the remainder m mod p in the first group",
    chunks=None, grouping="remainder-first", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "interleaved-megatron", build_interleaved_megatron,
    "Interleaved 1F1B grouped as Megatron-LM (microbatch_group_size_per_vp_stage, smallest valid)",
    chunks=None, grouping="megatron", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "interleaved-lm", build_interleaved_lm,
    "Less-memory interleaved 1F1B (warm-up v·p − s − 1), equal rounds",
    chunks=None, grouping="equal", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "interleaved-lm-rf", build_interleaved_lm_rf,
    "Less-memory interleaved 1F1B, the remainder m mod p in the first group",
    chunks=None, grouping="remainder-first", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "interleaved-zb", build_interleaved_zb,
    "Interleaved zero bubble (ZB-1P on chunks): less-memory warm-up, W of device s s backwards late",
    chunks=None, split_backward=True, grouping="equal", pytorch="ScheduleInterleavedZeroBubble", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "seq1f1b", build_seq1f1b,
    "Seq1F1B: 1F1B over k sequence slices per micro-batch", splits=True,
))
register(ScheduleSpec(
    "seq-interleaved", build_seq_interleaved,
    "Sequence slices on interleaved chunks: k slices per micro-batch, v chunks per device",
    chunks=None, splits=True, grouping="equal", **_SEQ_CHUNKS_MIN,
))
register(ScheduleSpec(
    "seq-interleaved-lm", build_seq_interleaved_lm,
    "Sequence slices on less-memory interleaved chunks (warm-up (v − 1)·G + p − s + k − 2)",
    chunks=None, splits=True, grouping="equal", **_SEQ_CHUNKS_MIN,
))
register(ScheduleSpec(
    "dualpipe-v", build_dualpipe_v,
    "DualPipeV (DeepSeek): V placement, overlapped F&B pairs, zero-bubble split backwards at the ends",
    placement="v", chunks=(2,), split_backward=True, pytorch="ScheduleDualPipeV",
    min_micro_batches=lambda p, v: 2 * p, min_micro_batches_text="m >= 2p",
))
register(ScheduleSpec(
    "zb-h1", build_zb_h1,
    "ZB-H1: 1F1B with split backwards, the W of stage s run s micro-batches late",
    split_backward=True, pytorch="ScheduleInterleavedZeroBubble",
))
register(ScheduleSpec(
    "zb-v", build_zb_v,
    "ZB-V in PyTorch's order: V placement, split backwards, zero bubble when F = I = W",
    placement="v", chunks=(2,), split_backward=True, pytorch="ScheduleZBVZeroBubble", **_AT_LEAST_P,
))
register(ScheduleSpec(
    "zb-v-greedy", build_zb_v_greedy,
    "ZB-V as a list schedule at the plan's costs (unit costs until balanced), memory capped at 1F1B's",
    placement="v", chunks=(2,), split_backward=True, cost_driven=True, **_AT_LEAST_P,
))

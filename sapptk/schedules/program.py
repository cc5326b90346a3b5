"""A schedule as data: the ordered ops of every device, and what derives from them.

A :class:`Program` is the one truth about a schedule. The simulator, the balancer's
memory and time model, the plots and the exports all read it, never a closed form.

Op kinds (:mod:`sapptk.schedules.ops`): ``F`` forward, ``B`` full backward, ``I``
input-gradient part of a split backward, ``W`` its weight-gradient part. Dependencies are
derived from the kinds (:mod:`sapptk.schedules.graph`), never written per schedule.

Ops that a device runs overlapped (DualPipe's forward/backward pairs) form one *unit*;
every other unit holds a single op. A device runs its units one after another.

A program stores its ops as arrays (:class:`~sapptk.schedules.ops.OpArrays`). Builders
make one of two ways: :func:`program_from_arrays` from per-device arrays of kind,
micro-batch, virtual stage, slice and unit (the fast path, used by the regular
schedules), or :func:`make_program` from per-device lists of :class:`Op` (for orders
easier to write op by op). :attr:`Program.units` is the op-by-op view, built on first use.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import ScheduleError
from sapptk.files import write_text
from sapptk.pareto import pareto_front
from sapptk.schedules.graph import ProgramGraph, compile_graph
from sapptk.schedules.memory import MemoryEvents, memory_events
from sapptk.schedules.ops import (
    B_CODE,
    F_CODE,
    I_CODE,
    KIND_CODES,
    KIND_NAMES,
    KINDS,
    W_CODE,
    Op,
    OpArrays,
    Unit,
)

__all__ = [
    "B_CODE",
    "F_CODE",
    "I_CODE",
    "KINDS",
    "KIND_NAMES",
    "W_CODE",
    "Op",
    "OpArrays",
    "Program",
    "ProgramGraph",
    "Unit",
    "make_program",
    "program_from_arrays",
]


@dataclass(frozen=True, eq=False)
class Program:
    """The per-device op order of one schedule instance.

    Attributes
    ----------
    name: schedule name (``"1f1b"``, ``"interleaved"``, ...).
    stages: number of devices ``p``.
    micro_batches: micro-batches per step ``m``.
    chunks: virtual stages per device ``v``.
    splits: sequence slices per micro-batch ``k``.
    placement: device of each virtual stage, virtual stages in model order.
    arrays: the op order as flat arrays (device by device, unit by unit).

    Build one with :func:`program_from_arrays` or :func:`make_program` (both validate).
    """

    name: str
    stages: int
    micro_batches: int
    chunks: int
    splits: int
    placement: tuple[int, ...]
    arrays: OpArrays

    # ----------------------------------------------------------------- views
    @property
    def num_virtual_stages(self) -> int:
        return len(self.placement)

    @cached_property
    def chunk_of(self) -> tuple[int, ...]:
        """Chunk index of each virtual stage: its rank among its device's stages."""
        seen = [0] * self.stages
        out = []
        for d in self.placement:
            out.append(seen[d])
            seen[d] += 1
        return tuple(out)

    @cached_property
    def device_stages(self) -> tuple[tuple[int, ...], ...]:
        """Virtual stages held by each device, in model order."""
        out: list[list[int]] = [[] for _ in range(self.stages)]
        for vs, d in enumerate(self.placement):
            out[d].append(vs)
        return tuple(tuple(x) for x in out)

    @property
    def num_ops(self) -> int:
        return self.arrays.n_ops

    @cached_property
    def units(self) -> tuple[tuple[Unit, ...], ...]:
        """For each device, its units in run order; a unit is a tuple of :class:`Op` run overlapped.

        Built from :attr:`arrays` on first use (op by op: meant for reading, not for speed).
        """
        return self.arrays.units()

    @cached_property
    def ops(self) -> pd.DataFrame:
        """One row per compute op.

        Columns: ``device``, ``order`` (unit position on the device), ``unit`` (id shared
        by ops run overlapped as one unit), ``kind`` (categorical F/B/I/W),
        ``micro_batch``, ``virtual_stage``, ``chunk``, ``slice``.
        """
        g = self.graph
        dev = g.unit_device[g.op_unit]
        order = g.op_unit - g.unit_ptr[dev]
        return pd.DataFrame(
            {
                "device": dev,
                "order": order,
                "unit": g.op_unit,
                "kind": pd.Categorical.from_codes(g.op_kind, dtype=kind_dtype()),
                "micro_batch": g.op_micro_batch,
                "virtual_stage": g.op_virtual_stage,
                "chunk": np.asarray(self.chunk_of, dtype=np.int64)[g.op_virtual_stage],
                "slice": g.op_slice,
            }
        )

    def device_ops(self, device: int) -> list[Op]:
        """The ops of one device in run order (units flattened)."""
        a = self.arrays
        first, last = a.unit_op_ptr[a.unit_ptr[device]], a.unit_op_ptr[a.unit_ptr[device + 1]]
        return [a.op(i) for i in range(first, last)]

    def __repr__(self) -> str:
        return (
            f"Program({self.name!r}, stages={self.stages}, micro_batches={self.micro_batches},"
            f" chunks={self.chunks}, splits={self.splits}, ops={self.num_ops})"
        )

    def describe(self, device: int | None = None) -> str:
        """A compact text rendering of the op order, one line per device."""
        a = self.arrays
        devices = range(self.stages) if device is None else [device]
        lines = []
        for d in devices:
            parts = ["+".join(map(str, a.unit(u))) for u in range(a.unit_ptr[d], a.unit_ptr[d + 1])]
            lines.append(f"device {d}: " + " ".join(parts))
        return "\n".join(lines)

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The op order in PyTorch's schedule CSV (``torch.distributed.pipelining``'s
        ``_dump_csv``/``_load_csv`` form; see :mod:`sapptk.schedules.torch_csv`).

        Returns the text and writes it to ``path`` when given; ``sapptk.schedules.from_csv``
        reads it back to an equal program. Programs with sequence slices cannot be written.
        """
        if self.splits != 1:
            raise ScheduleError(
                f"{self.name}: splits = {self.splits}: PyTorch's schedule CSV has no sequence slices "
                "(only programs with splits = 1 can be written)"
            )
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for units in self.units:
            writer.writerow([_csv_cell(u) for u in units])
        text = buffer.getvalue()
        if path is not None:  # atomically; a folder, a missing folder or a full disk is a ScheduleError
            write_text(path, text, what="schedule CSV", error=ScheduleError)
        return text

    # ------------------------------------------------------------ the graph
    @cached_property
    def graph(self) -> ProgramGraph:
        """Validate the program and derive its dependency graph (cached)."""
        return compile_graph(self)

    def validate(self) -> None:
        """Raise :class:`ScheduleError` (or :class:`DeadlockError`) if the program is invalid."""
        self.graph  # noqa: B018 - compiling validates

    # ----------------------------------------------------- memory from order
    @cached_property
    def memory_events(self) -> MemoryEvents:
        """Allocation and free events of every device in run order (:mod:`sapptk.schedules.memory`)."""
        return memory_events(self.graph, self.chunk_of, self.splits)

    def live_points(self, weight_holds: float = 0.5) -> list[np.ndarray]:
        """Live activation counts at every point where a device's memory can peak.

        For each device, an array of shape ``(points, chunks)``: after the allocations of
        each unit that allocates, how many micro-batches' worth of activation of each of
        the device's virtual stages are alive (a slice counts ``1/splits``; after an ``I``
        the fraction ``weight_holds`` stays until its ``W``). Only Pareto-maximal rows
        are kept, in ascending (lexicographic) order. These depend on the order alone,
        never on durations: the simulator's peak equals
        ``params + constant + max_row(row · activation)``.
        """
        widths = [len(s) for s in self.device_stages]
        return [_pareto_max(pts) for pts in self.memory_events.live_points(weight_holds, widths)]

    def peak_live(self, weight_holds: float = 0.5) -> np.ndarray:
        """Most micro-batch activations alive at once on each device (chunks summed), shape (p,)."""
        return self.memory_events.peak_live(weight_holds)


def _csv_cell(unit: Unit) -> str:
    """One unit as a PyTorch schedule action: ``<stage><kind><micro-batch>``, overlapped ops
    as ``(a;b)OVERLAP_F_B``."""
    ops = [f"{op.virtual_stage}{op.kind}{op.micro_batch}" for op in unit]
    return ops[0] if len(ops) == 1 else f"({';'.join(ops)})OVERLAP_F_B"


def _pareto_max(points: np.ndarray) -> np.ndarray:
    """Rows not dominated (<= in every column) by another row; duplicates removed; sorted."""
    if len(points) <= 1:
        return points
    pts = np.round(points, 9)
    front = pts[pareto_front(-pts)]
    return front[np.lexsort(front.T[::-1])]


@cache
def kind_dtype() -> pd.CategoricalDtype:
    """The categorical dtype of op kinds (F, B, I, W), made once (pandas checks categories slowly)."""
    return pd.CategoricalDtype(list(KINDS))


# ---------------------------------------------------------------- building
def make_program(
    name: str,
    *,
    stages: int,
    micro_batches: int,
    chunks: int,
    splits: int,
    placement: Sequence[int],
    device_units: Iterable[Iterable[Unit | Op]],
) -> Program:
    """Assemble a :class:`Program` from per-device lists of ops or units.

    A bare :class:`Op` in a device list is a unit of its own. The result is validated
    (every op once, dependencies acyclic) before it is returned.
    """
    units = tuple(
        tuple(u if isinstance(u, tuple) and not isinstance(u, Op) else (u,) for u in dev) for dev in device_units
    )
    if len(units) != stages:
        raise ScheduleError(f"{name}: {len(units)} device op lists for {stages} stages")
    flat_units = [u for dev in units for u in dev]
    flat_ops = [op for u in flat_units for op in u]
    n_ops = len(flat_ops)
    try:
        kinds = np.fromiter((KIND_CODES[op[0]] for op in flat_ops), dtype=np.int8, count=n_ops)
    except KeyError as exc:
        raise ScheduleError(f"{name}: unknown op kind {exc.args[0]!r}; expected one of {KINDS}") from None
    fields = np.array([op[1:4] for op in flat_ops], dtype=np.int64).reshape(n_ops, 3)
    unit_ptr = np.r_[0, np.cumsum([len(dev) for dev in units])]
    unit_op_ptr = np.r_[0, np.cumsum([len(u) for u in flat_units])]
    arrays = OpArrays(unit_ptr, unit_op_ptr, kinds, fields[:, 0], fields[:, 1], fields[:, 2])
    program = _program(name, stages, micro_batches, chunks, splits, placement, arrays)
    program.__dict__["units"] = units  # the op-by-op view is at hand: keep it
    program.validate()
    return program


def program_from_arrays(
    name: str,
    *,
    stages: int,
    micro_batches: int,
    chunks: int,
    splits: int,
    placement: Sequence[int],
    kind: Any,
    micro_batch: Any,
    virtual_stage: Any,
    slice: Any = None,  # noqa: A002 - the op field's name
    unit: Any = None,
    ops_per_device: Sequence[int] | None = None,
) -> Program:
    """Assemble a :class:`Program` from arrays of op fields, and validate it.

    Either every field is a 2-D array of shape ``(stages, ops per device)`` (row ``d``:
    device ``d``'s ops in run order), or a flat array of all ops device by device with
    ``ops_per_device`` saying how many each device runs. ``kind`` holds letters
    (``"F"``, ``"B"``, ``"I"``, ``"W"``) or their codes (0–3, :data:`KINDS` order);
    ``slice`` defaults to 0. ``unit`` groups ops run overlapped: an op whose ``unit``
    value equals the previous op's on the same device joins that op's unit (default:
    every op is a unit of its own).
    """
    kind_arr = np.asarray(kind)
    shape = kind_arr.shape
    if ops_per_device is None:
        if kind_arr.ndim != 2 or shape[0] != stages:
            raise ScheduleError(
                f"{name}: op arrays: expected shape (stages={stages}, ops per device), got {shape}"
                " (or flat arrays with ops_per_device)"
            )
        counts = np.full(stages, shape[1], dtype=np.int64)
    else:
        counts = np.asarray(ops_per_device)
        if counts.shape != (stages,) or counts.dtype.kind not in "iu" or (counts < 0).any():
            raise ScheduleError(f"{name}: ops_per_device: expected {stages} counts >= 0, got {ops_per_device!r}")
        if kind_arr.ndim != 1 or shape[0] != counts.sum():
            raise ScheduleError(f"{name}: op arrays: expected {int(counts.sum())} ops in a flat array, got {shape}")
    n = kind_arr.size
    codes = _kind_codes(name, kind_arr.reshape(n))
    columns = {}
    for label, value in (("micro_batch", micro_batch), ("virtual_stage", virtual_stage), ("slice", slice),
                         ("unit", unit)):
        if value is None:
            columns[label] = None
            continue
        arr = np.asarray(value)
        if arr.shape != shape:
            raise ScheduleError(f"{name}: op arrays: {label} has shape {arr.shape}, kind has {shape}")
        if arr.dtype.kind not in "iu":
            raise ScheduleError(f"{name}: op arrays: {label} must hold integers, got dtype {arr.dtype}")
        columns[label] = arr.reshape(n)
    sl = columns["slice"] if columns["slice"] is not None else np.zeros(n, dtype=np.int64)
    device_first = np.zeros(n, dtype=bool)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    device_first[starts[counts > 0]] = True
    if columns["unit"] is None:
        new_unit = np.ones(n, dtype=bool)
    else:
        u = columns["unit"]
        new_unit = device_first | np.r_[True, u[1:] != u[:-1]]
    unit_starts = np.flatnonzero(new_unit)
    unit_op_ptr = np.r_[unit_starts, n]
    # units per device: unit starts before each device boundary
    unit_ptr = np.searchsorted(unit_starts, np.r_[starts, n], side="left")
    arrays = OpArrays(unit_ptr, unit_op_ptr, codes, columns["micro_batch"], columns["virtual_stage"], sl)
    program = _program(name, stages, micro_batches, chunks, splits, placement, arrays)
    program.validate()
    return program


def _kind_codes(name: str, kind: np.ndarray) -> np.ndarray:
    """Kind letters or codes as int8 codes; a clear error for anything else."""
    if kind.dtype.kind in "iu":
        bad = (kind < 0) | (kind >= len(KINDS))
        if bad.any():
            raise ScheduleError(
                f"{name}: unknown op kind code {int(kind[bad][0])}; expected 0..{len(KINDS) - 1} for {KINDS}"
            )
        return kind.astype(np.int8)
    values, inverse = np.unique(kind.astype(str), return_inverse=True)
    lookup = np.array([KIND_CODES.get(v, -1) for v in values.tolist()], dtype=np.int8)
    if (lookup < 0).any():
        raise ScheduleError(f"{name}: unknown op kind {str(values[lookup < 0][0])!r}; expected one of {KINDS}")
    return lookup[inverse.reshape(-1)]


def _program(
    name: str, stages: int, micro_batches: int, chunks: int, splits: int, placement: Sequence[int], arrays: OpArrays
) -> Program:
    return Program(
        name=name,
        stages=stages,
        micro_batches=micro_batches,
        chunks=chunks,
        splits=splits,
        placement=tuple(int(d) for d in placement),
        arrays=arrays,
    )

"""A schedule as data: the ordered ops of every device, and the graph derived from them.

A :class:`Program` is the one truth about a schedule. The simulator, the balancer's
memory and time model, the plots and the exports all read it, never a closed form.

Op kinds
--------
``F``  forward of one (micro-batch, virtual stage, slice)
``B``  full backward (input and weight gradients together)
``I``  input-gradient part of a split backward (zero-bubble); its ``W`` must follow
``W``  weight-gradient part of a split backward

Dependencies are derived from the kinds, never written per schedule:

* ``F(m, v, j)`` needs ``F(m, v-1, j)`` and ``F(m, v, j-1)`` (causal slices);
* the backward (``B`` or ``I``) of ``(m, v, j)`` needs the backward of ``(m, v+1, j)``,
  or, on the last virtual stage, ``F(m, v, j)``; and the backward of ``(m, v, j+1)``
  (slices run in reverse);
* ``W(m, v, j)`` needs ``I(m, v, j)``.

Ops that a device runs overlapped (DualPipe's forward/backward pairs) form one *unit*;
every other unit holds a single op. A device runs its units one after another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pandas as pd

from sapptk.errors import DeadlockError, ScheduleError

KINDS: tuple[str, ...] = ("F", "B", "I", "W")
KIND_NAMES: dict[str, str] = {
    "F": "forward",
    "B": "backward",
    "I": "input-gradient",
    "W": "weight-gradient",
}
_CODE = {k: i for i, k in enumerate(KINDS)}
F_CODE, B_CODE, I_CODE, W_CODE = 0, 1, 2, 3


class Op(NamedTuple):
    """One compute op: its kind, micro-batch, virtual stage and sequence slice."""

    kind: str
    micro_batch: int
    virtual_stage: int
    slice: int = 0

    def __str__(self) -> str:
        tail = f"/{self.slice}" if self.slice else ""
        return f"{self.kind}{self.micro_batch}@{self.virtual_stage}{tail}"


Unit = tuple[Op, ...]


@dataclass(frozen=True, eq=False)
class ProgramGraph:
    """Flat arrays derived from a :class:`Program`; built once and cached.

    Units are numbered device by device, in each device's order, so the units of
    device ``d`` are ``unit_ptr[d]:unit_ptr[d+1]``. Ops are numbered unit by unit.
    """

    unit_ptr: np.ndarray  # (p+1,) first unit of each device
    unit_device: np.ndarray  # (n_units,)
    unit_op_ptr: np.ndarray  # (n_units+1,) first op of each unit
    op_kind: np.ndarray  # (n_ops,) int8 code into KINDS
    op_micro_batch: np.ndarray
    op_virtual_stage: np.ndarray
    op_slice: np.ndarray
    op_unit: np.ndarray
    op_deps: np.ndarray  # (n_ops, 2) op indices this op needs, -1 for none
    unit_preds: np.ndarray  # (n_units, D) predecessor units (device chain first), n_units = none
    unit_cross: np.ndarray  # (n_units, D) bool: predecessor on another device (comm applies)
    topo_order: np.ndarray  # units in a valid execution order
    level: np.ndarray  # longest chain of units ending at each unit (0-based)
    level_ptr: np.ndarray  # units sorted by level: level_units[level_ptr[l]:level_ptr[l+1]]
    level_units: np.ndarray

    @property
    def n_units(self) -> int:
        return len(self.unit_device)

    @property
    def n_ops(self) -> int:
        return len(self.op_kind)


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
    units: for each device, its units in run order; a unit is a tuple of ops run
        overlapped (usually one op).
    """

    name: str
    stages: int
    micro_batches: int
    chunks: int
    splits: int
    placement: tuple[int, ...]
    units: tuple[tuple[Unit, ...], ...]

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
        return self.graph.n_ops

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
                "kind": pd.Categorical.from_codes(g.op_kind, categories=list(KINDS)),
                "micro_batch": g.op_micro_batch,
                "virtual_stage": g.op_virtual_stage,
                "chunk": np.asarray(self.chunk_of, dtype=np.int64)[g.op_virtual_stage],
                "slice": g.op_slice,
            }
        )

    def device_ops(self, device: int) -> list[Op]:
        """The ops of one device in run order (units flattened)."""
        return [op for unit in self.units[device] for op in unit]

    def __repr__(self) -> str:
        return (
            f"Program({self.name!r}, stages={self.stages}, micro_batches={self.micro_batches},"
            f" chunks={self.chunks}, splits={self.splits}, ops={self.num_ops})"
        )

    def describe(self, device: int | None = None) -> str:
        """A compact text rendering of the op order, one line per device."""
        devices = range(self.stages) if device is None else [device]
        lines = []
        for d in devices:
            parts = ["+".join(str(op) for op in unit) for unit in self.units[d]]
            lines.append(f"device {d}: " + " ".join(parts))
        return "\n".join(lines)

    # ------------------------------------------------------------ the graph
    @cached_property
    def graph(self) -> ProgramGraph:
        """Validate the program and derive its dependency graph (cached)."""
        return _compile(self)

    def validate(self) -> None:
        """Raise :class:`ScheduleError` (or :class:`DeadlockError`) if the program is invalid."""
        self.graph  # noqa: B018 - compiling validates

    # ----------------------------------------------------- memory from order
    def live_points(self, weight_holds: float = 0.5) -> list[np.ndarray]:
        """Live activation counts at every point where a device's memory can peak.

        For each device, an array of shape ``(points, chunks)``: after the allocations of
        each unit that allocates, how many micro-batches' worth of activation of each of
        the device's virtual stages are alive (a slice counts ``1/splits``; after an ``I``
        the fraction ``weight_holds`` stays until its ``W``). Only Pareto-maximal rows
        are kept. These depend on the order alone, never on durations: the simulator's
        peak equals ``params + constant + max_row(row · activation)``.
        """
        return [_pareto_max(pts) for pts in self._live_trace(weight_holds)]

    def peak_live(self, weight_holds: float = 0.5) -> np.ndarray:
        """Most micro-batch activations alive at once on each device (chunks summed), shape (p,)."""
        return np.array([pts.sum(axis=1).max(initial=0.0) for pts in self._live_trace(weight_holds)])

    def _live_trace(self, weight_holds: float) -> list[np.ndarray]:
        """Per device, live counts per chunk after the allocations of each allocating unit."""
        g = self.graph
        k = self.splits
        kind = g.op_kind
        chunk = np.asarray(self.chunk_of, dtype=np.int64)[g.op_virtual_stage]
        delta = np.zeros(len(kind))
        delta[kind == F_CODE] = 1.0 / k
        delta[kind == B_CODE] = -1.0 / k
        delta[kind == I_CODE] = -(1.0 - weight_holds) / k
        delta[kind == W_CODE] = -weight_holds / k
        alloc = kind == F_CODE
        # ops are numbered unit by unit and units device by device, in run order; within a
        # unit allocations come first, so a stable sort on (2*unit + is_free) is chronological
        order = np.argsort(2 * g.op_unit + (~alloc), kind="stable")
        width = max(len(s) for s in self.device_stages)
        steps = np.zeros((len(order), width))
        steps[np.arange(len(order)), chunk[order]] = delta[order]
        live = np.cumsum(steps, axis=0)
        ev_unit = g.op_unit[order]
        ev_alloc = alloc[order]
        # a candidate peak: the last allocation event of a unit
        nxt_same = np.r_[(ev_unit[1:] == ev_unit[:-1]) & ev_alloc[1:], False]
        cand = ev_alloc & ~nxt_same
        dev = g.unit_device[ev_unit]
        out = []
        for d in range(self.stages):
            sel = dev == d
            rows = live[sel]
            base = live[np.flatnonzero(sel)[0] - 1] if sel.any() and np.flatnonzero(sel)[0] > 0 else 0.0
            rows = (rows - base)[cand[sel]][:, : len(self.device_stages[d])]
            rows[np.abs(rows) < 1e-9] = 0.0
            out.append(rows)
        return out


def _pareto_max(points: np.ndarray) -> np.ndarray:
    """Rows not dominated (<= in every column) by another row; duplicates removed."""
    if len(points) <= 1:
        return points
    pts = np.unique(np.round(points, 9), axis=0)
    keep = []
    for i, row in enumerate(pts):
        dominated = np.all(pts >= row, axis=1) & np.any(pts > row, axis=1)
        if not dominated.any():
            keep.append(i)
    return pts[keep]


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
        tuple(u if isinstance(u, tuple) and not isinstance(u, Op) else (u,) for u in dev)
        for dev in device_units
    )
    program = Program(
        name=name,
        stages=stages,
        micro_batches=micro_batches,
        chunks=chunks,
        splits=splits,
        placement=tuple(int(d) for d in placement),
        units=units,
    )
    program.validate()
    return program


def _compile(program: Program) -> ProgramGraph:
    p, m, k = program.stages, program.micro_batches, program.splits
    nvs = program.num_virtual_stages
    if len(program.units) != p:
        raise ScheduleError(f"{program.name}: {len(program.units)} device op lists for {p} stages")
    placement = np.asarray(program.placement, dtype=np.int64)
    if nvs == 0 or placement.min() < 0 or placement.max() >= p:
        raise ScheduleError(f"{program.name}: placement {program.placement} names a device outside 0..{p - 1}")

    # flatten
    unit_counts = [len(dev) for dev in program.units]
    unit_ptr = np.zeros(p + 1, dtype=np.int64)
    unit_ptr[1:] = np.cumsum(unit_counts)
    n_units = int(unit_ptr[-1])
    flat_units = [u for dev in program.units for u in dev]
    sizes = np.fromiter((len(u) for u in flat_units), dtype=np.int64, count=n_units)
    if n_units and sizes.min() < 1:
        raise ScheduleError(f"{program.name}: an empty unit")
    unit_op_ptr = np.zeros(n_units + 1, dtype=np.int64)
    unit_op_ptr[1:] = np.cumsum(sizes)
    flat_ops = [op for u in flat_units for op in u]
    n_ops = len(flat_ops)
    if n_ops == 0:
        raise ScheduleError(f"{program.name}: no ops")
    try:
        kinds = np.fromiter((_CODE[op[0]] for op in flat_ops), dtype=np.int8, count=n_ops)
    except KeyError as exc:
        raise ScheduleError(f"{program.name}: unknown op kind {exc.args[0]!r}; expected one of {KINDS}") from None
    arr = np.array([op[1:4] for op in flat_ops], dtype=np.int64).reshape(n_ops, 3)
    mb, vs, sl = arr[:, 0], arr[:, 1], arr[:, 2]
    unit_device = np.repeat(np.arange(p, dtype=np.int64), unit_counts)
    op_unit = np.repeat(np.arange(n_units, dtype=np.int64), sizes)
    op_device = unit_device[op_unit]

    def bad(mask: np.ndarray, what: str) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise ScheduleError(f"{program.name}: op {flat_ops[i]} on device {op_device[i]}: {what}")

    bad((mb < 0) | (mb >= m), f"micro-batch outside 0..{m - 1}")
    bad((vs < 0) | (vs >= nvs), f"virtual stage outside 0..{nvs - 1}")
    bad((sl < 0) | (sl >= k), f"slice outside 0..{k - 1}")
    bad(placement[vs] != op_device, "virtual stage placed on another device")

    # dense index of each (kind class, mb, vs, slice)
    key = (mb * nvs + vs) * k + sl
    n_keys = m * nvs * k
    index = {}
    for code in (F_CODE, B_CODE, I_CODE, W_CODE):
        sel = np.flatnonzero(kinds == code)
        counts = np.bincount(key[sel], minlength=n_keys)
        if counts.max(initial=0) > 1:
            i = sel[np.flatnonzero(counts[key[sel]] > 1)[0]]
            raise ScheduleError(f"{program.name}: op {flat_ops[i]} appears more than once")
        table = np.full(n_keys, -1, dtype=np.int64)
        table[key[sel]] = sel
        index[code] = table
    fwd = index[F_CODE]
    both_b = (index[B_CODE] >= 0) & (index[I_CODE] >= 0)
    if both_b.any():
        raise ScheduleError(f"{program.name}: {_key_name(int(np.flatnonzero(both_b)[0]), nvs, k)} has both B and I")
    bwd = np.maximum(index[B_CODE], index[I_CODE])
    for table, what in ((fwd, "F"), (bwd, "B or I")):
        missing = np.flatnonzero(table < 0)
        if len(missing):
            raise ScheduleError(
                f"{program.name}: no {what} op for {_key_name(int(missing[0]), nvs, k)}"
                f" ({len(missing)} missing in all)"
            )
    w_mismatch = (index[I_CODE] >= 0) != (index[W_CODE] >= 0)
    if w_mismatch.any():
        raise ScheduleError(
            f"{program.name}: {_key_name(int(np.flatnonzero(w_mismatch)[0]), nvs, k)}: "
            "an I op needs exactly one W op and a W op needs an I op"
        )

    # op dependencies (derived from kinds)
    deps = np.full((n_ops, 2), -1, dtype=np.int64)
    is_f = kinds == F_CODE
    is_b = (kinds == B_CODE) | (kinds == I_CODE)
    is_w = kinds == W_CODE
    sel = is_f & (vs > 0)
    deps[sel, 0] = fwd[key[sel] - k]
    sel = is_f & (sl > 0)
    deps[sel, 1] = fwd[key[sel] - 1]
    last = is_b & (vs == nvs - 1)
    deps[last, 0] = fwd[key[last]]
    mid = is_b & (vs < nvs - 1)
    deps[mid, 0] = bwd[key[mid] + k]
    sel = is_b & (sl < k - 1)
    deps[sel, 1] = bwd[key[sel] + 1]
    deps[is_w, 0] = index[I_CODE][key[is_w]]

    # unit predecessors: device chain first, then data deps of the unit's ops
    dep_units = np.where(deps >= 0, op_unit[np.maximum(deps, 0)], -1)
    own = dep_units == op_unit[:, None]
    if own.any():
        i = int(np.flatnonzero(own.any(axis=1))[0])
        raise DeadlockError(
            f"{program.name}: op {flat_ops[i]} is overlapped with an op it depends on",
            cycle=(flat_ops[i],),
        )
    device_prev = np.arange(n_units, dtype=np.int64) - 1
    device_prev[unit_ptr[:-1][np.array(unit_counts) > 0]] = -1
    # scatter each op's two deps into its unit's row: column 1 + 2·(position in unit) + c
    pos = np.arange(n_ops, dtype=np.int64) - unit_op_ptr[op_unit]
    width = 1 + 2 * int(sizes.max())
    preds = np.full((n_units, width), n_units, dtype=np.int64)
    preds[:, 0] = np.where(device_prev >= 0, device_prev, n_units)
    for c in range(2):
        has = dep_units[:, c] >= 0
        preds[op_unit[has], 1 + 2 * pos[has] + c] = dep_units[has, c]
    per_unit = [[x for x in row if x != n_units] for row in preds[:, 1:].tolist()]
    pad_device = np.append(unit_device, -1)
    cross = (preds < n_units) & (pad_device[preds] != unit_device[:, None])

    topo, level = _toposort(program, unit_ptr, per_unit, flat_units)
    by_level = np.argsort(level, kind="stable")
    counts = np.bincount(level, minlength=int(level.max(initial=-1)) + 1)
    level_ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    level_ptr[1:] = np.cumsum(counts)

    return ProgramGraph(
        unit_ptr=unit_ptr,
        unit_device=unit_device,
        unit_op_ptr=unit_op_ptr,
        op_kind=kinds,
        op_micro_batch=mb,
        op_virtual_stage=vs,
        op_slice=sl,
        op_unit=op_unit,
        op_deps=deps,
        unit_preds=preds,
        unit_cross=cross,
        topo_order=topo,
        level=level,
        level_ptr=level_ptr,
        level_units=by_level,
    )


def _key_name(key: int, nvs: int, k: int) -> str:
    sl = key % k
    rest = key // k
    return f"micro-batch {rest // nvs}, virtual stage {rest % nvs}" + (f", slice {sl}" if k > 1 else "")


def _toposort(
    program: Program, unit_ptr: np.ndarray, deps: list[list[int]], flat_units: list[Unit]
) -> tuple[np.ndarray, np.ndarray]:
    """Run every device's units in order, each as soon as its data deps are done.

    Returns the execution order and each unit's level (longest unit chain ending at
    it). Linear in the number of units: a blocked device waits on exactly one unit and
    is woken when that unit runs. A device that can never proceed means a cycle.
    """
    n = len(deps)
    p = program.stages
    done = bytearray(n)
    level = [0] * n
    order: list[int] = []
    ptr = unit_ptr[:-1].tolist()
    ends = unit_ptr[1:].tolist()
    waiting: dict[int, list[int]] = {}
    blocked_on: dict[int, int] = {}
    stack = list(range(p - 1, -1, -1))
    while stack:
        d = stack.pop()
        u, e = ptr[d], ends[d]
        prev_level = level[u - 1] if u > unit_ptr[d] else -1
        while u < e:
            lv = prev_level
            blocker = -1
            for x in deps[u]:
                if not done[x]:
                    blocker = x
                    break
                if level[x] > lv:
                    lv = level[x]
            if blocker >= 0:
                waiting.setdefault(blocker, []).append(d)
                blocked_on[d] = blocker
                break
            lv += 1
            level[u] = lv
            prev_level = lv
            done[u] = 1
            order.append(u)
            woken = waiting.pop(u, None)
            if woken:
                for w in woken:
                    blocked_on.pop(w, None)
                stack.extend(woken)
            u += 1
        ptr[d] = u
    if len(order) < n:
        raise _deadlock(program, ptr, unit_ptr, blocked_on, flat_units)
    return np.asarray(order, dtype=np.int64), np.asarray(level, dtype=np.int64)


def _deadlock(
    program: Program,
    ptr: list[int],
    unit_ptr: np.ndarray,
    blocked_on: dict[int, int],
    flat_units: list[Unit],
) -> DeadlockError:
    """Follow 'device d waits for unit u' edges until a device repeats: that is the cycle."""
    device_of = np.searchsorted(unit_ptr, np.arange(unit_ptr[-1]), side="right") - 1
    start = next(d for d in range(program.stages) if d in blocked_on)
    path: list[int] = []
    seen: dict[int, int] = {}
    d = start
    while d not in seen:
        seen[d] = len(path)
        path.append(d)
        d = int(device_of[blocked_on[d]])
    cycle_devices = path[seen[d] :]
    steps = []
    cycle_ops: list[Op] = []
    for dev in cycle_devices:
        head = flat_units[ptr[dev]]
        need = flat_units[blocked_on[dev]]
        cycle_ops.extend(head)
        steps.append(
            f"device {dev} is at {'+'.join(map(str, head))}, which needs "
            f"{'+'.join(map(str, need))} (device {int(device_of[blocked_on[dev]])}, not yet run)"
        )
    return DeadlockError(
        f"{program.name}: the op order deadlocks (p={program.stages}, m={program.micro_batches}, "
        f"v={program.chunks}, k={program.splits}): " + "; ".join(steps),
        cycle=tuple(cycle_ops),
    )

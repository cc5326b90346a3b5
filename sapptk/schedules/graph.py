"""Compile a program's op order into its dependency graph: validation, index, levels, deadlocks.

Dependencies are derived from the op kinds, never written per schedule:

* ``F(m, v, j)`` needs ``F(m, v-1, j)`` and ``F(m, v, j-1)`` (causal slices);
* the backward (``B`` or ``I``) of ``(m, v, j)`` needs the backward of ``(m, v+1, j)``,
  or, on the last virtual stage, ``F(m, v, j)``; and the backward of ``(m, v, j+1)``
  (slices run in reverse);
* ``W(m, v, j)`` needs ``I(m, v, j)``.

A unit (the ops a device runs overlapped) needs its device's previous unit and every op
its ops need. The compile is array work throughout, with one loop over *levels* (a unit's
level is the longest chain of units ending at it): at each level every device whose next
unit has all its data predecessors done runs it. No per-op Python. When no device can
move, the program deadlocks, and the devices' waits name the cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from sapptk.errors import DeadlockError, ScheduleError
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE, KINDS, W_CODE, Op, OpArrays

if TYPE_CHECKING:
    from sapptk.schedules.program import Program

__all__ = ["Grid", "ProgramGraph", "Sweep", "compile_graph", "dag_sweep"]


@dataclass(frozen=True, eq=False)
class Sweep:
    """Units in the order one pass of the longest-path kernel visits them, level by level.

    ``order[i]`` is the unit at position ``i``; the units of one level hold the positions
    ``bounds[l]:bounds[l+1]``. ``preds[r, i]`` (positions, ``len(order)`` for none) are the
    units position ``i`` waits for, all in earlier levels: row ``r`` holds column
    ``columns[r]`` of the graph's table (:attr:`ProgramGraph.unit_preds` forwards,
    :attr:`ProgramGraph.unit_succs` backwards; columns that are empty throughout are left
    out). ``cross[r, i]`` marks the ones on another device.
    """

    order: np.ndarray
    bounds: tuple[int, ...]
    preds: np.ndarray
    cross: np.ndarray
    columns: tuple[int, ...]

    @cached_property
    def blocks(self) -> list[tuple[list[np.ndarray], int, int]]:
        """(per-row pred positions, first, end) of every level, for the kernel's loop."""
        b = self.bounds
        rows = list(self.preds)
        return [([r[b[i] : b[i + 1]] for r in rows], b[i], b[i + 1]) for i in range(len(b) - 1)]


@dataclass(frozen=True, eq=False)
class Grid:
    """The units laid out level by device: cell ``level · p + device`` (a device runs at most
    one unit a level, since its units are chained).

    ``cell[u]`` is unit u's cell. A level's cells are ``l·p : (l+1)·p``; a cell without a unit
    stands for "the device is still busy with (or done after) its previous unit". ``data[r]``
    holds, per cell, the cell of its unit's predecessor in column ``columns[r]`` of
    :attr:`ProgramGraph.unit_preds` (``levels · p`` for none), ``cross[r]`` whether that
    predecessor ran on another device. The device chain (column 0) needs no table: it is the
    same column one level up.
    """

    cell: np.ndarray
    levels: int
    width: int
    data: tuple[np.ndarray, ...]
    cross: tuple[np.ndarray, ...]
    columns: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.levels * self.width

    @cached_property
    def blocks(self) -> list[list[np.ndarray]]:
        """Per level, the data-predecessor cells of each row, for the kernel's loop."""
        p = self.width
        return [[row[lv * p : (lv + 1) * p] for row in self.data] for lv in range(self.levels)]


@dataclass(frozen=True, eq=False)
class ProgramGraph:
    """Flat arrays derived from a :class:`~sapptk.schedules.Program`; built once and cached.

    Units are numbered device by device, in each device's order, so the units of device
    ``d`` are ``unit_ptr[d]:unit_ptr[d+1]``. Ops are numbered unit by unit.
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
    topo_order: np.ndarray  # units in a valid execution order (level by level)
    level: np.ndarray  # longest chain of units ending at each unit (0-based)
    level_ptr: np.ndarray  # units sorted by level: level_units[level_ptr[l]:level_ptr[l+1]]
    level_units: np.ndarray

    @property
    def n_units(self) -> int:
        return len(self.unit_device)

    @property
    def n_ops(self) -> int:
        return len(self.op_kind)

    @cached_property
    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`unit_preds` and :attr:`unit_cross` as (D, n_units) C-contiguous rows (column-wise maxima).

        The compile stores them that way (the (n_units, D) attributes are transposed views),
        so this costs nothing.
        """
        return np.ascontiguousarray(self.unit_preds.T), np.ascontiguousarray(self.unit_cross.T)

    @cached_property
    def grid(self) -> Grid:
        """The units laid out level by device (:class:`Grid`), for the forward kernel."""
        n = self.n_units
        p = len(self.unit_ptr) - 1
        levels = len(self.level_ptr) - 1
        size = levels * p
        cell = self.level * p + self.unit_device
        target = np.append(cell, size)  # a predecessor's cell; "none" (n) -> size
        preds, cross = self.columns
        used = [c for c in range(1, len(preds)) if (preds[c] < n).any()]
        data, flags = [], []
        for c in used:
            row = np.full(size, size, dtype=np.int64)
            row[cell] = target[preds[c]]
            crossing = np.zeros(size, dtype=bool)
            crossing[cell] = cross[c]
            data.append(row)
            flags.append(crossing)
        return Grid(cell=cell, levels=levels, width=p, data=tuple(data), cross=tuple(flags), columns=tuple(used))

    @cached_property
    def unit_succs(self) -> tuple[np.ndarray, np.ndarray]:
        """(successors, cross) of every unit, shape (n_units, S), ``n_units`` for none.

        A unit's successors are the units that name it in :attr:`unit_preds`, ordered by
        successor and then by column (so the first of equals is the lowest-numbered one).
        """
        n = self.n_units
        dst, col = np.nonzero(self.unit_preds < n)
        src = self.unit_preds[dst, col]
        cross = self.unit_cross[dst, col]
        order = np.argsort(src, kind="stable")  # within a source: (successor, column) order
        src, dst, cross = src[order], dst[order], cross[order]
        counts = np.bincount(src, minlength=n)
        first = np.cumsum(counts) - counts
        rank = np.arange(len(src)) - first[src]
        width = int(counts.max(initial=0))
        succs = np.full((n, max(width, 1)), n, dtype=np.int64)
        flags = np.zeros((n, max(width, 1)), dtype=bool)
        succs[src, rank] = dst
        flags[src, rank] = cross
        return succs, flags

    @cached_property
    def forward_sweep(self) -> Sweep:
        """Levels in increasing order, each unit waiting for its predecessors."""
        preds, cross = self.columns
        return self._sweep(self.level_units, self.level_ptr, preds, cross)

    @cached_property
    def backward_sweep(self) -> Sweep:
        """Levels in decreasing order, each unit waiting for its successors."""
        order = np.argsort(-self.level, kind="stable")  # highest level first, units in order within one
        ptr = np.r_[0, np.cumsum(np.diff(self.level_ptr)[::-1])]
        succs, cross = self.unit_succs
        return self._sweep(order, ptr, np.ascontiguousarray(succs.T), np.ascontiguousarray(cross.T))

    def _sweep(self, order: np.ndarray, ptr: np.ndarray, table: np.ndarray, cross: np.ndarray) -> Sweep:
        """``table``/``cross``: (columns, units), one row per column of the unit table."""
        n = self.n_units
        pos = np.empty(n + 1, dtype=np.int64)
        pos[order] = np.arange(n)
        pos[n] = n
        # column 0 always (forwards: the device chain), then the columns that name anyone
        used = [0] + [c for c in range(1, len(table)) if (table[c] < n).any()]
        preds = np.stack([pos[table[c].take(order)] for c in used])
        preds.flags.writeable = False
        flags = np.stack([cross[c].take(order) for c in used])
        return Sweep(order=order, bounds=tuple(ptr.tolist()), preds=preds, cross=flags, columns=tuple(used))


def dag_sweep(table: np.ndarray, cross: np.ndarray, chain_ptr: np.ndarray) -> Sweep:
    """The :class:`Sweep` of an acyclic graph made of chains, for the longest-path kernel.

    Nodes are numbered chain by chain (``chain_ptr``: first node of each chain, as
    :attr:`ProgramGraph.unit_ptr`), each node after its chain predecessor, as a program's units
    are device by device: a program's units with more chains (the copy streams of activation
    offload) fit. ``table`` (nodes, columns): each node's predecessors, ``nodes`` for none;
    ``cross`` of the same shape: the edges that carry the kernel's ``comm`` lag. Levels are the
    compile's (:func:`_levels`: one step a level, each chain's next node runs when its
    predecessors are done); a cycle raises :class:`~sapptk.errors.ScheduleError`.
    """
    n = len(table)
    waves = _levels(None, np.asarray(chain_ptr, dtype=np.int64), np.ascontiguousarray(table.T)) if n else []
    levels = waves or [np.zeros(0, dtype=np.int64)]
    order = np.concatenate(levels)
    bounds = np.r_[0, np.cumsum([len(w) for w in levels])]
    pos = np.empty(n + 1, dtype=np.int64)
    pos[order] = np.arange(n)
    pos[n] = n
    used = [0] + [c for c in range(1, table.shape[1]) if (table[:, c] < n).any()]
    preds = np.stack([pos[table[order, c]] for c in used])
    preds.flags.writeable = False
    flags = np.stack([cross[order, c] for c in used])
    return Sweep(order=order, bounds=tuple(bounds.tolist()), preds=preds, cross=flags, columns=tuple(used))


# ------------------------------------------------------------------ compile
def compile_graph(program: Program) -> ProgramGraph:
    """Validate ``program`` and derive its dependency graph.

    Raises :class:`~sapptk.errors.ScheduleError` naming the first bad op (a field out of
    range, a virtual stage on another device, a duplicate, a missing op, an ``I`` without
    its ``W``) and :class:`~sapptk.errors.DeadlockError` with the ops on the cycle.
    """
    p, m, k = program.stages, program.micro_batches, program.splits
    nvs = program.num_virtual_stages
    ops: OpArrays = program.arrays
    name = program.name
    placement = np.asarray(program.placement, dtype=np.int64)
    if len(ops.unit_ptr) != p + 1:
        raise ScheduleError(f"{name}: {len(ops.unit_ptr) - 1} device op lists for {p} stages")
    if nvs == 0 or placement.min() < 0 or placement.max() >= p:
        raise ScheduleError(f"{name}: placement {program.placement} names a device outside 0..{p - 1}")

    unit_ptr = ops.unit_ptr
    unit_op_ptr = ops.unit_op_ptr
    n_units = ops.n_units
    sizes = np.diff(unit_op_ptr)
    if n_units and sizes.min() < 1:
        raise ScheduleError(f"{name}: an empty unit")
    n_ops = ops.n_ops
    if n_ops == 0:
        raise ScheduleError(f"{name}: no ops")
    kinds, mb, vs, sl = ops.kind, ops.micro_batch, ops.virtual_stage, ops.slice
    if kinds.min() < 0 or kinds.max() >= len(KINDS):
        bad_code = int(kinds[(kinds < 0) | (kinds >= len(KINDS))][0])
        raise ScheduleError(f"{name}: unknown op kind code {bad_code}; expected 0..{len(KINDS) - 1} for {KINDS}")
    unit_counts = np.diff(unit_ptr)
    unit_device = np.repeat(np.arange(p, dtype=np.int64), unit_counts)
    op_unit = np.repeat(np.arange(n_units, dtype=np.int64), sizes)
    op_device = unit_device[op_unit]

    def bad(mask: np.ndarray, what: str) -> None:
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            raise ScheduleError(f"{name}: op {ops.op(i)} on device {op_device[i]}: {what}")

    bad((mb < 0) | (mb >= m), f"micro-batch outside 0..{m - 1}")
    bad((vs < 0) | (vs >= nvs), f"virtual stage outside 0..{nvs - 1}")
    bad((sl < 0) | (sl >= k), f"slice outside 0..{k - 1}")
    bad(placement[vs] != op_device, "virtual stage placed on another device")

    # dense index of each (kind, mb, vs, slice)
    key = (mb * nvs + vs) * k + sl
    n_keys = m * nvs * k
    index = {}
    for code in (F_CODE, B_CODE, I_CODE, W_CODE):
        sel = np.flatnonzero(kinds == code)
        counts = np.bincount(key[sel], minlength=n_keys)
        if counts.max(initial=0) > 1:
            i = sel[np.flatnonzero(counts[key[sel]] > 1)[0]]
            raise ScheduleError(f"{name}: op {ops.op(i)} appears more than once")
        table = np.full(n_keys, -1, dtype=np.int64)
        table[key[sel]] = sel
        index[code] = table
    fwd = index[F_CODE]
    both_b = (index[B_CODE] >= 0) & (index[I_CODE] >= 0)
    if both_b.any():
        raise ScheduleError(f"{name}: {_key_name(int(np.flatnonzero(both_b)[0]), nvs, k)} has both B and I")
    bwd = np.maximum(index[B_CODE], index[I_CODE])
    for table, what in ((fwd, "F"), (bwd, "B or I")):
        missing = np.flatnonzero(table < 0)
        if len(missing):
            raise ScheduleError(
                f"{name}: no {what} op for {_key_name(int(missing[0]), nvs, k)} ({len(missing)} missing in all)"
            )
    w_mismatch = (index[I_CODE] >= 0) != (index[W_CODE] >= 0)
    if w_mismatch.any():
        raise ScheduleError(
            f"{name}: {_key_name(int(np.flatnonzero(w_mismatch)[0]), nvs, k)}: "
            "an I op needs exactly one W op and a W op needs an I op"
        )

    # op dependencies (derived from kinds), one array per dependency column
    none = np.int64(-1)
    is_f = kinds == F_CODE
    is_b = (kinds == B_CODE) | (kinds == I_CODE)
    dep0 = np.full(n_ops, none, dtype=np.int64)
    dep1 = np.full(n_ops, none, dtype=np.int64)
    sel = is_f & (vs > 0)
    dep0[sel] = fwd[key[sel] - k]
    last = is_b & (vs == nvs - 1)
    dep0[last] = fwd[key[last]]
    mid = is_b & (vs < nvs - 1)
    dep0[mid] = bwd[key[mid] + k]
    is_w = kinds == W_CODE
    dep0[is_w] = index[I_CODE][key[is_w]]
    if k > 1:
        sel = is_f & (sl > 0)
        dep1[sel] = fwd[key[sel] - 1]
        sel = is_b & (sl < k - 1)
        dep1[sel] = bwd[key[sel] + 1]
    deps_by_column = np.stack([dep0, dep1])

    # unit predecessors, one row per column: the device chain first, then data deps of the unit's ops
    width = 1 + 2 * int(sizes.max())
    preds = np.full((width, n_units), n_units, dtype=np.int64)
    preds[0] = np.arange(-1, n_units - 1, dtype=np.int64)
    preds[0, unit_ptr[:-1][unit_counts > 0]] = n_units
    if n_units == n_ops:  # one op per unit (most schedules): ops are units
        for c, dep in enumerate(deps_by_column):
            preds[1 + c] = np.where(dep >= 0, dep, n_units)
    else:
        dep_units = np.where(deps_by_column >= 0, op_unit[np.maximum(deps_by_column, 0)], -1)
        own = (dep_units == op_unit).any(axis=0)
        if own.any():
            i = int(np.flatnonzero(own)[0])
            raise DeadlockError(f"{name}: op {ops.op(i)} is overlapped with an op it depends on", cycle=(ops.op(i),))
        # each op's two deps go to its unit's row 1 + 2·(position in unit) + c
        pos = np.arange(n_ops, dtype=np.int64) - unit_op_ptr[op_unit]
        for c in range(2):
            has = dep_units[c] >= 0
            preds[1 + 2 * pos[has] + c, op_unit[has]] = dep_units[c, has]
    pad_device = np.append(unit_device, -1)
    cross = (preds < n_units) & (pad_device[preds] != unit_device)

    waves = _levels(program, unit_ptr, preds[1:])
    level_units = np.concatenate(waves) if waves else np.zeros(0, dtype=np.int64)
    sizes_l = np.fromiter((len(w) for w in waves), dtype=np.int64, count=len(waves))
    level_ptr = np.r_[0, np.cumsum(sizes_l)].astype(np.int64)
    level = np.empty(n_units, dtype=np.int64)
    level[level_units] = np.repeat(np.arange(len(waves), dtype=np.int64), sizes_l)

    return ProgramGraph(
        unit_ptr=unit_ptr,
        unit_device=unit_device,
        unit_op_ptr=unit_op_ptr,
        op_kind=kinds,
        op_micro_batch=mb,
        op_virtual_stage=vs,
        op_slice=sl,
        op_unit=op_unit,
        op_deps=deps_by_column.T,
        unit_preds=preds.T,
        unit_cross=cross.T,
        topo_order=level_units,
        level=level,
        level_ptr=level_ptr,
        level_units=level_units,
    )


def _key_name(key: int, nvs: int, k: int) -> str:
    sl = key % k
    rest = key // k
    return f"micro-batch {rest // nvs}, virtual stage {rest % nvs}" + (f", slice {sl}" if k > 1 else "")


def _levels(program: Program | None, unit_ptr: np.ndarray, data_preds: np.ndarray) -> list[np.ndarray]:
    """The units of each level, level by level (each level's units in device order).

    ``data_preds`` (columns, units): each unit's data predecessors, ``n_units`` for none.

    At level ``t`` every device whose next unit has all its data predecessors done (at
    levels before ``t``) runs it: that unit's level is ``t``, one more than the highest
    level among its predecessors (its device's previous unit included). One iteration per
    level, a handful of numpy calls over the devices. If no device can move before all
    units have run, the remaining heads wait on each other in a cycle: :class:`DeadlockError`.
    """
    n = data_preds.shape[1]
    used = [c for c in range(len(data_preds)) if (data_preds[c] < n).any()]  # rows that name a predecessor
    # per column, entries n ("no predecessor": done) and n + 1 (the head of a finished
    # device: never ready)
    table = np.full((max(len(used), 1), n + 2), n, dtype=np.int64)
    table[: len(used), :n] = data_preds[used]
    table[:, n + 1] = n + 1
    done = np.zeros(n + 2, dtype=bool)
    done[n] = True
    nxt = np.arange(1, n + 3, dtype=np.int64)
    nonempty = unit_ptr[1:] > unit_ptr[:-1]
    nxt[unit_ptr[1:][nonempty] - 1] = n + 1
    nxt[n + 1] = n + 1
    head = np.where(nonempty, unit_ptr[:-1], n + 1).astype(np.int64)
    waves: list[np.ndarray] = []
    ran = 0
    first, *rest = list(table)
    check = done.take
    while ran < n:
        ready = check(first.take(head))
        for col in rest:
            ready &= check(col.take(head))
        run = head[ready]
        if not len(run):
            if program is None:
                raise ScheduleError(f"the graph has a cycle: {n - ran} of {n} nodes never ready")
            raise _deadlock(program, head, table, done)
        done[run] = True
        waves.append(run)
        head[ready] = nxt.take(run)
        ran += len(run)
    return waves


def _deadlock(program: Program, head: np.ndarray, table: np.ndarray, done: np.ndarray) -> DeadlockError:
    """Follow 'device d waits for unit u' edges until a device repeats: that is the cycle."""
    ops: OpArrays = program.arrays
    unit_ptr = ops.unit_ptr
    n = ops.n_units
    blocked_on: dict[int, int] = {}
    for d in range(program.stages):
        u = int(head[d])
        if u < n:
            row = table[:, u]
            blocked_on[d] = int(row[~done[row]][0])  # the first data predecessor not yet run

    def device_of(u: int) -> int:
        return int(np.searchsorted(unit_ptr, u, side="right") - 1)

    start = min(blocked_on)
    path: list[int] = []
    seen: dict[int, int] = {}
    d = start
    while d not in seen:
        seen[d] = len(path)
        path.append(d)
        d = device_of(blocked_on[d])
    steps = []
    cycle_ops: list[Op] = []
    for dev in path[seen[d] :]:
        at = ops.unit(int(head[dev]))
        need = ops.unit(blocked_on[dev])
        cycle_ops.extend(at)
        steps.append(
            f"device {dev} is at {'+'.join(map(str, at))}, which needs "
            f"{'+'.join(map(str, need))} (device {device_of(blocked_on[dev])}, not yet run)"
        )
    return DeadlockError(
        f"{program.name}: the op order deadlocks (p={program.stages}, m={program.micro_batches}, "
        f"v={program.chunks}, k={program.splits}): " + "; ".join(steps),
        cycle=tuple(cycle_ops),
    )

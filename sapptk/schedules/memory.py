"""Memory from the op order: allocation and free events, live activations, peaks.

An ``F`` allocates its micro-batch's activation on its virtual stage (``1/splits`` of it
per slice) when its unit *starts*; a ``B`` frees it when its unit *ends*; an ``I`` frees
``1 - weight_holds`` of it and its ``W`` the remaining ``weight_holds``. Within a unit,
allocations come before frees. A device's events therefore follow its unit order, and the
live activations after each event depend on the order alone, never on durations.

Live counts are kept exact: per chunk, ``full`` counts whole activations (``+1`` for an
``F``, ``-1`` for a ``B`` or an ``I``) and ``held`` counts the parts an ``I`` leaves for its
``W`` (``+1`` for the ``I``, ``-1`` for the ``W``); the live activation is
``(full + weight_holds · held) / splits``. Both are integers, so a device always returns
to exactly zero.

One set of events serves the simulator's memory steps (:func:`memory_steps`), a program's
live points (:meth:`sapptk.schedules.Program.live_points`) and the peak of every device
(:func:`device_peaks`: static memory plus the heaviest live point).

K/V of sequence slices (:func:`kv_events`) is a second, separate term: the K/V an ``F`` of
slice j writes stays alive from that ``F``'s start until the end of the backward of slice 0
of the same micro-batch on the same virtual stage (with causal attention every later slice
reads the K/V of the earlier ones, and the runtime keeps a micro-batch's K/V, and the
gradient buffer it accumulates into, as one tensor freed after the last backward).
:func:`memory_steps_kv` merges it with the activation steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sapptk.schedules.graph import ProgramGraph
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE, W_CODE

__all__ = ["KVEvents", "MemoryEvents", "device_peaks", "kv_events", "memory_events", "memory_steps", "memory_steps_kv"]


@dataclass(frozen=True, eq=False)
class MemoryEvents:
    """The allocation and free events of a program, device by device in run order.

    ``op`` (the op of each event), ``unit``, ``device``, ``alloc`` (True: at the unit's
    start; False: a free at its end), ``chunk`` (the op's chunk on its device), ``full`` and
    ``held`` (int8 steps, see the module docstring), ``ptr`` (device ``d``'s events are
    ``ptr[d]:ptr[d+1]``), ``candidate`` (the last allocation of its unit: where memory can
    peak), ``width`` (most chunks on a device), ``splits``.
    """

    op: np.ndarray
    unit: np.ndarray
    device: np.ndarray
    alloc: np.ndarray
    chunk: np.ndarray
    full: np.ndarray
    held: np.ndarray
    ptr: np.ndarray
    candidate: np.ndarray
    width: int
    splits: int

    @cached_property
    def counts(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Running ``full`` and ``held`` counts per chunk after each event, each (width, events) int64.

        ``held`` is None when no op holds a part (no split backward): it would be all zeros.
        """
        n = len(self.op)
        out: list[np.ndarray | None] = []
        for step in (self.full, self.held):
            if not step.any():
                out.append(None)
                continue
            mat = np.zeros((self.width, n), dtype=np.int64)
            mat[self.chunk, np.arange(n)] = step
            out.append(np.cumsum(mat, axis=1))  # each device ends at zero, so no restart is needed
        full = out[0] if out[0] is not None else np.zeros((self.width, n), dtype=np.int64)
        return full, out[1]

    def live(self, weight_holds: float) -> np.ndarray:
        """Live activations per chunk after each event (micro-batch units), shape (width, events)."""
        full, held = self.counts
        live = full if held is None else full + weight_holds * held
        return live / self.splits

    def live_points(self, weight_holds: float, chunks: Sequence[int]) -> list[np.ndarray]:
        """Per device, the live counts per chunk after the allocations of each allocating unit.

        ``chunks[d]`` is the number of chunks device ``d`` holds (columns of its array).
        """
        cand = np.flatnonzero(self.candidate)
        full, held = self.counts
        rows = full[:, cand] if held is None else full[:, cand] + weight_holds * held[:, cand]
        rows = (rows / self.splits).T
        bounds = np.searchsorted(cand, self.ptr)
        return [rows[bounds[d] : bounds[d + 1], : chunks[d]] for d in range(len(self.ptr) - 1)]

    def by_amount(self, amount: np.ndarray, devices: int) -> tuple[MemoryEvents, np.ndarray]:
        """The events with a column per (chunk, activation amount) of each device instead of a
        column per chunk, and the MB of each column: ``(events, activation[d, column])``.

        ``amount[e]``: MB per micro-batch of event ``e``'s op (micro-batches of one virtual
        stage may keep different amounts, e.g. when they recompute differently). The live
        counts of the new columns are exact integers as before, and ``activation[d] @ live``
        is the memory in use.
        """
        amount = np.asarray(amount, dtype=np.float64)
        n = len(self.op)
        activation = np.zeros((devices, 1))
        if n == 0:
            return self, activation
        order = np.lexsort((amount, self.chunk, self.device))
        dev, chk, amt = self.device[order], self.chunk[order], amount[order]
        new = np.r_[True, (dev[1:] != dev[:-1]) | (chk[1:] != chk[:-1]) | (amt[1:] != amt[:-1])]
        group = np.cumsum(new) - 1  # a group per (device, chunk, amount), device-major
        first_of_device = np.r_[True, dev[1:] != dev[:-1]]
        base = np.maximum.accumulate(np.where(first_of_device, group, 0))
        column = np.empty(n, dtype=np.int64)
        column[order] = group - base
        width = int(column.max()) + 1
        activation = np.zeros((devices, width))
        activation[dev, group - base] = amt
        events = MemoryEvents(op=self.op, unit=self.unit, device=self.device, alloc=self.alloc, chunk=column,
                              full=self.full, held=self.held, ptr=self.ptr, candidate=self.candidate, width=width,
                              splits=self.splits)
        return events, activation

    def peak_live(self, weight_holds: float) -> np.ndarray:
        """Most activations alive at once on each device (chunks summed; 0 for an idle device)."""
        full, held = self.counts
        total = np.add.reduce(full, axis=0).astype(float)
        if held is not None:
            total += weight_holds * np.add.reduce(held, axis=0)
        return _segment_max(total / self.splits, self.ptr)


def memory_events(graph: ProgramGraph, chunk_of: Sequence[int], splits: int) -> MemoryEvents:
    """The events of a compiled program; ``chunk_of[vs]`` is virtual stage vs's chunk on its device."""
    kind = graph.op_kind
    n = len(kind)
    alloc = kind == F_CODE
    if graph.n_units == n:  # one op per unit: op order is already the run order
        order = np.arange(n, dtype=np.int64)
    else:  # within a unit, allocations first (a stable sort of a nearly sorted key)
        order = np.argsort(2 * graph.op_unit + ~alloc, kind="stable")
    steps = np.zeros((4, 2), dtype=np.int8)  # (full, held) per kind code
    steps[F_CODE] = (1, 0)
    steps[B_CODE] = (-1, 0)
    steps[I_CODE] = (-1, 1)
    steps[W_CODE] = (0, -1)
    ev_kind = kind[order]
    unit = graph.op_unit[order]
    device = graph.unit_device[unit]
    ev_alloc = alloc[order]
    chunk = np.asarray(chunk_of, dtype=np.int64)[graph.op_virtual_stage[order]]
    p = len(graph.unit_ptr) - 1
    ptr = np.searchsorted(device, np.arange(p + 1), side="left")
    next_same = np.r_[(unit[1:] == unit[:-1]) & ev_alloc[1:], False]
    return MemoryEvents(
        op=order,
        unit=unit,
        device=device,
        alloc=ev_alloc,
        chunk=chunk,
        full=steps[ev_kind, 0],
        held=steps[ev_kind, 1],
        ptr=ptr,
        candidate=ev_alloc & ~next_same,
        width=int(max(chunk_of, default=0)) + 1,
        splits=splits,
    )


def memory_steps(
    events: MemoryEvents,
    start: np.ndarray,
    end: np.ndarray,
    activation: np.ndarray,
    static: np.ndarray,
    weight_holds: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory in use on every device as steps: ``(device, time, memory)`` arrays.

    ``start``/``end``: unit times; ``activation[d, c]``: MB per micro-batch of device d's
    chunk c; ``static[d]``: MB always held. Each device's rows begin with its static
    memory at time 0, then one row per event (the value from that time on).
    """
    p = len(static)
    live = events.live(weight_holds)  # (width, events)
    time = np.where(events.alloc, start[events.unit], end[events.unit])
    ptr = events.ptr
    rows = len(time) + p
    device = np.repeat(np.arange(p, dtype=np.int64), np.diff(ptr) + 1)
    times = np.empty(rows, dtype=np.float64)
    memory = np.empty(rows, dtype=np.float64)
    for d in range(p):  # device d: its static row, then its events
        a, b = ptr[d], ptr[d + 1]
        first = a + d
        times[first] = 0.0
        memory[first] = static[d]
        times[first + 1 : b + d + 1] = time[a:b]
        np.add(activation[d] @ live[:, a:b], static[d], out=memory[first + 1 : b + d + 1])
    return device, times, memory


@dataclass(frozen=True, eq=False)
class KVEvents:
    """K/V allocation and free events, device by device in run order (allocations first within
    a unit): ``op`` (the ``F`` whose K/V it is), ``unit``, ``device``, ``alloc``, ``ptr``."""

    op: np.ndarray
    unit: np.ndarray
    device: np.ndarray
    alloc: np.ndarray
    ptr: np.ndarray


def kv_events(graph: ProgramGraph) -> KVEvents:
    """The K/V events of a compiled program: each ``F(m, vs, j)`` allocates at its unit's start,
    and frees at the end of the unit of the backward (``B`` or ``I``) of ``(m, vs, 0)``."""
    kind = graph.op_kind
    fwd = np.flatnonzero(kind == F_CODE)
    last = np.flatnonzero(((kind == B_CODE) | (kind == I_CODE)) & (graph.op_slice == 0))
    m = int(graph.op_micro_batch.max(initial=0)) + 1
    vs = graph.op_virtual_stage
    free_unit = np.full((int(vs.max(initial=0)) + 1) * m, -1, dtype=np.int64)
    free_unit[vs[last] * m + graph.op_micro_batch[last]] = graph.op_unit[last]
    unit = np.r_[graph.op_unit[fwd], free_unit[vs[fwd] * m + graph.op_micro_batch[fwd]]]
    alloc = np.r_[np.ones(len(fwd), dtype=bool), np.zeros(len(fwd), dtype=bool)]
    order = np.lexsort((~alloc, unit))  # units are numbered device by device, in run order
    device = graph.unit_device[unit[order]]
    p = len(graph.unit_ptr) - 1
    return KVEvents(op=np.r_[fwd, fwd][order], unit=unit[order], device=device, alloc=alloc[order],
                    ptr=np.searchsorted(device, np.arange(p + 1), side="left"))


def memory_steps_kv(
    events: MemoryEvents,
    kv: KVEvents,
    kv_amount: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    activation: np.ndarray,
    static: np.ndarray,
    weight_holds: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`memory_steps` with the K/V term: ``(device, time, memory, kv)`` arrays, ``kv`` the
    K/V MB in use (included in ``memory``). ``kv_amount[op]``: MB the K/V of ``F`` op ``op`` keeps.

    The two streams are merged in run order (per device by unit, allocations before frees).
    """
    p = len(static)
    act_val = np.empty(len(events.op))
    live = events.live(weight_holds)
    for d in range(p):
        a, b = events.ptr[d], events.ptr[d + 1]
        act_val[a:b] = activation[d] @ live[:, a:b]
    step = np.where(kv.alloc, 1.0, -1.0) * np.asarray(kv_amount, dtype=float)[kv.op]
    kv_val = np.empty(len(step))
    for d in range(p):  # a running sum per device (each device's K/V returns to zero)
        a, b = kv.ptr[d], kv.ptr[d + 1]
        kv_val[a:b] = np.cumsum(step[a:b])
    unit = np.r_[events.unit, kv.unit]
    alloc = np.r_[events.alloc, kv.alloc]
    source = np.r_[np.zeros(len(events.unit), dtype=np.int8), np.ones(len(kv.unit), dtype=np.int8)]
    order = np.lexsort((source, ~alloc, unit))
    n = len(order)
    device_ev = np.r_[events.device, kv.device][order]
    values = np.r_[act_val, kv_val][order]
    filled = []
    for src in (0, 1):  # the value of each stream after each merged event (0 before its first event on the device)
        own = source[order] == src
        last = np.maximum.accumulate(np.where(own, np.arange(n), -1))
        ok = (last >= 0) & (device_ev[np.maximum(last, 0)] == device_ev)
        filled.append(np.where(ok, values[np.maximum(last, 0)], 0.0))
    ev_time = np.where(alloc, start[unit], end[unit])[order]
    ptr = np.searchsorted(device_ev, np.arange(p + 1), side="left")
    rows = n + p
    device = np.repeat(np.arange(p, dtype=np.int64), np.diff(ptr) + 1)
    times, memory, kv_mb = np.zeros(rows), np.empty(rows), np.zeros(rows)
    for d in range(p):  # device d: its static row, then its merged events
        a, b = ptr[d], ptr[d + 1]
        memory[a + d] = static[d]
        times[a + d + 1 : b + d + 1] = ev_time[a:b]
        kv_mb[a + d + 1 : b + d + 1] = filled[1][a:b]
        memory[a + d + 1 : b + d + 1] = static[d] + filled[0][a:b] + filled[1][a:b]
    return device, times, memory, kv_mb


def device_peaks(
    points: Sequence[np.ndarray],
    device_stages: Sequence[Sequence[int]],
    activation: np.ndarray,
    static: np.ndarray,
    *,
    scale: int | float = 1,
) -> np.ndarray:
    """Peak memory of every device: ``scale · static[d] + max(0, max_row(row · activation of d's stages))``.

    ``points[d]``: live points (rows of live counts per chunk, times ``scale``);
    ``activation``: per virtual stage. Integer inputs give exact integers.
    """
    act = np.asarray(activation)
    out = []
    for d, rows in enumerate(points):
        live = (np.asarray(rows) @ act[list(device_stages[d])]).max(initial=0) if len(rows) else 0
        out.append(scale * static[d] + live)
    return np.asarray(out)


def _segment_max(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Max of ``values[ptr[d]:ptr[d+1]]`` for each d, floored at 0 (0 for an empty segment)."""
    out = np.zeros(len(ptr) - 1, dtype=np.result_type(values, np.float64))
    nonempty = np.flatnonzero(ptr[1:] > ptr[:-1])
    if len(nonempty):
        out[nonempty] = np.maximum(np.maximum.reduceat(values, ptr[nonempty]), 0)
    return out

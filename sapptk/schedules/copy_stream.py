"""Activation offload's copy streams: when each transfer runs and what it does to memory.

A virtual stage may send part of each micro-batch's activation to host memory after its
forward and fetch it back before its backward, over one copy stream per device
(``docs/offload.md`` works a case by hand). :func:`sapptk.simulate` runs this model when it
is given ``host_bandwidth``; this module holds its structure and its pass:

* **One copy stream per device**, separate from compute, running its transfers one at a
  time in the order they are issued (FIFO). A transfer of ``x`` MB lasts
  ``x / host_bandwidth`` ms.
* **Offload** of (virtual stage, micro-batch, slice): issued when its ``F``'s unit ends.
* **Fetch**: issued when the unit *before* its backward (``B``, or ``I`` with a split
  backward) on that device starts: :data:`FETCH_POLICY`, one op of look-ahead. The backward's
  unit cannot start before the fetch ends (a late fetch delays it).
* A micro-batch whose backward is the very next unit after its forward is not offloaded
  (its fetch would be issued before its offload): nothing runs in between that could use
  the room. In 1F1B that is every micro-batch of the last stage.
* **Memory**: the ``F`` allocates the whole activation at its start, as without offload;
  the offloaded part is freed when the offload ends, allocated again when the fetch starts;
  the backward frees as without offload. At one instant, a transfer's free comes after the
  device's op events and its allocation before them (stream order kept).

The copy stream's order depends on the op order alone (an offload is placed at its ``F``'s
unit end, a fetch at its look-ahead unit's start), so units and transfers form one acyclic
graph: a transfer waits for what issues it and for the transfer before it on its stream, a
backward for its fetches. Its longest path is run by the one kernel,
:func:`sapptk.schedules.timing.longest_path`, on that graph's sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sapptk.schedules.graph import dag_sweep
from sapptk.schedules.memory import memory_steps
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE
from sapptk.schedules.program import Program
from sapptk.schedules.timing import longest_path, unit_starts

__all__ = ["FETCH_POLICY", "TRANSFER_KINDS", "Pairs", "Stream", "StreamRun", "memory", "pairs", "run", "stream"]

FETCH_POLICY = "one-op look-ahead"
"""When a fetch is issued: when the unit before its backward starts on its device."""

TRANSFER_KINDS: tuple[str, ...] = ("offload", "fetch")


@dataclass(frozen=True, eq=False)
class Pairs:
    """Every activation a program keeps: its ``F`` and the op that needs it back (``B`` or ``I``)."""

    f_op: np.ndarray
    b_op: np.ndarray
    f_unit: np.ndarray
    b_unit: np.ndarray
    device: np.ndarray
    virtual_stage: np.ndarray
    roundtrip: np.ndarray  # something runs between the F's unit and the backward's unit


@lru_cache(maxsize=16)
def pairs(program: Program) -> Pairs:
    """The program's (forward, backward) pairs, sorted by (virtual stage, micro-batch, slice)."""
    g = program.graph
    kind = g.op_kind
    f_ops = np.flatnonzero(kind == F_CODE)
    b_ops = np.flatnonzero((kind == B_CODE) | (kind == I_CODE))
    keys = (g.op_slice, g.op_micro_batch, g.op_virtual_stage)
    f_ops = f_ops[np.lexsort(tuple(k[f_ops] for k in keys))]
    b_ops = b_ops[np.lexsort(tuple(k[b_ops] for k in keys))]
    f_unit = g.op_unit[f_ops]
    b_unit = g.op_unit[b_ops]
    return Pairs(
        f_op=f_ops,
        b_op=b_ops,
        f_unit=f_unit,
        b_unit=b_unit,
        device=g.unit_device[f_unit],
        virtual_stage=g.op_virtual_stage[f_ops],
        roundtrip=b_unit - 1 > f_unit,
    )


@dataclass(frozen=True, eq=False)
class Stream:
    """The transfers of one run, in stream order (device by device, FIFO within a device)."""

    pair: np.ndarray  # index into Pairs
    fetch: np.ndarray  # bool: a fetch (else an offload)
    issue_unit: np.ndarray  # the unit whose end (offload) or start (fetch) issues it
    device: np.ndarray
    duration: np.ndarray


def stream(p: Pairs, size: np.ndarray, bandwidth: float, splits: int) -> Stream:
    """The copy streams for ``size[vs]`` MB per micro-batch offloaded from each virtual stage."""
    chosen = np.flatnonzero(p.roundtrip & (size[p.virtual_stage] > 0))
    k = len(chosen)
    pair = np.concatenate([chosen, chosen])
    fetch = np.r_[np.zeros(k, dtype=bool), np.ones(k, dtype=bool)]
    issue_unit = np.concatenate([p.f_unit[chosen], p.b_unit[chosen] - 1])
    key = 2 * issue_unit + ~fetch  # an offload at its unit's end, a fetch at its unit's start
    op = np.concatenate([p.f_op[chosen], p.b_op[chosen]])
    order = np.lexsort((op, key))  # units are numbered device by device: devices stay apart
    pair, fetch, issue_unit = pair[order], fetch[order], issue_unit[order]
    duration = size[p.virtual_stage[pair]] / splits / bandwidth
    return Stream(pair, fetch, issue_unit, p.device[pair], duration)


@dataclass(frozen=True, eq=False)
class StreamRun:
    """Times of one run: unit ``start``/``end`` and transfer ``c_start``/``c_end`` (ms); ``wait``:
    per transfer, how long its backward waited for it beyond its other inputs (0 for an offload)."""

    start: np.ndarray
    end: np.ndarray
    c_start: np.ndarray
    c_end: np.ndarray
    wait: np.ndarray


def _table(program: Program, p: Pairs, s: Stream) -> tuple[np.ndarray, np.ndarray, int]:
    """Predecessor table and cross flags of units (rows 0..n-1) and transfers (n..n+k-1), and
    where the fetch columns of a unit's row begin."""
    g = program.graph
    n, k = g.n_units, len(s.pair)
    none = n + k
    units_preds = np.where(g.unit_preds < n, g.unit_preds, none)
    d = units_preds.shape[1]
    fetches = np.flatnonzero(s.fetch)
    waiter = p.b_unit[s.pair[fetches]]  # the unit each fetch holds back
    by_unit = np.lexsort((fetches, waiter))
    fetches, waiter = fetches[by_unit], waiter[by_unit]
    first = np.r_[True, waiter[1:] != waiter[:-1]] if len(waiter) else np.zeros(0, dtype=bool)
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(waiter)), 0)) if len(waiter) else waiter
    rank = np.arange(len(waiter)) - group_start
    width_f = int(rank.max(initial=-1)) + 1
    width = d + width_f + 1
    table = np.full((n + k, width), none, dtype=np.int64)
    cross = np.zeros((n + k, width), dtype=bool)
    table[:n, :d] = units_preds
    cross[:n, :d] = g.unit_cross
    table[waiter, d + rank] = n + fetches
    idx = np.arange(k)
    same = np.r_[False, s.device[1:] == s.device[:-1]] if k else np.zeros(0, dtype=bool)
    table[n + idx[same], width - 1] = n + idx[same] - 1  # the transfer before it on its stream
    offl = np.flatnonzero(~s.fetch)
    table[n + offl, 0] = s.issue_unit[offl]  # an offload starts after its F's unit ends
    fet = np.flatnonzero(s.fetch)
    a = s.issue_unit[fet]  # a fetch starts when its look-ahead unit does: that unit's inputs
    table[n + fet, : width - 1] = table[a, : width - 1]
    cross[n + fet, : width - 1] = cross[a, : width - 1]
    return table, cross, d


def _starts(table: np.ndarray, cross: np.ndarray, end: np.ndarray, comm: float) -> np.ndarray:
    """The latest predecessor end of every node (+ ``comm`` on a crossing edge); 0 without any."""
    padded = np.r_[end, 0.0]
    x = padded[table]
    if comm:
        x = x + np.where(cross, comm, 0.0)
    return x.max(axis=1)


def run(program: Program, p: Pairs, s: Stream, dur: np.ndarray, comm: float) -> StreamRun:
    """Unit and transfer times: the longest path through units and transfers together."""
    n, k = program.graph.n_units, len(s.pair)
    if k == 0:
        end, _ = longest_path(program.graph, dur, comm)
        return StreamRun(unit_starts(program.graph, end, comm), end, np.zeros(0), np.zeros(0), np.zeros(0))
    table, cross, d = _table(program, p, s)
    g = program.graph
    chains = np.r_[g.unit_ptr, n + np.searchsorted(s.device, np.arange(1, program.stages + 1))]
    end, _ = longest_path(dag_sweep(table, cross, chains), np.r_[np.asarray(dur, dtype=float), s.duration], comm)
    start = _starts(table, cross, end, comm)
    # a fetch's wait: how far it pushed its backward past the backward's other inputs, fetches in stream order
    base = _starts(table[:n, :d], cross[:n, :d], end, comm)
    wait = np.zeros(k)
    for col in range(d, table.shape[1] - 1):
        holds = np.flatnonzero(table[:n, col] < n + k)
        i = table[holds, col] - n
        late = np.maximum(end[n + i] - base[holds], 0.0)
        wait[i] = late
        base[holds] += late
    return StreamRun(start[:n], end[:n], start[n:], end[n:], wait)


def memory(
    program: Program,
    p: Pairs,
    s: Stream,
    r: StreamRun,
    act_by_chunk: np.ndarray,
    off_by_chunk: np.ndarray,
    static: np.ndarray,
    weight_holds: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory steps ``(device, time, memory)``: the program's events, with the transfers merged in."""
    dev, times, mem = memory_steps(program.memory_events, r.start, r.end, act_by_chunk, static, weight_holds)
    k = len(s.pair)
    if k == 0:
        return dev, times, mem
    # transfer events: an offload's end sends one activation out (+1), a fetch's start brings it back (-1)
    t_time = np.where(s.fetch, r.c_start, r.c_end)
    t_dev = s.device
    t_step = np.where(s.fetch, -1, 1)
    chunk = np.asarray(program.chunk_of, dtype=np.int64)[p.virtual_stage[s.pair]]
    # at one instant a free (+1) comes after the device's ops, an allocation before them, stream order kept
    t_class = np.where(s.fetch, 0, 2)
    same = np.r_[False, (t_dev[1:] == t_dev[:-1]) & (t_time[1:] == t_time[:-1])]
    for i in np.flatnonzero(same):  # a run of equal instants keeps the stream order
        t_class[i] = max(t_class[i], t_class[i - 1])
    m = len(dev)
    first = np.r_[True, dev[1:] != dev[:-1]]  # each device's static row
    o_class = np.where(first, -1, 1)
    all_dev = np.concatenate([dev, t_dev])
    all_time = np.concatenate([times, t_time])
    all_class = np.concatenate([o_class, t_class])
    seq = np.concatenate([np.arange(m), np.arange(k)])
    order = np.lexsort((seq, all_class, all_time, all_dev))
    is_op = order < m
    # the op memory in force at each row: the latest op row at or before it
    op_idx = np.where(is_op, order, -1)
    op_idx = np.maximum.accumulate(op_idx)
    base = mem[op_idx]
    width = act_by_chunk.shape[1]
    steps = np.zeros((width, len(order)), dtype=np.int64)
    t_rows = np.flatnonzero(~is_op)
    tr = order[t_rows] - m
    steps[chunk[tr], t_rows] = t_step[tr]
    out = np.cumsum(steps, axis=1)  # every device ends with nothing out, so no restart is needed
    rows_dev = all_dev[order]
    shift = np.einsum("cr,rc->r", out, off_by_chunk[rows_dev]) if width else 0.0
    return rows_dev, all_time[order], base - shift

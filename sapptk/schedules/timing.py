"""The longest path through a program's unit graph: the one kernel behind every step time.

A unit ends at ``duration[u] + max(0, max over its predecessors q of end[q] + lag(q, u))``
where ``lag`` is ``comm`` when ``q`` ran on another device and 0 otherwise. The simulator
(:func:`sapptk.simulation.unit_times`), the solver's time model
(:class:`sapptk.solver.paths.PathModel`), the sensitivity analysis and activation offload's
copy streams (:mod:`sapptk.schedules.copy_stream`, on the larger graph of units and
transfers through :func:`~sapptk.schedules.graph.dag_sweep`) all call :func:`longest_path`;
they differ only in the numbers they feed it:

* float (ms) or integer (ticks) durations; the result has the durations' type;
* one cost vector (``duration`` of shape ``(units,)``) or a batch (``(units, batch)``);
* ``argmax=True`` also returns, for each unit, the column of the predecessor that set its
  start (the first of equals), from which :func:`critical_path` walks a longest path back;
* ``reverse=True`` runs over successors instead: ``end[u]`` is then the longest path that
  *starts* with ``u`` (its duration included), and the columns index
  :attr:`~sapptk.schedules.graph.ProgramGraph.unit_succs`.

The loop runs once per level (units of a level depend only on earlier levels), each level a
few numpy calls over its units; everything else is whole-array work.
"""

from __future__ import annotations

import numpy as np

from sapptk.schedules.graph import Grid, ProgramGraph, Sweep

__all__ = ["critical_path", "longest_path", "path_sums", "unit_starts"]


def _sweep(graph: ProgramGraph, reverse: bool) -> Sweep:
    return graph.backward_sweep if reverse else graph.forward_sweep


def longest_path(
    graph: ProgramGraph | Sweep,
    duration: np.ndarray,
    comm: float = 0,
    *,
    argmax: bool = False,
    reverse: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """End of every unit on the longest path to it (from it, with ``reverse``), and the arg-max columns.

    Parameters
    ----------
    graph: the compiled program; or the :class:`~sapptk.schedules.graph.Sweep` of another acyclic
        graph (:func:`~sapptk.schedules.graph.dag_sweep`: a program's units with more nodes, as
        the copy streams of activation offload), ``duration`` then in its node order (forward only).
    duration: unit durations, shape ``(units,)`` or ``(units, batch)``; integer or float.
    comm: the lag of an edge between devices (same unit as ``duration``).
    argmax: also return the column (into ``unit_preds``, or ``unit_succs`` with
        ``reverse``) of the neighbour that set each unit's start, the first of equals; a
        column holding the "none" entry means the unit starts at 0. Shape like ``duration``.
    reverse: follow successors: the longest path starting with each unit.

    Returns
    -------
    ``(end, columns)``: ``end`` has ``duration``'s shape; ``columns`` is None unless asked.
    """
    dur = np.asarray(duration)
    if isinstance(graph, Sweep):
        n = len(graph.order)
        if dur.shape[:1] != (n,) or reverse:
            raise ValueError(f"longest_path: a sweep runs forward over {n} nodes, got shape {dur.shape}")
        integral = dur.dtype.kind in "iub" and float(comm).is_integer()
        dtype = np.int64 if integral else np.float64
        return _on_sweep(graph, n, dur.astype(dtype, copy=False), int(comm) if integral else float(comm), argmax)
    if dur.shape[:1] != (graph.n_units,):
        raise ValueError(f"longest_path: duration must have {graph.n_units} rows, got shape {dur.shape}")
    integral = dur.dtype.kind in "iub" and float(comm).is_integer()
    dtype = np.int64 if integral else np.float64
    n = graph.n_units
    lag = int(comm) if integral else float(comm)
    if not reverse and graph.grid.size <= _GRID_SLACK * n:
        return _forward_on_grid(graph.grid, dur.astype(dtype, copy=False), lag, argmax)
    return _on_sweep(_sweep(graph, reverse), n, dur.astype(dtype, copy=False), lag, argmax)


_GRID_SLACK = 4  # the grid has a cell per (level, device); past 4 cells a unit, walk the levels instead


def _lags(flags: np.ndarray, comm: float, dtype: np.dtype, batch: tuple[int, ...]) -> np.ndarray | None:
    """``comm`` on the edges that cross devices, shaped to broadcast over a batch; None if none do."""
    if not comm or not flags.any():
        return None
    lag = (flags * comm).astype(dtype)
    return lag.reshape(lag.shape + (1,) * len(batch))


def _forward_on_grid(grid: Grid, dur: np.ndarray, comm: float, argmax: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The forward pass on the level × device grid: a device's previous unit is its cell one
    level up (``cur``), so only the data predecessors are gathered."""
    p, size, batch = grid.width, grid.size, dur.shape[1:]
    cells = np.zeros((size, *batch), dtype=dur.dtype)
    cells[grid.cell] = dur
    end = np.zeros((size + 1, *batch), dtype=dur.dtype)  # cell `size`: "no predecessor", ends at 0
    cur = np.zeros((p, *batch), dtype=dur.dtype)  # each device's latest end
    lags = [_lags(flags, comm, dur.dtype, batch) for flags in grid.cross]
    take = end.take
    top, add, greater = np.maximum, np.add, np.greater
    if not argmax and len(lags) == 1:  # the common shape: one data column
        (lag,) = lags
        for lv, (data,) in enumerate(grid.blocks):
            a = lv * p
            x = take(data, axis=0)
            if lag is not None:
                x += lag[a : a + p]
            top(x, cur, out=x)
            cur = end[a : a + p]
            add(x, cells[a : a + p], out=cur)
        return end[grid.cell], None
    best_cells = np.zeros((size, *batch), dtype=np.int64) if argmax else None
    for lv, rows in enumerate(grid.blocks):
        a = lv * p
        acc = cur.copy()  # column 0, the device chain, comes first
        best = best_cells[a : a + p] if best_cells is not None else None
        for column, data, lag in zip(grid.columns, rows, lags, strict=True):
            x = take(data, axis=0)
            if lag is not None:
                x += lag[a : a + p]
            if best is not None:
                np.copyto(best, column, where=greater(x, acc))  # strictly greater: the first of equals stays
            top(acc, x, out=acc)
        cur = end[a : a + p]
        add(acc, cells[a : a + p], out=cur)
    return end[grid.cell], (best_cells[grid.cell] if best_cells is not None else None)


def _on_sweep(sweep: Sweep, n: int, dur: np.ndarray, comm: float, argmax: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The pass level by level over a :class:`Sweep` (backwards over successors, or a grid too sparse)."""
    batch = dur.shape[1:]
    dur_o = dur[sweep.order]
    end = np.zeros((n + 1, *batch), dtype=dur.dtype)  # position n: "no predecessor", ends at 0
    lags = [_lags(flags, comm, dur.dtype, batch) for flags in sweep.cross]
    arg = np.zeros((n, *batch), dtype=np.int64) if argmax else None  # row of the sweep that set the start
    take = end.take
    top, add, greater = np.maximum, np.add, np.greater
    for rows, a, b in sweep.blocks:
        acc = None
        best = arg[a:b] if arg is not None else None
        for r, (preds, lag) in enumerate(zip(rows, lags, strict=True)):
            x = take(preds, axis=0)
            if lag is not None:
                x += lag[a:b]
            if acc is None:
                acc = x
                continue
            if best is not None:
                np.copyto(best, r, where=greater(x, acc))  # strictly greater: the first of equals stays
            top(acc, x, out=acc)
        add(acc, dur_o[a:b], out=end[a:b])
    ends = _unit_order(end[:n], sweep.order)
    if arg is None:
        return ends, None
    columns = np.asarray(sweep.columns, dtype=np.int64)[arg]  # sweep rows -> the table's columns
    return ends, _unit_order(columns, sweep.order)


def _unit_order(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rows in sweep order back to unit order."""
    out = np.empty_like(values)
    out[order] = values
    return out


def unit_starts(graph: ProgramGraph, end: np.ndarray, comm: float = 0) -> np.ndarray:
    """Start of every unit given every unit's end: the latest predecessor end, plus ``comm`` across devices.

    The same sums the kernel forms, so ``start + duration == end`` exactly.
    """
    padded = np.concatenate([end, np.zeros((1, *end.shape[1:]), dtype=end.dtype)])
    n = graph.n_units
    start = None
    for preds, flags in zip(*graph.columns, strict=True):
        if start is not None and not (preds < n).any():
            continue
        x = padded.take(preds, axis=0)
        if comm and flags.any():
            lag = flags * comm
            x += lag.reshape(lag.shape + (1,) * (end.ndim - 1)).astype(x.dtype)
        start = x if start is None else np.maximum(start, x, out=start)
    return start


def critical_path(graph: ProgramGraph, columns: np.ndarray, last: int) -> tuple[np.ndarray, int]:
    """The units of the longest path ending at unit ``last`` (first to last) and its device crossings.

    ``columns`` are the arg-max columns of :func:`longest_path` (one cost vector).
    """
    n = graph.n_units
    preds, cross = graph.unit_preds, graph.unit_cross
    units = []
    crossings = 0
    u = int(last)
    while True:
        units.append(u)
        col = int(columns[u])
        if preds[u, col] >= n:
            break
        crossings += int(cross[u, col])
        u = int(preds[u, col])
    return np.asarray(units[::-1], dtype=np.int64), crossings


def path_sums(graph: ProgramGraph, columns: np.ndarray, values: np.ndarray, *, reverse: bool = False) -> np.ndarray:
    """Sum ``values`` (one row per unit) along the arg-max paths of :func:`longest_path`.

    Row ``u`` of the result is ``values[u]`` plus the row of the neighbour that set ``u``'s
    start (its successor with ``reverse``): the sum over the whole longest path ending
    (starting) at ``u``. ``columns`` come from one cost vector.
    """
    sweep = _sweep(graph, reverse)
    n = graph.n_units
    vals = np.asarray(values)
    acc = np.zeros((n + 1, *vals.shape[1:]), dtype=vals.dtype)
    acc[:n] = vals[sweep.order]
    table = graph.unit_succs[0] if reverse else graph.unit_preds
    chosen = table[sweep.order, columns[sweep.order]]  # the neighbour, a unit (n: none)
    pos = np.empty(n + 1, dtype=np.int64)
    pos[sweep.order] = np.arange(n)
    pos[n] = n
    parent = pos[chosen]
    for a, b in zip(sweep.bounds[:-1], sweep.bounds[1:], strict=True):
        acc[a:b] += acc[parent[a:b]]
    return _unit_order(acc[:n], sweep.order)

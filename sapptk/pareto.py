"""The Pareto filter: rows that no other row beats in every column ("smaller is better").

One function serves every place that keeps only the non-dominated points: a program's
live points (:meth:`sapptk.schedules.Program.live_points`, on negated counts, since there
*more* is the worse), the solver's Pareto mixes of layers, and the sweep figures' front.

Row ``j`` *dominates* row ``i`` when ``values[j] <= values[i]`` in every column and
``<`` in at least one. Of two identical rows the first (in input order) stays.
"""

from __future__ import annotations

import numpy as np

from sapptk.errors import SapptkError

__all__ = ["pareto_front"]

_BLOCK = 256  # rows compared at once in the general (three or more columns) case


def pareto_front(values: np.ndarray, *, groups: np.ndarray | None = None) -> np.ndarray:
    """Indices, in input order, of the rows of ``values`` not dominated within their group.

    Parameters
    ----------
    values: shape ``(n, d)`` (a 1-D array is one column); smaller is better in every
        column; no NaN.
    groups: optional labels of shape ``(n,)``; rows are compared only with rows of the
        same label.

    Returns
    -------
    An ascending int64 array of row indices. Exact duplicates keep their first row. Values of
    another shape, NaN, or groups of another length raise a :class:`~sapptk.errors.SapptkError`.
    Sorting costs ``O(n log n)``; one and two columns then take one pass, more columns
    compare each row with the front found so far.
    """
    vals = np.asarray(values)
    if vals.ndim == 1:
        vals = vals[:, None]
    if vals.ndim != 2:
        raise SapptkError(f"pareto_front: values of shape {vals.shape}: expected shape (n, d) or (n,)")
    n, d = vals.shape
    if vals.dtype.kind not in "biuf":
        raise SapptkError(f"pareto_front: values of dtype {vals.dtype}: expected numbers")
    if vals.dtype.kind == "f" and np.isnan(vals).any():
        raise SapptkError("pareto_front: values contain NaN: expected numbers (smaller is better)")
    if groups is None:
        gid = np.zeros(n, dtype=np.int64)
    else:
        labels = np.asarray(groups)
        if labels.shape != (n,):
            raise SapptkError(f"pareto_front: groups of shape {labels.shape}: expected shape ({n},), one label per row")
        gid = np.unique(labels, return_inverse=True)[1].reshape(n)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if d == 0:  # no columns: every row equals every other
        vals, d = np.zeros((n, 1)), 1
    # lexicographic: group, then columns, then input order. Every dominator of a row (and
    # every earlier duplicate) comes before it in this order, in the same group.
    order = np.lexsort((np.arange(n), *(vals[:, c] for c in reversed(range(d))), gid))
    g_sorted = gid[order]
    starts = np.r_[True, g_sorted[1:] != g_sorted[:-1]]
    if d == 1:
        keep = starts
    elif d == 2:
        # kept iff its second column is below every earlier one of its group: a running
        # minimum that restarts at each group (dense ranks, shifted down group by group)
        rank = np.unique(vals[order, 1], return_inverse=True)[1].reshape(n).astype(np.int64)
        shifted = rank - np.cumsum(starts) * (int(rank.max(initial=0)) + 1)
        before = np.minimum.accumulate(shifted)
        keep = starts.copy()
        keep[1:] |= shifted[1:] < before[:-1]
    else:
        keep = _general(vals[order], g_sorted)
    return np.sort(order[keep])


def _general(rows: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Keep-mask of lexicographically sorted rows: a row goes if an earlier row of its group is <= it everywhere.

    The rows of a group are contiguous (sorted by group first), so each group is filtered on
    its own: no row is ever compared with another group's front (with many small groups that
    comparison was almost all of the work).
    """
    keep = np.zeros(len(rows), dtype=bool)
    bounds = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        keep[a:b] = _one_group(rows[a:b])
    return keep


def _one_group(rows: np.ndarray) -> np.ndarray:
    """Keep-mask of one group's sorted rows, in blocks compared with the front kept so far.

    Comparing with the front suffices: whatever dominates a dropped row also reaches every
    row that row reaches.
    """
    n = len(rows)
    keep = np.zeros(n, dtype=bool)
    front = np.zeros((0, rows.shape[1]), dtype=rows.dtype)
    for a in range(0, n, _BLOCK):
        blk = rows[a : a + _BLOCK]
        beaten = np.zeros(len(blk), dtype=bool)
        if len(front):
            beaten = np.all(front[None, :, :] <= blk[:, None, :], axis=2).any(axis=1)
        # within the block: earlier rows (lower triangle)
        le = np.all(blk[None, :, :] <= blk[:, None, :], axis=2) & np.tri(len(blk), k=-1, dtype=bool)
        beaten |= le.any(axis=1)
        keep[a : a + len(blk)] = ~beaten
        front = np.concatenate([front, blk[~beaten]])
    return keep

"""Branch and bound on the path LP of :mod:`sapptk.choosing.bounds`: whole layers per device.

The path LP lets a device hold 11.4 layers, 8.2 of them in one recompute mode; on setups whose
layouts are too many to enumerate (three or four chunks on eight stages of llama2_70b) that
fractional freedom is what keeps the LP's bound under the best step time. Every plan holds a
whole number of layers on each device, in each mode on each device, and on each virtual stage.
So for any such sum ``a·x`` with a fractional LP value ``v``, every plan has ``a·x ≤ ⌊v⌋`` or
``a·x ≥ ⌈v⌉``: two children, each the same LP with one more range row, row generation
continued from the paths found so far (every path row is valid in every node).

A node's bound is certified like the root's (:meth:`~sapptk.choosing.bounds.RowLP.certify`,
the range rows joining the weak-duality sum with their duals), so a node whose ranges no plan
meets may give any bound without harm: the ranges are kept *elastic* (a slack at a price per
layer above a whole step), so its LP has a solution and its duals make the bound large. The
bound of the tree is the least bound of its open nodes: nodes are taken least bound first,
and the search stops once that reaches ``ub`` (no plan under the incumbent: the setup is
pruned), or at the time limit (the least open bound is still a proven bound).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from ortools.linear_solver import pywraplp

from sapptk.choosing.bounds import ROW_ROUNDS, RowLP, SetupBound, _Relaxation, phase_clock
from sapptk.config import PipelineConfig
from sapptk.costs import TIME_UNIT_MS
from sapptk.profile import Profile
from sapptk.solver.clock import Clock

__all__ = ["BRANCH_TIME", "BRANCH_WITHIN", "branch_bound"]

BRANCH_TIME = 12.0
"""Seconds of branching per setup in :func:`sapptk.choose`, times its ``bound_time``: the
llama2_70b three- and four-chunk setups at eight stages were proven slower than the winner in
0.1-10 s each under a load of about 4 (docs/benchmarks.md)."""

BRANCH_WITHIN = 0.025
"""Branching starts only when the converged path LP is within this share of the incumbent: on
llama2_70b the three- and four-chunk setups at eight stages sat 0.4-1.7 % under the winner and
were proven; one 6 % under a first, poor incumbent spent its whole time without reaching it."""

_NODE_ROUNDS = 60
"""Row generation rounds per node (a child starts from every path of the tree so far)."""

_INTEGRAL = 1e-6
"""A sum within this of a whole number counts as whole (no branch on it)."""


def _sums(lp: _Relaxation, config: PipelineConfig) -> list[np.ndarray]:
    """The sums of ``x`` that are whole in every plan, coarse first: layers per device, per
    (device, mode), per virtual stage, per (virtual stage, mode) cell."""
    program = config.program()
    n = lp.n_vars
    cell_of: dict[tuple[int, int], list[int]] = {}
    vs_of = np.zeros(n, dtype=np.int64)
    # _Relaxation orders x by (group, allowed mode, virtual stage)
    nvs = config.num_virtual_stages
    i = 0
    while i < n:
        g = int(lp.var_group[i])
        for vs in range(nvs):
            vs_of[i + vs] = vs
            cell_of.setdefault((g, i), []).append(i + vs)
        i += nvs
    modes = list(cell_of.values())  # per (group, mode): its nvs variables
    rows: list[np.ndarray] = []
    for stages in program.device_stages:
        on = np.isin(vs_of, list(stages)).astype(float)
        rows.append(on)
    for stages in program.device_stages:
        for idx in modes:
            row = np.zeros(n)
            sel = [k for k in idx if vs_of[k] in set(stages)]
            row[sel] = 1.0
            rows.append(row)
    for vs in range(nvs):
        rows.append((vs_of == vs).astype(float))
    for k in range(n):
        row = np.zeros(n)
        row[k] = 1.0
        rows.append(row)
    return rows


def branch_bound(profile: Profile, config: PipelineConfig, start: SetupBound, ub_ms: float, *,
                 time_limit: float = 5.0, within: float = BRANCH_WITHIN, clock: Clock | None = None) -> SetupBound:
    """``start`` raised by branching on whole layers (module docstring), below ``ub_ms``
    (pipeline ms): the result is at most ``max(start, ub_ms)``. Timed (not deterministic).
    Branching starts only when the path LP's bound is within ``within`` (a share) of ``ub_ms``;
    otherwise the result is that LP's bound. ``clock``: the caller's (its deadline and stop event
    end the branching too)."""
    if start.infeasible or start.bound_ms is None or start.bound_ms >= ub_ms:
        return start
    clk = phase_clock(clock, time_limit)
    deadline = clk.deadline
    scale = 1000.0 * TIME_UNIT_MS / config.splits  # ms per LP unit (ticks / 1000)
    ub = ub_ms / scale
    lp = _Relaxation(profile, config)
    rows = RowLP(lp)
    rows.add_paths(start.paths)
    sums = _sums(lp, config)
    matrix = np.array(sums)
    root, rounds = rows.generate(max_rounds=ROW_ROUNDS, deadline=deadline, enough=ub, stopped=lambda: clk.stopped)
    if root < (1 - within) * ub:  # too far below: a better incumbent may bring it within reach
        return SetupBound(max(root * scale, start.bound_ms), rounds=start.rounds + rounds,
                          seconds=start.seconds + clk.elapsed(), paths=rows.binding(), integer=False)
    price = 2.0 * max(ub, 1.0)  # per layer out of range: above a whole step
    slots: dict[int, tuple[int, pywraplp.Variable, pywraplp.Variable]] = {}  # sum -> (range row, slacks)

    def slot(k: int) -> int:
        if k not in slots:
            j = rows.add_range(sums[k])
            below = rows.solver.NumVar(0.0, rows.solver.infinity(), f"below{k}")
            above = rows.solver.NumVar(0.0, rows.solver.infinity(), f"above{k}")
            ct = rows.range_cts[j]
            ct.SetCoefficient(below, 1.0)
            ct.SetCoefficient(above, -1.0)
            rows.solver.Objective().SetCoefficient(below, price)
            rows.solver.Objective().SetCoefficient(above, price)
            slots[k] = (j, below, above)
        return slots[k][0]

    def solve(box: dict[int, tuple[float, float]]) -> tuple[float, np.ndarray | None]:
        nonlocal rows, rounds
        for k in slots:
            lo, hi = box.get(k, (-math.inf, math.inf))
            rows.set_range(slots[k][0], lo, hi)
        for k in box:
            if k not in slots:
                rows.set_range(slot(k), *box[k])
        bound, n = rows.generate(max_rounds=_NODE_ROUNDS, deadline=deadline, enough=ub, stopped=lambda: clk.stopped)
        if rows.last_values is None and not clk.expired():
            # GLOP gave up from the last basis (ABNORMAL, seen on llama2_70b interleaved-lm p8 v4 and
            # again with the primal simplex): the node once more on a fresh LP with every path so far
            rows = rows.fresh()
            slots.clear()
            for k in box:
                rows.set_range(slot(k), *box[k])
            bound, m = rows.generate(max_rounds=_NODE_ROUNDS, deadline=deadline, enough=ub, stopped=lambda: clk.stopped)
            n += m
        rounds += n
        return bound, rows.last_values

    heap: list[tuple[float, int, dict[int, tuple[float, float]]]] = []
    counter = 0
    bound, values = root, rows.last_values
    node_box: dict[int, tuple[float, float]] = {}
    best_open = root
    while True:
        if bound < ub and values is None:  # the LP failed here: its bound is all this node has
            best_open = min(bound, heap[0][0]) if heap else bound
            break
        if bound < ub:
            sums_at = matrix @ values
            lows = np.array([node_box.get(i, (-math.inf, math.inf))[0] for i in range(len(sums))])
            highs = np.array([node_box.get(i, (-math.inf, math.inf))[1] for i in range(len(sums))])
            split = (np.abs(sums_at - np.rint(sums_at)) > _INTEGRAL) & (sums_at > lows) & (sums_at < highs)
            k = int(np.argmax(split)) if split.any() else None  # the first (coarsest) fractional sum
            if k is not None:
                v = float(sums_at[k])
                lo, hi = node_box.get(k, (-math.inf, math.inf))
                heapq.heappush(heap, (bound, counter, {**node_box, k: (lo, math.floor(v))}))
                heapq.heappush(heap, (bound, counter + 1, {**node_box, k: (math.ceil(v), hi)}))
                counter += 2
            else:  # every sum whole: this node's bound cannot be raised by branching
                best_open = min(bound, heap[0][0]) if heap else bound
                break
        if not heap:
            best_open = ub
            break
        best_open = heap[0][0]
        if best_open >= ub or clk.expired():
            break
        parent, _, node_box = heapq.heappop(heap)
        bound, values = solve(node_box)
        bound = max(bound, parent)
    ms = min(best_open, ub) * scale
    return SetupBound(max(ms, start.bound_ms), rounds=start.rounds + rounds,
                      seconds=start.seconds + clk.elapsed(), paths=start.paths, integer=True)

"""A proven lower bound that does not average device totals: branch and bound on how many
layers each device holds, with node bounds from a bundle of path weights.

The LP relaxation (:mod:`sapptk.solver.relaxation`) gains on two-chunk schedules by mixing
layouts of a device that hold different numbers of layers (a device "holds 6.4 layers"),
so its bound stops several percent under the best plan. Fixing every device's layer total
brings the same relaxation within about 1 % of it. This module searches over the totals:

1. **Any path weights give a bound for every plan.** For weights ``w ≥ 0`` on a set of
   paths (summing to 1), every plan's step time is at least ``Σ_P w_P len_P``, and that sum
   splits over devices: ``f_w(n) = Σ_d min{w·len_d(o) : layout o of device d holds n_d
   layers} + w·comm`` is a lower bound on the step time of every plan whose devices hold
   ``n`` layers (``len_d(o)``: the durations a path adds up on device ``d`` with layout
   ``o``). Over a box of totals ``lo ≤ n ≤ hi`` with the layers of every group adding up,
   its minimum is a small dynamic program over devices (state: layers of each group placed
   so far) — microseconds, not an LP.
2. **A bundle of weights.** A node (a box of totals) is bounded by the best of every weight
   vector found so far. Each vector comes from the duals of the LP relaxation restricted to
   one node's box (row generation over all paths, as in the relaxation), so the bundle
   holds a good vector for every region of totals the search has visited, and the node
   bound is ``max_w min_n f_w(n)`` — never an average of totals across regions.
3. **Best first.** The node with the least bound is taken; its LP gives a new weight
   vector; if that raises its bound it goes back in the queue, else it is split on the
   device whose total the LP mixes most. A node whose LP holds every device's total whole
   cannot be split further (its bound is final). The global bound is the least bound of
   the nodes not yet closed, capped by the incumbent: valid at any moment, so the search
   can stop whenever the clock says so.

Layouts whose own op chain exceeds the incumbent are not enumerated (:mod:`sapptk.solver.layouts`),
and before the search (again whenever the incumbent improves) :meth:`TotalsBound.prune` drops
every layout whose step time, with every other op at its least duration over the other
devices' layouts, already reaches the incumbent (the paths through the device's fill and
drain, not only its own chain; about half the layouts on llama2_70b 16 × 32 × 2, all those
holding more than 7 layers). So the bound holds for every plan faster than the incumbent —
which is what ``min(bound, incumbent)`` needs. Group contiguity is relaxed (still a bound). The dynamic
program sums in floating point: the result steps down by a relative 1e-9 before rounding up
to a tick, as the relaxation's does.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sapptk.solver.layouts import DeviceLayouts, path_lengths
from sapptk.solver.relaxation import LinearRelaxation

__all__ = ["BoundRates", "TotalsBound", "TotalsResult"]


@dataclass
class TotalsResult:
    """What :meth:`TotalsBound.run` reached: ``bound`` (ticks, proven for every plan no
    slower than the incumbent it was given), ``nodes`` (boxes bounded), ``lps`` (restricted
    LP relaxations solved), ``weights`` (vectors in the bundle), ``open`` (nodes left),
    ``failed`` (node LPs the LP solver gave up on with time left; those nodes were split
    without an LP), ``seconds``, and ``history`` ((seconds since the first run, bound) at each improvement)."""

    bound: int = 0
    nodes: int = 0
    lps: int = 0
    weights: int = 0
    open: int = 0
    failed: int = 0
    seconds: float = 0.0
    history: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class BoundRates:
    """How fast each worker of phase 6 has raised the proven bound: ticks gained and seconds
    spent by the master's CP-SAT solves and by the tree, summed since phase 6 began, and
    whether a master solve has ever returned a bound of its own (``master_bounded``).

    :meth:`tree_seconds` sizes the tree's next slice; *whole* is ``share / (1 − share)`` times
    the master solve just made. Before the tree has run, it gets the whole only when the master
    has had a real chance (it returned a bound) and raised nothing; else ``probe`` of it. Once
    measured: the whole while the tree raises the bound at least as fast per second as the
    master, else the whole scaled by the ratio of the two rates, never below ``floor`` of it
    (the tree keeps learning). Why: on deepseek_v3 ZB-V at 16 stages CP-SAT's own bound on the
    master rises in steps once its solves are a few seconds long, and a fixed share took the
    time it needed; on llama2_70b interleaved at 16 stages the master's bound never moves and
    the tree keeps its whole share after its first slice."""

    master_ticks: float = 0.0
    master_seconds: float = 0.0
    master_bounded: bool = False
    tree_ticks: float = 0.0
    tree_seconds_spent: float = 0.0
    floor: float = 0.1
    probe: float = 0.25

    def master(self, gained: float, seconds: float, bounded: bool) -> None:
        """Record one master solve: ``gained`` ticks of proven bound in ``seconds``; ``bounded``:
        CP-SAT returned a bound of its own."""
        self.master_ticks += max(0.0, float(gained))
        self.master_seconds += max(0.0, float(seconds))
        self.master_bounded = self.master_bounded or bool(bounded)

    def tree(self, gained: float, seconds: float) -> None:
        """Record one slice of the tree."""
        self.tree_ticks += max(0.0, float(gained))
        self.tree_seconds_spent += max(0.0, float(seconds))

    def tree_seconds(self, solve_seconds: float, share: float) -> float:
        """Seconds for the tree's next slice after a master solve of ``solve_seconds`` (0 when
        ``share`` is 0; at most ``share / (1 − share)`` times ``solve_seconds``)."""
        if share <= 0.0:
            return 0.0
        whole = max(0.0, float(solve_seconds)) * share / (1.0 - share)
        if self.tree_seconds_spent <= 0.0:
            return whole if (self.master_bounded and self.master_ticks <= 0.0) else whole * self.probe
        tree_rate = self.tree_ticks / self.tree_seconds_spent
        master_rate = self.master_ticks / self.master_seconds if self.master_seconds > 0.0 else 0.0
        if tree_rate >= master_rate:
            return whole
        return whole * max(self.floor, tree_rate / master_rate)


@dataclass(order=True)
class _Node:
    bound: float
    order: int
    lo: np.ndarray = field(compare=False)
    hi: np.ndarray = field(compare=False)
    final: bool = field(default=False, compare=False)  # the LP keeps every total whole: no split helps


class TotalsBound:
    """Branch and bound on per-device layer totals over the layouts of ``lp`` (see the module
    docstring). ``run`` may be called repeatedly; the tree and the bundle are kept between calls."""

    def __init__(self, lp: LinearRelaxation, *, lp_iterations: int = 40, evaluation_bytes: int | None = None) -> None:
        self.lp = lp
        # step times evaluated at once by prune (``evaluation_bytes``: working memory of one batch)
        self.batch = 256 if evaluation_bytes is None else max(1, min(256, lp.paths.batch_size(evaluation_bytes)))
        self.layouts: list[DeviceLayouts] = lp.layouts
        self.counts = np.asarray(lp.coef.counts, dtype=np.int64)
        self.lp_iterations = lp_iterations
        # per device: the distinct per-group totals of its layouts, and each layout's one
        self.keys: list[np.ndarray] = []
        self.key_of: list[np.ndarray] = []
        for lay in self.layouts:
            keys, inverse = np.unique(lay.comp.sum(axis=1), axis=0, return_inverse=True)
            self.keys.append(keys)
            self.key_of.append(inverse.ravel())
        self.key_total = [k.sum(axis=1) for k in self.keys]
        self.alive = [np.ones(len(lay), dtype=bool) for lay in self.layouts]  # layouts not pruned (see prune)
        self.key_alive = [np.ones(len(k), dtype=bool) for k in self.keys]
        self.cutoff: float = math.inf  # the cutoff of the last prune
        self._ub = [np.ones(len(lay), dtype=bool) for lay in self.layouts]  # the node LP's column bounds now
        self.shape = tuple(int(c) + 1 for c in self.counts)
        self.lengths: list[np.ndarray] = [np.zeros((0, len(lay)), dtype=np.float64) for lay in self.layouts]
        self.crossings = np.zeros(0, dtype=np.float64)
        self.weights = np.zeros((0, 0))  # (vectors, paths)
        self.key_costs: list[np.ndarray] = [np.zeros((0, len(k))) for k in self.keys]  # (vectors, keys)
        self.consts = np.zeros(0)
        lo = np.array([int(t.min()) for t in self.key_total], dtype=np.int64)
        hi = np.array([int(t.max()) for t in self.key_total], dtype=np.int64)
        self.heap: list[_Node] = []
        self.counter = 0
        self.out = TotalsResult()
        self.t0: float | None = None
        self._push(lo, hi, 0.0)

    # ------------------------------------------------------------------ pruning
    def prune(self, cutoff: float, until: float = math.inf) -> int:
        """Drop the layouts no plan faster than ``cutoff`` (ticks) can use; returns how many
        are left. Layout ``o`` of device ``d`` goes when the step time with ``o`` on ``d`` and
        every other op at its least duration over the other devices' remaining layouts is at
        least ``cutoff``: the step is monotone in every op's duration, so every plan with ``o``
        on ``d`` is at least that long (the longest paths through ``d``'s fill and drain, not
        only its own chain). Repeated until nothing more goes (the least durations rise as
        layouts go). The node bounds and node LPs then range over the layouts left only. Stops
        at ``until`` (a ``perf_counter`` time) with what it has dropped so far (each drop is
        valid on its own), and is not repeated until the cutoff falls."""
        if cutoff >= self.cutoff:
            return int(sum(int(a.sum()) for a in self.alive))
        self.cutoff = float(cutoff)
        paths, nvs, comm = self.lp.paths, self.lp.paths.nvs, self.lp.coef.comm
        tables = [(np.asarray(lay.stages), (lay.forward, lay.backward, lay.weight)) for lay in self.layouts]
        most = np.zeros(3 * nvs)
        for st, tabs in tables:
            for kind, table in enumerate(tabs):
                most[kind * nvs + st] = table.max(axis=0) if len(table) else 0
        if int(paths.steps(most[None, :], comm)[0]) < cutoff:
            return int(sum(int(a.sum()) for a in self.alive))  # every op at its longest is still faster: nothing goes
        out_of_time = False
        while not out_of_time:
            if not all(a.any() for a in self.alive):
                break  # no plan faster than the cutoff at all: every box is empty
            least = np.zeros(3 * nvs)
            for (st, tabs), alive in zip(tables, self.alive, strict=True):
                for kind, table in enumerate(tabs):
                    least[kind * nvs + st] = table[alive].min(axis=0)
            changed = False
            for (st, tabs), alive in zip(tables, self.alive, strict=True):
                idx = np.flatnonzero(alive)
                costs = np.repeat(least[None, :], len(idx), axis=0)
                for kind, table in enumerate(tabs):
                    costs[:, kind * nvs + st] = table[idx]
                for start in range(0, len(idx), self.batch):  # bounded working memory
                    if time.perf_counter() >= until:
                        out_of_time = True
                        break
                    part = idx[start:start + self.batch]
                    steps = paths.steps(costs[start:start + self.batch], comm)
                    gone = part[steps >= cutoff]
                    if len(gone):
                        alive[gone] = False
                        changed = True
            if not changed:
                break
        for d in range(len(self.layouts)):
            self.key_alive[d] = np.bincount(self.key_of[d][self.alive[d]], minlength=len(self.keys[d])) > 0
        self._refresh_key_costs()
        return int(sum(int(a.sum()) for a in self.alive))

    def _refresh_key_costs(self) -> None:
        """Every vector's per-key costs over the layouts left (after a prune)."""
        self.key_costs = [np.zeros((0, len(k))) for k in self.keys]
        for w in self.weights:
            self._add_key_costs(w)

    # ------------------------------------------------------------------ the bundle
    def _sync_paths(self) -> None:
        """Path lengths of every LP row not seen yet (rows only grow)."""
        n = len(self.crossings)
        if len(self.lp.sigs) == n:
            return
        sigs = np.stack(self.lp.sigs[n:])
        new = path_lengths(self.layouts, sigs)
        self.lengths = [np.vstack([old, add.astype(np.float64)]) for old, add in zip(self.lengths, new, strict=True)]
        self.crossings = np.r_[self.crossings, np.asarray(self.lp.crossings[n:], dtype=np.float64)]
        if len(self.weights):
            self.weights = np.hstack([self.weights, np.zeros((len(self.weights), len(self.crossings) - n))])

    def add_weights(self, duals: np.ndarray) -> bool:
        """Put one weight vector on the LP's rows in the bundle; False if it is all zero."""
        self._sync_paths()
        w = np.zeros(len(self.crossings))
        w[: len(duals)] = np.clip(np.asarray(duals, dtype=np.float64), 0.0, None)
        total = float(w.sum())
        if not math.isfinite(total) or total <= 0.0:
            return False
        w = w / total
        self.weights = np.vstack([self.weights.reshape(-1, len(w)), w[None, :]])
        self.consts = np.r_[self.consts, float(w @ self.crossings) * self.lp.comm_ticks]
        self._add_key_costs(w)
        self.out.weights = len(self.consts)
        return True

    def _add_key_costs(self, w: np.ndarray) -> None:
        for d, length in enumerate(self.lengths):
            cost = w @ length  # per layout
            per_key = np.full(len(self.keys[d]), np.inf)
            np.minimum.at(per_key, self.key_of[d][self.alive[d]], cost[self.alive[d]])
            self.key_costs[d] = np.vstack([self.key_costs[d], per_key[None, :]])

    def box_bounds(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For every weight vector, ``min f_w(n)`` over totals in [lo, hi] with the groups
        adding up (``inf`` when no such totals exist among the layouts)."""
        if len(self.consts) == 0:
            return np.zeros(0)
        return self._box_minimum(lo, hi, self.key_costs, self.consts)

    def box_feasible(self, lo: np.ndarray, hi: np.ndarray) -> bool:
        """Whether some choice of one layout per device has its totals in [lo, hi] and the
        groups adding up (exact, in integers: the same program with every cost zero)."""
        zeros = [np.where(alive, 0.0, np.inf)[None, :] for alive in self.key_alive]
        return bool(np.isfinite(self._box_minimum(lo, hi, zeros, np.zeros(1))[0]))

    def _box_minimum(
        self, lo: np.ndarray, hi: np.ndarray, key_costs: list[np.ndarray], consts: np.ndarray
    ) -> np.ndarray:
        k = len(consts)
        best = np.full((k, *self.shape), np.inf)
        best[(slice(None),) + (0,) * len(self.shape)] = 0.0
        for d in range(len(self.layouts)):
            nxt = np.full_like(best, np.inf)
            ok = ((self.key_total[d] >= lo[d]) & (self.key_total[d] <= hi[d])
                  & (self.keys[d] <= self.counts).all(axis=1) & self.key_alive[d])
            for i in np.flatnonzero(ok):
                key = self.keys[d][i]
                src = (slice(None),) + tuple(slice(0, n - int(c)) for n, c in zip(self.shape, key, strict=True))
                dst = (slice(None),) + tuple(slice(int(c), n) for n, c in zip(self.shape, key, strict=True))
                cost = key_costs[d][:, i].reshape((k,) + (1,) * len(self.shape))
                np.minimum(nxt[dst], best[src] + cost, out=nxt[dst])
            best = nxt
        return best[(slice(None),) + tuple(int(c) for c in self.counts)] + consts

    def _bound_of(self, lo: np.ndarray, hi: np.ndarray) -> float:
        values = self.box_bounds(lo, hi)
        return float(values.max()) if len(values) else 0.0

    def _push(self, lo: np.ndarray, hi: np.ndarray, bound: float, final: bool = False) -> None:
        self.counter += 1
        heapq.heappush(self.heap, _Node(bound, self.counter, lo, hi, final))

    # ------------------------------------------------------------------ the search
    def global_bound(self) -> float:
        """The least bound of the nodes not closed (``inf`` when none is left)."""
        return self.heap[0].bound if self.heap else math.inf

    def run(self, *, cutoff: int, until: float, stopped: Callable[[], bool] | None = None) -> TotalsResult:
        """Best-first search until ``until`` (a ``perf_counter`` time), ``stopped()``, or every
        node is at or above ``cutoff`` (ticks; the incumbent). Returns the result so far;
        ``bound`` is ``min(cutoff, least open bound)`` rounded up to a tick."""
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        out = self.out
        if cutoff < self.cutoff:
            self.prune(cutoff, until)
            self._rebound()
        try:
            while self.heap and time.perf_counter() < until and not (stopped is not None and stopped()):
                node = self.heap[0]
                if node.bound >= cutoff or node.final:
                    break
                heapq.heappop(self.heap)
                y_totals = self._solve_box(node.lo, node.hi, until, stopped)
                if y_totals == "infeasible":
                    if not self.box_feasible(node.lo, node.hi):  # proven in integers: no plan has totals in this box
                        self._record()
                        continue
                    self._push(node.lo, node.hi, node.bound, final=True)  # the LP solver's word alone: kept, not split
                    continue
                if y_totals == "stopped":  # cut short: the node goes back as it was
                    heapq.heappush(self.heap, node)
                    break
                if y_totals == "failed":  # the LP solver gave no answer with time left: split without it
                    self.out.failed += 1
                    self._split_widest(node)
                    self._record()
                    continue
                bound = max(node.bound, self._bound_of(node.lo, node.hi))
                out.nodes += 1
                if bound > node.bound * (1 + 1e-6) + 1.0:
                    self._push(node.lo, node.hi, bound)
                else:
                    self._split(node, bound, y_totals)
                self._record()
        finally:
            self.release()  # the shared LP's columns all open again, whatever happened
        self._record()
        out.open = len(self.heap)
        out.seconds = time.perf_counter() - self.t0
        return self._result(cutoff)

    def _rebound(self) -> None:
        """The open nodes' bounds again, over the layouts left after a prune (never lower)."""
        nodes, self.heap = self.heap, []
        for node in nodes:
            node.bound = max(node.bound, self._bound_of(node.lo, node.hi))
            heapq.heappush(self.heap, node)

    def _result(self, cutoff: int) -> TotalsResult:
        best = min(self.global_bound(), float(cutoff))
        self.out.bound = (
            int(min(cutoff, max(0, math.ceil(best - 1e-9 * abs(best) - 1e-6)))) if math.isfinite(best) else int(cutoff)
        )
        return self.out

    def _record(self) -> None:
        value = self.global_bound()
        if not math.isfinite(value):
            return
        value = max(0, math.ceil(value - 1e-9 * abs(value) - 1e-6))
        if not self.out.history or value > self.out.history[-1][1]:
            assert self.t0 is not None
            self.out.history.append((time.perf_counter() - self.t0, value))

    def _split(self, node: _Node, bound: float, y_totals: list[np.ndarray]) -> None:
        """Split on the device whose total the LP mixes most; final when none is mixed."""
        spread = np.array([float(p @ np.abs(t - float(p @ t))) for p, t in y_totals])
        d = int(np.argmax(spread))
        if spread[d] < 1e-6:
            self._push(node.lo, node.hi, bound, final=True)
            return
        p, t = y_totals[d]
        cut = int(math.floor(float(p @ t) + 1e-9))
        cut = min(max(cut, int(node.lo[d])), int(node.hi[d]) - 1)
        for lo_d, hi_d in ((int(node.lo[d]), cut), (cut + 1, int(node.hi[d]))):
            lo, hi = node.lo.copy(), node.hi.copy()
            lo[d], hi[d] = lo_d, hi_d
            self._push(lo, hi, max(bound, self._bound_of(lo, hi)))

    def _split_widest(self, node: _Node) -> None:
        """Split at the middle of the device whose range of totals is widest (no LP needed);
        final when every range is a single total."""
        width = node.hi - node.lo
        d = int(np.argmax(width))
        if width[d] <= 0:
            self._push(node.lo, node.hi, node.bound, final=True)
            return
        cut = int(node.lo[d] + width[d] // 2)
        for lo_d, hi_d in ((int(node.lo[d]), cut), (cut + 1, int(node.hi[d]))):
            lo, hi = node.lo.copy(), node.hi.copy()
            lo[d], hi[d] = lo_d, hi_d
            self._push(lo, hi, max(node.bound, self._bound_of(lo, hi)))

    def _set_columns(self, d: int, allowed: np.ndarray) -> None:
        """Open the node LP's columns of device ``d`` where ``allowed``, close the others (only
        the bounds that change are set: a bound change costs the LP solver a call each)."""
        for o in np.flatnonzero(allowed != self._ub[d]):
            self.lp.y[d][o].SetUb(1.0 if allowed[o] else 0.0)
        self._ub[d] = allowed.copy()

    def release(self) -> None:
        """Open every column of the shared LP again (the relaxation's own runs need them all)."""
        for d in range(len(self.layouts)):
            self._set_columns(d, np.ones(len(self.layouts[d]), dtype=bool))

    def _solve_box(
        self, lo: np.ndarray, hi: np.ndarray, until: float, stopped: Callable[[], bool] | None
    ) -> list[tuple[np.ndarray, np.ndarray]] | str:
        """The LP relaxation with every device's total in [lo, hi] (row generation); its duals
        join the bundle. Returns per device (LP weights of its layouts, their totals), or
        "infeasible" when the restricted LP has no solution, "stopped" when it was cut short, or
        "failed" when the LP solver gave up with time left (a node whose LP fails so is split
        without it, never retried forever)."""
        lp = self.lp
        for d in range(len(self.layouts)):
            tot = self.key_total[d][self.key_of[d]]
            self._set_columns(d, (tot >= lo[d]) & (tot <= hi[d]) & self.alive[d])
        lp.run(until=until, stopped=stopped, max_iterations=self.lp_iterations, lagrangian=False)
        self.out.lps += 1
        if not lp.last_optimal:
            if lp.last_infeasible:
                return "infeasible"
            cut_short = time.perf_counter() >= until or (stopped is not None and stopped())
            return "stopped" if cut_short else "failed"
        y = [np.array([v.solution_value() for v in lp.y[d]]) for d in range(len(self.layouts))]
        self.add_weights(lp.last_duals)
        return [(y[d], self.key_total[d][self.key_of[d]]) for d in range(len(self.layouts))]

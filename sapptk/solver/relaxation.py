"""A proven lower bound on the step time from the LP relaxation of the layout master.

CP-SAT's own bound on the two-chunk masters moves slowly and by chance (it depends on
which paths it has seen and on its portfolio); this module computes the relaxation's bound
directly, and hands the paths it needed to the master.

1. **Row generation on the LP.** The layout master (:class:`~sapptk.solver.masters.LayoutMaster`)
   with its ``y[d, o]`` relaxed to ``[0, 1]``: exactly one layout per device, the layers of
   every group adding up, ``z ≥ length of path P`` for the paths found so far. GLOP solves
   it; at its solution every virtual stage has a fractional (averaged) duration, and the
   longest path under those durations is the most violated path constraint
   (:meth:`~sapptk.solver.paths.PathModel.longest` with fractional costs). It joins the LP
   until none is violated: the LP then holds the optimum of the relaxation with *all* paths.
   Each op duration of a virtual stage is one LP variable, defined by its device's layouts,
   so a path row names at most ``3 · V`` durations rather than every layout of every device.
2. **A Lagrangian bound, in exact arithmetic over the integers.** Any weights ``λ ≥ 0`` on
   the path constraints give ``z ≥ Σ_P λ_P len_P(y) / Σ_P λ_P`` for every plan, so
   ``min`` of that over integer plans (one layout per device, the layers of every group
   adding up) is a lower bound. With the LP's duals as ``λ`` it is at least the LP bound up
   to rounding, and its minimum is a small dynamic program over devices (state: layers of
   each group placed so far). The LP itself is never trusted for the bound: floating-point
   tolerances only make ``λ`` a little less good, never the bound wrong.

Why it does not close the gap on its own: the step time is a max over paths, convex in the
durations, so the relaxation gains by averaging layouts of a device (see the balance module).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

from sapptk.costs import LayerCoefficients
from sapptk.solver.layouts import DeviceLayouts, path_lengths
from sapptk.solver.paths import PathModel, path_key

__all__ = ["LinearRelaxation", "Relaxation", "lagrangian_bound", "relax"]

@dataclass
class Relaxation:
    """What :func:`relax` found.

    ``bound`` (ticks, a proven lower bound on every plan built from ``layouts``; 0 when the
    LP could not be solved), ``lp`` (ticks, the LP's value, for reporting only), ``converged``
    (no path constraint was violated at the last LP solution), ``cuts`` (the paths added,
    as (signature, crossings)), ``iterations`` (LP solves) and ``seconds``.
    """

    bound: int = 0
    lp: float = 0.0
    converged: bool = False
    cuts: list[tuple[np.ndarray, int]] = field(default_factory=list)
    iterations: int = 0
    seconds: float = 0.0


def _totals(layouts: list[DeviceLayouts]) -> list[np.ndarray]:
    """Per device, the (layouts, groups) layers each layout holds over its chunks."""
    return [lay.comp.sum(axis=1) for lay in layouts]


def lagrangian_bound(
    layouts: list[DeviceLayouts],
    counts: np.ndarray,
    sigs: np.ndarray,
    crossings: np.ndarray,
    comm_ticks: int,
    weights: np.ndarray,
    *,
    max_states: int = 2_000_000,
) -> float:
    """``min over integer plans of Σ_P w_P len_P / Σ_P w_P``: a lower bound on the step time (ticks).

    A plan picks one layout per device with the layers of each group adding up to
    ``counts`` (group contiguity is relaxed). Returns ``inf`` when no such plan exists
    among ``layouts``, and 0 when the weights are all zero. Above ``max_states`` states of
    per-group layer counts, only the total layer count is tracked (still a lower bound).
    """
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    total_w = float(w.sum())
    if total_w <= 0.0:
        return 0.0
    w = w / total_w
    const = float(w @ (crossings.astype(np.float64) * comm_ticks))
    lengths = path_lengths(layouts, sigs)
    totals = _totals(layouts)
    counts = np.asarray(counts, dtype=np.int64)
    if math.prod(int(c) + 1 for c in counts) > max_states:  # only the total layers: still a relaxation
        counts = np.array([int(counts.sum())])
        totals = [t.sum(axis=1, keepdims=True) for t in totals]
    shape = tuple(int(c) + 1 for c in counts)
    best = np.full(shape, np.inf)
    best[(0,) * len(shape)] = 0.0
    for length, tot in zip(lengths, totals, strict=True):
        cost = w @ length.astype(np.float64)
        nxt = np.full(shape, np.inf)
        keys, inverse = np.unique(tot, axis=0, return_inverse=True)
        for i, key in enumerate(keys):
            if (key > counts).any():
                continue
            c = float(cost[inverse.ravel() == i].min())
            src = tuple(slice(0, n - int(k)) for n, k in zip(shape, key, strict=True))
            dst = tuple(slice(int(k), n) for n, k in zip(shape, key, strict=True))
            np.minimum(nxt[dst], best[src] + c, out=nxt[dst])
        best = nxt
    return float(best[tuple(int(c) for c in counts)]) + const


class LinearRelaxation:
    """The LP relaxation of the layout master, solved by row generation in as many calls to
    :meth:`run` as the caller likes (the LP and its rows are kept between them).

    ``add`` puts a path in the LP (device chains, the paths seen so far); ``run`` adds the
    most violated path of each LP solution until none is violated, the time is up, or
    ``max_iterations`` LP solves were made, and returns the :class:`Relaxation` so far. Its
    ``bound`` is the best Lagrangian bound from the duals of the last LP solved in each run
    and of every tenth one before it (so a run cut short by time, or by a failed LP solve,
    still gives a valid bound); ``cuts`` the paths row generation added, over all runs.
    """

    def __init__(
        self,
        coef: LayerCoefficients,
        paths: PathModel,
        layouts: list[DeviceLayouts],
        comm_ticks: int,
        *,
        max_dp_states: int = 2_000_000,
    ) -> None:
        self.coef, self.paths, self.layouts, self.comm_ticks = coef, paths, layouts, comm_ticks
        self.max_dp_states = max_dp_states
        self.out = Relaxation()
        self.best = 0.0  # the best Lagrangian bound so far (ticks, floating point)
        self.sigs: list[np.ndarray] = []
        self.crossings: list[int] = []
        self.rows: list[pywraplp.Constraint] = []
        self.seen: set[bytes] = set()
        self.generated: set[bytes] = set()
        # the last LP solve of :meth:`run`: optimal, proven infeasible; the row duals of the last
        # optimal solve at which a run stopped (any weights >= 0 give a valid bound)
        self.last_optimal = False
        self.last_infeasible = False
        self.last_duals = np.zeros(0)
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        if self.solver is None:  # GLOP ships with OR-Tools; guard anyway
            return
        solver = self.solver
        # each new row cuts the last solution off while its basis stays dual feasible: dual simplex
        # restarts from there (measured about 20 % faster than the default on the benchmarks). Without
        # presolve and scaling GLOP keeps its basis between solves (a new row, changed column bounds):
        # a node LP of the totals tree re-solves in a few ms instead of 30 (the rows are normalised)
        solver.SetSolverSpecificParametersAsString(
            "use_dual_simplex: true, use_preprocessing: false, use_scaling: false")
        self.y = [[solver.NumVar(0.0, 1.0, f"y_{d}_{o}") for o in range(len(lay))] for d, lay in enumerate(layouts)]
        for ys in self.y:
            row = solver.Constraint(1.0, 1.0)
            for var in ys:
                row.SetCoefficient(var, 1.0)
        totals = _totals(layouts)
        for g, n in enumerate(coef.counts.tolist()):
            row = solver.Constraint(float(n), float(n))
            for d in range(len(layouts)):
                for o in np.flatnonzero(totals[d][:, g]):
                    row.SetCoefficient(self.y[d][o], float(totals[d][o, g]))
        # lengths are normalised by the longest device chain so that the LP's numbers are near 1
        self.norm = float(max(int(lay.chain.max()) for lay in layouts) or 1)
        # one variable per op duration of each virtual stage (forward, backward, weight), defined by
        # the layouts of its device: a path row then names at most 3 · V durations instead of every
        # layout of every device (about ten times fewer nonzeros; the same LP in y and z)
        nvs = paths.nvs
        self.dur = [solver.NumVar(-solver.infinity(), solver.infinity(), f"d_{k}") for k in range(3 * nvs)]
        for lay, ys in zip(layouts, self.y, strict=True):
            for kind, table in enumerate((lay.forward, lay.backward, lay.weight)):
                for c, vs in enumerate(lay.stages):
                    row = solver.Constraint(0.0, 0.0)
                    row.SetCoefficient(self.dur[kind * nvs + vs], 1.0)
                    for o in np.flatnonzero(table[:, c]):
                        row.SetCoefficient(ys[o], -float(table[o, c]) / self.norm)
        self.z = solver.NumVar(0.0, solver.infinity(), "z")
        objective = solver.Objective()
        objective.SetCoefficient(self.z, 1.0)
        objective.SetMinimization()

    def add(self, sig: np.ndarray, cross: int) -> bool:
        """Add the row ``z ≥ length of the path (sig, cross)``; False if it is there already."""
        key = path_key(sig, cross)
        if key in self.seen or self.solver is None:
            return False
        self.seen.add(key)
        solver = self.solver
        row = solver.Constraint(cross * self.comm_ticks / self.norm, solver.infinity())
        row.SetCoefficient(self.z, 1.0)
        for k in np.flatnonzero(sig):
            row.SetCoefficient(self.dur[k], -float(sig[k]))
        self.sigs.append(np.asarray(sig, dtype=np.int64))
        self.crossings.append(int(cross))
        self.rows.append(row)
        return True

    def _bound_now(self) -> float:
        duals = np.array([row.dual_value() for row in self.rows])
        return lagrangian_bound(self.layouts, self.coef.counts, np.stack(self.sigs), np.asarray(self.crossings),
                                self.comm_ticks, duals, max_states=self.max_dp_states)

    def run(self, *, until: float, stopped: Callable[[], bool] | None = None, max_iterations: int = 1000,
            lagrangian: bool = True) -> Relaxation:
        """Row generation until converged, ``until`` (a ``perf_counter`` time; each LP solve is
        capped by it, but gets at least 0.1 s), ``stopped()`` or ``max_iterations`` LP solves.
        ``lagrangian=False``: no Lagrangian bound from these duals (a caller that bounds with
        ``last_duals`` itself, as :mod:`sapptk.solver.totals_bound` does; ``bound`` keeps its
        value from earlier runs)."""
        t0 = time.perf_counter()
        out, solver = self.out, self.solver
        if solver is None or not self.rows:
            return out
        for i in range(max_iterations):
            solver.SetTimeLimit(max(100, int(1000 * (until - time.perf_counter()))))
            status = _solve(solver, stopped)
            out.iterations += 1
            self.last_optimal = status == pywraplp.Solver.OPTIMAL
            self.last_infeasible = status == pywraplp.Solver.INFEASIBLE
            if status != pywraplp.Solver.OPTIMAL:
                break
            out.lp = self.z.solution_value() * self.norm
            # the averaged durations are the duration variables' values
            cost = np.array([var.solution_value() for var in self.dur]) * self.norm
            steps, found = self.paths.longest(cost[None, :], self.coef.comm)
            converged = float(steps[0]) <= out.lp * (1 + 1e-9) + 1e-6
            out_of_time = time.perf_counter() >= until or (stopped is not None and stopped())
            if converged or out_of_time or i == max_iterations - 1:
                out.converged = converged
                self.last_duals = np.array([row.dual_value() for row in self.rows])
                if lagrangian:
                    self.best = max(self.best, self._bound_now())  # these duals, before any row changes them
                break
            if lagrangian and out.iterations % 10 == 0:  # kept in case a later LP solve fails
                self.best = max(self.best, self._bound_now())
            sig, cross = found[0]
            if not self.add(sig, cross):  # a path already in the LP: tolerances; stop with what we have
                self.last_duals = np.array([row.dual_value() for row in self.rows])
                if lagrangian:
                    self.best = max(self.best, self._bound_now())
                break
            self.generated.add(path_key(sig, cross))
            out.cuts.append((self.sigs[-1], self.crossings[-1]))
        if math.isfinite(self.best):
            # the DP's sums are floating point: step down by a relative 1e-9 before rounding up to a tick
            out.bound = max(0, math.ceil(self.best - 1e-9 * abs(self.best) - 1e-6))
        else:
            out.bound = 2**62  # no integer plan among these layouts at all
        out.seconds += time.perf_counter() - t0
        return out


def _solve(solver: pywraplp.Solver, stopped: Callable[[], bool] | None) -> int:
    """``solver.Solve()``, interrupted within a few tens of milliseconds once ``stopped()``."""
    if stopped is None:
        return solver.Solve()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            if stopped():
                solver.InterruptSolve()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return solver.Solve()
    finally:
        done.set()
        watcher.join()


def relax(
    coef: LayerCoefficients,
    paths: PathModel,
    layouts: list[DeviceLayouts],
    comm_ticks: int,
    seed_paths: list[tuple[np.ndarray, int]],
    *,
    until: float,
    stopped: Callable[[], bool] | None = None,
    max_iterations: int = 1000,
    max_dp_states: int = 2_000_000,
) -> Relaxation:
    """One :class:`LinearRelaxation` from ``seed_paths`` (device chains and the paths seen so
    far), run once (see :meth:`LinearRelaxation.run`)."""
    lp = LinearRelaxation(coef, paths, layouts, comm_ticks, max_dp_states=max_dp_states)
    for sig, cross in seed_paths:
        lp.add(sig, cross)
    return lp.run(until=until, stopped=stopped, max_iterations=max_iterations)

"""A proven lower bound on the step time of a setup, before it is balanced.

The bound is the value of a linear relaxation, certified by weak duality:

* **Variables.** ``x[g, r, vs] ≥ 0``: how many layers of body group ``g`` in recompute mode
  ``r`` virtual stage ``vs`` holds, fractional, with ``Σ_{r, vs} x[g, r, vs] = N_g`` (modes
  the profile offers and the setup allows only). Every plan is such an ``x`` (integer, with
  contiguous groups); the relaxation drops integrality and contiguity.
* **Time.** Per virtual stage, the forward, backward and weight durations are linear in
  ``x`` (the solver's integer costs, :func:`sapptk.costs.layer_coefficients`). Any path of
  the program's dependency graph has a length linear in ``x``
  (:class:`~sapptk.solver.paths.PathModel`), and the step time is at least the length of
  every path: ``z ≥ len_P(x)``. The rows start with each device's whole op chain (its work)
  and grow by row generation: the longest path at the relaxation's fractional durations is
  the most violated row (it carries the schedule's warm-up and cool-down).
* **Memory.** Every device's peak is the heaviest of its live points
  (:func:`sapptk.solver.paths.live_rows`, the balancer's exact constraint), linear in ``x``:
  each must stay within the budget. So the cheapest recompute that can fit is forced.

GLOP solves the LP, but its answer is not trusted: with the LP's duals as multipliers
``y ≥ 0`` (paths, normalised to sum 1) and ``μ ≥ 0`` (memory rows), every plan ``x`` that
fits satisfies ``step ≥ Σ_P y_P len_P(x) + Σ_k μ_k (mem_k(x) − budget_k)``, and the
minimum of the right-hand side over the product of simplices is a sum, per group, of
``N_g`` times its smallest coefficient. That minimum is the bound (less a rounding margin
far above float64's error). The same argument on ``min t: mem_k(x) − budget ≤ t`` proves a
setup infeasible and says by how many MB, on which device.

The module runs past 500 lines because the relaxation's data, its kept GLOP model
(:class:`RowLP`, which :mod:`sapptk.choosing.branching` extends by range rows), its
certificate and the integer model over the same rows share private helpers; split, each part
would import the others' internals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from sapptk.config import PipelineConfig
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, layer_coefficients, memory_units
from sapptk.profile import Profile
from sapptk.solver.clock import Clock
from sapptk.solver.paths import live_rows, path_model

__all__ = ["FIRST_ROUNDS", "ROW_ROUNDS", "ROW_TIME", "RowLP", "SetupBound", "pipeline_bound", "work_bound"]

ROW_ROUNDS = 400
ROW_TIME = 3.0
"""Row generation before a setup is balanced once :func:`sapptk.choose` has a best step time:
at most this many rounds and this many times ``bound_time``, stopping at the best step time.
The llama2_70b three- and four-chunk setups at eight stages need 140-290 rounds (1-3 s) to
converge, 2.5-3.5 % above their bound after 12 rounds (docs/benchmarks.md)."""

FIRST_ROUNDS = 12
"""Rounds before any best step time exists (nothing to stop at yet: the setup is bounded again
below the first best step time)."""

_MARGIN = 1e-7
"""Relative margin taken off a certified bound (float64 sums of at most a few thousand terms
err by about 1e-13 relative)."""

_IN_OUT = 0.8
"""Row generation separates at ``0.8 × centre + 0.2 × the LP's durations`` when that point's
longest path is violated at the LP's solution (in-out stabilisation; the centre follows the
separation points): on the llama2_70b three- and four-chunk setups it reached the same bound
in 30-35 % fewer rounds than separating at the LP's solution (docs/benchmarks.md). Which
violated row joins only changes the speed, never the validity of the certified bound."""

_TOLERANCE_MB = 1e-3
"""A setup is proven infeasible only when its certified excess is above this many MB."""


@dataclass(frozen=True)
class SetupBound:
    """What :func:`pipeline_bound` proved about one setup.

    ``bound_ms``: a lower bound on the pipeline step time of every plan that fits (None when
    the setup is proven infeasible). ``infeasible``: nothing fits, not even fractional
    layers with the strongest recompute; then ``excess_mb`` (a proven lower bound on how far
    the fullest device must exceed the budget) and ``device`` (the device whose memory
    binds). ``rounds`` (LP or CP-SAT solves) and ``seconds``; ``paths`` the path rows found
    (signatures as int64 bytes, crossings), which :func:`~sapptk.choosing.integer_bound.integer_bound` starts from;
    ``integer``: the bound comes from :func:`~sapptk.choosing.integer_bound.integer_bound`.
    """

    bound_ms: float | None
    infeasible: bool = False
    excess_mb: float = 0.0
    device: int | None = None
    rounds: int = 0
    seconds: float = 0.0
    paths: tuple[tuple[bytes, int], ...] = ()
    integer: bool = False

    @property
    def reason(self) -> str:
        """Why the setup has no plan ("" when it may have one)."""
        if not self.infeasible:
            return ""
        if self.device is None:
            return ("memory: no whole-layer assignment fits the budget on every device, even with the strongest "
                    "allowed recompute")
        return (f"memory: device {self.device} needs at least {self.excess_mb:,.1f} MB more than the budget, "
                "even with the strongest allowed recompute")


class _Relaxation:
    """The LP's data: variables, path rows and memory rows as dense arrays (ticks / 1000, MB)."""

    def __init__(self, profile: Profile, config: PipelineConfig) -> None:
        coef = layer_coefficients(profile, config)
        program = config.program()
        self.paths = path_model(program)
        self.comm = int(coef.comm)
        nvs = config.num_virtual_stages
        G, R = coef.allowed.shape
        # variables: (g, r, vs) for allowed (g, r)
        self.var_group = []
        cols_f, cols_b, cols_w, cols_a, cols_p, var_vs = [], [], [], [], [], []
        for g in range(G):
            for r in range(R):
                if not coef.allowed[g, r]:
                    continue
                for vs in range(nvs):
                    self.var_group.append(g)
                    var_vs.append(vs)
                    cols_f.append(coef.forward[g])
                    cols_b.append(coef.backward[g, r])
                    cols_w.append(coef.weight[g])
                    cols_a.append(coef.activation[g, r])
                    cols_p.append(coef.params[g])
        self.var_group = np.asarray(self.var_group, dtype=np.int64)
        var_vs = np.asarray(var_vs, dtype=np.int64)
        self.n_vars = len(var_vs)
        self.group_counts = coef.counts.astype(float)
        # per-vs [F; BI; W] costs = cost_matrix @ x + cost_fixed (time units)
        self.cost_matrix = np.zeros((3 * nvs, self.n_vars))
        idx = np.arange(self.n_vars)
        self.cost_matrix[var_vs, idx] = cols_f
        self.cost_matrix[nvs + var_vs, idx] = cols_b
        self.cost_matrix[2 * nvs + var_vs, idx] = cols_w
        self.cost_fixed = np.concatenate([coef.fixed_forward, coef.fixed_backward, coef.fixed_weight]).astype(float)
        # memory rows: one per (device, live point), in MB: row @ x + const <= budget
        act = np.zeros((nvs, self.n_vars))
        act[var_vs, idx] = np.asarray(cols_a, float) * MEMORY_UNIT_MB
        par = np.zeros((nvs, self.n_vars))
        par[var_vs, idx] = np.asarray(cols_p, float) * MEMORY_UNIT_MB
        fixed_act = coef.fixed_activation * MEMORY_UNIT_MB
        fixed_par = coef.fixed_params * MEMORY_UNIT_MB
        live = live_rows(program)
        rows, consts, owners = [], [], []
        for d, stages in enumerate(program.device_stages):
            stages = list(stages)
            static = par[stages].sum(axis=0)
            static_c = float(fixed_par[stages].sum()) + coef.constant * MEMORY_UNIT_MB
            points = live.rows[d] / live.scale if len(live.rows[d]) else np.zeros((1, len(stages)))
            for point in np.unique(points, axis=0):
                rows.append(static + point @ act[stages])
                consts.append(static_c + float(point @ fixed_act[stages]))
                owners.append(d)
        self.mem_rows = np.asarray(rows)
        self.mem_const = np.asarray(consts)
        self.mem_device = np.asarray(owners, dtype=np.int64)
        budget = config.memory_budget
        self.budget = None if budget is None else memory_units(budget) * MEMORY_UNIT_MB
        self.splits = config.splits

    def path_row(self, sig: np.ndarray, crossings: int) -> tuple[np.ndarray, float]:
        """A path's length as (coefficients on x, constant), in ticks / 1000."""
        sig = np.asarray(sig, dtype=float)
        return sig @ self.cost_matrix / 1000.0, (sig @ self.cost_fixed + crossings * self.comm * self.splits) / 1000.0

    def group_minimum(self, coefficients: np.ndarray) -> float:
        """``min Σ c·x`` over the product of simplices ``Σ_{r,vs} x[g, r, vs] = N_g``."""
        total = 0.0
        for g, n in enumerate(self.group_counts):
            if n:
                total += n * float(coefficients[self.var_group == g].min())
        return total


def _new_solver() -> pywraplp.Solver:
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with OR-Tools
        raise RuntimeError("OR-Tools has no GLOP solver")
    return solver


def _simplex_vars(solver: pywraplp.Solver, lp: _Relaxation) -> list[pywraplp.Variable]:
    x = [solver.NumVar(0.0, solver.infinity(), f"x{i}") for i in range(lp.n_vars)]
    for g, n in enumerate(lp.group_counts):
        ct = solver.Constraint(float(n), float(n))
        for i in np.flatnonzero(lp.var_group == g):
            ct.SetCoefficient(x[i], 1.0)
    return x


def _infeasibility(lp: _Relaxation) -> tuple[float, int]:
    """A proven lower bound on the smallest possible worst memory excess (MB), and the device
    whose rows carry it."""
    solver = _new_solver()
    x = _simplex_vars(solver, lp)
    t = solver.NumVar(-solver.infinity(), solver.infinity(), "t")
    cts = []
    for row, const in zip(lp.mem_rows, lp.mem_const, strict=True):
        ct = solver.Constraint(-solver.infinity(), lp.budget - const)  # row·x - t <= budget - const
        for i in np.flatnonzero(row):
            ct.SetCoefficient(x[i], float(row[i]))
        ct.SetCoefficient(t, -1.0)
        cts.append(ct)
    solver.Minimize(t)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0, 0
    mu = np.maximum(0.0, -np.array([ct.dual_value() for ct in cts]))
    if mu.sum() <= 0:
        return 0.0, 0
    mu /= mu.sum()
    value = float(mu @ (lp.mem_const - lp.budget)) + lp.group_minimum(mu @ lp.mem_rows)
    value -= _MARGIN * (abs(value) + float(mu @ lp.mem_const))
    device = int(np.bincount(lp.mem_device, weights=mu).argmax())
    return value, device


class RowLP:
    """The relaxation as a GLOP model kept between solves: path rows by row generation, the
    memory rows, and optional range rows ``lo ≤ a·x ≤ hi`` (branching on sums of ``x``); every
    bound it reports is certified by weak duality (:meth:`certify`), never read off the LP."""

    def __init__(self, lp: _Relaxation) -> None:
        self.lp = lp
        solver = self.solver = _new_solver()
        self.x = _simplex_vars(solver, lp)
        self.z = solver.NumVar(0.0, solver.infinity(), "z")
        self.mem_cts: list[pywraplp.Constraint] = []
        if lp.budget is not None:
            for row, const in zip(lp.mem_rows, lp.mem_const, strict=True):
                ct = solver.Constraint(-solver.infinity(), lp.budget - const)
                for i in np.flatnonzero(row):
                    ct.SetCoefficient(self.x[i], float(row[i]))
                self.mem_cts.append(ct)
        self.path_cts: list[pywraplp.Constraint] = []
        self.path_rows: list[tuple[np.ndarray, float]] = []
        self.range_cts: list[pywraplp.Constraint] = []
        self.range_rows: list[np.ndarray] = []
        self.seen: dict[bytes, None] = {}  # path keys in the order of their rows
        self.last_values: np.ndarray | None = None  # x at the last optimal solve of :meth:`generate`
        self.path_duals = np.zeros(0)  # the path rows' duals at the last certified solve
        for sig in lp.paths.device_sig:
            self.add(sig, 0)
        solver.Minimize(self.z)

    def fresh(self) -> RowLP:
        """A new LP over the same relaxation with every path row of this one (no range rows):
        for a solve GLOP gave up on from this one's basis."""
        other = RowLP(self.lp)
        for key in self.seen:
            other.add(np.frombuffer(key[:-8], dtype=np.int64).copy(), int.from_bytes(key[-8:], "little"))
        return other

    def add(self, sig: np.ndarray, crossings: int) -> bool:
        """Add a path's row ``z ≥ len_P(x)``; False when it is already there."""
        key = np.asarray(sig, dtype=np.int64).tobytes() + int(crossings).to_bytes(8, "little")
        if key in self.seen:
            return False
        self.seen[key] = None
        coeffs, const = self.lp.path_row(sig, crossings)
        ct = self.solver.Constraint(const, self.solver.infinity())  # z - coeffs·x >= const
        ct.SetCoefficient(self.z, 1.0)
        for i in np.flatnonzero(coeffs):
            ct.SetCoefficient(self.x[i], -float(coeffs[i]))
        self.path_cts.append(ct)
        self.path_rows.append((coeffs, const))
        return True

    def add_paths(self, paths: Sequence[tuple[bytes, int]]) -> None:
        """Add the rows of ``paths`` as :attr:`SetupBound.paths` holds them (signature bytes, crossings)."""
        for sig_bytes, crossings in paths:
            self.add(np.frombuffer(sig_bytes, dtype=np.int64).copy(), crossings)

    def binding(self) -> tuple[tuple[bytes, int], ...]:
        """The path rows with a positive dual at the last solve (all of them when there is none):
        the rows that hold the bound up, as (signature bytes, crossings) to start other models from."""
        keys = list(self.seen)
        duals = self.path_duals
        keep = [k for i, k in enumerate(keys) if i >= len(duals) or duals[i] > 0] if len(duals) else keys
        return tuple((k[:-8], int.from_bytes(k[-8:], "little")) for k in keep)

    def add_range(self, row: np.ndarray) -> int:
        """A free row ``a·x`` (bounds set by :meth:`set_range`); returns its index."""
        ct = self.solver.Constraint(-self.solver.infinity(), self.solver.infinity())
        for i in np.flatnonzero(row):
            ct.SetCoefficient(self.x[i], float(row[i]))
        self.range_cts.append(ct)
        self.range_rows.append(np.asarray(row, dtype=float))
        return len(self.range_cts) - 1

    def set_range(self, k: int, lo: float, hi: float) -> None:
        inf = self.solver.infinity()
        self.range_cts[k].SetBounds(-inf if lo == -math.inf else lo, inf if hi == math.inf else hi)

    def values(self) -> np.ndarray:
        return np.array([v.solution_value() for v in self.x])

    def certify(self) -> float:
        """The weak-duality bound of the current duals (ticks / 1000; module docstring): range
        rows join like memory rows, ``α (lo − a·x) + β (a·x − hi) ≤ 0`` for every ``x`` in them."""
        lp = self.lp
        y = self.path_duals = np.maximum(0.0, np.array([ct.dual_value() for ct in self.path_cts]))
        if y.sum() <= 0:
            return 0.0
        y = y / y.sum()
        coeffs = y @ np.array([c for c, _ in self.path_rows])
        value = float(y @ np.array([k for _, k in self.path_rows]))
        if self.mem_cts:
            mu = np.maximum(0.0, -np.array([ct.dual_value() for ct in self.mem_cts]))
            coeffs = coeffs + mu @ lp.mem_rows
            value += float(mu @ (lp.mem_const - lp.budget))
        for ct, row in zip(self.range_cts, self.range_rows, strict=True):
            dual = ct.dual_value()
            if dual > 0 and ct.lb() > -self.solver.infinity():  # the lower end binds
                coeffs = coeffs - dual * row
                value += dual * ct.lb()
            elif dual < 0 and ct.ub() < self.solver.infinity():  # the upper end binds
                coeffs = coeffs - dual * row
                value += dual * ct.ub()
        value += lp.group_minimum(coeffs)
        return max(0.0, value * (1 - _MARGIN))

    def generate(self, *, max_rounds: int, deadline: float | None, enough: float = math.inf,
                 stopped: Callable[[], bool] | None = None) -> tuple[float, int]:
        """Row generation: (the best certified bound, ticks / 1000; the LP solves). Stops when no
        path is violated, at ``max_rounds``, past ``deadline`` or once the bound reaches
        ``enough``, or once ``stopped()``; 0.0 when the LP has no solution (infeasible ranges:
        the caller decides)."""
        lp, z = self.lp, self.z
        best, rounds = 0.0, 0
        self.last_values = None
        center: np.ndarray | None = None  # durations the separation leans towards (in-out stabilisation)
        while rounds < max_rounds:
            rounds += 1
            if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
                break
            best = max(best, self.certify())
            values = self.last_values = self.values()
            if rounds >= max_rounds or best >= enough:
                break
            cost = lp.cost_matrix @ values + lp.cost_fixed
            level = z.solution_value() * (1 + 1e-6) + 1e-6
            added = False
            if center is not None:  # in-out separation: the longest path at a point towards the centre
                center = _IN_OUT * center + (1 - _IN_OUT) * cost
                _, found = lp.paths.longest(center[None, :], lp.comm)
                coeffs, const = lp.path_row(*found[0])
                if float(coeffs @ values + const) > level:
                    added = self.add(*found[0])
            if not added:
                step, found = lp.paths.longest(cost[None, :], lp.comm)
                if float(step[0]) / 1000.0 <= level or not self.add(*found[0]):
                    break
                if center is None:
                    center = cost
            if (deadline is not None and Clock.now() > deadline) or (stopped is not None and stopped()):
                break
        return best, rounds


def phase_clock(clock: Clock | None, seconds: float) -> Clock:
    """A phase of ``seconds`` on the caller's ``clock`` (its stop event, never past its deadline);
    on a clock of its own without one."""
    return (clock or Clock(math.inf)).phase(seconds)


def call_over(clk: Clock) -> bool:
    """Whether the whole call of the phase ``clk`` is over: stopped, or past the call's own
    deadline (not the phase's: a ``deterministic`` search counts its work, not the phase's seconds)."""
    return clk.stopped or (clk.call_deadline is not None and Clock.now() >= clk.call_deadline)


def work_bound(profile: Profile, config: PipelineConfig) -> float:
    """A proven lower bound (ms) on the pipeline step time of every plan of ``config``, without
    building its program: the average device's work, every layer in its fastest allowed mode.

    Every device runs its whole op chain one op after another, and that chain is a path of
    the program, so the step is at least the longest chain, hence at least the chains'
    average: ``m × (Σ_g N_g · min_r (F + B + W)_{g,r} + head + tail) / p`` (each op of every
    virtual stage runs once per micro-batch). It is the value of :func:`pipeline_bound`'s LP at
    the multipliers ``1/p`` on the device chains and 0 on memory, so it never exceeds the LP's
    bound (no memory rows: a setup whose memory binds gets more from the LP). Exact integer
    sums, then one division. 0.0 (no bound) for sliced micro-batches or a carried program.
    ``config`` must be valid for ``profile`` (:meth:`PipelineConfig.check`).
    """
    if config.splits != 1 or config.custom_program is not None:
        return 0.0
    coef = layer_coefficients(profile, config)
    per = coef.forward[:, None] + coef.backward + coef.weight[:, None]
    fastest = np.where(coef.allowed, per, np.iinfo(np.int64).max).min(axis=1)
    work = int((coef.counts * fastest).sum()) + int(coef.fixed_forward.sum() + coef.fixed_backward.sum()
                                                    + coef.fixed_weight.sum())
    return max(0.0, config.micro_batches * work * TIME_UNIT_MS / config.stages * (1 - 1e-12))


def pipeline_bound(profile: Profile, config: PipelineConfig, *, max_rounds: int = 40,
                   time_limit: float = 10.0, deterministic: bool = False,
                   enough_ms: float = math.inf, start: SetupBound | None = None,
                   clock: Clock | None = None) -> SetupBound:
    """A proven lower bound on the simulated step time (ms, without DP synchronisation) of every
    plan of ``profile`` on ``config`` that fits the memory budget; or a proof that none fits.

    ``config`` must be valid for ``profile`` (:meth:`PipelineConfig.check`) and name a
    schedule whose order does not depend on costs. ``max_rounds`` and ``time_limit`` (not
    with ``deterministic``: then the rounds alone, so the same input gives the same bound) cap the
    row generation; stopping early only makes the bound weaker, never wrong. The rounds also
    stop once the certified bound reaches ``enough_ms`` (a caller that prunes at that step time
    needs no more).

    ``start``: an earlier bound of the same setup (not infeasible) to resume from: its path rows
    seed the LP, the memory certificate is not computed again, and the result is at least
    ``start``'s bound, with its rounds and seconds added.

    ``clock``: the caller's :class:`~sapptk.solver.clock.Clock`; the rounds also stop at its
    deadline or stop event (even with ``deterministic``).
    """
    if start is not None and (start.infeasible or start.bound_ms is None or start.bound_ms >= enough_ms):
        return start
    clk = phase_clock(clock, time_limit)
    lp = _Relaxation(profile, config)
    if start is None and lp.budget is not None:  # a resumed bound's setup already passed this certificate
        excess, device = _infeasibility(lp)
        if excess > _TOLERANCE_MB:
            return SetupBound(None, infeasible=True, excess_mb=excess, device=device, seconds=clk.elapsed())
    rows = RowLP(lp)
    if start is not None:
        rows.add_paths(start.paths)
    enough = enough_ms / (1000.0 * TIME_UNIT_MS / config.splits)
    best, rounds = rows.generate(max_rounds=max_rounds, deadline=None if deterministic else clk.deadline,
                                 enough=enough, stopped=lambda: call_over(clk))
    ms = best * 1000.0 * TIME_UNIT_MS / config.splits
    found_paths = rows.binding()
    if start is not None:
        return SetupBound(max(ms, start.bound_ms), rounds=start.rounds + rounds,
                          seconds=start.seconds + clk.elapsed(), paths=found_paths)
    return SetupBound(ms, rounds=rounds, seconds=clk.elapsed(), paths=found_paths)

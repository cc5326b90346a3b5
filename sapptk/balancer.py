"""The balancer: layers and recompute modes per virtual stage, by CP-SAT, exactly as simulated.

What it decides
---------------
How many layers of each body group, in each recompute mode, every virtual stage holds.
Body groups stay contiguous and in model order (a virtual stage may end one group and start
the next); every virtual stage without the head or tail holds at least one body layer
(unless ``allow_empty_stages``).

Memory is exact (design idea 2): for each device and each Pareto-maximal live vector
``row`` of :meth:`Program.live_points`, ``static + Σ_chunks row_c · activation_c ≤ budget``
— the rows the simulator walks through, so m mod p, V placements, sequence slices and split
backwards are all covered (fractions scaled to integers exactly).

Time is exact too (design idea 3), by *path generation*. The simulator's step time is the
longest path through the program's dependency graph; every op's duration is linear in the
assignment, so each path P gives a linear lower bound ``Z ≥ len_P`` on the step time. The
optimum of ``min Z`` subject to *all* paths is the true optimum; there are far too many
paths, but few matter. So the master problem holds a set of paths; we compute the exact
longest path of each solution it reports (integer arithmetic, proven equal to the
simulator by the tests) and add that path when it is longer than the master believed.
The master's optimum is a lower bound on the true optimum (it relaxes it); every solution
is a real, memory-feasible plan, so its simulated step time is an upper bound; when the
two meet, optimality is proven. The first master holds every device's own op chain (a
path) and the critical paths of the even splits.

The master problem (:mod:`sapptk.solver.masters`) picks one *layout* per device among an
enumeration (:mod:`sapptk.solver.options`) of the layouts that fit its memory, Pareto-
reduced (memory is per device, so this is exact and CP-SAT never reasons about a memory
knapsack); this is what lets CP-SAT prove one-chunk schedules optimal in seconds. When
there are too many layouts it falls back to the layer counts ``x[g, r, vs]`` with one
memory row per live point; both are exact (the tests compare them).

Before the master runs, a local search over the layers per virtual stage and the layouts
of each device (every neighbour timed exactly), iterated with random kicks, supplies a
strong incumbent; then the LP relaxation of the layout master is solved to its optimum over
*all* paths by row generation (:mod:`sapptk.solver.relaxation`), which gives a proven bound
at once (as a Lagrangian bound over integer plans, not trusting the LP's floating point)
and hands the master the paths that matter. Master solves are capped, and the cap doubles
when a capped solve adds no path, so hard instances get many rounds of paths.

Where it is weak: on two-chunk schedules (interleaved, dualpipe-v) at 16 stages the step
time is a max over very many paths, convex in the durations, and the relaxation gains by
averaging several layouts of a device: for llama2_70b interleaved (16 stages, 32
micro-batches, 56000 MB) its optimum is 75.1 s against a best plan of 82.1 s. CP-SAT's
branching then moves the bound by well under 1 % a minute, and the plan comes back
"feasible" with a gap of about 8 % (``benchmarks/balance.py``). Measured for whoever takes
it on: the gap is almost all in how many layers each device holds. With every device's
layer total fixed to the best plan's, the same relaxation is within 0.94 % of it, and with
every virtual stage's layer count fixed, within 0.18 %. A plain best-first branch and bound on
those totals, with GLOP nodes, moved the bound from 75.1 to 77.0 s in 4 minutes. It needs
much faster node LPs (or a formulation that does not average devices' layer totals) before
it can prove anything here.

Ties are broken lexicographically by the same loop with the step time held at its
optimum: first the least recompute overhead (backward time above the no-recompute
backward, summed over layers), then the smallest deviation from the even split,
``Σ_vs |V · layers_vs − N|``. With ``deterministic=True`` CP-SAT runs one sequential worker,
so the same input gives the same plan (unless the time limit cuts the search short).

All integer units come from :mod:`sapptk.costs`; the solver's time unit is a *tick*,
``TIME_UNIT_MS / splits`` (a slice op of a stage costing c units lasts c ticks).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from ortools.sat.python import cp_model

from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, LayerCoefficients, layer_coefficients
from sapptk.schedules import OpCosts, build, get
from sapptk.solver.masters import LayerMaster, LayoutMaster, Master
from sapptk.solver.options import TooManyLayouts, device_layouts, stage_options
from sapptk.solver.paths import memory_model, path_key, path_model, stage_cost_vector
from sapptk.solver.relaxation import Relaxation, relax

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["BalanceResult", "balance", "solve"]


@dataclass
class BalanceResult:
    """What the search found, before it becomes a :class:`~sapptk.plan.Plan`.

    ``step_ticks``/``bound_ticks`` are in ticks (``ticks_ms`` ms each); ``counts`` is None
    when no plan was found. ``overhead`` (time units per micro-batch) and ``deviation`` are
    the tie-break objectives of the returned counts. ``iterations`` counts CP-SAT solves,
    ``cuts`` the paths in the final master, ``layouts`` the enumerated device layouts
    (0 when the layer-count model was used).
    """

    status: str
    counts: np.ndarray | None = None
    step_ticks: int | None = None
    bound_ticks: int | None = None
    overhead: int | None = None
    deviation: int | None = None
    ticks_ms: float = TIME_UNIT_MS
    seconds: float = 0.0
    iterations: int = 0
    cuts: int = 0
    layouts: int = 0
    message: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def step_time(self) -> float | None:
        """Predicted (= simulated) step time in ms."""
        return None if self.step_ticks is None else self.step_ticks * self.ticks_ms

    @property
    def bound(self) -> float | None:
        """Proven lower bound on the optimal step time in ms."""
        return None if self.bound_ticks is None else self.bound_ticks * self.ticks_ms

    @property
    def gap(self) -> float | None:
        """(step − bound) / step, 0 when proven optimal."""
        if self.step_ticks is None or self.bound_ticks is None:
            return None
        if self.step_ticks <= 0:
            return 0.0
        return max(0.0, (self.step_ticks - self.bound_ticks) / self.step_ticks)


class _Search:
    """Path generation around a master problem; see the module docstring."""

    def __init__(
        self,
        profile: Profile,
        config: PipelineConfig,
        *,
        time_limit: float,
        workers: int,
        seed: int,
        deterministic: bool,
        allow_empty: bool,
    ) -> None:
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + float(time_limit)
        self.profile, self.config = profile, config
        self.coef: LayerCoefficients = layer_coefficients(profile, config)
        self.program = config.program()
        self.paths = path_model(self.program)
        self.memory = memory_model(self.program)
        self.k = self.program.splits
        self.comm_ticks = self.coef.comm * self.k
        # the budget in the memory model's scaled units (memory units × live-point scale), rounded down
        self.budget = (
            None if config.memory_budget is None
            else int(math.floor(config.memory_budget / MEMORY_UNIT_MB * self.memory.scale + 1e-6))
        )
        self.allow_empty = allow_empty
        self.workers, self.seed, self.deterministic = workers, seed, deterministic
        self.iterations = 0
        self.pool: dict[bytes, tuple[np.ndarray, int]] = {}  # every path seen: key -> (sig, crossings)
        self.master: Master | None = None
        self.best: np.ndarray | None = None
        self.best_z: int | None = None
        self.relaxation = Relaxation()

    # ---------------------------------------------------------------- helpers
    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def fits(self, counts: np.ndarray) -> bool:
        """Whether an assignment fits the budget (exact, from the live points)."""
        if self.budget is None:
            return True
        return bool((self.memory.peaks(self.coef, self.program, counts) <= self.budget).all())

    def valid(self, counts: np.ndarray) -> bool:
        """Structure the masters enforce: allowed modes only, no empty stage unless allowed."""
        if (counts[~self.coef.allowed] != 0).any():
            return False
        if not self.allow_empty:
            empty = (counts.sum(axis=(0, 1)) == 0) & (self.coef.fixed_layers == 0)
            if empty.any():
                return False
        return True

    def evaluate(self, counts_list: list[np.ndarray], cap: int | None = None) -> list[int]:
        """Exact step ticks of each assignment. Records every critical path in the pool and,
        when it is longer than ``cap`` (or always, without a cap), as a cut in the master."""
        if not counts_list:
            return []
        costs = np.stack([stage_cost_vector(self.coef, c) for c in counts_list])
        steps, paths = self.paths.longest(costs, self.coef.comm)
        out = []
        for step, (sig, crossings) in zip(steps.tolist(), paths, strict=True):
            key = path_key(sig, crossings)
            self.pool.setdefault(key, (sig, crossings))
            if self.master is not None and (cap is None or step > cap):
                self.master.add_cut(sig, crossings)
            out.append(int(step))
        return out

    def offer(self, counts: np.ndarray, z: int) -> None:
        if self.best_z is None or z < self.best_z:
            self.best, self.best_z = counts, z

    def solve(self, time_cap: float | None = None) -> tuple[int, cp_model.CpSolver, list[np.ndarray]]:
        """One CP-SAT solve of the master; every solution it reports, as counts."""
        assert self.master is not None
        solver = cp_model.CpSolver()
        prm = solver.parameters
        # deterministic: one sequential worker (reproducible). CP-SAT 9.15's interleave_search,
        # its documented deterministic parallel mode, aborts on some of these models
        # ("Check failed: heuristics.fixed_search != nullptr").
        prm.num_workers = 1 if self.deterministic else int(self.workers)
        prm.random_seed = int(self.seed)
        if self.deterministic:
            # caps in CP-SAT's deterministic time, so the sequence of solves is reproducible;
            # only the overall wall-clock limit can cut it short
            prm.max_time_in_seconds = max(0.05, self.remaining())
            if time_cap is not None:
                prm.max_deterministic_time = max(0.05, time_cap)
        else:
            limit = self.remaining() if time_cap is None else min(self.remaining(), time_cap)
            prm.max_time_in_seconds = max(0.05, limit)
        collector = _Collector(self.master.variables)
        status = solver.solve(self.master.model, collector)
        self.iterations += 1
        if status == cp_model.MODEL_INVALID:
            raise AssertionError(f"balance: invalid CP-SAT model: {self.master.model.validate()}")
        sols = [self.master.counts_of(v) for v in collector.solutions]
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            final = self.master.counts_of([solver.value(v) for v in self.master.variables])
            if not any(np.array_equal(final, s) for s in sols[-1:]):
                sols.append(final)
        return status, solver, sols

    def use(self, master: Master) -> None:
        """Make ``master`` current, with every device chain and every path seen as cuts."""
        self.master = master
        for d in range(self.program.stages):
            master.add_cut(self.paths.device_sig[d], 0)
        for sig, crossings in self.pool.values():
            master.add_cut(sig, crossings)

    # ----------------------------------------------------------------- phases
    def seed_incumbents(self) -> None:
        """Even splits (each allowed mode) as first incumbents and sources of paths."""
        unique = _even_splits(self.profile, self.config)
        steps = self.evaluate(unique)
        for c, z in zip(unique, steps, strict=True):
            if self.valid(c) and self.fits(c):
                self.offer(c, z)

    def first_plan(self, share: float) -> str:
        """No even split fits: find a plan with the layer-count model.

        Returns "found", "infeasible" (CP-SAT proved that no assignment fits) or "unknown"
        (the time limit ran out first). A capped solve that ends without an answer proves
        nothing: the cap doubles and the search goes on until the deadline.
        """
        master = LayerMaster(self.coef, self.program, self.comm_ticks, budget=self.budget, allow_empty=self.allow_empty)
        self.use(master)
        master.model.minimize(master.z)
        cap = max(1.0, share * self.remaining())
        while self.best_z is None and self.remaining() > 0:
            status, _, sols = self.solve(time_cap=cap)
            for c, z in zip(sols, self.evaluate(sols), strict=True):
                self.offer(c, z)
            if status == cp_model.INFEASIBLE:
                return "infeasible"
            if status == cp_model.UNKNOWN:
                cap *= 2
        return "found" if self.best_z is not None else "unknown"

    def build_master(self) -> int:
        """The layout master if enumeration is small enough, else the layer-count one."""
        try:
            n_max = self._layer_caps()
            options = stage_options(self.coef, n_max)
            layouts = device_layouts(
                self.coef, self.program, options, ub=self.best_z, budget=self.budget, allow_empty=self.allow_empty
            )
            durations = self.config.chunks == 1
            self.use(LayoutMaster(self.coef, self.program, self.comm_ticks, layouts, durations=durations))
            return sum(len(lay) for lay in layouts)
        except TooManyLayouts:
            self.use(
                LayerMaster(self.coef, self.program, self.comm_ticks, budget=self.budget, allow_empty=self.allow_empty)
            )
            return 0

    def local_search(self, until: float) -> None:
        """Primal heuristic: hill-climb on the layers per virtual stage, exactly evaluated.

        A candidate is a vector of body layers per virtual stage (groups follow in model
        order); each device then takes, among its enumerated layouts with that composition,
        the one with the least total backward time. Moves shift one layer between two
        stages (devices whose composition does not change keep their layout) or switch one
        device to another kept layout of the same composition (recompute modes traded
        between its stages); every neighbour is timed exactly (batched longest paths,
        :meth:`PathModel.steps`) and the best improving one is taken. From the local
        optimum, an iterated local search kicks it by 2-4 random layer moves, climbs again
        on a sample of 4·V layer moves per round, and keeps the result when it is better;
        it stops after V/2 kicks without improvement, or at ``until``. When deterministic,
        the rounds and kicks are counted instead of timed. It only supplies incumbents:
        bounds and proofs come from the master.
        """
        master = self.master
        if not isinstance(master, LayoutMaster) or self.best is None:
            return
        pick: list[dict[bytes, int]] = []
        for lay in master.layouts:
            table: dict[bytes, int] = {}
            total = lay.backward.sum(axis=1)
            for o in np.argsort(total, kind="stable"):
                table.setdefault(lay.comp[o].tobytes(), int(o))
            pick.append(table)
        counts_g = self.coef.counts
        starts = np.concatenate([[0], np.cumsum(counts_g)])
        V = len(self.coef.fixed_forward)
        floor = np.where((self.coef.fixed_layers > 0) | self.allow_empty, 0, 1)

        def build(per_vs: np.ndarray, base: np.ndarray | None = None) -> np.ndarray | None:
            """Counts with ``per_vs`` layers per stage; a device whose composition is the same
            as in ``base`` keeps its layout there, the others take their cheapest layout."""
            bounds = np.concatenate([[0], np.cumsum(per_vs)])
            comp = np.clip(np.minimum(bounds[1:, None], starts[None, 1:]) - np.maximum(bounds[:-1, None],
                                                                                       starts[None, :-1]), 0, None)
            counts = np.zeros(self.coef.shape, dtype=np.int64)
            for lay, table in zip(master.layouts, pick, strict=True):
                st = list(lay.stages)
                if base is not None and np.array_equal(base[:, :, st].sum(axis=1).T, comp[st]):
                    counts[:, :, st] = base[:, :, st]
                    continue
                o = table.get(np.ascontiguousarray(comp[st]).tobytes())
                if o is None:
                    return None
                for c, vs in enumerate(lay.stages):
                    counts[:, :, vs] = lay.mix[o, c]
            return counts

        def alternatives(counts: np.ndarray) -> list[np.ndarray]:
            """``counts`` with one device switched to another kept layout of the same composition."""
            out = []
            for lay in master.layouts:
                st = list(lay.stages)
                comp = counts[:, :, st].sum(axis=1).T
                for o in np.flatnonzero(np.all(lay.comp == comp[None], axis=(1, 2))):
                    alt = counts.copy()
                    for c, vs in enumerate(lay.stages):
                        alt[:, :, vs] = lay.mix[o, c]
                    if not np.array_equal(alt, counts):
                        out.append(alt)
            return out

        def climb(
            current: np.ndarray, current_z: int, rounds: int | None, sample: int | None = None
        ) -> tuple[np.ndarray, int]:
            """Best-improvement hill climb from the counts ``current``: one layer between two
            stages (over ``sample`` random moves per round, or all of them) or one device's
            layout for another of the same composition; returns the local optimum reached."""
            while (rounds is None and time.perf_counter() < until) or (rounds is not None and rounds > 0):
                if rounds is not None:
                    rounds -= 1
                vec = current.sum(axis=(0, 1))
                cands = alternatives(current)
                chosen = moves if sample is None else [moves[i] for i in rng.choice(len(moves), sample, replace=False)]
                for a, b in chosen:
                    if vec[a] <= floor[a]:
                        continue
                    v = vec.copy()
                    v[a] -= 1
                    v[b] += 1
                    counts = build(v, current)
                    if counts is not None:
                        cands.append(counts)
                if not cands:
                    break
                costs = np.stack([stage_cost_vector(self.coef, c) for c in cands])
                steps = self.paths.steps(costs, self.coef.comm)
                i = int(np.argmin(steps))
                if steps[i] >= current_z:
                    break
                current, current_z = cands[i], int(steps[i])
                if self.best_z is None or current_z < self.best_z:
                    self.evaluate([current])  # its critical path joins the pool
                    self.offer(current, current_z)
            return current, current_z

        rng = np.random.default_rng(self.seed)
        start = build(self.best.sum(axis=(0, 1)))
        if start is not None:
            z = self.evaluate([start])[0]
            self.offer(start, z)
        moves = [(a, b) for a in range(V) for b in range(V) if a != b]
        # a fixed number of rounds when deterministic (wall time would make it irreproducible)
        rounds = 4 * V if self.deterministic else None
        assert self.best_z is not None
        current, current_z = climb(self.best, self.best_z, rounds)
        # iterated local search: kick the local optimum by a few random layer moves, climb
        # again (on a sample of the moves), keep the result when it is better (a fixed number
        # of kicks when deterministic)
        kicks = 2 * V if self.deterministic else None
        idle = 0  # kicks since the last improvement: the search stops after V / 2 of them
        while ((kicks is None and time.perf_counter() < until) or (kicks is not None and kicks > 0)) and idle < V // 2:
            if kicks is not None:
                kicks -= 1
            idle += 1
            vec = current.sum(axis=(0, 1))
            for _ in range(int(rng.integers(2, 5))):
                a, b = moves[int(rng.integers(len(moves)))]
                if vec[a] > floor[a]:
                    vec[a] -= 1
                    vec[b] += 1
            counts = build(vec, current)
            if counts is None or np.array_equal(counts, current):
                continue
            z = int(self.paths.steps(stage_cost_vector(self.coef, counts)[None, :], self.coef.comm)[0])
            counts, z = climb(counts, z, V if self.deterministic else None, sample=min(len(moves), 4 * V))
            if z < current_z:
                current, current_z = climb(counts, z, V if self.deterministic else None)
                idle = 0

    def _layer_caps(self) -> np.ndarray:
        """Most layers of each group one virtual stage can hold in a plan no slower than the incumbent."""
        coef = self.coef
        V = len(coef.fixed_forward)
        required = 0 if self.allow_empty else int((coef.fixed_layers == 0).sum()) - 1
        caps = np.minimum(coef.counts, max(0, int(coef.counts.sum()) - max(required, 0)))
        if self.best_z is None:
            return caps
        # a stage's layers all run on its device: its op chain (a path) is at most the incumbent
        sig = self.paths.device_sig
        per_vs = [sig[:, vs].max() for vs in range(V)]
        fewest_ops = min(per_vs) if per_vs else 1
        for g in range(len(coef.counts)):
            cheapest = int(coef.forward[g]) + int(coef.backward[g][coef.allowed[g]].min()) + int(coef.weight[g])
            if cheapest > 0 and fewest_ops > 0:
                caps[g] = min(caps[g], self.best_z // (fewest_ops * cheapest))
        return caps

    def relax(self, until: float) -> None:
        """The LP relaxation's proven bound (:mod:`sapptk.solver.relaxation`); its paths join the master."""
        master = self.master
        if not isinstance(master, LayoutMaster):
            return
        seed = [(self.paths.device_sig[d], 0) for d in range(self.program.stages)] + list(self.pool.values())
        self.relaxation = relax(self.coef, self.paths, master.layouts, self.comm_ticks, seed, until=until)
        for sig, crossings in self.relaxation.cuts:
            self.pool.setdefault(path_key(sig, crossings), (sig, crossings))
            master.add_cut(sig, crossings)

    def minimise_step(self) -> tuple[str, int]:
        """Phase 1: the step time. Returns (status, lower bound in ticks).

        Each master solve is capped (starting at 5 % of the time limit, doubled whenever a
        capped solve brings no new path), so that on hard instances many rounds of paths
        reach the master instead of one long solve on a stale path set.
        """
        m = self.master
        assert m is not None
        m.model.minimize(m.z)
        lower = self.relaxation.bound if self.best_z is None else min(self.relaxation.bound, self.best_z)
        cap = max(1.0, 0.05 * (self.deadline - self.t0))
        while True:
            if self.best_z is not None and self.best_z <= lower:
                return "optimal", self.best_z
            if self.best_z is not None:
                m.set_domain(m.z, lower, self.best_z - 1)
            m.hint(self.best)
            cuts_before = len(m.cuts)
            status, solver, sols = self.solve(time_cap=cap)
            for c, z in zip(sols, self.evaluate(sols), strict=True):
                self.offer(c, z)
            if status == cp_model.INFEASIBLE:
                # nothing beats the incumbent (or, without one, nothing fits)
                if self.best_z is None:
                    return "infeasible", 0
                lower = self.best_z
            elif status == cp_model.OPTIMAL:
                lower = max(lower, int(round(solver.objective_value)))
            elif status in (cp_model.FEASIBLE, cp_model.UNKNOWN):
                lower = max(lower, int(math.ceil(solver.best_objective_bound - 1e-9)))
            if self.best_z is not None and self.best_z <= lower:
                return "optimal", self.best_z
            if self.remaining() <= 0:
                return ("feasible" if self.best_z is not None else "unknown"), lower
            if status in (cp_model.FEASIBLE, cp_model.UNKNOWN) and len(m.cuts) == cuts_before:
                cap *= 2  # the cap cut the solve short and taught nothing new: give it longer

    def minimise(self, var: cp_model.IntVar, value, cap: int, until: float) -> tuple[int, bool]:  # noqa: ANN001
        """Phases 2 and 3: minimise ``var`` (``value(counts)`` computes it exactly) with the step
        time held at ``cap``, until the wall-clock time ``until``. Returns (its value, proven)."""
        m = self.master
        assert m is not None and self.best is not None
        m.model.minimize(var)
        best_v = value(self.best)
        while time.perf_counter() < until:
            if best_v <= 0:  # both tie-break objectives are >= 0
                m.set_domain(var, 0, 0)
                return best_v, True
            m.set_domain(var, 0, best_v - 1)
            m.hint(self.best)
            status, _, sols = self.solve(time_cap=None if self.deterministic else until - time.perf_counter())
            for c, z in zip(sols, self.evaluate(sols, cap=cap), strict=True):
                v = value(c)
                if z <= cap and v < best_v:
                    self.best, best_v = c, v
            if status == cp_model.INFEASIBLE:
                m.set_domain(var, best_v, best_v)
                return best_v, True
            if status == cp_model.UNKNOWN:
                break
        m.set_domain(var, 0, best_v)
        return best_v, False

    def run(self) -> BalanceResult:
        self.seed_incumbents()
        ticks_ms = TIME_UNIT_MS / self.k
        if self.best_z is None:
            found = self.first_plan(share=0.25)
            if found != "found":
                return self._finish(BalanceResult(status=found, ticks_ms=ticks_ms))
        layouts = self.build_master()
        # half the time at most: on hard instances the incumbent, not the master, is what improves
        self.local_search(until=time.perf_counter() + 0.5 * self.remaining())
        self.relax(until=time.perf_counter() + 0.25 * self.remaining())
        status, lower = self.minimise_step()
        res = BalanceResult(status=status, ticks_ms=ticks_ms, layouts=layouts)
        if status == "infeasible":  # the layout master cannot be infeasible with an incumbent
            return self._finish(res)
        res.step_ticks, res.bound_ticks = self.best_z, lower
        if status == "optimal":
            m = self.master
            assert m is not None and self.best_z is not None
            m.set_domain(m.z, lower, self.best_z)
            # half the time left for each tie-break (all of it when deterministic: reproducible)
            half = self.deadline if self.deterministic else time.perf_counter() + 0.5 * self.remaining()
            _, proven = self.minimise(m.overhead_var, self._overhead, self.best_z, half)
            if proven:
                _, proven = self.minimise(m.deviation_var, self._deviation, self.best_z, self.deadline)
                if not proven:
                    res.notes.append("the smallest deviation from the even split was not proven in time")
            else:
                res.notes.append("the least recompute overhead at this step time was not proven in time")
        res.overhead = self._overhead(self.best) if self.best is not None else None
        res.deviation = self._deviation(self.best) if self.best is not None else None
        res.counts = self.best
        return self._finish(res)

    def _overhead(self, counts: np.ndarray) -> int:
        return int(np.einsum("grv,gr->", counts, self.coef.overhead))

    def _deviation(self, counts: np.ndarray) -> int:
        V = counts.shape[2]
        return int(np.abs(V * counts.sum(axis=(0, 1)) - int(self.coef.counts.sum())).sum())

    def _finish(self, res: BalanceResult) -> BalanceResult:
        res.seconds = time.perf_counter() - self.t0
        res.iterations = self.iterations
        res.cuts = len(self.master.cuts) if self.master is not None else 0
        return res


class _Collector(cp_model.CpSolverSolutionCallback):
    """Keeps every solution CP-SAT reports (each one is a real plan worth evaluating)."""

    def __init__(self, variables: list[cp_model.IntVar]) -> None:
        super().__init__()
        self._vars = variables
        self.solutions: list[list[int]] = []

    def on_solution_callback(self) -> None:
        self.solutions.append([self.value(v) for v in self._vars])


def _even_splits(profile: Profile, config: PipelineConfig) -> list[np.ndarray]:
    """The counts of every distinct even split (:func:`sapptk.plan.even_splits`)."""
    from sapptk.plan import even_splits

    return [np.asarray(plan.counts, dtype=np.int64) for plan in even_splits(profile, config)]


def solve(
    profile: Profile,
    config: PipelineConfig,
    *,
    time_limit: float = 30,
    workers: int = 2,
    seed: int = 0,
    deterministic: bool = False,
    allow_empty_stages: bool = False,
) -> BalanceResult:
    """Run the search and return its raw result (counts in the :mod:`sapptk.costs` layout).

    Validates ``config`` against ``profile`` first (:class:`~sapptk.errors.ConfigError`).
    See :func:`balance` for the parameters.
    """
    config.check(profile, allow_empty_stages=allow_empty_stages)
    search = _Search(
        profile, config, time_limit=time_limit, workers=workers, seed=seed,
        deterministic=deterministic, allow_empty=allow_empty_stages,
    )
    res = search.run()
    if res.status == "infeasible":
        res.message = explain_infeasible(profile, config, allow_empty_stages=allow_empty_stages)
    elif res.status == "unknown":
        res.message = f"no plan found within the time limit of {time_limit:g} s"
    elif res.status == "feasible":
        res.message = (
            f"time limit of {time_limit:g} s reached: step time {res.step_time:.6g} ms, "
            f"best bound {res.bound:.6g} ms, gap {100 * (res.gap or 0.0):.3g} %; not proven optimal"
        )
    else:
        res.message = f"optimal step time {res.step_time:.6g} ms (proven)"
    if res.notes:
        res.message += "; " + "; ".join(res.notes)
    return res


def balance(
    profile: Profile,
    config: PipelineConfig,
    *,
    time_limit: float = 30,
    workers: int = 2,
    seed: int = 0,
    deterministic: bool = False,
    allow_empty_stages: bool = False,
) -> Plan:
    """The plan with the shortest simulated step time that fits the memory budget.

    Parameters
    ----------
    profile, config: the model and the pipeline setup (validated first; a
        :class:`~sapptk.errors.ConfigError` is raised before any solving).
    time_limit: wall-clock seconds for the whole search.
    workers: CP-SAT worker threads.
    seed: CP-SAT random seed.
    deterministic: run CP-SAT on one sequential worker (``workers`` is ignored), so the same
        input gives the same plan as long as the time limit is not hit.
    allow_empty_stages: let virtual stages hold no body layer.

    Returns
    -------
    A :class:`~sapptk.plan.Plan` with ``status`` "optimal" (step time proven optimal),
    "feasible" (time limit hit; ``bound`` and ``gap`` say how far it may be from optimal),
    "infeasible" (nothing fits; ``message`` names the device and the shortfall) or
    "unknown" (no plan found in time). ``step_time`` is the simulated step time of the
    plan; ``bound`` a proven lower bound on the optimum.
    """
    from sapptk.plan import make_plan

    def solve_plan(cfg: PipelineConfig, limit: float) -> Plan:
        res = solve(
            profile, cfg, time_limit=limit, workers=workers, seed=seed,
            deterministic=deterministic, allow_empty_stages=allow_empty_stages,
        )
        return make_plan(
            profile,
            cfg,
            res.counts,
            status=res.status,
            step_time=res.step_time,
            bound=res.bound,
            gap=res.gap,
            solve_seconds=res.seconds,
            message=res.message,
            source="balance",
        )

    config.validate()  # a ConfigError before anything else
    if config.custom_program is None and get(config.schedule).cost_driven:
        return reorder_until_stable(config, solve_plan, time_limit=time_limit)
    return solve_plan(config, time_limit)


# ------------------------------------------------------------ cost-driven schedules
def _same_layout(plan: Plan, config: PipelineConfig) -> Plan | None:
    """``plan``'s layout on another order of the same setup, or None when it does not fit."""
    from sapptk.costs import peak_memory, simulate_counts
    from sapptk.plan import make_plan

    if not plan.solved:
        return None
    budget = config.memory_budget
    if budget is not None and peak_memory(plan.profile, config, plan.counts).max() > budget + 1e-6:
        return None
    step = simulate_counts(plan.profile, config, plan.counts).step_time
    return make_plan(plan.profile, config, plan.counts, status="feasible", step_time=step,
                     message="the previous layout on the re-built order (its own solve found no better)",
                     source="balance")

REORDER_ROUNDS = 4
"""At most this many re-orderings of a cost-driven schedule after the first balance."""


def reorder_until_stable(config: PipelineConfig, solve_plan: Callable[[PipelineConfig, float], Plan], *,
                         time_limit: float) -> Plan:
    """Balance a cost-driven schedule (``zb-v-greedy``) and its order together.

    The order of such a schedule depends on the op costs, and the costs on the plan. So:
    balance on the order built at unit costs; rebuild the order at the plan's per-stage
    costs (and comm); balance again on that fixed order (a setup carrying the program);
    repeat while the step time improves and the order is new, at most
    :data:`REORDER_ROUNDS` times. A solve cut short may find less than the layout in hand:
    then that layout on the new order is kept when it fits and is faster (status
    ``feasible``, no bound). Each solve gets half the time left, so the whole loop keeps
    ``time_limit``. The plan returned carries the program it
    was balanced on; its ``bound`` and ``gap`` are for that fixed order. ``solve_plan(config,
    seconds)`` is one balance.
    """
    deadline = time.monotonic() + time_limit
    plan = solve_plan(config, time_limit / 2)
    orders = {config.program().units}
    steps = [plan.step_time]
    for _ in range(REORDER_ROUNDS):
        left = deadline - time.monotonic()
        if not plan.solved or left < 0.2:
            break
        c = plan.costs
        costs = OpCosts(tuple(c.forward), tuple(c.backward), tuple(c.weight), float(c.comm))
        program = build(config.schedule, stages=config.stages, micro_batches=config.micro_batches,
                        chunks=config.chunks, splits=config.splits, costs=costs)
        if program.units in orders:
            break  # the order is stable at these costs
        orders.add(program.units)
        reordered = config.with_program(program)
        candidate = solve_plan(reordered, left / 2)
        kept = _same_layout(plan, reordered)  # the layout in hand on the new order, if it fits
        if kept is not None and (not candidate.solved or kept.step_time < candidate.step_time):
            candidate = kept
        if not candidate.solved or candidate.step_time >= plan.step_time - 1e-9:
            break
        plan = candidate
        steps.append(plan.step_time)
    if len(steps) > 1:
        history = " -> ".join(f"{t:.6g}" for t in steps)
        note = f"order re-built at the plan's costs {len(steps) - 1} time(s); step time {history} ms"
        plan = dataclasses.replace(plan, message=f"{plan.message}; {note}", source="balance (re-ordered)")
    return plan


def explain_infeasible(profile: Profile, config: PipelineConfig, *, allow_empty_stages: bool = False) -> str:
    """Why nothing fits: the device that needs the most memory even in the best layout, and by how much.

    First a direct bound: each device with the fewest layers it must hold (one per stage
    without head or tail), all in the group's lowest-activation allowed mode. If that already
    exceeds the budget, it names the device. Otherwise the shortfall is joint (the layers
    must go somewhere), and a small CP-SAT model finds the least possible peak of the
    fullest device.
    """
    coef = layer_coefficients(profile, config)
    program = config.program()
    mem = memory_model(program)
    budget_mb = float(config.memory_budget) if config.memory_budget is not None else math.inf
    # a body layer needs at least the smallest params and the smallest activation any allowed mode has
    min_params = int(coef.params.min())
    min_act = int(np.where(coef.allowed, coef.activation, np.iinfo(np.int64).max).min())
    lowest = []
    for d, stages in enumerate(program.device_stages):
        static = coef.constant + sum(int(coef.fixed_params[vs]) for vs in stages)
        act = []
        for vs in stages:
            a = int(coef.fixed_activation[vs])
            if not allow_empty_stages and coef.fixed_layers[vs] == 0:
                static += min_params
                a += min_act
            act.append(a)
        live = max((int(np.asarray(row) @ np.asarray(act)) for row in mem.rows[d]), default=0)
        lowest.append((mem.scale * static + live) / mem.scale * MEMORY_UNIT_MB)
    worst = int(np.argmax(lowest))
    if lowest[worst] > budget_mb:
        return (
            f"infeasible: device {worst} needs at least {lowest[worst]:.6g} MB even with the fewest layers it "
            f"must hold, in the strongest allowed recompute mode; the budget is {budget_mb:.6g} MB, "
            f"{lowest[worst] - budget_mb:.6g} MB short"
        )
    # joint shortfall: minimise the fullest device's peak
    master = LayerMaster(coef, program, coef.comm * program.splits, budget=None, allow_empty=allow_empty_stages)
    model = master.model
    peak = model.new_int_var(0, 2**52, "peak")
    for _, expr in master.peaks:
        model.add(peak >= expr)
    model.minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.parameters.max_time_in_seconds = 10.0
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return f"infeasible: no layout fits the budget of {budget_mb:.6g} MB on every device at once"
    bound_mb = math.ceil(solver.best_objective_bound - 1e-9) / master.scale * MEMORY_UNIT_MB
    values = [solver.value(v) for v in master.variables]
    counts = master.counts_of(values)
    peaks = mem.peaks(coef, program, counts) / mem.scale * MEMORY_UNIT_MB
    device = int(np.argmax(peaks))
    exact = status == cp_model.OPTIMAL
    need = peaks[device] if exact else bound_mb
    return (
        f"infeasible: the layers must go somewhere, and every layout leaves some device over budget; the best "
        f"one still needs {need:.6g} MB on device {device} {'(proven least)' if exact else '(a lower bound)'}, "
        f"{need - budget_mb:.6g} MB over the budget of {budget_mb:.6g} MB"
    )

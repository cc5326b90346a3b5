"""The search: layers and recompute modes per virtual stage, exactly as simulated. Its phases, in order:

1. **Seed incumbents** — the caller's start plan (when it fits this budget and its modes are
   allowed) and every even split that fits: a plan at once whenever one exists.
2. **First plan** — only when nothing fits yet: the layout master over every layout that
   fits, else the layer-count master, looks for one (each capped solve that ends without an
   answer doubles the cap; only a proof says "infeasible").
3. **Master** — enumerate every device's layouts (:mod:`sapptk.solver.layouts`) for the
   layout master, or, when that would be too large or too slow, the layer-count master
   (:mod:`sapptk.solver.masters`); then first a *coarse incumbent*: nearly identical
   consecutive groups coarsened into one (:func:`sapptk.solver.groups.coarsen`), that
   problem solved by layouts and local search, its plan spread back.
4. **Relaxation** (:mod:`sapptk.solver.relaxation`) — the LP bound over all paths, and the
   paths it needed, handed to the master (and to the local search, whose filter they sharpen).
5. **Local search** (:mod:`sapptk.solver.local_search`) — better incumbents, fast; then the
   relaxation goes on with the critical paths the local search found.
6. **Minimise the step** — path generation around capped CP-SAT solves
   (:mod:`sapptk.solver.cpsat`): every solution is timed exactly, its critical path becomes a
   cut; the master's optimum is a lower bound, every solution an upper bound; they meet at
   the proven optimum.
7. **Tie-breaks** — with the step time held at its optimum: the least recompute overhead,
   then the smallest deviation from the even split.

Why it is exact: memory is the live-point rows of the program (the simulator walks the
same rows) and time is the longest path through the program's dependency graph with op
durations linear in the assignment (:mod:`sapptk.solver.paths`); every path P gives
``z ≥ len_P``, and the master holds the paths that matter. Every phase asks the same
:class:`~sapptk.solver.clock.Clock` whether to go on, so the time limit and a stop request
end the search alike, with the best plan so far. The knobs are in
:class:`~sapptk.solver.settings.SearchOptions`; ``docs/solver.md`` explains the whole.

(Over 500 lines: the phases share the problem, the clock and the incumbent; ``_Phases``
keeps them as methods in the order they run, so the file reads as the algorithm.)
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sapptk.costs import TIME_UNIT_MS
from sapptk.solver.clock import Clock
from sapptk.solver.cpsat import run_master
from sapptk.solver.diagnosis import explain_infeasible
from sapptk.solver.groups import GroupMap, coarsen
from sapptk.solver.incumbent import Incumbent
from sapptk.solver.layouts import DeviceLayouts, TooManyLayouts, device_layouts, layer_caps, stage_options
from sapptk.solver.local_search import LocalSearch
from sapptk.solver.masters import LayerMaster, LayoutMaster, Master
from sapptk.solver.paths import MemoryModel, OutOfTime
from sapptk.solver.problem import Problem, make_problem
from sapptk.solver.relaxation import LinearRelaxation, Relaxation
from sapptk.solver.settings import SearchOptions
from sapptk.solver.totals_bound import BoundRates, TotalsBound

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["SearchResult", "even_starts", "search"]

STALL_FRACTION = 0.001
"""Phase 6 gives the branch and bound on device totals time only after a master solve that
brought no better plan and raised the bound by less than this fraction of the step."""


@dataclass
class SearchResult:
    """What the search found, before it becomes a :class:`~sapptk.plan.Plan`.

    ``step_ticks``/``bound_ticks`` are in ticks (``ticks_ms`` ms each); ``counts`` (in the
    :mod:`sapptk.costs` layout, the profile's own groups) is None when no plan was found.
    ``overhead`` (time units per micro-batch) and ``deviation`` are the tie-break objectives
    of the returned counts. ``iterations`` counts CP-SAT solves, ``cuts`` the paths in the
    final master, ``layouts`` the enumerated device layouts (0 when the layer-count model was
    used); ``first_plan_seconds`` is when the first plan was in hand; ``stopped`` says the
    caller's stop event ended the search; ``history`` lists (seconds, step ticks, bound
    ticks) at every improvement of either (None before the first).
    """

    status: str
    counts: np.ndarray | None = None
    step_ticks: int | None = None
    bound_ticks: int | None = None
    overhead: int | None = None
    deviation: int | None = None
    ticks_ms: float = TIME_UNIT_MS
    seconds: float = 0.0
    first_plan_seconds: float | None = None
    iterations: int = 0
    cuts: int = 0
    layouts: int = 0
    stopped: bool = False
    message: str = ""
    notes: list[str] = field(default_factory=list)
    history: list[tuple[float, int | None, int | None]] = field(default_factory=list)

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


def search(
    profile: Profile,
    config: PipelineConfig,
    *,
    time_limit: float = 30.0,
    workers: int = 2,
    seed: int = 0,
    deterministic: bool = False,
    allow_empty_stages: bool = False,
    start: np.ndarray | None = None,
    stop: threading.Event | None = None,
    options: SearchOptions | None = None,
    clock: Clock | None = None,
) -> SearchResult:
    """Run the search and return its raw result. The arguments are those of
    :func:`sapptk.balance` (checked there); ``start`` is a layer assignment (counts) for this
    profile and program, or None. ``clock``: the caller's clock (one phase of a longer call,
    :meth:`~sapptk.solver.clock.Clock.phase`), used instead of ``time_limit`` and ``stop``.
    Validates ``config`` against ``profile`` first (:class:`~sapptk.errors.ConfigError`).
    """
    options = options or SearchOptions()
    if clock is None:
        clock = Clock(float(time_limit), stop, stall=options.stall_time)
    config.check(profile, allow_empty_stages=allow_empty_stages)
    problem = make_problem(profile, config, allow_empty=allow_empty_stages, options=options)
    phases = _Phases(problem, clock, workers=workers, seed=seed, deterministic=deterministic)
    res = phases.run(start)
    if res.status == "infeasible":
        res.message = explain_infeasible(problem, clock, workers=workers, seed=seed)
    elif res.status == "unknown":
        res.message = ("stopped before any plan was found" if res.stopped
                       else f"no plan found within {clock.describe_limit()}")
    elif res.status == "feasible":
        why = ("stopped" if res.stopped else f"no better plan for {clock.stall:g} s (stall_time)"
               if clock.stalled else f"{clock.describe_limit()} reached")
        res.message = (
            f"{why}: step time {res.step_time:.6g} ms, best bound {res.bound:.6g} ms, "
            f"gap {100 * (res.gap or 0.0):.3g} %; not proven optimal"
        )
    else:
        res.message = f"optimal step time {res.step_time:.6g} ms (proven)"
    if res.notes:
        res.message += "; " + "; ".join(res.notes)
    if res.counts is not None:
        res.counts = problem.groups.spread(res.counts)
    res.seconds = clock.elapsed()
    return res


class _Phases:
    """The search's state between phases: the problem, the clock, the incumbent, the master."""

    def __init__(
        self, problem: Problem, clock: Clock, *, workers: int, seed: int, deterministic: bool, coarse: bool = False
    ) -> None:
        self.problem = problem
        self.coarse = coarse  # this is the coarsened problem of another search (no further coarsening)
        self.clock = clock
        self.options = problem.options
        self.workers, self.seed, self.deterministic = workers, seed, deterministic
        self.incumbent = Incumbent(problem, clock)
        self.master: Master | None = None
        self.relaxation = Relaxation()
        self.lp: LinearRelaxation | None = None
        self.coarse_bound = 0  # ticks: the bound of the coarsened relaxation, when there is one
        self.totals: TotalsBound | None = None  # the branch and bound on device totals (two-chunk schedules)
        self.totals_bound = 0  # ticks: its bound, for plans no slower than the incumbent it was given
        self.rates = BoundRates()  # how fast the master and the tree raise the bound (sizes the tree's slices)
        self.iterations = 0
        self.first_plan_at: float | None = None
        self.notes: list[str] = []
        self.bounds: list[tuple[float, int]] = []  # (seconds, proven bound) at each improvement

    # ------------------------------------------------------------- the driver
    def run(self, start: np.ndarray | None) -> SearchResult:
        self.seed_incumbents(start)  # 1
        if self.incumbent.counts is None:
            found = self.first_plan()  # 2
            if found != "found":
                return self.result(found, None)
        layouts = self.build_master()  # 3
        if isinstance(self.master, LayoutMaster):
            self.relax(self.master, self.options.relaxation_share, self.options.relaxation_first_seconds)  # 4
            self.local_search(self.master)  # 5
            self.relax(self.master, self.options.relaxation_after_share)
        status, lower = self.minimise_step()  # 6
        if status == "optimal":
            self.tie_breaks()  # 7
        return self.result(status, lower, layouts=layouts)

    # ---------------------------------------------------------------- helpers
    def offer_all(self, solutions: list[np.ndarray], cap: int | None = None) -> list[int]:
        """Time every solution exactly (critical paths join the pool and the master), keep the best."""
        steps = self.incumbent.evaluate(solutions, cap=cap)
        for counts, ticks in zip(solutions, steps, strict=True):
            if self.incumbent.offer(counts, ticks) and self.first_plan_at is None:
                self.first_plan_at = self.clock.elapsed()
        return steps

    def solve_master(self, time_cap: float | None):  # noqa: ANN201 - MasterSolve
        assert self.master is not None
        self.iterations += 1
        return run_master(self.master, self.clock, workers=self.workers, seed=self.seed,
                          deterministic=self.deterministic, time_cap=time_cap)

    def lower_bound(self) -> int:
        """The best proven bound without a master: the relaxation's (of this problem or of its
        coarsened relaxation), or the average device's work."""
        return max(self.relaxation.bound, self.coarse_bound, self.totals_bound, _work_bound(self.problem))

    def proven(self, lower: int) -> int:
        """Record a proven lower bound (ticks) when it improves; returns it."""
        if not self.bounds or lower > self.bounds[-1][1]:
            self.bounds.append((self.clock.elapsed(), int(lower)))
        return lower

    # ------------------------------------------------------------------ phases
    def seed_incumbents(self, start: np.ndarray | None) -> None:
        """Phase 1: the start plan (if it fits) and every even split that fits."""
        problem = self.problem
        candidates = []
        if start is not None:
            merged = problem.groups.merge(np.asarray(start, dtype=np.int64))
            if not problem.valid(merged):
                self.notes.append("the start plan uses a recompute mode this setup does not allow (not used)")
            elif not problem.fits(merged):
                self.notes.append("the start plan does not fit this memory budget (not used)")
            else:
                candidates.append(merged)
        candidates += [c for c in _even_split_counts(problem) if problem.valid(c) and problem.fits(c)]
        if candidates:
            self.offer_all(candidates)

    def first_plan(self) -> str:
        """Phase 2: no even split fits; find a plan.

        First with the layout master over every layout that fits (a plain assignment, which
        CP-SAT answers at once), when the enumeration is small and quick enough; else with
        the layer-count model. Returns "found", "infeasible" (CP-SAT proved that no
        assignment fits) or "unknown" (the time limit ran out first). A capped solve that
        ends without an answer proves nothing: the cap doubles and the search goes on until
        the deadline.
        """
        p = self.problem
        if self.clock.expired():
            return "unknown"
        try:
            memory = p.reduced_memory(self.clock.deadline)
        except OutOfTime:
            return "unknown"
        cap = max(1.0, self.options.first_plan_share * self.clock.remaining())
        layouts = self.enumerate(None, memory, self.clock.until(self.options.first_plan_share))
        if layouts is not None and not self.clock.expired():
            if not all(len(lay) for lay in layouts):
                return "infeasible"  # some device holds no layout that fits
            master: Master = LayoutMaster(p.coef, p.program, p.comm_ticks, layouts)
            self.use(master)
            master.model.minimize(master.z)
            solved = self.solve_master(cap)
            self.offer_all(solved.solutions)
            if solved.status == "infeasible":
                return "infeasible"  # every layout that fits was there: a proof
            if self.incumbent.counts is not None:
                return "found"
            cap *= 2  # cut short without an answer: the next solve gets longer
        master = LayerMaster(p.coef, p.program, p.comm_ticks, budget=p.budget, allow_empty=p.allow_empty,
                             memory=memory)
        self.use(master)
        master.model.minimize(master.z)
        while self.incumbent.counts is None and not self.clock.expired():
            solved = self.solve_master(cap)
            self.offer_all(solved.solutions)
            if solved.status == "infeasible":
                return "infeasible"
            if solved.status == "unknown":
                cap *= 2
        return "found" if self.incumbent.counts is not None else "unknown"

    def build_master(self, ub: int | None = None) -> int:
        """Phase 3: the layout master if enumeration is small and quick enough, else the
        layer-count one. Returns the number of layouts (0 for the layer-count master).
        Layouts whose device chain exceeds ``ub`` (default: the incumbent's step) are left out."""
        p = self.problem
        ub = self.incumbent.ticks if ub is None else ub
        if self.clock.expired():
            return 0
        # enumeration may use at most half the time left: the layer-count master is the fallback
        deadline = self.clock.until(0.5)
        try:
            memory = p.reduced_memory(self.clock.deadline)
        except OutOfTime:
            return 0  # no time even for the live points a master needs: the incumbent it is
        layouts = self.enumerate(ub, memory, deadline)
        if layouts is None:
            if self.clock.expired():
                return 0
            self.coarse_incumbent()
            if self.clock.expired():
                return 0
            self.use(LayerMaster(p.coef, p.program, p.comm_ticks, budget=p.budget, allow_empty=p.allow_empty,
                                 memory=memory))
            return 0
        durations = p.config.chunks == 1
        self.use(LayoutMaster(p.coef, p.program, p.comm_ticks, layouts, durations=durations))
        return sum(len(lay) for lay in layouts)

    def enumerate(self, ub: int | None, memory: MemoryModel, deadline: float) -> list[DeviceLayouts] | None:
        """Every device's layouts that fit (chains within ``ub``), or None when there would be
        too many or they take past ``deadline``."""
        p, opts = self.problem, self.options
        try:
            caps, work_cap = layer_caps(p.coef, p.paths, ub, allow_empty=p.allow_empty)
            options = stage_options(p.coef, caps, work_cap=work_cap, max_options=opts.max_partial_layouts,
                                    max_bytes=opts.max_layout_bytes, deadline=deadline)
            return device_layouts(
                p.coef, p.program, options, ub=ub, budget=p.budget, allow_empty=p.allow_empty,
                max_partial=opts.max_partial_layouts, max_layouts=opts.max_layouts,
                max_bytes=opts.max_layout_bytes, deadline=deadline, memory=memory,
            )
        except TooManyLayouts:
            return None

    def coarse_incumbent(self) -> None:
        """Phase 3, when the real groups have too many layouts: solve the coarsened problem
        (a restriction: its plans are real, and no slower than it says) by layouts and local
        search in a share of the time left, and offer its best plan, spread back."""
        p, opts = self.problem, self.options
        if self.coarse:
            return
        coef, coarse_map = coarsen(p.coef, opts.coarsen_tolerance)
        if coarse_map.identity:
            return
        # the coarse problem's groups, in terms of the profile's own groups
        members = tuple(tuple(g for j in m for g in p.groups.members[j]) for m in coarse_map.members)
        coarse = dataclasses.replace(p, coef=coef, groups=GroupMap(members=members, counts=p.groups.counts))
        clock = Clock(opts.local_search_share * self.clock.remaining(), self.clock.stop)
        sub = _Phases(coarse, clock, workers=self.workers, seed=self.seed, deterministic=self.deterministic,
                      coarse=True)
        start = None
        if self.incumbent.counts is not None:
            start = p.groups.spread(self.incumbent.counts)
        sub.seed_incumbents(start)
        if sub.incumbent.counts is None:
            return
        sub.build_master()
        if isinstance(sub.master, LayoutMaster):
            sub.local_search(sub.master)
        if sub.incumbent.counts is not None:
            self.offer_all([coarse_map.spread(sub.incumbent.counts)])
        # the same runs with their smallest figures: a relaxation, so its LP bound holds here too
        if self.incumbent.ticks is None or self.clock.expired():
            return
        low = dataclasses.replace(coarse, coef=coarsen(p.coef, opts.coarsen_tolerance, largest=False)[0])
        clock = Clock(opts.relaxation_after_share * self.clock.remaining(), self.clock.stop)
        sub = _Phases(low, clock, workers=self.workers, seed=self.seed, deterministic=self.deterministic,
                      coarse=True)
        sub.build_master(ub=self.incumbent.ticks)  # the real optimum's image has every chain within it
        if isinstance(sub.master, LayoutMaster):
            sub.relax(sub.master, 1.0)
            self.coarse_bound = max(self.coarse_bound, min(sub.relaxation.bound, self.incumbent.ticks))
            self.proven(self.lower_bound())

    def use(self, master: Master) -> None:
        self.master = master
        self.incumbent.attach(master)

    def local_search(self, master: LayoutMaster) -> None:
        """Phase 5: iterated local search over the layouts (a share of the time left)."""
        if self.incumbent.counts is None or self.clock.expired():
            return
        search = LocalSearch(self.problem, self.incumbent, master.layouts, clock=self.clock, seed=self.seed,
                             deterministic=self.deterministic)
        search.run(until=self.clock.until(self.options.local_search_share))

    def relax(self, master: LayoutMaster, share: float, seconds: float | None = None) -> None:
        """Phase 4 (and again after the local search): the LP relaxation's proven bound, for a
        ``share`` of the time left (and at most ``seconds``); the paths it adds join the pool
        and the master."""
        if self.clock.expired():
            return
        p, opts = self.problem, self.options
        if self.lp is None:
            self.lp = LinearRelaxation(p.coef, p.paths, master.layouts, p.comm_ticks, max_dp_states=opts.max_dp_states)
            for d in range(p.program.stages):
                self.lp.add(p.paths.device_sig[d], 0)
        for sig, crossings in self.incumbent.paths.values():
            self.lp.add(sig, crossings)
        iterations = opts.max_relaxation_iterations
        if self.deterministic:  # counted, not timed: the same paths every run
            iterations = max(1, int(opts.deterministic_relaxation_iterations_per_second * self.clock.limit * share))
        known = len(self.relaxation.cuts)
        self.relaxation = self.lp.run(
            until=self.clock.deadline if self.deterministic else min(
                self.clock.until(share), self.clock.now() + (math.inf if seconds is None else seconds)),
            stopped=lambda: self.clock.stopped, max_iterations=iterations,
        )
        for sig, crossings in self.relaxation.cuts[known:]:
            self.incumbent.paths.setdefault(_key(sig, crossings), (sig, crossings))
            master.add_cut(sig, crossings)
        self.proven(self.lower_bound())

    def minimise_step(self) -> tuple[str, int]:
        """Phase 6: the step time. Returns (status, lower bound in ticks).

        Each master solve is capped (at first ``master_cap_share`` of the time limit, doubled
        whenever a capped solve brings no new path), so that on hard instances many rounds of
        paths reach the master instead of one long solve on a stale path set.
        """
        inc = self.incumbent
        lower = self.lower_bound()
        if inc.ticks is not None:
            lower = min(lower, inc.ticks)
        self.proven(lower)
        m = self.master
        if m is None:
            return ("feasible" if inc.ticks is not None else "unknown"), lower
        m.model.minimize(m.z)
        cap = max(1.0, self.options.master_cap_share * self.clock.limit)
        while True:
            if inc.ticks is not None and inc.ticks <= lower:
                return "optimal", inc.ticks
            if self.clock.expired():
                return ("feasible" if inc.ticks is not None else "unknown"), lower
            if inc.ticks is not None:
                m.set_domain(m.z, lower, inc.ticks - 1)
            m.hint(inc.counts)
            cuts_before, ticks_before, lower_before, started = len(m.cuts), inc.ticks, lower, self.clock.now()
            solved = self.solve_master(cap)
            self.offer_all(solved.solutions)
            learned = len(m.cuts) > cuts_before  # the solve's own paths (the tree's, added below, do not count)
            if solved.status == "infeasible":
                # nothing beats the incumbent (or, without one, nothing fits)
                if inc.ticks is None:
                    return "infeasible", 0
                lower = inc.ticks
            elif solved.status == "optimal":
                lower = max(lower, int(round(solved.objective)))
            elif solved.bound is not None and math.isfinite(solved.bound):
                lower = max(lower, int(math.ceil(solved.bound - 1e-9)))
            self.proven(lower)
            self.rates.master(lower - lower_before, self.clock.now() - started,
                              bounded=solved.bound is not None and math.isfinite(solved.bound) and solved.bound > 0)
            if inc.ticks is not None and inc.ticks <= lower:
                return "optimal", inc.ticks
            stalled = inc.ticks is not None and inc.ticks == ticks_before
            if stalled and lower - lower_before < STALL_FRACTION * inc.ticks:
                # neither the plan nor the master's bound moved: the bound work may have time
                lower = max(lower, self.raise_bound(self.clock.now() - started))
                if inc.ticks <= lower:
                    return "optimal", inc.ticks
            if solved.status in ("feasible", "unknown") and not learned:
                cap *= 2  # the cap cut the solve short and taught nothing new: give it longer

    def raise_bound(self, solve_seconds: float) -> int:
        """Phase 6, between master solves that moved neither the plan nor (by ``STALL_FRACTION``)
        the bound: the branch and bound on device totals (:mod:`sapptk.solver.totals_bound`)
        for ``totals_share / (1 − totals_share)`` times ``solve_seconds`` (less while it raises
        the bound more slowly per second than the master: :class:`BoundRates`), on schedules with two
        or more chunks per device (one-chunk masters close on their own), when the
        relaxation's LP is there. Returns the best proven bound (ticks)."""
        share, inc = self.options.totals_share, self.incumbent
        if (share <= 0 or self.deterministic or self.lp is None or inc.ticks is None
                or self.problem.config.chunks < 2 or self.clock.expired()):
            return self.lower_bound()
        if self.totals is None:
            self.totals = TotalsBound(self.lp, lp_iterations=self.options.totals_lp_iterations,
                                      evaluation_bytes=self.options.evaluation_bytes)
            self.totals.add_weights(self.lp.last_duals)
        began = self.clock.now()
        before = max(self.lower_bound(), self.bounds[-1][1] if self.bounds else 0)  # the proven bound so far
        until = min(self.clock.deadline, began + self.rates.tree_seconds(solve_seconds, share))
        known = len(self.lp.out.cuts)
        found = self.totals.run(cutoff=inc.ticks, until=until, stopped=lambda: self.clock.stopped)
        self.totals_bound = max(self.totals_bound, min(found.bound, inc.ticks))
        self.rates.tree(min(self.totals_bound, inc.ticks) - before, self.clock.now() - began)
        assert self.master is not None
        if self.clock.expired():  # no master solve follows: adding hundreds of cuts would only run past the limit
            return self.proven(self.lower_bound())
        for sig, crossings in self.lp.out.cuts[known:]:  # the paths its LPs added join the master
            self.incumbent.paths.setdefault(_key(sig, crossings), (sig, crossings))
            self.master.add_cut(sig, crossings)
        return self.proven(self.lower_bound())

    def tie_breaks(self) -> None:
        """Phase 7: least recompute overhead, then smallest deviation from the even split, at the optimum."""
        m, inc = self.master, self.incumbent
        assert m is not None and inc.ticks is not None
        m.set_domain(m.z, inc.ticks, inc.ticks)
        # a share of the time left for the first (all of it when deterministic: reproducible)
        first = self.clock.deadline if self.deterministic else self.clock.until(self.options.tie_break_share)
        if not self._minimise(m.overhead_var, self.problem.overhead, first):
            self.notes.append("the least recompute overhead at this step time was not proven in time")
        elif not self._minimise(m.deviation_var, self.problem.deviation, self.clock.deadline):
            self.notes.append("the smallest deviation from the even split was not proven in time")

    def _minimise(self, var, value: Callable[[np.ndarray], int], until: float) -> bool:  # noqa: ANN001
        """Minimise ``var`` (``value(counts)`` computes it exactly) with the step time held at the
        incumbent's, until ``until``. True when its least value is proven."""
        m, inc = self.master, self.incumbent
        assert m is not None and inc.counts is not None and inc.ticks is not None
        cap_ticks = inc.ticks
        m.model.minimize(var)
        best_v = value(inc.counts)
        while self.clock.now() < until and not self.clock.expired():
            if best_v <= 0:  # both tie-break objectives are >= 0
                m.set_domain(var, 0, 0)
                return True
            m.set_domain(var, 0, best_v - 1)
            m.hint(inc.counts)
            solved = self.solve_master(None if self.deterministic else until - self.clock.now())
            steps = self.incumbent.evaluate(solved.solutions, cap=cap_ticks)
            for counts, ticks in zip(solved.solutions, steps, strict=True):
                v = value(counts)
                if ticks <= cap_ticks and v < best_v:
                    inc.counts, best_v = counts, v
            if solved.status == "infeasible":
                m.set_domain(var, best_v, best_v)
                return True
            if solved.status == "unknown":
                break
        m.set_domain(var, 0, best_v)
        return False

    def result(self, status: str, lower: int | None, *, layouts: int = 0) -> SearchResult:
        inc, p = self.incumbent, self.problem
        res = SearchResult(status=status, ticks_ms=p.ticks_ms, layouts=layouts, iterations=self.iterations,
                           cuts=len(self.master.cuts) if self.master is not None else 0,
                           first_plan_seconds=self.first_plan_at, stopped=self.clock.stopped)
        res.notes = list(self.notes)
        res.history = _history(inc.trace, self.bounds)
        if status in ("optimal", "feasible") and inc.counts is not None:
            res.counts, res.step_ticks = inc.counts, inc.ticks
            res.bound_ticks = min(lower if lower is not None else 0, inc.ticks)
            res.overhead, res.deviation = p.overhead(inc.counts), p.deviation(inc.counts)
        return res


def _history(
    steps: list[tuple[float, int]], bounds: list[tuple[float, int]]
) -> list[tuple[float, int | None, int | None]]:
    """Both traces merged in time: (seconds, best step so far, best bound so far)."""
    events = sorted([(t, 0, v) for t, v in steps] + [(t, 1, v) for t, v in bounds])
    step: int | None = None
    bound: int | None = None
    out: list[tuple[float, int | None, int | None]] = []
    for t, kind, v in events:
        if kind == 0:
            step = v
        else:
            bound = v
        out.append((t, step, None if bound is None else (bound if step is None else min(bound, step))))
    return out


def _key(sig: np.ndarray, crossings: int) -> bytes:
    from sapptk.solver.paths import path_key

    return path_key(sig, crossings)


def even_starts(profile: Profile, config: PipelineConfig) -> list[tuple[str, np.ndarray]]:
    """Every distinct even split (:func:`sapptk.baselines.even_counts`) as ``(mode, counts)``, the
    profile's own groups: the starts of the search and of the offload phase."""
    from sapptk.baselines import distinct_recomputes, even_counts

    return [(mode, even_counts(profile, config, mode)) for mode in distinct_recomputes(profile, config)]


def _even_split_counts(problem: Problem) -> list[np.ndarray]:
    """Every distinct even split (:func:`even_starts`), merged groups."""
    out: list[np.ndarray] = []
    for _, split in even_starts(problem.profile, problem.config):
        counts = problem.groups.merge(split)
        if not any(np.array_equal(counts, c) for c in out):
            out.append(counts)
    return out


def _work_bound(problem: Problem) -> int:
    """A bound any plan meets: some device works at least the average of all the work, each
    layer in its cheapest allowed mode, wherever it is placed."""
    coef, paths = problem.coef, problem.paths
    V = problem.num_virtual_stages
    ops = paths.unit_sig.sum(axis=0)  # ops of each (class, vs)
    f_ops, b_ops, w_ops = ops[:V], ops[V : 2 * V], ops[2 * V :]
    fixed = int(f_ops @ coef.fixed_forward + b_ops @ coef.fixed_backward + w_ops @ coef.fixed_weight)
    cheapest_b = np.where(coef.allowed, coef.backward, np.iinfo(np.int64).max).min(axis=1)
    body = 0
    for g in range(len(coef.counts)):
        # a layer costs the fewest ops of any stage, whichever stage it is on
        per_stage = f_ops * int(coef.forward[g]) + b_ops * int(cheapest_b[g]) + w_ops * int(coef.weight[g])
        body += int(coef.counts[g]) * int(per_stage.min())
    return (fixed + body) // problem.program.stages

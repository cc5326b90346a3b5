"""The branch and bound on device totals: its node bounds equal brute force, and its bound
never exceeds the exhaustive optimum on hundreds of random small two-chunk cases."""

from __future__ import annotations

import contextlib
import itertools
import time
from unittest import mock

import numpy as np
import pytest
from ortools.linear_solver import pywraplp
from support import all_assignments, fast_step, seed_of

from sapptk.config import PipelineConfig
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS
from sapptk.errors import ConfigError
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.solver import relaxation
from sapptk.solver.layouts import device_layouts, path_lengths, stage_options
from sapptk.solver.problem import make_problem
from sapptk.solver.relaxation import LinearRelaxation
from sapptk.solver.settings import SearchOptions
from sapptk.solver.totals_bound import BoundRates, TotalsBound

TWO_CHUNK = [("interleaved", 2, 3), ("interleaved", 2, 4), ("interleaved-lm", 2, 4), ("zb-v", 2, 3),
             ("dualpipe-v", 2, 4)]
# three devices: the tree branches on two free totals (with two devices the second total is the rest)
THREE_DEVICES = [("interleaved", 3, 3), ("interleaved-lm", 3, 3), ("zb-v", 3, 3)]


def random_profile(rng: np.random.Generator, layers: tuple[int, int] = (2, 5), groups: int = 2) -> Profile:
    """Head, one to ``groups`` body groups of ``layers`` (low, high + 1) layers with two modes
    (none, full), tail; random figures."""
    body = []
    for g in range(int(rng.integers(1, groups + 1))):
        fwd = float(rng.uniform(0.5, 3.0))
        act = float(rng.uniform(3, 9))
        modes = {"none": ModeCost(float(rng.uniform(1.5, 2.5)) * fwd, act),
                 "full": ModeCost(float(rng.uniform(2.6, 3.5)) * fwd, float(rng.uniform(0.05, 0.5)) * act)}
        body.append(LayerGroup(f"g{g}", "body", int(rng.integers(*layers)), fwd, float(rng.uniform(0.5, 4)), modes))
    head = LayerGroup("head", "head", 1, float(rng.uniform(0.1, 1)), float(rng.uniform(0.5, 3)))
    tail = LayerGroup("tail", "tail", 1, float(rng.uniform(0.1, 2)), float(rng.uniform(0.5, 3)))
    return Profile("random-two-mode", (head, *body, tail))


def random_case(rng: np.random.Generator, setups: list | None = None, layers: tuple[int, int] = (2, 5)):
    """A random two-chunk case (a setup of ``setups``, default ``TWO_CHUNK``) with a binding
    budget: its problem, layouts, the LP over them,
    the exhaustive optimum (ticks), every fitting plan's step (ticks) and the fastest plan.

    Every assignment is enumerated; peaks and steps are computed in batches by the solver's
    exact yardsticks (the simulator's equality with them is tested elsewhere, and the fast
    cases check it again on the fastest plan)."""
    setups = TWO_CHUNK if setups is None else setups
    schedule, p, m = setups[int(rng.integers(len(setups)))]
    prof = random_profile(rng, layers, 2 if p == 2 else 1)  # three devices: one group (enumeration stays small)
    base = PipelineConfig(p, m, 2, schedule, comm=float(rng.choice([0.0, 0.01, 0.2])))
    unlimited = make_problem(prof, base, allow_empty=False, options=SearchOptions())
    candidates = [unlimited.groups.merge(c)
                  for c in all_assignments(prof, base, (MODES.index("none"), MODES.index("full")))]
    peaks = np.array([unlimited.peaks(c).max() for c in candidates]) / unlimited.memory.scale * MEMORY_UNIT_MB
    budget = float(np.quantile(peaks, float(rng.uniform(0.05, 1.0))))
    cfg = base.replace(memory_budget=budget)
    problem = make_problem(prof, cfg, allow_empty=False, options=SearchOptions())
    fitting = [c for c in candidates if problem.fits(c)]
    steps = problem.step_ticks(problem.cost_vectors(fitting))
    best = int(steps.min())
    coef = problem.coef
    layouts = device_layouts(coef, problem.program, stage_options(coef, coef.counts), ub=None,
                             budget=problem.budget, allow_empty=False)
    lp = LinearRelaxation(coef, problem.paths, layouts, problem.comm_ticks)
    for d in range(problem.program.stages):
        lp.add(problem.paths.device_sig[d], 0)
    return problem, layouts, lp, best, steps, fitting[int(steps.argmin())]


def check_never_above_the_optimum(seed: int, setups: list | None = None, layers: tuple[int, int] = (2, 5),
                                  failing: bool = False) -> tuple[int, int]:
    """The tree's bound (no cutoff, then a cutoff at some plan's step) against the exhaustive
    optimum of one random case; ``failing``: the LP solver gives up on every other node LP."""
    rng = np.random.default_rng(seed)
    problem, _, lp, best, steps, _ = random_case(rng, setups, layers)
    lp.run(until=time.perf_counter() + 10, max_iterations=int(rng.integers(1, 6)))  # often not converged
    tree = TotalsBound(lp, lp_iterations=int(rng.integers(1, 4)))
    tree.add_weights(lp.last_duals)
    # no cutoff worth the name: the tree must stay under the optimum on its own
    far = 2**60
    with _failing_lps(failing):
        found = tree.run(cutoff=far, until=time.perf_counter() + 10)
    assert found.bound <= best, (seed, found.bound, best)
    # with a cutoff at some plan's step (never below the optimum) the bound is capped there
    cutoff = int(rng.choice(steps))
    again = TotalsBound(lp, lp_iterations=2)
    again.add_weights(lp.last_duals)
    with _failing_lps(failing):
        capped = again.run(cutoff=cutoff, until=time.perf_counter() + 10)
    assert capped.bound <= min(best, cutoff) or capped.bound <= best
    return found.bound, best


@contextlib.contextmanager
def _failing_lps(on: bool):
    """While ``on``: every other LP solve returns ABNORMAL at once (GLOP giving up), as seen
    under load; a node whose LP fails must be split without it, never retried forever."""
    if not on:
        yield
        return
    calls = itertools.count()

    def flaky(solver, stopped):  # noqa: ANN001, ANN202
        return pywraplp.Solver.ABNORMAL if next(calls) % 2 == 0 else original(solver, stopped)

    original = relaxation._solve
    with mock.patch.object(relaxation, "_solve", flaky):
        yield


@pytest.mark.parametrize("case", range(6))
def test_bound_never_exceeds_the_exhaustive_optimum(case):
    check_never_above_the_optimum(seed_of("totals-bound", case))


@pytest.mark.parametrize("case", range(3))
def test_the_oracle_is_the_simulator(case):
    """The exhaustive optimum of the random cases is the simulator's step time of the fastest plan."""
    problem, _, _, best, _, fastest = random_case(np.random.default_rng(seed_of("totals-bound", case)))
    simulated = fast_step(problem.config, problem.profile, problem.groups.spread(fastest))
    assert best == round(simulated / TIME_UNIT_MS * problem.program.splits)


@pytest.mark.slow
def test_bound_never_exceeds_the_exhaustive_optimum_on_hundreds_of_cases():
    tight = 0
    for case in range(200):
        bound, best = check_never_above_the_optimum(seed_of("totals-bound-many", case))
        tight += bound == best
    assert tight > 0  # the tree closes some cases exactly: the test can tell a weak bound from none


@pytest.mark.parametrize("case", range(3))
def test_bound_never_exceeds_the_exhaustive_optimum_on_three_devices(case):
    check_never_above_the_optimum(seed_of("totals-bound-3", case), THREE_DEVICES, (5, 7))


@pytest.mark.slow
def test_bound_never_exceeds_the_exhaustive_optimum_on_hundreds_of_three_device_cases():
    tight = 0
    for case in range(150):
        bound, best = check_never_above_the_optimum(seed_of("totals-bound-3-many", case), THREE_DEVICES, (5, 7))
        tight += bound == best
    assert tight > 0


@pytest.mark.parametrize("case", range(4))
def test_a_node_whose_lp_fails_is_split_and_the_bound_stays_valid(case):
    check_never_above_the_optimum(seed_of("totals-bound-failing", case), THREE_DEVICES, (5, 7), failing=True)


@pytest.mark.slow
def test_failing_lps_on_hundreds_of_cases():
    for case in range(100):
        setups, layers = (THREE_DEVICES, (5, 7)) if case % 2 else (TWO_CHUNK, (2, 5))
        check_never_above_the_optimum(seed_of("totals-bound-failing-many", case), setups, layers, failing=True)


def test_failed_lps_do_not_stall_the_tree():
    """Every node LP fails: the tree still splits (by the widest range) down to boxes that cannot
    be split, and stops there, instead of retrying one node until the time is up."""
    rng = np.random.default_rng(seed_of("totals-all-fail"))
    problem, _, lp, best, _, _ = random_case(rng, THREE_DEVICES, (6, 7))
    lp.run(until=time.perf_counter() + 10)
    tree = TotalsBound(lp, lp_iterations=2)
    tree.add_weights(lp.last_duals)
    with mock.patch.object(relaxation, "_solve", lambda solver, stopped: pywraplp.Solver.ABNORMAL):
        found = tree.run(cutoff=2**60, until=time.perf_counter() + 120)
    assert found.failed > 0 and found.bound <= best
    # the run ended on its own: the least open node cannot be split further (before the fix the
    # same node was retried until the deadline)
    assert tree.heap and tree.heap[0].final and found.seconds < 120


def test_bound_rates_size_the_tree_slices():
    """Hand-worked: share 0.8 gives four times the solve (the whole); an unmeasured tree gets the
    probe (a quarter) unless the master returned a bound and raised nothing; then the ratio of
    the rates, never below the floor."""
    rates = BoundRates()
    assert rates.tree_seconds(2.0, 0.0) == 0.0
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(2.0)  # nothing known: the probe
    rates.master(0, 5.0, bounded=False)  # cut short without a bound: still the probe
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(2.0)
    stuck = BoundRates()
    stuck.master(0, 5.0, bounded=True)  # a bound of its own that raised nothing: the whole
    assert stuck.tree_seconds(2.0, 0.8) == pytest.approx(8.0)
    rates.master(1000, 5.0, bounded=True)  # 1000 ticks in 10 s: 100 per second
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(2.0)
    rates.tree(250, 5.0)  # 50 per second: half the master's rate
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(4.0)
    rates.tree(-7, 5.0)  # a slice that gained nothing (a loss counts as none): 25 per second
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(2.0)
    rates.tree(0, 100.0)  # a long fruitless stretch: the floor
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(0.8)
    rates.tree(100_000, 1.0)  # faster than the master again: the whole
    assert rates.tree_seconds(2.0, 0.8) == pytest.approx(8.0)
    lone = BoundRates()
    lone.tree(10, 1.0)  # the master never raised anything: the tree keeps the whole
    assert lone.tree_seconds(2.0, 0.8) == pytest.approx(8.0)


@pytest.mark.slow
def test_box_bounds_equal_brute_force():
    """For every weight vector in the bundle and every box, the dynamic program is the minimum over
    every choice of one layout per device with totals in the box and the groups adding up
    (brute force over every pair of layouts)."""
    rng = np.random.default_rng(seed_of("totals-box"))
    checked = 0
    for _ in range(6):
        _, layouts, lp, _, _, _ = random_case(rng)
        lp.run(until=time.perf_counter() + 10, max_iterations=3)
        tree = TotalsBound(lp)
        for _ in range(3):
            tree.add_weights(rng.uniform(0, 1, size=len(lp.rows)))
        sigs = np.stack(lp.sigs)
        lengths = path_lengths(layouts, sigs)
        totals = [lay.comp.sum(axis=1) for lay in layouts]  # (k, G)
        counts = tree.counts
        for _ in range(4):
            lo = np.array([int(rng.integers(t.sum(axis=1).min(), t.sum(axis=1).max() + 1)) for t in totals])
            hi = np.array([int(rng.integers(lo[d], totals[d].sum(axis=1).max() + 1)) for d in range(len(lo))])
            got = tree.box_bounds(lo, hi)
            assert len(layouts) == 2  # every case has two devices: all pairs at once
            t0, t1 = totals[0], totals[1]
            ok = ((t0.sum(axis=1)[:, None] >= lo[0]) & (t0.sum(axis=1)[:, None] <= hi[0])
                  & (t1.sum(axis=1)[None, :] >= lo[1]) & (t1.sum(axis=1)[None, :] <= hi[1])
                  & np.all(t0[:, None, :] + t1[None, :, :] == counts, axis=2))
            values = (np.einsum("wp,pa->wa", tree.weights, lengths[0])[:, :, None]
                      + np.einsum("wp,pb->wb", tree.weights, lengths[1])[:, None, :] + tree.consts[:, None, None])
            want = np.where(ok[None], values, np.inf).min(axis=(1, 2))
            np.testing.assert_allclose(got, want, rtol=1e-9)
            checked += 1
    assert checked


@pytest.mark.slow
def test_the_tree_moves_the_bound_past_the_relaxation_on_a_case_it_averages():
    """On a case where the relaxation averages device totals, the tree ends strictly higher
    than the converged LP's bound and no higher than the exhaustive optimum."""
    rng = np.random.default_rng(seed_of("totals-above-lp"))
    for _ in range(40):
        problem, _, lp, best, _, _ = random_case(rng)
        relaxed = lp.run(until=time.perf_counter() + 10)
        tree = TotalsBound(lp, lp_iterations=20)
        tree.add_weights(lp.last_duals)
        found = tree.run(cutoff=best, until=time.perf_counter() + 10)
        assert found.bound <= best
        if relaxed.converged and found.bound > relaxed.bound:
            return
    pytest.fail("no random case where the tree beats the relaxation")


def test_search_phase_raises_a_valid_bound():
    """Phase 6's bound work (``_Phases.raise_bound``) on small two-chunk cases: the tree runs,
    and the bound it records stays at or under the exhaustive optimum."""
    from sapptk.solver.clock import Clock
    from sapptk.solver.search import _Phases

    rng = np.random.default_rng(seed_of("totals-phase"))
    for _ in range(4):
        problem, _, _, best, _, _ = random_case(rng)
        phases = _Phases(problem, Clock(30.0), workers=1, seed=0, deterministic=False)
        phases.seed_incumbents(None)
        if phases.incumbent.counts is None:
            phases.first_plan()
        phases.build_master()
        phases.relax(phases.master, 1.0)
        lower = phases.raise_bound(0.5)
        assert phases.totals is not None
        assert phases.totals_bound <= best and lower <= best


def test_options_of_the_tree_are_checked():
    assert SearchOptions(totals_share=0).totals_share == 0
    for bad in (0.95, -0.1, float("nan"), True):
        with pytest.raises(ConfigError, match="totals_share"):
            SearchOptions(totals_share=bad)
    with pytest.raises(ConfigError, match="totals_lp_iterations"):
        SearchOptions(totals_lp_iterations=0)


@pytest.mark.parametrize("case", range(8))
def test_pruning_keeps_every_layout_of_a_faster_plan(case):
    """``TotalsBound.prune(cutoff)`` drops only layouts no plan faster than the cutoff uses:
    for every fitting plan faster than the cutoff, the layout each device takes for it (its
    composition, no longer backwards) is kept; with the cutoff just above the optimum some
    layouts go (the test can tell pruning from none)."""
    rng = np.random.default_rng(seed_of("totals-prune", case))
    problem, layouts, lp, best, steps, _ = random_case(rng)
    fitting = [c for c in _fitting_plans(problem)]
    lp.run(until=time.perf_counter() + 10, max_iterations=2)
    for cutoff in (int(np.quantile(steps, 0.3)) + 1, best + 1):
        tree = TotalsBound(lp)
        left = tree.prune(cutoff)
        assert left == sum(int(a.sum()) for a in tree.alive)
        for counts, step in zip(fitting, steps, strict=True):
            if step >= cutoff:
                continue
            for d, lay in enumerate(layouts):
                o = lay.find(problem.coef, counts)
                assert o is not None and tree.alive[d][o], (case, cutoff, d)
    # just above the optimum, layouts of slower plans go
    assert left < sum(len(lay) for lay in layouts)


def _fitting_plans(problem) -> list[np.ndarray]:  # noqa: ANN001
    """Every fitting plan of a random case, in the order of ``random_case``'s ``steps``."""
    prof, cfg = problem.profile, problem.config
    unlimited = make_problem(prof, cfg.replace(memory_budget=None), allow_empty=False, options=SearchOptions())
    candidates = [unlimited.groups.merge(c)
                  for c in all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full")))]
    return [c for c in candidates if problem.fits(c)]


@pytest.mark.parametrize("case", range(4))
def test_the_lp_durations_are_the_layouts_average(case):
    """The LP names each op's duration once (a variable per virtual stage and kind, defined by its
    device's layouts): at a converged LP its value is the longest path under the durations
    averaged from the layouts' own weights ``y``, recomputed here without those variables."""
    rng = np.random.default_rng(seed_of("lp-durations", case))
    problem, layouts, lp, best, _, _ = random_case(rng)
    relaxed = lp.run(until=time.perf_counter() + 10)
    assert relaxed.converged and relaxed.lp <= best * (1 + 1e-9)
    nvs = problem.paths.nvs
    cost = np.zeros(3 * nvs)
    for d, lay in enumerate(layouts):
        y = np.array([v.solution_value() for v in lp.y[d]])
        st = np.asarray(lay.stages)
        cost[st] += y @ lay.forward
        cost[nvs + st] += y @ lay.backward
        cost[2 * nvs + st] += y @ lay.weight
    step, _ = problem.paths.longest(cost[None, :], problem.coef.comm)
    assert float(step[0]) == pytest.approx(relaxed.lp, rel=1e-6)


def test_pruning_stops_at_its_deadline():
    """A prune out of time drops nothing more (what it dropped stays valid) and is not repeated
    for the same cutoff; a lower cutoff prunes again."""
    rng = np.random.default_rng(seed_of("totals-prune", 0))
    _, layouts, lp, best, _, _ = random_case(rng)
    lp.run(until=time.perf_counter() + 10, max_iterations=2)
    tree = TotalsBound(lp)
    everything = sum(len(lay) for lay in layouts)
    assert tree.prune(best + 1, until=0.0) == everything  # out of time before the first batch
    assert tree.prune(best + 1) == everything  # the same cutoff: not repeated
    assert tree.prune(best) < everything  # a lower one: pruned (nothing reaches below the optimum)

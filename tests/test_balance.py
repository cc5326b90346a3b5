"""The balancer against the simulator: predictions equal simulations, optima equal exhaustive
search, infeasibility is explained, bad setups fail before solving, answers are reproducible."""

from __future__ import annotations

import re

import numpy as np
import pytest
from support import (
    EXHAUSTIVE,
    all_assignments,
    config_for,
    fast_step,
    peaks_mb,
    random_counts,
    seed_of,
    small_profile,
    two_mode_profile,
)

import sapptk.solver.search as search_module
from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, layer_coefficients, simulate_counts
from sapptk.errors import ConfigError
from sapptk.plan import load_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import names
from sapptk.solver.paths import path_model, stage_cost_vector
from sapptk.solver.search import search
from sapptk.solver.settings import SearchOptions


# ------------------------------------------------------------ prediction = simulation
@pytest.mark.slow
@pytest.mark.parametrize("schedule", names())
def test_prediction_equals_simulation_on_random_problems(schedule):
    """Every schedule, random two-group profiles, random budgets (some too small)."""
    rng = np.random.default_rng(seed_of("prediction", schedule))
    for trial in range(2):
        prof = small_profile(rng)
        cfg = config_for(schedule, rng, comm=float(rng.choice([0.0, 0.05])))
        samples = [peaks_mb(cfg, prof, random_counts(rng, prof, cfg)).max() for _ in range(8)]
        budget = float(rng.uniform(0.6, 1.1) * np.median(samples))
        cfg = cfg.replace(memory_budget=budget)
        res = search(prof, cfg, time_limit=20, deterministic=True)
        assert res.status in ("optimal", "infeasible"), (schedule, trial, res.message)
        if res.status == "infeasible":
            assert "device" in res.message and "MB" in res.message
            continue
        sim = simulate_counts(prof, cfg, res.counts)
        assert res.step_time == pytest.approx(sim.step_time, abs=1e-6)
        assert (sim.peak_memory.to_numpy() <= budget + 1e-6).all()
        assert np.allclose(peaks_mb(cfg, prof, res.counts), sim.peak_memory.to_numpy(), atol=1e-6)
        assert res.gap == 0.0 and res.bound == pytest.approx(res.step_time)


@pytest.mark.parametrize("schedule", names())
def test_batched_step_times_equal_the_simulator(schedule):
    """PathModel.steps (the local search's evaluator, no paths) is the simulator's step time."""
    rng = np.random.default_rng(seed_of("batched", schedule))
    prof = small_profile(rng)
    cfg = config_for(schedule, rng, comm=float(rng.choice([0.0, 0.05])))
    coef = layer_coefficients(prof, cfg)
    program = cfg.program()
    paths = path_model(program)
    counts = [random_counts(rng, prof, cfg) for _ in range(6)]
    costs = np.stack([stage_cost_vector(coef, c) for c in counts])
    steps = paths.steps(costs, coef.comm)
    assert steps.tolist() == paths.longest(costs, coef.comm)[0].tolist()
    ticks_ms = TIME_UNIT_MS / program.splits
    for c, st in zip(counts, steps.tolist(), strict=True):
        assert st * ticks_ms == pytest.approx(simulate_counts(prof, cfg, c).step_time, abs=1e-6)


def test_balance_returns_a_plan_the_simulator_agrees_with():
    rng = np.random.default_rng(3)
    prof = small_profile(rng)
    cfg = PipelineConfig(3, 6, 2, "interleaved", comm=0.02)
    plan = balance(prof, cfg, time_limit=20, deterministic=True)
    assert plan.status == "optimal" and plan.source == "balance"
    assert plan.step_time == pytest.approx(plan.simulate().step_time, abs=1e-6)
    assert plan.gap == 0.0 and plan.solve_seconds > 0 and "optimal" in plan.message


# ------------------------------------------------------------------ exhaustive search
@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "p", "m", "v", "k"), EXHAUSTIVE, ids=[e[0] for e in EXHAUSTIVE])
def test_optimum_equals_exhaustive_search(schedule, p, m, v, k):
    if schedule not in names():
        pytest.skip(f"{schedule} is not registered")
    prof = two_mode_profile((3, 5))
    base = PipelineConfig(p, m, v, schedule, splits=k, comm=0.01)
    candidates = list(all_assignments(prof, base, (MODES.index("none"), MODES.index("full"))))
    peaks = np.array([peaks_mb(base, prof, c).max() for c in candidates])
    budget = float(np.quantile(peaks, 0.3))  # memory binds: most assignments do not fit
    cfg = base.replace(memory_budget=budget)
    steps = np.array([fast_step(cfg, prof, c) if pk <= budget + 1e-9 else np.inf for c, pk in zip(candidates, peaks,
                                                                                                  strict=True)])
    best = steps.min()
    res = search(prof, cfg, time_limit=30, deterministic=True)
    assert res.status == "optimal", res.message
    assert res.step_time == pytest.approx(best, abs=1e-6)
    assert simulate_counts(prof, cfg, res.counts).step_time == pytest.approx(best, abs=1e-6)
    assert peaks_mb(cfg, prof, res.counts).max() <= budget + 1e-9
    # the tie-break: among the optimal assignments, the least recompute overhead
    coef = layer_coefficients(prof, cfg)
    ties = [c for c, s in zip(candidates, steps, strict=True) if abs(s - best) < 1e-9]
    least = min(int(np.einsum("grv,gr->", c, coef.overhead)) for c in ties)
    assert res.overhead == least


# ----------------------------------------------------------------- infeasible / errors
def test_budget_below_any_layout_names_the_device_and_shortfall():
    rng = np.random.default_rng(5)
    prof = small_profile(rng)
    cfg = PipelineConfig(3, 6, 1, "1f1b", memory_budget=1.0)
    plan = balance(prof, cfg, time_limit=10)
    assert plan.status == "infeasible"
    found = re.search(r"device (\d+) needs at least ([\d.]+) MB.*budget is 1 MB, ([\d.]+) MB short", plan.message)
    assert found, plan.message
    device, need, short = int(found[1]), float(found[2]), float(found[3])
    assert 0 <= device < 3 and short == pytest.approx(need - 1.0, abs=1e-3)
    # every layout needs at least that much on that device
    some = random_counts(np.random.default_rng(0), prof, cfg)
    assert peaks_mb(cfg, prof, some)[device] >= need - 1e-6


def test_joint_shortfall_is_explained_with_the_least_possible_peak():
    prof = two_mode_profile((3, 5))
    base = PipelineConfig(3, 4, 1, "1f1b")
    least = min(peaks_mb(base, prof, c).max()
                for c in all_assignments(prof, base, (MODES.index("none"), MODES.index("full"))))
    budget = round(least - 0.5, 3)
    res = search(prof, base.replace(memory_budget=budget), time_limit=20)
    assert res.status == "infeasible"
    assert f"{least:.6g} MB on device" in res.message
    assert f"{least - budget:.6g} MB over the budget" in res.message


@pytest.mark.parametrize(
    "cfg",
    [
        PipelineConfig(4, 2, 1, "1f1b"),  # m < p
        PipelineConfig(2, 4, 1, "no-such-schedule"),
        PipelineConfig(2, 4, 3, "1f1b"),  # 1f1b has one chunk
        PipelineConfig(2, 4, 1, "1f1b", recompute=("half",)),
        PipelineConfig(2, 4, 1, "1f1b", memory_budget=-3),
        PipelineConfig(8, 8, 2, "interleaved"),  # 16 virtual stages, 8 body layers
    ],
)
def test_config_errors_raise_before_solving(cfg, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the solver should not have started")

    monkeypatch.setattr(search_module, "make_problem", boom)
    with pytest.raises(ConfigError):
        balance(two_mode_profile((3, 5)), cfg)


@pytest.mark.slow
def test_deterministic_runs_give_the_same_plan():
    rng = np.random.default_rng(9)
    prof = small_profile(rng, layers=(4, 8))
    cfg = PipelineConfig(3, 6, 2, "interleaved", memory_budget=None)
    a = search(prof, cfg, time_limit=20, deterministic=True)
    b = search(prof, cfg, time_limit=20, deterministic=True)
    assert a.status == b.status == "optimal"
    assert np.array_equal(a.counts, b.counts)


def test_time_units():
    assert TIME_UNIT_MS == 1e-3 and MEMORY_UNIT_MB == 1e-3


@pytest.mark.slow
def test_layer_count_fallback_gives_the_same_optimum(monkeypatch):
    """When enumeration is too large the layer-count master takes over; same optimum."""
    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(2, 3, 2, "interleaved", comm=0.01)
    candidates = list(all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full"))))
    peaks = np.array([peaks_mb(cfg, prof, c).max() for c in candidates])
    cfg = cfg.replace(memory_budget=float(np.quantile(peaks, 0.3)))
    reference = search(prof, cfg, time_limit=30, deterministic=True)
    fallback = search(prof, cfg, time_limit=30, deterministic=True, options=SearchOptions(max_partial_layouts=1))
    assert fallback.layouts == 0 and reference.layouts > 0
    assert fallback.status == reference.status == "optimal"
    assert fallback.step_time == pytest.approx(reference.step_time, abs=1e-9)
    assert fallback.overhead == reference.overhead


@pytest.mark.slow
def test_first_plan_when_no_even_split_fits():
    """A budget no even split meets: the layer-count model finds the first plan."""
    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(3, 4, 1, "1f1b")
    from sapptk.plan import even_split

    evens = [even_split(prof, cfg, mode) for mode in ("none", "full")]
    candidates = list(all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full"))))
    feasible = sorted(peaks_mb(cfg, prof, c).max() for c in candidates)
    budget = max(feasible[0], 0.5 * (feasible[0] + min(p.simulation.peak_memory.max() for p in evens)))
    budget = min(budget, min(p.simulation.peak_memory.max() for p in evens) - 1e-3)
    cfg = cfg.replace(memory_budget=budget)
    assert not any(even_split(prof, cfg, mode).fits for mode in ("none", "full"))
    best = min(fast_step(cfg, prof, c) for c in candidates if peaks_mb(cfg, prof, c).max() <= budget + 1e-9)
    res = search(prof, cfg, time_limit=30, deterministic=True)
    assert res.status == "optimal" and res.step_time == pytest.approx(best, abs=1e-6)


def test_a_first_solve_cut_short_is_not_called_infeasible(monkeypatch):
    """Only a proof makes a plan infeasible: a capped solve that ends without an answer
    (as under load) doubles its cap and searches on."""
    from sapptk.plan import even_split
    from sapptk.solver.cpsat import MasterSolve

    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(3, 4, 1, "1f1b")
    strongest = even_split(prof, cfg, "full").simulation.peak_memory.max()
    cfg = cfg.replace(memory_budget=strongest - 1e-3)  # no even split fits
    real = search_module.run_master
    caps: list[float | None] = []

    def first_one_times_out(master, clock, **kw):
        caps.append(kw["time_cap"])
        if len(caps) == 1:
            return MasterSolve("unknown")
        return real(master, clock, **kw)

    monkeypatch.setattr(search_module, "run_master", first_one_times_out)
    res = search(prof, cfg, time_limit=30)
    assert res.status in ("optimal", "feasible"), res.message
    assert caps[1] == pytest.approx(2 * caps[0])


def test_empty_stages_when_allowed():
    prof = two_mode_profile((2, 2))
    cfg = PipelineConfig(4, 4, 2, "interleaved")  # 8 virtual stages, 4 body layers
    with pytest.raises(ConfigError):
        search(prof, cfg)
    res = search(prof, cfg, time_limit=20, allow_empty_stages=True, deterministic=True)
    assert res.status == "optimal"
    assert (res.counts.sum(axis=(0, 1)) == 0).any()
    assert res.step_time == pytest.approx(simulate_counts(prof, cfg, res.counts).step_time, abs=1e-9)


# ------------------------------------------------ cells MindFormers can spell
def select_comm_profile() -> Profile:
    rng = np.random.default_rng(7)
    fwd, act = 1.5, 6.0
    body = LayerGroup("g0", "body", 5, fwd, 2.0, {
        "select": ModeCost(2.1 * fwd, 0.7 * act), "comm": ModeCost(2.3 * fwd, 0.45 * act),
    })
    head = LayerGroup("head", "head", 1, float(rng.uniform(0.2, 0.4)), 2.0)
    tail = LayerGroup("tail", "tail", 1, 1.1, 3.0)
    return Profile("select-comm", (head, body, tail))


@pytest.mark.parametrize("budget_quantile", [0.2, 0.5, 0.9])
def test_no_cell_mixes_select_only_and_comm_only(budget_quantile):
    """MindFormers reads a layer in both select lists as "both": the solver never mixes the
    two in a cell, and its optimum equals exhaustive search over the spellable assignments."""
    prof = select_comm_profile()
    sel, com = MODES.index("select"), MODES.index("comm")
    base = PipelineConfig(2, 4, 1, "1f1b")
    candidates = [c for c in all_assignments(prof, base, (sel, com))
                  if not ((c[:, sel] > 0) & (c[:, com] > 0)).any()]
    peaks = np.array([peaks_mb(base, prof, c).max() for c in candidates])
    cfg = base.replace(memory_budget=float(np.quantile(peaks, budget_quantile)))
    steps = [fast_step(cfg, prof, c) for c, pk in zip(candidates, peaks, strict=True)
             if pk <= cfg.memory_budget + 1e-9]
    plan = balance(prof, cfg, time_limit=20, deterministic=True)
    assert plan.status == "optimal", plan.message
    assert plan.step_time == pytest.approx(min(steps), abs=1e-6)
    assert not ((plan.counts[:, sel] > 0) & (plan.counts[:, com] > 0)).any()
    back = load_plan(plan.export("mindformers").data, "mindformers", profile=prof, config=cfg)
    assert np.array_equal(back.counts, plan.counts)

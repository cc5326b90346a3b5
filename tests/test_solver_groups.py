"""Per-layer profiles: identical groups merged exactly, nearly identical ones coarsened into a
restriction, and profiles with one group per layer (30 and more) balanced, exactly as simulated."""

from __future__ import annotations

import numpy as np
import pytest
from support import peaks_mb, random_counts, small_profile, two_mode_profile

from sapptk.config import PipelineConfig
from sapptk.costs import layer_coefficients, simulate_counts
from sapptk.profile import LayerGroup, ModeCost, Profile
from sapptk.solver.groups import GroupMap, coarsen, merge_groups
from sapptk.solver.paths import memory_model, path_model, stage_cost_vector
from sapptk.solver.search import search


def per_layer(profile: Profile, jitter: float = 0.0, rng: np.random.Generator | None = None) -> Profile:
    """One body group per layer; every figure times (1 ± up to ``jitter``)."""

    def j(x: float) -> float:
        return float(x * (1 + rng.uniform(-jitter, jitter))) if jitter else x

    groups = []
    for g in profile.groups:
        if g.kind != "body":
            groups.append(g)
            continue
        for i in range(g.count):
            none = ModeCost(j(g.modes["none"].backward), j(g.modes["none"].activation))
            modes = {"none": none}
            for name, cost in g.modes.items():
                if name != "none":
                    modes[name] = ModeCost(max(j(cost.backward), none.backward), j(cost.activation))
            groups.append(LayerGroup(f"{g.name}_{i}", "body", 1, j(g.forward), j(g.params), modes))
    return Profile(f"{profile.name}_per_layer", tuple(groups))


def test_merge_and_spread_are_inverse(rng):
    prof = small_profile(rng, groups=2, layers=(3, 5))
    split = per_layer(prof)
    cfg = PipelineConfig(2, 4, 2, "interleaved")
    coef = layer_coefficients(split, cfg)
    merged, groups = merge_groups(coef)
    assert len(merged.counts) == 2 and merged.counts.tolist() == [3, 5]
    for _ in range(5):
        counts = random_counts(rng, split, cfg)
        back = groups.spread(groups.merge(counts))
        # the same layers per stage and mode, and a valid assignment (groups in model order)
        assert np.array_equal(groups.merge(back), groups.merge(counts))
        plan_costs = stage_cost_vector(coef, back)
        assert np.array_equal(plan_costs, stage_cost_vector(coef, counts))


def test_spread_places_layers_in_model_order():
    groups = GroupMap(members=((0, 1, 2),), counts=np.array([2, 1, 3]))
    merged = np.zeros((1, 5, 3), dtype=np.int64)
    merged[0, 0, 0] = 1  # stage 0: one layer, mode 0
    merged[0, 4, 0] = 2  # and two in mode 4
    merged[0, 0, 1] = 1
    merged[0, 0, 2] = 2
    out = groups.spread(merged)
    assert out[:, :, 0].tolist()[0] == [1, 0, 0, 0, 1]  # group 0: layer 0 (mode 0), layer 1 (mode 4)
    assert out[1, 4, 0] == 1  # group 1's only layer, mode 4
    assert out[2, 0, 1] == 1 and out[2, 0, 2] == 2


def test_a_coarse_plan_is_no_slower_and_no_larger_than_the_coarse_problem_says(rng):
    prof = per_layer(small_profile(rng, groups=2, layers=(4, 6)), jitter=0.03, rng=rng)
    cfg = PipelineConfig(3, 6, 2, "interleaved", comm=0.01)
    coef = layer_coefficients(prof, cfg)
    coarse, groups = coarsen(coef, 0.1)
    assert len(coarse.counts) < len(coef.counts)
    program = cfg.program()
    paths, mem = path_model(program), memory_model(program)
    for _ in range(10):
        coarse_counts = groups.merge(random_counts(rng, prof, cfg))
        real = groups.spread(coarse_counts)
        fine_cost = stage_cost_vector(coef, real)
        coarse_cost = stage_cost_vector(coarse, coarse_counts)
        assert (fine_cost <= coarse_cost).all()
        steps = paths.steps(np.stack([fine_cost, coarse_cost]), coef.comm)
        assert steps[0] <= steps[1]
        assert (mem.peaks(coef, program, real) <= mem.peaks(coarse, program, coarse_counts)).all()


def test_an_identical_per_layer_profile_has_the_grouped_optimum():
    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(3, 4, 1, "1f1b", comm=0.01)
    grouped = search(prof, cfg, time_limit=20, deterministic=True)
    split = search(per_layer(prof), cfg, time_limit=20, deterministic=True)
    assert grouped.status == split.status == "optimal"
    assert split.step_time == pytest.approx(grouped.step_time, abs=1e-9)
    assert split.counts.shape[0] == 8


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "dualpipe-v"])
def test_forty_distinct_groups_balance_exactly(schedule, rng):
    """One group per layer, no two alike (the layout enumeration used to be exponential in the
    groups a stage spans): a plan within the limit, prediction = simulation, within budget."""
    base = Profile("forty", (
        LayerGroup("head", "head", 1, 0.5, 3.0),
        LayerGroup("body", "body", 40, 1.2, 2.0, {"none": ModeCost(2.4, 6.0), "select": ModeCost(2.6, 4.0),
                                                "full": ModeCost(3.6, 0.5)}),
        LayerGroup("tail", "tail", 1, 1.0, 3.0),
    ))
    prof = per_layer(base, jitter=0.02, rng=rng)
    assert len(prof.body) == 40
    chunks = 1 if schedule == "1f1b" else 2
    cfg = PipelineConfig(4, 8, chunks, schedule, comm=0.01)
    samples = [peaks_mb(cfg, prof, random_counts(rng, prof, cfg)).max() for _ in range(8)]
    cfg = cfg.replace(memory_budget=float(np.median(samples)))
    res = search(prof, cfg, time_limit=4)
    assert res.status in ("optimal", "feasible"), res.message
    sim = simulate_counts(prof, cfg, res.counts)
    assert res.step_time == pytest.approx(sim.step_time, abs=1e-6)
    assert (sim.peak_memory.to_numpy() <= cfg.memory_budget + 1e-6).all()
    assert res.bound is not None and res.bound <= res.step_time + 1e-9


@pytest.mark.slow
def test_the_coarse_relaxation_bound_never_exceeds_the_exhaustive_optimum(rng):
    """Groups merged with their smallest figures: a relaxation, so its LP bound is a bound."""
    import dataclasses
    import time

    from support import all_assignments, fast_step, two_mode_profile

    from sapptk.profile import MODES
    from sapptk.solver.layouts import device_layouts, stage_options
    from sapptk.solver.problem import make_problem
    from sapptk.solver.relaxation import relax
    from sapptk.solver.settings import SearchOptions

    prof = per_layer(two_mode_profile((3, 3)), jitter=0.04, rng=rng)
    base = PipelineConfig(2, 4, 2, "interleaved", comm=0.01)
    candidates = list(all_assignments(prof, base, (MODES.index("none"), MODES.index("full"))))
    peaks = np.array([peaks_mb(base, prof, c).max() for c in candidates])
    cfg = base.replace(memory_budget=float(np.quantile(peaks, 0.4)))
    best = min(fast_step(cfg, prof, c) for c, pk in zip(candidates, peaks, strict=True)
               if pk <= cfg.memory_budget + 1e-9)
    problem = make_problem(prof, cfg, allow_empty=False, options=SearchOptions())
    low, _ = coarsen(problem.coef, 0.1, largest=False)
    assert len(low.counts) < len(problem.coef.counts)
    lowp = dataclasses.replace(problem, coef=low)
    layouts = device_layouts(low, lowp.program, stage_options(low, low.counts), ub=None, budget=lowp.budget,
                             allow_empty=False)
    seeds = [(lowp.paths.device_sig[d], 0) for d in range(lowp.program.stages)]
    res = relax(low, lowp.paths, layouts, lowp.comm_ticks, seeds, until=time.perf_counter() + 30)
    assert res.converged
    assert 0 < res.bound * problem.ticks_ms <= best + 1e-9

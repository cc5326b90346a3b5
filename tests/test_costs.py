"""costs.py and config.py: integer coefficients, stage costs, and the solver's program views
(longest paths and live points) against the simulator."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from support import random_counts, reference_run, reference_through, seed_of, setups, small_profile

from sapptk.config import MAX_PROGRAM_OPS, PipelineConfig, program_ops
from sapptk.costs import (
    MEMORY_UNIT_MB,
    TIME_UNIT_MS,
    WEIGHT_SHARE,
    check_counts,
    layer_coefficients,
    peak_memory,
    simulate_counts,
    stage_costs,
)
from sapptk.errors import ConfigError
from sapptk.plan import even_split
from sapptk.profile import MODES, bundled_profile
from sapptk.schedules import names
from sapptk.simulation import simulate
from sapptk.solver.paths import memory_model, path_model, stage_cost_vector


# --------------------------------------------------------------------- config
def test_config_is_plain_picklable_data_and_caches_its_program():
    cfg = PipelineConfig(4, 8, 2, "interleaved", recompute=["full", "none"])
    assert cfg.recompute == ("none", "full")
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.program() is PipelineConfig(4, 8, 2, "interleaved").program()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"stages": 0, "micro_batches": 4}, "stages = 0"),
        ({"stages": 2.0, "micro_batches": 4}, "stages = 2.0"),
        ({"stages": 4, "micro_batches": 2}, "micro_batches = 2"),
        ({"stages": 4, "micro_batches": 8, "schedule": "nope"}, "unknown schedule"),
        ({"stages": 4, "micro_batches": 8, "chunks": 2}, "chunks = 2"),
        ({"stages": 4, "micro_batches": 8, "splits": 2}, "splits = 2"),
        ({"stages": 4, "micro_batches": 8, "memory_budget": -1}, "memory_budget = -1"),
        ({"stages": 4, "micro_batches": 8, "comm": -0.5}, "comm = -0.5"),
        ({"stages": 4, "micro_batches": 8, "constant_memory": float("nan")}, "constant_memory"),
        ({"stages": 4, "micro_batches": 8, "recompute": ("none", "half")}, "'half'"),
        ({"stages": 4, "micro_batches": 8, "recompute": ()}, "recompute"),
        ({"stages": 4, "micro_batches": 8, "memory_budget": 10**400}, "memory_budget = 1000000000"),
        ({"stages": 4, "micro_batches": 8, "memory_budget": 1e300}, "at most 1e+12"),
        ({"stages": 4, "micro_batches": 8, "comm": 1e30}, "at most 1e+07"),
        ({"stages": 64, "micro_batches": 8192, "chunks": 2, "schedule": "interleaved"},
         "would have 2,097,152 ops, which would need about 42 s and 2.1 GB"),
        ({"stages": 2**40, "micro_batches": 2**40}, "about 10^24 ops, which would need more time and memory"),
    ],
)
def test_config_errors_name_field_and_value(kwargs, needle):
    cfg = PipelineConfig(**kwargs)
    with pytest.raises(ConfigError, match=None) as info:
        cfg.check(bundled_profile("llama2_70b"))
    assert needle in str(info.value)


def test_config_check_against_profile():
    prof = bundled_profile("llama2_70b")  # modes none, select, both, full
    with pytest.raises(ConfigError, match="offers only"):
        PipelineConfig(4, 8, recompute=("comm",)).check(prof)
    with pytest.raises(ConfigError, match="virtual stages"):
        PipelineConfig(64, 64, 2, "interleaved").check(prof)
    PipelineConfig(64, 64, 2, "interleaved").check(prof, allow_empty_stages=True)
    if "dualpipe-v" in names():
        with pytest.raises(ConfigError, match="micro_batches"):
            PipelineConfig(4, 6, 2, "dualpipe-v").check(prof)


def test_program_ops_bounds_every_program():
    for config in setups():
        ops = program_ops(config.schedule, config.stages, config.micro_batches, config.chunks, config.splits)
        kinds = config.program().ops["kind"].value_counts()
        assert kinds["F"] * (3 if config.split_backward else 2) == ops  # one F per slice and virtual stage
        assert len(config.program().ops) <= ops


def test_largest_accepted_program_is_built():
    """At the limit itself the program is accepted (and one op more is not)."""
    config = PipelineConfig(2, MAX_PROGRAM_OPS // 4, schedule="1f1b")  # 2 stages x m x 2 ops = the limit
    config.validate()
    with pytest.raises(ConfigError, match="would have 1,000,004 ops"):
        config.replace(micro_batches=config.micro_batches + 1).validate()


# ---------------------------------------------------------------- magnitudes
def test_sizes_that_could_overflow_are_refused_with_the_figures():
    from sapptk.profile import LayerGroup, ModeCost, Profile

    big = LayerGroup("b", "body", 1_000_000, 1e7, 1e9, {"none": ModeCost(1e7, 1e9)})
    with pytest.raises(ConfigError, match=r"step time could reach 1\.6e\+14 ms \(8 micro-batches × 2e\+13 ms"):
        layer_coefficients(Profile("big", (big,)), PipelineConfig(4, 8))
    heavy = LayerGroup("b", "body", 1_000_000, 1.0, 1e9, {"none": ModeCost(1.0, 1.0)})
    with pytest.raises(ConfigError, match=r"memory could reach 1e\+15 MB \(parameters 1e\+15 MB"):
        layer_coefficients(Profile("heavy", (heavy,)), PipelineConfig(4, 8))
    fine = LayerGroup("b", "body", 1_000, 1e3, 1e5, {"none": ModeCost(2e3, 1e4)})
    assert layer_coefficients(Profile("fine", (fine,)), PipelineConfig(4, 8)).forward[0] == 10**6  # µs


# ---------------------------------------------------------------- coefficients
def test_coefficients_are_integer_units_and_split_backward_keeps_totals():
    prof = bundled_profile("deepseek_v3")
    plain = layer_coefficients(prof, PipelineConfig(4, 8))
    assert plain.forward.dtype.kind == "i" and not plain.weight.any()
    moe = prof.body[1]
    r_full = MODES.index("full")
    assert plain.forward[1] == round(moe.forward / TIME_UNIT_MS)
    assert plain.backward[1, r_full] == round(moe.modes["full"].backward / TIME_UNIT_MS)
    assert plain.activation[1, r_full] == round(moe.modes["full"].activation / MEMORY_UNIT_MB)
    assert plain.overhead[1, r_full] == plain.backward[1, r_full] - plain.backward[1, 0]
    if "zb-h1" in names():
        split = layer_coefficients(prof, PipelineConfig(4, 8, schedule="zb-h1"))
        assert split.split
        assert split.weight[1] == round(WEIGHT_SHARE * plain.backward[1, 0])
        avail = split.available
        assert np.array_equal((split.backward + split.weight[:, None])[avail], plain.backward[avail])
        assert split.fixed_backward[0] + split.fixed_weight[0] == plain.fixed_backward[0]


def test_head_on_first_and_tail_on_last_virtual_stage():
    prof = bundled_profile("llama2_70b")
    for sched, v in (("interleaved", 2), ("dualpipe-v", 2)):
        if sched not in names():
            continue
        cfg = PipelineConfig(4, 8, v, sched)
        coef = layer_coefficients(prof, cfg)
        assert coef.fixed_layers.tolist() == [1] + [0] * 6 + [1]
        program = cfg.program()
        device_of_tail = program.placement[-1]
        assert device_of_tail == (0 if sched == "dualpipe-v" else 3)


def test_check_counts_rejects_bad_assignments():
    rng = np.random.default_rng(0)
    prof = small_profile(rng)
    cfg = PipelineConfig(3, 4)
    good = random_counts(rng, prof, cfg)
    check_counts(prof, cfg, good)
    with pytest.raises(ConfigError, match="shape"):
        check_counts(prof, cfg, good[:, :, :2])
    bad = good.copy()
    bad[0, 0, 0] += 1
    with pytest.raises(ConfigError, match="layers"):
        check_counts(prof, cfg, bad)
    order = np.zeros_like(good)
    order[1, 0, 0] = prof.body[1].count  # group 1 first, then group 0: out of model order
    order[0, 0, 2] = prof.body[0].count
    with pytest.raises(ConfigError, match="before group"):
        check_counts(prof, cfg, order)


@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_stage_costs_simulation_and_peaks(config):
    """Totals per layer survive the split; simulate_counts is the simulator on these costs;
    peak_memory (live points) equals the simulated peak."""
    rng = np.random.default_rng(seed_of("costs", config.schedule))
    prof = small_profile(rng)
    for _ in range(3):
        counts = random_counts(rng, prof, config)
        sc = stage_costs(prof, config, counts)
        sim = simulate_counts(prof, config, counts)
        assert sim.costs["comm"] == pytest.approx(sc.comm)
        assert np.allclose(peak_memory(prof, config, counts), sim.peak_memory.to_numpy(), atol=1e-6)
        direct = simulate(config.program(), forward=sc.forward, backward=sc.backward, weight=sc.weight,
                          activation=sc.activation, params=sc.params, comm=sc.comm, constant=sc.constant)
        assert direct.step_time == pytest.approx(sim.step_time)


# --------------------------------------------------------- the solver's views
@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_integer_longest_path_equals_the_simulator(config):
    """The solver's time model (integer longest path, critical path signatures) is the simulator's step time."""
    rng = np.random.default_rng(7)
    prof = small_profile(rng)
    coef = layer_coefficients(prof, config)
    program = config.program()
    paths = path_model(program)
    batch = [random_counts(rng, prof, config) for _ in range(6)]
    costs = np.stack([stage_cost_vector(coef, c) for c in batch])
    steps, crit = paths.longest(costs, coef.comm)
    k = program.splits
    for c, cost, step, (sig, crossings) in zip(batch, costs, steps, crit, strict=True):
        sim = simulate_counts(prof, config, c)
        assert step * TIME_UNIT_MS / k == pytest.approx(sim.step_time, abs=1e-9)
        assert sig @ cost + crossings * coef.comm * k == step  # the critical path is that long
        length, sigs, cross = paths.through(cost, coef.comm)
        assert length.max() == step
        assert np.array_equal(sigs @ cost + cross * coef.comm * k, length)
        # every unit lies on its own longest path: no through-path is shorter than that unit's end
        assert (length >= paths.unit_sig @ cost).all()


@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_integer_live_points_equal_the_simulated_peak(config):
    rng = np.random.default_rng(11)
    prof = small_profile(rng)
    coef = layer_coefficients(prof, config)
    program = config.program()
    mem = memory_model(program)
    for _ in range(3):
        counts = random_counts(rng, prof, config)
        peaks = mem.peaks(coef, program, counts) / mem.scale * MEMORY_UNIT_MB
        sim = simulate_counts(prof, config, counts)
        assert np.allclose(peaks, sim.peak_memory.to_numpy(), atol=1e-6)


@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_solver_views_equal_the_plain_python_oracle(config):
    """PathModel.steps/longest/through and MemoryModel.peaks against the op-by-op reference."""
    rng = np.random.default_rng(seed_of("oracle", config.schedule))
    prof = small_profile(rng)
    coef = layer_coefficients(prof, config)
    program = config.program()
    paths, mem = path_model(program), memory_model(program)
    k = program.splits
    batch = [random_counts(rng, prof, config) for _ in range(4)]
    costs = np.stack([stage_cost_vector(coef, c) for c in batch])
    steps = paths.steps(costs, coef.comm)
    assert steps.dtype == np.int64
    assert steps.tolist() == paths.longest(costs, coef.comm)[0].tolist()
    for counts, cost, step in zip(batch, costs, steps, strict=True):
        nvs = program.num_virtual_stages
        # ticks: a slice op of a stage costing c time units lasts c ticks, so scale by k
        ref = reference_run(program, forward=cost[:nvs] * k, backward=cost[nvs:2 * nvs] * k,
                            weight=cost[2 * nvs:] * k, comm=coef.comm * k)
        assert step == ref["step_time"]
        length, _, _ = paths.through(cost, coef.comm)
        assert length.tolist() == reference_through(ref["preds"], (paths.unit_sig @ cost).tolist(), coef.comm * k)
        sc = stage_costs(prof, config, counts)
        memory = reference_run(program, forward=1.0, backward=1.0, activation=sc.activation, params=sc.params,
                               constant=sc.constant)
        assert np.allclose(mem.peaks(coef, program, counts) / mem.scale * MEMORY_UNIT_MB, memory["peak_mb"])
        assert np.allclose(peak_memory(prof, config, counts), memory["peak_mb"])


def test_plan_simulate_passes_the_budget_and_takes_overrides():
    prof = bundled_profile("llama2_70b")
    config = PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000, comm=0.02)
    plan = even_split(prof, config, "none")
    sim = plan.simulate()
    assert sim.memory_budget == 60000 and sim.costs["comm"] == pytest.approx(0.02)
    other = plan.simulate(comm=0.5, constant=100.0, memory_budget=None)  # once raised "multiple values"
    assert (other.costs["comm"], other.costs["constant"], other.memory_budget) == (0.5, 100.0, None)
    assert other.step_time > sim.step_time
    sc = stage_costs(prof, config, plan.counts)
    again = simulate(config.program(), **sc.simulate_args(), memory_budget=60000)
    assert again.step_time == sim.step_time and (again.peak_memory == sim.peak_memory).all()
    for own in ("forward", "offloaded", "host_bandwidth"):
        with pytest.raises(ConfigError, match=f"{own}: these come from the plan's layout"):
            plan.simulate(**{own: 1.0})

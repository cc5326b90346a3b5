"""Recompute per micro-batch: costs per (virtual stage, micro-batch) in the simulator, the
AlternativeLayout of a plan, and the search that moves micro-batches to less recompute."""

from __future__ import annotations

import time

import numpy as np
import pytest
import yaml
from support import config_for, random_counts, seed_of, small_profile

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.costs import AlternativeLayout, check_alternative, simulate_counts
from sapptk.errors import ConfigError, SapptkError
from sapptk.plan import even_split, load_plan, make_plan
from sapptk.profile import MODES
from sapptk.schedules import build, names
from sapptk.simulation import simulate
from sapptk.solver.micro_batches import _Model, improve_per_micro_batch, weak_layout


# ------------------------------------------------------------------ the simulator, by hand
def test_one_f_one_b_by_hand():
    """1F1B, p = 2, m = 4, backward and activation per micro-batch; times and memory worked by hand.

    device 0: F0 0-1, F1 1-2, B0 6-8, F2 8-9, B1 11-13, F3 13-14, B2 16-17, B3 19-20
    device 1: F0 1-3, B0 3-6, F1 6-8, B1 8-11, F2 11-13, B2 13-16, F3 16-18, B3 18-19
    memory 0: +10 at 0, +10 at 1, -10 at 8, +30 at 8, -10 at 13, +30 at 13, -30 at 17, -30 at 20
    memory 1: +20/-20 per micro-batch, the last one +50 at 16, -50 at 19
    """
    program = build("1f1b", stages=2, micro_batches=4)
    sim = simulate(program, forward=[1, 2], backward=np.array([[2, 2, 1, 1], [3, 3, 3, 1]]),
                   activation=np.array([[10, 10, 30, 30], [20, 20, 20, 50]]))
    assert sim.step_time == 20.0
    ev = sim.events.set_index(["device", "kind", "micro_batch"]).sort_index()
    expect = {(0, "B", 0): (6, 8), (0, "B", 1): (11, 13), (0, "B", 2): (16, 17), (0, "B", 3): (19, 20),
              (1, "B", 0): (3, 6), (1, "B", 1): (8, 11), (1, "B", 2): (13, 16), (1, "B", 3): (18, 19),
              (1, "F", 3): (16, 18), (0, "F", 3): (13, 14)}
    for key, (start, end) in expect.items():
        row = ev.loc[key]
        assert (float(row.start_ms), float(row.end_ms)) == (start, end), key
    mem0 = sim.memory[sim.memory.device == 0]
    assert mem0.memory_mb.tolist() == [0, 10, 20, 10, 40, 30, 60, 30, 0]
    assert mem0.time_ms.tolist() == [0, 0, 1, 8, 8, 13, 13, 17, 20]
    mem1 = sim.memory[sim.memory.device == 1]
    assert mem1.memory_mb.tolist() == [0, 20, 0, 20, 0, 20, 0, 50, 0]
    assert sim.peak_memory.tolist() == [60.0, 50.0]


def test_costs_equal_along_micro_batches_are_todays_simulation(rng):
    program = build("interleaved", stages=4, micro_batches=8, chunks=2)
    f, b, a = rng.uniform(1, 3, 8), rng.uniform(2, 5, 8), rng.uniform(10, 40, 8)
    today = simulate(program, forward=f, backward=b, activation=a, comm=0.1)
    wide = simulate(program, forward=np.repeat(f[:, None], 8, axis=1), backward=np.repeat(b[:, None], 8, axis=1),
                    activation=np.repeat(a[:, None], 8, axis=1), comm=0.1)
    assert wide.step_time == today.step_time
    assert wide.memory.equals(today.memory) and wide.events.equals(today.events)


def test_simulator_refuses_bad_per_micro_batch_costs():
    program = build("1f1b", stages=2, micro_batches=4)
    with pytest.raises(SapptkError, match=r"backward: .*shape \(2, 4\) \(virtual stages, micro-batches\), got shape "
                                          r"\(2, 3\)"):
        simulate(program, forward=1, backward=np.ones((2, 3)))
    with pytest.raises(SapptkError, match="activation: expected finite values >= 0"):
        simulate(program, forward=1, backward=1, activation=-np.ones((2, 4)))
    with pytest.raises(SapptkError, match="forward: expected numbers, got a bool"):
        simulate(program, forward=[[True, 1, 1, 1], [1, 1, 1, 1]], backward=1)


# ------------------------------------------------------------------ plans
def _demo_setup(demo, budget=None):
    config = PipelineConfig(4, 8, 1, "1f1b", memory_budget=budget)
    base = even_split(demo, config, "strongest")
    weak = weak_layout(demo, config, np.asarray(base.counts))
    return config, base, weak


def test_an_unused_alternative_is_todays_plan_and_an_all_used_one_is_the_other_layout(demo):
    config, base, weak = _demo_setup(demo)
    nvs, m = config.num_virtual_stages, config.micro_batches
    none = make_plan(demo, config, base.counts, status="given", alternative=AlternativeLayout(weak, np.zeros((nvs, m),
                                                                                                     dtype=bool)))
    assert none.simulation.step_time == base.simulation.step_time
    assert none.simulation.memory.equals(base.simulation.memory)
    every = make_plan(demo, config, base.counts, status="given",
                      alternative=AlternativeLayout(weak, np.ones((nvs, m), dtype=bool)))
    other = simulate_counts(demo, config, weak)
    assert every.step_time == other.step_time
    assert every.simulation.memory.equals(other.memory)


def test_bad_alternatives_are_refused_at_the_boundary(demo):
    config, base, weak = _demo_setup(demo)
    nvs, m = config.num_virtual_stages, config.micro_batches
    mask = np.zeros((nvs, m), dtype=bool)
    with pytest.raises(ConfigError, match=r"alternative.mask: expected shape \(4, 8\) .* got \(4, 7\)"):
        check_alternative(demo, config, base.counts, weak, mask[:, :7])
    with pytest.raises(ConfigError, match="alternative.mask: expected booleans"):
        check_alternative(demo, config, base.counts, weak, np.full((nvs, m), 2))
    with pytest.raises(ConfigError, match="alternative.mask: expected a boolean array"):
        check_alternative(demo, config, base.counts, weak)
    moved = np.array(weak)
    g = int(np.flatnonzero(moved.sum(axis=(1, 2)))[0])
    r, vs = (int(i) for i in np.argwhere(moved[g] > 0)[0])
    moved[g, r, vs] -= 1
    moved[g, r, (vs + 1) % nvs] += 1
    with pytest.raises(ConfigError, match="alternative.counts: group .* expected the same layers per group"):
        check_alternative(demo, config, base.counts, moved, mask)
    with pytest.raises(ConfigError, match="a plan with status 'unknown' has no layer assignment"):
        make_plan(demo, config, None, status="unknown", alternative=AlternativeLayout(weak, mask))
    with pytest.raises(ConfigError, match="per_micro_batch = 'yes': expected True or False"):
        balance(demo, config, per_micro_batch="yes")
    offload = config.replace(host_bandwidth=10.0, recompute=("none", "full", "offload"))
    with pytest.raises(ConfigError, match="per_micro_batch = True with 'offload' in config.recompute"):
        balance(demo, offload, per_micro_batch=True)


def _mixed_plan(demo):
    config, base, weak = _demo_setup(demo)
    mask = np.zeros((config.num_virtual_stages, config.micro_batches), dtype=bool)
    mask[1, 2:5] = mask[3, ::2] = True
    return make_plan(demo, config, base.counts, status="given", alternative=AlternativeLayout(weak, mask))


def test_plan_frames_show_the_choice_and_the_file_round_trips(demo, tmp_path):
    plan = _mixed_plan(demo)
    frame = plan.micro_batch_layout
    assert len(frame) == 4 * 8 and (frame.variant == "alternative").sum() == 7
    assert set(frame[frame.variant == "alternative"].virtual_stage) == {1, 3}
    layout = plan.layout
    assert list(layout.variant.cat.categories) == ["base", "alternative"]
    per_vs = layout.groupby(["virtual_stage", "variant"], observed=True).micro_batches.first()
    assert per_vs[(1, "alternative")] == 3 and per_vs[(1, "base")] == 5 and per_vs[(0, "base")] == 8
    assert "recompute per micro-batch: 7 of 32" in plan.summary()
    assert plan.devices.backward_ms.notna().all()
    plan.export("sapptk", tmp_path / "plan.yaml")
    back = load_plan(tmp_path / "plan.yaml")
    assert np.array_equal(back.alternative.mask, plan.alternative.mask)
    assert np.array_equal(back.alternative.counts, plan.alternative.counts)
    assert back.simulate().step_time == plan.simulation.step_time
    assert load_plan(yaml.safe_load(even_split(demo, plan.config).export("sapptk").text)).alternative is None


def test_exports_say_they_cannot_run_it(demo):
    plan = _mixed_plan(demo)
    with pytest.raises(ConfigError, match="recomputes per micro-batch .* MindFormers"):
        plan.export("mindformers")
    with pytest.raises(ConfigError, match="FlagScale"):
        plan.export("megatron")
    with pytest.raises(ConfigError, match="torchtitan settings cannot express"):
        plan.export("torchtitan")
    with pytest.raises(ConfigError, match="sensitivity cannot express"):
        plan.sensitivity(samples=10)
    assert plan.per_stage_plan().export("mindformers")


def test_bad_plan_file_alternatives_name_the_field(demo):
    data = yaml.safe_load(_mixed_plan(demo).export("sapptk").text)
    data["alternative"]["micro_batches"] = [[0]] * 3
    with pytest.raises(ConfigError, match="alternative.micro_batches: expected 4 lists"):
        load_plan(data)
    data["alternative"]["micro_batches"] = [[0], [9], [], []]
    with pytest.raises(ConfigError, match=r"alternative.micro_batches\[1\]: 9: expected a micro-batch 0..7"):
        load_plan(data)


# ------------------------------------------------------------------ the search's model = the simulator
@pytest.mark.slow
@pytest.mark.parametrize("schedule", names())
def test_search_model_equals_simulation_on_every_schedule(schedule):
    rng = np.random.default_rng(seed_of("micro-batch model", schedule))
    for _ in range(3):
        profile = small_profile(rng)
        config = config_for(schedule, rng, comm=float(rng.choice([0.0, 0.05])))
        counts = random_counts(rng, profile, config)
        weak = weak_layout(profile, config, counts)
        model = _Model(profile, config, counts, weak)
        mask = rng.random(config.num_virtual_stages * config.micro_batches) < 0.4
        alt = AlternativeLayout(weak, mask.reshape(config.num_virtual_stages, config.micro_batches))
        sim = simulate_counts(profile, config, counts, alt)
        step = int(model.steps(model.durations(mask)[:, None])[0]) * model.ticks_ms
        assert step == pytest.approx(sim.step_time, abs=1e-6)
        peaks = []
        for d, memory in enumerate(model.memory):
            extra = sum((model.move_memory(int(c))[1] for c in np.flatnonzero(mask)
                         if model.device_of_cell[c] == d), np.zeros_like(memory))
            peaks.append(max(0, (memory + extra).max(initial=0)) / (2 * config.splits) * 1e-3)
        assert np.allclose(np.maximum(peaks, sim.summary.static_mb), sim.peak_memory.to_numpy(), atol=1e-6)
        # the search: its prediction is the simulation, it fits, it is never slower
        budget = float(simulate_counts(profile, config, counts).peak_memory.max()) * 1.05
        config = config.replace(memory_budget=budget)
        found = improve_per_micro_batch(profile, config, counts, deadline=time.perf_counter() + 10)
        if found.alternative is None:
            continue
        plan = make_plan(profile, config, found.counts, status="given", alternative=found.alternative)
        assert found.step_ms == pytest.approx(plan.step_time, abs=1e-6)
        assert plan.fits and plan.step_time < found.base_step_ms


@pytest.mark.slow
def test_per_micro_batch_never_loses_and_keeps_its_time_limit(deepseek):
    for budget in (36000.0, 64000.0):
        config = PipelineConfig(16, 32, 1, "1f1b", memory_budget=budget)
        t0 = time.perf_counter()
        micro = balance(deepseek, config, time_limit=4, per_micro_batch=True)
        assert time.perf_counter() - t0 <= 4 + 1
        assert micro.fits and micro.step_time == pytest.approx(micro.simulate().step_time, abs=1e-6)
        if micro.alternative is not None:
            assert micro.status == "feasible" and micro.bound is None
        # from the per-stage plan of a plain call: never slower, and the prediction is the simulation
        stage = balance(deepseek, config, time_limit=4)
        found = improve_per_micro_batch(deepseek, config, stage.counts, deadline=time.perf_counter() + 4)
        assert found.base_step_ms == pytest.approx(stage.step_time, abs=1e-6)
        assert found.step_ms <= stage.step_time + 1e-6
        if found.alternative is not None:
            plan = make_plan(deepseek, config, found.counts, status="given", alternative=found.alternative)
            assert plan.fits and plan.step_time == pytest.approx(found.step_ms, abs=1e-6)


def test_per_micro_batch_wins_on_a_small_tight_case(demo):
    """Where the per-stage optimum is proven, recompute per micro-batch beats it (or keeps it)."""
    config = PipelineConfig(4, 8, 1, "1f1b", recompute=tuple(MODES))
    full = even_split(demo, config, "strongest").simulation.peak_memory.max()
    none = even_split(demo, config, "none").simulation.peak_memory.max()
    config = config.replace(memory_budget=float(full + 0.5 * (none - full)))
    stage = balance(demo, config, time_limit=10, deterministic=True)
    micro = balance(demo, config, time_limit=10, deterministic=True, per_micro_batch=True)
    assert stage.status == "optimal"
    assert micro.fits and micro.step_time <= stage.step_time + 1e-6


@pytest.mark.slow
def test_per_micro_batch_keeps_a_safe_budget(deepseek):
    from sapptk.sensitivity import robust_budget

    config = PipelineConfig(16, 32, 1, "1f1b", memory_budget=36000.0)
    safe = robust_budget(config, memory_margin=0.05)
    plan = balance(deepseek, config, time_limit=4, per_micro_batch=True, memory_margin=0.05)
    assert plan.config.memory_budget == 36000.0
    assert (plan.simulation.peak_memory.to_numpy() <= safe + 1e-6).all()


def test_a_plan_offloads_or_varies_its_recompute_not_both(demo):
    config = PipelineConfig(4, 8, 1, "1f1b", host_bandwidth=10.0, recompute=("none", "both", "offload"))
    counts = even_split(demo, config, "none").counts
    offload = np.zeros((counts.shape[0], counts.shape[2]), dtype=np.int64)
    offload[0, 1] = 1
    mask = np.zeros((4, 8), dtype=bool)
    mask[1, 0] = True
    weak = np.array(counts)
    both = MODES.index("both")
    weak[0, both, 2], weak[0, 0, 2] = weak[0, 0, 2], 0
    with pytest.raises(ConfigError, match="cannot be combined with activation offload"):
        make_plan(demo, config, counts, status="given", offload=offload, alternative=AlternativeLayout(weak, mask))

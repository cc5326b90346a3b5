"""A setup carrying its own Program: a user's schedule CSV, a cost-driven order rebuilt at a
plan's costs. The balancer reads nothing but ``config.program()``."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from support import fast_step, random_counts, small_profile

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.costs import simulate_counts
from sapptk.errors import ConfigError
from sapptk.plan import even_split
from sapptk.schedules import build, from_csv

DATA = Path(__file__).parent / "data"
CUSTOM = DATA / "schedules" / "w_last_p3_v2_m6.csv"


def test_a_config_carries_a_program_and_keeps_every_field_consistent():
    program = from_csv(CUSTOM)
    cfg = PipelineConfig.from_program(program, memory_budget=1000.0, comm=0.01)
    assert cfg.program() is program
    assert (cfg.stages, cfg.micro_batches, cfg.chunks, cfg.splits, cfg.schedule) == (3, 6, 2, 1, "csv:w_last_p3_v2_m6")
    assert cfg.split_backward  # the file has I and W ops
    assert cfg.num_virtual_stages == program.num_virtual_stages == 6
    again = pickle.loads(pickle.dumps(cfg))  # sweeps send configs to other processes
    assert again.program().units == program.units
    one = PipelineConfig(3, 6, 1, "1f1b", comm=0.5).with_program(build("gpipe", stages=3, micro_batches=6))
    assert (one.schedule, one.comm, one.split_backward) == ("gpipe", 0.5, False)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"stages": 4}, "stages = 4: the carried program"),
        ({"micro_batches": 7}, "micro_batches = 7: the carried program"),
        ({"chunks": 1}, "chunks = 1: the carried program"),
        ({"schedule": "interleaved"}, "expected the carried program's name"),
        ({"custom_program": "x.csv"}, "expected a sapptk.schedules.Program"),
    ],
)
def test_inconsistent_fields_are_refused(changes, needle):
    cfg = PipelineConfig.from_program(from_csv(CUSTOM)).replace(**changes)
    with pytest.raises(ConfigError, match=needle):
        cfg.program()


def test_from_program_refuses_fields_it_takes_from_the_program():
    with pytest.raises(ConfigError, match="from_program takes it from the program"):
        PipelineConfig.from_program(from_csv(CUSTOM), stages=3)
    with pytest.raises(ConfigError, match="expected a sapptk.schedules.Program"):
        PipelineConfig.from_program("w_last.csv")


def test_plans_simulate_on_the_carried_program(rng):
    prof = small_profile(rng, layers=(4, 5))
    cfg = PipelineConfig.from_program(from_csv(CUSTOM))
    counts = random_counts(rng, prof, cfg)
    sim = simulate_counts(prof, cfg, counts)
    assert sim.program is cfg.program()
    assert sim.step_time == pytest.approx(fast_step(cfg, prof, counts))
    assert even_split(prof, cfg).config.program() is cfg.program()


@pytest.mark.slow
def test_a_user_csv_schedule_balances_and_its_prediction_equals_its_simulation(rng):
    prof = small_profile(rng, layers=(4, 5))
    cfg = PipelineConfig.from_program(from_csv(CUSTOM), comm=0.01)
    loose = balance(prof, cfg, time_limit=20, deterministic=True)
    budget = float(np.quantile([even_split(prof, cfg, m).simulation.peak_memory.max() for m in ("none", "strongest")],
                               0.5))
    plan = balance(prof, cfg.replace(memory_budget=budget), time_limit=20, deterministic=True)
    for p in (loose, plan):
        assert p.status == "optimal", p.message
        assert p.config.program() is cfg.program()
        sim = p.simulate()
        assert p.step_time == pytest.approx(sim.step_time, abs=1e-6)
    assert plan.fits and plan.step_time >= loose.step_time


@pytest.mark.slow
def test_the_balancer_reorders_a_cost_driven_schedule(demo):
    """zb-v-greedy: balanced on the unit-cost order, re-built at the plan's costs, balanced
    again on the new order (demo profile, p = 2, m = 6: 82800 -> 82350 -> 81900 -> 81810 ms,
    each proven optimal for its order)."""
    cfg = PipelineConfig(2, 6, 2, "zb-v-greedy")
    first = balance(demo, cfg.with_program(cfg.program()), time_limit=20, deterministic=True)
    assert first.status == "optimal"
    plan = balance(demo, cfg, time_limit=40, deterministic=True)
    assert plan.source == "balance (re-ordered)" and "order re-built" in plan.message
    assert plan.config.custom_program is not None and plan.config.schedule == "zb-v-greedy"
    assert plan.config.program().units != cfg.program().units
    assert plan.step_time < first.step_time
    assert plan.step_time == pytest.approx(plan.simulate().step_time, abs=1e-6)


def test_sweeps_keep_to_registered_schedules():
    from sapptk.sweeps import CONFIG_FIELDS, expand_grid

    assert "custom_program" not in CONFIG_FIELDS
    with pytest.raises(ConfigError, match="carrying its own program"):
        expand_grid([PipelineConfig.from_program(from_csv(CUSTOM))])

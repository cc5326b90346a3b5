"""simulate's call shape: keyword-only costs, validated at the boundary with clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from sapptk import PipelineConfig, bundled_profile, even_split
from sapptk.errors import SapptkError
from sapptk.schedules import build
from sapptk.simulation import simulate

PROGRAM = build("1f1b", stages=2, micro_batches=2)


def test_costs_are_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        simulate(PROGRAM, 1.0, 2.0)  # type: ignore[misc]
    sim = simulate(PROGRAM, forward=1.0, backward=2.0)
    assert sim.step_time == 9.0  # (m + p − 1)(F + B)
    assert sim.memory_budget is None


@pytest.mark.parametrize(
    ("program", "needle"),
    [
        ("1f1b", "program: expected a Program (sapptk.schedules.build(...) or PipelineConfig.program()), got str"),
        ({"stages": 2}, "got dict {'stages': 2}"),
        (None, "got NoneType None"),
    ],
)
def test_not_a_program(program, needle):
    with pytest.raises(SapptkError) as info:
        simulate(program, forward=1.0, backward=2.0)
    assert needle in str(info.value)


def test_a_plan_is_pointed_to_its_own_simulate():
    prof = bundled_profile("llama2_70b")
    plan = even_split(prof, PipelineConfig(4, 8, 2, "interleaved"), "none")
    with pytest.raises(SapptkError, match=r"a Plan simulates itself: plan.simulation, or plan.simulate\(...\) "):
        simulate(plan, forward=1.0, backward=2.0)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"comm": "1"}, "comm: expected a latency >= 0 ms, got str '1'"),
        ({"comm": -1}, "comm: expected a latency >= 0 ms, got -1"),
        ({"comm": float("inf")}, "comm: expected a latency >= 0 ms, got inf"),
        ({"comm": True}, "comm: expected a latency >= 0 ms, got bool True"),
        ({"weight_holds": "x"}, "weight_holds: expected a fraction in [0, 1], got str 'x'"),
        ({"weight_holds": 1.5}, "weight_holds: expected a fraction in [0, 1], got 1.5"),
        ({"constant": -100}, "constant: expected memory >= 0 MB, got -100"),
        ({"constant": float("nan")}, "constant: expected memory >= 0 MB, got nan"),
        ({"memory_budget": 0}, "memory_budget: expected MB > 0 per device, or None, got 0"),
        ({"memory_budget": "80GB"}, "memory_budget: expected MB > 0 per device, or None, got str '80GB'"),
        ({"overlap": "min"}, "overlap: expected one of ['max', 'sum'], got 'min'"),
        ({"overlap": None}, "overlap: expected one of ['max', 'sum'], got None"),
        ({"forward": [1.0, 2.0, 3.0]}, "forward: expected a number or 2 values (one per virtual stage), got shape"),
        ({"forward": [[1.0, 2.0]]}, "forward: expected a number or 2 values"),
        ({"backward": -2}, "backward: expected finite values >= 0, got [-2.0, -2.0]"),
        ({"backward": [1.0, float("nan")]}, "backward: expected finite values >= 0, got [1.0, nan]"),
        ({"activation": float("inf")}, "activation: expected finite values >= 0"),
        ({"params": "100"}, "params: expected a number or 2 numbers >= 0 (one per virtual stage), got str '100'"),
        ({"params": ["1", "2"]}, "params: expected a number or 2 numbers >= 0"),
        ({"weight": True}, "weight: expected a number or 2 numbers >= 0 (one per virtual stage), got bool True"),
        ({"weight": [True, 1.0]}, "weight: expected numbers, got a bool"),
        ({"weight": np.array([True, False])}, "weight: expected a number or 2 numbers >= 0"),
        ({"forward": [1.0, [2.0, 3.0]]}, "forward: expected a number or 2 numbers"),
        ({"forward": {"a": 1}}, "forward: expected a number or 2 numbers >= 0"),
    ],
)
def test_bad_values_name_the_argument(kwargs, needle):
    args = {"forward": 1.0, "backward": 2.0}
    args.update(kwargs)
    with pytest.raises(SapptkError) as info:
        simulate(PROGRAM, **args)
    assert needle in str(info.value)


def test_nothing_given_is_mutated_and_costs_may_be_arrays_of_ints():
    forward = np.array([1, 2])
    sim = simulate(PROGRAM, forward=forward, backward=[2, 4], constant=np.float64(3.0), comm=np.int64(1))
    assert forward.tolist() == [1, 2] and forward.flags.writeable
    assert sim.costs["constant"] == 3.0 and sim.costs["comm"] == 1.0
    assert sim.summary["static_mb"].tolist() == [3.0, 3.0]


def test_memory_budget_is_kept_for_figures():
    sim = simulate(PROGRAM, forward=1.0, backward=2.0, activation=10.0, memory_budget=50)
    assert sim.memory_budget == 50.0
    assert "budget=50 MB" in repr(sim)
    prof = bundled_profile("llama2_70b")
    config = PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000)
    assert even_split(prof, config, "none").simulate().memory_budget == 60000


def test_costs_so_large_the_step_overflows():
    with pytest.raises(SapptkError, match="the step time could overflow"):
        simulate(PROGRAM, forward=1e308, backward=1e308)
    with pytest.raises(SapptkError, match="the memory could overflow"):
        simulate(PROGRAM, forward=1.0, backward=1.0, activation=1e300)

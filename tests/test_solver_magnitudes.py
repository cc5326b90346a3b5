"""Values the loaders accept but whose step times or peaks leave the solver's integer range give
a ConfigError naming them; odd but valid inputs (zeros, huge budgets) never build an invalid
CP-SAT model."""

from __future__ import annotations

import pytest

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.profile import LayerGroup, ModeCost, Profile
from sapptk.solver.problem import MAX_INTEGER


def profile(forward: float = 1.0, params: float = 2.0, activation: float = 5.0, head_forward: float = 0.5,
            layers: int = 6) -> Profile:
    body = LayerGroup("body", "body", layers, forward, params, {
        "none": ModeCost(2 * forward, activation), "full": ModeCost(3 * forward, 0.1 * activation)})
    return Profile("odd", (LayerGroup("head", "head", 1, head_forward, params), body,
                           LayerGroup("tail", "tail", 1, forward, params)))


def test_a_step_time_beyond_the_solver_range_is_refused_with_the_figure():
    """81,000 s of layer work per micro-batch (6 layers and the tail), 70,000 micro-batches:
    5.67e12 ms, past 2**52 µs."""
    with pytest.raises(ConfigError, match=r"step time of some plan could reach 5\.67e\+12 ms") as info:
        balance(profile(forward=3e6), PipelineConfig(2, 70_000), time_limit=5)
    assert f"{MAX_INTEGER * 1e-3:.3g} ms" in str(info.value)


@pytest.mark.parametrize(
    ("prof", "cfg"),
    [
        (profile(forward=3e6), PipelineConfig(2, 140_000)),
        (profile(params=1e9, activation=1e9, layers=2000), PipelineConfig(2, 4, memory_budget=100.0)),
    ],
)
def test_larger_ones_are_refused_too(prof, cfg):
    with pytest.raises(ConfigError, match="step time|memory"):
        balance(prof, cfg, time_limit=5)


@pytest.mark.parametrize(
    ("prof", "cfg"),
    [
        (profile(forward=0.0, head_forward=0.0), PipelineConfig(2, 4, memory_budget=50.0)),
        (profile(params=0.0, activation=0.0), PipelineConfig(2, 4, 2, "interleaved", memory_budget=1.0)),
        (profile(), PipelineConfig(2, 4, memory_budget=1e12)),
        (profile(forward=1e6), PipelineConfig(2, 4, 2, "interleaved", comm=1e6, memory_budget=60.0)),
        (profile(layers=4), PipelineConfig(2, 4, 2, "dualpipe-v", memory_budget=1e6, constant_memory=1e9)),
        (profile(activation=1e9, params=1e9), PipelineConfig(2, 4, memory_budget=3e10)),
    ],
)
def test_odd_inputs_get_an_answer(prof, cfg):
    plan = balance(prof, cfg, time_limit=5, deterministic=True)
    assert plan.status in ("optimal", "feasible", "infeasible"), plan.message
    if plan.solved:
        assert plan.fits
        assert plan.step_time == pytest.approx(plan.simulate().step_time, rel=1e-12, abs=1e-6)

"""Values that pass the loaders but not the solver's integer range give a ConfigError naming
them; odd but valid inputs (zeros, huge budgets) never build an invalid CP-SAT model."""

from __future__ import annotations

import pytest

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.costs import layer_coefficients
from sapptk.errors import ConfigError
from sapptk.profile import LayerGroup, ModeCost, Profile


def profile(forward: float = 1.0, params: float = 2.0, activation: float = 5.0, head_forward: float = 0.5,
            layers: int = 6) -> Profile:
    body = LayerGroup("body", "body", layers, forward, params, {
        "none": ModeCost(2 * forward, activation), "full": ModeCost(3 * forward, 0.1 * activation)})
    return Profile("odd", (LayerGroup("head", "head", 1, head_forward, params), body,
                           LayerGroup("tail", "tail", 1, forward, params)))


def test_a_figure_beyond_the_integer_units_is_named():
    with pytest.raises(ConfigError, match=r"group 'body': forward = 1e\+20"):
        layer_coefficients(profile(forward=1e20), PipelineConfig(2, 4))
    with pytest.raises(ConfigError, match="constant_memory"):
        layer_coefficients(profile(), PipelineConfig(2, 4, constant_memory=1e30))


@pytest.mark.parametrize(
    ("prof", "cfg", "what"),
    [
        (profile(forward=1e14), PipelineConfig(2, 4), "step time"),
        (profile(), PipelineConfig(2, 4, comm=1e12), "step time"),
        (profile(params=1e14), PipelineConfig(2, 4, memory_budget=100.0), "peak memory"),
        (profile(activation=1e15), PipelineConfig(2, 4, memory_budget=100.0), "peak memory"),
    ],
)
def test_step_times_or_peaks_beyond_the_solver_range_are_refused(prof, cfg, what):
    with pytest.raises(ConfigError, match=what):
        balance(prof, cfg, time_limit=5)


@pytest.mark.parametrize(
    ("prof", "cfg"),
    [
        (profile(forward=0.0, head_forward=0.0), PipelineConfig(2, 4, memory_budget=50.0)),
        (profile(params=0.0, activation=0.0), PipelineConfig(2, 4, 2, "interleaved", memory_budget=1.0)),
        (profile(), PipelineConfig(2, 4, memory_budget=1e300)),
        (profile(forward=1e9), PipelineConfig(2, 4, 2, "interleaved", comm=1e6, memory_budget=60.0)),
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

"""Sensitivity of a plan to profile errors, its critical path, and robust budgets — against
plain simulations of the same perturbed costs and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from support import small_profile

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.plan import even_split, make_plan
from sapptk.schedules import get, names
from sapptk.sensitivity import PERTURBATIONS, perturbed_costs, robust_budget
from sapptk.simulation import simulate


def _setup(schedule: str, rng: np.random.Generator):
    prof = small_profile(rng)
    spec = get(schedule)
    chunks = 2 if spec.chunks is None or 2 in spec.chunks else 1
    m = 8 if schedule == "dualpipe-v" else 5
    cfg = PipelineConfig(3, m, chunks, schedule, splits=2 if schedule == "seq1f1b" else 1, comm=0.013,
                         constant_memory=1.5, memory_budget=1e6)
    return prof, cfg, even_split(prof, cfg, "none")


@pytest.mark.parametrize("schedule", names())
@pytest.mark.parametrize("perturbation", PERTURBATIONS)
def test_batched_samples_equal_plain_simulations(schedule, perturbation, rng):
    """Every sample's step time and peaks are what simulate() gives for the same perturbed costs."""
    prof, cfg, plan = _setup(schedule, rng)
    costs = perturbed_costs(plan, time_error=0.1, memory_error=0.05, samples=6, perturbation=perturbation, seed=3)
    res = plan.sensitivity(time_error=0.1, memory_error=0.05, samples=6, seed=3)
    got = res.samples[res.samples.perturbation == perturbation]
    for s in range(6):
        sim = simulate(cfg.program(), forward=costs.forward[s], backward=costs.backward[s], weight=costs.weight[s],
                       activation=costs.activation[s], params=costs.params[s], comm=plan.costs.comm,
                       constant=plan.costs.constant)
        rows = got[got["sample"] == s]
        assert rows.step_time_ms.iloc[0] == pytest.approx(sim.step_time, rel=1e-9)
        np.testing.assert_allclose(rows.peak_mb.to_numpy(), sim.peak_memory.to_numpy(), rtol=1e-9)


def test_quantiles_are_those_of_the_samples_and_zero_error_is_the_plan(rng):
    prof, cfg, plan = _setup("interleaved", rng)
    res = plan.sensitivity(time_error=0.0, memory_error=0.0, samples=5)
    assert np.allclose(res.step_time.step_time_ms, plan.simulation.step_time)
    peaks = plan.simulation.peak_memory.to_numpy()
    for kind in PERTURBATIONS:
        dev = res.devices[res.devices.perturbation == kind]
        np.testing.assert_allclose(dev.peak_mb_median.to_numpy(), peaks)
    res = plan.sensitivity(time_error=0.05, memory_error=0.02, samples=200, seed=1)
    for kind in PERTURBATIONS:
        steps = res.samples[(res.samples.perturbation == kind) & (res.samples.device == 0)].step_time_ms
        q = res.step_time[res.step_time.perturbation == kind].set_index("quantile").step_time_ms
        assert q.loc[0.5] == pytest.approx(np.quantile(steps, 0.5))
        assert q.is_monotonic_increasing


def test_probability_over_budget_counts_the_samples(rng):
    prof, cfg, plan = _setup("1f1b", rng)
    peaks = plan.simulation.peak_memory.to_numpy()
    tight = make_plan(prof, cfg.replace(memory_budget=float(peaks.max())), plan.counts, status="given")
    res = tight.sensitivity(time_error=0.0, memory_error=0.05, samples=400, seed=2)
    dev = res.devices[res.devices.perturbation == "shared"].set_index("device")
    top = int(np.argmax(peaks))
    assert 0.3 < dev.p_over_budget.loc[top] < 0.7  # a symmetric-ish error around a peak at the budget
    s = res.samples[res.samples.perturbation == "shared"]
    over = (s.peak_mb > tight.config.memory_budget).groupby(s["sample"]).any().mean()
    assert res.p_any_over_budget["shared"] == pytest.approx(over)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-h1", "dualpipe-v"])
def test_critical_path_derivatives_are_finite_differences(schedule, rng):
    prof, cfg, plan = _setup(schedule, rng)
    crit = plan.critical()
    assert crit.dstep_per_ms.gt(0).all()
    if not crit.unique.iloc[0]:
        pytest.skip("tied critical paths: derivatives are one-sided")
    base = plan.simulation.step_time
    sc = plan.costs
    field = {"F": "forward", "B": "backward", "W": "weight"}
    delta = 1e-3
    for row in crit.itertuples():
        arrays = {name: np.array(getattr(sc, name), dtype=float) for name in ("forward", "backward", "weight")}
        arrays[field[row.kind]][row.virtual_stage] += delta
        sim = simulate(cfg.program(), **arrays, activation=sc.activation, params=sc.params, comm=sc.comm,
                       constant=sc.constant)
        assert (sim.step_time - base) / delta == pytest.approx(row.dstep_per_ms, rel=1e-6)


@pytest.mark.slow
def test_a_robust_plan_keeps_its_risk_on_fresh_samples(llama):
    cfg = PipelineConfig(8, 16, 2, "interleaved", memory_budget=40000)
    safe = robust_budget(cfg, oom_risk=0.01, memory_error=0.02)
    assert safe < 40000
    robust = balance(llama, cfg, time_limit=5, deterministic=True, oom_risk=0.01, memory_error=0.02)
    assert robust.solved and robust.config == cfg
    assert robust.simulation.peak_memory.max() <= safe + 1e-6
    res = robust.sensitivity(time_error=0.0, memory_error=0.02, samples=4000, seed=11)
    assert res.p_any_over_budget.max() <= 0.01
    plain = balance(llama, cfg, time_limit=5, deterministic=True)
    naive = make_plan(llama, cfg, plain.counts, status="given").sensitivity(time_error=0.0, memory_error=0.02,
                        samples=4000, seed=11)
    assert naive.p_any_over_budget["shared"] > res.p_any_over_budget["shared"]


def test_robust_budget_arithmetic():
    cfg = PipelineConfig(4, 8, memory_budget=1000.0, constant_memory=100.0)
    assert robust_budget(cfg) == 1000.0
    assert robust_budget(cfg, memory_margin=50) == 950.0
    assert robust_budget(cfg, memory_margin=0.1) == pytest.approx(900.0)
    # shared lognormal factor with 2 % sd: its 99 % quantile is about 1 + 2.33 * 0.02
    assert robust_budget(cfg, oom_risk=0.01, memory_error=0.02) == pytest.approx(100 + 900 / 1.0466, rel=1e-3)
    both = robust_budget(cfg, memory_margin=1, oom_risk=0.01, memory_error=0.02)
    assert both == pytest.approx(100 + 900 / 1.0466, rel=1e-3)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"time_error": -0.1}, "time_error = -0.1"),
        ({"memory_error": float("nan")}, "memory_error = nan"),
        ({"samples": 0}, "samples = 0"),
        ({"seed": -1}, "seed = -1"),
    ],
)
def test_bad_sensitivity_arguments(kwargs, needle, rng):
    _, _, plan = _setup("1f1b", rng)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        plan.sensitivity(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"oom_risk": 0.6, "memory_error": 0.02}, "oom_risk = 0.6"),
        ({"oom_risk": -0.1, "memory_error": 0.02}, "oom_risk = -0.1"),
        ({"oom_risk": 0.01}, "give memory_error"),
        ({"memory_margin": -5}, "memory_margin = -5"),
        ({"memory_error": 0.02}, "only used with oom_risk"),
        ({"oom_risk": 0.01, "memory_error": "x"}, "memory_error = 'x'"),
    ],
)
def test_bad_robust_budget_arguments(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        robust_budget(PipelineConfig(4, 8, memory_budget=1000.0), **kwargs)
    with pytest.raises(ConfigError, match="no memory_budget"):
        robust_budget(PipelineConfig(4, 8), memory_margin=10)


def test_balance_keeps_a_margin_and_the_real_budget(demo):
    cfg = PipelineConfig(4, 8, memory_budget=120000)
    plain = balance(demo, cfg, time_limit=3, deterministic=True)
    peak = float(plain.simulation.peak_memory.max())
    margin = cfg.memory_budget - peak + 500.0  # the plain plan no longer fits the safe budget
    safe = balance(demo, cfg, time_limit=3, deterministic=True, memory_margin=margin)
    assert safe.solved and safe.config == cfg and safe.fits
    assert safe.simulation.peak_memory.max() <= cfg.memory_budget - margin + 1e-6
    assert safe.step_time >= plain.step_time
    assert f"{cfg.memory_budget - margin:.6g} MB" in safe.message


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"oom_risk": -0.1, "memory_error": 0.02}, "oom_risk"),
    ({"oom_risk": 0.01}, "memory_error"),
    ({"memory_error": 0.02}, "oom_risk"),
    ({"oom_risk": 0.01, "memory_error": -0.02}, "memory_error"),
    ({"memory_margin": -5}, "memory_margin"),
])
def test_balance_rejects_bad_safety_arguments(demo, kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        balance(demo, PipelineConfig(4, 8, memory_budget=120000), time_limit=1, **kwargs)

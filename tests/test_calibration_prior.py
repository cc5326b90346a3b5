"""calibrate(..., prior=estimated_profile): three scales from few dry runs (docs/estimation.md).

Oracle: dry-run peaks made by the simulator from a known truth = the prior with known
scales and constant; the fit must give those scales back exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_calibration import _peaks, _random_lists

import sapptk
from sapptk.calibration.memory_model import UNKNOWNS
from sapptk.calibration.prior import prior_basis
from sapptk.errors import CalibrationError
from sapptk.models import Parallel
from sapptk.schedules import build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prior():
    return sapptk.estimate_profile("llama2-7b", Parallel(tp=2, seq_length=4096), "h100")


def _frame(rng, prior, scales, constant, *, modes=("none", "select", "full"), p=4, m=8):
    truth_vector = prior_basis(prior) @ np.array([scales[0], scales[1], constant])
    truth = {name: float(truth_vector[i]) for i, name in enumerate(UNKNOWNS)}
    layers = prior.num_body_layers
    lists, cells = _random_lists(rng, p, 1, layers, list(modes))
    program = build("1f1b", stages=p, micro_batches=m)
    rows = [{"run": "dry", "device": d, "peak_mb": peak, "schedule": "1f1b", "stages": p, "micro_batches": m,
             "chunks": 1, "layers": layers, **lists} for d, peak in enumerate(_peaks(program, cells, truth))]
    return pd.DataFrame(rows)


def test_one_dry_run_recovers_the_scales(rng, prior):
    frame = _frame(rng, prior, (1.1, 1.3), 3000.0)
    cal = sapptk.calibrate(frame, prior=prior)
    assert cal.unknowns == ("static", "activation", "constant")
    assert cal.scales["static"] == pytest.approx(1.1, rel=1e-9)
    assert cal.scales["activation"] == pytest.approx(1.3, rel=1e-9)
    assert cal.constant_mb == pytest.approx(3000.0, rel=1e-9)
    assert cal.scales["time"] == 1.0 and any("times stay as estimated" in n for n in cal.notes)
    np.testing.assert_allclose(cal.residuals["residual_mb"], 0.0, atol=1e-6)
    assert cal.verified
    profile = cal.to_profile(fold_constant=False)
    assert [g.name for g in profile.groups] == [g.name for g in prior.groups]
    assert profile.body[0].params == pytest.approx(1.1 * prior.body[0].params)
    for mode, cost in prior.body[0].modes.items():
        assert profile.body[0].modes[mode].activation == pytest.approx(1.3 * cost.activation)
        assert profile.body[0].modes[mode].backward == pytest.approx(cost.backward)
    assert cal.profile.head.params == pytest.approx(1.1 * prior.head.params + 3000.0)  # folded by default
    assert profile.provenance["calibrated"]["static"] == pytest.approx(1.1)


def test_moved_says_what_the_data_moved(rng, prior):
    cal = sapptk.calibrate(_frame(rng, prior, (0.9, 1.5), 2500.0), prior=prior,
                           times={"body": 2 * prior.body[0].forward})
    moved = cal.moved.set_index("quantity")
    assert moved.loc["body params_mb", "change_pct"] == pytest.approx(-10.0)
    assert moved.loc["body activation_none_mb", "change_pct"] == pytest.approx(50.0)
    assert moved.loc["body forward_ms", "change_pct"] == pytest.approx(100.0)
    assert moved.loc["constant_mb", "prior"] == prior.provenance["constant_mb"]
    assert moved.loc["constant_mb", "calibrated"] == pytest.approx(2500.0)
    assert cal.to_profile().body[0].modes["full"].backward == pytest.approx(2 * prior.body[0].modes["full"].backward)


def test_the_shipped_dry_run_gives_its_scales_back():
    """data/calibration/llama3.1-70b_tp8_dry_run.yaml (README, docs/estimation.md) was made with
    scales 1.08 and 1.25 and a 3000 MB constant (scripts/make_dry_run_fixture.py)."""
    prior = sapptk.estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), "h100")
    cal = sapptk.calibrate(ROOT / "data" / "calibration" / "llama3.1-70b_tp8_dry_run.yaml", prior=prior)
    assert cal.scales["static"] == pytest.approx(1.08, rel=1e-6)
    assert cal.scales["activation"] == pytest.approx(1.25, rel=1e-6)
    assert cal.constant_mb == pytest.approx(3000.0, abs=0.01)


def test_too_few_observations_fix_the_constant_first(rng, prior):
    frame = _frame(rng, prior, (1.2, 0.8), prior.provenance["constant_mb"])
    two = frame[frame["device"].isin([1, 2])]  # no head or tail device: static and constant collide
    cal = sapptk.calibrate(two, prior=prior)
    assert "constant" not in cal.unknowns and cal.unidentified == ("constant",)
    assert any("constant fixed at the prior's" in n for n in cal.notes)
    assert cal.scales["static"] == pytest.approx(1.2, rel=1e-9)
    assert cal.scales["activation"] == pytest.approx(0.8, rel=1e-9)
    one = frame[frame["device"] == 1]  # one observation: one memory scale
    single = sapptk.calibrate(one, prior=prior)
    assert single.unknowns == ("memory",)
    assert single.scales["static"] == single.scales["activation"]
    np.testing.assert_allclose(single.residuals["residual_mb"], 0.0, atol=1e-6)


def test_without_a_prior_one_run_cannot_separate_the_unknowns(rng, prior):
    """The point of the prior: the same single dry run alone leaves unknowns unidentified."""
    frame = _frame(rng, prior, (1.0, 1.0), prior.provenance["constant_mb"], p=2, m=4)
    with pytest.raises(CalibrationError, match="cannot identify"):
        sapptk.calibrate(frame)
    assert sapptk.calibrate(frame, prior=prior).scales["static"] == pytest.approx(1.0, rel=1e-9)


def test_bad_priors(rng, prior):
    frame = _frame(rng, prior, (1.0, 1.0), 2000.0)
    with pytest.raises(CalibrationError, match="expected a Profile"):
        sapptk.calibrate(frame, prior="llama2-7b")
    deepseek = sapptk.estimate_profile("deepseek-v3", Parallel(ep=8, dp=8), "h100")
    with pytest.raises(CalibrationError, match="2 body groups"):
        sapptk.calibrate(frame, prior=deepseek)
    partial = sapptk.Profile("p", (prior.head, sapptk.LayerGroup("layers", "body", 32, 1.0, 100.0,
                                                                  {"none": prior.body[0].modes["none"]}),
                                   prior.tail))
    with pytest.raises(CalibrationError, match="select, full"):
        sapptk.calibrate(frame, prior=partial)

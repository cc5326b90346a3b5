"""Plans checked against measurements (validate, its figure) and the calibrate/design commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sapptk
from sapptk.calibration import validate
from sapptk.calibration.figures import validation_figure
from sapptk.calibration.validation import VALIDATION_COLUMNS
from sapptk.cli import main
from sapptk.errors import CalibrationError
from sapptk.profile import bundled_profile, load_profile

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "calibration" / "init_demo.yaml"
ROUNDS = ROOT / "data" / "calibration" / "init_demo_pp4_rounds.yaml"
TRACE = ROOT / "tests" / "data" / "traces" / "tiny_gpt.pt.trace.json.gz"


@pytest.fixture(scope="module")
def demo_cal():
    return sapptk.calibrate(DEMO)


def test_validate_the_dry_run_against_its_own_observations(demo_cal):
    plan = demo_cal.dry_run_plan(0)
    frame = validate(plan, demo_cal.observed(0))
    assert tuple(frame.columns) == VALIDATION_COLUMNS
    assert frame["device"].tolist() == [0, 6, 9, 10, 11, 12, 13, 15]
    errors = frame.set_index("device")["error_mb"]
    # head and tail devices carry the folded constant: exact; the others miss it (-1896.75 MB), within
    # the 0.001 MB rounding of each layer's figure
    assert errors.loc[[0, 15]].abs().max() < 0.01
    np.testing.assert_allclose(errors.drop([0, 15]), -demo_cal.constant_mb, atol=0.01)
    pct = frame.set_index("device")["error_pct"]
    assert pct.loc[12] == pytest.approx(100 * errors.loc[12] / 23134)
    assert (frame["predicted_step_ms"] == plan.simulation.step_time).all()
    assert frame["observed_step_ms"].isna().all()


def test_validate_step_times_and_mappings(demo_cal):
    sim = demo_cal.dry_run_plan(0).simulation
    observed = pd.DataFrame({"device": [3, 1], "step_time_ms": [sim.step_time * 1.1, sim.step_time]})
    frame = validate(sim, observed)
    assert frame["device"].tolist() == [1, 3]
    assert frame["step_error_pct"].tolist() == pytest.approx([0.0, 100 * (1 / 1.1 - 1)])
    assert frame["observed_mb"].isna().all()
    by_map = validate(sim, {0: 77698.0})
    assert by_map["error_mb"].iloc[0] == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize(
    ("observed", "needle"),
    [({"device": [0]}, "at least one of"), (pd.DataFrame({"device": [16], "peak_mb": [1.0]}), "device = 16"),
     (pd.DataFrame({"device": [1, 1], "peak_mb": [1.0, 2.0]}), "observed twice"), ([1, 2], "expected a DataFrame")],
)
def test_validate_refuses_bad_observations(demo_cal, observed, needle):
    if isinstance(observed, dict):
        observed = pd.DataFrame(observed)
    with pytest.raises(CalibrationError, match=needle):
        validate(demo_cal.dry_run_plan(0), observed)


@pytest.mark.slow
def test_validation_figure_has_observed_bars_and_predicted_markers(demo_cal):
    frame = validate(demo_cal.dry_run_plan(0), demo_cal.observed(0))
    fig = validation_figure(frame)
    glyphs = [type(r.glyph).__name__ for r in fig.renderers]
    assert "VBar" in glyphs and "Scatter" in glyphs
    data = fig.renderers[0].data_source.data
    assert list(data["observed_mb"]) == frame["observed_mb"].tolist()
    residual_fig = validation_figure(demo_cal.residuals)
    assert list(residual_fig.x_range.factors)[:2] == ["0/0", "0/15"]


# -------------------------------------------------------------------------------- CLI
def test_cli_calibrate_prints_the_fit_and_writes_demo_json(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["calibrate", str(DEMO), "--out", str(out), "--integers", "--name", "demo"]) == 0
    text = capsys.readouterr().out
    for needle in ("activation_comm", "535.8571", "constant", "-1896.75", "rank 8 of 8", "residual per observation"):
        assert needle in text
    assert load_profile(out).groups == bundled_profile("demo").groups
    yaml_out = tmp_path / "profile.yaml"
    assert main(["calibrate", str(DEMO), "--out", str(yaml_out)]) == 0
    assert load_profile(yaml_out) == sapptk.calibrate(DEMO).profile


def test_cli_calibrate_bad_input_exits_2(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["calibrate", str(ROUNDS), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "activation_none = -38.1" in err and not (tmp_path / "p.json").exists()
    assert main(["calibrate", str(DEMO), "--trace", str(TRACE)]) == 2
    assert "--layer" in capsys.readouterr().err
    assert main(["calibrate", str(DEMO), "--trace", str(TRACE), "--layer", "body"]) == 2
    assert "GROUP=REGEX" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_calibrate_with_a_trace(tmp_path, capsys):
    out = tmp_path / "p.json"
    args = ["calibrate", str(DEMO), "--trace", str(TRACE.parent / "tiny_gpt.pt.trace.json.gz"),
            "--layer", r"body=layers\.\d+", "--layer", "head=embedding", "--layer", "tail=lm_head", "--out", str(out)]
    assert main(args) == 0
    assert "layer times from" in capsys.readouterr().out
    body = json.loads(out.read_text())["layers_description"][1]
    assert 5 < body["time"] < 60 and "backward_time" in body


def test_cli_design(capsys):
    assert main(["design", "--stages", "16", "--layers", "96", "--modes", "select", "comm"]) == 0
    text = capsys.readouterr().out
    assert "1 dry run(s)" in text and "select_comm_recompute:" in text and "condition number" in text
    assert main(["design", "--stages", "2", "--layers", "8", "--modes", "full"]) == 0
    assert "constant" in capsys.readouterr().out
    assert main(["design", "--stages", "1", "--layers", "8"]) == 2
    assert "stages = 1" in capsys.readouterr().err
    assert main(["design", "--stages", "4", "--layers", "8", "--modes", "fast"]) == 2

"""Designed dry runs: valid MindFormers configs, the fewest runs, every unknown identified."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sapptk.calibration import calibrate, design
from sapptk.calibration.dry_runs import RECOMPUTE_MODES
from sapptk.calibration.observations import observations_from_frame
from sapptk.errors import CalibrationError
from sapptk.profile import MODES
from sapptk.schedules import build
from sapptk.simulation import simulate

SUBSETS = [modes for r in range(len(RECOMPUTE_MODES) + 1) for modes in itertools.combinations(RECOMPUTE_MODES, r)]


def _check(stages: int, layers: int, modes: tuple[str, ...]) -> None:
    d = design(stages, layers, modes)
    k = len(d.unknowns)
    assert len(d.rounds) == math.ceil(k / stages), "not the fewest runs: R·p >= K is the only bound"
    assert d.folded == (("constant",) if stages == 2 else ())
    matrix = d.matrix.to_numpy()
    assert np.linalg.matrix_rank(matrix / np.linalg.norm(matrix, axis=0)) == k
    assert math.isfinite(d.condition) and d.condition >= 1
    frame = d.frame()
    frame["peak_mb"] = 0.0
    runs = observations_from_frame(frame).runs  # the calibration reader accepts every config
    for lists, run in zip(d.rounds, runs, strict=True):
        assert sum(lists["offset"]) == layers % stages
        per = run.cells.sum(axis=0)[0]
        assert (per >= 1).all() and per.sum() == layers
        for key in ("recompute", "select_recompute", "select_comm_recompute"):
            assert all(0 <= x <= n for x, n in zip(lists[key], per, strict=True))
        used = {MODES[r] for r in range(len(MODES)) if run.cells[r].any()}
        assert used <= {"none", *modes}


@pytest.mark.parametrize("stages", [2, 3, 5, 16])
def test_design_identifies_every_unknown_small_grid(stages):
    for modes in SUBSETS:
        _check(stages, 3 * stages + 1, modes)


@pytest.mark.slow
def test_design_identifies_every_unknown_for_2_to_32_stages_and_every_subset_of_modes():
    for stages in range(2, 33):
        for modes in SUBSETS:
            _check(stages, 3 * stages + 1, modes)


@pytest.mark.parametrize(("stages", "layers", "modes"), [(16, 96, ("select", "comm")), (2, 10, ("full",)),
                                                           (4, 62, ("select", "comm", "both", "full"))])
def test_calibrating_the_designed_runs_recovers_the_profile(rng, stages, layers, modes):
    d = design(stages, layers, modes, seed=3)
    truth = {"param": 1234.5, "head": 2222.0, "tail": 1111.0, "constant": -700.0 if stages > 2 else 0.0}
    truth |= {f"activation_{m}": float(rng.uniform(50, 900)) for m in ("none", *modes)}
    frame = d.frame()
    program = build("1f1b", stages=stages, micro_batches=stages)
    a = np.array([truth.get(f"activation_{m}", 0.0) for m in MODES])
    peaks = []
    for run in observations_from_frame(frame.assign(peak_mb=0.0)).runs:
        cells = run.cells[:, 0, :]
        par = truth["param"] * cells.sum(axis=0)
        par[0] += truth["head"]
        par[-1] += truth["tail"]
        sim = simulate(program, forward=1.0, backward=2.0, activation=a @ cells, params=par)  # constant: may be < 0
        peaks += (sim.peak_memory + truth["constant"]).tolist()
    frame["peak_mb"] = peaks
    cal = calibrate(frame)
    assert set(cal.unknowns) == set(d.unknowns)
    for key in d.unknowns:
        assert cal.coefficients[key] == pytest.approx(truth[key], rel=1e-9, abs=1e-6), key


def test_design_is_deterministic_per_seed():
    a, b = design(8, 40, ("select", "full"), seed=7), design(8, 40, ("select", "full"), seed=7)
    assert a.rounds == b.rounds and a.condition == b.condition
    assert design(8, 40, ("select", "full"), seed=8).rounds != a.rounds


def test_design_prints_mindformers_lists():
    text = design(16, 96, ("select", "comm")).to_yaml()
    assert "offset:" in text and "select_comm_recompute:" in text


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [((1, 10, ()), {}, "stages = 1"), ((4, 3, ()), {}, "layers = 3"), ((4, 40, ("fast",)), {}, "modes"),
     ((4, 40, ("select",)), {"rounds": 1}, "expected rounds >= 2"),
     ((4, 40, ()), {"schedule": "dualpipe-v"}, "chunks = 1")],
)
def test_design_refuses_bad_arguments(args, kwargs, needle):
    with pytest.raises(CalibrationError, match=needle):
        design(*args, **kwargs)

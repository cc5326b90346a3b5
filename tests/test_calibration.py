"""Calibration from dry runs: exactness on the reference's files, recovery of random profiles
under any schedule, true least squares, identifiability, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sapptk.calibration import calibrate, read_calibration_yaml
from sapptk.errors import CalibrationError, SapptkError
from sapptk.profile import MODES, bundled_profile, load_profile
from sapptk.schedules import build
from sapptk.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "calibration" / "init_demo.yaml"
ROUNDS = ROOT / "data" / "calibration" / "init_demo_pp4_rounds.yaml"


# ------------------------------------------------------------------- the reference's files
def test_init_demo_gives_demo_json_exactly():
    cal = calibrate(DEMO)
    c = cal.coefficients
    # the reference's square solve, by hand from the file (domain figures)
    assert c["param"] == pytest.approx(2141.75)
    assert c["activation_none"] == pytest.approx(852.5)
    assert c["activation_select"] == pytest.approx(767.25)
    assert c["activation_comm"] == pytest.approx(535.857142857, rel=1e-9)
    assert c["activation_both"] == pytest.approx(511.5)
    assert c["constant"] == pytest.approx(-1896.75)
    # the reference folds the constant into head and tail
    assert c["head"] + c["constant"] == pytest.approx(4245.25)
    assert c["tail"] + c["constant"] == pytest.approx(1203.25)
    assert cal.rank == 8 and cal.unidentified == ()
    assert cal.verified
    demo = bundled_profile("demo")
    assert cal.to_profile(integers=True).groups == demo.groups  # every figure, times 90/90/180 too
    assert [int(g.params) for g in cal.profile.groups] == [4245, 2141, 1203]


def test_init_demo_sapp_json_reads_back_as_demo(tmp_path):
    cal = calibrate(DEMO)
    path = tmp_path / "demo.json"
    text = cal.to_sapp_json(path, integers=True, name="demo")  # the reference names it with -m demo
    assert json.loads(text) == json.loads(path.read_text())
    assert load_profile(path).groups == bundled_profile("demo").groups
    entries = {e["name"]: e for e in json.loads(text)["layers_description"]}
    ref = {e["name"]: e for e in json.loads((ROOT / "data" / "demo.json").read_text())["layers_description"]}
    for name, entry in ref.items():
        for key, value in entry.items():
            assert entries[name][key] == value, (name, key)


def test_rounds_file_assigns_rounds_and_reads_ceil_offsets():
    dry = read_calibration_yaml(ROUNDS)
    assert len(dry.runs) == 2
    # offsets sum to -2 = 62 mod 4 - 4: stages hold ceil(62/4) + offset = 13, 16, 15, 18 layers (62 in all)
    for run in dry.runs:
        assert run.cells.sum(axis=(0, 1)).tolist() == [13, 16, 15, 18]
    sel = MODES.index("select")
    assert dry.runs[0].cells[sel, 0].tolist() == [1, 2, 2, 5]
    assert dry.runs[1].cells[sel, 0].tolist() == [1, 3, 6, 5]
    obs = dry.observations
    # head and tail belong to the first round; round 1 observes stage 1 only
    assert sorted(zip(obs["run"], obs["device"], obs["peak_mb"], strict=True)) == [
        (0, 0, 18799.0), (0, 1, 17546.0), (0, 2, 16887.0), (0, 3, 16788.0), (1, 1, 17794.0)]
    cal = calibrate(ROUNDS)
    assert cal.unidentified == ("constant",) and "constant" not in cal.coefficients
    assert cal.rank == 5
    design = cal.design.set_index(["run", "device"])
    # round 1, stage 1: 16 layers, 3 select, 13 none, 3 micro-batches in flight (1F1B, p - s)
    assert design.loc[(1, 1)].tolist() == [16.0, 39.0, 9.0, 0.0, 0.0]
    assert design.loc[(0, 1)].tolist() == [16.0, 42.0, 6.0, 0.0, 0.0]
    np.testing.assert_allclose(cal.residuals["residual_mb"], 0.0, atol=1e-6)
    # the file's peaks make activation_none and tail negative: no profile, a clear message
    with pytest.raises(CalibrationError, match="activation_none = -38.1"):
        _ = cal.profile


# ------------------------------------------------------------------- synthetic recovery
def _random_lists(rng: np.random.Generator, p: int, v: int, layers: int, modes: list[str]) -> tuple[dict, np.ndarray]:
    """Random valid MindFormers lists (v rows of p) and the cells (modes, v, p) they mean."""
    cells_n = p * v
    base, rem = divmod(layers, cells_n)
    per = np.full(cells_n, base)
    per[rng.choice(cells_n, rem, replace=False)] += 1
    for _ in range(cells_n * 2):  # random moves of one layer
        i, j = rng.integers(cells_n, size=2)
        if per[i] > 1:
            per[i] -= 1
            per[j] += 1
    per = per.reshape(v, p)
    cells = np.zeros((len(MODES), v, p), dtype=np.int64)
    for c in range(v):
        for s in range(p):
            left = int(per[c, s])
            chosen = [m for m in modes if m != "none"]
            rng.shuffle(chosen)
            picked_single = None
            for m in chosen:
                if m in ("select", "comm"):
                    if picked_single is not None:
                        continue
                    picked_single = m
                k = int(rng.integers(0, left + 1))
                cells[MODES.index(m), c, s] = k
                left -= k
            cells[MODES.index("none"), c, s] = left
    full, both = cells[MODES.index("full")], cells[MODES.index("both")]
    lists = {
        "offset": per - base,
        "recompute": full,
        "select_recompute": cells[MODES.index("select")] + both + full,
        "select_comm_recompute": cells[MODES.index("comm")] + both + full,
    }

    def spell(grid):
        rows = [[int(x) for x in row] for row in grid]
        return rows[0] if v == 1 else rows

    return {k: spell(g) for k, g in lists.items()}, cells


def _peaks(program, cells: np.ndarray, truth: dict) -> np.ndarray:
    """The simulator's peaks of a run whose layers cost ``truth`` (the oracle of the recovery test)."""
    nvs = program.num_virtual_stages
    act, par = np.zeros(nvs), np.zeros(nvs)
    a = np.array([truth.get(f"activation_{m}", 0.0) for m in MODES])
    for d, stages in enumerate(program.device_stages):
        for c, vs in enumerate(stages):
            act[vs] = cells[:, c, d] @ a
            par[vs] = truth["param"] * cells[:, c, d].sum()
    par[0] += truth["head"]
    par[-1] += truth["tail"]
    sim = simulate(program, forward=1.0, backward=2.0, activation=act, params=par)  # constant: may be < 0
    return sim.peak_memory.to_numpy() + truth["constant"]


RUNS = [  # schedule, p, v, m: m < p, m not a multiple of p, V placement
    ("1f1b", 4, 1, 4), ("1f1b", 4, 1, 2), ("interleaved", 4, 2, 6), ("interleaved", 4, 3, 8),
    ("dualpipe-v", 4, 2, 8), ("zb-h1", 4, 1, 5),
]


@pytest.mark.parametrize("modes", [["none", "select", "comm", "both"], ["none", "full"], ["none", "select", "full"]])
def test_recovers_a_random_profile_from_runs_under_several_schedules(rng, modes):
    truth = {"param": float(rng.uniform(500, 3000)), "head": float(rng.uniform(1000, 5000)),
             "tail": float(rng.uniform(500, 4000)), "constant": float(rng.uniform(-2000, 3000))}
    for m in modes:
        truth[f"activation_{m}"] = float(rng.uniform(50, 900))
    layers = 40
    rows = []
    for i, (schedule, p, v, mb) in enumerate(RUNS):
        lists, cells = _random_lists(rng, p, v, layers, modes)
        program = build(schedule, stages=p, micro_batches=mb, chunks=v)
        for d, peak in enumerate(_peaks(program, cells, truth)):
            rows.append({"run": f"r{i}", "device": d, "peak_mb": peak, "schedule": schedule, "stages": p,
                         "micro_batches": mb, "chunks": v, "layers": layers, **lists})
    frame = pd.DataFrame(rows)
    before = frame.copy(deep=True)
    cal = calibrate(frame)
    pd.testing.assert_frame_equal(frame, before)  # the user's table is not modified
    assert cal.unidentified == ()
    for key, value in truth.items():
        assert cal.coefficients[key] == pytest.approx(value, rel=1e-9, abs=1e-6), key
    np.testing.assert_allclose(cal.residuals["residual_mb"], 0.0, atol=1e-6)
    assert cal.verified


def test_interleaved_peak_depends_on_the_unknowns_and_is_read_at_the_right_point(rng):
    """Two chunks with different activations: which live point is highest depends on them."""
    program = build("interleaved-lm", stages=4, micro_batches=8, chunks=2)
    assert all(len(pts) > 1 for pts in program.live_points()[:3])
    for trial in range(3):
        truth = {"param": 100.0, "head": 300.0, "tail": 200.0, "constant": 50.0,
                 "activation_none": float(rng.uniform(10, 100)), "activation_full": float(rng.uniform(1, 10))}
        rows = []
        for i in range(4):
            lists, cells = _random_lists(rng, 4, 2, 24, ["none", "full"])
            for d, peak in enumerate(_peaks(program, cells, truth)):
                rows.append({"run": i, "device": d, "peak_mb": peak, "schedule": "interleaved-lm", "stages": 4,
                             "micro_batches": 8, "chunks": 2, "layers": 24, **lists})
        cal = calibrate(pd.DataFrame(rows))
        for key, value in truth.items():
            assert cal.coefficients[key] == pytest.approx(value, rel=1e-9), (trial, key)


# ----------------------------------------------------------------- true least squares
def _noisy_frame(rng) -> pd.DataFrame:
    truth = {"param": 900.0, "head": 2500.0, "tail": 1700.0, "constant": 400.0,
             "activation_none": 300.0, "activation_select": 250.0}
    rows = []
    for i, (schedule, p, v, mb) in enumerate([("1f1b", 6, 1, 8), ("1f1b", 6, 1, 6), ("interleaved-lm", 3, 2, 6)]):
        lists, cells = _random_lists(rng, p, v, 36, ["none", "select"])
        program = build(schedule, stages=p, micro_batches=mb, chunks=v)
        for d, peak in enumerate(_peaks(program, cells, truth)):
            rows.append({"run": i, "device": d, "peak_mb": peak + float(rng.normal(0, 150)), "schedule": schedule,
                         "stages": p, "micro_batches": mb, "chunks": v, "layers": 36, **lists})
    return pd.DataFrame(rows)


def test_the_fit_is_a_true_least_squares(rng):
    cal = calibrate(_noisy_frame(rng))
    a = cal.design[list(cal.unknowns)].to_numpy()
    y = cal.residuals["observed_mb"].to_numpy()
    x = cal.coefficients[list(cal.unknowns)].to_numpy()
    best, *_ = np.linalg.lstsq(a, y, rcond=None)
    np.testing.assert_allclose(x, best, rtol=1e-7, atol=1e-6)
    sse = cal.sum_of_squares
    assert sse > 0  # real noise: the model does not fit exactly
    np.testing.assert_allclose(cal.residuals["residual_mb"], y - a @ x, atol=1e-6)
    # the predictions are the exact (max over live points) model's peaks at the fitted values
    assert _exact_sse(cal, dict(zip(cal.unknowns, x, strict=True))) == pytest.approx(sse, rel=1e-9)


@pytest.mark.slow
def test_no_nearby_choice_of_the_unknowns_has_a_smaller_sum_of_squares(rng):
    cal = calibrate(_noisy_frame(rng))
    x = cal.coefficients[list(cal.unknowns)].to_numpy()
    sse = cal.sum_of_squares
    for _ in range(100):
        other = x + rng.normal(0, 1, len(x)) * np.maximum(1.0, np.abs(x)) * 10 ** rng.uniform(-6, -1)
        values = dict(zip(cal.unknowns, other, strict=True))
        assert _exact_sse(cal, values) >= sse - 1e-6 * sse


def _exact_sse(cal, values: dict) -> float:
    """Sum of squares of the max-over-live-points model at ``values`` (the simulator as oracle)."""
    total = 0.0
    runs = cal.dry_runs.runs
    truth = {"constant": 0.0, **{k: float(v) for k, v in values.items()}}
    for r, group in cal.dry_runs.observations.groupby("run"):
        run = runs[r]
        t = {f"activation_{m}": 0.0 for m in MODES} | truth
        if min(t[k] for k in t if k.startswith("activation")) < 0:
            continue
        peaks = _peaks(run.program, run.cells, t)
        total += float(((group["peak_mb"].to_numpy() - peaks[group["device"].to_numpy()]) ** 2).sum())
    return total


# ---------------------------------------------------------------------- identifiability
def test_under_determined_names_the_unknowns_and_the_observation_that_fixes_it():
    frame = _frame_1f1b(devices=[0, 2, 3, 5])
    with pytest.raises(CalibrationError) as info:
        calibrate(frame, constant=False)
    text = str(info.value)
    assert "cannot identify" in text and "rank" in text
    assert "observing the peak of device" in text
    # adding what it asks for identifies every unknown
    device = int(text.split("observing the peak of device ")[1].split()[0])
    full = _frame_1f1b(devices=[0, 2, 3, 5, device])
    assert calibrate(full, constant=False).unidentified == ()


def _frame_1f1b(devices: list[int]) -> pd.DataFrame:
    lists = {"offset": [0, 1, -1, 1, -1, 0], "select_recompute": [0, 1, 2, 0, 3, 1]}
    rows = []
    for d in devices:
        rows.append({"run": "a", "device": d, "peak_mb": 1000.0 + 37 * d, "stages": 6, "layers": 24, **lists})
    return pd.DataFrame(rows)


def test_constant_true_when_it_cannot_be_identified_is_an_error():
    with pytest.raises(CalibrationError, match="constant"):
        calibrate(ROUNDS, constant=True)


# ---------------------------------------------------------------------------- bad input
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "calib.yaml"
    path.write_text(text)
    return path


BASE = DEMO.read_text()


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("offset: [-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1]",
         "offset: [-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1]", "pipeline_config.offset has 15 entries"),
        ("offset: [-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1]",
         "offset: [-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, 1, 1]", "pipeline_config.offset sums to 2"),
        ("select_recompute: [1, 0, 0, 0, 1, 1, 2,", "select_recompute: [9, 0, 0, 0, 1, 1, 2,",
         r"recompute_config.select_recompute\[0\] = 9: expected at most 5"),
        ("stage_id: [6, 9, 10, 11, 12, 13]", "stage_id: [6, 9, 10, 11, 12, 16]",
         r"body_memories.stage_id\[5\] = 16: expected a stage id from 0 to 15"),
        ("memories: [49732, 50435, 32341, 41228, 23134, 30998]", "memories: [49732, 50435]",
         "body_memories.memories = .*: expected a list of 6 peaks"),
        ("pipeline_num: 16", "pipeline_num: sixteen", "pipeline_config.pipeline_num = 'sixteen'"),
        ("  head_memory: 77698\n", "", "memory_usage.head_memory is missing"),
        ("time_config:", "time_confg:", "unknown field 'time_confg'"),
    ],
)
def test_bad_calibration_files_name_the_file_and_field(tmp_path, old, new, needle):
    assert old in BASE
    path = _write(tmp_path, BASE.replace(old, new))
    before = path.read_bytes()
    with pytest.raises(CalibrationError, match=needle) as info:
        calibrate(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_bad_tables_are_refused_clearly():
    good = _frame_1f1b([0, 1, 2, 3, 4, 5])
    with pytest.raises(CalibrationError, match="column 'peak_mb' is missing"):
        calibrate(good.drop(columns="peak_mb"))
    bad = good.copy()
    bad.loc[2, "device"] = 6
    with pytest.raises(CalibrationError, match="device = 6: expected a device from 0 to 5"):
        calibrate(bad)
    bad = good.copy()
    bad["offset"] = [[0, 1, -1, 1, -1, 1]] * len(bad)
    with pytest.raises(SapptkError, match="offset sums to 1"):
        calibrate(bad)
    bad = good.copy()
    bad.loc[3, "layers"] = 30
    with pytest.raises(CalibrationError, match="described differently"):
        calibrate(bad)
    with pytest.raises(CalibrationError, match="expected a calibration YAML"):
        calibrate("observations.txt")


def test_csv_observations(tmp_path):
    frame = _frame_1f1b([0, 1, 2, 3, 4, 5])
    path = tmp_path / "obs.csv"
    frame.to_csv(path, index=False)
    a = calibrate(path, constant=False)
    b = calibrate(frame, constant=False)
    pd.testing.assert_series_equal(a.coefficients, b.coefficients)


@pytest.mark.parametrize("name", ["demo", "llama2_70b", "deepseek_v3"])
def test_profiles_write_sapp_json_that_reads_back_equal(tmp_path, name):
    profile = bundled_profile(name)
    path = tmp_path / f"{name}.json"
    profile.to_sapp_json(path)
    assert load_profile(path) == profile


def test_times_given_override_the_time_config():
    cal = calibrate(DEMO, times={"body": {"forward": 2.0, "backward": 5.0}, "tail": 3.0})
    body, tail, head = cal.profile.body[0], cal.profile.tail, cal.profile.head
    assert body.forward == 2.0 and body.modes["none"].backward == 5.0
    assert body.modes["comm"].backward == pytest.approx(5.0 + 0.125 * 2 * 2.0)
    assert tail.forward == 3.0 and tail.modes["none"].backward == 6.0
    assert head.forward == 90.0  # from time_config
    with pytest.raises(CalibrationError, match="unknown group 'middle'"):
        calibrate(DEMO, times={"middle": 1.0})
    with pytest.raises(CalibrationError, match="forward = -1"):
        calibrate(DEMO, times={"body": -1})
    frame_cal = calibrate(_frame_1f1b([0, 1, 2, 3, 4, 5]), constant=False)
    with pytest.raises(CalibrationError, match="no forward time for head, body, tail"):
        _ = frame_cal.profile


@pytest.mark.slow
def test_importing_the_calibration_package_loads_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, sapptk.calibration\n"
            "print([m for m in ('ortools', 'bokeh', 'ipywidgets', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"

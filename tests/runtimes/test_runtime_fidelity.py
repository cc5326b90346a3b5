"""``benchmarks/runtime_fidelity.py`` end to end on one small case (``runtimes`` extra).

Two gloo ranks run sapptk's ZB-H1 order (p = 2, m = 4, split backward) for 2 profiled steps;
the analysis then reads the ranks' traces. No timing is asserted: what is checked holds on
any machine. Every op of the program is in every step's trace, the fitted terms are
non-negative, and replaying a step with its own op durations and no gaps never exceeds the
span of that step's ops (the recorded starts respect the device orders and the dependencies,
so the earliest-start schedule the simulator computes ends no later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")

from sapptk.calibration.runtime_ops import op_samples, step_costs  # noqa: E402
from sapptk.formats.chrome_trace import read_trace  # noqa: E402
from sapptk.schedules import build  # noqa: E402
from sapptk.simulation import simulate  # noqa: E402

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "runtime_fidelity.py"


def _bench():
    spec = importlib.util.spec_from_file_location("runtime_fidelity", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_case_runs_and_its_trace_follows_the_program(tmp_path):
    bench = _bench()
    program = build("zb-h1", stages=2, micro_batches=4)
    program.to_csv(tmp_path / "zb-h1_m4.csv")
    cases = [{"id": "zb-h1_m4", "name": "zb-h1", "m": 4, "v": 1, "csv": str(tmp_path / "zb-h1_m4.csv"),
              "placement": [int(d) for d in program.placement]}]
    (tmp_path / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    args = argparse.Namespace(warmup=1, steps=2, malloc="heap", timeout=300.0)
    bench._run(tmp_path, cases, args)
    rows = bench.analyse(tmp_path)
    assert [(r["schedule"], r["m"]) for r in rows] == [("zb-h1", 4)]
    row = rows[0]
    assert row["overhead_ms"] >= 0 and row["comm_ms"] >= 0 and row["step_ms"] >= 0
    assert row["measured_ms"] > 0 and len(json.loads((tmp_path / "rank0.json").read_text())["zb-h1_m4"]
                                          ["unprofiled_ms"]) == 2
    ops = op_samples(read_trace(tmp_path / "zb-h1_m4_merged.json"))
    assert sorted(ops["step"].unique()) == [0, 1]
    assert len(ops) == 2 * program.num_ops
    for step, own in ops.groupby("step"):
        span = (own["start_ms"] + own["duration_ms"]).max() - own["start_ms"].min()
        replayed = simulate(program, **step_costs(program, ops, int(step))).step_time
        assert replayed <= span + 1e-6

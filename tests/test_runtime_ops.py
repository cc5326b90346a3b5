"""Op costs and the per-op runtime overhead from a pipeline run's trace (hand-made traces)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sapptk.calibration.runtime_ops import op_overhead, op_samples, stage_costs
from sapptk.errors import TraceError
from sapptk.formats.chrome_trace import read_trace
from sapptk.schedules import build
from sapptk.simulation import simulate


def _event(name, ts, dur, pid=0):
    return {"name": name, "cat": "user_annotation", "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 0}


def _one_f_one_b(tmp_path, overhead_us=100.0):
    """1F1B, p = 2, m = 2, F = 1 ms and B = 2 ms, every op followed by ``overhead_us`` of runtime
    work, the waits as ranges; laid out by hand from the worked case of docs/conventions.md."""
    o = overhead_us
    F, B = 1000.0, 2000.0
    ev = []
    # device 0: F0 F1 (wait) B0 (wait) B1 ; device 1: (wait) F0 B0 (wait) F1 B1
    def run(pid, name, dur, t):
        ev.append(_event(name, t, dur, pid))
        return t + dur + o

    t = run(0, "sapptk:F:0:0", F, 0.0)
    t = run(0, "sapptk:F:0:1", F, t)
    ev.append(_event("sapptk:wait", t, 2000.0, 0))
    t = run(0, "sapptk:B:0:0", B, t + 2000.0)
    ev.append(_event("sapptk:wait", t, 1000.0, 0))
    t_end0 = run(0, "sapptk:B:0:1", B, t + 1000.0)
    ev.append(_event("sapptk:wait", 0.0, F + o, 1))
    t = run(1, "sapptk:F:1:0", F, F + o)
    t = run(1, "sapptk:B:1:0", B, t)
    t = run(1, "sapptk:F:1:1", F, t)
    t_end1 = run(1, "sapptk:B:1:1", B, t)
    ev.append(_event("ProfilerStep#0", 0.0, t_end0, 0))
    ev.append(_event("ProfilerStep#0", 0.0, t_end1, 1))
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"traceEvents": ev}), encoding="utf-8")
    return read_trace(path)


def test_samples_costs_and_overhead_of_a_hand_laid_run(tmp_path):
    trace = _one_f_one_b(tmp_path)
    ops = op_samples(trace)
    assert len(ops) == 8 and set(ops["device"]) == {0, 1}
    assert ops.groupby("kind", observed=True)["duration_ms"].median().to_dict() == {"F": 1.0, "B": 2.0}
    overhead, frame = op_overhead(trace, ops)
    # device 0: span 4 ops + 3 ms of waits + 4 overheads; device 1: the same with 1.1 ms of wait
    assert overhead == pytest.approx(0.1)
    np.testing.assert_allclose(frame["overhead_ms"], [0.1, 0.1])
    costs = stage_costs(ops, 2)
    np.testing.assert_allclose(costs["forward"], [1.0, 1.0])
    np.testing.assert_allclose(costs["backward"], [2.0, 2.0])
    np.testing.assert_allclose(costs["weight"], [0.0, 0.0])
    program = build("1f1b", stages=2, micro_batches=2)
    assert simulate(program, **costs).step_time == pytest.approx(9.0)  # (m + p - 1)(F + B)
    with_overhead = stage_costs(ops, 2, overhead=overhead)
    assert simulate(program, **with_overhead).step_time == pytest.approx(9.0 + 6 * 0.1)  # 6 ops on the path


def test_split_backward_costs(tmp_path):
    ev = [_event("ProfilerStep#0", 0, 10_000), _event("sapptk:F:0:0", 0, 1000), _event("sapptk:I:0:0", 1000, 1500),
          _event("sapptk:W:0:0", 2500, 500)]
    path = tmp_path / "zb.json"
    path.write_text(json.dumps({"traceEvents": ev}), encoding="utf-8")
    costs = stage_costs(op_samples(read_trace(path)), 1, overhead=0.25)
    assert (costs["forward"][0], costs["backward"][0], costs["weight"][0]) == (1.25, 1.75, 0.75)


def test_clear_errors(tmp_path):
    path = tmp_path / "none.json"
    path.write_text(json.dumps({"traceEvents": [_event("ProfilerStep#0", 0, 10), _event("aten::mm", 1, 2)]}),
                    encoding="utf-8")
    trace = read_trace(path)
    with pytest.raises(TraceError, match="no op range named like"):
        op_samples(trace)
    with pytest.raises(TraceError, match="expected the named groups kind, stage and micro_batch"):
        op_samples(trace, r"sapptk:(?P<kind>F)")
    with pytest.raises(TraceError, match="no step ranges"):
        op_samples(trace, step="Step#.*")
    trace = _one_f_one_b(tmp_path)
    with pytest.raises(TraceError, match="overhead = -1"):
        stage_costs(op_samples(trace), 2, overhead=-1)
    with pytest.raises(TraceError, match="no F op of virtual stage 2"):
        stage_costs(op_samples(trace), 3)

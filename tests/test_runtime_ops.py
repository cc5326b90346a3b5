"""Op costs and the per-op runtime overhead from a pipeline run's trace (hand-made traces)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
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


def _model_run(tmp_path, name, m, v, *, overhead=0.3, comm=0.2, head=0.4, tail=0.7, steps=2, seed=0):
    """A trace laid out by the time model itself: every op of ``build(name)`` runs for its own
    random duration, then its device idles ``overhead`` ms; a crossing lags ``comm`` ms more;
    each device's step range opens ``head`` ms before the first op and closes ``tail`` ms after
    the last. Returns the trace path, the program and, per step, the span of its ops."""
    from sapptk.schedules import KINDS
    from sapptk.simulation import unit_times

    program = build(name, stages=2, micro_batches=m, chunks=v)
    g = program.graph
    rng = np.random.default_rng(seed)
    ev, spans = [], []
    t0 = 0.0
    for step in range(steps):
        dur = rng.uniform(0.5, 2.0, g.n_ops)
        unit_dur = np.array([sum(dur[i] + overhead for i in range(g.unit_op_ptr[u], g.unit_op_ptr[u + 1]))
                             for u in range(g.n_units)])
        start, end = unit_times(program, unit_dur, comm)
        first, last = [np.inf] * 2, [0.0] * 2
        for u in range(g.n_units):
            t = start[u]
            d = int(g.unit_device[u])
            for i in range(g.unit_op_ptr[u], g.unit_op_ptr[u + 1]):
                op = f"sapptk:{KINDS[g.op_kind[i]]}:{g.op_virtual_stage[i]}:{g.op_micro_batch[i]}"
                ev.append(_event(op, (t0 + t) * 1e3, dur[i] * 1e3, d))
                first[d], last[d] = min(first[d], t), max(last[d], t + dur[i])
                t += dur[i] + overhead
        for d in (0, 1):
            ev.append(_event(f"ProfilerStep#{step}", (t0 + first[d] - head) * 1e3,
                             (last[d] - first[d] + head + tail) * 1e3, d))
        spans.append(max(last) - min(first))
        t0 += float(end.max()) + 50.0
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"traceEvents": ev}), encoding="utf-8")
    return read_trace(path), program, spans


@pytest.mark.parametrize(("name", "m", "v"), [("1f1b", 4, 1), ("gpipe", 3, 1), ("zb-h1", 5, 1), ("interleaved", 4, 2),
                                              ("zb-v", 4, 2), ("dualpipe-v", 4, 2)])
def test_fit_runtime_gives_back_the_model_that_laid_the_trace(tmp_path, name, m, v):
    from sapptk.calibration.runtime_ops import fit_runtime, step_costs, unit_gaps

    trace, program, spans = _model_run(tmp_path, name, m, v)
    ops = op_samples(trace)
    fit = fit_runtime(program, ops, trace)
    assert fit.overhead == pytest.approx(0.3)
    assert fit.comm == pytest.approx(0.2)
    # the longest device range: its own ops' span + head + tail, at least the ops' span of both devices
    assert fit.step_ms >= 0
    gaps = fit.gaps
    own = gaps[gaps["bound"].isin(["device", "inside"])]
    np.testing.assert_allclose(own["gap_ms"], 0.3, atol=1e-6)
    np.testing.assert_allclose(gaps.loc[gaps["bound"] == "neighbour", "gap_ms"], 0.5, atol=1e-6)
    free = int((program.graph.unit_preds >= program.graph.n_units).all(axis=1).sum())  # units waiting for nothing
    assert free >= 1 and (gaps["bound"] == "first").sum() == 2 * free
    if name == "dualpipe-v":
        assert (gaps["bound"] == "inside").any()  # the overlapped units' inner gaps
    for step, span in enumerate(spans):  # a step replayed with its own durations is the step
        costs = step_costs(program, ops, step, overhead=fit.overhead)
        assert simulate(program, **costs, comm=fit.comm).step_time - fit.overhead == pytest.approx(span)
    with pytest.raises(TraceError, match="overhead = -1"):
        unit_gaps(program, ops, comm=-1)


def test_step_work_outside_the_ops(tmp_path):
    from sapptk.calibration.runtime_ops import fit_runtime

    trace, program, spans = _model_run(tmp_path, "1f1b", 4, 1, head=0.4, tail=0.7)
    ops = op_samples(trace)
    fit = fit_runtime(program, ops, trace)
    # device 0 opens first and closes last in 1F1B: its range is the ops' span + head + tail
    assert fit.step_ms == pytest.approx(1.1)
    assert fit_runtime(program, ops).step_ms == 0.0


def test_op_costs_keep_whole_and_split_backwards_apart(tmp_path):
    from sapptk.calibration.runtime_ops import op_costs

    trace, program, _ = _model_run(tmp_path, "dualpipe-v", 4, 2, steps=3)
    ops = op_samples(trace)
    costs = op_costs(program, ops, overhead=0.1)
    mean = ops.groupby(["kind", "virtual_stage"], observed=True)["duration_ms"].mean()
    g = program.graph
    from sapptk.schedules import KINDS

    kinds = {(KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]), int(g.op_micro_batch[i])) for i in range(g.n_ops)}
    assert any(k == "B" for k, _, _ in kinds) and any(k == "I" for k, _, _ in kinds)
    for kind, vs, mb in kinds:
        field = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}[kind]
        assert costs[field][vs, mb] == pytest.approx(mean[(kind, vs)] + 0.1)
    median = op_costs(program, ops, statistic="median")
    assert median["forward"][0, 0] == pytest.approx(ops[(ops["kind"] == "F") & (ops["virtual_stage"] == 0)]
                                                    ["duration_ms"].median())
    with pytest.raises(TraceError, match="statistic = 'max'"):
        op_costs(program, ops, statistic="max")
    with pytest.raises(TraceError, match="overhead = True"):
        op_costs(program, ops, overhead=True)


def test_a_trace_of_another_schedule_is_refused(tmp_path):
    from sapptk.calibration.runtime_ops import fit_runtime, op_costs, step_costs

    trace, _, _ = _model_run(tmp_path, "1f1b", 4, 1)
    ops = op_samples(trace)
    other = build("zb-h1", stages=2, micro_batches=4)
    with pytest.raises(TraceError, match=r"step 0: no I op of virtual stage \d, micro-batch \d in the trace"):
        fit_runtime(other, ops)
    with pytest.raises(TraceError, match="no I op"):
        step_costs(other, ops, 0)
    with pytest.raises(TraceError, match="program: expected a sapptk.schedules.Program"):
        fit_runtime("zb-h1", ops)
    with pytest.raises(TraceError, match="program: expected"):
        op_costs(None, ops)


def test_fit_messages_splits_the_gaps_by_sends_and_receives():
    """Gaps laid out as base + send + recv exactly give the three terms back."""
    from sapptk.calibration.runtime_ops import fit_messages, unit_messages

    program = build("interleaved", stages=2, micro_batches=4, chunks=2)
    sends, receives = unit_messages(program)
    assert sends.any() and receives.any() and not sends.all()
    rows = []
    n = program.graph.n_units
    for u in range(1, n):
        q = u - 1
        rows.append({"bound": "device", "unit": u, "after_unit": q,
                     "gap_ms": 0.2 + 0.5 * sends[q] + 0.25 * receives[u]})
    rows.append({"bound": "neighbour", "unit": 0, "after_unit": 0, "gap_ms": 0.2 + 0.5 + 0.3})
    base, send, recv, comm = fit_messages(program, pd.DataFrame(rows))
    assert (base, send, recv, comm) == pytest.approx((0.2, 0.5, 0.25, 0.3))
    with pytest.raises(TraceError, match="per-op overhead"):
        fit_messages(program, pd.DataFrame(rows[-1:]))

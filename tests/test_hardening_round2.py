"""The examples of issue 22 ("Hardened, second round"), each a test: every one used to end in a
raw exception, a hang or a silently wrong answer; each must now be a clear sapptk error (or a
correct result), naming the file or argument, the value and what was expected.

(The one-stage crash and the other degenerate shapes: ``test_degenerate_shapes.py``; plan
files: ``test_formats_plan_file.py``; schedule CSV, Megatron and torchtitan sizes: their
format tests; the time limits with every lever: ``benchmarks/time_limits.py``.)
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from sapptk import PipelineConfig, balance, checks
from sapptk.calibration import calibrate, chrome_layer_times, design, layer_times, mindspore_layer_times
from sapptk.errors import CalibrationError, ConfigError, TraceError
from sapptk.plan import even_split
from sapptk.sensitivity import robust_budget

CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "calibration" / "init_demo.yaml"


def _trace(tmp_path: Path, events: list, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return path


def _x(**fields) -> dict:
    return {"ph": "X", "name": "layer", "pid": 1, "tid": 1, "ts": 0, "dur": 5, **fields}


# ------------------------------------------------------------------------------ traces
@pytest.mark.parametrize(
    ("events", "needle"),
    [
        ([_x(dur=-5)], "event 0 (layer), dur = -5: expected a duration >= 0"),
        ([{"ph": "E", "pid": 1, "tid": 1, "ts": 3}, {"ph": "B", "name": "layer", "pid": 1, "tid": 1, "ts": 10}],
         "event 0 (): an 'E' (end) event with no open 'B'"),
        ([{"ph": "B", "name": "layer", "pid": 1, "tid": 1, "ts": 10}, {"ph": "E", "pid": 1, "tid": 1, "ts": 3}],
         "ends at ts = 3 µs, before its 'B' (event 0) begins at 10 µs"),
        ([_x(ts=10**400)], "event 0, ts = 1000"),
        ([_x(dur=[1])], "event 0, dur = [1]: expected a finite number"),
        ([_x(ts="soon")], "event 0, ts = 'soon': expected a time in µs"),
        ([_x(pid=[1])], "event 0, pid = [1]: expected an integer or a name"),
        ([_x(args=[1])], "event 0, args = [1]: expected a mapping"),
        ([_x(args={"micro_batch": 10**30})], "args.micro_batch = 1000000000000000000000000000000"),
    ],
)
def test_bad_trace_events_name_the_file_and_event(tmp_path, events, needle):
    path = _trace(tmp_path, events)
    with pytest.raises(TraceError) as exc:
        chrome_layer_times(path, "layer")
    assert str(exc.value).startswith(str(path)) and needle in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"layers": "(("}, "layers entry = '((': not a valid regex"),
        ({"layers": "layer", "step": "(?<=a)b+"}, None),  # Python's regex, not pandas' Arrow engine
        ({"layers": "layer", "step": "("}, "step = '(': not a valid regex"),
        ({"layers": "layer", "phases": {"forward": "(?P<x"}}, "phases['forward'] = '(?P<x': not a valid regex"),
        ({"layers": "x" * (checks.MAX_REGEX_CHARS + 1)}, "a regular expression of at most 10,000 characters"),
        ({"layers": "(a+)+$"}, "the repeated group '(a+)+' repeats inside"),  # would backtrack for ages
    ],
)
def test_user_regexes(tmp_path, options, needle):
    path = _trace(tmp_path, [_x()])
    if needle is None:
        assert len(chrome_layer_times(path, **options).samples) == 1
        return
    with pytest.raises(TraceError) as exc:
        chrome_layer_times(path, **options)
    assert needle in str(exc.value), str(exc.value)


def test_trace_times_come_out_non_negative(tmp_path):
    events = [{"ph": "B", "name": "layer", "pid": 1, "tid": 1, "ts": 10},
              {"ph": "E", "name": "layer", "pid": 1, "tid": 1, "ts": 14.5}, _x(ts=20, dur=2)]
    times = layer_times(_trace(tmp_path, events), "layer")
    assert times.samples["duration_ms"].tolist() == [0.0045, 0.002]


def test_mindspore_arguments_are_checked(tmp_path):
    path = _trace(tmp_path, [_x()])
    for kw, needle in (({"micro_batches": 10**30}, "micro_batches = 1000"),
                       ({"micro_batches": 2, "outlier_share": float("nan")}, "outlier_share = nan")):
        with pytest.raises(TraceError, match=needle):
            mindspore_layer_times(path, "layer", **kw)


def test_to_chrome_trace_refuses_a_folder_and_a_fifo(tmp_path, demo):
    sim = even_split(demo, PipelineConfig(2, 4)).simulation
    with pytest.raises(TraceError, match="expected a file name, not a folder"):
        sim.to_chrome_trace(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="expected a regular file"):
        sim.to_chrome_trace(fifo)  # opening a FIFO for writing would block until a reader comes
    with pytest.raises(TraceError, match="existing folder"):
        sim.to_chrome_trace(tmp_path / "missing" / "t.json")
    out = sim.to_chrome_trace(tmp_path / "t.json.gz")
    assert json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]


# ------------------------------------------------------------------------- calibration
def test_a_calibration_with_200000_stages_is_refused_before_any_table(tmp_path):
    data = yaml.safe_load(CALIBRATION.read_text(encoding="utf-8"))
    data["pipeline_config"]["pipeline_num"] = 200_000
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(CalibrationError, match="pipeline_num = 200000: expected an integer from 1 to 10,000"):
        calibrate(path)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"stages": 10**6, "layers": 10**6}, "stages = 1000000: expected an integer from 2 to 10,000"),
        ({"stages": 4, "layers": 8, "rounds": 10**6}, "rounds = 1000000: expected an integer from 1 to 1,000"),
        ({"stages": 4, "layers": 10**30}, "layers = 1000000000000000000000000000000"),
        ({"stages": 8, "layers": 16, "micro_batches": 10**9}, "micro_batches = 1000000000"),
        ({"stages": 2000, "layers": 4000}, "ops: expected at most 1,000,000"),
    ],
)
def test_design_sizes_are_checked_first(kw, needle):
    with pytest.raises(CalibrationError, match=needle):
        design(**kw)


# -------------------------------------------------------------------------- safe budgets
def test_a_tiny_oom_risk_is_a_budget_not_a_statistics_error():
    config = PipelineConfig(4, 8, memory_budget=60000.0, constant_memory=1000.0)
    tiny = robust_budget(config, oom_risk=1e-300, memory_error=0.02)
    usual = robust_budget(config, oom_risk=0.01, memory_error=0.02)
    assert 1000.0 < tiny < usual < 60000.0
    with pytest.raises(ConfigError, match="memory_margin = 1000000"):
        robust_budget(config, memory_margin=10**400)


@pytest.mark.slow
def test_balance_with_a_tiny_oom_risk(demo):
    plan = balance(demo, PipelineConfig(4, 8, memory_budget=1e6), time_limit=3, oom_risk=1e-300, memory_error=0.02)
    assert plan.solved and plan.fits


# ------------------------------------------------------------ the levers ask the same clock
def test_the_per_micro_batch_search_asks_the_clock_first(llama):
    """Past its deadline it returns at once and says so (it used to build its memory model first:
    8 s and about 1 GB at 64 x 256 x 4, outside the time limit)."""
    import time

    from sapptk import baselines
    from sapptk.solver.micro_batches import improve_per_micro_batch

    config = PipelineConfig(4, 8, memory_budget=1e6)
    counts = baselines.even_counts(llama, config, "full")
    found = improve_per_micro_batch(llama, config, counts, deadline=time.perf_counter() - 1)
    assert found.alternative is None and "not tried" in found.message


def test_the_offload_search_starts_no_simulation_it_cannot_finish(llama):
    import time

    import numpy as np

    from sapptk import baselines
    from sapptk.profile import MODES
    from sapptk.solver.offload_search import offload_search

    config = PipelineConfig(4, 8, memory_budget=1e6, recompute=(*MODES, "offload"), host_bandwidth=25.0)
    counts = baselines.even_counts(llama, config, "none")
    res = offload_search(llama, config, np.asarray(counts), deadline=time.perf_counter() - 1)
    assert res.evaluations == 0 and not res.improved and not res.complete
    res = offload_search(llama, config, np.asarray(counts), deadline=time.perf_counter() + 60)
    assert res.evaluations >= 1


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"times": {"body": 10**400}}, "times['body']: forward = 1000"),
        ({"weight_holds": 10**400}, "weight_holds = 1000"),
        ({"trace": 5}, "trace = 5: expected layer times"),
    ],
)
def test_calibrate_arguments_are_checked(kw, needle):
    with pytest.raises(CalibrationError, match=re.escape(needle)):
        calibrate(CALIBRATION, **kw)

"""Layer times from traces: a real torch.profiler trace against a direct measurement taken in
the same run, MindSpore's trace_view.json, any Chrome trace, and sapptk's own traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sapptk.calibration import calibrate, chrome_layer_times, layer_times, mindspore_layer_times, pytorch_layer_times
from sapptk.config import PipelineConfig
from sapptk.costs import simulate_counts
from sapptk.errors import TraceError
from sapptk.formats.chrome_trace import read_trace
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile

TRACES = Path(__file__).resolve().parent / "data" / "traces"
TORCH = TRACES / "tiny_gpt.pt.trace.json.gz"
DIRECT = TRACES / "tiny_gpt.direct.json"
MINDSPORE = TRACES / "mindspore_trace_view.json"
GPT_LAYERS = {"embedding": "head", r"layers\.\d+": "body", "lm_head": "tail"}


@pytest.fixture(scope="module")
def torch_times():
    return pytorch_layer_times(TORCH, GPT_LAYERS)


@pytest.fixture(scope="module")
def direct() -> pd.DataFrame:
    frame = pd.DataFrame(json.loads(DIRECT.read_text())["samples"])
    return frame[frame["step"] >= 1]  # the reader skips the first recorded step


@pytest.mark.slow
def test_pytorch_trace_matches_the_direct_measurement_within_one_percent(torch_times, direct):
    samples = torch_times.samples
    assert set(samples["step"]) == {1, 2, 3}  # warm-up step 0 skipped
    both = samples.merge(direct.rename(columns={"ms": "direct_ms"}), on=["layer", "phase", "step", "micro_batch"])
    body = both[both["group"] == "body"]
    assert len(body) == 2 * 3 * 2 * 3  # phases × layers × micro-batches × steps
    rel = (body["duration_ms"] / body["direct_ms"] - 1).abs()
    assert rel.max() < 0.01, body.assign(rel=rel).sort_values("rel").tail()
    medians = torch_times.medians()["body"]
    for phase in ("forward", "backward"):
        want = direct[direct["layer"].str.startswith("layers.") & (direct["phase"] == phase)]["ms"].median()
        assert medians[phase] == pytest.approx(want, rel=0.01), phase
    # head and tail are short: the profiler's own range costs tens of µs there
    ends = both[both["group"] != "body"]
    assert (ends["duration_ms"] - ends["direct_ms"]).abs().max() < 0.15


@pytest.mark.slow
def test_pytorch_backward_splits_into_input_and_weight(torch_times):
    s = torch_times.samples.pivot_table(index=["layer", "step", "micro_batch"], columns="phase",
                                        values="duration_ms", observed=True)
    np.testing.assert_allclose(s["input"] + s["weight"], s["backward"], rtol=1e-12)
    body = s.loc[[k for k in s.index if k[0].startswith("layers.")]]
    # a GPT block's linear layers: the weight gradients are a large share, never all of it
    assert ((body["weight"] > 0.15 * body["backward"]) & (body["weight"] < 0.6 * body["backward"])).all()
    summary = torch_times.summary()
    assert list(summary.columns) == ["group", "phase", "median_ms", "q25_ms", "q75_ms", "samples"]
    assert (summary["q25_ms"] <= summary["median_ms"]).all() and (summary["median_ms"] <= summary["q75_ms"]).all()


@pytest.mark.slow
def test_the_reader_picks_the_format():
    assert layer_times(TORCH, GPT_LAYERS).format == "pytorch"
    assert layer_times(MINDSPORE, "DecodeLayer", micro_batches=2).format == "mindspore"


@pytest.mark.slow
def test_no_matching_layer_names_is_a_clear_error():
    with pytest.raises(TraceError, match=r"tiny_gpt.*no record_function or module range .* 'decoder'"):
        pytorch_layer_times(TORCH, "decoder")
    with pytest.raises(TraceError, match="skip_steps = 9"):
        pytorch_layer_times(TORCH, GPT_LAYERS, skip_steps=9)
    with pytest.raises(TraceError, match="not a valid regex"):
        pytorch_layer_times(TORCH, {"layers.(": "body"})


def test_mindspore_trace_view_as_the_reference_reads_it():
    lt = mindspore_layer_times(MINDSPORE, {"LlamaEmbedding": "head", "LLamaDecodeLayer": "body", "lm_head": "tail"},
                               micro_batches=2)
    assert lt.medians() == {"head": {"forward": 0.3}, "body": {"forward": 1.0, "backward": 2.0},
                            "tail": {"forward": 0.5}}
    s = lt.samples
    assert set(s["step"]) == {2, 3, 4}  # five steps, the first two skipped
    forward = s[(s["group"] == "body") & (s["phase"] == "forward")]
    assert len(forward) == 4 * 3 - 1  # layer 2 in step 3 is an outlier (over 10 % of its step)
    assert not ((forward["layer"] == "2-LLamaDecodeLayer") & (forward["step"] == 3)).any()
    with pytest.raises(TraceError, match="no 'Scope Layer' process"):
        mindspore_layer_times(TORCH, "x", micro_batches=1)


def test_bad_trace_files(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match="bad.json: invalid JSON"):
        read_trace(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"events": []}))
    with pytest.raises(TraceError, match="no 'traceEvents'"):
        read_trace(other)


# ------------------------------------------------------------------ sapptk's own traces
def _one_layer_per_stage(schedule: str, chunks: int) -> tuple[Profile, PipelineConfig, np.ndarray]:
    modes = {"none": ModeCost(3.1, 10.0)}
    profile = Profile("round-trip", (LayerGroup("body", "body", 4 * chunks, 1.5, 2.0, modes),))
    config = PipelineConfig(4, 8, chunks, schedule)
    counts = np.zeros((1, len(MODES), 4 * chunks), dtype=np.int64)
    counts[0, 0] = 1
    return profile, config, counts


@pytest.mark.parametrize(("schedule", "chunks"), [("interleaved", 2), ("1f1b", 1), ("zb-h1", 1)])
def test_simulation_trace_reads_back_as_the_profiles_times(tmp_path, schedule, chunks):
    profile, config, counts = _one_layer_per_stage(schedule, chunks)
    sim = simulate_counts(profile, config, counts)
    path = sim.to_chrome_trace(tmp_path / "plan.json.gz")
    with gzip.open(path, "rt") as handle:
        data = json.load(handle)
    ops = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(ops) == len(sim.events)
    assert {e["pid"] for e in ops} == set(range(4))
    assert {"kind", "micro_batch", "virtual_stage", "chunk"} <= set(ops[0]["args"])
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert max(c["args"]["memory_mb"] for c in counters) == pytest.approx(sim.peak_memory.max())
    times = chrome_layer_times(path, {r"vs(?P<layer>\d+)$": "body"}).medians()["body"]
    assert times["forward"] == pytest.approx(1.5)
    if config.split_backward:
        w = sim.costs["weight"][0]
        assert times["input"] == pytest.approx(3.1 - w) and times["weight"] == pytest.approx(w)
    else:
        assert times["backward"] == pytest.approx(3.1)
    samples = chrome_layer_times(path, {r"vs(?P<layer>\d+)$": "body"}).samples
    assert set(samples["micro_batch"]) == set(range(8)) and set(samples["layer"]) == {str(i) for i in range(4 * chunks)}


@pytest.mark.slow
def test_calibrate_takes_times_from_a_trace(torch_times):
    cal = calibrate(Path(__file__).resolve().parents[1] / "data" / "calibration" / "init_demo.yaml", trace=torch_times)
    body = cal.profile.body[0]
    medians = torch_times.medians()
    assert body.forward == pytest.approx(medians["body"]["forward"])
    assert body.modes["none"].backward == pytest.approx(medians["body"]["backward"])
    assert body.modes["select"].backward == pytest.approx(medians["body"]["backward"] + 0.04 * 2 * body.forward)


def test_a_trace_without_ranges_says_how_to_get_them(tmp_path):
    """Only operators (no record_function, no with_stack): the error says so and what to do."""
    path = tmp_path / "ops_only.json"
    events = [{"name": "ProfilerStep#0", "cat": "user_annotation", "ph": "X", "ts": 0, "dur": 100, "pid": 1, "tid": 1}]
    events += [{"name": "aten::addmm", "cat": "cpu_op", "ph": "X", "ts": 10 + 20 * i, "dur": 5, "pid": 1, "tid": 1,
                "args": {"Sequence number": i}} for i in range(4)]
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    with pytest.raises(TraceError, match=r"ops_only.json: the trace has no record_function ranges and no module "
                                         r"events.*record_function\('<layer name>'\).*with_stack=True.*Block_"):
        pytorch_layer_times(path, "Block", skip_steps=0)

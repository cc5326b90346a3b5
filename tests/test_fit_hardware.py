"""fit_hardware and measured rows (sapptk.models.measured, sapptk.models.hardware_fit).

Oracle of the fit: rows whose "measured" figures the model itself made with known parameter
values; the fit must give those values back. The published rows (data/published/runs.yaml)
are checked for what the benchmark relies on: a source and a split on every row.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

import sapptk
from sapptk.errors import ConfigError
from sapptk.models import Parallel, card, hardware, load_measured_rows, measured_row
from sapptk.models.hardware_fit import fit_hardware, fittable, predict_row

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "published" / "runs.yaml"
FIT = ("matmul_efficiency", "constant_mb")


def _row(ident="r", **over):
    row = {
        "id": ident, "split": "fit", "stack": "s", "source": {"ref": "test", "where": "synthesized"},
        "model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "framework": "megatron",
        "layout": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 8, "vp": 1, "sharding": "distributed"},
        "schedule": "1f1b", "micro_batch_size": 1, "global_batch": 16, "seq_length": 2048, "recompute": "none",
        "dtype": "bf16", "measured": {"tokens_per_s_per_gpu": 5000.0},
    }
    row.update(over)
    return row


def _synthesized(truth, *, memory=True):
    """Rows whose measured step time and peak memory the model made on the card ``truth``."""
    shapes = [
        _row("a"),
        _row("b", layout={"tp": 2, "pp": 2, "cp": 1, "ep": 1, "dp": 2, "vp": 1}, global_batch=8),
        _row("c", micro_batch_size=2, recompute="full", seq_length=4096),
    ]
    out = []
    for row in shapes:
        p = predict_row(row, truth)
        measured = {"step_time_ms": p.step_ms}
        if memory:
            measured["peak_memory"] = {"value": p.peak_mb, "unit": "MB", "kind": "allocated"}
        out.append({**row, "measured": measured})
    return out


def test_fit_recovers_known_parameters():
    base = hardware("h100")
    truth = replace(base, matmul_efficiency=0.5, constant_mb=3500.0)
    result = fit_hardware(base, _synthesized(truth), parameters=FIT, prior_weight=0)
    assert result.identified == {"matmul_efficiency": True, "constant_mb": True}
    assert result.values["matmul_efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert result.values["constant_mb"] == pytest.approx(3500.0, rel=1e-3)
    assert result.hardware.matmul_efficiency == pytest.approx(0.5, rel=1e-3)
    assert "fitted by sapptk.fit_hardware on 3 measured rows" in result.hardware.source
    assert result.cost < 1e-8 < result.cost_before
    assert set(result.residuals.figure) == {"step", "memory"} and len(result.residuals) == 6
    assert result.residuals.error.abs().max() < 1e-3
    assert result.provenance["rows"] == ["a", "b", "c"]
    assert base.matmul_efficiency != 0.5  # the given card is not changed


def test_unidentified_parameter_stays_and_is_reported():
    base = hardware("h100")
    truth = replace(base, matmul_efficiency=0.45)
    result = fit_hardware(base, _synthesized(truth, memory=False), parameters=FIT, prior_weight=0)
    assert result.identified["matmul_efficiency"] is True
    assert result.values["matmul_efficiency"] == pytest.approx(0.45, rel=1e-3)
    reason = result.unidentified["constant_mb"]
    assert "not identified" in reason and "peak memory" in reason
    assert result.hardware.constant_mb == base.constant_mb
    assert set(result.residuals.figure) == {"step"}


def test_more_parameters_than_figures_leave_the_rest():
    base = hardware("h100")
    rows = _synthesized(replace(base, matmul_efficiency=0.5), memory=False)[:1]  # one figure: one step time
    result = fit_hardware(base, rows, parameters=["matmul_efficiency", "hbm_efficiency"], prior_weight=0)
    assert list(result.identified.values()).count(True) == 1
    (name, reason), = result.unidentified.items()
    assert "the 1 figures of these rows are taken by" in reason
    assert getattr(result.hardware, name) == getattr(base, name)
    assert sapptk.fit_hardware is fit_hardware  # the package's lazy export


def test_the_prior_weight_pulls_towards_the_card():
    base = hardware("h100")
    truth = replace(base, matmul_efficiency=0.5)
    rows = _synthesized(truth, memory=False)
    pulled = fit_hardware(base, rows, parameters=["matmul_efficiency"]).values["matmul_efficiency"]
    assert 0.5 < pulled < base.matmul_efficiency
    assert pulled == pytest.approx(0.5, abs=0.02)  # three rows outweigh a weak pull
    with pytest.raises(ConfigError, match="prior_weight = -1"):
        fit_hardware(base, rows, prior_weight=-1)


def test_fittable_names_are_fields_with_bounds():
    bounds = fittable(hardware("h100"))
    assert set(FIT) <= set(bounds)
    for name, (low, high) in bounds.items():
        assert low < high
        replace(hardware("h100"), **{name: (low + high) / 2})  # a field replace() accepts


@pytest.mark.parametrize("change, field", [
    (lambda r: r.pop("seq_length"), "'seq_length' is missing"),
    (lambda r: r["measured"].update(tokens_per_s_per_gpu=-5.0), "'measured.tokens_per_s_per_gpu' = -5.0"),
    (lambda r: r["measured"].update(tokens_per_s_per_gpu=math.nan), "'measured.tokens_per_s_per_gpu' = nan"),
    (lambda r: r.update(global_batch=math.nan), "'global_batch' = nan"),
    (lambda r: r["measured"].update(peak_memory={"value": 80, "unit": "GiB", "kind": "reserved"}),
     "is the unit GB"),
    (lambda r: r["measured"].update(peak_memory={"value": 60, "unit": "GiG", "kind": "reserved"}),
     "'measured.peak_memory.unit' = 'GiG'"),
    (lambda r: r["measured"].update(peak_memory={"value": 60, "unit": "GB"}), "'measured.peak_memory.kind' is"),
    (lambda r: r["layout"].update(ep=2), "'layout'.*no experts"),
    (lambda r: r.update(gpus=16), "'layout' = tp 1 × pp 1 × cp 1 × dp 8 = 8: expected the 16 GPUs"),
    (lambda r: r.update(split="train"), "'split' = 'train'"),
])
def test_bad_rows_name_the_row_and_field(change, field):
    row = _row("bad-row")
    row["layout"] = dict(row["layout"])
    row["measured"] = dict(row["measured"])
    change(row)
    with pytest.raises(ConfigError, match=r"measured row 'bad-row' \(row 1\).*" + field):
        fit_hardware("h100", [_row("good"), row])


def test_fit_refuses_held_out_rows_and_other_gpus():
    with pytest.raises(ConfigError, match=r"row 'held' \(row 0\): field 'split' = 'predict'"):
        fit_hardware("h100", [_row("held", split="predict")])
    with pytest.raises(ConfigError, match=r"row 'other' \(row 0\): field 'gpu' = 'a100': expected the card being"):
        fit_hardware("h100", [_row("other", gpu="a100")])


def test_published_rows_load_with_source_and_split():
    rows = load_measured_rows(RUNS)
    assert len(rows) >= 25
    for r in rows:
        assert r.split in ("fit", "predict")
        assert r.source["repository"] and len(r.source["commit"]) == 40 and r.source["where"], r.id
    assert {r.split for r in rows} == {"fit", "predict"}
    assert len({r.gpu for r in rows}) >= 2
    assert any(card(r.model).moe is not None for r in rows) and any(card(r.model).moe is None for r in rows)
    assert len({r.schedule for r in rows if r.pp > 1}) >= 2
    assert any(r.cp > 1 for r in rows) and any(r.sharding == "fsdp" for r in rows)
    assert any(r.dtype == "fp8" for r in rows) and any(r.memory_kind == "reserved" for r in rows)
    held = {r.stack for r in rows if r.split == "predict"} - {r.stack for r in rows if r.split == "fit"}
    assert held, "whole stacks are held out"


def test_a_fitted_card_keeps_calibrate_with_a_prior_working():
    base = hardware("h100")
    fitted = fit_hardware(base, _synthesized(replace(base, matmul_efficiency=0.5), memory=False),
                          parameters=FIT).hardware
    prior = sapptk.estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), fitted)
    cal = sapptk.calibrate(ROOT / "data" / "calibration" / "llama3.1-70b_tp8_dry_run.yaml", prior=prior)
    assert cal.scales["static"] == pytest.approx(1.08, rel=1e-6)
    assert cal.scales["activation"] == pytest.approx(1.25, rel=1e-6)


def test_measured_row_throughput_and_step_agree():
    r = measured_row(_row("t", measured={"tokens_per_s_per_gpu": 4096.0}))
    assert r.measured_step_ms == pytest.approx(16 * 2048 / (4096.0 * 8) * 1e3)
    assert r.tokens_per_s_per_gpu_at(r.measured_step_ms) == pytest.approx(4096.0)


def test_a_torchtitan_row_holds_the_loss_as_it_was_run() -> None:
    # one device holds the tail: the eager loss keeps 4·N·V and holds 8·N·V at its backward,
    # the compiled one 2·N·V and 2·N·V (bf16): 8·N·V bytes apart, N = 2048 tokens, V = 128256
    titan = _row(framework="torchtitan", gpus=8)
    eager = predict_row(titan).peak_mb
    compiled = predict_row({**titan, "compile_loss": True}).peak_mb
    assert eager - compiled == pytest.approx(8 * 2048 * 128256 / 1e6, abs=1e-3)  # figures kept to 1 kB


def test_a_torchtitan_pipeline_keeps_every_micro_batchs_logits_on_the_last_stage() -> None:
    from sapptk.models.hardware_fit import pipeline_outputs_mb

    # pp 2, dp 4, micro-batch 1, global batch 16: 4 micro-batches of 2048 tokens; vocabulary 128256
    layout = {"tp": 1, "pp": 2, "cp": 1, "ep": 1, "dp": 4, "vp": 1, "sharding": "fsdp"}
    titan = measured_row(_row(framework="torchtitan", layout=layout))
    assert titan.micro_batches == 4
    kept = 4 * 2 * 2048 * 128256 / 1e6  # micro-batches × 2 bytes (bf16) × tokens × vocabulary = 2101.2 MB
    assert pipeline_outputs_mb(titan, hardware("h100")) == pytest.approx(kept)
    reserved = measured_row({**_row(framework="torchtitan", layout=layout),
                             "measured": {"tokens_per_s_per_gpu": 5000.0,
                                          "peak_memory": {"value": 70, "unit": "GB", "kind": "reserved"}}})
    assert pipeline_outputs_mb(reserved, hardware("h100", allocator_reserve=0.25)) == pytest.approx(1.25 * kept)


def test_row_framework_turns_on_what_the_run_did() -> None:
    """torchtitan with pipeline parallelism and FSDP gathers once a step; a row naming DeepEP
    deduplicates the expert dispatch; neither elsewhere."""
    from sapptk.models.hardware_fit import row_framework

    fsdp = {"tp": 1, "pp": 2, "cp": 1, "ep": 1, "dp": 4, "vp": 1, "sharding": "fsdp"}
    titan_pp = measured_row(_row(framework="torchtitan", layout=fsdp))
    assert row_framework(titan_pp).fsdp_once_per_step
    titan_flat = measured_row(_row(framework="torchtitan", layout={**fsdp, "pp": 1, "dp": 8}))
    assert not row_framework(titan_flat).fsdp_once_per_step
    assert not row_framework(measured_row(_row(layout=fsdp))).fsdp_once_per_step  # Megatron: per micro-batch
    assert row_framework(measured_row(_row(deepep=True))).moe_dedup_dispatch
    assert not row_framework(measured_row(_row())).moe_dedup_dispatch
    assert row_framework(measured_row(_row(a2a_overlap=True))).moe_a2a_overlap  # 1F1B all-to-all overlap
    assert not row_framework(measured_row(_row())).moe_a2a_overlap
    with pytest.raises(ConfigError, match="'a2a_overlap' = 'yes': expected true or false"):
        measured_row(_row(a2a_overlap="yes"))


def test_unpaired_warm_up_chunks_expose_their_all_to_alls_by_hand() -> None:
    """Under the 1F1B all-to-all overlap the warm-up forwards and cool-down backwards have no
    partner: device d's 2·(pp − d − 1) + (vp − 1)·pp chunks (1F1B: pp − d − 1) expose what
    pairing hid. Qwen3-235B, one body group; the worst device decides."""
    import dataclasses

    import numpy as np

    from sapptk.config import PipelineConfig
    from sapptk.models import Parallel, estimate_profile, framework
    from sapptk.models.hardware_fit import unpaired_a2a_ms

    fw = dataclasses.replace(framework("megatron"), moe_a2a_overlap=True)
    profile = estimate_profile("qwen3-235b-a22b", Parallel(tp=2, ep=32, dp=16, etp=1), "h100", framework=fw)
    table = profile.provenance["operators"]
    at = {c: i for i, c in enumerate(table["columns"])}
    hidden = sum(r[at["time_ms"]] - r[at["exposed_ms"]] for r in table["rows"]
                 if r[at["overlapped_with"]] == "paired_microbatch")
    assert hidden > 0 and len(profile.body) == 1
    one = PipelineConfig(stages=2, micro_batches=4, chunks=1, schedule="1f1b")
    assert unpaired_a2a_ms(profile, np.array([[3, 2]]), one) == pytest.approx(1 * 3 * hidden, rel=1e-12)
    inter = PipelineConfig(stages=2, micro_batches=4, chunks=2, schedule="interleaved")
    # device 0 holds virtual stages 0 and 2: 2·1 + 1·2 = 4 warm-up chunks of (3 + 1)/2 layers
    assert unpaired_a2a_ms(profile, np.array([[3, 2, 1, 2]]), inter) == pytest.approx(4 * 2 * hidden, rel=1e-12)
    plain = estimate_profile("qwen3-235b-a22b", Parallel(tp=2, ep=32, dp=16, etp=1), "h100")
    assert unpaired_a2a_ms(plain, np.array([[3, 2]]), one) == 0.0  # no overlap, nothing unpaired

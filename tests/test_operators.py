"""The operator model of a layer and the achieved-efficiency hardware card (issue 31 items 1-5)."""

from __future__ import annotations

import dataclasses

import pytest

from sapptk.errors import ConfigError
from sapptk.models import (
    HARDWARE,
    Framework,
    Hardware,
    ModelCard,
    Parallel,
    card,
    estimate_profile,
    framework,
    hardware,
    operators,
)
from sapptk.models.estimate import layer_flops, static_bytes_per_parameter
from sapptk.models.ops import layer_param_split
from sapptk.models.timing import attention_ms, collective_ms, elementwise_ms, gemm_ms, placement, remote_node_share


def test_fittable_names_fields_with_bounds_holding_every_bundled_value() -> None:
    names = {f.name for f in dataclasses.fields(Hardware)}
    for hw in HARDWARE.values():
        bounds = hw.fittable()
        assert bounds and set(bounds) <= names
        for name, (low, high) in bounds.items():
            assert low < high and low <= getattr(hw, name) <= high, (hw.name, name)
            assert getattr(dataclasses.replace(hw, **{name: high}), name) == high


def test_hardware_rejects_a_share_above_one_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="attention_efficiency"):
        hardware("h100", attention_efficiency=1.5)
    with pytest.raises(ConfigError, match="launch_us"):
        hardware("h100", launch_us=-1)


# --- hand-worked operator times on a toy card with round numbers ----------------------------

TOY = Hardware("toy", peak_tflops=100.0, hbm_gb=80.0, hbm_tbps=1.0, intra_node_gbps=100.0, inter_node_gbps=10.0,
               gpus_per_node=8, sms=10, matmul_efficiency=0.5, peak_fp8_tflops=200.0, fp8_matmul_efficiency=0.5,
               attention_efficiency=0.4, attention_bwd_efficiency=0.2, hbm_efficiency=0.5, launch_us=10.0,
               comm_latency_us=20.0, intra_bus_efficiency=0.5, inter_bus_efficiency=0.5)
# rates: GEMM 100e9 × 0.5 = 5e10 FLOPs per ms; HBM 1e9 × 0.5 = 5e8 bytes per ms; launch 0.01 ms;
# bus 100e6 × 0.5 = 5e7 bytes per ms inside a node, 10e6 × 0.5 = 5e6 across; alpha 0.02 ms


def test_gemm_time_by_hand() -> None:
    # 1280 × 1280 × 1000: 10 × 10 tiles of 128, 10 full waves on 10 SMs: compute-bound
    assert gemm_ms(TOY, 1280, 1280, 1000) == pytest.approx(0.01 + 2 * 1280 * 1280 * 1000 / 5e10, rel=1e-12)
    # M = 1300 pads to 11 tiles: the padded tiles' FLOPs
    assert gemm_ms(TOY, 1300, 1280, 1000) == pytest.approx(0.01 + 2 * 110 * 128 * 128 * 1000 / 5e10, rel=1e-12)
    # 100 tiles on 12 SMs: 9 waves, 108 tile slots
    twelve = dataclasses.replace(TOY, sms=12)
    assert gemm_ms(twelve, 1280, 1280, 1000) == pytest.approx(0.01 + 2 * 108 * 128 * 128 * 1000 / 5e10, rel=1e-12)
    # roofline: at 0.01 TB/s the bytes (2 inputs bf16 + bf16 output) take longer than the FLOPs
    slow = dataclasses.replace(TOY, hbm_tbps=0.01)
    nbytes = 2 * (1280 * 1000 * 2) + 2 * 1280 * 1280
    assert gemm_ms(slow, 1280, 1280, 1000) == pytest.approx(0.01 + nbytes / (1e7 * 0.5), rel=1e-12)
    # FP8: the FP8 peak × its efficiency, 1-byte inputs
    assert gemm_ms(TOY, 1280, 1280, 1000, fp8=True) == pytest.approx(0.01 + 2 * 1280 * 1280 * 1000 / 1e11,
                                                                     rel=1e-12)


def test_attention_elementwise_and_collective_times_by_hand() -> None:
    # 128 keys: half the long-sequence rate; forward 0.4, backward 0.2 of 100 TFLOPS
    assert attention_ms(TOY, 1e12, 128) == pytest.approx(0.01 + 1e12 / (1e11 * 0.2), rel=1e-12)
    assert attention_ms(TOY, 1e12, 128, backward=True) == pytest.approx(0.01 + 1e12 / (1e11 * 0.1), rel=1e-12)
    assert elementwise_ms(TOY, 1e9) == pytest.approx(0.01 + 1e9 / 5e8, rel=1e-12)
    # all-reduce over 8 ranks in a node: 2·7/8 of the bytes at the intra bus bandwidth
    assert collective_ms(TOY, "all_reduce", 1e8, 8) == pytest.approx(0.02 + 1e8 * 2 * 7 / 8 / 5e7, rel=1e-12)
    # all-gather over 4 ranks 8 apart: across nodes, 3/4 of the bytes at the NIC
    assert placement(TOY, 4, 8) == ("inter", 1)
    assert collective_ms(TOY, "all_gather", 1e8, 4, 8) == pytest.approx(0.02 + 1e8 * 3 / 4 / 5e6, rel=1e-12)
    # all-to-all over 16 consecutive ranks: 7/16 of the bytes over NVLink, 8/16 over the NIC, the slower
    assert placement(TOY, 16, 1) == ("inter", 8)
    assert collective_ms(TOY, "all_to_all", 1e8, 16) == pytest.approx(0.02 + 8 / 16 * 1e8 / 5e6, rel=1e-12)
    # a ring step between ranks 4 apart in one node: the bytes once
    assert placement(TOY, 2, 4) == ("intra", 2)
    assert collective_ms(TOY, "send_recv", 1e8, 2, 4) == pytest.approx(0.02 + 1e8 / 5e7, rel=1e-12)
    assert collective_ms(TOY, "all_reduce", 1e8, 1) == 0.0


def _gpt(bias: bool = True, dropout: bool = True) -> ModelCard:
    return ModelCard(name="gpt-toy", model_type="gpt2", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=4,
                     head_dim=64, intermediate_size=1024, vocab_size=1000, norm="layernorm", gated_mlp=False,
                     linear_bias=bias, positions=2048, dropout=dropout)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("flash", [True, False])
def test_gpt_layer_operators_sum_to_the_textbook_flops(tp: int, flash: bool) -> None:
    b, s, h = 2, 512, 256
    table = operators(_gpt(), Parallel(tp=tp, seq_length=s, micro_batch_size=b, flash_attention=flash), TOY)
    fwd = table[(table["group"] == "layers") & (table["phase"] == "fwd")]
    core = {"attention_core", "attention_scores", "attention_values"}
    linear = fwd.loc[(fwd["kind"] == "gemm") & ~fwd["op"].isin(core), "flops"].sum()
    attention = fwd.loc[fwd["op"].isin(core), "flops"].sum()
    assert linear * tp == 24 * b * s * h**2
    # flash skips the masked half (causal); the unfused core computes the full square
    assert attention * tp == (2 if flash else 4) * b * s**2 * h


def test_profile_times_are_the_operator_tables_exposed_sums() -> None:
    par = Parallel(tp=2, seq_length=2048, dp=2)
    profile = estimate_profile("llama2-7b", par, "h100")
    table = operators("llama2-7b", par, "h100")
    for group in profile.groups:
        rows = table[table["group"] == group.name]
        assert group.forward == pytest.approx(rows.loc[rows["phase"] == "fwd", "exposed_ms"].sum(), abs=1e-5)
        for mode, cost in group.modes.items():
            back = rows.loc[(rows["phase"] == "bwd") | ((rows["phase"] == "recompute") & (rows["mode"] == mode)),
                            "exposed_ms"].sum()
            assert cost.backward == pytest.approx(back, abs=1e-5)
    assert {"group", "op", "phase", "count", "flops", "bytes", "time_ms", "overlapped_with", "m", "n", "k",
            "group_size", "placement"} <= set(table.columns)


def test_tp_communication_hides_under_gemms_only_where_the_framework_does() -> None:
    par = Parallel(tp=2, seq_length=4096)
    mega = operators("llama2-7b", par, "h100", framework="megatron")
    deep = operators("llama2-7b", par, "h100", framework="deepspeed")
    pick = (mega["group"] == "layers") & (mega["phase"] == "fwd")
    rs = mega[pick & (mega["op"] == "ffn_reduce_scatter")].iloc[0]
    fc2 = mega[pick & (mega["op"] == "fc2")].iloc[0]
    assert rs["overlapped_with"] == "fc2"
    assert rs["exposed_ms"] == pytest.approx(max(0.0, rs["time_ms"] - fc2["time_ms"]), abs=1e-12)
    same = deep[(deep["group"] == "layers") & (deep["phase"] == "fwd") & (deep["op"] == "ffn_reduce_scatter")].iloc[0]
    assert same["exposed_ms"] == same["time_ms"] > 0


def test_dp_gradient_reduction_per_step_hides_under_the_backward() -> None:
    par = Parallel(tp=8, dp=4, seq_length=8192)
    table = operators("llama3.1-70b", par, "h100")
    layer = table[table["group"] == "layers"]
    step = layer[layer["phase"] == "step"].set_index("op")
    assert set(step.index) == {"dp_grad_reduce_scatter", "dp_param_all_gather"}
    assert (step["placement"] == "inter").all() and (step["group_size"] == 4).all()  # tp 8 fills the node
    back = layer.loc[layer["phase"] == "bwd", "exposed_ms"].sum()
    rs = step.loc["dp_grad_reduce_scatter"]
    assert rs["exposed_ms"] == pytest.approx(max(0.0, rs["time_ms"] - back), abs=1e-9)
    unhidden = Framework("plain", tp_comm_overlap=False, cp_comm_overlap=False, overlap_grad_reduce=False,
                         overlap_param_gather=False, fsdp_prefetch=False)
    plain = operators("llama3.1-70b", par, "h100", framework=unhidden)
    row = plain[(plain["group"] == "layers") & (plain["op"] == "dp_grad_reduce_scatter")].iloc[0]
    assert row["exposed_ms"] == row["time_ms"] == pytest.approx(rs["time_ms"])


def test_fsdp_gathers_per_micro_batch_inside_the_node_and_holds_unsharded_layers() -> None:
    model = card("llama2-7b")
    par = Parallel(dp=8, sharding="fsdp", seq_length=4096)
    table = operators(model, par, "h100")
    layer = table[table["group"] == "layers"]
    ops = layer.set_index(["phase", "op"])
    params = model.layer_parameters(False)
    assert ops.loc[("fwd", "fsdp_all_gather"), "bytes"] == 2 * params  # bf16 weights, gathered
    again = ops.loc[("bwd", "fsdp_all_gather_bwd")]
    assert again["collective"] == "all_gather" and again["bytes"] == 2 * params  # gathered again for the backward
    rs = ops.loc[("bwd", "fsdp_grad_reduce_scatter")]
    assert rs["bytes"] == 4 * params and rs["placement"] == "intra" and rs["group_size"] == 8  # fp32 grads, one node
    assert (layer["phase"] != "step").all()  # nothing left for the step: no fp32 all-reduce across nodes
    fsdp = estimate_profile(model, par, "h100")
    zero1 = estimate_profile(model, dataclasses.replace(par, sharding="distributed"), "h100")
    assert fsdp.body[0].forward >= zero1.body[0].forward  # prefetched: hidden under the layer where it fits
    plain = Framework("plain", tp_comm_overlap=False, cp_comm_overlap=False, overlap_grad_reduce=False,
                      overlap_param_gather=False, fsdp_prefetch=False)
    exposed = estimate_profile(model, par, "h100", framework=plain).body[0].forward
    zero1_plain = estimate_profile(model, dataclasses.replace(par, sharding="distributed"), "h100", framework=plain)
    gather = collective_ms(hardware("h100"), "all_gather", 2 * params, 8)
    assert exposed == pytest.approx(zero1_plain.body[0].forward + gather, abs=2e-6)
    extra = fsdp.provenance["transient_mb"]["layers"]["none"] - zero1.provenance["transient_mb"]["layers"]["none"]
    assert extra == pytest.approx((2 * 2 + 4) * params / 1e6, rel=1e-6)  # two unsharded layers + their gradients


def test_expert_all_to_all_stays_in_the_node_with_tp_2_and_ep_8() -> None:
    """Issue 31's defect: the expert group was taken to span tp·cp·ep GPUs (6.54 ms at ep 8
    against 2.29 at ep 4). With expert-TP 1 the expert-parallel ranks are consecutive
    (Megatron's default expert-TP is tp: etp=1 is asked for, as MoE recipes do)."""
    model = card("qwen3-235b-a22b")
    table = operators(model, Parallel(tp=2, ep=8, dp=4, etp=1), "h100")
    a2a = table[(table["op"] == "dispatch_all_to_all") & (table["phase"] == "fwd")].iloc[0]
    assert a2a["placement"] == "intra" and a2a["group_size"] == 8
    ep4 = estimate_profile(model, Parallel(tp=2, ep=4, dp=4, etp=1), "h100").body[0].forward
    ep8 = estimate_profile(model, Parallel(tp=2, ep=8, dp=4, etp=1), "h100").body[0].forward
    assert ep8 < 1.1 * ep4


def test_expert_tp_follows_the_framework_and_shapes_the_expert_gemms() -> None:
    """Megatron's --expert-tensor-parallel-size defaults to tp; torchtitan's to 1. Qwen3-235B
    (128 experts of width 1536, top 8, hidden 4096) at tp 2, ep 4, dp 4, s 4096: a device
    holds 4096 / 2 = 2048 tokens (SP), routes 2048 x 8 = 16384 copies; with etp 2 the EP
    group's members are 2 apart (span 7: one node), the copies are gathered over the 2
    expert-TP ranks (32768 per device over 128 / 4 = 32 local experts: M = 1024) and each
    expert GEMM is half as wide (N = 2 x 1536 / 2 = 1536)."""
    model = card("qwen3-235b-a22b")
    mo = model.moe
    assert (mo.experts, mo.expert_size, mo.top_k, model.hidden_size) == (128, 1536, 8, 4096)
    par = Parallel(tp=2, ep=4, dp=4)
    megatron = estimate_profile(model, par, "h100")
    assert megatron.provenance["parallel"]["etp"] == 2 and "etp2" in megatron.name
    assert estimate_profile(model, par, "h100", framework="torchtitan").provenance["parallel"]["etp"] == 1
    table = operators(model, par, "h100").set_index(["op", "phase"])
    fc1 = table.loc[("expert_fc1", "fwd")]
    assert (fc1["m"], fc1["n"], fc1["k"], fc1["count"]) == (1024, 1536, 4096, 32)
    a2a = table.loc[("dispatch_all_to_all", "fwd")]
    assert a2a["group_size"] == 4 and a2a["placement"] == "intra" and a2a["bytes"] == 2 * 16384 * 4096
    gather = table.loc[("expert_all_gather", "fwd")]
    assert gather["group_size"] == 2 and gather["bytes"] == 2 * 32768 * 4096
    assert ("expert_reduce_scatter", "fwd") in table.index
    # the experts' parameters: 1/(ep x etp) of them; their optimizer over dp·cp·tp/(ep·etp) = 1 rank
    _, experts = layer_param_split(model, dataclasses.replace(par, etp=2), True)
    assert experts == pytest.approx(128 * 3 * 4096 * 1536 / 8)
    with pytest.raises(ConfigError, match="ep' = 8 \\(× etp = 2\\)"):
        estimate_profile(model, Parallel(tp=2, ep=8, dp=4), "h100")


def test_fp32_compute_doubles_activations_and_slows_gemms() -> None:
    model = card("llama2-7b")
    half = estimate_profile(model, Parallel(seq_length=2048), "h100")
    full = estimate_profile(model, Parallel(seq_length=2048, compute_dtype="fp32"), "h100")
    assert full.body[0].modes["full"].activation == pytest.approx(2 * half.body[0].modes["full"].activation)
    assert full.body[0].forward > 1.8 * half.body[0].forward


def test_bf16_moments_and_fp8_need_fp8_units() -> None:
    assert static_bytes_per_parameter(Parallel(sharding="none", moment_dtype="bf16"), 1) == 2 + 4 + 4 + 4
    with pytest.raises(ConfigError, match="moment_dtype"):
        Parallel(moment_dtype="fp16")
    with pytest.raises(ConfigError, match="fp8"):
        estimate_profile("llama2-7b", Parallel(fp8=True), "a100")
    fp8 = operators("llama2-7b", Parallel(fp8=True), "h100")
    fc1 = fp8[(fp8["op"] == "fc1") & (fp8["phase"] == "fwd")].iloc[0]
    assert fc1["dtype"] == "fp8"
    assert "fc1_fp8_cast" in set(fp8["op"])
    bf16 = estimate_profile("llama2-7b", Parallel(), "h100").body[0].forward
    assert estimate_profile("llama2-7b", Parallel(fp8=True), "h100").body[0].forward < bf16


def test_gpt_cards_follow_their_config_for_biases_and_dropout() -> None:
    config = {"model_type": "gpt2", "n_embd": 256, "n_head": 4, "n_layer": 2, "n_positions": 1024,
              "vocab_size": 1000}
    plain = ModelCard.from_hf({**config, "bias": False, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0})
    default = ModelCard.from_hf(config)
    assert default.linear_bias and default.dropout
    assert not plain.linear_bias and not plain.dropout
    assert plain.layer_parameters(False) == default.layer_parameters(False) - (3 * 256 + 256 + 1024 + 256)
    with pytest.raises(Exception, match="attn_pdrop"):
        ModelCard.from_hf({**config, "attn_pdrop": 1.5})


def test_reserved_memory_scales_the_dynamic_memory_by_the_allocator_reserve() -> None:
    hw = hardware("h100", allocator_reserve=0.2)
    alloc = estimate_profile("llama2-7b", Parallel(), hw)
    reserved = estimate_profile("llama2-7b", Parallel(), hw, memory="reserved")
    assert reserved.provenance["memory_figure"] == "reserved" and alloc.provenance["memory_figure"] == "allocated"
    assert reserved.body[0].modes["none"].activation == pytest.approx(1.2 * alloc.body[0].modes["none"].activation)
    assert reserved.body[0].params == alloc.body[0].params
    with pytest.raises(ConfigError, match="memory"):
        estimate_profile("llama2-7b", Parallel(), hw, memory="peak")


def test_full_recompute_transient_is_the_rebuilt_layer() -> None:
    profile = estimate_profile("llama2-7b", Parallel(seq_length=2048), "h100")
    modes = profile.body[0].modes
    transient = profile.provenance["transient_mb"]["layers"]
    assert transient["full"] - transient["none"] == pytest.approx(modes["none"].activation - modes["full"].activation,
                                                                  abs=1e-5)
    assert profile.provenance["constant_mb"] == pytest.approx(profile.provenance["context_mb"] + transient["full"])
    tail = profile.tail.modes["none"].activation
    assert tail == pytest.approx((2 * 2 * 2048 * 4096 + 2 * 4 * 2048 * 32000) / 1e6)  # norm in/out, logits + grad


def test_dualpipe_pair_hides_each_all_to_all_under_the_other_micro_batch() -> None:
    profile = estimate_profile("deepseek-v3", Parallel(tp=1, ep=64, dp=64, seq_length=4096), "h800")
    moe = next(g for g in profile.body if g.name == "moe")
    pair = profile.provenance["dualpipe_pair_ms"]["moe"]
    assert pair["sum"] == pytest.approx(moe.forward + moe.modes["none"].backward, abs=1e-5)
    compute_f = moe.forward - pair["forward_all_to_all"]
    compute_b = moe.modes["none"].backward - pair["backward_all_to_all"]
    by_hand = compute_f + compute_b + max(0.0, pair["forward_all_to_all"] - compute_b) + max(
        0.0, pair["backward_all_to_all"] - compute_f)
    assert pair["overlapped"] == pytest.approx(by_hand, abs=1e-5) and pair["overlapped"] < pair["sum"]


def test_fp32_and_fp8_gemm_rows_by_hand() -> None:
    """fc1 of the toy GPT layer, 1024 tokens × 1024 outputs × 256 inputs: 8 × 8 tiles, 7 waves on 10 SMs."""
    par = Parallel(seq_length=512, micro_batch_size=2)
    compute = 2 * 1024 * 1024 * 256 / (5e10 * 64 / 70)
    fp32 = operators(_gpt(), dataclasses.replace(par, compute_dtype="fp32"), TOY)
    row = fp32[(fp32["op"] == "fc1") & (fp32["phase"] == "fwd")].iloc[0]
    memory = (4 * (1024 * 256 + 256 * 1024) + 2 * 1024 * 1024) / 5e8
    assert row["time_ms"] == pytest.approx(0.01 + max(compute, memory) / 0.5, rel=1e-12)  # TF32: half the rate
    fp8 = operators(_gpt(), dataclasses.replace(par, fp8=True), TOY)
    row = fp8[(fp8["op"] == "fc1") & (fp8["phase"] == "fwd")].iloc[0]
    assert row["time_ms"] == pytest.approx(0.01 + compute / 2, rel=1e-12)  # FP8 peak 200 × 0.5: twice the rate
    cast = fp8[(fp8["op"] == "fc1_fp8_cast") & (fp8["phase"] == "fwd")].iloc[0]
    assert cast["bytes"] == 3 * 1024 * 256 and cast["time_ms"] == pytest.approx(0.01 + 3 * 1024 * 256 / 5e8)


def test_zero2_reduces_per_micro_batch_and_gathers_parameters_per_step() -> None:
    table = operators("llama2-7b", Parallel(dp=8, sharding="zero2"), "h100")
    layer = table[table["group"] == "layers"]
    assert set(layer.loc[layer["phase"] == "step", "op"]) == {"dp_param_all_gather"}
    rs = layer[(layer["phase"] == "bwd") & (layer["op"] == "zero2_grad_reduce_scatter")].iloc[0]
    assert rs["bytes"] == 4 * card("llama2-7b").layer_parameters(False) and rs["placement"] == "intra"


def test_flashattention2_frameworks_run_attention_at_the_cards_fa2_efficiency() -> None:
    fa2 = dataclasses.replace(TOY, attention_fa2_efficiency=0.2)  # half the card's best kernel (0.4)
    assert attention_ms(fa2, 1e12, 128, kernel="fa2") == pytest.approx(0.01 + 1e12 / (1e11 * 0.1), rel=1e-12)
    assert attention_ms(fa2, 1e12, 128, backward=True, kernel="fa2") == pytest.approx(0.01 + 1e12 / (1e11 * 0.05),
                                                                                     rel=1e-12)
    assert attention_ms(TOY, 1e12, 128, kernel="fa2") == attention_ms(TOY, 1e12, 128)  # 0: no separate figure

    def core(fw: str, hw: str) -> float:
        table = operators("llama3.1-8b", Parallel(seq_length=8192), hw, framework=fw)
        return float(table.loc[(table["op"] == "attention_core") & (table["phase"] == "fwd"), "time_ms"].iloc[0])

    assert core("torchtitan", "h100") > 1.6 * core("megatron", "h100")  # FlashAttention-2 on Hopper: 35 % vs 60 %
    assert core("torchtitan", "a100") == core("megatron", "a100")  # A100's best kernel is FlashAttention-2
    with pytest.raises(ConfigError, match="attention_kernel"):
        Framework("x", tp_comm_overlap=False, cp_comm_overlap=False, overlap_grad_reduce=False,
                  overlap_param_gather=False, fsdp_prefetch=False, attention_kernel="fa9")


@pytest.mark.parametrize("name", ["llama3.1-8b", "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b", "gpt2"])
def test_every_familys_operator_flops_are_its_layer_flops(name: str) -> None:
    """Dense GQA/SwiGLU, MoE (router, routed and shared experts), MLA and GPT: the forward
    GEMMs and the attention core of the operator list add up to ``layer_flops``."""
    model = card(name)
    par = Parallel(tp=2, seq_length=1024, dp=8, ep=8 if model.moe else 1)
    table = operators(model, par, "h100")
    for group in model.groups:
        if group.kind != "body":
            continue
        rows = table[(table["group"] == group.name) & (table["phase"] == "fwd")]
        flops = layer_flops(model, par, moe=group.moe)
        assert rows.loc[rows["kind"] == "gemm", "flops"].sum() == pytest.approx(flops["matmul"], rel=1e-12)
        assert rows.loc[rows["kind"] == "attention", "flops"].sum() == pytest.approx(flops["attention"], rel=1e-12)


def test_node_deduplicated_expert_dispatch_by_hand() -> None:
    """DeepEP sends a token once per remote node holding one of its experts. 128 experts over
    4 nodes (32 each), top 8: a node is missed with C(96, 8)/C(128, 8) = Π (96−i)/(128−i) =
    0.092747; 3 remote nodes × 0.907253 / 8 copies = 0.340220 of the buffer crosses the NIC
    (the plain all-to-all: 24/32 = 0.75)."""
    miss = 1.0
    for i in range(8):
        miss *= (96 - i) / (128 - i)
    assert miss == pytest.approx(0.0927473, rel=1e-6)
    assert remote_node_share(128, 8, 4) == pytest.approx(3 * (1 - miss) / 8, rel=1e-12)
    assert remote_node_share(128, 8, 4) == pytest.approx(0.340220, rel=1e-5)
    assert remote_node_share(128, 1, 4) == pytest.approx(3 / 4, rel=1e-12)  # one copy: nothing to merge
    assert remote_node_share(128, 8, 1) == 0.0
    # 16 consecutive ranks over 2 nodes, far share 0.25: NVLink 7/8 of 1e8 at 5e7 = 1.75 ms,
    # NIC 0.25 × 1e8 at 5e6 = 5 ms; the slower plus alpha
    assert collective_ms(TOY, "all_to_all", 1e8, 16, far_share=0.25) == pytest.approx(0.02 + 5.0, rel=1e-12)
    # in the operator table: Qwen3-235B, EP 32 across 4 H100 nodes, only with the framework flag
    model, par, h100 = card("qwen3-235b-a22b"), Parallel(tp=2, ep=32, dp=16, etp=1), hardware("h100")
    plain = operators(model, par, h100)
    dedup = operators(model, par, h100, framework=dataclasses.replace(framework("megatron"), moe_dedup_dispatch=True))
    pick = (plain["op"] == "dispatch_all_to_all") & (plain["phase"] == "fwd")
    nbytes = float(plain.loc[pick, "bytes"].iloc[0])
    alpha, inter = h100.comm_latency_us / 1e3, h100.inter_node_gbps * 1e6 * h100.inter_bus_efficiency
    assert float(plain.loc[pick, "time_ms"].iloc[0]) == pytest.approx(alpha + 24 / 32 * nbytes / inter, rel=1e-9)
    assert float(dedup.loc[pick, "time_ms"].iloc[0]) == pytest.approx(alpha + 0.340220 * nbytes / inter, rel=1e-5)


def test_fsdp_once_per_step_moves_the_gathers_to_the_step() -> None:
    """torchtitan with pipeline parallelism keeps a layer unsharded across micro-batches
    (``reshard_after_forward`` off) and reduce-scatters once after the last backward: no
    per-micro-batch FSDP rows, one all-gather (bf16 weights) and one reduce-scatter (fp32
    gradients) a step, over the 8 FSDP ranks of one node."""
    model, h100 = card("llama2-7b"), hardware("h100")
    par = Parallel(dp=8, sharding="fsdp", seq_length=4096)
    once = dataclasses.replace(framework("torchtitan"), fsdp_once_per_step=True)
    table = operators(model, par, h100, framework=once)
    layer = table[table["group"] == "layers"]
    assert not layer["op"].str.startswith("fsdp_").any()
    step = layer[layer["phase"] == "step"].set_index("op")
    params = model.layer_parameters(False)
    assert step.loc["dp_param_all_gather", "bytes"] == 2 * params
    assert step.loc["dp_grad_reduce_scatter", "bytes"] == 4 * params
    # 7/8 of the bytes at NVLink's bus bandwidth plus alpha, by hand
    intra, alpha = h100.intra_node_gbps * 1e6 * h100.intra_bus_efficiency, h100.comm_latency_us / 1e3
    assert step.loc["dp_param_all_gather", "time_ms"] == pytest.approx(alpha + 2 * params * 7 / 8 / intra, rel=1e-12)
    assert step.loc["dp_grad_reduce_scatter", "time_ms"] == pytest.approx(alpha + 4 * params * 7 / 8 / intra,
                                                                          rel=1e-12)
    # the reduce-scatter runs after the stage's last backward (pipelining's post-backward): exposed in full;
    # the all-gather hides under the first forward
    assert step.loc["dp_grad_reduce_scatter", "exposed_ms"] == step.loc["dp_grad_reduce_scatter", "time_ms"]
    assert step.loc["dp_param_all_gather", "overlapped_with"] == "layer"
    per_mb = estimate_profile(model, par, h100, framework="torchtitan").body[0]
    kept = estimate_profile(model, par, h100, framework=once).body[0]
    assert kept.forward <= per_mb.forward and kept.modes["none"].backward <= per_mb.modes["none"].backward


def test_moe_a2a_overlap_hides_each_all_to_all_under_its_paired_step_by_hand() -> None:
    """Megatron's combined 1F1B (``--overlap-moe-expert-parallel-comm``): the layer cut at the
    dispatch into A (attention, router, permute) and M (experts, combine, shared); the steps
    A_fwd ‖ combine_bwd, M_bwd ‖ dispatch_fwd, M_fwd ‖ dispatch_bwd, A_bwd ‖ combine_fwd. Each
    all-to-all keeps max(0, its time − its step's compute), plus 20/(132 − 20) of what it hid
    (DeepEP's 20 SMs taken from H100's 132 slow the compute beside it); compute rows are
    untouched."""
    model, h100 = card("qwen3-235b-a22b"), hardware("h100")
    par = Parallel(tp=2, ep=32, dp=16, etp=1)
    plain = operators(model, par, h100)
    paired = operators(model, par, h100, framework=dataclasses.replace(framework("megatron"), moe_a2a_overlap=True))
    layer = plain[(plain["group"] == "moe") & plain["phase"].isin(["fwd", "bwd"])]

    def compute(phase: str, before: bool) -> float:
        rows = layer[layer["phase"] == phase].reset_index(drop=True)
        cut = rows.index[rows["op"].str.startswith("dispatch_all_to_all")][0]
        part = rows.iloc[:cut] if before else rows.iloc[cut:]
        return float(part.loc[part["kind"] != "collective", "exposed_ms"].sum())

    a_f, m_f, a_b, m_b = compute("fwd", True), compute("fwd", False), compute("bwd", True), compute("bwd", False)
    under = {("fwd", "dispatch_all_to_all"): m_b, ("fwd", "combine_all_to_all"): a_b,
             ("bwd", "dispatch_all_to_all_bwd"): m_f, ("bwd", "combine_all_to_all_bwd"): a_f}
    for (phase, op), window in under.items():
        before = layer[(layer["phase"] == phase) & (layer["op"] == op)].iloc[0]
        after = paired[(paired["group"] == "moe") & (paired["phase"] == phase) & (paired["op"] == op)].iloc[0]
        assert after["time_ms"] == before["time_ms"]
        left = max(0.0, before["exposed_ms"] - window)
        # the compute beside it runs on 132 - 20 SMs: 20/112 of the hidden time comes back
        assert after["exposed_ms"] == pytest.approx(left + 20 / 112 * (before["exposed_ms"] - left), abs=1e-12)
        assert after["overlapped_with"] == "paired_microbatch"
    others = ~plain["op"].str.contains("all_to_all")
    assert (paired.loc[others, "exposed_ms"].to_numpy() == plain.loc[others, "exposed_ms"].to_numpy()).all()
    dense = operators(card("llama2-7b"), Parallel(dp=8), h100,
                      framework=dataclasses.replace(framework("megatron"), moe_a2a_overlap=True))
    assert (dense["exposed_ms"].to_numpy() == operators(card("llama2-7b"), Parallel(dp=8), h100)[
        "exposed_ms"].to_numpy()).all()  # no all-to-all, nothing changes


def test_full_recompute_under_fsdp_does_not_gather_the_layer_again() -> None:
    """The recomputed forward runs inside the backward on the parameters the backward's gather
    brought: the forward's FSDP all-gather is not rerun (two gathers a micro-batch, not three);
    the rerun compute hides the backward's gather and reduce-scatter besides the backward's:
    min(their exposed time, the rerun compute) less."""
    model = card("llama2-7b")
    par = Parallel(dp=16, sharding="fsdp", seq_length=4096)  # 16 ranks: across two nodes
    table = operators(model, par, "h100")
    rerun = table[(table["phase"] == "recompute") & (table["mode"] == "full")]
    assert not rerun["op"].str.startswith("fsdp_").any()  # no gather rerun (one row says what the rerun hides)
    assert (rerun["op"] == "qkv").any()  # the compute is rerun
    profile = estimate_profile(model, par, "h100")
    layer = table[(table["group"] == "layers") & (table["phase"] == "fwd")]
    again = float(layer.loc[layer["kind"] != "collective", "exposed_ms"].sum()) + float(
        layer.loc[~layer["op"].str.startswith("fsdp_") & (layer["kind"] == "collective"), "exposed_ms"].sum())
    # the rerun compute also widens the window of the backward's gather and reduce-scatter (across nodes here)
    bwd = table[(table["group"] == "layers") & (table["phase"] == "bwd")]
    waiting = float(bwd.loc[bwd["op"].str.startswith("fsdp_"), "exposed_ms"].sum())
    rerun_compute = float(layer.loc[layer["kind"] != "collective", "exposed_ms"].sum())
    hidden = min(waiting, rerun_compute)
    assert hidden > 0
    hides = rerun[rerun["op"] == "recompute_hides_backward_collectives"]
    assert len(hides) == 1 and float(hides["exposed_ms"].iloc[0]) == pytest.approx(-hidden, abs=1e-12)
    body = profile.body[0]
    assert body.modes["full"].backward == pytest.approx(body.modes["none"].backward + again - hidden, abs=1e-5)
    rows = table[table["group"] == "layers"]  # the table still sums to the profile's backward
    full = rows.loc[(rows["phase"] == "bwd") | ((rows["phase"] == "recompute") & (rows["mode"] == "full")),
                    "exposed_ms"].sum()
    assert body.modes["full"].backward == pytest.approx(full, abs=1e-5)


def test_a_prefetched_gather_across_nodes_hides_under_the_nodes_own_collectives_too() -> None:
    """FSDP's prefetched gathers run on the NIC while the layer computes and while its expert
    all-to-all (inside the node, NVLink) runs: the ``layer`` window is the compute plus the
    exposed collectives on the other link. Qwen3-235B, TP 2 × EP 8 inside a node, FSDP over
    the 32 nodes (dense over 128 ranks, experts over 32, both across nodes)."""
    model, h100 = card("qwen3-235b-a22b"), hardware("h100")
    par = Parallel(tp=2, ep=8, dp=128, etp=1, sharding="fsdp", micro_batch_size=4)
    table = operators(model, par, h100)
    fwd = table[(table["group"] == "moe") & (table["phase"] == "fwd")].set_index("op")
    dense, expert = fwd.loc["fsdp_all_gather"], fwd.loc["fsdp_expert_all_gather"]
    assert dense["placement"] == expert["placement"] == "inter"
    compute = float(fwd.loc[fwd["kind"] != "collective", "time_ms"].sum())
    nvlink = fwd[(fwd["kind"] == "collective") & (fwd["placement"] == "intra")]
    assert set(nvlink.index) >= {"dispatch_all_to_all", "combine_all_to_all"}
    window = compute + float(nvlink["exposed_ms"].sum()) - float((nvlink["time_ms"] - nvlink["exposed_ms"]).sum())
    # the TP collectives hide under their GEMMs (megatron): what they hide is taken from the compute
    first = min(window, dense["time_ms"])
    assert dense["exposed_ms"] == pytest.approx(dense["time_ms"] - first, abs=1e-9)
    assert expert["exposed_ms"] == pytest.approx(max(0.0, expert["time_ms"] - (window - first)), abs=1e-9)
    assert expert["exposed_ms"] < expert["time_ms"] - (compute - first)  # more hidden than the compute alone allows


def test_eager_elementwise_moves_the_bytes_of_torchtitans_unfused_kernels_by_hand() -> None:
    """torchtitan without torch.compile: RMSNorm moves 36 bytes an element (float() 2+4, pow
    4+4, mean 4, x·rsqrt 4+4, type_as 4+2, ·weight 2+2) against the fused 4: × 9; rotary 20
    against 4: × 5; SwiGLU 10 against 6: × 5/3; a residual add is one kernel either way."""
    from sapptk.models.ops import EAGER_BYTES

    assert EAGER_BYTES == {"norm": (6 + 8 + 4 + 8 + 6 + 4) / 4, "rope": (6 + 8 + 6) / 4, "swiglu": 10 / 6}
    model, h100, par = card("llama3.1-8b"), hardware("h100"), Parallel(dp=8, seq_length=8192)
    fused = dataclasses.replace(framework("torchtitan"), eager_elementwise=False)
    eager = operators(model, par, h100, framework="torchtitan").set_index(["group", "phase", "op"])
    plain = operators(model, par, h100, framework=fused).set_index(["group", "phase", "op"])
    launch = h100.launch_us / 1e3
    for op, mult in (("attention_norm", 9.0), ("rope", 5.0), ("swiglu", 10 / 6), ("attention_residual", 1.0)):
        for phase, name in (("fwd", op), ("bwd", op + "_bwd")):
            if ("layers", phase, name) not in plain.index:
                continue
            nbytes = plain.loc[("layers", phase, name), "bytes"]
            assert eager.loc[("layers", phase, name), "bytes"] == nbytes  # the table keeps the fused bytes
            by_hand = launch + mult * nbytes / (h100.hbm_tbps * 1e9 * h100.hbm_efficiency)
            assert eager.loc[("layers", phase, name), "time_ms"] == pytest.approx(by_hand, rel=1e-12)
    gemms = plain.reset_index()["kind"] == "gemm"
    assert (eager.reset_index().loc[gemms, "time_ms"].to_numpy() == plain.reset_index().loc[gemms, "time_ms"]
            .to_numpy()).all()

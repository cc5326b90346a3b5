"""Model cards, layouts, hardware and estimate_profile (sapptk.models; docs/estimation.md).

Oracles: published parameter counts (source named per card), the closed forms of
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
Table 2 and section 4) for their GPT shapes, the textbook forward FLOPs of a GPT layer
(24·b·s·h² for the linears, 2·b·s²·h for causal attention), and hand-computed cases.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace

import pytest

import sapptk
from sapptk.errors import ConfigError, ProfileError
from sapptk.models import (
    MODEL_TYPES,
    Hardware,
    ModelCard,
    Parallel,
    available,
    card,
    estimate_profile,
    hardware,
    layer_tensors,
    operators,
)
from sapptk.models.estimate import layer_flops, static_bytes_per_parameter
from sapptk.profile import MODES, LayerGroup, Profile

# (card, published total, source)
PUBLISHED = [
    ("llama2-7b", 6.74e9, "Llama 2 paper (Touvron et al. 2023) / HF model page: 6.74B"),
    ("llama2-13b", 13.0e9, "Llama 2 paper / HF model page: 13.0B"),
    ("llama2-70b", 68.98e9, "HF meta-llama/Llama-2-70b-hf safetensors: 68.98B (paper: 70B)"),
    ("llama3.1-8b", 8.03e9, "HF meta-llama/Llama-3.1-8B: 8.03B"),
    ("llama3.1-70b", 70.6e9, "HF meta-llama/Llama-3.1-70B: 70.6B"),
    ("llama3.1-405b", 405.9e9, "HF meta-llama/Llama-3.1-405B: 406B (405.9B)"),
    ("mixtral-8x7b", 46.7e9, "Mistral AI, 'Mixtral of experts' (2023): 46.7B total"),
    ("qwen2.5-72b", 72.7e9, "Qwen2.5-72B model card: 72.7B"),
    ("qwen3-32b", 32.8e9, "Qwen3-32B model card: 32.8B"),
    ("qwen3-235b-a22b", 235e9, "Qwen3-235B-A22B model card: 235B total, 22B activated"),
    ("deepseek-v3", 671e9, "DeepSeek-V3 technical report: 671B total (MTP module excluded), 37B activated"),
    ("gpt3-175b", 175e9, "Brown et al. 2020, Table 2.1: 175.0B"),
]


@pytest.mark.parametrize(("name", "published", "source"), PUBLISHED)
def test_parameter_count_matches_the_published_total(name, published, source):
    count = card(name).parameters()
    assert abs(count - published) / published < 0.005, f"{name}: {count:,} vs {published:,.0f} ({source})"


def test_every_bundled_card_has_a_published_count():
    assert {name for name, _, _ in PUBLISHED} | {"gpt2"} == set(available())


def test_exact_counts_by_hand():
    # GPT-2 small: 124,439,808 (the figure every GPT-2 reimplementation prints)
    assert card("gpt2").parameters() == 124_439_808
    # Llama-2-7B by hand: 32 × (4·4096² + 3·4096·11008 + 2·4096) + 2·32000·4096 + 4096
    assert card("llama2-7b").parameters() == 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert card("llama2-7b").parameters() == 6_738_415_616


def test_active_parameters_of_moe_cards():
    assert abs(card("qwen3-235b-a22b").active_parameters() - 22e9) / 22e9 < 0.01  # model card: 22B activated
    assert abs(card("deepseek-v3").active_parameters() - 37e9) / 37e9 < 0.02  # report: 37B activated
    assert card("llama2-7b").active_parameters() == card("llama2-7b").parameters()


def test_groups_in_model_order():
    groups = card("deepseek-v3").groups
    assert [(g.name, g.kind, g.count, g.moe) for g in groups] == [
        ("embedding", "head", 1, False),
        ("dense", "body", 3, False),
        ("moe", "body", 58, True),
        ("output", "tail", 1, False),
    ]
    assert [g.name for g in card("llama3.1-8b").groups] == ["embedding", "layers", "output"]
    assert [g.name for g in card("mixtral-8x7b").groups] == ["embedding", "moe", "output"]


def test_alternating_moe_layers_make_runs():
    data = json.loads(json.dumps(_qwen3_moe_config()))
    data["decoder_sparse_step"] = 2
    data["num_hidden_layers"] = 4
    made = ModelCard.from_hf(data)
    assert [(g.name, g.count) for g in made.groups] == [
        ("embedding", 1), ("dense_1", 1), ("moe_2", 1), ("dense_3", 1), ("moe_4", 1), ("output", 1)
    ]


def _qwen3_moe_config() -> dict:
    return {
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100,
    }


def test_tied_embeddings_count_once():
    data = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "vocab_size": 10, "tie_word_embeddings": True}
    tied = ModelCard.from_hf(data)
    untied = ModelCard.from_hf({**data, "tie_word_embeddings": False})
    assert untied.parameters() - tied.parameters() == 10 * 8
    # by hand: attention 4·64, MLP 3·8·16, norms 2·8; embedding 80; final norm 8
    assert tied.parameters() == 4 * 64 + 3 * 8 * 16 + 16 + 80 + 8


def test_from_hf_reads_a_file_and_a_folder(tmp_path):
    data = {**_qwen3_moe_config(), "some_other_field": [1, 2], "architectures": ["Qwen3MoeForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(data), encoding="utf-8")
    by_folder = ModelCard.from_hf(tmp_path)
    by_file = ModelCard.from_hf(tmp_path / "config.json")
    assert by_folder.parameters() == by_file.parameters() == ModelCard.from_hf(data).parameters()


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"model_type": "bert"}, ["model_type", "'bert'", "llama", "deepseek_v3", "gpt2"]),
        ({"hidden_size": None}, ["'hidden_size'", "missing"]),
        ({"num_hidden_layers": 0}, ["'num_hidden_layers'", "0", "integer >= 1"]),
        ({"num_attention_heads": -4}, ["'num_attention_heads'", "-4"]),
        ({"num_key_value_heads": 3}, ["num_key_value_heads", "3", "divisor"]),
        ({"vocab_size": 2.5}, ["'vocab_size'", "2.5"]),
        ({"tie_word_embeddings": "yes"}, ["tie_word_embeddings", "true or false"]),
    ],
)
def test_bad_configs_are_named(change, fragments):
    data = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    data.update(change)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ProfileError) as info:
        ModelCard.from_hf(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_bundled_names_list_the_known_ones():
    with pytest.raises(ProfileError, match="llama3.1-70b"):
        card("llama9")
    with pytest.raises(ConfigError, match="h100"):
        hardware("tpu")
    assert set(available("hardware")) == {"h100", "h800", "h200", "a100", "b200", "mi300x", "ascend910b"}
    assert set(MODEL_TYPES) >= {"llama", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gpt2"}


# --- Korthikanti et al. 2022: their GPT shapes, exactly -------------------------------------
# (name, heads a, hidden h, seq s, tensor parallel t) from Table 3 of the paper
KORTHIKANTI = [("22B", 64, 6144, 2048, 8), ("175B", 96, 12288, 2048, 8), ("530B", 128, 20480, 2048, 8),
               ("1T", 160, 25600, 2048, 8)]


def _gpt(a: int, h: int) -> ModelCard:
    return ModelCard.from_hf({"model_type": "gpt2", "n_embd": h, "n_head": a, "n_layer": 2, "n_positions": 2048,
                              "vocab_size": 51200})


def _layer_bytes(model: ModelCard, parallel: Parallel, mode: str) -> float:
    return sum(x.mb for x in layer_tensors(model, parallel) if mode in x.modes) * 1e6


@pytest.mark.parametrize(("name", "a", "h", "s", "t"), KORTHIKANTI)
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_closed_forms(name, a, h, s, t, b):
    model = _gpt(a, h)
    sbh = s * b * h
    no_par = Parallel(flash_attention=False, seq_length=s, micro_batch_size=b)
    tp = replace(no_par, tp=t, sequence_parallel=False)
    tp_sp = replace(no_par, tp=t, sequence_parallel=True)
    exact = [
        (no_par, "none", sbh * (34 + 5 * a * s / h)),  # eq. (1)
        (tp, "none", sbh * (10 + 24 / t + 5 * a * s / (h * t))),  # eq. (2)
        (tp_sp, "none", sbh * (34 + 5 * a * s / h) / t),  # eq. (4)
        (tp_sp, "select", 34 * sbh / t),  # eq. (6): selective recompute with SP
        (no_par, "full", 2 * sbh),  # full recompute: only the layer input
        (tp_sp, "full", 2 * sbh / t),
    ]
    for parallel, mode, expected in exact:
        got = _layer_bytes(model, parallel, mode)
        assert math.isclose(got, expected, rel_tol=1e-12), (name, parallel, mode, got, expected)
    # the profile carries the same figures (MB, rounded to 1e-6 MB = 1 byte)
    profile = estimate_profile(model, tp_sp, "a100")
    assert profile.body[0].modes["none"].activation == pytest.approx(sbh * (34 + 5 * a * s / h) / t / 1e6, abs=1e-6)


def test_flash_attention_drops_the_score_term():
    model = _gpt(96, 12288)
    s, h = 2048, 12288
    flash = Parallel(seq_length=s, flash_attention=True)
    # no s² tensors, no attention dropout (flash regenerates it): 34 − 5 (the masks and
    # dropout outputs of the core) ... the core keeps Q, K, V, the output and fp32 statistics
    got = _layer_bytes(model, flash, "none")
    assert math.isclose(got, s * h * 34 + 4 * s * 96, rel_tol=1e-12)


def test_gqa_swiglu_by_hand():
    # Llama-style layer, no dropout, flash: norm inputs 2+2, norm outputs 2+2, Q 2, K and V
    # 2·g/a each, attention output 2, FC1 output 2·2f/h, FC2 input 2f/h (units s·b·h bytes),
    # plus fp32 softmax statistics 4·s·b·a.
    model = card("llama2-70b")
    s, h, a, g, f = 4096, 8192, 64, 8, 28672
    got = _layer_bytes(model, Parallel(seq_length=s), "none")
    expected = s * h * (2 + 2 + 2 + 2 + 2 + 4 * g / a + 2 + 4 * f / h + 2 * f / h) + 4 * s * a
    assert math.isclose(got, expected, rel_tol=1e-12)


def test_gpt_layer_flops_are_the_textbook_ones():
    model = _gpt(96, 12288)
    s, b, h = 2048, 2, 12288
    flops = layer_flops(model, Parallel(seq_length=s, micro_batch_size=b))
    assert flops["matmul"] == 24 * b * s * h**2
    assert flops["attention"] == 2 * b * s**2 * h  # causal: half of 4·b·s²·h
    split = layer_flops(model, Parallel(seq_length=s, micro_batch_size=b, tp=4))
    assert split["matmul"] == 24 * b * s * h**2 / 4


@pytest.mark.parametrize("name", ["llama3.1-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "qwen3-235b-a22b"])
@pytest.mark.parametrize(
    "parallel",
    [
        Parallel(seq_length=2048),
        Parallel(tp=2, sequence_parallel=True, seq_length=2048, micro_batch_size=2),
        Parallel(flash_attention=False, seq_length=2048),
    ],
)
def test_modes_are_monotone(name, parallel):
    profile = estimate_profile(card(name), parallel, "h100")
    for group in profile.body:
        act = {m: group.modes[m].activation for m in MODES}
        back = {m: group.modes[m].backward for m in MODES}
        assert act["none"] >= act["select"] >= act["both"] > act["full"] > 0
        assert act["none"] >= act["comm"] >= act["both"]
        assert back["none"] <= back["select"] <= back["both"] <= back["full"]
        assert back["none"] <= back["comm"] <= back["both"]
        assert group.forward > 0 and group.params > 0


def test_static_bytes_per_parameter():
    assert static_bytes_per_parameter(Parallel(sharding="none"), 8) == 18  # 2 + 4 + 12
    assert static_bytes_per_parameter(Parallel(sharding="distributed"), 8) == 6 + 12 / 8
    assert static_bytes_per_parameter(Parallel(sharding="zero2"), 8) == 2 + 16 / 8
    assert static_bytes_per_parameter(Parallel(sharding="fsdp"), 8) == 18 / 8
    assert static_bytes_per_parameter(Parallel(sharding="none", grad_dtype="bf16"), 1) == 16
    assert static_bytes_per_parameter(Parallel(sharding="none", compute_dtype="fp32"), 1) == 16  # no master copy
    assert static_bytes_per_parameter(Parallel(sharding="none", adam=False), 1) == 6


def test_static_memory_of_a_dense_layer_by_hand():
    model = card("llama2-7b")
    profile = estimate_profile(model, Parallel(tp=2, sharding="none"), "h100")
    h, f = 4096, 11008
    per_layer = (4 * h * h + 3 * h * f) / 2 + 2 * h  # norms replicated
    assert profile.body[0].params == pytest.approx(per_layer * 18 / 1e6, abs=1e-6)
    assert profile.head.params == pytest.approx(32000 * h / 2 * 18 / 1e6, abs=1e-6)
    assert profile.tail.params == pytest.approx((32000 * h / 2 + h) * 18 / 1e6, abs=1e-6)


def test_experts_are_split_by_ep_and_sharded_over_expert_dp():
    model = card("mixtral-8x7b")
    par = Parallel(tp=1, ep=8, dp=8, sharding="distributed")
    h, f = 4096, 14336
    dense = 2 * h * h + 2 * h * 1024 + 8 * h + 2 * h  # attention, router, norms
    experts = 8 * 3 * h * f / 8
    expected = dense * (6 + 12 / 8) + experts * (6 + 12 / 1)  # expert dp = dp·cp·tp / ep = 1
    assert estimate_profile(model, par, "h100").body[0].params == pytest.approx(expected / 1e6, abs=1e-6)


def test_time_scales_with_efficiency_and_peak():
    """The GEMMs' time is their FLOPs at peak × efficiency (issue 31: one fixed efficiency
    became a per-shape model; at tp = 1 and 4096 tokens every GEMM of Llama-2-7B fills
    whole tiles, so with no launch cost their time is the FLOPs at peak × efficiency ×
    wave quantization, and halving the efficiency doubles it)."""
    model = card("llama2-7b")
    fast = operators(model, Parallel(), hardware("h100", launch_us=0.0))
    slow = operators(model, Parallel(), hardware("h100", launch_us=0.0, matmul_efficiency=0.375))
    gemm = (fast["kind"] == "gemm") & (fast["group"] == "layers") & (fast["phase"] == "fwd")
    assert (slow.loc[gemm, "time_ms"] / fast.loc[gemm, "time_ms"]).to_numpy() == pytest.approx(2.0, rel=1e-9)
    s, h, f = 4096, 4096, 11008
    assert fast.loc[gemm, "flops"].sum() == 2 * s * (4 * h * h + 3 * h * f)
    qkv = fast[gemm & (fast["op"] == "qkv")].iloc[0]  # 4096 × 12288 × 4096: 32 × 96 tiles, 3072 / 132 SMs
    waves = 3072 / (24 * 132)
    assert qkv["time_ms"] == pytest.approx(2 * s * 3 * h * h / (989e9 * 0.75 * waves), rel=1e-12)
    none = estimate_profile(model, Parallel(), "h100").body[0]
    assert none.modes["full"].backward == pytest.approx(none.modes["none"].backward + none.forward, abs=1e-5)


def test_profile_is_a_normal_profile_with_provenance(tmp_path):
    profile = sapptk.estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), "h100")
    assert isinstance(profile, Profile)
    assert [g.name for g in profile.groups] == ["embedding", "layers", "output"]
    assert profile.provenance["card"]["name"] == "llama3.1-70b"
    assert profile.provenance["parallel"]["tp"] == 8
    assert profile.provenance["hardware"]["name"] == "h100"
    assert profile.provenance["memory_figure"] == "allocated" and profile.provenance["framework"] == "megatron"
    assert "norm statistics (4-8 bytes per token) and integer routing indices" in profile.provenance["not_modelled"]
    assert profile.provenance["operators"]["rows"]
    path = tmp_path / "p.yaml"
    profile.to_yaml(path)
    back = sapptk.load_profile(path)
    assert back == profile
    assert back.provenance == json.loads(json.dumps(profile.provenance))


@pytest.mark.parametrize(
    ("name", "parallel", "fragments"),
    [
        ("llama2-70b", dict(tp=16), ["'tp' = 16", "key/value heads"]),
        ("llama2-7b", dict(tp=3, seq_length=4098), ["'tp' = 3", "attention heads"]),
        ("mixtral-8x7b", dict(ep=16, dp=16), ["'ep' = 16", "8 experts"]),
        ("llama2-7b", dict(ep=2, dp=2), ["'ep' = 2", "no experts"]),
        ("mixtral-8x7b", dict(tp=2, sequence_parallel=False), ["sequence_parallel", "MoE"]),
        ("gpt2", dict(seq_length=2048), ["seq_length", "1024 learned positions"]),
    ],
)
def test_layouts_the_card_refuses(name, parallel, fragments):
    with pytest.raises(ConfigError) as info:
        estimate_profile(name, Parallel(**parallel), "h100")
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        (dict(tp=0), ["'tp' = 0"]),
        (dict(micro_batch_size=-1), ["'micro_batch_size' = -1"]),
        (dict(seq_length=4097, cp=2), ["seq_length", "multiple of cp = 2"]),
        (dict(seq_length=4100, tp=8), ["seq_length", "cp × tp = 8"]),
        (dict(sharding="zero9"), ["sharding", "fsdp"]),
        (dict(compute_dtype="int8"), ["compute_dtype"]),
        (dict(cp=2, flash_attention=False), ["flash"]),
        (dict(ep=3, dp=4), ["'ep' = 3", "dp × cp × tp"]),
        (dict(tp=True), ["'tp' = True"]),
    ],
)
def test_bad_layouts(fields, fragments):
    with pytest.raises(ConfigError) as info:
        Parallel(**fields)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        (dict(peak_tflops=0), ["peak_tflops", "> 0"]),
        (dict(peak_tflops=float("nan")), ["peak_tflops"]),
        (dict(matmul_efficiency=1.5), ["matmul_efficiency", "(0, 1]"]),
        (dict(hbm_gb=-80), ["hbm_gb"]),
        (dict(constant_mb=-1), ["constant_mb"]),
    ],
)
def test_bad_hardware(fields, fragments):
    with pytest.raises(ConfigError) as info:
        hardware("h100", **fields)
    for fragment in fragments:
        assert fragment in str(info.value)
    with pytest.raises(ConfigError, match="unknown field 'peak'"):
        hardware("h100", peak=1.0)


def test_hardware_overrides_and_cards():
    h = hardware("H100", hbm_gb=94.0)
    assert isinstance(h, Hardware) and h.hbm_gb == 94.0 and h.memory_mb == 94000.0
    assert hardware("b200").peak_tflops > hardware("h100").peak_tflops > hardware("a100").peak_tflops


_LONG_CONTEXT = {"kv_mb_per_token", "attention_share"} <= {f.name for f in fields(LayerGroup)}


@pytest.mark.skipif(not _LONG_CONTEXT, reason="the profile types have no long-context fields on this branch")
def test_long_context_fields():
    profile = estimate_profile("llama3.1-70b", Parallel(tp=8, cp=2, seq_length=8192, micro_batch_size=2), "h100")
    assert profile.seq_length == 8192
    group = profile.body[0]
    # K and V: 8 KV heads of 128, bf16, 2 samples per position, split over tp 8 and cp 2
    assert group.kv_mb_per_token == pytest.approx(2 * 8 * 128 * 2 * 2 / (8 * 2) / 1e6)
    longer = estimate_profile("llama3.1-70b", Parallel(tp=8, cp=2, seq_length=32768, micro_batch_size=2), "h100")
    assert 0 < group.attention_share < longer.body[0].attention_share < 1


def test_a_hardware_card_of_your_own():
    mine = hardware({"name": "x1", "peak_tflops": 500, "hbm_gb": 96, "hbm_tbps": 4, "intra_node_gbps": 400,
                     "inter_node_gbps": 50})
    assert mine.peak_tflops == 500.0 and mine.matmul_efficiency == 0.75
    with pytest.raises(ConfigError, match="field 'peak_tflops' is missing"):
        hardware({"name": "x1", "hbm_gb": 96, "hbm_tbps": 4, "intra_node_gbps": 400, "inter_node_gbps": 50})
    with pytest.raises(ConfigError, match="unknown field 'tflops'"):
        hardware({"name": "x1", "tflops": 500})

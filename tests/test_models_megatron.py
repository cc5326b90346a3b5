"""Cross-check against Megatron-LM's ``megatron/training/theoretical_memory_usage.py``.

``tests/data/megatron_theoretical_memory.json`` holds its figures (MiB, first pipeline
stage) for four setups (dense MHA, GQA + SwiGLU, MoE, MLA + MoE), each with and without the
distributed optimizer, made by ``scripts/make_megatron_memory_fixture.py`` from the commit
recorded in the file. Each test rebuilds Megatron's number from ours plus the differences
``docs/estimation.md`` explains, term by term, and requires equality (to float rounding):
a difference nobody explained fails.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sapptk.models import ModelCard, Parallel, card, estimate_profile
from sapptk.models.estimate import static_bytes_per_parameter

FIXTURE = Path(__file__).parent / "data" / "megatron_theoretical_memory.json"
DATA = json.loads(FIXTURE.read_text(encoding="utf-8"))
MIB = 2**20


def _setup_id(row: dict) -> str:
    return f"{row['card']}-{'distopt' if row['distributed_optimizer'] else 'plain'}"


def _parallel(row: dict) -> Parallel:
    # the fixture's script sets expert_tensor_parallel_size=1 (Megatron's default would be tp)
    return Parallel(tp=row["tp"], dp=row["dp"], ep=row["ep"], etp=1, seq_length=row["seq_length"],
                    micro_batch_size=row["micro_batch_size"], flash_attention=False,
                    sharding="distributed" if row["distributed_optimizer"] else "none")


def test_fixture_names_its_source():
    assert DATA["source"] == "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py"
    assert len(DATA["file_commit"]) == 40
    kinds = {row["card"] for row in DATA["setups"]}
    assert kinds == {"gpt3-175b", "llama3.1-70b", "mixtral-8x7b", "deepseek-v3"}
    assert {row["distributed_optimizer"] for row in DATA["setups"]} == {True, False}


@pytest.mark.parametrize("row", DATA["setups"], ids=_setup_id)
def test_weight_and_optimizer_memory(row):
    model = card(row["card"])
    par = _parallel(row)
    pp, t = row["pp"], row["tp"]
    profile = estimate_profile(model, par, "h100")
    ours = (profile.head.params + sum(g.count * g.params for g in profile.body) / pp) * 1e6  # bytes, stage 0
    per = static_bytes_per_parameter(par, par.dp * par.cp)  # dense (non-expert) parameters
    h = model.hidden_size
    norm = h * (2 if model.norm == "layernorm" else 1)
    layers = model.num_layers / pp  # Megatron spreads every layer kind evenly over the stages
    explained = -norm / pp * per  # Megatron puts the final norm on every stage's 1/pp; ours on the tail
    if model.positions:  # learned position embeddings (not in Megatron's count; replicated over TP)
        explained += model.positions * h * per
    if model.linear_bias:  # GPT's linear biases (Megatron counts none): QKV and FC1 split by TP, the rest not
        explained += layers * ((3 * h + model.intermediate_size) / t + 2 * h) * per
    if model.mla is not None:  # MLA down-projections and their norms: replicated in ours, split by TP in Megatron
        replicated = model.attention_parameters()["replicated"]
        explained += layers * replicated * (1 - 1 / t) * per
    if model.moe is not None and model.moe.router_bias:  # DeepSeek-V3's per-expert score bias
        explained += sum(model.moe_layers) / pp * model.moe.experts * per
    megatron = row["weight_and_optimizer_mib"] * MIB
    assert ours - explained == pytest.approx(megatron, rel=1e-9)
    assert abs(ours - megatron) / megatron < 0.02  # the explained terms are small


def _megatron_view(model: ModelCard) -> ModelCard:
    """The layer Megatron's activation formula assumes (Korthikanti's GPT layer: multi-head
    attention, two FFN tensors of width ``ffn_hidden_size``, dropout, dense) with this
    model's hidden size, heads and FFN width."""
    return replace(model, num_kv_heads=model.num_heads, head_dim=model.hidden_size // model.num_heads,
                   gated_mlp=False, dropout=True, moe=None, moe_layers=(), mla=None, norm="layernorm",
                   qkv_bias=False, linear_bias=False, qk_norm=False, positions=0)


@pytest.mark.parametrize("row", DATA["setups"], ids=_setup_id)
def test_activation_memory(row):
    model = card(row["card"])
    par = _parallel(row)
    pp, t = row["pp"], row["tp"]
    tokens = row["seq_length"] * row["micro_batch_size"]
    # Megatron's figure is our account of its assumed layer (selective recompute, SP), for
    # every layer and pp micro-batches of the embedding, but token ids split by TP (ours:
    # every TP rank holds the int64 ids).
    view = estimate_profile(_megatron_view(model), replace(par, ep=1), "h100")
    rebuilt = (model.num_layers * view.body[0].modes["select"].activation
               + pp * view.head.modes["none"].activation) * 1e6 - pp * 8 * tokens * (1 - 1 / t)
    megatron = row["activation_mib"] * MIB
    assert rebuilt == pytest.approx(megatron, rel=1e-9)
    # and ours for the real layer differs by exactly the architecture (GQA, SwiGLU, no
    # dropout, MoE top-k routing, MLA), which docs/estimation.md lists per setup
    ours = estimate_profile(model, par, "h100")
    real = sum(g.count * g.modes["select"].activation for g in ours.body) * 1e6
    if row["card"] == "gpt3-175b":
        assert real == pytest.approx(model.num_layers * view.body[0].modes["select"].activation * 1e6, rel=1e-12)
    else:
        assert real != pytest.approx(model.num_layers * view.body[0].modes["select"].activation * 1e6, rel=1e-3)

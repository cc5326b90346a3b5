"""Memory beyond live tensors (issue 31 item 5): torchtitan's op-level selective checkpointing,
the loss's logits buffers and FSDP kept unsharded, each against bytes worked by hand."""

from __future__ import annotations

import pytest

from sapptk.errors import ConfigError
from sapptk.models import ModelCard, Parallel, estimate_profile
from sapptk.models.estimate import layer_tensors, op_select_kept
from sapptk.models.ops import layer_param_split

# h 64, 4 heads of 16 (2 KV heads), SwiGLU 128, vocabulary 1000; 32 tokens, bf16, tp 1
TINY = ModelCard(name="tiny", model_type="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=1000)
PAR = Parallel(seq_length=32, sharding="none")


def _group(profile, kind):
    return next(g for g in profile.groups if g.kind == kind)


def test_op_select_keeps_every_other_matmul_output_and_the_attention_kernel() -> None:
    # kept: layer input 2·32·64 = 4096, Q 2·32·64 = 4096, V 2·32·32 = 2048, softmax statistics
    # 4·32·4 = 512, attention output 4096, w1 (gate) 2·32·128 = 8192, w2 output 4096 -> 27136 B;
    # rebuilt: attention norm output 4096, K 2048, FFN norm input and output 2·4096, w3 (up)
    # 8192, SwiGLU product 8192 -> 30720 B
    kept, rebuilt = op_select_kept(TINY, PAR, layer_tensors(TINY, PAR))
    assert kept == pytest.approx(27136e-6, abs=1e-12)
    assert rebuilt == pytest.approx(30720e-6, abs=1e-12)
    titan = estimate_profile(TINY, PAR, "h100", framework="torchtitan")
    body = _group(titan, "body")
    assert body.modes["select"].activation == pytest.approx(0.027136)
    # transient: the rebuilt tensors plus twice the largest kept tensor (FC1 output, 16384 B)
    assert titan.provenance["transient_mb"][body.name]["select"] == pytest.approx(0.030720 + 0.032768)
    # Megatron's select (the attention core recomputed) is untouched: everything but the 512 B statistics
    mega = _group(estimate_profile(TINY, PAR, "h100"), "body")
    assert mega.modes["select"].activation == pytest.approx(0.053760 - 0.000512)


@pytest.mark.parametrize(("loss", "logits_b", "transient_b"), [
    ("fused", 128000, 128000),      # fp32 logits 4·32·1000 kept, their fp32 gradient beside
    ("eager", 128000, 256000),      # log-softmax output kept; its incoming gradient and the logits' gradient
    ("compiled", 64000, 64000),     # bf16 logits kept, one bf16 gradient
])
def test_the_loss_holds_the_logits_as_its_implementation_does(loss: str, logits_b: int, transient_b: int) -> None:
    profile = estimate_profile(TINY, PAR, "h100", loss=loss)
    tail = _group(profile, "tail")
    # final norm input and output 2·2·32·64 = 8192 B beside the loss's buffers
    assert tail.modes["none"].activation == pytest.approx((8192 + logits_b + transient_b) / 1e6)
    assert profile.provenance["transient_mb"][tail.name]["none"] == pytest.approx(transient_b / 1e6)
    assert profile.provenance["loss"] == loss


def test_the_loss_defaults_to_the_frameworks_and_rejects_an_unknown_name() -> None:
    assert estimate_profile(TINY, PAR, "h100").provenance["loss"] == "fused"
    assert estimate_profile(TINY, PAR, "h100", framework="torchtitan").provenance["loss"] == "eager"
    with pytest.raises(ConfigError, match="loss = 'chunked'"):
        estimate_profile(TINY, PAR, "h100", loss="chunked")
    with pytest.raises(ConfigError, match="fsdp_reshard"):
        estimate_profile(TINY, PAR, "h100", fsdp_reshard="no")


def test_fsdp_without_resharding_keeps_unsharded_weights_and_gradients_in_every_layer() -> None:
    par = Parallel(seq_length=32, dp=2, sharding="fsdp")
    dense, experts = layer_param_split(TINY, par, False)
    # q 64·64 + k, v 2·64·32 + o 64·64 + SwiGLU 3·64·128 + two norms 2·64 = 36992 parameters
    assert dense + experts == 36992
    resharded = estimate_profile(TINY, par, "h100")
    kept = estimate_profile(TINY, par, "h100", fsdp_reshard=False)
    # sharded: (2 bf16 + 4 fp32 grad + 12 Adam) / 2 ranks = 9 B per parameter
    assert _group(resharded, "body").params == pytest.approx(9 * 36992 / 1e6)
    # plus the unsharded bf16 weight and fp32 gradient: 6 B per parameter
    assert _group(kept, "body").params == pytest.approx(15 * 36992 / 1e6)
    # the head's 1000·64 embedding too
    assert _group(kept, "head").params - _group(resharded, "head").params == pytest.approx(6 * 64000 / 1e6)
    # the per-layer in-flight unsharded copies (2 weights + 1 gradient: 8 B per parameter) leave the transient
    name = _group(kept, "body").name
    for mode, value in kept.provenance["transient_mb"][name].items():
        assert resharded.provenance["transient_mb"][name][mode] - value == pytest.approx(8 * 36992 / 1e6)
    # without FSDP the flag changes nothing
    assert estimate_profile(TINY, PAR, "h100", fsdp_reshard=False).groups == estimate_profile(TINY, PAR, "h100").groups

"""Framework presets: which communication a training framework hides under compute and how
many separate elementwise kernels it runs (:data:`FRAMEWORKS`, :func:`framework`).

Each flag is a documented feature of the framework (``docs/estimation.md``, "Framework
presets"); an overlapped collective costs only what its window of compute does not cover.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sapptk.errors import ConfigError

__all__ = ["ATTENTION_KERNELS", "FRAMEWORKS", "Framework", "framework"]

ATTENTION_KERNELS: tuple[str, ...] = ("fused", "fa2")


@dataclass(frozen=True)
class Framework:
    """``tp_comm_overlap``: tensor-parallel all-gathers and reduce-scatters run under the
    neighbouring GEMM; ``cp_comm_overlap``: the context-parallel ring's sends under the
    attention of the previous chunk; ``overlap_grad_reduce``: the data-parallel gradient
    reduction runs bucket by bucket under the backward; ``overlap_param_gather``: the
    distributed optimizer's parameter all-gather runs under the next forward;
    ``fsdp_prefetch``: FSDP / ZeRO-3 gathers the next layer's parameters during this one;
    ``elementwise_factor``: bytes and launches of the elementwise ops relative to the
    fused kernels the operator list names (1: every listed op one kernel);
    ``attention_kernel``: ``fused`` (the card's best flash-attention kernel: cuDNN /
    FlashAttention-3 on Hopper) or ``fa2`` (FlashAttention-2, the card's
    ``attention_fa2_efficiency``); ``expert_tp_follows_tp``: a layout's unset ``etp``
    (expert tensor parallel size) is ``tp`` (else 1); ``moe_dedup_dispatch``: the expert
    all-to-all across nodes sends a token once per remote node and forwards it over NVLink
    (DeepEP: Megatron ``--moe-token-dispatcher-type flex --moe-enable-deepep``; off in the
    presets, a measured row turns it on with ``deepep: true``); ``fsdp_once_per_step``:
    FSDP gathers a layer's parameters once a step and keeps them across micro-batches,
    reduce-scattering the gradients once after the last backward (torchtitan with pipeline
    parallelism: ``reshard_after_forward`` off, and ``torch.distributed.pipelining`` defers
    gradient sync and resharding to the last backward); off: every micro-batch gathers and
    reduce-scatters; ``moe_a2a_overlap``: the expert all-to-alls of one micro-batch run under
    the compute of another in the pipeline's steady state (Megatron
    ``--overlap-moe-expert-parallel-comm``, the combined 1F1B schedule; off in the presets, a
    measured row turns it on with ``a2a_overlap: true``; :func:`sapptk.models.ops.pair_a2a`)."""

    name: str
    tp_comm_overlap: bool
    cp_comm_overlap: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    fsdp_prefetch: bool
    elementwise_factor: float = 1.0
    source: str = ""
    attention_kernel: str = "fused"
    expert_tp_follows_tp: bool = False
    moe_dedup_dispatch: bool = False
    fsdp_once_per_step: bool = False
    moe_a2a_overlap: bool = False
    eager_elementwise: bool = False
    a2a_overlap_sms: int = 20

    def __post_init__(self) -> None:
        f = self.elementwise_factor
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0.1 <= float(f) <= 10:
            raise ConfigError(f"framework {self.name!r}: field 'elementwise_factor' = {f!r}: expected a number "
                              "in [0.1, 10]")
        n = self.a2a_overlap_sms
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n <= 1000:
            raise ConfigError(f"framework {self.name!r}: field 'a2a_overlap_sms' = {n!r}: expected an integer "
                              "in [0, 1000]")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ConfigError(f"framework {self.name!r}: field 'attention_kernel' = {self.attention_kernel!r}: "
                              f"expected one of {', '.join(ATTENTION_KERNELS)}")


FRAMEWORKS: Mapping[str, Framework] = MappingProxyType({
    "megatron": Framework(
        "megatron", tp_comm_overlap=True, cp_comm_overlap=True, overlap_grad_reduce=True,
        overlap_param_gather=True, fsdp_prefetch=True, elementwise_factor=1.0, expert_tp_follows_tp=True,
        source="Megatron-LM / Megatron-Core arguments --tp-comm-overlap (Transformer Engine userbuffers), "
               "Transformer Engine's fused (cuDNN) attention, "
               "--overlap-grad-reduce, --overlap-param-gather (distributed optimizer); Transformer Engine's "
               "context-parallel attention overlaps the ring's P2P with attention; fused kernels "
               "--bias-swiglu-fusion, --bias-dropout-fusion, --apply-rope-fusion; --expert-tensor-parallel-size "
               "defaults to --tensor-model-parallel-size (megatron/training/arguments.py, validate_args)"),
    "torchtitan": Framework(
        "torchtitan", tp_comm_overlap=False, cp_comm_overlap=True, overlap_grad_reduce=True,
        overlap_param_gather=True, fsdp_prefetch=True, elementwise_factor=1.0, attention_kernel="fa2",
        eager_elementwise=True,
        source="torchtitan: FSDP2 (fully_shard) prefetches the next layer's all-gather and overlaps the "
               "reduce-scatter with the backward; async TP is opt-in (not assumed); PyTorch context-parallel "
               "ring attention; eager elementwise ops unless torch.compile (torchtitan/models/norms.py RMSNorm, "
               "torchtitan/models/llama/model.py apply_rotary_emb and FeedForward: ops.EAGER_BYTES); attention "
               "through PyTorch SDPA, "
               "whose flash backend is FlashAttention-2; expert tensor parallel degree 1 unless set"),
    "deepspeed": Framework(
        "deepspeed", tp_comm_overlap=False, cp_comm_overlap=False, overlap_grad_reduce=True,
        overlap_param_gather=True, fsdp_prefetch=True, elementwise_factor=1.5, attention_kernel="fa2",
        source="DeepSpeed ZeRO config overlap_comm (gradient reduction under backward) and ZeRO-3 "
               "stage3_prefetch_bucket_size (parameter prefetch); Hugging Face modules run unfused "
               "elementwise kernels and FlashAttention-2 (or SDPA); MoE experts split by expert parallelism only"),
})
"""The bundled presets by name."""


def framework(name: str | Framework) -> Framework:
    """A preset by name (``megatron``, ``torchtitan``, ``deepspeed``) or a given
    :class:`Framework`."""
    if isinstance(name, Framework):
        return name
    key = str(name).strip().lower() if isinstance(name, str) else None
    if key not in FRAMEWORKS:
        raise ConfigError(f"framework = {name!r}: expected one of {', '.join(FRAMEWORKS)} or a Framework")
    return FRAMEWORKS[key]

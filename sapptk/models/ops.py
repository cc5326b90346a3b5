"""A layer as a list of operators: :func:`layer_ops` (the records
:func:`sapptk.estimate_profile` sums) and :func:`to_frame` (the table
:func:`sapptk.models.operators` returns).

Each layer's forward is an explicit list of GEMMs (M, N, K, dtype), the attention core
(flash or not, causal, keys per query, heads, head widths), elementwise and norm kernels
(bytes moved) and collectives (kind, bytes, group size and stride, hence placement inside a
node or across). The backward and each recompute mode's extra work follow from it: a GEMM
gives its input-gradient and weight-gradient GEMMs, the attention core its backward, an
elementwise op its backward kernel, a collective its transpose (an all-gather becomes a
reduce-scatter, ...). A model family is the function that lists its forward: dense
GQA/SwiGLU or GPT (with or without biases and dropout), MoE (router, routed and shared
experts), MLA — the seam where a new family goes.

Ranks follow Megatron's order: tensor parallel fastest, then context parallel, then data
parallel (then pipeline); the routed experts use their own grid (Megatron-Core's MoE
parallel folding): expert tensor parallel (``etp``) fastest, then expert parallel, then expert
data parallel. With ``etp`` > 1 an EP rank's received tokens are all-gathered over the
expert-TP group before the expert GEMMs (each ``1/etp`` of the expert width) and
reduce-scattered after them, as Megatron-Core's all-to-all token dispatcher does. A group's
stride and size give its placement (:func:`sapptk.models.timing.placement`).

Times come from :mod:`sapptk.models.timing`; which collectives hide under which compute
comes from the framework preset (:mod:`sapptk.models.frameworks`).

Over 500 lines because the families' operator lists, the overlap that resolves their
exposed times (within a phase, across the paired micro-batches of the 1F1B all-to-all
overlap, under a recompute) and the table all read and write the same :class:`Operator`
records built by one builder; split, each part would import the others' private helpers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import pandas as pd

from sapptk.errors import ConfigError
from sapptk.models.cards import ModelCard
from sapptk.models.frameworks import Framework
from sapptk.models.layout import DTYPE_BYTES, Hardware, Parallel
from sapptk.models.timing import attention_ms, collective_ms, elementwise_ms, gemm_ms, placement, remote_node_share

__all__ = ["COLUMNS", "EAGER_BYTES", "KINDS", "PAIRED", "PHASES", "RERUN_HIDES", "Operator", "check_fp8", "layer_ops",
           "pair_a2a", "recompute_hiding", "step_ops", "to_frame"]

KINDS: tuple[str, ...] = ("gemm", "attention", "elementwise", "collective")
PHASES: tuple[str, ...] = ("fwd", "bwd", "recompute", "step")
FP32_PEAK_SHARE = 0.5
"""fp32 GEMMs run as TF32 on tensor cores: half the dense 16-bit peak on A100 (156 of 312
TFLOPS) and H100 (494.7 of 989) per NVIDIA's datasheets (PyTorch needs ``allow_tf32``)."""

EAGER_BYTES: dict[str, float] = {"norm": 9.0, "rope": 5.0, "swiglu": 10.0 / 6.0}
"""Bytes an eager PyTorch implementation moves per byte of the fused kernel the operator list
names, by op (a name ending in the key; per element, bf16 2 bytes, fp32 4), from torchtitan's
model code. RMSNorm ``self._norm(x.float()).type_as(x) * self.weight`` with ``_norm`` =
``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``: float() 2 + 4, pow 4 + 4, mean 4,
x · rsqrt 4 + 4, type_as 4 + 2, · weight 2 + 2 = 36 against the fused 2 + 2: 9. Rotary
``view_as_complex(x.float().reshape(...)) * freqs_cis`` then ``view_as_real(...).type_as(x)``:
float() 2 + 4, the complex product 4 + 4 per real element, type_as 4 + 2 = 20 against 4: 5.
SwiGLU ``F.silu(w1(x)) * w3(x)``: silu 2 + 2, the product 2 + 2 + 2 = 10 against the fused
6: 5/3. Residual adds are one kernel either way; their backward kernels take the same
multiples."""

_FULL = frozenset({"full"})
_SELECT = frozenset({"select", "both", "full"})  # the attention core (and the CP ring it needs)
_COMM = frozenset({"comm", "both", "full"})  # norms, the all-gathers after them, the all-to-alls
_NONE: frozenset[str] = frozenset()
_TRANSPOSE = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_reduce": "all_reduce",
              "all_to_all": "all_to_all", "send_recv": "send_recv"}


class Operator(NamedTuple):
    """One row of the operator table. ``flops``, ``bytes`` and ``time_ms`` are totals over
    ``count`` identical ops; ``m``, ``n``, ``k`` one GEMM's shape (0 otherwise); for the
    attention core ``m`` is the queries, ``n`` the heads, ``k`` the mean keys per query;
    ``exposed_ms`` is what the op adds to the layer's time after overlap (the compute ops:
    all of it); ``overlapped_with`` the op (or ``layer``) whose compute hides it;
    ``recompute`` the modes that rerun a forward op in the backward."""

    group: str
    op: str
    phase: str
    kind: str
    count: float
    flops: float
    bytes: float
    time_ms: float
    exposed_ms: float
    overlapped_with: str
    m: float
    n: float
    k: float
    dtype: str
    collective: str
    group_size: int
    placement: str
    recompute: frozenset[str]


COLUMNS: tuple[str, ...] = ("group", "op", "phase", "mode", "kind", "count", "flops", "bytes", "time_ms",
                            "exposed_ms", "overlapped_with", "m", "n", "k", "dtype", "collective", "group_size",
                            "placement")


def dims(card: ModelCard, par: Parallel) -> dict[str, float]:
    """Tokens of this device's sequence shard ``N``, in the norm regions ``Nsp``, ``t``, ``h``."""
    tokens = par.seq_length * par.micro_batch_size / par.cp
    return {"N": tokens, "Nsp": tokens / par.tp if par.sp else tokens, "t": float(par.tp),
            "h": float(card.hidden_size)}


def capacity(par: Parallel) -> float:
    return 1.0 if par.capacity_factor is None else par.capacity_factor


def attention_widths(card: ModelCard) -> tuple[int, int, int]:
    """(query/key width per head, value width per head, KV heads)."""
    if card.mla is not None:
        return card.mla.qk_nope_dim + card.mla.qk_rope_dim, card.mla.v_dim, card.num_heads
    return card.head_dim, card.head_dim, card.num_kv_heads


def _eager(op: str) -> float:
    """:data:`EAGER_BYTES` of an op by the end of its name (1: one kernel either way)."""
    for key, mult in EAGER_BYTES.items():
        if op.endswith(key):
            return mult
    return 1.0


class _Builder:
    """Lists one group's forward ops, with the hardware timing each as it is added."""

    def __init__(self, group: str, par: Parallel, hw: Hardware, fw: Framework) -> None:
        self.group, self.par, self.hw, self.fw = group, par, hw, fw
        self.e = float(DTYPE_BYTES[par.compute_dtype])
        self.dtype = par.compute_dtype
        self.fwd: list[Operator] = []
        self.bwd: list[Operator] = []

    def _row(self, phase: str, op: str, kind: str, count: float, flops: float, nbytes: float, ms: float,
             overlap: str = "", m: float = 0.0, n: float = 0.0, k: float = 0.0, dtype: str = "",
             collective: str = "", size: int = 0, where: str = "", recompute: frozenset[str] = _NONE) -> None:
        row = Operator(self.group, op, phase, kind, count, flops, nbytes, ms, ms, overlap, m, n, k, dtype,
                       collective, size, where, recompute)
        (self.fwd if phase == "fwd" else self.bwd).append(row)

    def _gemm_time(self, m: float, n: float, k: float, fp8: bool) -> float:
        if self.par.compute_dtype == "fp32" and not fp8:
            hw = self.hw
            one = gemm_ms(hw, m, n, k, elem_bytes=4.0)
            launch = hw.launch_us / 1e3
            return launch + (one - launch) / FP32_PEAK_SHARE
        return gemm_ms(self.hw, m, n, k, fp8=fp8, elem_bytes=self.e)

    def gemm(self, op: str, m: float, n: float, k: float, *, count: float = 1.0, recompute: frozenset[str] = _FULL,
             fp8_ok: bool = True, bwd_weight: bool = True) -> None:
        """A linear layer's forward GEMM (M tokens, N outputs, K inputs) and, in the
        backward, its input gradient (M×N by N×K) and weight gradient (K×M by M×N)."""
        fp8 = self.par.fp8 and fp8_ok
        dtype = "fp8" if fp8 else self.dtype
        self._row("fwd", op, "gemm", count, count * 2 * m * n * k, count * self.e * (m * k + k * n + m * n),
                  count * self._gemm_time(m, n, k, fp8), m=m, n=n, k=k, dtype=dtype, recompute=recompute)
        self._row("bwd", op + "_dgrad", "gemm", count, count * 2 * m * n * k, count * self.e * (m * n + n * k + m * k),
                  count * self._gemm_time(m, k, n, fp8), m=m, n=k, k=n, dtype=dtype)
        if bwd_weight:
            self._row("bwd", op + "_wgrad", "gemm", count, count * 2 * m * n * k,
                      count * self.e * (m * n + m * k + k * n), count * self._gemm_time(k, n, m, fp8),
                      m=k, n=n, k=m, dtype=dtype)
        if fp8:  # cast the activation input (fwd) and the output gradient (bwd) to FP8
            self.elementwise(op + "_fp8_cast", count * (self.e + 1) * m * k, recompute=recompute, backward=0.0)
            self._row("bwd", op + "_fp8_cast_bwd", "elementwise", count, 0.0, count * (self.e + 1) * m * n,
                      count * self._elem_time((self.e + 1) * m * n))

    def _elem_time(self, nbytes: float, op: str = "") -> float:
        f = self.fw.elementwise_factor
        if self.fw.eager_elementwise:
            nbytes *= _eager(op)
        return f * elementwise_ms(self.hw, nbytes)

    def elementwise(self, op: str, nbytes: float, *, recompute: frozenset[str] = _FULL, backward: float = 2.0,
                    count: float = 1.0) -> None:
        """A memory-bound kernel moving ``nbytes`` (all ``count`` of them); its backward
        kernel moves ``backward`` × as many (0: no backward kernel)."""
        if nbytes <= 0:
            return
        self._row("fwd", op, "elementwise", count, 0.0, nbytes, count * self._elem_time(nbytes / count, op),
                  recompute=recompute)
        if backward:
            b = backward * nbytes
            self._row("bwd", op + "_bwd", "elementwise", count, 0.0, b, count * self._elem_time(b / count, op))

    def attention(self, flops: float, queries: float, heads: float, keys: float, *, flash: bool,
                  recompute: frozenset[str] = _SELECT) -> None:
        """The attention core of ``flops`` forward FLOPs, ``keys`` keys per query on average.
        Flash: one kernel, backward 2.5 × the FLOPs (it recomputes the scores)."""
        dtype = self.dtype
        kernel = self.fw.attention_kernel
        self._row("fwd", "attention_core", "attention", 1.0, flops, 0.0,
                  attention_ms(self.hw, flops, keys, kernel=kernel), m=queries, n=heads, k=keys, dtype=dtype,
                  recompute=recompute)
        back = 2.5 * flops if flash else 2.0 * flops
        self._row("bwd", "attention_core_bwd", "attention", 1.0, back, 0.0,
                  attention_ms(self.hw, back, keys, backward=True, kernel=kernel), m=queries, n=heads, k=keys,
                  dtype=dtype)

    def collective(self, op: str, kind: str, nbytes: float, size: int, stride: int, *,
                   recompute: frozenset[str] = _FULL, overlap: str = "", overlap_bwd: str = "",
                   count: float = 1.0, backward: float = 1.0, far_share: float | None = None) -> None:
        """A collective of ``nbytes`` per op (``count`` of them) over ``size`` ranks
        ``stride`` apart, its transpose in the backward (``backward`` × the bytes; 0: none);
        ``far_share``: see :func:`~sapptk.models.timing.collective_ms`."""
        if size <= 1 or nbytes <= 0:
            return
        where = placement(self.hw, size, stride)[0]
        one = collective_ms(self.hw, kind, nbytes, size, stride, far_share=far_share)
        self._row("fwd", op, "collective", count, 0.0, count * nbytes, count * one, overlap=overlap,
                  collective=kind, size=size, where=where, recompute=recompute)
        if backward:
            t = _TRANSPOSE[kind]
            b = collective_ms(self.hw, t, backward * nbytes, size, stride, far_share=far_share)
            self._row("bwd", op + "_bwd", "collective", count, 0.0, count * backward * nbytes, count * b,
                      overlap=overlap_bwd, collective=t, size=size, where=where)


# --- families ------------------------------------------------------------------------------
def _attention_block(b: _Builder, card: ModelCard, par: Parallel) -> None:
    d = dims(card, par)
    n, nsp, t, h = d["N"], d["Nsp"], par.tp, d["h"]
    e, a, s = b.e, card.num_heads, par.seq_length
    fw = b.fw
    dqk, dv, kv = attention_widths(card)
    b.elementwise("attention_norm", 2 * e * nsp * h, recompute=_COMM)
    first = "q_down" if (card.mla is not None and card.mla.q_lora_rank) else ("q_proj" if card.mla else "qkv")
    if t > 1 and par.sp:
        b.collective("attention_all_gather", "all_gather", e * n * h, t, 1, recompute=_COMM,
                     overlap=first if fw.tp_comm_overlap else "", overlap_bwd=(first + "_wgrad") if fw.tp_comm_overlap
                     else "")
    if card.mla is not None:
        m = card.mla
        if m.q_lora_rank:
            b.gemm("q_down", nsp, m.q_lora_rank, h)
            b.elementwise("q_norm", 2 * e * nsp * m.q_lora_rank, recompute=_COMM)
            b.gemm("q_up", n, a * dqk / t, m.q_lora_rank)
        else:
            b.gemm("q_proj", n, a * dqk / t, h)
        b.gemm("kv_down", nsp, m.kv_lora_rank + m.qk_rope_dim, h)
        b.elementwise("kv_norm", 2 * e * nsp * m.kv_lora_rank, recompute=_COMM)
        b.gemm("kv_up", n, a * (m.qk_nope_dim + dv) / t, m.kv_lora_rank)
        b.elementwise("rope", 2 * e * n * (a / t + 1) * m.qk_rope_dim)
    else:
        b.gemm("qkv", n, (a * dqk + kv * dqk + kv * dv) / t, h)
        if card.qk_norm:
            b.elementwise("qk_norm", 2 * e * n * (a + kv) * dqk / t)
        if not card.positions:  # rotary embedding on Q and K (GPT: learned positions instead)
            b.elementwise("rope", 2 * e * n * (a + kv) * dqk / t)
    if par.cp > 1:  # ring attention: K and V pass cp - 1 times (the gradients back in the backward)
        kv_bytes = e * n * kv * (dqk + dv) / t
        b.collective("cp_ring", "send_recv", kv_bytes, par.cp, t, count=par.cp - 1, recompute=_SELECT,
                     overlap="attention_core" if fw.cp_comm_overlap else "",
                     overlap_bwd="attention_core_bwd" if fw.cp_comm_overlap else "", backward=2.0)
    if par.flash_attention:
        keys = s / 2 if par.cp == 1 else s / par.cp  # causal mean; a ring step's key chunk
        b.attention(n * s * a * (dqk + dv) / t, n, a / t, keys, flash=True)
    else:  # unfused: the full square, a softmax (and dropout) over it
        bt = par.micro_batch_size * a / t
        b.gemm("attention_scores", s, s, dqk, count=bt, recompute=_SELECT, fp8_ok=False)
        scores = bt * s * s
        b.elementwise("softmax", 2 * e * scores, recompute=_SELECT)
        if card.dropout:
            b.elementwise("attention_dropout", (2 * e + 1) * scores, recompute=_SELECT, backward=1.0)
        b.gemm("attention_values", s, dv, s, count=bt, recompute=_SELECT, fp8_ok=False)
    b.gemm("attention_proj", n, h, a * dv / t)
    _row_parallel_out(b, "attention", n, t, h, "attention_proj")
    b.elementwise("attention_residual", (3 * e + (1 if card.dropout else 0)) * nsp * h,
                  backward=(1.0 if card.dropout else 0.0))


def _row_parallel_out(b: _Builder, block: str, n: float, t: int, h: float, gemm: str) -> None:
    if t <= 1:
        return
    over = gemm if b.fw.tp_comm_overlap else ""
    over_bwd = (gemm + "_dgrad") if b.fw.tp_comm_overlap else ""
    if b.par.sp:
        b.collective(f"{block}_reduce_scatter", "reduce_scatter", b.e * n * h, t, 1, overlap=over, overlap_bwd=over_bwd)
    else:  # the backward's all-reduce follows the column-parallel input GEMM: same size
        b.collective(f"{block}_all_reduce", "all_reduce", b.e * n * h, t, 1, overlap=over, overlap_bwd=over_bwd)


def _dense_ffn(b: _Builder, card: ModelCard, par: Parallel) -> None:
    d = dims(card, par)
    n, nsp, t, h, e = d["N"], d["Nsp"], par.tp, d["h"], b.e
    f = card.intermediate_size
    b.elementwise("ffn_norm", 2 * e * nsp * h, recompute=_COMM)
    if t > 1 and par.sp:
        b.collective("ffn_all_gather", "all_gather", e * n * h, t, 1, recompute=_COMM,
                     overlap="fc1" if b.fw.tp_comm_overlap else "",
                     overlap_bwd="fc1_wgrad" if b.fw.tp_comm_overlap else "")
    widths = 2 if card.gated_mlp else 1
    b.gemm("fc1", n, widths * f / t, h)
    b.elementwise("swiglu" if card.gated_mlp else "gelu", (widths + 1) * e * n * f / t)
    b.gemm("fc2", n, h, f / t)
    _row_parallel_out(b, "ffn", n, t, h, "fc2")
    b.elementwise("ffn_residual", (3 * e + (1 if card.dropout else 0)) * nsp * h,
                  backward=(1.0 if card.dropout else 0.0))


def _moe_ffn(b: _Builder, card: ModelCard, par: Parallel) -> None:
    assert card.moe is not None
    d = dims(card, par)
    n, nsp, t, h, e = d["N"], d["Nsp"], par.tp, d["h"], b.e
    moe = card.moe
    routed = nsp * moe.top_k * capacity(par)  # token copies this device's experts process (balanced routing)
    local = moe.experts / par.ep
    b.elementwise("ffn_norm", 2 * e * nsp * h, recompute=_COMM)
    b.gemm("router", nsp, moe.experts, h, fp8_ok=False)
    b.elementwise("router_topk", 2 * 4 * nsp * moe.experts)
    b.elementwise("permute", e * (nsp * h + routed * h), recompute=_COMM)
    et = par.expert_tp
    # expert grid (Megatron-Core): expert TP fastest, then EP -- the EP group's members are etp apart
    far = None
    where, members = placement(b.hw, par.ep, et)
    if b.fw.moe_dedup_dispatch and where == "inter":  # DeepEP: once per remote node, then NVLink
        far = remote_node_share(moe.experts, moe.top_k, -(-par.ep // members))  # nodes spanned
    b.collective("dispatch_all_to_all", "all_to_all", e * routed * h, par.ep, et, recompute=_COMM, far_share=far)
    if et > 1:  # the received tokens gathered over the expert-TP group (the combine reduce-scatters them)
        b.collective("expert_all_gather", "all_gather", e * routed * et * h, et, 1, recompute=_COMM)
    per_expert = routed * et / local  # tokens per local expert: R·etp·ep/E
    b.gemm("expert_fc1", per_expert, 2 * moe.expert_size / et, h, count=local)
    b.elementwise("expert_swiglu", 3 * e * routed * moe.expert_size)
    b.gemm("expert_fc2", per_expert, h, moe.expert_size / et, count=local)
    if et > 1:
        b.collective("expert_reduce_scatter", "reduce_scatter", e * routed * et * h, et, 1, recompute=_COMM)
    b.collective("combine_all_to_all", "all_to_all", e * routed * h, par.ep, et, recompute=_COMM, far_share=far)
    b.elementwise("unpermute", e * (routed * h + nsp * h), recompute=_COMM)
    if moe.shared_size:
        if t > 1 and par.sp:
            b.collective("shared_all_gather", "all_gather", e * n * h, t, 1, recompute=_COMM,
                         overlap="shared_fc1" if b.fw.tp_comm_overlap else "",
                         overlap_bwd="shared_fc1_wgrad" if b.fw.tp_comm_overlap else "")
        b.gemm("shared_fc1", n, 2 * moe.shared_size / t, h)
        b.elementwise("shared_swiglu", 3 * e * n * moe.shared_size / t)
        b.gemm("shared_fc2", n, h, moe.shared_size / t)
        _row_parallel_out(b, "shared", n, t, h, "shared_fc2")
    b.elementwise("ffn_residual", 3 * e * nsp * h, backward=0.0)


def _body(b: _Builder, card: ModelCard, par: Parallel, moe: bool) -> None:
    _attention_block(b, card, par)
    if moe:
        _moe_ffn(b, card, par)
    else:
        _dense_ffn(b, card, par)
    _fsdp(b, card, par, moe)


def _fsdp(b: _Builder, card: ModelCard, par: Parallel, moe: bool) -> None:
    """ZeRO-3 / FSDP: every micro-batch gathers the layer's parameters in the forward and
    again in the backward and reduce-scatters its gradients (prefetched under the layer's
    compute when the framework does); ZeRO-2 reduce-scatters the gradients per micro-batch.
    A recompute reruns the layer's forward inside its backward, on the parameters the
    backward's gather brought (FSDP's pre-backward hook unshards them before the checkpointed
    region reruns): the forward's gather is not rerun."""
    if par.sharding not in ("fsdp", "zero2") or (par.sharding == "fsdp" and b.fw.fsdp_once_per_step):
        return
    dense, experts = layer_param_split(card, par, moe)
    grad = DTYPE_BYTES[par.grad_dtype]
    over = "layer" if b.fw.fsdp_prefetch else ""
    for name, count, size, stride in (("", dense, par.dp * par.cp, par.tp), ("expert_", experts, par.expert_dp,
                                                                              par.ep * par.expert_tp)):
        if count <= 0 or size <= 1:
            continue
        where = placement(b.hw, size, stride)[0]
        if par.sharding == "fsdp":  # gathered for the forward, freed, gathered again for the backward
            # not rerun by a recompute: the backward's own gather serves the recomputed forward
            b.collective(f"fsdp_{name}all_gather", "all_gather", b.e * count, size, stride, overlap=over, backward=0.0,
                         recompute=_NONE)
            again = collective_ms(b.hw, "all_gather", b.e * count, size, stride)
            b._row("bwd", f"fsdp_{name}all_gather_bwd", "collective", 1.0, 0.0, b.e * count, again, overlap=over,
                   collective="all_gather", size=size, where=where)
        ms = collective_ms(b.hw, "reduce_scatter", grad * count, size, stride)
        b._row("bwd", f"{'fsdp' if par.sharding == 'fsdp' else 'zero2'}_{name}grad_reduce_scatter", "collective",
               1.0, 0.0, grad * count, ms, overlap=over, collective="reduce_scatter", size=size, where=where)


def layer_param_split(card: ModelCard, par: Parallel, moe: bool) -> tuple[float, float]:
    """Parameters one device holds of one layer before data-parallel sharding: (the dense
    part after tensor parallelism, the routed experts after expert parallelism)."""
    attention = card.attention_parameters()
    ffn = card.ffn_parameters(moe)
    dense = (attention["sharded"] + ffn["sharded"]) / par.tp + attention["replicated"] + ffn["replicated"]
    dense += 2 * card.hidden_size * (2 if card.norm == "layernorm" else 1)
    return dense, ffn["experts"] / (par.ep * par.expert_tp)


def _head(b: _Builder, card: ModelCard, par: Parallel) -> None:
    d = dims(card, par)
    n, nsp, t, h, e = d["N"], d["Nsp"], par.tp, d["h"], b.e
    b.elementwise("embedding_lookup", e * (n * h + nsp * h))
    if t > 1:  # vocabulary-parallel lookup: reduce-scatter (SP) or all-reduce of the output
        kind = "reduce_scatter" if par.sp else "all_reduce"
        where = placement(b.hw, t, 1)[0]
        ms = collective_ms(b.hw, kind, e * n * h, t, 1)
        for phase in ("fwd", "bwd"):
            b._row(phase, "embedding_" + kind + ("" if phase == "fwd" else "_bwd"), "collective", 1.0, 0.0,
                   e * n * h, ms, collective=kind, size=t, where=where)


def _tail(b: _Builder, card: ModelCard, par: Parallel) -> None:
    d = dims(card, par)
    n, nsp, t, h, e = d["N"], d["Nsp"], par.tp, d["h"], b.e
    v = card.vocab_size
    b.elementwise("final_norm", 2 * e * nsp * h)
    if t > 1 and par.sp:
        b.collective("lm_all_gather", "all_gather", e * n * h, t, 1)
    b.gemm("lm_head", n, v / t, h, fp8_ok=False)
    logits = 4 * n * v / t  # fp32 logits
    b.elementwise("cross_entropy", 2 * logits, backward=1.0)  # softmax and loss over fp32 logits; its gradient
    if t > 1 and not par.sp:  # the input gradient of the vocabulary-parallel head, all-reduced
        where = placement(b.hw, t, 1)[0]
        b._row("bwd", "lm_input_grad_all_reduce", "collective", 1.0, 0.0, e * n * h,
               collective_ms(b.hw, "all_reduce", e * n * h, t, 1), collective="all_reduce", size=t, where=where)


# --- overlap -------------------------------------------------------------------------------
def _resolve(rows: list[Operator]) -> list[Operator]:
    """``exposed_ms`` of each collective after hiding under its window (an op of the same
    phase, or ``layer``); compute ops stay exposed in full. The ``layer`` window is every
    compute op of the phase not already covering a collective, plus the exposed time of the
    phase's collectives on the other link (a collective across nodes runs on the NIC while
    one inside the node waits on NVLink, and the other way round: FSDP's prefetched gather
    over the NIC beside a node's expert all-to-all)."""
    window: dict[str, float] = {}
    compute = 0.0
    for r in rows:
        if r.kind != "collective":
            window[r.op] = window.get(r.op, 0.0) + r.time_ms
            compute += r.time_ms
    out = []
    for r in rows:  # first the collectives hidden under one op (or not at all)
        if r.kind == "collective" and r.overlapped_with and r.overlapped_with != "layer":
            avail = window.get(r.overlapped_with, 0.0)
            hidden = min(avail, r.time_ms)
            window[r.overlapped_with] = avail - hidden
            compute -= hidden
            r = r._replace(exposed_ms=r.time_ms - hidden)
        out.append(r)
    other = {}
    for where in ("intra", "inter"):
        other[where] = sum(r.exposed_ms for r in out if r.kind == "collective" and r.overlapped_with != "layer"
                           and r.placement and r.placement != where)
    used = 0.0
    for i, r in enumerate(out):  # then the ones hidden under the layer
        if r.kind == "collective" and r.overlapped_with == "layer":
            avail = max(0.0, compute + other.get(r.placement, 0.0) - used)
            hidden = min(avail, r.time_ms)
            used += hidden
            out[i] = r._replace(exposed_ms=r.time_ms - hidden)
    return out


def layer_ops(card: ModelCard, par: Parallel, hw: Hardware, fw: Framework, *, group: str, kind: str,
              moe: bool = False) -> tuple[list[Operator], list[Operator]]:
    """The forward and backward operators of one layer of ``group`` (``kind`` head, body or
    tail), overlap resolved."""
    b = _Builder(group, par, hw, fw)
    if kind == "head":
        _head(b, card, par)
    elif kind == "tail":
        _tail(b, card, par)
    else:
        _body(b, card, par, moe)
    fwd, bwd = _resolve(b.fwd), _resolve(b.bwd)
    if fw.moe_a2a_overlap and kind == "body" and moe:
        fwd, bwd = pair_a2a(fwd, bwd, contention=_sm_contention(hw, fw))
    return fwd, bwd


PAIRED = "paired_microbatch"
"""``overlapped_with`` of an expert all-to-all hidden under another micro-batch's compute."""


def _split_compute(rows: list[Operator], at: str) -> tuple[float, float]:
    """Exposed compute (every op but the collectives) listed before the op ``at`` and from it on."""
    names = [r.op for r in rows]
    cut = names.index(at) if at in names else len(rows)
    before = sum(r.exposed_ms for r in rows[:cut] if r.kind != "collective")
    after = sum(r.exposed_ms for r in rows[cut:] if r.kind != "collective")
    return before, after


def _sm_contention(hw: Hardware, fw: Framework) -> float:
    """Extra compute time per ms of compute that runs beside the all-to-all's kernels: they
    hold ``a2a_overlap_sms`` of the card's ``sms``, the compute gets the rest."""
    held = min(fw.a2a_overlap_sms, hw.sms - 1)
    return held / (hw.sms - held)


def pair_a2a(fwd: list[Operator], bwd: list[Operator], *,
             contention: float = 0.0) -> tuple[list[Operator], list[Operator]]:
    """A MoE layer's forward of one micro-batch beside the backward of another, as Megatron's
    combined 1F1B schedule runs them (``--overlap-moe-expert-parallel-comm``; DeepSeek-V3 report
    §3.2.1): the layer is cut at the dispatch into an attention part A (attention, router,
    permute) and an MLP part M (experts, combine, shared experts), and four steps run a compute
    stream beside a communication stream:
    ``A_fwd ‖ combine_bwd``, ``M_bwd ‖ dispatch_fwd``, ``M_fwd ‖ dispatch_bwd``,
    ``A_bwd ‖ combine_fwd``. Each all-to-all keeps exposed only what its step's compute does not
    cover: ``max(0, all-to-all − compute)``; the compute stays exposed in full. While an
    all-to-all runs beside compute its kernels hold SMs, and the compute beside it is slowed:
    ``contention`` × the hidden time is added to the all-to-all's exposed time
    (``a2a_overlap_sms / (sms − a2a_overlap_sms)``, :class:`~sapptk.models.Framework`)."""
    a_f, m_f = _split_compute(fwd, "dispatch_all_to_all")
    a_b, m_b = _split_compute(bwd, "dispatch_all_to_all_bwd")
    under = {"dispatch_all_to_all": m_b, "combine_all_to_all": a_b,
             "dispatch_all_to_all_bwd": m_f, "combine_all_to_all_bwd": a_f}

    def hide(rows: list[Operator]) -> list[Operator]:
        out = []
        for r in rows:
            if r.op in under:
                left = max(0.0, r.exposed_ms - under[r.op])
                r = r._replace(exposed_ms=left + contention * (r.exposed_ms - left), overlapped_with=PAIRED)
            out.append(r)
        return out

    return hide(fwd), hide(bwd)


def step_ops(card: ModelCard, par: Parallel, hw: Hardware, fw: Framework, *, group: str, moe: bool,
             backward_ms: float, forward_ms: float) -> list[Operator]:
    """Once per step per layer: the data-parallel gradient reduction (all-reduce without
    optimizer sharding, reduce-scatter with it; none under FSDP / ZeRO-2, which reduce per
    micro-batch, unless the framework's ``fsdp_once_per_step``) in ``grad_dtype``, and the
    parameter all-gather after a sharded optimizer step (distributed optimizer, ZeRO-2; FSDP
    gathering once a step) in the compute dtype; hidden (FSDP's once-a-step reduce-scatter
    never: it runs after the last backward)
    under the last micro-batch's ``backward_ms`` and the first one's ``forward_ms`` where
    the framework overlaps them."""
    if par.sharding == "fsdp" and not fw.fsdp_once_per_step:
        return []
    dense, experts = layer_param_split(card, par, moe)
    grad, weight = DTYPE_BYTES[par.grad_dtype], DTYPE_BYTES[par.compute_dtype]
    rows: list[Operator] = []
    for name, count, size, stride in (("", dense, par.dp * par.cp, par.tp), ("expert_", experts, par.expert_dp,
                                                                              par.ep * par.expert_tp)):
        if count <= 0 or size <= 1:
            continue
        where = placement(hw, size, stride)[0]
        kinds: list[tuple[str, int, bool, float]] = []
        if par.sharding != "zero2":  # ZeRO-2 reduce-scatters per micro-batch (in the backward)
            # FSDP once a step: pipelining's post-backward reduce-scatters after the last backward, exposed
            kinds.append(("grad_" + ("all_reduce" if par.sharding == "none" else "reduce_scatter"), grad,
                          fw.overlap_grad_reduce and par.sharding != "fsdp", backward_ms))
        if par.sharding in ("distributed", "zero2", "fsdp"):  # fsdp here: gathered once a step
            kinds.append(("param_all_gather", weight, fw.overlap_param_gather, forward_ms))
        for op, nbytes, overlapped, window in kinds:
            kind = op.split("_", 1)[1]
            ms = collective_ms(hw, kind, nbytes * count, size, stride)
            exposed = max(0.0, ms - window) if overlapped else ms
            rows.append(Operator(group, f"dp_{name}{op}", "step", "collective", 1.0, 0.0, nbytes * count, ms,
                                 exposed, "layer" if overlapped else "", 0.0, 0.0, 0.0, "", kind, size, where, _NONE))
    return rows


RERUN_HIDES = "recompute_hides_backward_collectives"
"""The operator-table row (phase ``recompute``) of what a mode's rerun forward hides of the
backward's collectives: its ``exposed_ms`` is minus that time."""


def recompute_hiding(fwd: list[Operator], bwd: list[Operator], mode: str) -> float:
    """ms of the backward's collectives hidden under the layer (FSDP's gather and gradient
    reduce-scatter, ZeRO-2's reduce-scatter) that a recompute mode's rerun forward hides
    besides: the rerun compute runs inside the backward (FSDP2 unshards the layer before its
    checkpointed region reruns and reduce-scatters after its backward), so it widens their
    window: ``min(their exposed time, the mode's rerun compute)``."""
    rerun = sum(r.exposed_ms for r in fwd if mode in r.recompute and r.kind != "collective")
    waiting = sum(r.exposed_ms for r in bwd if r.kind == "collective" and r.overlapped_with == "layer")
    return min(rerun, waiting)


# --- the table -----------------------------------------------------------------------------
def to_frame(groups: Iterable[tuple[list[Operator], list[Operator], list[Operator]]]) -> pd.DataFrame:
    """The tidy table of (forward, backward, step) operator lists: one row per op and phase;
    a forward op rerun by a recompute mode appears again with phase ``recompute`` and that
    ``mode``, and what that rerun hides of the backward's collectives as one row
    (:data:`RERUN_HIDES`, negative ``exposed_ms``: :func:`recompute_hiding`)."""
    rows: list[tuple] = []
    for fwd, bwd, step in groups:
        for r in fwd:
            rows.append(_as_row(r, "fwd", ""))
        for r in bwd:
            rows.append(_as_row(r, "bwd", ""))
        for mode in ("select", "comm", "both", "full"):
            for r in fwd:
                if mode in r.recompute:
                    rows.append(_as_row(r, "recompute", mode))
            hidden = recompute_hiding(fwd, bwd, mode)
            if hidden > 0 and fwd:
                rows.append((fwd[0].group, RERUN_HIDES, "recompute", mode, "collective", 1.0, 0.0, 0.0, 0.0, -hidden,
                             "layer", 0.0, 0.0, 0.0, "", "", 0, ""))
        for r in step:
            rows.append(_as_row(r, "step", ""))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("group", "op", "phase", "mode", "kind", "dtype", "collective", "placement", "overlapped_with"):
        frame[col] = frame[col].astype("category")
    return frame


def _as_row(r: Operator, phase: str, mode: str) -> tuple:
    return (r.group, r.op, phase, mode, r.kind, r.count, r.flops, r.bytes, r.time_ms, r.exposed_ms,
            r.overlapped_with, r.m, r.n, r.k, r.dtype, r.collective, r.group_size, r.placement)


def check_fp8(par: Parallel, hw: Hardware) -> None:
    if par.fp8 and hw.peak_fp8_tflops <= 0:
        raise ConfigError(f"parallel layout: field 'fp8' = True: hardware {hw.name!r} has no FP8 peak "
                          "(peak_fp8_tflops = 0): expected fp8=False or a card with FP8 units")

"""A :class:`~sapptk.profile.Profile` from a model card, a parallel layout and a hardware
card, before any run: :func:`estimate_profile`.

Everything is an operator-level account written down in ``docs/estimation.md``:

* **activation** — every tensor a layer's backward keeps (:func:`layer_tensors`), its
  bytes per micro-batch on one device and the recompute modes that keep it; a mode's
  activation is the sum of the tensors it keeps. Korthikanti et al. (2022) are the
  special case of a GPT layer (LayerNorm, GeLU, dropout, no flash attention).
* **static** — parameters per device (tensor-parallel parts ÷ ``tp``, routed experts ÷
  ``ep``, norms and routers replicated) times bytes per parameter (weight, gradient,
  Adam), the optimizer sharding dividing its parts over the data-parallel ranks.
* **time** — the layer's operators (:mod:`sapptk.models.ops`), each timed by the
  hardware card's achieved-efficiency model (:mod:`sapptk.models.timing`), collectives
  hidden under compute where the framework preset overlaps them; recompute adds the
  forward operators a mode reruns.
* **transient** — the peak inside an op (the backward's largest temporaries, a recomputed
  layer rebuilt, the logits' gradient, FSDP's unsharded layers), charged once per device
  in the constant; memory ``allocated`` or ``reserved`` (the caching allocator's reserve).

Memory is in MB (10⁶ bytes), times in ms, per layer per micro-batch, as profiles are.

Over 500 lines because the four accounts above are one estimate: they share the resolved
inputs, the layer's tensors and its operator lists, and a profile is assembled from all four
in one pass (the operators themselves live in :mod:`sapptk.models.ops`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from sapptk.errors import ConfigError
from sapptk.models.bundled import card as bundled_card
from sapptk.models.bundled import hardware as bundled_hardware
from sapptk.models.cards import CardGroup, ModelCard
from sapptk.models.frameworks import Framework
from sapptk.models.frameworks import framework as framework_preset
from sapptk.models.layout import DTYPE_BYTES, Hardware, Parallel
from sapptk.models.ops import (
    Operator,
    attention_widths,
    capacity,
    check_fp8,
    dims,
    layer_ops,
    layer_param_split,
    recompute_hiding,
    step_ops,
    to_frame,
)
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LOSSES", "MEMORY_FIGURES", "NOT_MODELLED", "LayerTensor", "layer_flops", "layer_tensors", "op_select_kept",
           "operators",
           "static_bytes_per_parameter",
           "check_layout", "estimate_profile"]

_KEEP = frozenset({"none", "select", "comm", "both"})
"""Tensors every mode but full keeps."""
_SCORES = frozenset({"none", "comm"})
"""The attention core's own tensors: select (and both) recompute the core."""
_COLUMN = frozenset({"none", "select"})
"""Norm outputs (gathered under sequence parallelism) feeding a column-parallel matmul or
the expert dispatch, and what the all-to-alls return: comm (and both) recompute them."""
_ALL = frozenset(MODES)
"""The layer input: kept in every mode, the only tensor full recompute keeps."""

_GROUP_FIELDS = frozenset(f.name for f in fields(LayerGroup))
_PROFILE_FIELDS = frozenset(f.name for f in fields(Profile))
"""Long-context fields (``seq_length``; ``kv_mb_per_token``, ``attention_share``) are filled
where the profile types have them."""

NOT_MODELLED: tuple[str, ...] = (
    "norm statistics (4-8 bytes per token) and integer routing indices",
    "load imbalance between experts (routing is taken as balanced) and node-limited routing",
    "vocabulary padding (the card's vocabulary is used as is)",
    "slowdown of compute that runs beside overlapped communication (SM and memory contention), except the SMs "
    "the expert all-to-all holds under the 1F1B all-to-all overlap",
    "the optimizer step's own time (the data-parallel collectives of a step are in provenance)",
    "FP8 copies of activations kept for the backward (kept in the compute dtype)",
    "the MoE all-to-all hidden under another micro-batch's compute in the simulator (DualPipe pairs: provenance "
    "only; Megatron's 1F1B all-to-all overlap, moe_a2a_overlap, is in the layer times)",
    "host (CPU) time: kernel launches and the all-to-all dispatcher's token-count synchronisation",
)
"""What the estimate leaves out (also in ``docs/estimation.md`` and on every profile)."""


@dataclass(frozen=True)
class LayerTensor:
    """One tensor a layer keeps for its backward: ``mb`` per micro-batch on one device and
    the recompute ``modes`` that keep it."""

    name: str
    block: str
    mb: float
    modes: frozenset[str]


def layer_tensors(card: ModelCard, parallel: Parallel, *, moe: bool = False) -> list[LayerTensor]:
    """Every tensor one transformer layer keeps for its backward (one micro-batch, one
    device), with the modes that keep it: the table of ``docs/estimation.md``."""
    d = dims(card, parallel)
    n, nsp, t, h = d["N"], d["Nsp"], d["t"], d["h"]
    s, b, a = parallel.seq_length, parallel.micro_batch_size, card.num_heads
    e = DTYPE_BYTES[parallel.compute_dtype]  # bytes of an activation element (2; fp32: 4)
    out: list[LayerTensor] = []

    def add(name: str, block: str, nbytes: float, modes: frozenset[str]) -> None:
        out.append(LayerTensor(name, block, nbytes / 1e6, modes))

    add("attention norm input (the layer input)", "attention", e * nsp * h, _ALL)
    add("attention norm output (QKV input)", "attention", e * nsp * h, _COLUMN)
    dqk, dv, kv_heads = attention_widths(card)
    if card.mla is not None:
        m = card.mla
        if m.q_lora_rank:
            add("query down-projection output (q norm input)", "attention", e * nsp * m.q_lora_rank, _KEEP)
            add("q norm output (query up-projection input)", "attention", e * nsp * m.q_lora_rank, _COLUMN)
        add("KV down-projection output (KV norm input, rope key)", "attention",
            e * nsp * (m.kv_lora_rank + m.qk_rope_dim), _KEEP)
        add("KV norm output (KV up-projection input)", "attention", e * nsp * m.kv_lora_rank, _COLUMN)
    add("Q", "attention", e * n * a * dqk / t, _KEEP)
    add("K", "attention", e * n * kv_heads * dqk / t, _KEEP)
    add("V", "attention", e * n * kv_heads * dv / t, _KEEP)
    if parallel.flash_attention:
        add("softmax statistics (fp32, flash attention)", "attention", 4 * n * a / t, _SCORES)
    else:
        add("softmax output", "attention", e * a * s * s * b / t, _SCORES)
        if card.dropout:
            add("attention dropout mask", "attention", a * s * s * b / t, _SCORES)
            add("attention dropout output", "attention", e * a * s * s * b / t, _SCORES)
    add("attention output (output-projection input)", "attention", e * n * a * dv / t, _KEEP)
    if card.dropout:
        add("attention residual dropout mask", "attention", nsp * h, _KEEP)
    add("FFN norm input", "ffn", e * nsp * h, _KEEP)
    add("FFN norm output (FC1 / router input)", "ffn", e * nsp * h, _COLUMN)
    widths = 2 if card.gated_mlp else 1
    if not moe:
        f = card.intermediate_size
        add("FC1 output (activation input" + (", gate and up)" if card.gated_mlp else ")"), "ffn",
            e * n * widths * f / t, _KEEP)
        add("FC2 input (activation output)", "ffn", e * n * f / t, _KEEP)
    else:
        assert card.moe is not None
        mo = card.moe
        routed = nsp * mo.top_k * capacity(parallel)  # expert tokens per device (balanced routing)
        add("router probabilities (fp32)", "moe", 4 * nsp * mo.experts, _KEEP)
        add("routing weights of the top-k (fp32)", "moe", 4 * nsp * mo.top_k, _KEEP)
        add("dispatched tokens, gathered over expert TP (expert FC1 input)", "moe",
            e * routed * parallel.expert_tp * h, _COLUMN)
        add("expert FC1 output (gate and up)", "moe", e * routed * 2 * mo.expert_size, _KEEP)
        add("expert FC2 input", "moe", e * routed * mo.expert_size, _KEEP)
        add("combined expert outputs (for the routing weights' gradient)", "moe", e * routed * h, _COLUMN)
        if mo.shared_size:
            add("shared expert FC1 output (gate and up)", "moe", e * n * 2 * mo.shared_size / t, _KEEP)
            add("shared expert FC2 input", "moe", e * n * mo.shared_size / t, _KEEP)
    if card.dropout:
        add("FFN residual dropout mask", "ffn", nsp * h, _KEEP)
    return out


def op_select_kept(card: ModelCard, parallel: Parallel, tensors: list[LayerTensor], *,
                   moe: bool = False) -> tuple[float, float] | None:
    """torchtitan's op-level selective activation checkpointing (``selective_ac_option = "op"``):
    (MB kept, MB rebuilt in the backward's recompute) per micro-batch, or ``None`` where the
    policy is not written down here (MoE, MLA, attention without flash). The policy saves the
    output of every odd-numbered matmul of the layer's forward and of the attention kernel
    (torchtitan ``_save_list`` with "save every other mm"): with the Llama order wq, wk, wv,
    attention, wo, w1, w3, w2 it keeps the layer input (the checkpoint's input), Q, V, the
    attention output and its softmax statistics, w1's output (the gate half of FC1) and w2's
    output; everything else (norms, K, wo's output, w3's output, the SwiGLU product) is
    rebuilt for the backward."""
    if moe or card.mla is not None or not parallel.flash_attention or not card.gated_mlp or card.dropout:
        return None
    d = dims(card, parallel)
    n, nsp, t, h = d["N"], d["Nsp"], d["t"], d["h"]
    a, e = card.num_heads, DTYPE_BYTES[parallel.compute_dtype]
    dqk, dv, kv_heads = attention_widths(card)
    listed = (e * nsp * h + e * n * a * dqk / t + e * n * kv_heads * dv / t + 4 * n * a / t
              + e * n * a * dv / t + e * n * card.intermediate_size / t) / 1e6
    w2_output = e * nsp * h / 1e6  # not a tensor of layer_tensors' list (no backward needs it)
    none = sum(x.mb for x in tensors)
    return listed + w2_output, max(0.0, none - listed)


def layer_flops(card: ModelCard, parallel: Parallel, *, moe: bool = False) -> dict[str, float]:
    """Forward FLOPs of one layer on one device for one micro-batch: ``matmul`` (every
    linear layer) and ``attention`` (the causal core: QKᵀ and the product with V, half of
    the full square)."""
    d = dims(card, parallel)
    n, nsp, t, h = d["N"], d["Nsp"], d["t"], d["h"]
    a, s = card.num_heads, parallel.seq_length
    dqk, dv, kv_heads = attention_widths(card)
    if card.mla is not None:
        m = card.mla
        q = (2 * nsp * h * m.q_lora_rank + 2 * n * m.q_lora_rank * a * dqk / t) if m.q_lora_rank \
            else 2 * n * h * a * dqk / t
        kv = 2 * nsp * h * (m.kv_lora_rank + m.qk_rope_dim) + 2 * n * m.kv_lora_rank * a * (m.qk_nope_dim + dv) / t
        matmul = q + kv + 2 * n * a * dv * h / t
    else:
        matmul = 2 * n * h * (a * dqk + 2 * kv_heads * dqk) / t + 2 * n * a * dv * h / t
    attention = n * s * a * (dqk + dv) / t  # 2·N·(s/2)·a·(dqk + dv): causal, on average s/2 keys per query
    if not moe:
        matmul += (6 if card.gated_mlp else 4) * n * h * card.intermediate_size / t
    else:
        assert card.moe is not None
        e = card.moe
        routed = nsp * e.top_k * capacity(parallel)
        matmul += 2 * nsp * h * e.experts + 6 * routed * h * e.expert_size + 6 * n * h * e.shared_size / t
    return {"matmul": matmul, "attention": attention}


def static_bytes_per_parameter(parallel: Parallel, data_parallel: int) -> float:
    """Bytes one device keeps per parameter it holds: weight (compute dtype), gradient
    (``grad_dtype``) and, with Adam, fp32 master weights (when computing in 16 bits) and
    two moments (``moment_dtype``: 4 or 2 bytes each), divided over ``data_parallel``
    ranks as ``sharding`` says."""
    weight = DTYPE_BYTES[parallel.compute_dtype]
    grad = DTYPE_BYTES[parallel.grad_dtype]
    moments = 2 * DTYPE_BYTES[parallel.moment_dtype]
    optimizer = (moments + (4 if weight < 4 else 0)) if parallel.adam else 0
    shard = parallel.sharding
    dp = float(data_parallel)
    if shard == "none":
        return weight + grad + optimizer
    if shard == "distributed":
        return weight + grad + optimizer / dp
    if shard == "zero2":
        return weight + (grad + optimizer) / dp
    return (weight + grad + optimizer) / dp


def _layer_static_mb(card: ModelCard, par: Parallel, moe: bool) -> float:
    dense, experts = layer_param_split(card, par, moe)
    per_dense = static_bytes_per_parameter(par, par.dp * par.cp)
    per_expert = static_bytes_per_parameter(par, par.expert_dp)
    return (dense * per_dense + experts * per_expert) / 1e6


def check_layout(card: ModelCard, parallel: Parallel) -> None:
    """The checks that need both the card and the layout; :class:`ConfigError` naming the
    field, the value and what was expected."""
    where = f"parallel layout for {card.name!r}"
    t = parallel.tp
    if card.num_heads % t:
        raise ConfigError(f"{where}: field 'tp' = {t}: expected a divisor of the {card.num_heads} attention heads")
    if card.mla is None and card.num_kv_heads % t:
        raise ConfigError(
            f"{where}: field 'tp' = {t}: expected a divisor of the {card.num_kv_heads} key/value heads"
        )
    if card.moe is None and parallel.ep > 1:
        raise ConfigError(f"{where}: field 'ep' = {parallel.ep}: expected 1 ({card.name!r} has no experts)")
    if card.moe is not None and card.moe.experts % parallel.ep:
        raise ConfigError(
            f"{where}: field 'ep' = {parallel.ep}: expected a divisor of the {card.moe.experts} experts"
        )
    if card.moe is not None and t > 1 and not parallel.sequence_parallel:
        raise ConfigError(
            f"{where}: field 'sequence_parallel' = False: expected True for MoE layers with tp = {t} "
            "(as Megatron requires)"
        )
    if card.positions and parallel.seq_length > card.positions:
        raise ConfigError(
            f"{where}: field 'seq_length' = {parallel.seq_length}: expected at most the card's "
            f"{card.positions} learned positions"
        )


def _r(value: float) -> float:
    """Figures kept to 1e-6 (ns, bytes): exports stay readable, nothing that matters moves."""
    return round(value, 6)


def _head_tail_params(card: ModelCard, par: Parallel, kind: str) -> float:
    """Parameters of the head (embedding) or tail (final norm, output layer) on one device."""
    if kind == "head":
        return card.vocab_size * card.hidden_size / par.tp + card.positions * card.hidden_size
    params = card.output_parameters(count_tied=True) - card.vocab_size * card.hidden_size
    return params + card.vocab_size * card.hidden_size / par.tp


def _head_static_mb(card: ModelCard, par: Parallel) -> float:
    return _head_tail_params(card, par, "head") * static_bytes_per_parameter(par, par.dp * par.cp) / 1e6


def _tail_static_mb(card: ModelCard, par: Parallel) -> float:
    return _head_tail_params(card, par, "tail") * static_bytes_per_parameter(par, par.dp * par.cp) / 1e6


def _unsharded_bytes_per_parameter(par: Parallel) -> float:
    """FSDP without resharding: the unsharded weight (compute dtype) and the unsharded
    gradient accumulated over the micro-batches (``grad_dtype``) every layer keeps."""
    return DTYPE_BYTES[par.compute_dtype] + DTYPE_BYTES[par.grad_dtype]


LOSSES: tuple[str, ...] = ("fused", "eager", "compiled")
"""How the loss holds the logits (``loss=`` of :func:`estimate_profile`), in buffers of the
logits' size: ``fused`` (Megatron's vocab-parallel cross entropy: the fp32 logits kept, their
gradient written beside them), ``eager`` (PyTorch's ``cross_entropy`` on the fp32 upcast, as
torchtitan runs it uncompiled: the log-softmax output kept; at its backward the incoming
gradient and the logits' gradient, both fp32, beside it), ``compiled`` (``torch.compile`` of
the upcast and the loss: the compute-dtype logits kept and one compute-dtype gradient)."""

_DEFAULT_LOSS = {"torchtitan": "eager"}
"""A framework's loss when ``loss`` is not given (others: ``fused``)."""

_OP_SELECT = frozenset({"torchtitan"})
"""Frameworks whose ``select`` is op-level selective checkpointing (:func:`op_select_kept`)."""


def _loss_mb(card: ModelCard, par: Parallel, loss: str) -> tuple[float, float]:
    """(kept, transient at the loss backward's peak) MB of the logits per micro-batch."""
    logits = dims(card, par)["N"] * card.vocab_size / par.tp
    if loss == "compiled":
        e = DTYPE_BYTES[par.compute_dtype]
        return e * logits / 1e6, e * logits / 1e6
    return 4 * logits / 1e6, (8 if loss == "eager" else 4) * logits / 1e6


def _exposed(rows: list[Operator]) -> float:
    return sum(r.exposed_ms for r in rows)


def _mode_times(fwd: list[Operator], bwd: list[Operator]) -> tuple[float, dict[str, float]]:
    """Forward ms and backward ms per mode (the backward plus what the mode reruns)."""
    forward = _exposed(fwd)
    back = _exposed(bwd)
    extra = dict.fromkeys(MODES, 0.0)
    for r in fwd:
        for mode in r.recompute:
            extra[mode] += r.exposed_ms
    return forward, {m: back + extra[m] - recompute_hiding(fwd, bwd, m) for m in MODES}


def _head_tail_kept(card: ModelCard, par: Parallel, kind: str) -> float:
    d = dims(card, par)
    n, nsp, h = d["N"], d["Nsp"], d["h"]
    e = DTYPE_BYTES[par.compute_dtype]
    if kind == "head":
        return 8 * n + (nsp * h if card.dropout else 0.0)  # int64 token ids (+ dropout mask)
    return 2 * e * nsp * h  # final norm input and output (the logits: _loss_mb)


def _body_transient_mb(tensors: list[LayerTensor], card: ModelCard, par: Parallel, moe: bool,
                       op_select: tuple[float, float] | None = None, fsdp_reshard: bool = True) -> dict[str, float]:
    """Per mode, the MB a layer's backward holds beyond its kept tensors at its peak: the
    tensors the mode recomputes (rebuilt for this layer's backward) plus the largest
    backward temporary, taken as twice the largest kept tensor (its gradient and the
    gradient arriving beside it); FSDP adds two unsharded layers' weights and one layer's
    unsharded gradients (not when every layer stays unsharded: ``fsdp_reshard`` False, they
    are in the layer's static memory). ``op_select``: select is torchtitan's op-level policy
    (:func:`op_select_kept`), its rebuilt tensors in place of the attention core's."""
    largest = 2 * max(x.mb for x in tensors)
    none = sum(x.mb for x in tensors)
    out = {}
    for mode in MODES:
        kept = sum(x.mb for x in tensors if mode in x.modes)
        out[mode] = none - kept + largest
    if op_select is not None:
        out["select"] = op_select[1] + largest
    if par.sharding == "fsdp" and fsdp_reshard:
        dense, experts = layer_param_split(card, par, moe)
        per = dense + experts
        fsdp = (2 * DTYPE_BYTES[par.compute_dtype] + DTYPE_BYTES[par.grad_dtype]) * per / 1e6
        out = {m: v + fsdp for m, v in out.items()}
    return out


_A2A = ("dispatch_all_to_all", "combine_all_to_all")


def _dualpipe_pair(fwd: list[Operator], bwd: list[Operator]) -> dict[str, float]:
    """One DualPipe overlapped unit of a MoE layer: the forward of one micro-batch beside the
    backward of another. ``sum``: the two run one after the other; ``overlapped``: each
    one's expert all-to-alls hidden under the other's compute (DeepSeek-V3 report, section
    3.2.1: the all-to-alls of one chunk under the computation of the other)."""
    forward, back = _exposed(fwd), _exposed(bwd)
    comm_f = sum(r.exposed_ms for r in fwd if r.op in _A2A)
    comm_b = sum(r.exposed_ms for r in bwd if r.op.removesuffix("_bwd") in _A2A)
    compute_f, compute_b = forward - comm_f, back - comm_b
    overlapped = compute_f + compute_b + max(0.0, comm_f - compute_b) + max(0.0, comm_b - compute_f)
    return {"sum": _r(forward + back), "overlapped": _r(overlapped), "forward_all_to_all": _r(comm_f),
            "backward_all_to_all": _r(comm_b)}


def resolve_inputs(card: ModelCard | str, parallel: Parallel | None, hardware: Hardware | str,
                   framework: Framework | str) -> tuple[ModelCard, Parallel, Hardware, Framework]:
    """The card, layout, hardware and framework an estimate names, checked together."""
    model = bundled_card(card) if isinstance(card, str) else card
    if not isinstance(model, ModelCard):
        raise ConfigError(f"estimate_profile: card = {model!r}: expected a ModelCard or a bundled card name")
    par = Parallel() if parallel is None else parallel
    if not isinstance(par, Parallel):
        raise ConfigError(f"estimate_profile: parallel = {par!r}: expected a Parallel")
    hw = bundled_hardware(hardware) if isinstance(hardware, str) else hardware
    if not isinstance(hw, Hardware):
        raise ConfigError(f"estimate_profile: hardware = {hw!r}: expected a Hardware or a bundled hardware name")
    fw = framework_preset(framework)
    if par.etp is None:  # the framework's convention (Megatron: expert TP = tp)
        par = replace(par, etp=par.tp if fw.expert_tp_follows_tp and model.moe is not None else 1)
    check_layout(model, par)
    check_fp8(par, hw)
    return model, par, hw, fw


def tables(model: ModelCard, par: Parallel, hw: Hardware, fw: Framework,
           groups: tuple[CardGroup, ...] | None = None) -> list[tuple[list[Operator], list[Operator], list[Operator]]]:
    """(forward, backward, step) operators of one layer of each group (``model.groups``
    unless given), in model order."""
    out = []
    for group in model.groups if groups is None else groups:
        fwd, bwd = layer_ops(model, par, hw, fw, group=group.name, kind=group.kind, moe=group.moe)
        step: list[Operator] = []
        if group.kind == "body":
            step = step_ops(model, par, hw, fw, group=group.name, moe=group.moe,
                            backward_ms=_exposed(bwd), forward_ms=_exposed(fwd))
        out.append((fwd, bwd, step))
    return out


def operators(card: ModelCard | str, parallel: Parallel | None = None, hardware: Hardware | str = "h100", *,
              framework: Framework | str = "megatron") -> pd.DataFrame:
    """The operator table of ``card`` under ``parallel`` on ``hardware`` with ``framework``'s
    overlaps: one row per operator and phase (``fwd``, ``bwd``, ``recompute`` with its
    ``mode``, ``step`` for the once-per-step data-parallel collectives) of one layer of each
    group (head, body groups, tail), with columns :data:`COLUMNS`. Summing ``exposed_ms``
    over a group's ``fwd`` rows gives its profile forward time; over ``bwd`` plus a mode's
    ``recompute`` rows its backward in that mode. Raises
    :class:`~sapptk.errors.ConfigError` as :func:`sapptk.estimate_profile` does."""
    model, par, hw, fw = resolve_inputs(card, parallel, hardware, framework)
    return to_frame(tables(model, par, hw, fw))


MEMORY_FIGURES: tuple[str, ...] = ("allocated", "reserved")
"""What an estimate's memory figures are: the caching allocator's ``allocated`` bytes (what
tensors hold) or its ``reserved`` bytes (allocated × (1 + ``Hardware.allocator_reserve``)
for the dynamic memory: activations and transients)."""


def estimate_profile(
    card: ModelCard | str,
    parallel: Parallel | None = None,
    hardware: Hardware | str = "h100",
    *,
    framework: Framework | str = "megatron",
    memory: str = "allocated",
    loss: str | None = None,
    fsdp_reshard: bool = True,
) -> Profile:
    """A :class:`~sapptk.profile.Profile` for ``card`` (a :class:`ModelCard` or a bundled
    name) run with ``parallel`` (default :class:`Parallel`) on ``hardware`` (a
    :class:`Hardware` or a bundled name) under ``framework``'s overlaps (a preset name of
    :data:`~sapptk.models.frameworks.FRAMEWORKS` or a :class:`Framework`). Groups follow
    ``card.groups``: ``embedding`` (head), the body groups with every recompute mode,
    ``output`` (tail); times are the exposed times of each layer's operators
    (:func:`sapptk.models.operators`). ``memory`` says which figure the memory is:
    ``allocated`` or ``reserved`` (:data:`MEMORY_FIGURES`). ``loss``: how the loss holds the
    logits (:data:`LOSSES`; default: the framework's, ``eager`` for torchtitan, else ``fused``).
    ``fsdp_reshard`` False: under ``sharding="fsdp"`` every layer keeps its unsharded weight
    and its unsharded gradient through the step (torchtitan under pipeline parallelism:
    ``reshard_after_forward=False``, gradient sync deferred to the last micro-batch), charged
    in each layer's static memory. Under torchtitan, ``select`` is its op-level selective
    checkpointing (:func:`op_select_kept`) where written down. The profile's ``provenance``
    names the card, layout, hardware, framework, the memory figure, the per-device
    constant (``constant_mb`` = the card's context constant + the body layers' largest transient, for
    ``PipelineConfig(constant_memory=...)``), the operator table and what is not
    modelled. Raises :class:`~sapptk.errors.ConfigError` for a layout the card does not
    admit (heads or KV heads not divisible by ``tp``, experts by ``ep``, FP8 on a card
    without it, ...)."""
    model, par, hw, fw = resolve_inputs(card, parallel, hardware, framework)
    if memory not in MEMORY_FIGURES:
        raise ConfigError(f"estimate_profile: memory = {memory!r}: expected one of {', '.join(MEMORY_FIGURES)}")
    loss = _DEFAULT_LOSS.get(fw.name, "fused") if loss is None else loss
    if loss not in LOSSES:
        raise ConfigError(f"estimate_profile: loss = {loss!r}: expected one of {', '.join(LOSSES)}")
    if not isinstance(fsdp_reshard, bool):
        raise ConfigError(f"estimate_profile: fsdp_reshard = {fsdp_reshard!r}: expected True or False")
    unsharded = _unsharded_bytes_per_parameter(par) if par.sharding == "fsdp" and not fsdp_reshard else 0.0
    scale = 1.0 + hw.allocator_reserve if memory == "reserved" else 1.0
    card_groups = model.groups
    ops = tables(model, par, hw, fw, card_groups)
    groups: list[LayerGroup] = []
    transient: dict[str, dict[str, float]] = {}
    step_ms: dict[str, float] = {}
    pairs: dict[str, dict[str, float]] = {}
    for group, (fwd, bwd, step) in zip(card_groups, ops, strict=True):
        forward, backward = _mode_times(fwd, bwd)
        if group.kind == "body":
            tensors = layer_tensors(model, par, moe=group.moe)
            kept = {m: sum(x.mb for x in tensors if m in x.modes) for m in MODES}
            op_select = op_select_kept(model, par, tensors, moe=group.moe) if fw.name in _OP_SELECT else None
            if op_select is not None:
                kept["select"] = op_select[0]
            modes = {m: ModeCost(backward=_r(backward[m]), activation=_r(scale * kept[m])) for m in MODES}
            transient[group.name] = {m: _r(v * scale) for m, v in _body_transient_mb(
                tensors, model, par, group.moe, op_select, fsdp_reshard=not unsharded).items()}
            dense, experts = layer_param_split(model, par, group.moe)
            params = _layer_static_mb(model, par, group.moe) + unsharded * (dense + experts) / 1e6
            step_ms[group.name] = _r(_exposed(step))
            if group.moe:
                pairs[group.name] = _dualpipe_pair(fwd, bwd)
            extra: dict[str, float] = {}
            if "kv_mb_per_token" in _GROUP_FIELDS:
                dqk, dv, kv_heads = attention_widths(model)
                e = DTYPE_BYTES[par.compute_dtype]
                extra["kv_mb_per_token"] = e * kv_heads * (dqk + dv) * par.micro_batch_size / (par.tp * par.cp) / 1e6
            if "attention_share" in _GROUP_FIELDS:
                core = sum(r.exposed_ms for r in (*fwd, *bwd) if r.kind == "attention")
                extra["attention_share"] = min(1.0, core / (forward + backward["none"]))
            groups.append(LayerGroup(name=group.name, kind="body", count=group.count, forward=_r(forward),
                                     params=_r(params), modes=modes, **extra))
        else:
            static = _head_static_mb(model, par) if group.kind == "head" else _tail_static_mb(model, par)
            static += unsharded * _head_tail_params(model, par, group.kind) / 1e6
            held = scale * _head_tail_kept(model, par, group.kind) / 1e6
            if group.kind == "tail":  # the logits as the loss keeps them, and its backward's buffers beside
                logits, grad = (scale * v for v in _loss_mb(model, par, loss))
                transient[group.name] = {"none": _r(grad)}
                held += logits + grad
            groups.append(LayerGroup(name=group.name, kind=group.kind, count=1, forward=_r(forward),
                                     params=_r(static), modes={"none": ModeCost(backward=_r(backward["none"]),
                                                                                activation=_r(held))}))
    extra_fields = {"seq_length": par.seq_length} if "seq_length" in _PROFILE_FIELDS else {}
    body = {g.name for g in card_groups if g.kind == "body"}
    peak = max((v for name, by_mode in transient.items() if name in body for v in by_mode.values()), default=0.0)
    provenance = _provenance(model, par, hw, fw, memory=memory, transient=transient, peak=peak, step_ms=step_ms,
                             ops=ops)
    provenance["loss"] = loss
    provenance["fsdp_reshard"] = fsdp_reshard
    if pairs:
        provenance["dualpipe_pair_ms"] = pairs
    return Profile(name=_name(model, par, hw), groups=tuple(groups), provenance=provenance, **extra_fields)


def _name(card: ModelCard, par: Parallel, hw: Hardware) -> str:
    parts = [card.name, f"tp{par.tp}"]
    if par.cp > 1:
        parts.append(f"cp{par.cp}")
    if par.ep > 1:
        parts.append(f"ep{par.ep}")
    if par.expert_tp > 1:
        parts.append(f"etp{par.expert_tp}")
    parts += [f"s{par.seq_length}", f"b{par.micro_batch_size}", hw.name]
    return " ".join(parts)


def _provenance(card: ModelCard, par: Parallel, hw: Hardware, fw: Framework, *, memory: str,
                transient: dict[str, dict[str, float]], peak: float, step_ms: dict[str, float],
                ops: list[tuple[list[Operator], list[Operator], list[Operator]]]) -> Mapping[str, Any]:
    columns = ["group", "op", "phase", "kind", "count", "flops", "bytes", "time_ms", "exposed_ms",
               "overlapped_with", "recompute"]
    rows = [[r.group, r.op, r.phase, r.kind, r.count, r.flops, r.bytes, r.time_ms, r.exposed_ms,
             r.overlapped_with, ",".join(sorted(r.recompute))]
            for fwd, bwd, step in ops for r in (*fwd, *bwd, *step)]
    return {
        "estimated_by": "sapptk.estimate_profile",
        "card": card.describe(),
        "parallel": par.describe(),
        "hardware": hw.describe(),
        "framework": fw.name,
        "matmul_efficiency": hw.matmul_efficiency,
        "memory_figure": memory,
        "context_mb": hw.constant_mb,
        "transient_mb": transient,
        "constant_mb": _r(hw.constant_mb + peak),
        "dp_step_exposed_ms_per_layer": step_ms,
        "operators": {"columns": columns, "rows": rows},
        "not_modelled": list(NOT_MODELLED),
    }

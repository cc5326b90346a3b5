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
* **time** — FLOPs (matmuls, causal attention, MoE routed tokens) at
  ``peak × matmul_efficiency``, plus the tensor-parallel collectives, the expert
  all-to-all and the context-parallel ring from their volumes and the bandwidths;
  recompute adds what it recomputes. Communication is added, not overlapped.

Memory is in MB (10⁶ bytes), times in ms, per layer per micro-batch, as profiles are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sapptk.errors import ConfigError
from sapptk.models.bundled import card as bundled_card
from sapptk.models.bundled import hardware as bundled_hardware
from sapptk.models.cards import ModelCard
from sapptk.models.layout import DTYPE_BYTES, Hardware, Parallel
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile

__all__ = ["NOT_MODELLED", "LayerTensor", "layer_flops", "layer_tensors", "static_bytes_per_parameter",
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
    "allocator fragmentation and caching reserve",
    "temporary buffers of an op while it runs (the peak inside a backward)",
    "norm statistics (4-8 bytes per token) and integer routing indices",
    "elementwise ops' time (norms, activations, residual adds, rotary embedding)",
    "overlap of communication with compute (communication is added)",
    "data-parallel gradient reduction and optimizer step (outside the pipeline's per-micro-batch costs)",
    "load imbalance between experts (routing is taken as balanced)",
    "vocabulary padding (the card's vocabulary is used as is)",
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


def _dims(card: ModelCard, par: Parallel) -> dict[str, float]:
    tokens = par.seq_length * par.micro_batch_size / par.cp  # tokens of this device's sequence shard
    return {
        "N": tokens,
        "Nsp": tokens / par.tp if par.sp else tokens,  # tokens in the norm / dropout regions
        "t": float(par.tp),
        "h": float(card.hidden_size),
    }


def _capacity(par: Parallel) -> float:
    return 1.0 if par.capacity_factor is None else par.capacity_factor


def _attention_widths(card: ModelCard) -> tuple[int, int, int]:
    """(query/key width per head, value width per head, KV heads)."""
    if card.mla is not None:
        return card.mla.qk_nope_dim + card.mla.qk_rope_dim, card.mla.v_dim, card.num_heads
    return card.head_dim, card.head_dim, card.num_kv_heads


def layer_tensors(card: ModelCard, parallel: Parallel, *, moe: bool = False) -> list[LayerTensor]:
    """Every tensor one transformer layer keeps for its backward (one micro-batch, one
    device), with the modes that keep it: the table of ``docs/estimation.md``."""
    d = _dims(card, parallel)
    n, nsp, t, h = d["N"], d["Nsp"], d["t"], d["h"]
    s, b, a = parallel.seq_length, parallel.micro_batch_size, card.num_heads
    out: list[LayerTensor] = []

    def add(name: str, block: str, nbytes: float, modes: frozenset[str]) -> None:
        out.append(LayerTensor(name, block, nbytes / 1e6, modes))

    add("attention norm input (the layer input)", "attention", 2 * nsp * h, _ALL)
    add("attention norm output (QKV input)", "attention", 2 * nsp * h, _COLUMN)
    dqk, dv, kv_heads = _attention_widths(card)
    if card.mla is not None:
        m = card.mla
        if m.q_lora_rank:
            add("query down-projection output (q norm input)", "attention", 2 * nsp * m.q_lora_rank, _KEEP)
            add("q norm output (query up-projection input)", "attention", 2 * nsp * m.q_lora_rank, _COLUMN)
        add("KV down-projection output (KV norm input, rope key)", "attention",
            2 * nsp * (m.kv_lora_rank + m.qk_rope_dim), _KEEP)
        add("KV norm output (KV up-projection input)", "attention", 2 * nsp * m.kv_lora_rank, _COLUMN)
    add("Q", "attention", 2 * n * a * dqk / t, _KEEP)
    add("K", "attention", 2 * n * kv_heads * dqk / t, _KEEP)
    add("V", "attention", 2 * n * kv_heads * dv / t, _KEEP)
    if parallel.flash_attention:
        add("softmax statistics (fp32, flash attention)", "attention", 4 * n * a / t, _SCORES)
    else:
        add("softmax output", "attention", 2 * a * s * s * b / t, _SCORES)
        if card.dropout:
            add("attention dropout mask", "attention", a * s * s * b / t, _SCORES)
            add("attention dropout output", "attention", 2 * a * s * s * b / t, _SCORES)
    add("attention output (output-projection input)", "attention", 2 * n * a * dv / t, _KEEP)
    if card.dropout:
        add("attention residual dropout mask", "attention", nsp * h, _KEEP)
    add("FFN norm input", "ffn", 2 * nsp * h, _KEEP)
    add("FFN norm output (FC1 / router input)", "ffn", 2 * nsp * h, _COLUMN)
    widths = 2 if card.gated_mlp else 1
    if not moe:
        f = card.intermediate_size
        add("FC1 output (activation input" + (", gate and up)" if card.gated_mlp else ")"), "ffn",
            2 * n * widths * f / t, _KEEP)
        add("FC2 input (activation output)", "ffn", 2 * n * f / t, _KEEP)
    else:
        assert card.moe is not None
        e = card.moe
        routed = nsp * e.top_k * _capacity(parallel)  # expert tokens per device (balanced routing)
        add("router probabilities (fp32)", "moe", 4 * nsp * e.experts, _KEEP)
        add("routing weights of the top-k (fp32)", "moe", 4 * nsp * e.top_k, _KEEP)
        add("dispatched tokens (expert FC1 input)", "moe", 2 * routed * h, _COLUMN)
        add("expert FC1 output (gate and up)", "moe", 2 * routed * 2 * e.expert_size, _KEEP)
        add("expert FC2 input", "moe", 2 * routed * e.expert_size, _KEEP)
        add("combined expert outputs (for the routing weights' gradient)", "moe", 2 * routed * h, _COLUMN)
        if e.shared_size:
            add("shared expert FC1 output (gate and up)", "moe", 2 * n * 2 * e.shared_size / t, _KEEP)
            add("shared expert FC2 input", "moe", 2 * n * e.shared_size / t, _KEEP)
    if card.dropout:
        add("FFN residual dropout mask", "ffn", nsp * h, _KEEP)
    return out


def layer_flops(card: ModelCard, parallel: Parallel, *, moe: bool = False) -> dict[str, float]:
    """Forward FLOPs of one layer on one device for one micro-batch: ``matmul`` (every
    linear layer) and ``attention`` (the causal core: QKᵀ and the product with V, half of
    the full square)."""
    d = _dims(card, parallel)
    n, nsp, t, h = d["N"], d["Nsp"], d["t"], d["h"]
    a, s = card.num_heads, parallel.seq_length
    dqk, dv, kv_heads = _attention_widths(card)
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
        routed = nsp * e.top_k * _capacity(parallel)
        matmul += 2 * nsp * h * e.experts + 6 * routed * h * e.expert_size + 6 * n * h * e.shared_size / t
    return {"matmul": matmul, "attention": attention}


def _layer_comm_ms(card: ModelCard, par: Parallel, hw: Hardware, moe: bool) -> dict[str, float]:
    """Forward communication of one layer, ms: ``tp`` (all-gathers and reduce-scatters, or
    all-reduces), ``tp_gather`` (the all-gathers alone, which comm recompute repeats),
    ``ep`` (dispatch and combine all-to-all), ``cp`` (the ring passing K and V)."""
    d = _dims(card, par)
    n, t, h = d["N"], par.tp, d["h"]
    activation = 2 * n * h  # bytes of one full-width activation of this device's tokens
    collectives = 2 if (not moe or (card.moe is not None and card.moe.shared_size)) else 1
    tp = tp_gather = 0.0
    if t > 1:
        one = (t - 1) / t * activation / hw.bandwidth(t)  # an all-gather or a reduce-scatter
        # per block, SP: an all-gather and a reduce-scatter; no SP: one all-reduce (= 2 × one)
        tp = 2 * collectives * one
        tp_gather = collectives * one if par.sp else 0.0
    ep = 0.0
    if moe and par.ep > 1:
        assert card.moe is not None
        routed = d["Nsp"] * card.moe.top_k * _capacity(par)
        ep = 2 * (par.ep - 1) / par.ep * 2 * routed * h / hw.bandwidth(t * par.cp * par.ep)
    cp = 0.0
    if par.cp > 1:
        dqk, dv, kv_heads = _attention_widths(card)
        kv_bytes = 2 * n * kv_heads * (dqk + dv) / t
        cp = (par.cp - 1) * kv_bytes / hw.bandwidth(t * par.cp)
    return {"tp": tp, "tp_gather": tp_gather, "ep": ep, "cp": cp}


def static_bytes_per_parameter(parallel: Parallel, data_parallel: int) -> float:
    """Bytes one device keeps per parameter it holds: weight (compute dtype), gradient
    (``grad_dtype``) and, with Adam, fp32 master weights (when computing in 16 bits) and
    two fp32 moments, divided over ``data_parallel`` ranks as ``sharding`` says."""
    weight = DTYPE_BYTES[parallel.compute_dtype]
    grad = DTYPE_BYTES[parallel.grad_dtype]
    optimizer = (8 + (4 if weight < 4 else 0)) if parallel.adam else 0
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
    attention = card.attention_parameters()
    ffn = card.ffn_parameters(moe)
    dense = (attention["sharded"] + ffn["sharded"]) / par.tp + attention["replicated"] + ffn["replicated"]
    dense += 2 * card.hidden_size * (2 if card.norm == "layernorm" else 1)
    per_dense = static_bytes_per_parameter(par, par.dp * par.cp)
    experts = ffn["experts"] / par.ep
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


def _body_group(name: str, count: int, card: ModelCard, par: Parallel, hw: Hardware, moe: bool) -> LayerGroup:
    tensors = layer_tensors(card, par, moe=moe)
    flops = layer_flops(card, par, moe=moe)
    comm = _layer_comm_ms(card, par, hw, moe)
    rate = hw.flops_per_ms()
    comm_fwd = comm["tp"] + comm["ep"] + comm["cp"]
    matmul_ms, attention_ms = flops["matmul"] / rate, flops["attention"] / rate
    forward = matmul_ms + attention_ms + comm_fwd
    attention_bwd = (2.5 if par.flash_attention else 2.0) * attention_ms  # flash recomputes the scores
    backward = 2 * matmul_ms + attention_bwd + comm["tp"] + comm["ep"] + 2 * comm["cp"]
    extra = {
        "none": 0.0,
        "select": attention_ms,
        "comm": comm["tp_gather"] + comm["ep"],
        "both": attention_ms + comm["tp_gather"] + comm["ep"],
        "full": forward,
    }
    modes = {
        m: ModeCost(backward=_r(backward + extra[m]), activation=_r(sum(x.mb for x in tensors if m in x.modes)))
        for m in MODES
    }
    long_context: dict[str, float] = {}  # the long-context fields, where the profile has them
    if "kv_mb_per_token" in _GROUP_FIELDS:
        dqk, dv, kv_heads = _attention_widths(card)
        bytes_per_token = 2 * kv_heads * (dqk + dv) * par.micro_batch_size / (par.tp * par.cp)
        long_context["kv_mb_per_token"] = bytes_per_token / 1e6
    if "attention_share" in _GROUP_FIELDS:
        long_context["attention_share"] = min(1.0, (attention_ms + attention_bwd) / (forward + backward))
    return LayerGroup(name=name, kind="body", count=count, forward=_r(forward),
                      params=_r(_layer_static_mb(card, par, moe)), modes=modes, **long_context)


def _r(value: float) -> float:
    """Figures kept to 1e-6 (ns, bytes): exports stay readable, nothing that matters moves."""
    return round(value, 6)


def _head_group(card: ModelCard, par: Parallel, hw: Hardware) -> LayerGroup:
    d = _dims(card, par)
    n, nsp, t, h = d["N"], d["Nsp"], par.tp, d["h"]
    hbm = hw.hbm_tbps * 1e12 / 1e3  # bytes per ms
    lookup = (2 * n * h + 2 * nsp * h) / hbm  # gather the rows, write the output
    # vocabulary-parallel lookup: a reduce-scatter (SP) or an all-reduce (twice the bytes) of the output
    reduce = (1 if par.sp else 2) * (t - 1) / t * 2 * n * h / hw.bandwidth(t) if t > 1 else 0.0
    kept = 8 * n + (nsp * h if card.dropout else 0.0)  # int64 token ids (+ dropout mask)
    params = card.vocab_size * card.hidden_size / t + card.positions * card.hidden_size
    per = static_bytes_per_parameter(par, par.dp * par.cp)
    forward = lookup + reduce
    return LayerGroup(name="embedding", kind="head", count=1, forward=_r(forward), params=_r(params * per / 1e6),
                      modes={"none": ModeCost(backward=_r(2 * lookup + reduce), activation=_r(kept / 1e6))})


def _tail_group(card: ModelCard, par: Parallel, hw: Hardware) -> LayerGroup:
    d = _dims(card, par)
    n, nsp, t, h = d["N"], d["Nsp"], par.tp, d["h"]
    v = card.vocab_size
    hbm = hw.hbm_tbps * 1e12 / 1e3
    lm_ms = 2 * n * h * v / t / hw.flops_per_ms()
    logits = 4 * n * v / t  # fp32 logits for the loss
    one = (t - 1) / t * 2 * n * h / hw.bandwidth(t) if t > 1 else 0.0
    gather = one if par.sp else 0.0  # SP: the final norm's output gathered; its gradient reduce-scattered
    forward = lm_ms + 2 * logits / hbm + gather
    backward = 2 * lm_ms + 2 * logits / hbm + (gather if par.sp else 2 * one)  # no SP: all-reduce the input grad
    kept = 2 * nsp * h + 2 * nsp * h + logits  # final norm input and output, fp32 logits
    params = card.output_parameters(count_tied=True) - card.vocab_size * card.hidden_size
    params += card.vocab_size * card.hidden_size / t
    per = static_bytes_per_parameter(par, par.dp * par.cp)
    return LayerGroup(name="output", kind="tail", count=1, forward=_r(forward), params=_r(params * per / 1e6),
                      modes={"none": ModeCost(backward=_r(backward), activation=_r(kept / 1e6))})


def estimate_profile(
    card: ModelCard | str,
    parallel: Parallel | None = None,
    hardware: Hardware | str = "h100",
) -> Profile:
    """A :class:`~sapptk.profile.Profile` for ``card`` (a :class:`ModelCard` or a bundled
    name) run with ``parallel`` (default :class:`Parallel`) on ``hardware`` (a
    :class:`Hardware` or a bundled name). Groups follow ``card.groups``: ``embedding``
    (head), the body groups with every recompute mode, ``output`` (tail). The profile's
    ``provenance`` names the card, layout, hardware and efficiency, the per-device
    constant (``constant_mb``, for ``PipelineConfig(constant_memory=...)``) and what is
    not modelled. Raises :class:`~sapptk.errors.ConfigError` for a layout the card does
    not admit (heads or KV heads not divisible by ``tp``, experts by ``ep``, ...)."""
    model = bundled_card(card) if isinstance(card, str) else card
    if not isinstance(model, ModelCard):
        raise ConfigError(f"estimate_profile: card = {model!r}: expected a ModelCard or a bundled card name")
    par = Parallel() if parallel is None else parallel
    if not isinstance(par, Parallel):
        raise ConfigError(f"estimate_profile: parallel = {par!r}: expected a Parallel")
    hw = bundled_hardware(hardware) if isinstance(hardware, str) else hardware
    if not isinstance(hw, Hardware):
        raise ConfigError(f"estimate_profile: hardware = {hw!r}: expected a Hardware or a bundled hardware name")
    check_layout(model, par)
    groups = [_head_group(model, par, hw)]
    for group in model.groups:
        if group.kind == "body":
            groups.append(_body_group(group.name, group.count, model, par, hw, group.moe))
    groups.append(_tail_group(model, par, hw))
    extra = {"seq_length": par.seq_length} if "seq_length" in _PROFILE_FIELDS else {}
    return Profile(name=_name(model, par, hw), groups=tuple(groups), provenance=_provenance(model, par, hw), **extra)


def _name(card: ModelCard, par: Parallel, hw: Hardware) -> str:
    parts = [card.name, f"tp{par.tp}"]
    if par.cp > 1:
        parts.append(f"cp{par.cp}")
    if par.ep > 1:
        parts.append(f"ep{par.ep}")
    parts += [f"s{par.seq_length}", f"b{par.micro_batch_size}", hw.name]
    return " ".join(parts)


def _provenance(card: ModelCard, par: Parallel, hw: Hardware) -> Mapping[str, Any]:
    return {
        "estimated_by": "sapptk.estimate_profile",
        "card": card.describe(),
        "parallel": par.describe(),
        "hardware": hw.describe(),
        "matmul_efficiency": hw.matmul_efficiency,
        "constant_mb": hw.constant_mb,
        "not_modelled": list(NOT_MODELLED),
    }

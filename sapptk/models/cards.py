"""Model cards: a model's shapes read from a Hugging Face ``config.json``, its layer groups
and its exact parameter count.

:meth:`ModelCard.from_hf` reads the JSON itself (no ``transformers``, no hub): a path to a
``config.json`` (or to the folder holding one) or the parsed mapping. Supported
``model_type`` values are :data:`MODEL_TYPES`: Llama 2/3 (GQA, SwiGLU, tied or untied
embeddings), Mistral and Mixtral (MoE top-k), Qwen2/Qwen2.5 (bias on Q, K, V), Qwen2-MoE,
Qwen3 (Q/K norms; dense and MoE), DeepSeek-V2/V3 (MLA, first k dense layers, shared +
routed experts) and GPT-2 shapes (learned positions, LayerNorm, GeLU; linear biases unless
``"bias": false`` as nanoGPT writes it; dropout unless every ``*_pdrop`` is 0; the GPT-3
paper's shapes are written this way too). Extra fields are accepted (HF configs carry
many); a field the card needs and does not find is named in the error.

The parameter count (:meth:`ModelCard.parameters`) is exact for the modules the card
describes: it adds up every weight and bias tensor of the Hugging Face implementation
(DeepSeek's multi-token-prediction module, which its checkpoints ship beside the model,
is not part of the model and is not counted).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapptk import checks
from sapptk.errors import ProfileError
from sapptk.files import load_document

__all__ = ["MODEL_TYPES", "CardGroup", "Mla", "ModelCard", "Moe"]

MODEL_TYPES: tuple[str, ...] = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt2",
)
"""The Hugging Face ``model_type`` values :meth:`ModelCard.from_hf` reads."""

_MAX_SIZE = checks.MAX_DIMENSION  # the largest single dimension accepted (hidden size, vocabulary, ...)


@dataclass(frozen=True)
class Moe:
    """The mixture-of-experts part of a card: ``experts`` routed experts of width
    ``expert_size``, ``top_k`` of them per token, ``shared_size`` the total width of the
    shared experts (0 if none); ``shared_gate``: a sigmoid gate on the shared expert
    (Qwen2-MoE); ``router_bias``: a per-expert bias on the router (DeepSeek-V3's
    ``e_score_correction_bias``)."""

    experts: int
    top_k: int
    expert_size: int
    shared_size: int = 0
    shared_gate: bool = False
    router_bias: bool = False


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3): query low-rank ``q_lora_rank`` (0 = a
    full query projection), key/value low-rank ``kv_lora_rank``, per-head query/key widths
    ``qk_nope_dim`` + ``qk_rope_dim`` and value width ``v_dim``."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_dim: int


@dataclass(frozen=True)
class CardGroup:
    """``count`` consecutive identical layers of a card, in model order: ``kind`` is
    ``head`` (embedding), ``body`` (transformer layers; ``moe`` says whether their FFN is a
    mixture of experts) or ``tail`` (final norm, LM head, loss); ``parameters`` per layer."""

    name: str
    kind: str
    count: int
    parameters: int
    moe: bool = False


@dataclass(frozen=True)
class ModelCard:
    """A decoder-only transformer's shapes. Build one with :meth:`from_hf` or
    :func:`sapptk.models.card`; sizes are validated (integers >= 1, heads divisible by KV
    heads) when the card is made."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False
    norm: str = "rmsnorm"
    gated_mlp: bool = True
    qkv_bias: bool = False
    linear_bias: bool = False
    qk_norm: bool = False
    positions: int = 0
    dropout: bool = False
    moe: Moe | None = None
    moe_layers: tuple[bool, ...] = ()
    mla: Mla | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        where = f"model card {self.name!r}"
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size"):
            _size(getattr(self, name), where, name)
        if self.positions:
            _size(self.positions, where, "positions")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ProfileError(f"{where}: field 'norm' = {self.norm!r}: expected 'rmsnorm' or 'layernorm'")
        if self.num_heads % self.num_kv_heads:
            raise ProfileError(
                f"{where}: field 'num_key_value_heads' = {self.num_kv_heads}: expected a divisor of "
                f"num_attention_heads = {self.num_heads}"
            )
        if self.moe is not None:
            for name in ("experts", "top_k", "expert_size"):
                _size(getattr(self.moe, name), where, name)
            if self.moe.top_k > self.moe.experts:
                raise ProfileError(
                    f"{where}: field 'num_experts_per_tok' = {self.moe.top_k}: expected at most the "
                    f"{self.moe.experts} experts"
                )
        layers = self.moe_layers or (False,) * self.num_layers
        if len(layers) != self.num_layers:
            raise ProfileError(f"{where}: {len(layers)} MoE flags for {self.num_layers} layers")
        if any(layers) and self.moe is None:
            raise ProfileError(f"{where}: MoE layers without MoE shapes")
        object.__setattr__(self, "moe_layers", tuple(bool(x) for x in layers))
        if self.mla is not None:
            for name in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_dim"):
                _size(getattr(self.mla, name), where, name)

    # --- reading -------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, path_or_dict: str | os.PathLike[str] | Mapping[str, Any], *, name: str | None = None) -> ModelCard:
        """A card from a Hugging Face ``config.json`` (a path, a folder holding one, or the
        parsed mapping, which is not modified). Raises :class:`~sapptk.errors.ProfileError`
        naming the file and field for an unknown ``model_type`` (listing the supported
        ones), a missing field the card needs, or a size that is not an integer >= 1."""
        if isinstance(path_or_dict, Mapping):
            data, source = path_or_dict, "<config>"
        elif isinstance(path_or_dict, (str, os.PathLike)):
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            data = load_document(path, what="model config", error=ProfileError)
            source = str(path)
        else:
            raise ProfileError(
                f"model config: expected a config.json path or a mapping, got {type(path_or_dict).__name__}"
            )
        if not isinstance(data, Mapping):
            raise ProfileError(f"{source}: top level: expected a mapping of config fields")
        default = name or (Path(source).parent.name if source != "<config>" else None)
        return _parse(data, source, name=name or default or str(data.get("model_type", "model")))

    # --- derived shapes ------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the attention's query (and output-projection input): heads × head width
        (MLA: heads × value width for the output)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): KV heads × head width."""
        return self.num_kv_heads * self.head_dim

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def attention_parameters(self) -> dict[str, int]:
        """Attention parameters of one layer, split into ``sharded`` (split by tensor
        parallelism) and ``replicated`` (every TP rank holds them)."""
        h = self.hidden_size
        if self.mla is not None:
            m, a = self.mla, self.num_heads
            qk = m.qk_nope_dim + m.qk_rope_dim
            if m.q_lora_rank:
                q_down = h * m.q_lora_rank + m.q_lora_rank  # q_a_proj + q_a_layernorm
                q_up = m.q_lora_rank * a * qk
            else:
                q_down, q_up = 0, h * a * qk
            kv_down = h * (m.kv_lora_rank + m.qk_rope_dim) + m.kv_lora_rank  # kv_a_proj_with_mqa + kv_a_layernorm
            kv_up = m.kv_lora_rank * a * (m.qk_nope_dim + m.v_dim)
            out = a * m.v_dim * h
            return {"sharded": q_up + kv_up + out, "replicated": q_down + kv_down}
        sharded = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias or self.linear_bias:
            sharded += self.q_dim + 2 * self.kv_dim
        replicated = h if self.linear_bias else 0  # the output projection's bias
        if self.qk_norm:
            replicated += 2 * self.head_dim
        return {"sharded": sharded, "replicated": replicated}

    def ffn_parameters(self, moe: bool) -> dict[str, int]:
        """FFN parameters of one dense or MoE layer: ``sharded`` (by TP: the dense MLP or
        the shared experts), ``experts`` (routed experts, split by expert parallelism) and
        ``replicated`` (router, shared-expert gate, a row-parallel bias)."""
        h = self.hidden_size
        if not moe:
            width = self.intermediate_size
            sharded = (3 if self.gated_mlp else 2) * h * width + (width if self.linear_bias else 0)
            return {"sharded": sharded, "experts": 0, "replicated": h if self.linear_bias else 0}
        assert self.moe is not None
        per_expert = 3 * h * self.moe.expert_size
        shared = 3 * h * self.moe.shared_size
        replicated = h * self.moe.experts + (self.moe.experts if self.moe.router_bias else 0)
        replicated += h if (self.moe.shared_gate and self.moe.shared_size) else 0
        return {"sharded": shared, "experts": self.moe.experts * per_expert, "replicated": replicated}

    def layer_parameters(self, moe: bool) -> int:
        """Parameters of one transformer layer (attention, FFN, its two norms)."""
        attention = self.attention_parameters()
        ffn = self.ffn_parameters(moe)
        return sum(attention.values()) + sum(ffn.values()) + 2 * self._norm_params()

    def embedding_parameters(self) -> int:
        """The head: token embedding (and learned positions)."""
        return (self.vocab_size + self.positions) * self.hidden_size

    def output_parameters(self, *, count_tied: bool = False) -> int:
        """The tail: final norm and LM head (the LM head counts only when untied, or when
        ``count_tied``: a pipeline's last stage holds its own copy of a tied matrix)."""
        head = self.vocab_size * self.hidden_size if (not self.tied_embeddings or count_tied) else 0
        return self._norm_params() + head

    @property
    def groups(self) -> tuple[CardGroup, ...]:
        """Layer groups in model order: ``embedding`` (head), runs of identical transformer
        layers (``layers`` for a dense model; ``dense`` then ``moe`` for DeepSeek-style
        models; numbered runs when dense and MoE layers alternate), ``output`` (tail)."""
        runs: list[tuple[bool, int]] = []
        for flag in self.moe_layers:
            if runs and runs[-1][0] == flag:
                runs[-1] = (flag, runs[-1][1] + 1)
            else:
                runs.append((flag, 1))
        kinds = {flag for flag, _ in runs}
        groups = [CardGroup("embedding", "head", 1, self.embedding_parameters())]
        for i, (flag, count) in enumerate(runs):
            if len(runs) == 1:
                label = "moe" if flag else "layers"
            elif len(runs) == 2 and len(kinds) == 2:
                label = "moe" if flag else "dense"
            else:
                label = f"{'moe' if flag else 'dense'}_{i + 1}"
            groups.append(CardGroup(label, "body", count, self.layer_parameters(flag), moe=flag))
        groups.append(CardGroup("output", "tail", 1, self.output_parameters()))
        return tuple(groups)

    def parameters(self) -> int:
        """The exact parameter count (tied embeddings counted once)."""
        return sum(g.count * g.parameters for g in self.groups)

    def active_parameters(self) -> int:
        """Parameters one token uses: the routed experts count ``top_k`` of ``experts``."""
        total = self.parameters()
        if self.moe is None:
            return total
        per_expert = 3 * self.hidden_size * self.moe.expert_size
        idle = (self.moe.experts - self.moe.top_k) * per_expert
        return total - idle * sum(self.moe_layers)

    def describe(self) -> dict[str, Any]:
        """The card's main shapes as plain data (for provenance and tables)."""
        out: dict[str, Any] = {
            "name": self.name,
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "parameters": self.parameters(),
        }
        if self.moe is not None:
            out.update(experts=self.moe.experts, top_k=self.moe.top_k, expert_size=self.moe.expert_size,
                       shared_size=self.moe.shared_size, moe_layers=sum(self.moe_layers))
        if self.mla is not None:
            out["mla"] = True
        if self.source:
            out["source"] = self.source
        return out


# --- parsing ------------------------------------------------------------------------------
_MISSING: Any = object()


def _size(value: Any, where: str, field_name: str) -> int:
    """An integer >= 1 (integral floats accepted), at most :data:`_MAX_SIZE`."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and not isinstance(value, numbers.Integral):
        ok = math.isfinite(float(value)) and float(value).is_integer()
    if not ok or not 1 <= int(value) <= _MAX_SIZE:
        shown = "missing" if value is _MISSING else f"= {value!r}"
        raise ProfileError(f"{where}: field {field_name!r} {shown}: expected an integer >= 1 and at most {_MAX_SIZE}")
    return int(value)


class _Fields:
    """Typed access to a config mapping with errors naming the source and field."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def size(self, *names: str, default: Any = _MISSING) -> int:
        for name in names:
            value = self.data.get(name)
            if value is not None:
                return _size(value, self.source, name)
        if default is not _MISSING:
            return default
        return _size(_MISSING, self.source, names[0])

    def count(self, name: str, default: int = 0) -> int:
        """An integer >= 0 (0 allowed: no shared experts, no dense layers)."""
        value = self.data.get(name)
        if value is None:
            return default
        if value == 0 and not isinstance(value, bool):
            return 0
        return _size(value, self.source, name)

    def flag(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ProfileError(f"{self.source}: field {name!r} = {value!r}: expected true or false")
        return value


def _dropout(data: Mapping[str, Any], source: str) -> bool:
    """GPT-2 configs: dropout is on when any of ``attn_pdrop``, ``resid_pdrop``,
    ``embd_pdrop`` (Hugging Face defaults 0.1) is above 0."""
    rates = []
    for name in ("attn_pdrop", "resid_pdrop", "embd_pdrop"):
        value = data.get(name, 0.1)
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
        if not ok or not 0 <= float(value) < 1:
            raise ProfileError(f"{source}: field {name!r} = {value!r}: expected a probability in [0, 1)")
        rates.append(float(value))
    return any(r > 0 for r in rates)


def _parse(data: Mapping[str, Any], source: str, *, name: str) -> ModelCard:
    model_type = data.get("model_type", _MISSING)
    if model_type is _MISSING or model_type not in MODEL_TYPES:
        shown = "is missing" if model_type is _MISSING else f"= {model_type!r}"
        raise ProfileError(
            f"{source}: field 'model_type' {shown}: expected one of {', '.join(MODEL_TYPES)}"
        )
    f = _Fields(data, source)
    if model_type == "gpt2":
        h = f.size("n_embd", "hidden_size")
        heads = f.size("n_head", "num_attention_heads")
        if h % heads:
            raise ProfileError(f"{source}: field 'n_embd' = {h}: expected a multiple of n_head = {heads}")
        return ModelCard(
            name=name, model_type=model_type, hidden_size=h, num_layers=f.size("n_layer", "num_hidden_layers"),
            num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
            intermediate_size=f.size("n_inner", default=4 * h), vocab_size=f.size("vocab_size"),
            tied_embeddings=f.flag("tie_word_embeddings", True), norm="layernorm", gated_mlp=False,
            linear_bias=f.flag("bias", True), positions=f.size("n_positions", "max_position_embeddings"),
            dropout=_dropout(data, source), source=source,
        )
    h = f.size("hidden_size")
    layers = f.size("num_hidden_layers")
    heads = f.size("num_attention_heads")
    kv_heads = f.size("num_key_value_heads", default=heads)
    head_dim = f.size("head_dim", default=0) or max(1, h // heads)
    mla_type = model_type.startswith("deepseek")
    if data.get("head_dim") is None and h % heads and not mla_type:
        raise ProfileError(
            f"{source}: field 'hidden_size' = {h}: expected a multiple of num_attention_heads = {heads} "
            "(or give head_dim)"
        )
    common: dict[str, Any] = dict(
        name=name, model_type=model_type, hidden_size=h, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=f.size("intermediate_size"),
        vocab_size=f.size("vocab_size"), tied_embeddings=f.flag("tie_word_embeddings", False), source=source,
    )
    bias = f.flag("attention_bias", False)
    if model_type in ("llama", "mistral"):
        return ModelCard(**common, qkv_bias=bias)
    if model_type == "mixtral":
        moe = Moe(experts=f.size("num_local_experts"), top_k=f.size("num_experts_per_tok"),
                  expert_size=common["intermediate_size"])
        return ModelCard(**common, qkv_bias=bias, moe=moe, moe_layers=(True,) * layers)
    if model_type in ("qwen2", "qwen2_moe"):
        common["qkv_bias"] = True  # Qwen2 always has biases on Q, K and V
    if model_type in ("qwen3", "qwen3_moe"):
        common["qkv_bias"] = bias
        common["qk_norm"] = True
    if model_type in ("qwen2", "qwen3"):
        return ModelCard(**common)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        shared = f.count("shared_expert_intermediate_size") if model_type == "qwen2_moe" else 0
        moe = Moe(experts=f.size("num_experts"), top_k=f.size("num_experts_per_tok"),
                  expert_size=f.size("moe_intermediate_size"), shared_size=shared,
                  shared_gate=model_type == "qwen2_moe" and shared > 0)
        step = f.size("decoder_sparse_step", default=1)
        dense_only = data.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense_only):
            raise ProfileError(
                f"{source}: field 'mlp_only_layers' = {dense_only!r}: expected a list of layer indices below {layers}"
            )
        flags = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
        return ModelCard(**common, moe=moe if any(flags) else None, moe_layers=flags)
    # deepseek_v2 / deepseek_v3
    q_lora = f.count("q_lora_rank")
    mla = Mla(q_lora_rank=q_lora, kv_lora_rank=f.size("kv_lora_rank"), qk_nope_dim=f.size("qk_nope_head_dim"),
              qk_rope_dim=f.size("qk_rope_head_dim"), v_dim=f.size("v_head_dim"))
    common["head_dim"] = mla.qk_nope_dim + mla.qk_rope_dim
    common["num_kv_heads"] = heads
    experts = f.count("n_routed_experts")
    first_dense = f.count("first_k_dense_replace")
    freq = f.size("moe_layer_freq", default=1)
    flags = tuple(bool(experts) and i >= first_dense and i % freq == 0 for i in range(layers))
    moe = None
    if experts:
        moe = Moe(experts=experts, top_k=f.size("num_experts_per_tok"), expert_size=f.size("moe_intermediate_size"),
                  shared_size=f.count("n_shared_experts") * f.size("moe_intermediate_size"),
                  router_bias=model_type == "deepseek_v3")
    return ModelCard(**common, mla=mla, moe=moe, moe_layers=flags)

"""The parallel layout being considered (:class:`Parallel`) and the accelerator it runs on
(:class:`Hardware`), validated when made; bundled hardware cards in :data:`HARDWARE`.

Both are frozen dataclasses: override any field with :func:`dataclasses.replace` (or
``hardware(name, field=value)``), which validates again. Bad values raise
:class:`~sapptk.errors.ConfigError` naming the field, the value and what was expected.
Checks that need the model (heads divisible by TP, experts by EP) are made by
:func:`sapptk.estimate_profile`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, replace
from types import MappingProxyType
from typing import Any

from sapptk import checks
from sapptk.errors import ConfigError

__all__ = ["DTYPE_BYTES", "HARDWARE", "SHARDINGS", "Hardware", "Parallel", "hardware_card"]

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bf16": 2, "fp16": 2, "fp32": 4})
"""Bytes per element of the dtypes a layout may name."""

SHARDINGS: tuple[str, ...] = ("none", "distributed", "zero2", "fsdp")
"""Optimizer sharding over data parallelism: ``none`` (every rank holds everything),
``distributed`` (Megatron's distributed optimizer, ZeRO-1: optimizer states split),
``zero2`` (gradients split too), ``fsdp`` (ZeRO-3: weights split too)."""

_MAX_PARALLEL = checks.MAX_PARALLEL


def _int(value: Any, where: str, name: str, *, low: int = 1, high: int = _MAX_PARALLEL) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or not low <= int(value) <= high:
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected an integer >= {low} and at most {high}")
    return int(value)


def _positive(value: Any, where: str, name: str, *, high: float = 1e12) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and isinstance(value, numbers.Integral):  # bounded before float(): 10**400 is refused, not an OverflowError
        ok = 0 < value <= high
    if not ok or not math.isfinite(float(value)) or not 0 < float(value) <= high:
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected a number > 0 and at most {high:g}")
    return float(value)


def _choice(value: Any, where: str, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected one of {', '.join(choices)}")
    return value


def _flag(value: Any, where: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected True or False")
    return value


@dataclass(frozen=True)
class Parallel:
    """A parallel layout for one pipeline stage's devices (the pipeline itself is the
    balancer's business: ``pp`` is not here).

    ``tp`` tensor parallel size (``sequence_parallel`` splits the norm/dropout regions
    too; ignored when ``tp`` is 1); ``cp`` context parallel (the sequence split across
    devices); ``ep`` expert parallel (routed experts split across ``ep`` devices, taken
    from the data-, context- and tensor-parallel ranks as Megatron does with expert-TP 1);
    ``dp`` data parallel; ``sharding`` of the optimizer over data parallelism
    (:data:`SHARDINGS`); ``micro_batch_size`` and ``seq_length`` (tokens per sample);
    ``compute_dtype`` of weights and activations,
    ``grad_dtype`` of the gradients kept for the optimizer; ``adam`` (fp32 master weights
    when computing in 16 bits, and two fp32 moments; otherwise no optimizer state);
    ``flash_attention`` (no score matrix kept); ``capacity_factor`` of MoE experts (None:
    dropless, each token processed by exactly ``top_k`` experts).
    """

    tp: int = 1
    sequence_parallel: bool = True
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sharding: str = "distributed"
    micro_batch_size: int = 1
    seq_length: int = 4096
    compute_dtype: str = "bf16"
    grad_dtype: str = "fp32"
    adam: bool = True
    flash_attention: bool = True
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        where = "parallel layout"
        for name in ("tp", "cp", "ep", "dp", "micro_batch_size"):
            _int(getattr(self, name), where, name)
        _int(self.seq_length, where, "seq_length", high=1 << 24)  # a profile's longest sequence (16 M tokens)
        for name in ("sequence_parallel", "adam", "flash_attention"):
            _flag(getattr(self, name), where, name)
        _choice(self.sharding, where, "sharding", SHARDINGS)
        _choice(self.compute_dtype, where, "compute_dtype", tuple(DTYPE_BYTES))
        _choice(self.grad_dtype, where, "grad_dtype", tuple(DTYPE_BYTES))
        if self.capacity_factor is not None:
            _positive(self.capacity_factor, where, "capacity_factor", high=1e3)
        if self.seq_length % self.cp:
            raise ConfigError(
                f"{where}: field 'seq_length' = {self.seq_length}: expected a multiple of cp = {self.cp}"
            )
        if self.sp and (self.seq_length // self.cp) % self.tp:
            raise ConfigError(
                f"{where}: field 'seq_length' = {self.seq_length}: expected a multiple of cp × tp = "
                f"{self.cp * self.tp} with sequence parallelism (or sequence_parallel=False)"
            )
        if (self.dp * self.cp * self.tp) % self.ep:
            raise ConfigError(
                f"{where}: field 'ep' = {self.ep}: expected a divisor of dp × cp × tp = {self.dp * self.cp * self.tp} "
                "(expert-parallel ranks are taken from the data-, context- and tensor-parallel ranks, as in Megatron)"
            )
        if self.cp > 1 and not self.flash_attention:
            raise ConfigError(f"{where}: field 'flash_attention' = False: context parallelism (cp = {self.cp}) "
                              "expected flash attention (ring attention keeps no score matrix)")

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (asked for, and ``tp`` > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the routed experts' optimizer: ``dp × cp × tp / ep``
        (Megatron's expert data parallelism with expert-TP 1)."""
        return self.dp * self.cp * self.tp // self.ep

    def describe(self) -> dict[str, Any]:
        """The layout as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Hardware:
    """One accelerator: ``peak_tflops`` dense 16-bit (no sparsity), ``hbm_gb`` memory (GB,
    10⁹ bytes), ``hbm_tbps`` memory bandwidth (TB/s), ``intra_node_gbps`` and
    ``inter_node_gbps`` bandwidth per device per direction (GB/s) inside a node and
    between nodes, ``gpus_per_node``, ``matmul_efficiency`` (the share of the peak a large
    matmul reaches: every FLOP-derived time is divided by ``peak × efficiency``) and
    ``constant_mb``, memory every device holds besides the model (CUDA context, collective
    buffers, allocator reserve): an assumption, stated on every estimate."""

    name: str
    peak_tflops: float
    hbm_gb: float
    hbm_tbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int = 8
    matmul_efficiency: float = 0.6
    constant_mb: float = 2000.0
    source: str = ""

    def __post_init__(self) -> None:
        where = f"hardware {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"hardware: field 'name' = {self.name!r}: expected a non-empty string")
        for name in ("peak_tflops", "hbm_gb", "hbm_tbps", "intra_node_gbps", "inter_node_gbps"):
            object.__setattr__(self, name, _positive(getattr(self, name), where, name))
        _int(self.gpus_per_node, where, "gpus_per_node", high=100_000)
        eff = self.matmul_efficiency
        if isinstance(eff, bool) or not isinstance(eff, numbers.Real) or not 0 < float(eff) <= 1:
            raise ConfigError(f"{where}: field 'matmul_efficiency' = {eff!r}: expected a number in (0, 1]")
        c = self.constant_mb
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(float(c)) or c < 0:
            raise ConfigError(f"{where}: field 'constant_mb' = {c!r}: expected a number >= 0")

    @property
    def memory_mb(self) -> float:
        """The device's memory in MB (10⁶ bytes): a memory budget before any reserve."""
        return self.hbm_gb * 1000.0

    def flops_per_ms(self) -> float:
        """FLOPs one device does per ms at ``matmul_efficiency`` of the peak."""
        return self.peak_tflops * 1e12 * self.matmul_efficiency / 1e3

    def bandwidth(self, span: int) -> float:
        """Bytes per ms per device for a collective over ``span`` consecutive devices: the
        intra-node link when they fit in a node, else the inter-node one."""
        gbps = self.intra_node_gbps if span <= self.gpus_per_node else self.inter_node_gbps
        return gbps * 1e9 / 1e3

    def describe(self) -> dict[str, Any]:
        """The card as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_H100_NOTE = "NVIDIA H100 datasheet (SXM5): 989 TFLOPS dense BF16, 80 GB HBM3 3.35 TB/s, NVLink 900 GB/s"
HARDWARE: Mapping[str, Hardware] = MappingProxyType({
    "h100": Hardware("h100", 989.0, 80.0, 3.35, 450.0, 50.0, source=_H100_NOTE + "; 400 Gb/s NIC per GPU"),
    "h800": Hardware("h800", 989.0, 80.0, 3.35, 200.0, 50.0,
                     source="NVIDIA H800 SXM: H100 compute, NVLink 400 GB/s; 400 Gb/s NIC per GPU"),
    "h200": Hardware("h200", 989.0, 141.0, 4.8, 450.0, 50.0,
                     source="NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16, 141 GB HBM3e 4.8 TB/s"),
    "a100": Hardware("a100", 312.0, 80.0, 2.039, 300.0, 25.0,
                     source="NVIDIA A100 80GB SXM datasheet: 312 TFLOPS BF16, 2.039 TB/s, NVLink 600 GB/s; "
                            "200 Gb/s NIC per GPU"),
    "b200": Hardware("b200", 2250.0, 180.0, 8.0, 900.0, 50.0,
                     source="NVIDIA HGX B200: 2.25 PFLOPS dense BF16 per GPU, 180 GB HBM3e 8 TB/s, "
                            "NVLink 1.8 TB/s; 400 Gb/s NIC per GPU"),
    "mi300x": Hardware("mi300x", 1307.4, 192.0, 5.3, 448.0, 50.0,
                       source="AMD Instinct MI300X datasheet: 1307.4 TFLOPS dense BF16, 192 GB HBM3 5.3 TB/s, "
                              "Infinity Fabric 896 GB/s aggregate"),
    "ascend910b": Hardware("ascend910b", 313.0, 64.0, 1.6, 196.0, 25.0,
                           source="Huawei Ascend 910B (public figures vary by SKU): ~313 TFLOPS FP16, 64 GB HBM2e "
                                  "1.6 TB/s, HCCS 392 GB/s; 200 Gb/s RoCE per NPU"),
})
"""Bundled hardware cards by name (each field can be overridden, see :func:`hardware_card`)."""

_ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "a100-80gb": "a100", "mi300": "mi300x", "910b": "ascend910b",
            "ascend-910b": "ascend910b"}


def hardware_card(name: str | Hardware | Mapping[str, Any], **overrides: Any) -> Hardware:
    """A bundled hardware card by name (case-insensitive; e.g. ``"h100"``), a given
    :class:`Hardware`, or a mapping of its fields (a card of your own: a missing or unknown
    field is named), with any fields overridden (validated again)."""
    if isinstance(name, Mapping):
        known = [f.name for f in fields(Hardware)]
        required = [f.name for f in fields(Hardware) if f.default is MISSING]
        where = f"hardware {name.get('name', '(unnamed)')!r}"
        for key in name:
            if key not in known:
                raise ConfigError(f"{where}: unknown field {key!r}: expected one of {', '.join(known)}")
        for key in required:
            if key not in name and key not in overrides:
                raise ConfigError(f"{where}: field {key!r} is missing: expected one of the required fields "
                                  f"{', '.join(required)}")
        return Hardware(**{**name, **overrides})
    if isinstance(name, Hardware):
        base = name
    else:
        key = str(name).strip().lower()
        key = _ALIASES.get(key, key)
        if key not in HARDWARE:
            raise ConfigError(f"hardware {name!r} is not a bundled card: expected one of {', '.join(HARDWARE)}")
        base = HARDWARE[key]
    known = {f.name for f in fields(Hardware)}
    for key in overrides:
        if key not in known:
            raise ConfigError(
                f"hardware {base.name!r}: unknown field {key!r}: expected one of {', '.join(sorted(known))}"
            )
    return replace(base, **overrides) if overrides else base

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
    from the data-, context- and tensor-parallel ranks as Megatron does: ``ep × etp`` of them);
    ``dp`` data parallel; ``sharding`` of the optimizer over data parallelism
    (:data:`SHARDINGS`); ``micro_batch_size`` and ``seq_length`` (tokens per sample);
    ``compute_dtype`` of weights and activations,
    ``grad_dtype`` of the gradients kept for the optimizer; ``adam`` (fp32 master weights
    when computing in 16 bits, and two fp32 moments; otherwise no optimizer state);
    ``flash_attention`` (no score matrix kept); ``capacity_factor`` of MoE experts (None:
    dropless, each token processed by exactly ``top_k`` experts); ``fp8``: the linear layers'
    GEMMs run in FP8 (Transformer Engine style: inputs cast per GEMM, weights, activations and
    master copies as without it); ``moment_dtype`` of Adam's two moments (``fp32`` or
    ``bf16``); ``etp`` expert tensor parallel size: each routed expert's weights split
    over ``etp`` ranks, the tokens an EP rank receives all-gathered over them (None: the
    framework preset's convention, :attr:`Framework.expert_tp_follows_tp`: Megatron's
    ``--expert-tensor-parallel-size`` defaults to ``tp``, torchtitan and DeepSpeed to 1).
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
    fp8: bool = False
    moment_dtype: str = "fp32"
    etp: int | None = None

    def __post_init__(self) -> None:
        where = "parallel layout"
        if self.etp is not None:
            _int(self.etp, where, "etp")
        for name in ("tp", "cp", "ep", "dp", "micro_batch_size"):
            _int(getattr(self, name), where, name)
        _int(self.seq_length, where, "seq_length", high=1 << 24)  # a profile's longest sequence (16 M tokens)
        for name in ("sequence_parallel", "adam", "flash_attention", "fp8"):
            _flag(getattr(self, name), where, name)
        _choice(self.sharding, where, "sharding", SHARDINGS)
        _choice(self.compute_dtype, where, "compute_dtype", tuple(DTYPE_BYTES))
        _choice(self.grad_dtype, where, "grad_dtype", tuple(DTYPE_BYTES))
        _choice(self.moment_dtype, where, "moment_dtype", ("fp32", "bf16"))
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
        if (self.dp * self.cp * self.tp) % (self.ep * self.expert_tp):
            raise ConfigError(
                f"{where}: field 'ep' = {self.ep} (× etp = {self.expert_tp}): expected ep × etp dividing dp × cp × tp "
                f"= {self.dp * self.cp * self.tp} (expert-parallel ranks are taken from the data-, context- and "
                "tensor-parallel ranks, as in Megatron)"
            )
        if self.cp > 1 and not self.flash_attention:
            raise ConfigError(f"{where}: field 'flash_attention' = False: context parallelism (cp = {self.cp}) "
                              "expected flash attention (ring attention keeps no score matrix)")

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (asked for, and ``tp`` > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel size in effect: ``etp``, 1 while it is unresolved (None);
        :func:`sapptk.estimate_profile` resolves None by the framework preset."""
        return 1 if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Data-parallel size of the routed experts' optimizer: ``dp × cp × tp / (ep × etp)``
        (Megatron-Core's expert grid: expert TP fastest, then EP, then expert DP)."""
        return self.dp * self.cp * self.tp // (self.ep * self.expert_tp)

    def describe(self) -> dict[str, Any]:
        """The layout as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_FITTABLE: Mapping[str, tuple[float, float]] = MappingProxyType({
    "matmul_efficiency": (0.2, 1.0),
    "fp8_matmul_efficiency": (0.1, 1.0),
    "attention_efficiency": (0.1, 1.0),
    "attention_bwd_efficiency": (0.05, 1.0),
    "hbm_efficiency": (0.2, 1.0),
    "launch_us": (0.0, 50.0),
    "comm_latency_us": (0.0, 500.0),
    "intra_bus_efficiency": (0.1, 1.0),
    "inter_bus_efficiency": (0.1, 1.0),
    "allocator_reserve": (0.0, 0.6),
    "constant_mb": (0.0, 20000.0),
})
"""The achieved-efficiency parameters a fit may move, with their bounds (:meth:`Hardware.fittable`)."""

_SHARES = ("matmul_efficiency", "fp8_matmul_efficiency", "attention_efficiency", "attention_bwd_efficiency",
           "hbm_efficiency", "intra_bus_efficiency", "inter_bus_efficiency")
_NONNEGATIVE = ("constant_mb", "peak_fp8_tflops", "launch_us", "comm_latency_us", "allocator_reserve",
                "attention_fa2_efficiency")


@dataclass(frozen=True)
class Hardware:
    """One accelerator and its achieved efficiencies (``docs/estimation.md``, "Hardware card").

    Datasheet figures: ``peak_tflops`` dense 16-bit (no sparsity), ``peak_fp8_tflops`` dense
    FP8 (0: no FP8 units), ``hbm_gb`` memory (GB, 10⁹ bytes), ``hbm_tbps`` memory bandwidth
    (TB/s), ``intra_node_gbps`` and ``inter_node_gbps`` bandwidth per device per direction
    (GB/s) inside a node and between nodes, ``gpus_per_node``, ``sms`` (streaming
    multiprocessors / compute units: the GEMM wave size).

    Achieved efficiencies (the few parameters :meth:`fittable` lists): ``matmul_efficiency``
    the share of the 16-bit peak a large, well-shaped GEMM reaches (smaller shapes lose
    more to tile and wave quantization and the roofline); ``fp8_matmul_efficiency`` the
    same for FP8 GEMMs against ``peak_fp8_tflops``; ``attention_efficiency`` and
    ``attention_bwd_efficiency`` the flash-attention forward and backward against the
    16-bit peak at long sequences; ``hbm_efficiency`` the share of ``hbm_tbps`` an
    elementwise kernel moves; ``launch_us`` per kernel; ``comm_latency_us`` a collective's
    latency (alpha); ``intra_bus_efficiency`` and ``inter_bus_efficiency`` the bus bandwidth
    NCCL reaches as a share of the link; ``allocator_reserve`` the caching allocator's
    reserve over allocated dynamic memory (reserved = allocated × (1 + reserve));
    ``attention_fa2_efficiency`` the forward efficiency of the FlashAttention-2 kernel where
    it is below the card's best fused kernel (0: the same; a framework preset whose
    attention is FlashAttention-2 scales both attention efficiencies by it);
    ``constant_mb`` memory every device holds besides the model (CUDA context, NCCL
    buffers, workspaces). ``source`` names the public source of each figure."""

    name: str
    peak_tflops: float
    hbm_gb: float
    hbm_tbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int = 8
    matmul_efficiency: float = 0.75
    constant_mb: float = 2000.0
    source: str = ""
    peak_fp8_tflops: float = 0.0
    sms: int = 132
    fp8_matmul_efficiency: float = 0.6
    attention_efficiency: float = 0.55
    attention_bwd_efficiency: float = 0.4
    hbm_efficiency: float = 0.8
    launch_us: float = 4.0
    comm_latency_us: float = 15.0
    intra_bus_efficiency: float = 0.8
    inter_bus_efficiency: float = 0.8
    allocator_reserve: float = 0.1
    attention_fa2_efficiency: float = 0.0

    def __post_init__(self) -> None:
        where = f"hardware {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"hardware: field 'name' = {self.name!r}: expected a non-empty string")
        for name in ("peak_tflops", "hbm_gb", "hbm_tbps", "intra_node_gbps", "inter_node_gbps"):
            object.__setattr__(self, name, _positive(getattr(self, name), where, name))
        _int(self.gpus_per_node, where, "gpus_per_node", high=100_000)
        _int(self.sms, where, "sms", high=100_000)
        for name in _SHARES:
            eff = getattr(self, name)
            if isinstance(eff, bool) or not isinstance(eff, numbers.Real) or not 0 < float(eff) <= 1:
                raise ConfigError(f"{where}: field {name!r} = {eff!r}: expected a number in (0, 1]")
        for name in _NONNEGATIVE:
            c = getattr(self, name)
            if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(float(c)) or c < 0:
                raise ConfigError(f"{where}: field {name!r} = {c!r}: expected a number >= 0")
        if self.attention_fa2_efficiency > 1:
            raise ConfigError(f"{where}: field 'attention_fa2_efficiency' = {self.attention_fa2_efficiency!r}: "
                              "expected a number in [0, 1] (0: the same as attention_efficiency)")
        if not isinstance(self.source, str):
            raise ConfigError(f"{where}: field 'source' = {self.source!r}: expected a string")

    @staticmethod
    def fittable() -> dict[str, tuple[float, float]]:
        """The parameters a fit may move: ``{field name: (low, high)}``. Each name is a
        field of this class, so ``dataclasses.replace(card, **{name: value})`` is a new card
        (validated again). A stable contract (``sapptk.models.fit_hardware`` uses it)."""
        return dict(_FITTABLE)

    @property
    def memory_mb(self) -> float:
        """The device's memory in MB (10⁶ bytes): a memory budget before any reserve."""
        return self.hbm_gb * 1000.0

    def flops_per_ms(self) -> float:
        """FLOPs one device does per ms at ``matmul_efficiency`` of the 16-bit peak (a large
        GEMM's rate; :mod:`sapptk.models.timing` times each shape)."""
        return self.peak_tflops * 1e12 * self.matmul_efficiency / 1e3

    def bandwidth(self, span: int) -> float:
        """Link bytes per ms per device for a group over ``span`` consecutive devices: the
        intra-node link when they fit in a node, else the inter-node one (datasheet, no bus
        efficiency)."""
        gbps = self.intra_node_gbps if span <= self.gpus_per_node else self.inter_node_gbps
        return gbps * 1e9 / 1e3

    def describe(self) -> dict[str, Any]:
        """The card as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_EFFICIENCY_NOTE = (
    "efficiencies (starting values, to be fitted): matmul_efficiency from public cuBLAS GEMM "
    "microbenchmarks (large BF16 GEMMs reach 70-80 % of peak; domain notes); attention from the "
    "FlashAttention-2 paper (Dao 2023: forward up to 73 % of A100 peak, backward lower) and "
    "FlashAttention-3 paper (Shah et al. 2024: up to 75 % of H100 BF16 peak forward, FlashAttention-2 "
    "only 35 % on H100: attention_fa2_efficiency); bus "
    "efficiencies from nccl-tests' busbw convention (busbw = algbw x 2(n-1)/n for all-reduce, "
    "(n-1)/n for all-gather/reduce-scatter), published busbw 75-85 % of the link; launch_us and "
    "comm_latency_us the order of a CUDA kernel launch and a small-message NCCL latency; "
    "allocator_reserve: PyTorch caching allocator, reserved above allocated by 5-30 % (torch.cuda "
    "memory_reserved vs memory_allocated)"
)
_H100_NOTE = ("NVIDIA H100 datasheet (SXM5): 989 TFLOPS dense BF16, 1979 dense FP8, 80 GB HBM3 3.35 TB/s, "
              "NVLink 900 GB/s, 132 SMs")
HARDWARE: Mapping[str, Hardware] = MappingProxyType({
    "h100": Hardware("h100", 989.0, 80.0, 3.35, 450.0, 50.0, peak_fp8_tflops=1979.0, sms=132,
                     attention_efficiency=0.6, attention_bwd_efficiency=0.45, attention_fa2_efficiency=0.35,
                     source=f"{_H100_NOTE}; 400 Gb/s NIC per GPU; {_EFFICIENCY_NOTE}"),
    "h800": Hardware("h800", 989.0, 80.0, 3.35, 200.0, 50.0, peak_fp8_tflops=1979.0, sms=132,
                     attention_efficiency=0.6, attention_bwd_efficiency=0.45, attention_fa2_efficiency=0.35,
                     source="NVIDIA H800 SXM: H100 compute (989 BF16 / 1979 FP8 TFLOPS, 132 SMs), NVLink 400 GB/s; "
                            f"400 Gb/s NIC per GPU; {_EFFICIENCY_NOTE}"),
    "h200": Hardware("h200", 989.0, 141.0, 4.8, 450.0, 50.0, peak_fp8_tflops=1979.0, sms=132,
                     attention_efficiency=0.6, attention_bwd_efficiency=0.45, attention_fa2_efficiency=0.35,
                     source="NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16, 1979 dense FP8, 141 GB HBM3e 4.8 TB/s, "
                            f"NVLink 900 GB/s; {_EFFICIENCY_NOTE}"),
    "a100": Hardware("a100", 312.0, 80.0, 2.039, 300.0, 25.0, sms=108, attention_efficiency=0.65,
                     attention_bwd_efficiency=0.5,
                     source="NVIDIA A100 80GB SXM datasheet: 312 TFLOPS BF16 (no FP8), 2.039 TB/s, NVLink 600 GB/s, "
                            f"108 SMs; 200 Gb/s NIC per GPU; {_EFFICIENCY_NOTE}"),
    "b200": Hardware("b200", 2250.0, 180.0, 8.0, 900.0, 50.0, peak_fp8_tflops=4500.0, sms=148,
                     source="NVIDIA HGX B200: 2.25 PFLOPS dense BF16 and 4.5 dense FP8 per GPU, 180 GB HBM3e 8 TB/s, "
                            f"NVLink 1.8 TB/s, 148 SMs; 400 Gb/s NIC per GPU; {_EFFICIENCY_NOTE}"),
    "mi300x": Hardware("mi300x", 1307.4, 192.0, 5.3, 448.0, 50.0, peak_fp8_tflops=2614.9, sms=304,
                       attention_efficiency=0.4, attention_bwd_efficiency=0.3,
                       source="AMD Instinct MI300X datasheet: 1307.4 TFLOPS dense BF16, 2614.9 dense FP8, 192 GB "
                              f"HBM3 5.3 TB/s, Infinity Fabric 896 GB/s aggregate, 304 CUs; {_EFFICIENCY_NOTE}"),
    "ascend910b": Hardware("ascend910b", 313.0, 64.0, 1.6, 196.0, 25.0, sms=24,
                           attention_efficiency=0.45, attention_bwd_efficiency=0.35,
                           source="Huawei Ascend 910B (public figures vary by SKU): ~313 TFLOPS FP16 (no FP8), 64 GB "
                                  "HBM2e 1.6 TB/s, HCCS 392 GB/s, 20-25 AI cores; 200 Gb/s RoCE per NPU; "
                                  f"{_EFFICIENCY_NOTE}"),
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

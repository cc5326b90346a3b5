"""How long one operator takes on a :class:`~sapptk.models.layout.Hardware` card: the
achieved-efficiency model of ``docs/estimation.md`` ("Hardware card").

* :func:`gemm_ms` — a GEMM of M×K by K×N: the card's efficiency for large shapes, reduced
  by tile quantization (M and N padded to 128-wide tiles) and wave quantization (tiles
  spread over ``sms`` in whole waves), never faster than its bytes at HBM speed (the
  roofline), plus one launch; FP8 at ``peak_fp8_tflops`` × ``fp8_matmul_efficiency``.
* :func:`attention_ms` — flash attention's FLOPs at ``attention_efficiency`` (forward) or
  ``attention_bwd_efficiency`` (backward) of the 16-bit peak, lower for short key ranges.
* :func:`elementwise_ms` — bytes moved at ``hbm_tbps`` × ``hbm_efficiency``, plus a launch.
* :func:`collective_ms` — alpha–beta: ``comm_latency_us`` plus bytes × the bus factor
  (all-reduce 2(n−1)/n, all-gather and reduce-scatter (n−1)/n, all-to-all (n−1)/n) ÷ the
  bus bandwidth of the links the group uses (:func:`placement`).
* :func:`remote_node_share` — a node-deduplicating expert dispatch (DeepEP's internode
  kernels) sends a token once to each remote node holding one of its experts, not once per
  expert: the share of a token's copies that still cross the NIC.

Every function takes plain numbers (no tables), so a profile's few hundred operators time
in well under a millisecond.
"""

from __future__ import annotations

import math

from sapptk.models.layout import Hardware

__all__ = ["ATTENTION_HALF_KEYS", "COLLECTIVES", "TILE", "attention_ms", "collective_ms", "elementwise_ms",
           "gemm_ms", "group_span", "placement",
           "remote_node_share"]

TILE = 128
"""Output tile edge of the GEMM model (CUTLASS/cuBLAS tiles are 128 or 256 wide)."""

ATTENTION_HALF_KEYS = 128.0
"""Keys per query at which flash attention runs at half its long-sequence rate: a 512-key
attention runs at 80 % of it, a 16 k one at 99 %, the shape of FlashAttention-2's published
throughput curves over sequence length."""

COLLECTIVES: dict[str, float] = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0,
                                 "send_recv": 0.0}
"""Bus factor numerators: the factor is ``k·(n−1)/n`` (nccl-tests' busbw convention);
``send_recv`` moves its bytes once (factor 1)."""


def gemm_ms(hw: Hardware, m: float, n: float, k: float, *, fp8: bool = False, elem_bytes: float = 2.0) -> float:
    """One GEMM (M×K)·(K×N): ``launch_us`` + max(compute, memory). Compute is ``2·M·N·K``
    FLOPs at the peak × efficiency × tile quantization × wave quantization; memory the
    inputs (``elem_bytes`` each; 1 in FP8) and a 16-bit output at HBM speed."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    tm, tn = math.ceil(m / TILE), math.ceil(n / TILE)
    tiles = tm * tn
    tile_q = (m * n) / (tiles * TILE * TILE)
    wave_q = tiles / (math.ceil(tiles / hw.sms) * hw.sms)
    if fp8:
        rate = hw.peak_fp8_tflops * hw.fp8_matmul_efficiency
        elem_bytes = 1.0
    else:
        rate = hw.peak_tflops * hw.matmul_efficiency
    compute = 2.0 * m * n * k / (rate * 1e9 * tile_q * wave_q)  # TFLOP/s × 1e9 = FLOPs per ms
    memory = (elem_bytes * (m * k + k * n) + 2.0 * m * n) / (hw.hbm_tbps * 1e9 * hw.hbm_efficiency)
    return hw.launch_us / 1e3 + max(compute, memory)


def attention_ms(hw: Hardware, flops: float, keys: float, *, backward: bool = False, kernel: str = "fused") -> float:
    """Flash attention core of ``flops`` FLOPs whose queries see ``keys`` keys on average:
    one launch plus the FLOPs at the forward (or backward) efficiency × ``keys / (keys +``
    :data:`ATTENTION_HALF_KEYS` ``)``. ``kernel="fa2"`` (FlashAttention-2) scales both
    efficiencies by ``attention_fa2_efficiency / attention_efficiency`` where the card
    gives it (Hopper: FlashAttention-2 reaches 35 % of the peak, FlashAttention-3 75 %)."""
    if flops <= 0:
        return 0.0
    eff = hw.attention_bwd_efficiency if backward else hw.attention_efficiency
    if kernel == "fa2" and hw.attention_fa2_efficiency > 0:
        eff *= hw.attention_fa2_efficiency / hw.attention_efficiency
    eff = min(1.0, eff) * keys / (keys + ATTENTION_HALF_KEYS)
    return hw.launch_us / 1e3 + flops / (hw.peak_tflops * 1e9 * eff)


def elementwise_ms(hw: Hardware, nbytes: float) -> float:
    """A memory-bound kernel moving ``nbytes`` (read + written): one launch plus the bytes
    at ``hbm_tbps`` × ``hbm_efficiency``."""
    if nbytes <= 0:
        return 0.0
    return hw.launch_us / 1e3 + nbytes / (hw.hbm_tbps * 1e9 * hw.hbm_efficiency)


def group_span(size: int, stride: int) -> int:
    """Consecutive ranks a group of ``size`` members ``stride`` apart covers."""
    return (size - 1) * stride + 1


def placement(hw: Hardware, size: int, stride: int) -> tuple[str, int]:
    """``("intra", n)`` when a group of ``size`` ranks ``stride`` apart fits in one node,
    else ``("inter", members per node)``: ranks are numbered node by node, ``gpus_per_node``
    a node, so a group's members in one node are ``ceil(gpus_per_node / stride)`` at most."""
    if size <= 1 or group_span(size, stride) <= hw.gpus_per_node:
        return "intra", size
    return "inter", max(1, min(size, math.ceil(hw.gpus_per_node / stride)))


def remote_node_share(experts: int, top_k: int, nodes: int) -> float:
    """Under a node-deduplicating dispatch, the NIC bytes of an all-to-all over ``nodes``
    nodes as a share of its buffer (``top_k`` copies per token): each token crosses once to
    every remote node holding at least one of its ``top_k`` experts (of ``experts``, spread
    evenly, routing uniform), ``(nodes − 1)·(1 − C(E − E/nodes, k) / C(E, k)) / k``. The
    plain all-to-all sends every copy: ``(nodes − 1)/nodes`` of them cross. DeepSeek-V3
    technical report §3.2.2: a token goes over InfiniBand once per target node and is
    forwarded over NVLink to its experts there (DeepEP's internode kernels)."""
    if nodes <= 1 or top_k <= 0:
        return 0.0
    per_node = experts / nodes
    miss = math.comb(experts - round(per_node), top_k) / math.comb(experts, top_k)
    return (nodes - 1) * (1.0 - miss) / top_k


def collective_ms(hw: Hardware, kind: str, nbytes: float, size: int, stride: int = 1, *,
                  far_share: float | None = None) -> float:
    """A collective over ``size`` ranks ``stride`` apart on ``nbytes`` (the full buffer: the
    gathered output of an all-gather, the input of a reduce-scatter or all-reduce, what one
    rank sends in an all-to-all or a send/recv). Alpha–beta: ``comm_latency_us`` plus bytes
    × bus factor ÷ bus bandwidth. Inside a node the bus bandwidth is ``intra_node_gbps`` ×
    ``intra_bus_efficiency``; a group across nodes runs at the NIC's ``inter_node_gbps`` ×
    ``inter_bus_efficiency``, except an all-to-all, whose in-node share rides NVLink while
    the rest crosses the NIC (the slower of the two); ``far_share`` (a node-deduplicating
    dispatch, :func:`remote_node_share`) replaces the share of the bytes that crosses it,
    the rest moving over NVLink to its GPU in the node."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    where, local = placement(hw, size, stride)
    intra = hw.intra_node_gbps * 1e6 * hw.intra_bus_efficiency  # bytes per ms
    inter = hw.inter_node_gbps * 1e6 * hw.inter_bus_efficiency
    alpha = hw.comm_latency_us / 1e3
    share = (size - 1) / size
    if kind == "send_recv":
        return alpha + nbytes / (intra if where == "intra" else inter)
    factor = COLLECTIVES[kind] * share
    if where == "intra":
        return alpha + nbytes * factor / intra
    if kind == "all_to_all":
        if far_share is None:
            near = (local - 1) / size * nbytes / intra
            far = (size - local) / size * nbytes / inter
        else:  # forwarded: every copy not for this GPU takes one NVLink hop in the node it lands in
            near = (local - 1) / local * nbytes / intra
            far = far_share * nbytes / inter
        return alpha + max(near, far)
    return alpha + nbytes * factor / inter

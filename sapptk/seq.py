"""Sequence slices for long context: slice lengths, causal slice costs, K/V of an assignment.

A sample of S tokens (``Profile.seq_length``) is cut into k slices of l_0, …, l_{k−1} tokens
(``PipelineConfig.slice_lengths``, or equal lengths). Slice j covers tokens o_j to e_j
(o_j = l_0 + … + l_{j−1}, e_j = o_j + l_j). What one layer costs for one micro-batch is
split over its slices:

* the linear part, (1 − a) of its forward and backward times (a = the group's
  ``attention_share``): slice j takes λ_j = l_j / S of it;
* the causal attention part, a of them: the queries of slice j attend to every key up to
  their own position, so slice j takes the rows o_j..e_j of the causal triangle,
  α_j = (e_j² − o_j²) / S² of it (equal slices: (2j + 1)/k², the last slice 2k − 1 times
  the first);
* its activation (flash attention keeps no S × S tensor): λ_j of it;
* K/V: ``kv_mb_per_token`` · l_j MB, kept from the slice's forward to the end of the
  backward of slice 0 of its micro-batch (:func:`sapptk.schedules.memory.kv_events`).

Σ_j λ_j = Σ_j α_j = 1: the slices of a micro-batch cost what the micro-batch costs. A setup
is *sliced* (:func:`is_sliced`) when it has k > 1 slices and its profile a ``seq_length``;
without ``seq_length`` slices stay equal shares of linear costs, with no K/V term, as before.
Everything here works on per-virtual-stage totals the caller (:mod:`sapptk.costs`) computes
from the rounded integer figures, so the balancer's and the simulator's numbers agree.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.pareto import pareto_front
from sapptk.profile import ModeCost, ModeTable

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import LayerGroup, Profile
    from sapptk.schedules.program import Program

__all__ = [
    "equal_lengths",
    "is_sliced",
    "kv_per_token",
    "kv_ratio",
    "slice_live_points",
    "per_slice",
    "slice_lengths",
    "slice_shares",
    "solver_profile",
    "time_attention",
]


def is_sliced(profile: Profile, config: PipelineConfig) -> bool:
    """Whether ``config`` runs ``profile`` as a long-context sliced setup (k > 1 and a seq_length)."""
    return config.splits > 1 and profile.seq_length is not None


def equal_lengths(seq_length: int, splits: int) -> np.ndarray:
    """k lengths summing to ``seq_length``, differing by at most one token (longer first)."""
    base, extra = divmod(int(seq_length), int(splits))
    return np.array([base + (j < extra) for j in range(splits)], dtype=np.int64)


def slice_lengths(profile: Profile, config: PipelineConfig) -> np.ndarray | None:
    """Tokens of each slice of a sliced setup (``config.slice_lengths`` or equal), else None."""
    if not is_sliced(profile, config):
        return None
    if config.slice_lengths is not None:
        return np.asarray(config.slice_lengths, dtype=np.int64)
    return equal_lengths(int(profile.seq_length), config.splits)  # type: ignore[arg-type]


def slice_shares(lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(linear, attention)`` shares of each slice: λ_j = l_j / S and α_j = (e_j² − o_j²) / S²."""
    tokens = np.asarray(lengths, dtype=np.float64)
    total = tokens.sum()
    ends = np.cumsum(tokens)
    starts = ends - tokens
    return tokens / total, (ends**2 - starts**2) / total**2


def per_slice(total: np.ndarray, attention: np.ndarray, lengths: Any, micro_batches: int) -> np.ndarray:
    """Per virtual stage ``total`` of which ``attention`` is the causal part, as the cost of each
    slice op: shape (virtual stages, micro-batches, slices)."""
    linear, causal = slice_shares(lengths)
    total = np.asarray(total, dtype=np.float64)
    attention = np.asarray(attention, dtype=np.float64)
    each = (total - attention)[:, None] * linear[None, :] + attention[:, None] * causal[None, :]
    return np.broadcast_to(each[:, None, :], (len(total), micro_batches, len(linear)))


def _ends(profile: Profile, nvs: int) -> list[tuple[LayerGroup, int]]:
    """The head and tail with the virtual stage each lives on."""
    return [(g, vs) for g, vs in ((profile.head, 0), (profile.tail, nvs - 1)) if g is not None]


def time_attention(profile: Profile, coef: Any, counts: np.ndarray) -> dict[str, np.ndarray]:
    """The causal-attention part of each virtual stage's ``forward``, ``backward`` and ``weight``
    totals, in the integer time units of ``coef`` (:class:`sapptk.costs.LayerCoefficients`),
    as floats: every body layer's time × its group's ``attention_share`` (the head and tail
    are linear in the sequence; :meth:`PipelineConfig.check` refuses an attention share there)."""
    c = np.asarray(counts, dtype=np.float64)
    share = np.array([g.attention_share for g in profile.body], dtype=np.float64)
    out = {
        "forward": np.einsum("grv,g->v", c, coef.forward * share),
        "backward": np.einsum("grv,gr->v", c, coef.backward * share[:, None]),
        "weight": np.einsum("grv,g->v", c, coef.weight * share),
    }
    return out


def kv_per_token(profile: Profile, counts: np.ndarray) -> np.ndarray:
    """K/V MB per token of the sequence each virtual stage keeps (its layers' ``kv_mb_per_token``;
    a head or tail without it keeps none)."""
    c = np.asarray(counts, dtype=np.float64)
    kv = np.array([g.kv_mb_per_token or 0.0 for g in profile.body], dtype=np.float64)
    out = np.einsum("grv,g->v", c, kv)
    for group, vs in _ends(profile, c.shape[2]):
        out[vs] += group.count * (group.kv_mb_per_token or 0.0)
    return out



def kv_ratio(program: Program, lengths: Any = None) -> float:
    """The most K/V alive per unit of activation alive on any chunk of a device at any allocation
    point of that device in ``program`` (both in tokens of the slices alive; ``lengths`` None:
    equal slices).

    Both terms allocate at the start of an ``F`` only, and a chunk holding K/V of a micro-batch
    also holds its slice 0's activation, so at every point of a device
    Σ_c (A_c·act_c + K_c·kv_c) <= Σ_c (A_c + ratio·K_c)·act_c: an activation of A + ratio·K per
    micro-batch bounds the memory with K/V from above (the balancer's model of a sliced setup).
    """
    k = program.splits
    share = np.full(k, 1.0 / k) if lengths is None else slice_shares(lengths)[0]
    worst = 0.0
    for units in program.units:
        act: dict[int, float] = {}
        kv: dict[int, float] = {}
        kept: dict[tuple[int, int], float] = {}
        for unit in units:
            for op in unit:
                if op.kind == "F":
                    act[op.virtual_stage] = act.get(op.virtual_stage, 0.0) + share[op.slice]
                    kv[op.virtual_stage] = kv.get(op.virtual_stage, 0.0) + share[op.slice]
                    key = (op.virtual_stage, op.micro_batch)
                    kept[key] = kept.get(key, 0.0) + share[op.slice]
                    # every chunk of the device at this allocation, not only the allocating one: another
                    # chunk between the backwards of its slices holds K/V for tokens whose activation is gone
                    worst = max(worst, *(kv[v] / a for v, a in act.items() if a > 1e-12))
            for op in unit:
                if op.kind in ("B", "I"):
                    act[op.virtual_stage] -= share[op.slice]
                    if op.slice == 0:
                        kv[op.virtual_stage] -= kept.pop((op.virtual_stage, op.micro_batch))
    return worst


def solver_profile(profile: Profile, ratio: float) -> Profile:
    """The profile the balancer's solver sees for a sliced setup: no ``seq_length`` (equal, linear
    slices) and every group's activation in every mode raised by ``ratio`` × its K/V per
    micro-batch (``kv_mb_per_token`` × ``seq_length``). With ``ratio`` = :func:`kv_ratio` this
    bounds the memory with K/V from above; with 1 from below (a chunk holding activation
    holds at least as much K/V, in tokens)."""
    seq = int(profile.seq_length or 0)
    groups = []
    for group in profile.groups:
        extra = ratio * (group.kv_mb_per_token or 0.0) * seq
        modes = ModeTable({m: ModeCost(c.backward, c.activation + extra) for m, c in group.modes.items()})
        groups.append(dataclasses.replace(group, modes=modes))
    return dataclasses.replace(profile, groups=tuple(groups), seq_length=None)


def slice_live_points(program: Program) -> list[np.ndarray]:
    """The live points of a sliced program with K/V: per device, integer rows over the columns
    (chunk, slice) of slice activations alive, then (chunk, slice) of slice K/V alive, after the
    allocations of each allocating unit; only the Pareto-maximal rows (:func:`sapptk.pareto.pareto_front`).

    Both terms allocate at an ``F``'s start; an activation is freed by its backward, the K/V of
    every slice of a micro-batch by the backward of its slice 0. With MB per slice op ``a[c, j]``
    and ``kv[c, j]`` (the same for every micro-batch), device d peaks at
    static_d + max_row(row · [a; kv]): :func:`sapptk.costs.peak_memory` on a sliced setup.
    For programs with full backwards ``B`` (every sequence-slice schedule); refuses split ones.
    """
    if "I" in program.ops["kind"].astype(str).values:
        raise ValueError(f"{program.name}: slice live points are for programs without split backwards")
    k = program.splits
    out = []
    for d, units in enumerate(program.units):
        chunks = len(program.device_stages[d])
        width = chunks * k
        chunk_of = program.chunk_of
        act = np.zeros(2 * width, dtype=np.int64)
        rows = []
        for unit in units:
            allocated = False
            for op in unit:
                if op.kind == "F":
                    col = chunk_of[op.virtual_stage] * k + op.slice
                    act[col] += 1
                    act[width + col] += 1
                    allocated = True
            if allocated:
                rows.append(act.copy())
            for op in unit:
                if op.kind == "B":
                    col = chunk_of[op.virtual_stage] * k + op.slice
                    act[col] -= 1
                    if op.slice == 0:  # the micro-batch's K/V, every slice of it
                        base = chunk_of[op.virtual_stage] * k
                        act[width + base : width + base + k] -= 1
        pts = np.unique(np.array(rows, dtype=np.int64).reshape(-1, 2 * width), axis=0)
        out.append(pts[pareto_front(-pts)] if len(pts) > 1 else pts)
    return out

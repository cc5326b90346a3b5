"""Per-device layouts, enumerated: the strong formulation of the balancer.

Memory is a per-device constraint: it involves only the virtual stages of one device. So
instead of handing CP-SAT the layer counts and a knapsack-like memory row per live point
(whose LP relaxation is weak, and which leaves CP-SAT unable to prove that a device
*cannot* hold one more layer), we enumerate, for every device, the layouts it can hold —
layers of each group and recompute modes on each of its virtual stages — keep only those
that fit its budget, and among layouts with the same layer composition keep only the
Pareto-optimal ones in the backward times of its stages (forward and weight times, params
and the deviation from the even split depend on the composition alone; every objective and
path length grows with the backward times). The master then picks exactly one layout per
device. This is exact: every feasible assignment is dominated, stage by stage, by a
combination of kept layouts.

Enumeration is bounded by an incumbent step time ``ub``: a device's own op chain is a path,
so a layout whose chain is longer than ``ub`` can never be in a better plan.

Dominance within a group's recompute mixes uses a DP that is exact: a Pareto-optimal mix of
n layers minus any one layer is a Pareto-optimal mix of n − 1 layers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sapptk.costs import LayerCoefficients
from sapptk.pareto import pareto_front
from sapptk.profile import MODES
from sapptk.schedules.program import Program
from sapptk.solver.paths import MemoryModel, PathModel, memory_model, path_model

__all__ = [
    "DeviceLayouts",
    "StageOptions",
    "TooManyLayouts",
    "device_layouts",
    "group_fronts",
    "layer_caps",
    "path_lengths",
    "stage_options",
]


class TooManyLayouts(Exception):
    """Enumeration would be too large or too slow; the caller falls back to the layer-count model."""


@dataclass(frozen=True, eq=False)
class StageOptions:
    """Body contents one virtual stage may hold (head/tail excluded), Pareto in (backward, activation).

    Arrays over options: ``comp`` (k, G) layers per group and ``comp_id`` (k,) its number
    (options with the same composition share it); ``mix`` (k, G, R) layers per group and
    mode; ``forward``, ``backward``, ``weight``, ``activation``, ``params``, ``overhead`` (k,).
    """

    comp_id: np.ndarray
    comp: np.ndarray
    mix: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    weight: np.ndarray
    activation: np.ndarray
    params: np.ndarray
    overhead: np.ndarray

    def __len__(self) -> int:
        return len(self.forward)


def _pareto_2d(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Indices of points not dominated in (b, a) (:func:`sapptk.pareto.pareto_front`), lowest b
    first (then a); of identical points the first index."""
    keep = pareto_front(np.stack([b, a], axis=1))
    return keep[np.lexsort((keep, a[keep], b[keep]))]


def group_fronts(coef: LayerCoefficients, g: int, n_max: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For n = 0..n_max layers of group g: Pareto mixes as (backward, activation, mix (k, R)).

    A mix never holds select-only and comm-only layers together: MindFormers' lists count a
    layer in both ``select_recompute`` and ``select_comm_recompute`` as "both", so such a
    cell has no spelling in the format users train with. With both modes allowed, the
    fronts of the two restricted mode sets are merged (each is exact by the DP below).
    """
    modes = np.flatnonzero(coef.allowed[g])
    select, comm = MODES.index("select"), MODES.index("comm")
    if select not in modes or comm not in modes:
        return _fronts(coef, g, n_max, modes)
    one = _fronts(coef, g, n_max, modes[modes != comm])
    two = _fronts(coef, g, n_max, modes[modes != select])
    merged = []
    for (b1, a1, m1), (b2, a2, m2) in zip(one, two, strict=True):
        b, a, m = np.r_[b1, b2], np.r_[a1, a2], np.concatenate([m1, m2])
        keep = _pareto_2d(b, a)
        merged.append((b[keep], a[keep], m[keep]))
    return merged


def _fronts(
    coef: LayerCoefficients, g: int, n_max: int, modes: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pareto mixes of n = 0..n_max layers of group g over ``modes``.

    Exact: a Pareto-optimal mix of n layers minus any one layer is Pareto-optimal for n − 1.
    """
    R = coef.allowed.shape[1]
    b = coef.backward[g]
    a = coef.activation[g]
    fronts = [(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros((1, R), np.int64))]
    for _ in range(n_max):
        pb, pa, pm = fronts[-1]
        nb = (pb[:, None] + b[modes][None, :]).ravel()
        na = (pa[:, None] + a[modes][None, :]).ravel()
        nm = np.repeat(pm, len(modes), axis=0)
        nm[np.arange(len(nm)), np.tile(modes, len(pm))] += 1
        # prefer weaker modes among equal (b, a): order candidates by their mix, strongest last
        rank = np.lexsort(tuple(nm[:, r] for r in range(R)))
        nb, na, nm = nb[rank], na[rank], nm[rank]
        keep = _pareto_2d(nb, na)
        fronts.append((nb[keep], na[keep], nm[keep]))
    return fronts


def _add_fronts(
    left: tuple[np.ndarray, np.ndarray, np.ndarray], right: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Pareto front of the sums of two fronts of (backward, activation, mix (k, G, R)).

    Exact: a sum is dominated whenever one of its terms is, so filtering after each addition
    loses nothing.
    """
    lb, la, lm = left
    rb, ra, rm = right
    b = (lb[:, None] + rb[None, :]).ravel()
    a = (la[:, None] + ra[None, :]).ravel()
    keep = _pareto_2d(b, a)
    i, j = np.divmod(keep, len(rb))
    return b[keep], a[keep], lm[i] + rm[j]


def stage_options(
    coef: LayerCoefficients,
    n_max: np.ndarray,
    *,
    work_cap: int | None = None,
    max_options: int | None = None,
    max_bytes: int | None = None,
    deadline: float | None = None,
) -> StageOptions:
    """All Pareto body contents of a virtual stage with at most ``n_max[g]`` layers of group g.

    Groups in a stage are consecutive in model order: a stage holds the end of one group
    (or a part of it), every group after it whole, and the start of the last one; a group
    in the middle is always whole (the master's contiguity rule would reject anything
    else), so the number of compositions is polynomial in the groups. ``work_cap`` bounds
    ``Σ_g layers_g · (forward_g + cheapest backward_g + weight_g)`` (a stage's op chain per
    micro-batch). The empty content is included. Raises :class:`TooManyLayouts` above
    ``max_options`` options, when their mode mixes would take more than ``max_bytes``, or
    past ``deadline`` (a ``time.perf_counter`` time).
    """
    G, R = coef.allowed.shape
    n_max = np.minimum(np.asarray(n_max, dtype=np.int64), coef.counts)
    cheapest = [int(coef.forward[g]) + int(coef.backward[g][coef.allowed[g]].min()) + int(coef.weight[g])
                for g in range(G)]
    cap = None if work_cap is None else int(work_cap)

    def fronts_of(g: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        out = []
        for b, a, m in group_fronts(coef, g, int(n_max[g])):
            mix = np.zeros((len(b), G, R), np.int64)
            mix[:, g, :] = m
            out.append((b, a, mix))
        return out

    fronts = [fronts_of(g) for g in range(G)]
    comps: list[np.ndarray] = [np.zeros(G, np.int64)]
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
        (np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros((1, G, R), np.int64))
    ]
    total = 1

    def keep(comp: np.ndarray, front: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        nonlocal total
        comps.append(comp.copy())
        found.append(front)
        total += len(front[0])
        if max_options is not None and total > max_options:
            raise TooManyLayouts(f"more than {max_options} stage contents")
        if max_bytes is not None and total * G * R * 8 > max_bytes:
            raise TooManyLayouts(f"stage contents would take more than {max_bytes} bytes")
        if deadline is not None and time.perf_counter() > deadline:
            raise TooManyLayouts("out of time enumerating stage contents")

    for lo in range(G):
        for n_lo in range(1, int(n_max[lo]) + 1):
            work = n_lo * cheapest[lo]
            if cap is not None and work > cap:
                break
            comp = np.zeros(G, np.int64)
            comp[lo] = n_lo
            front = fronts[lo][n_lo]
            keep(comp, front)
            # the stage may end group lo here (its last n_lo layers) and go on over the following
            # groups: the last one partly, the ones between whole
            for hi in range(lo + 1, G):
                for n_hi in range(1, int(n_max[hi]) + 1):
                    if cap is not None and work + n_hi * cheapest[hi] > cap:
                        break
                    comp[hi] = n_hi
                    keep(comp, _add_fronts(front, fronts[hi][n_hi]))
                comp[hi] = 0
                if n_max[hi] < coef.counts[hi]:
                    break  # group hi cannot be whole here
                work += int(coef.counts[hi]) * cheapest[hi]
                if cap is not None and work > cap:
                    break
                front = _add_fronts(front, fronts[hi][int(coef.counts[hi])])
                comp[hi] = coef.counts[hi]
    sizes = [len(f[0]) for f in found]
    comp = np.repeat(np.stack(comps), sizes, axis=0)
    mix = np.concatenate([f[2] for f in found])
    return StageOptions(
        comp_id=np.repeat(np.arange(len(comps)), sizes),
        comp=comp,
        mix=mix,
        forward=comp @ coef.forward,
        backward=np.concatenate([f[0] for f in found]),
        weight=comp @ coef.weight,
        activation=np.concatenate([f[1] for f in found]),
        params=comp @ coef.params,
        overhead=np.einsum("kgr,gr->k", mix, coef.overhead),
    )


@dataclass(frozen=True, eq=False)
class DeviceLayouts:
    """The layouts kept for one device; arrays over layouts ``k`` and its chunks ``c``.

    ``comp`` (k, c, G) and ``mix`` (k, c, G, R) layers; ``forward``, ``backward``,
    ``weight`` (k, c) integer op costs of each of its virtual stages, head/tail included;
    ``overhead`` and ``deviation`` (k,) the two tie-break objectives; ``chain`` (k,) the
    length in ticks of the device's own op chain.
    """

    device: int
    stages: tuple[int, ...]
    comp: np.ndarray
    mix: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    weight: np.ndarray
    overhead: np.ndarray
    deviation: np.ndarray
    chain: np.ndarray

    def __len__(self) -> int:
        return len(self.chain)

    def find(self, coef: LayerCoefficients, counts: np.ndarray) -> int | None:
        """A layout with the composition of ``counts`` on this device and no longer backwards."""
        st = list(self.stages)
        comp = counts[:, :, st].sum(axis=1).T  # (c, G)
        back = np.einsum("grc,gr->c", counts[:, :, st], coef.backward) + coef.fixed_backward[st]
        ok = np.all(self.comp == comp[None], axis=(1, 2)) & np.all(self.backward <= back[None], axis=1)
        hits = np.flatnonzero(ok)
        if not len(hits):
            return None
        return int(hits[np.argmin(self.backward[hits].sum(axis=1))])


def path_lengths(layouts: list[DeviceLayouts], sigs: np.ndarray) -> list[np.ndarray]:
    """Per device, the (paths, layouts) matrix of the op durations each path (row of ``sigs``,
    a :class:`~sapptk.solver.paths.PathModel` signature) adds up on that device's stages."""
    V = sigs.shape[1] // 3
    out = []
    for lay in layouts:
        st = np.asarray(lay.stages)
        a, b, w = sigs[:, st], sigs[:, V + st], sigs[:, 2 * V + st]
        out.append(a @ lay.forward.T + b @ lay.backward.T + w @ lay.weight.T)
    return out


def _pareto_groups(key: np.ndarray, back: np.ndarray) -> np.ndarray:
    """Ascending indices of rows whose ``back`` vector is not dominated by a row with the same
    ``key`` (:func:`sapptk.pareto.pareto_front`; of identical rows the first)."""
    return pareto_front(back, groups=key)


def device_layouts(
    coef: LayerCoefficients,
    program: Program,
    options: StageOptions,
    *,
    ub: int | None,
    budget: int | None,
    allow_empty: bool,
    max_partial: int = 1_000_000,
    max_layouts: int | None = None,
    max_bytes: int | None = None,
    deadline: float | None = None,
    memory: MemoryModel | None = None,
) -> list[DeviceLayouts]:
    """Every device's layouts that fit ``budget`` (memory units × live-point scale), op chain at most
    ``ub`` ticks, Pareto-reduced per composition.

    Raises :class:`TooManyLayouts` when one device would have more than ``max_partial``
    partial layouts, when more than ``max_layouts`` are kept over all devices or they would
    take more than ``max_bytes``, or past ``deadline`` (a ``time.perf_counter`` time).
    ``memory``: the live points (default :func:`~sapptk.solver.paths.memory_model`; its scale
    is the budget's).
    """
    paths = path_model(program)
    mem = memory_model(program) if memory is None else memory
    V = len(coef.fixed_forward)
    total = int(coef.counts.sum())
    n_body = options.comp.sum(axis=1)
    G, R = coef.allowed.shape
    out = []
    kept = 0
    for d, stages in enumerate(program.device_stages):
        sig = paths.device_sig[d]
        chunk = []
        for vs in stages:
            valid = np.ones(len(options), dtype=bool)
            if not allow_empty and coef.fixed_layers[vs] == 0:
                valid &= n_body >= 1
            f = options.forward + coef.fixed_forward[vs]
            b = options.backward + coef.fixed_backward[vs]
            w = options.weight + coef.fixed_weight[vs]
            chain = sig[vs] * f + sig[V + vs] * b + sig[2 * V + vs] * w
            chunk.append({
                "idx": np.flatnonzero(valid), "f": f, "b": b, "w": w, "chain": chain,
                "act": options.activation + coef.fixed_activation[vs],
                "par": options.params + coef.fixed_params[vs],
            })
        rows = mem.rows[d]
        scale = mem.scale
        # lower bounds of what the chunks not yet chosen add
        min_chain = [int(ch["chain"][ch["idx"]].min()) if len(ch["idx"]) else 0 for ch in chunk]
        min_act = [int(ch["act"][ch["idx"]].min()) if len(ch["idx"]) else 0 for ch in chunk]
        min_par = [int(ch["par"][ch["idx"]].min()) if len(ch["idx"]) else 0 for ch in chunk]
        nc = len(stages)
        sel = np.zeros((1, 0), dtype=np.int64)
        p_chain = np.zeros(1, dtype=np.int64)
        p_par = np.zeros(1, dtype=np.int64) + coef.constant
        p_act = np.zeros((1, 0), dtype=np.int64)
        for c, ch in enumerate(chunk):
            idx = ch["idx"]
            if deadline is not None and time.perf_counter() > deadline:
                raise TooManyLayouts("out of time enumerating layouts")
            if c == nc - 1:  # the last stage: per composition, only its cheapest content that fits
                sel, p_chain = _cheapest_last(sel, p_chain, p_par, p_act, ch, options.comp_id, rows, scale, budget,
                                              ub, max_partial, deadline)
                break
            if len(sel) * len(idx) > max_partial:
                raise TooManyLayouts(f"device {d}: more than {max_partial} partial layouts")
            left = slice(c + 1, nc)
            sel = np.concatenate([np.repeat(sel, len(idx), axis=0), np.tile(idx, len(sel))[:, None]], axis=1)
            p_chain = np.repeat(p_chain, len(idx)) + np.tile(ch["chain"][idx], len(p_chain))
            p_par = np.repeat(p_par, len(idx)) + np.tile(ch["par"][idx], len(p_par))
            p_act = np.concatenate(
                [np.repeat(p_act, len(idx), axis=0), np.tile(ch["act"][idx], len(p_act))[:, None]], axis=1
            )
            keep = np.ones(len(sel), dtype=bool)
            if ub is not None:
                keep &= p_chain + sum(min_chain[left]) <= ub
            if budget is not None:
                rest_par = sum(min_par[left])
                for row in rows:
                    used = scale * (p_par + rest_par) + p_act @ row[: c + 1] + int(row[c + 1 :] @ min_act[left])
                    keep &= used <= budget
                if not len(rows):
                    keep &= scale * (p_par + rest_par) <= budget
            sel, p_chain, p_par, p_act = sel[keep], p_chain[keep], p_par[keep], p_act[keep]
        back = np.stack([chunk[c]["b"][sel[:, c]] for c in range(nc)], axis=1).reshape(len(sel), nc)
        if len(sel):
            _, key = np.unique(options.comp_id[sel], axis=0, return_inverse=True)  # the device's composition
            keep = _pareto_groups(key.ravel(), back)
        else:
            keep = np.zeros(0, dtype=np.int64)
        sel = sel[keep]
        kept += len(keep)
        if max_layouts is not None and kept > max_layouts:
            raise TooManyLayouts(f"more than {max_layouts} layouts")
        if max_bytes is not None and kept * nc * G * (R + 1) * 8 > max_bytes:
            raise TooManyLayouts(f"layouts would take more than {max_bytes} bytes")
        n_c = options.comp[sel].sum(axis=2)  # (k, c)
        out.append(DeviceLayouts(
            device=d,
            stages=tuple(stages),
            comp=options.comp[sel],
            mix=options.mix[sel],
            forward=np.stack([chunk[c]["f"][sel[:, c]] for c in range(nc)], axis=1).reshape(len(sel), nc),
            backward=back[keep],
            weight=np.stack([chunk[c]["w"][sel[:, c]] for c in range(nc)], axis=1).reshape(len(sel), nc),
            overhead=options.overhead[sel].sum(axis=1),
            deviation=np.abs(V * n_c - total).sum(axis=1),
            chain=p_chain[keep],
        ))
    return out


def _cheapest_last(
    sel: np.ndarray,
    p_chain: np.ndarray,
    p_par: np.ndarray,
    p_act: np.ndarray,
    chunk: dict[str, np.ndarray],
    comp_id: np.ndarray,
    rows: np.ndarray,
    scale: int,
    budget: int | None,
    ub: int | None,
    max_partial: int,
    deadline: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Complete each partial layout (rows of ``sel``) on the device's last stage: for every
    composition of that stage, only its cheapest content (least backward) that fits.

    Exact for the Pareto reduction that follows: a stage's contents of one composition are a
    front sorted by backward ascending and activation descending (memory fits for a suffix),
    and with everything else equal a larger backward is dominated. Returns the completed
    ``sel`` and chains.
    """
    idx = chunk["idx"]
    if not len(idx) or not len(sel):
        return np.zeros((0, sel.shape[1] + 1), np.int64), np.zeros(0, np.int64)
    cid = comp_id[idx]
    starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
    ends = np.r_[starts[1:], len(idx)]
    if len(sel) * len(starts) > max_partial:
        raise TooManyLayouts(f"more than {max_partial} partial layouts")
    c = sel.shape[1]
    act, par, chain = chunk["act"], chunk["par"], chunk["chain"]
    # what the budget leaves for this stage under every live-point row, before its own params
    if budget is not None:
        base = [budget - scale * p_par - (p_act @ row[:c] if c else 0) for row in rows]
        if not len(rows):
            base = [budget - scale * p_par]
    picks_p, picks_o = [], []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if deadline is not None and time.perf_counter() > deadline:
            raise TooManyLayouts("out of time enumerating layouts")
        opts = idx[a:b]  # one composition: backward ascending, activation descending
        ok = np.ones(len(sel), dtype=bool)
        limit = np.full(len(sel), np.iinfo(np.int64).max, dtype=np.int64)  # most activation this stage may take
        if budget is not None:
            left = [av - scale * int(par[opts[0]]) for av in base]
            if len(rows):
                for row, av in zip(rows, left, strict=True):
                    if row[c] > 0:
                        limit = np.minimum(limit, av // int(row[c]))
                    else:
                        ok &= av >= 0
            else:
                ok &= left[0] >= 0
        pos = np.searchsorted(-act[opts], -limit, side="left")  # the first content with activation <= limit
        ok &= pos < len(opts)
        o = opts[np.minimum(pos, len(opts) - 1)]
        if ub is not None:
            ok &= p_chain + chain[o] <= ub
        hit = np.flatnonzero(ok)
        picks_p.append(hit)
        picks_o.append(o[hit])
    p_idx = np.concatenate(picks_p)
    o_idx = np.concatenate(picks_o)
    out = np.concatenate([sel[p_idx], o_idx[:, None]], axis=1)
    order = np.lexsort(out.T[::-1])  # the order of the full product: first stage's content first
    return out[order], (p_chain[p_idx] + chain[o_idx])[order]


def layer_caps(
    coef: LayerCoefficients, paths: PathModel, ub: int | None, *, allow_empty: bool
) -> tuple[np.ndarray, int | None]:
    """Most layers of each group one virtual stage can hold, and the most work
    ``Σ_g layers_g · (forward_g + cheapest backward_g + weight_g)`` it can hold, in a plan
    whose step time is at most ``ub`` ticks (``None``: no incumbent, no work cap).

    The other stages without head or tail need a layer each (unless ``allow_empty``); a
    stage's ops all run on its device, one after another (a path), at least ``fewest``
    forwards and backwards of it, where ``fewest`` is the least over stages.
    """
    required = 0 if allow_empty else int((coef.fixed_layers == 0).sum()) - 1
    caps = np.minimum(coef.counts, max(0, int(coef.counts.sum()) - max(required, 0)))
    if ub is None:
        return caps, None
    V = len(coef.fixed_forward)
    sig = paths.device_sig
    fewest = min(int(sig[:, vs].max()) for vs in range(V)) if V else 1
    if fewest <= 0:
        return caps, None
    return caps, int(ub) // fewest

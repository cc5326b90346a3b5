"""Consecutive identical body groups, merged: an exact reduction of the problem; and nearly
identical ones, coarsened: a restriction that finds good plans fast.

A profile where every layer is its own group (a calibrated or traced one often is) has
tens of groups whose integer costs are equal (every decoder layer of a dense model, every
MoE layer). Layers of equal cost are interchangeable: a plan places *how many* of them on
each virtual stage in each mode, and which of the equal layers they are changes no time
and no memory. So the search works on the merged groups, and a merged plan is spread back
over the original groups by position (each virtual stage takes the next layers in model
order, and the modes of a cell in :data:`~sapptk.profile.MODES` order): the same costs on
every virtual stage, so the same step time and peaks.

:func:`coarsen` goes further for profiles whose per-layer figures differ a little (measured
ones do): runs of consecutive groups whose figures are all within a tolerance become one
group with the *largest* figure of each kind. Every plan of the coarse problem, spread back,
is a plan of the real one that is no slower and needs no more memory than the coarse one
says: the coarse problem is a restriction, so its plans are real incumbents (never bounds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sapptk.costs import LayerCoefficients

__all__ = ["GroupMap", "coarsen", "merge_groups"]


@dataclass(frozen=True, eq=False)
class GroupMap:
    """Which original body groups each merged group stands for (``members[i]``, consecutive),
    and the original layer counts."""

    members: tuple[tuple[int, ...], ...]
    counts: np.ndarray  # (G_original,)

    @property
    def identity(self) -> bool:
        return all(len(m) == 1 for m in self.members)

    def merge(self, counts: np.ndarray) -> np.ndarray:
        """Original counts (G, R, V) → merged counts (layers of the members added up)."""
        if self.identity:
            return counts
        return np.stack([counts[list(m)].sum(axis=0) for m in self.members])

    def spread(self, merged: np.ndarray) -> np.ndarray:
        """Merged counts → original counts: each virtual stage takes the next layers of the
        merged group in model order, its modes in order."""
        if self.identity:
            return merged
        _, R, V = merged.shape
        out = np.zeros((len(self.counts), R, V), dtype=np.int64)
        for i, members in enumerate(self.members):
            ends = np.cumsum(self.counts[list(members)])
            starts = ends - self.counts[list(members)]
            pos = 0  # layers of the merged group placed so far (model order)
            for vs in range(V):
                for r in range(R):
                    n = int(merged[i, r, vs])
                    lo, hi = pos, pos + n
                    for g, a, b in zip(members, starts.tolist(), ends.tolist(), strict=True):
                        take = min(hi, b) - max(lo, a)
                        if take > 0:
                            out[g, r, vs] += take
                    pos = hi
        return out


_PER_GROUP = ("available", "allowed", "forward", "backward", "weight", "overhead", "activation", "params")


def merge_groups(coef: LayerCoefficients) -> tuple[LayerCoefficients, GroupMap]:
    """Merge runs of consecutive body groups whose integer costs and allowed modes are equal."""
    G = len(coef.counts)
    members: list[list[int]] = []
    for g in range(G):
        if members and all(np.array_equal(getattr(coef, f)[g], getattr(coef, f)[members[-1][0]]) for f in _PER_GROUP):
            members[-1].append(g)
        else:
            members.append([g])
    groups = GroupMap(members=tuple(tuple(m) for m in members), counts=coef.counts.copy())
    if groups.identity:
        return coef, groups
    first = [m[0] for m in members]
    merged = dataclasses.replace(
        coef,
        group_names=tuple(
            coef.group_names[m[0]] if len(m) == 1 else f"{coef.group_names[m[0]]}..{coef.group_names[m[-1]]}"
            for m in members
        ),
        counts=np.array([int(coef.counts[m].sum()) for m in members], dtype=np.int64),
        **{f: getattr(coef, f)[first] for f in _PER_GROUP},
    )
    return merged, groups


def coarsen(coef: LayerCoefficients, tolerance: float, *, largest: bool = True) -> tuple[LayerCoefficients, GroupMap]:
    """Runs of consecutive groups with the same allowed modes whose every figure is within
    ``tolerance`` (relative, plus one unit) of the run's smallest, as one group each with the
    largest figures (a restriction; see the module docstring) or, with ``largest=False``, the
    smallest (a relaxation: every real plan, merged, is a coarse plan no slower and no larger,
    so a lower bound of the coarse problem is one of the real problem)."""
    G = len(coef.counts)
    fields = ("forward", "backward", "weight", "activation", "params", "overhead")
    compared = fields[:-1]  # the overhead (a tie-break) is a difference of figures: not compared
    members: list[list[int]] = []
    lo: dict[str, np.ndarray] = {}
    hi: dict[str, np.ndarray] = {}
    for g in range(G):
        if members and np.array_equal(coef.allowed[g], coef.allowed[members[-1][0]]):
            mask = coef.allowed[g]
            new_lo = {f: np.minimum(lo[f], getattr(coef, f)[g]) for f in fields}
            new_hi = {f: np.maximum(hi[f], getattr(coef, f)[g]) for f in fields}
            close = all(
                np.all((new_hi[f] <= (1 + tolerance) * new_lo[f] + 1)[mask] if new_hi[f].ndim else
                       new_hi[f] <= (1 + tolerance) * new_lo[f] + 1)
                for f in compared
            )
            if close:
                members[-1].append(g)
                lo, hi = new_lo, new_hi
                continue
        members.append([g])
        lo = {f: getattr(coef, f)[g].copy() for f in fields}
        hi = {f: getattr(coef, f)[g].copy() for f in fields}
    groups = GroupMap(members=tuple(tuple(m) for m in members), counts=coef.counts.copy())
    if groups.identity:
        return coef, groups
    pick = np.max if largest else np.min
    figures = {f: np.stack([pick(getattr(coef, f)[m], axis=0) for m in members]) for f in fields}
    coarse = dataclasses.replace(
        coef,
        group_names=tuple(f"{coef.group_names[m[0]]}..{coef.group_names[m[-1]]}" for m in members),
        counts=np.array([int(coef.counts[m].sum()) for m in members], dtype=np.int64),
        available=np.stack([coef.available[m].all(axis=0) for m in members]),
        allowed=np.stack([coef.allowed[m[0]] for m in members]),
        **figures,
    )
    return coarse, groups

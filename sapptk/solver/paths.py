"""Integer views of a :class:`~sapptk.schedules.Program` for the solver: paths and live points.

Both depend on the program alone (never on durations), so they are built once per program
and cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from sapptk.costs import LayerCoefficients
from sapptk.schedules.program import B_CODE, F_CODE, I_CODE, W_CODE, Program
from sapptk.simulation import WEIGHT_HOLDS

__all__ = ["MemoryModel", "PathModel", "memory_model", "path_key", "path_model", "stage_cost_vector"]


# ----------------------------------------------------------------- the time model
@dataclass(frozen=True, eq=False)
class PathModel:
    """A program's dependency graph prepared for integer longest paths.

    Time is counted in *ticks* of ``TIME_UNIT_MS / splits``, so that a slice op of a virtual
    stage whose op costs ``c`` time units lasts exactly ``c`` ticks. A path is summarised by
    its *signature*: how many forward, backward (``B`` or ``I``) and weight (``B`` or ``W``)
    op durations of each virtual stage it adds up, and how many cross-device edges (each
    costing ``comm``) it crosses; its length is ``sig · [F; BI; W] + crossings · comm · k``.
    """

    program: Program
    unit_sig: np.ndarray  # (n_units, 3*nvs) int64: ops per (kind class, vs) in each unit
    device_sig: np.ndarray  # (p, 3*nvs): the whole op chain of each device (a path)

    @property
    def nvs(self) -> int:
        return self.program.num_virtual_stages

    def durations(self, costs: np.ndarray) -> np.ndarray:
        """Unit durations in ticks for cost vectors ``costs`` of shape (batch, 3·nvs)."""
        return self.unit_sig @ costs.T  # (n_units, batch)

    def longest(self, costs: np.ndarray, comm: int) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
        """Exact step time (ticks) and one critical path per cost vector.

        ``costs`` has shape (batch, 3·nvs): per virtual stage the forward, backward (``I`` or
        the part of ``B`` carrying recompute) and weight costs in time units; ``comm`` is the
        p2p latency in time units. Mirrors :func:`sapptk.simulation.unit_times`: a unit starts
        at the latest end of its predecessors, plus comm across devices. Integer costs give
        exact integer steps; fractional costs (the LP relaxation's averaged durations,
        :mod:`sapptk.solver.relaxation`) are timed in floating point, and their critical
        paths are real paths all the same.
        """
        g = self.program.graph
        k = self.program.splits
        n = g.n_units
        batch = costs.shape[0]
        dur = self.durations(costs)
        end = np.zeros((n + 1, batch), dtype=np.float64 if np.issubdtype(dur.dtype, np.floating) else np.int64)
        arg = np.full((n, batch), -1, dtype=np.int64)  # column of unit_preds that set the start
        lag = g.unit_cross.astype(np.int64) * (comm * k)
        preds, lp, lu = g.unit_preds, g.level_ptr, g.level_units
        for lvl in range(len(lp) - 1):
            idx = lu[lp[lvl] : lp[lvl + 1]]
            cand = end[preds[idx]] + lag[idx][:, :, None]  # (units, width, batch)
            a = cand.argmax(axis=1)
            s = np.take_along_axis(cand, a[:, None, :], axis=1)[:, 0, :]
            arg[idx] = a
            end[idx] = s + dur[idx]
        end = end[:n]
        step = end.max(axis=0)
        paths = []
        for b in range(batch):
            u = int(end[:, b].argmax())
            sig = np.zeros(self.unit_sig.shape[1], dtype=np.int64)
            crossings = 0
            while True:
                sig += self.unit_sig[u]
                col = int(arg[u, b])
                pred = int(preds[u, col])
                if pred >= n:
                    break
                crossings += int(g.unit_cross[u, col])
                u = pred
            paths.append((sig, crossings))
        return step, paths


    def steps(self, costs: np.ndarray, comm: int) -> np.ndarray:
        """Exact step time (ticks) of each cost vector, as :meth:`longest` without the paths (faster)."""
        g = self.program.graph
        k = self.program.splits
        n = g.n_units
        dur = self.durations(costs)
        end = np.zeros((n + 1, costs.shape[0]), dtype=np.int64)
        lag = g.unit_cross.astype(np.int64) * (comm * k)
        preds, lp, lu = g.unit_preds, g.level_ptr, g.level_units
        for lvl in range(len(lp) - 1):
            idx = lu[lp[lvl] : lp[lvl + 1]]
            end[idx] = (end[preds[idx]] + lag[idx][:, :, None]).max(axis=1) + dur[idx]
        return end[:n].max(axis=0)

    def through(self, cost: np.ndarray, comm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every unit, the longest path through it: (lengths (n,), signatures (n, 3·nvs), crossings (n,)).

        One forward and one backward pass over the levels; signatures are carried along
        the arg-max edges, so each one is a real path of the graph.
        """
        g = self.program.graph
        k = self.program.splits
        n = g.n_units
        dur = self.unit_sig @ cost
        width = self.unit_sig.shape[1]
        lag_unit = g.unit_cross.astype(np.int64) * (comm * k)
        end = np.zeros(n + 1, dtype=np.int64)
        sig_in = np.zeros((n + 1, width), dtype=np.int64)
        cross_in = np.zeros(n + 1, dtype=np.int64)
        preds, lp, lu = g.unit_preds, g.level_ptr, g.level_units
        levels = len(lp) - 1
        for lvl in range(levels):
            idx = lu[lp[lvl] : lp[lvl + 1]]
            cand = end[preds[idx]] + lag_unit[idx]
            a = cand.argmax(axis=1)
            p = preds[idx, a]
            end[idx] = cand[np.arange(len(idx)), a] + dur[idx]
            sig_in[idx] = sig_in[p] + self.unit_sig[idx]
            cross_in[idx] = cross_in[p] + g.unit_cross[idx, a]
        # backward: longest continuation after each unit's end
        tail = np.zeros(n, dtype=np.int64)
        sig_out = np.zeros((n, width), dtype=np.int64)
        cross_out = np.zeros(n, dtype=np.int64)
        src, dst, ecross = self.edges
        elag = ecross.astype(np.int64) * (comm * k)
        src_level = g.level[src]
        order = np.argsort(-src_level, kind="stable")
        bounds = np.searchsorted(-src_level[order], np.arange(-(levels - 1), 1))
        bounds = np.r_[bounds, len(order)]
        for i in range(levels):
            sel = order[bounds[i] : bounds[i + 1]]
            if not len(sel):
                continue
            s_, d_ = src[sel], dst[sel]
            cand = elag[sel] + dur[d_] + tail[d_]
            best = np.full(n, -1, dtype=np.int64)
            np.maximum.at(best, s_, cand)
            win = cand == best[s_]
            # first winning edge per source
            ws, first = np.unique(s_[win], return_index=True)
            we = sel[np.flatnonzero(win)[first]]
            wd = dst[we]
            tail[ws] = best[ws]
            sig_out[ws] = sig_out[wd] + self.unit_sig[wd]
            cross_out[ws] = cross_out[wd] + ecross[we]
        length = end[:n] + tail
        return length, sig_in[:n] + sig_out, cross_in[:n] + cross_out

    @property
    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unit edges as (source, destination, crosses devices) arrays."""
        g = self.program.graph
        n = g.n_units
        u, col = np.nonzero(g.unit_preds < n)
        return g.unit_preds[u, col], u, g.unit_cross[u, col]


def path_key(sig: np.ndarray, crossings: int) -> bytes:
    """A hashable identity of a path (its signature and crossings), for sets of paths already seen."""
    return np.asarray(sig, dtype=np.int64).tobytes() + int(crossings).to_bytes(8, "little")


def _unit_signatures(program: Program) -> np.ndarray:
    g = program.graph
    nvs = program.num_virtual_stages
    sig = np.zeros((g.n_units, 3 * nvs), dtype=np.int64)
    vs = g.op_virtual_stage
    u = g.op_unit
    kind = g.op_kind
    for code, cls in ((F_CODE, (0,)), (B_CODE, (1, 2)), (I_CODE, (1,)), (W_CODE, (2,))):
        sel = kind == code
        for c in cls:
            np.add.at(sig, (u[sel], c * nvs + vs[sel]), 1)
    return sig


@lru_cache(maxsize=64)
def path_model(program: Program) -> PathModel:
    """The :class:`PathModel` of a program (cached; programs are immutable)."""
    sig = _unit_signatures(program)
    g = program.graph
    device_sig = np.stack([sig[g.unit_ptr[d] : g.unit_ptr[d + 1]].sum(axis=0) for d in range(program.stages)])
    return PathModel(program=program, unit_sig=sig, device_sig=device_sig)


def stage_cost_vector(coef: LayerCoefficients, counts: np.ndarray) -> np.ndarray:
    """Per-vs [F; BI; W] integer costs of an assignment, shape (3·nvs,)."""
    tot = coef.per_stage(counts)
    return np.concatenate([tot["forward"], tot["backward"], tot["weight"]])


# --------------------------------------------------------------- the memory model
@dataclass(frozen=True, eq=False)
class MemoryModel:
    """Integer live points: ``rows[d]`` (points, chunks) = live counts × ``scale``."""

    scale: int
    rows: tuple[np.ndarray, ...]

    def peaks(self, coef: LayerCoefficients, program: Program, counts: np.ndarray) -> np.ndarray:
        """Peak memory of every device for ``counts``, in memory units × ``scale`` (exact integers)."""
        tot = coef.per_stage(counts)
        out = np.zeros(program.stages, dtype=np.int64)
        for d, rows in enumerate(self.rows):
            st = list(program.device_stages[d])
            static = int(tot["params"][st].sum()) + coef.constant
            live = int((rows @ tot["activation"][st]).max()) if len(rows) else 0
            out[d] = self.scale * static + live
        return out


def _common_scale(values: np.ndarray) -> int:
    scale = 1
    for v in np.unique(np.round(values.ravel(), 9)):
        frac = Fraction(float(v)).limit_denominator(10_000)
        scale = math.lcm(scale, frac.denominator)
    return scale


@lru_cache(maxsize=64)
def memory_model(program: Program) -> MemoryModel:
    """Live points of a program as integers (cached)."""
    pts = program.live_points(WEIGHT_HOLDS)
    allv = np.concatenate([p.ravel() for p in pts]) if pts else np.zeros(0)
    scale = _common_scale(allv)
    rows = []
    for p in pts:
        scaled = np.rint(p * scale).astype(np.int64)
        if not np.allclose(scaled, p * scale, atol=1e-6):
            raise AssertionError("live points are not multiples of 1/scale")
        rows.append(scaled)
    return MemoryModel(scale=scale, rows=tuple(rows))

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
from sapptk.schedules.memory import device_peaks
from sapptk.schedules.program import B_CODE, F_CODE, I_CODE, W_CODE, Program
from sapptk.schedules.timing import critical_path, longest_path, path_sums
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
        p2p latency in time units. The simulator's kernel
        (:func:`sapptk.schedules.timing.longest_path`): a unit starts at the latest end of its
        predecessors, plus comm across devices. Integer costs give exact integer steps;
        fractional costs (the LP relaxation's averaged durations,
        :mod:`sapptk.solver.relaxation`) are timed in floating point, and their critical
        paths are real paths all the same.
        """
        g = self.program.graph
        end, columns = longest_path(g, self.durations(costs), comm * self.program.splits, argmax=True)
        step = end.max(axis=0)
        paths = []
        for b in range(costs.shape[0]):
            units, crossings = critical_path(g, columns[:, b], int(end[:, b].argmax()))
            paths.append((self.unit_sig[units].sum(axis=0), crossings))
        return step, paths

    def steps(self, costs: np.ndarray, comm: int) -> np.ndarray:
        """Exact step time (ticks) of each cost vector, as :meth:`longest` without the paths (faster)."""
        end, _ = longest_path(self.program.graph, self.durations(costs), comm * self.program.splits)
        return end.max(axis=0)

    def through(self, cost: np.ndarray, comm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every unit, the longest path through it: (lengths (n,), signatures (n, 3·nvs), crossings (n,)).

        One forward and one backward pass of the kernel; signatures are carried along the
        arg-max edges, so each one is a real path of the graph.
        """
        g = self.program.graph
        lag = comm * self.program.splits
        dur = self.unit_sig @ cost
        end, into = longest_path(g, dur, lag, argmax=True)
        start_here, out_of = longest_path(g, dur, lag, argmax=True, reverse=True)
        rows = np.arange(g.n_units)
        succ_cross = g.unit_succs[1]
        sig = path_sums(g, into, self.unit_sig) + path_sums(g, out_of, self.unit_sig, reverse=True) - self.unit_sig
        crossings = path_sums(g, into, g.unit_cross[rows, into].astype(np.int64)) + path_sums(
            g, out_of, succ_cross[rows, out_of].astype(np.int64), reverse=True
        )
        return end + start_here - dur, sig, crossings

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
        static = np.array([tot["params"][list(st)].sum() for st in program.device_stages], dtype=np.int64)
        peaks = device_peaks(self.rows, program.device_stages, tot["activation"], static + coef.constant,
                             scale=self.scale)
        return peaks.astype(np.int64)


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

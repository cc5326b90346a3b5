"""Integer views of a :class:`~sapptk.schedules.Program` for the solver: paths and live points.

Both depend on the program alone (never on durations), so they are built once per program
and cached. Unit signatures are stored sparse (a unit holds at most two ops, each adding to
at most two columns): a dense (units × 3·nvs) table would take 0.8 GB at 64 stages,
256 micro-batches and 4 chunks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from sapptk.costs import LayerCoefficients
from sapptk.pareto import pareto_front
from sapptk.schedules.memory import device_peaks
from sapptk.schedules.program import B_CODE, F_CODE, I_CODE, W_CODE, Program
from sapptk.schedules.timing import critical_path, longest_path, path_sums
from sapptk.simulation import WEIGHT_HOLDS

__all__ = [
    "MemoryModel",
    "OutOfTime",
    "PathModel",
    "UnitSignatures",
    "live_rows",
    "memory_model",
    "path_key",
    "path_model",
    "reduce_live_points",
    "stage_cost_vector",
]


# ----------------------------------------------------------- unit signatures
@dataclass(frozen=True, eq=False)
class UnitSignatures:
    """How many forward, backward and weight op durations of each virtual stage every unit adds up.

    A sparse (units × ``width``) integer matrix: row ``u`` is ``Σ_k vals[u, k] · e(cols[u, k])``,
    padded with column ``width`` (a zero column) and value 0. It answers the few operations
    the path model needs as a dense matrix would: ``sig[u]`` and ``sig[units]`` (dense rows),
    ``sig @ costs`` (costs of shape (width,) or (width, batch)), ``sig.sum(axis=0)``,
    ``sig.shape`` and ``np.asarray(sig)``.
    """

    cols: np.ndarray  # (n_units, K) int64
    vals: np.ndarray  # (n_units, K) int64
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.cols), self.width)

    def __getitem__(self, index: int | np.integer | np.ndarray) -> np.ndarray:
        # a row's real columns are distinct (built so); padding entries all write 0 to column `width`
        cols, vals = self.cols[index], self.vals[index]
        if cols.ndim == 1:
            row = np.zeros(self.width + 1, dtype=np.int64)
            row[cols] = vals
            return row[: self.width]
        rows = np.zeros((len(cols), self.width + 1), dtype=np.int64)
        rows[np.arange(len(cols))[:, None], cols] = vals
        return rows[:, : self.width]

    def __matmul__(self, costs: np.ndarray) -> np.ndarray:
        costs = np.asarray(costs)
        padded = np.concatenate([costs, np.zeros((1, *costs.shape[1:]), dtype=costs.dtype)])
        out = padded[self.cols[:, 0]] * (self.vals[:, 0, None] if costs.ndim == 2 else self.vals[:, 0])
        for k in range(1, self.cols.shape[1]):
            out += padded[self.cols[:, k]] * (self.vals[:, k, None] if costs.ndim == 2 else self.vals[:, k])
        return out

    def sum(self, axis: int = 0) -> np.ndarray:
        """Column sums (``axis=0``, the signature of all units together) or row sums."""
        if axis == 0:
            out = np.zeros(self.width + 1, dtype=np.int64)
            np.add.at(out, self.cols.ravel(), self.vals.ravel())
            return out[: self.width]
        return self.vals.sum(axis=1)

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:  # noqa: ARG002
        dense = self[np.arange(len(self.cols))]
        return dense if dtype is None else dense.astype(dtype)

    def device_sums(self, unit_ptr: np.ndarray) -> np.ndarray:
        """Signature of each run of units ``unit_ptr[d]:unit_ptr[d+1]`` (a device's whole chain)."""
        n_dev = len(unit_ptr) - 1
        owner = np.repeat(np.arange(n_dev), np.diff(unit_ptr))
        out = np.zeros((n_dev, self.width + 1), dtype=np.int64)
        np.add.at(out, (np.repeat(owner, self.cols.shape[1]), self.cols.ravel()), self.vals.ravel())
        return out[:, : self.width]


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
    unit_sig: UnitSignatures  # (n_units, 3*nvs), sparse: ops per (kind class, vs) in each unit
    device_sig: np.ndarray  # (p, 3*nvs) int64: the whole op chain of each device (a path)

    @property
    def nvs(self) -> int:
        return self.program.num_virtual_stages

    def durations(self, costs: np.ndarray) -> np.ndarray:
        """Unit durations in ticks for cost vectors ``costs`` of shape (batch, 3·nvs): (n_units, batch).

        Integer costs give exact integers (int64); fractional costs give floats.
        """
        return self.unit_sig @ np.asarray(costs).T

    def batch_size(self, max_bytes: int) -> int:
        """How many cost vectors one call to :meth:`steps` or :meth:`longest` may take within
        ``max_bytes`` of working memory (at least 1): each vector needs a few arrays of one
        integer per unit."""
        return max(1, int(max_bytes) // (32 * (self.program.graph.n_units + 1)))

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


def _unit_signatures(program: Program) -> UnitSignatures:
    """Sparse unit signatures: an ``F`` adds its stage's forward; ``B`` its backward and weight;
    ``I`` its backward; ``W`` its weight."""
    g = program.graph
    nvs = program.num_virtual_stages
    width = 3 * nvs
    vs = np.asarray(g.op_virtual_stage, dtype=np.int64)
    unit = np.asarray(g.op_unit, dtype=np.int64)
    kind = np.asarray(g.op_kind)
    units, cols = [], []
    for code, classes in ((F_CODE, (0,)), (B_CODE, (1, 2)), (I_CODE, (1,)), (W_CODE, (2,))):
        sel = kind == code
        for c in classes:
            units.append(unit[sel])
            cols.append(c * nvs + vs[sel])
    u = np.concatenate(units)
    col = np.concatenate(cols)
    key, count = np.unique(u * (width + 1) + col, return_counts=True)
    u, col = key // (width + 1), key % (width + 1)
    per_unit = np.bincount(u, minlength=g.n_units)
    k = max(1, int(per_unit.max(initial=0)))
    slot = np.arange(len(u)) - np.repeat(np.cumsum(per_unit) - per_unit, per_unit)
    cols_arr = np.full((g.n_units, k), width, dtype=np.int64)
    vals_arr = np.zeros((g.n_units, k), dtype=np.int64)
    cols_arr[u, slot] = col
    vals_arr[u, slot] = count
    return UnitSignatures(cols=cols_arr, vals=vals_arr, width=width)


@lru_cache(maxsize=64)
def path_model(program: Program) -> PathModel:
    """The :class:`PathModel` of a program (cached; programs are immutable)."""
    sig = _unit_signatures(program)
    device_sig = sig.device_sums(np.asarray(program.graph.unit_ptr))
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


class OutOfTime(Exception):
    """:func:`reduce_live_points` ran past its deadline."""


@lru_cache(maxsize=64)
def live_rows(program: Program) -> MemoryModel:
    """Every distinct live point of a program as integers (cached): exact peaks, no reduction.

    Fast at every size (a sort per device); :func:`memory_model` keeps only the Pareto-maximal
    rows, which the layouts and the layer-count master need (fewer rows) but which take
    seconds at a million ops with four chunks.
    """
    widths = [len(s) for s in program.device_stages]
    pts = [np.unique(np.round(p, 9), axis=0) if len(p) else p
           for p in program.memory_events.live_points(WEIGHT_HOLDS, widths)]
    allv = np.concatenate([p.ravel() for p in pts]) if pts else np.zeros(0)
    scale = _common_scale(allv)
    rows = []
    for p in pts:
        scaled = np.rint(p * scale).astype(np.int64)
        if not np.allclose(scaled, p * scale, atol=1e-6):
            raise AssertionError("live points are not multiples of 1/scale")
        rows.append(scaled)
    return MemoryModel(scale=scale, rows=tuple(rows))


def reduce_live_points(model: MemoryModel, deadline: float | None = None) -> MemoryModel:
    """``model`` with only the Pareto-maximal rows of each device (same scale, same peaks).

    Raises :class:`OutOfTime` past ``deadline`` (a ``time.perf_counter`` time, checked
    between devices)."""
    rows = []
    for r in model.rows:
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime("out of time reducing the live points")
        front = r[pareto_front(-r)] if len(r) > 1 else r
        rows.append(front[np.lexsort(front.T[::-1])] if len(front) else front)
    return MemoryModel(scale=model.scale, rows=tuple(rows))


@lru_cache(maxsize=64)
def memory_model(program: Program) -> MemoryModel:
    """The Pareto-maximal live points of a program as integers (cached)."""
    return reduce_live_points(live_rows(program))

"""Activation offload in the balancer: a local search over offload choices, every candidate simulated.

Run after the usual solve when ``"offload"`` is in ``config.recompute``. It starts from that
solve's plan (no offload) and moves, one at a time, between plans that fit the budget:

* **convert**: layers of a recompute mode on a virtual stage become mode-``"none"`` layers
  whose activations are offloaded (one layer, all of them on that stage, or one on every
  stage that has one); when that does not fit, the same with one more resident
  ``"none"`` layer of that stage offloaded to make room;
* **shift**: one layer (its mode and offload flag kept) moves to the neighbouring virtual
  stage in model order (re-balancing the stages the conversions made lighter);
* **keep**: an offloaded layer keeps its activation on the device again.

A candidate is simulated exactly (:func:`sapptk.simulate` with ``host_bandwidth``: the copy stream and
the memory steps the plan will show) and accepted when it fits and is better in the order
(step time, recompute ms summed over virtual stages, offloaded MB): faster first; at the same
step time, less recompute work, then less traffic. The search stops at a plan no move
improves, at the deadline or on ``stop``. The caller keeps its own plan unless the search's
is strictly faster, so offload never makes a plan worse.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, fits_budget, layer_coefficients
from sapptk.profile import MODES
from sapptk.simulation import simulate

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["OffloadResult", "offload_search"]
"""A peak this far over the budget still fits (the plan's own tolerance)."""

_NONE = MODES.index("none")

EVALUATION_SECONDS_PER_OP = 15e-6
"""Estimated seconds per op of the first candidate simulation of a setup (it builds the
program's transfer pairs too; measured: 1.3–2.1 s for 131,072 ops on a loaded 2-core machine).
The search starts no simulation it does not expect to finish by the deadline: the estimate
until one was measured, then the last one's time."""


@dataclass(frozen=True)
class OffloadResult:
    """What :func:`offload_search` found: the best assignment and its figures.

    ``counts`` (groups, modes, virtual stages) and ``offload`` (groups, virtual stages);
    ``step_time`` (ms) and ``peaks`` (MB per device) as simulated; ``base_step_time`` of the
    start; ``evaluations`` (candidates simulated), ``accepted`` (moves taken), ``seconds``,
    ``complete`` (True: no move improves the result; False: cut short by the deadline or stop).
    """

    counts: np.ndarray | None
    offload: np.ndarray | None
    step_time: float
    peaks: np.ndarray
    base_step_time: float
    evaluations: int
    accepted: int
    seconds: float
    complete: bool

    @property
    def improved(self) -> bool:
        """Whether the result is strictly faster than the start."""
        return self.step_time < self.base_step_time


class _Evaluator:
    """Exact figures of (counts, offload) on one setup, from the rounded per-layer coefficients."""

    def __init__(self, profile: Profile, config: PipelineConfig) -> None:
        self.coef = layer_coefficients(profile, config)
        self.program = config.program()
        self.bandwidth = config.host_bandwidth
        self.budget = config.memory_budget
        self.evaluations = 0
        # seconds one evaluation is expected to take: an estimate from the program's size until
        # one was measured (the first also builds the program's cached transfer pairs)
        self.expected = EVALUATION_SECONDS_PER_OP * len(self.program.graph.op_kind)

    def affordable(self, until: float) -> bool:
        """Whether one more evaluation is expected to end by ``until`` (a ``perf_counter`` time)."""
        return time.perf_counter() + self.expected <= until

    def __call__(self, counts: np.ndarray, offload: np.ndarray) -> tuple[float, np.ndarray, float, float]:
        """(step ms, peaks MB, recompute ms summed over stages, offloaded MB per micro-batch summed)."""
        began = time.perf_counter()
        try:
            return self._evaluate(counts, offload)
        finally:
            self.expected = time.perf_counter() - began

    def _evaluate(self, counts: np.ndarray, offload: np.ndarray) -> tuple[float, np.ndarray, float, float]:
        tot = self.coef.per_stage(counts)
        off_units = np.einsum("gv,g->v", offload, self.coef.activation[:, _NONE])
        self.evaluations += 1
        sim = simulate(
            self.program,
            forward=tot["forward"] * TIME_UNIT_MS,
            backward=tot["backward"] * TIME_UNIT_MS,
            weight=tot["weight"] * TIME_UNIT_MS,
            activation=tot["activation"] * MEMORY_UNIT_MB,
            params=tot["params"] * MEMORY_UNIT_MB,
            offloaded=off_units * MEMORY_UNIT_MB,
            host_bandwidth=self.bandwidth,
            comm=self.coef.comm * TIME_UNIT_MS,
            constant=self.coef.constant * MEMORY_UNIT_MB,
        )
        step, peaks = sim.step_time, sim.peak_memory.to_numpy()
        return step, peaks, float(tot["overhead"].sum()) * TIME_UNIT_MS, float(off_units.sum()) * MEMORY_UNIT_MB

    def fits(self, peaks: np.ndarray) -> bool:
        return fits_budget(peaks, self.budget)


def _moves(counts: np.ndarray, offload: np.ndarray, convertible: np.ndarray, movable: np.ndarray,
           keep_nonempty: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Candidate (counts, offload) pairs around the current one, the most promising first."""
    G, R, V = counts.shape
    # convert one layer of mode r on every virtual stage that has one
    for g in range(G):
        for r in range(R):
            if not convertible[g, r] or not counts[g, r].any():
                continue
            c, o = counts.copy(), offload.copy()
            has = c[g, r] > 0
            c[g, r, has] -= 1
            c[g, _NONE, has] += 1
            o[g, has] += 1
            yield c, o
    # per virtual stage: all of mode r, one of mode r, each with one more resident layer offloaded if possible
    for v in range(V):
        for g in range(G):
            for r in range(R):
                n = int(counts[g, r, v])
                if not convertible[g, r] or n == 0:
                    continue
                for k in (n, 1) if n > 1 else (1,):
                    c, o = counts.copy(), offload.copy()
                    c[g, r, v] -= k
                    c[g, _NONE, v] += k
                    o[g, v] += k
                    yield c, o
                    if c[g, _NONE, v] > o[g, v]:
                        o2 = o.copy()
                        o2[g, v] += 1
                        yield c, o2
    # shifts: one layer to the neighbouring virtual stage in model order
    layers = counts.sum(axis=(0, 1))
    for v in range(V - 1):
        for src, dst in ((v, v + 1), (v + 1, v)):
            if layers[src] == 1 and keep_nonempty[src]:
                continue
            present_src = np.flatnonzero(counts[:, :, src].sum(axis=1))
            present_dst = np.flatnonzero(counts[:, :, dst].sum(axis=1))
            for g in present_src:
                # groups stay contiguous in model order: moving right takes the last group of src and
                # needs no earlier group on dst; moving left the reverse
                if dst > src and (present_src.max() != g or (len(present_dst) and present_dst.min() < g)):
                    continue
                if dst < src and (present_src.min() != g or (len(present_dst) and present_dst.max() > g)):
                    continue
                for r in range(R):
                    if not movable[g, r] or counts[g, r, src] == 0:
                        continue
                    resident = counts[g, r, src] - (offload[g, src] if r == _NONE else 0)
                    for offloaded in (False, True) if r == _NONE else (False,):
                        if offloaded and offload[g, src] == 0:
                            continue
                        if not offloaded and resident == 0:
                            continue
                        c, o = counts.copy(), offload.copy()
                        c[g, r, src] -= 1
                        c[g, r, dst] += 1
                        if offloaded:
                            o[g, src] -= 1
                            o[g, dst] += 1
                        yield c, o
    # keep an offloaded layer's activation on the device
    for v in range(V):
        for g in range(G):
            if offload[g, v] > 0:
                o = offload.copy()
                o[g, v] -= 1
                yield counts, o


def offload_search(
    profile: Profile,
    config: PipelineConfig,
    counts: np.ndarray | None,
    *,
    deadline: float,
    stop: threading.Event | None = None,
    allow_empty_stages: bool = False,
    starts: Sequence[np.ndarray | tuple[np.ndarray, np.ndarray]] = (),
) -> OffloadResult:
    """Improve ``counts`` (a plan that fits, no offload) with offload choices; see the module docstring.

    ``counts`` may be None (no plan fits without offload): then only ``starts`` are searched,
    ``base_step_time`` is infinite, and ``counts``/``offload`` of the result are None when no
    start fits either.

    ``starts``: further assignments (same shape; typically the plan balanced without a memory
    budget) to search from, each with every mode-``"none"`` layer offloaded; one that does not
    fit that way, or uses a mode the config does not allow, is skipped. A start may also be a
    pair ``(counts, offload)`` (a plan with offload, e.g. of a smaller budget): then its own
    offload is kept. They are searched
    first, with half the time left each, then ``counts``; the best result of all is returned,
    never worse than ``counts``.
    ``deadline`` is a :func:`time.perf_counter` time: the search starts no candidate simulation
    it does not expect to end by it (:data:`EVALUATION_SECONDS_PER_OP` until one was timed; with
    no time for one, the result has ``evaluations == 0`` and is not an improvement).
    ``config.host_bandwidth`` must be set.
    """
    began = time.perf_counter()
    ev = _Evaluator(profile, config)
    coef = ev.coef
    shape = coef.shape
    if not ev.affordable(deadline) or (stop is not None and stop.is_set()):  # not even one simulation
        return OffloadResult(counts=None, offload=None, step_time=math.inf, peaks=np.full(config.stages, math.inf),
                             base_step_time=math.inf, evaluations=0, accepted=0,
                             seconds=time.perf_counter() - began, complete=False)
    if counts is None:
        base = _Point(None, None, (math.inf, math.inf, math.inf), np.full(config.stages, math.inf))
    else:
        base_c = np.array(counts, dtype=np.int64, copy=True)
        zero = np.zeros((shape[0], shape[2]), dtype=np.int64)
        step, peaks, overhead, traffic = ev(base_c, zero)
        base = _Point(base_c, zero, (step, overhead, traffic), peaks)
    can_offload = coef.available[:, _NONE]
    space = _Space(
        convertible=(coef.allowed & can_offload[:, None]) & (np.arange(len(MODES)) != _NONE)[None, :],
        movable=coef.allowed | (can_offload[:, None] & (np.arange(len(MODES)) == _NONE)[None, :]),
        keep_nonempty=np.full(shape[2], not allow_empty_stages) & (coef.fixed_layers == 0),
    )

    def out_of_time(until: float) -> bool:
        return not ev.affordable(until) or (stop is not None and stop.is_set())

    best, accepted, complete = base, 0, True
    for extra in starts:
        given = extra[1] if isinstance(extra, tuple) else None
        c = np.array(extra[0] if isinstance(extra, tuple) else extra, dtype=np.int64, copy=True)
        if c.shape != shape or out_of_time(deadline) or (c.sum(axis=2) > 0)[~space.movable].any():
            continue  # another setup's, out of time, or a mode the config does not allow
        if given is None:
            o = c[:, _NONE, :] * can_offload[:, None]
        else:
            o = np.array(given, dtype=np.int64, copy=True)
            if o.shape != (shape[0], shape[2]) or (o < 0).any() or (o > c[:, _NONE, :]).any():
                continue
        step, peaks, overhead, traffic = ev(c, o)
        if not ev.fits(peaks):
            continue
        until = time.perf_counter() + (deadline - time.perf_counter()) / 2
        point = _Point(c, o, (step, overhead, traffic), peaks)
        found, n, done = _local(ev, space, point, lambda u=until: out_of_time(u))
        accepted += n
        complete &= done
        best = min(best, found, key=lambda pt: pt.key)
    n, done = 0, True
    if base.counts is not None:
        found, n, done = _local(ev, space, base, lambda: out_of_time(deadline))
        best = min(best, found, key=lambda pt: pt.key)
    return OffloadResult(
        counts=best.counts,
        offload=best.offload,
        step_time=best.key[0],
        peaks=best.peaks,
        base_step_time=base.key[0],
        evaluations=ev.evaluations,
        accepted=accepted + n,
        seconds=time.perf_counter() - began,
        complete=complete and done,
    )


@dataclass(frozen=True)
class _Point:
    counts: np.ndarray | None
    offload: np.ndarray | None
    key: tuple[float, float, float]  # step ms, recompute ms, offloaded MB
    peaks: np.ndarray


@dataclass(frozen=True)
class _Space:
    convertible: np.ndarray  # (G, R): layers of this mode may become offloaded "none" layers
    movable: np.ndarray  # (G, R): layers of this mode may move between neighbouring stages
    keep_nonempty: np.ndarray  # (V,): a stage that must keep a body layer


def _local(ev: _Evaluator, space: _Space, start: _Point, out_of_time: Callable[[], bool]) -> tuple[_Point, int, bool]:
    """First-improvement local search from ``start`` (which fits): (best point, moves taken, finished)."""
    cur = start
    accepted = 0
    resume = 0  # after a move, the next scan starts where the last one took it (then wraps around)
    while not out_of_time():
        moves = list(_moves(cur.counts, cur.offload, space.convertible, space.movable, space.keep_nonempty))
        resume = min(resume, len(moves))
        taken = None
        for i in [*range(resume, len(moves)), *range(resume)]:
            if out_of_time():
                return cur, accepted, False
            c, o = moves[i]
            step, peaks, overhead, traffic = ev(c, o)
            key = (step, overhead, traffic)
            if key < cur.key and ev.fits(peaks):
                cur = _Point(c, o, key, peaks)
                accepted += 1
                taken = i
                break
        if taken is None:
            return cur, accepted, True
        resume = taken
    return cur, accepted, False

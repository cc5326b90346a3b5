"""A choice's run: every setup bounded, then a queue by bound, one step per state.

::

    ENUMERATED ─► BOUNDED ─► TIGHTENED ─► INTEGER ─► BALANCED ─► PROVING ─► RETRIED ─► DECIDED
        │            │            │           │           │           │
        invalid   infeasible   (pruned: bound ≥ best step time, whenever it is first in the queue)

:meth:`ChoiceRun.run_queue` is the scheduler: after every setup is bounded
(:meth:`~ChoiceRun.bound_all`), while the queue's first bound is below the best step time and the clock allows, fills a
batch (:meth:`~ChoiceRun.fill_batch`: each setup taken from the queue makes one step of its
state and goes back, or joins the batch) and balances it (:class:`~sapptk.choosing.balancing.Balancer`).
The steps:

* :meth:`~ChoiceRun.step_tighten` (``BOUNDED`` → ``TIGHTENED`` → ``INTEGER``): whole layouts
  below the best step time, or LP path rows when the layouts are too many, then the integer
  model; branching on whole layers below the best.
* :meth:`~ChoiceRun.step_retighten` (``INTEGER``, again): a tightening below a better best
  step time, or on from a goal it stopped at, or more path rows.
* :meth:`~ChoiceRun.step_balanced` (``BALANCED`` → ``PROVING`` → ``RETRIED``): a longer layout
  bound below the best step time, then (within ``RETRY_WITHIN`` of the best) a second balance.

Each tightening stops at a goal: the best step time, or ``AHEAD`` past the next setup's bound
in the queue (a setup that is no longer first may be pruned before it is first again).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sapptk.choosing.bounds import FIRST_ROUNDS, ROW_ROUNDS, ROW_TIME, SetupBound, pipeline_bound, work_bound
from sapptk.choosing.branching import BRANCH_TIME, branch_bound
from sapptk.choosing.integer_bound import integer_bound
from sapptk.choosing.layout_bound import layout_bound
from sapptk.choosing.records import sync_floor, twin_key
from sapptk.choosing.result import TIE
from sapptk.choosing.setups import Candidate
from sapptk.choosing.state import SetupState, Twin
from sapptk.config import MAX_PROGRAM_OPS, program_ops
from sapptk.errors import SapptkError
from sapptk.solver.clock import Clock
from sapptk.sweeps.grid import profile_digest

__all__ = ["AHEAD", "RETRY_WITHIN", "STEPS", "TIE", "ChoiceRun"]

S = SetupState
STEPS: tuple[str, ...] = ("bound", "tighten", "balance", "prove", "retry", "other")
"""The steps of :attr:`Choice.timings <sapptk.choosing.result.Choice.timings>`: first bounds, bound
tightenings before a balance (and again below a better incumbent), first balances, the longer
layout bounds of balanced setups, second balances, and the rest (setup, cache, plans)."""

AHEAD = 0.01
"""A bound tightened before any balance stops once it is this share past the next setup's bound
in the queue (or at the best step time): then another setup is first, and this one is tightened
again only when it is first again."""

RETRY_WITHIN = 0.02
"""A balanced setup is balanced a second time only when its bound is within this share of the
best step time: a second balance at twice the time limit raised the balancer's bound by 1-1.5 %
of the step on the llama2_70b two-chunk setups (docs/benchmarks.md); farther ones stay unproven."""


class ChoiceRun:
    """The queue of one choice and its state: the candidates, their twins, the best step time
    and its holder, the clock and the seconds spent by step (:data:`STEPS`)."""

    def __init__(self, candidates: list[Candidate], *, clock: Clock, balancer: Any, dp_bandwidth: float | None,
                 bound_time: float, retry: float, prove: bool, tighten: bool, batch: int, deterministic: bool,
                 done: Callable[[Candidate, str], None]) -> None:
        self.candidates, self.clock, self.balancer = candidates, clock, balancer
        self.bw, self.bound_time, self.retry = dp_bandwidth, bound_time, retry
        self.prove, self.tighten, self.batch, self.deterministic = prove, tighten, batch, deterministic
        self.done = done
        self.spent = dict.fromkeys(STEPS, 0.0)
        self.heap: list[tuple[float, int]] = []
        self.twins: dict[tuple[Any, ...], Twin] = {}
        self.digests: dict[int, str] = {}  # profile digests by id, for the twin keys
        self.best = math.inf
        self.leader: int | None = None  # the candidate holding the best step time
        self.parked: list[tuple[float, int]] = []  # the leader's own entry: it needs no proof against itself
        self.stalled: list[tuple[float, int]] = []  # balanced with a gap, nothing left to try below this best

    # ------------------------------------------------------------------ the scheduler
    def run_queue(self) -> None:
        """After :meth:`bound_all`: fill and balance batches until the queue is decided (or the
        clock says stop); the setups left in the queue are then pruned or undecided."""
        while self.heap and not self.clock.expired():
            chosen = self.fill_batch()
            if not chosen:
                break
            self.balancer.balance(self, chosen)

    def fill_batch(self) -> list[int]:
        """Setups to balance now: each one first in the queue makes its state's step and goes
        back, until ``batch`` need a balance (one before any step time is known, when tightening:
        the second would be balanced without the first's step time to prune it)."""
        chosen: list[int] = []
        solves = 0  # setups of this batch that need a balance (a twin already balanced takes its result)
        deferred: list[tuple[float, int]] = []  # twins of a setup in this batch: they take its result
        limit = self.batch if self.best < math.inf or not self.tighten else 1
        while self.heap and solves < limit and not self.clock.expired():
            lower, i = self.heap[0]
            if lower >= self.best * (1 - TIE):
                break
            heapq.heappop(self.heap)
            c = self.candidates[i]
            if not self.step(c, i, lower):
                continue
            if any(self.candidates[j].twin is c.twin for j in chosen):
                deferred.append((lower, i))
                continue
            chosen.append(i)
            solves += (c.twin.retry_result if c.retry else c.twin.result) is None
        for item in deferred:
            heapq.heappush(self.heap, item)
        return chosen

    def step(self, c: Candidate, i: int, lower: float) -> bool:
        """One step of ``c`` by its state; True when it is to be balanced in this batch."""
        if c.balanced:
            return self.step_balanced(c, i, lower)
        if c.state is S.ENUMERATED:
            self.step_bound(c, i)
            return False
        if self.first_bounds_near(lower):  # the goal below is then measured against their LP bounds
            self.push(c, i)
            return False
        twin = c.twin
        if twin.bound is not c.bound and twin.bound.bound_ms is not None:
            c.bound, c.layouts = twin.bound, twin.layouts  # a twin tightened the bound they share
            if twin.bound.bound_ms + c.sync_floor_ms > c.lower_ms:
                self.push(c, i, twin.bound.bound_ms + c.sync_floor_ms)
                return False
        # how far to tighten now: past the next setup in the queue by AHEAD (then this one is no
        # longer first and may never be needed again), at most to the best step time
        goal = self.best - c.sync_floor_ms if self.deterministic else (
            min(self.best, max(self.heap[0][0] if self.heap else math.inf, lower * (1 + AHEAD))) - c.sync_floor_ms)
        if c.state is S.INTEGER and twin.result is None and (
                self.best - c.sync_floor_ms < twin.layout_ub * (1 - TIE) or twin.short or not twin.rows_done):
            self.step_retighten(c, i, goal)
            return False
        if self.tighten and c.state < S.INTEGER and twin.result is None:
            self.step_tighten(c, i, goal)
            return False
        return True

    def first_bounds_near(self, lower: float) -> bool:
        """Before a setup at ``lower`` is tightened: the first LP bound of every setup first in the
        queue at a work bound within ``AHEAD`` of it (True if there was any). A tightening stops
        at a goal past the next setup's bound; a work bound there would stop it too early."""
        near, any_ = lower * (1 + AHEAD), False
        while self.heap and self.heap[0][0] <= near and not self.clock.expired():
            j = self.heap[0][1]
            if self.candidates[j].state is not S.ENUMERATED:
                break
            heapq.heappop(self.heap)
            self.step_bound(self.candidates[j], j)
            any_ = True
        return any_

    def push(self, c: Candidate, i: int, lower_ms: float | None = None) -> None:
        """Back into the queue at its bound (raised to ``lower_ms``)."""
        if lower_ms is not None:
            c.lower_ms = max(c.lower_ms, lower_ms)
        heapq.heappush(self.heap, (c.lower_ms, i))

    @contextmanager
    def timed(self, step: str, c: Candidate) -> Iterator[None]:
        """Book the wall time of a step to :data:`STEPS` and to the setup's ``bound_seconds``."""
        t0 = self.clock.now()
        try:
            yield
        finally:
            dt = self.clock.now() - t0
            self.spent[step] += dt
            c.row["bound_seconds"] = c.row.get("bound_seconds", 0.0) + dt

    # ------------------------------------------------------------------ ENUMERATED -> BOUNDED
    def bound_all(self) -> None:
        """Every setup checked (invalid ones decided) and queued at its work bound
        (:func:`~sapptk.choosing.bounds.work_bound`, no program built); its first LP bound
        (:meth:`step_bound`) waits until it is first in the queue, so a setup whose work alone
        reaches the best step time is pruned without one."""
        for i, c in enumerate(self.candidates):
            if self.clock.expired():  # stopped (or out of time) before this setup was bounded
                continue
            with self.timed("bound", c):
                try:
                    cfg = c.setup.config
                    cfg.check(c.profile)
                    if program_ops(cfg.schedule, cfg.stages, cfg.micro_batches, cfg.chunks, cfg.splits) \
                            > MAX_PROGRAM_OPS:
                        cfg.program()  # refused, with the program's size, before anything is built
                    work = work_bound(c.profile, cfg)
                except SapptkError as exc:
                    c.row["reason"] = str(exc)
                    self.decide(c, "invalid")
                    continue
                c.state = S.ENUMERATED
                c.sync_floor_ms = sync_floor(c, self.bw)
                c.lower_ms = work + c.sync_floor_ms
                heapq.heappush(self.heap, (c.lower_ms, i))

    def step_bound(self, c: Candidate, i: int) -> None:
        """``ENUMERATED`` → ``BOUNDED``: the first LP bound (shared by its twins); an infeasible
        setup is decided."""
        with self.timed("bound", c):
            try:
                key = twin_key(c, self.digests.setdefault(id(c.profile), profile_digest(c.profile)))
                if key not in self.twins:
                    first = pipeline_bound(c.profile, c.setup.config, max_rounds=1,
                                           deterministic=self.deterministic, clock=self.clock)
                    self.twins[key] = Twin(first)
                c.twin = self.twins[key]
                c.bound, c.state = c.twin.bound, S.BOUNDED
            except SapptkError as exc:
                c.row["reason"] = str(exc)
                self.decide(c, "invalid")
                return
        if c.bound.infeasible:
            c.row["reason"] = c.bound.reason
            c.row["excess_mb"] = c.bound.excess_mb
            self.decide(c, "infeasible")
        else:
            self.push(c, i, float(c.bound.bound_ms) + c.sync_floor_ms)

    def decide(self, c: Candidate, status: str) -> None:
        """``c`` leaves the queue with ``status``."""
        c.state = S.DECIDED
        self.done(c, status)

    # ------------------------------------------------------------------ BOUNDED -> TIGHTENED -> INTEGER
    def branch(self, c: Candidate, start: SetupBound, ub: float) -> SetupBound:
        """``start`` raised by branching on whole layers below ``ub`` (pipeline ms); timed, so not
        with ``deterministic``, and nothing to branch against without an incumbent."""
        if self.deterministic or not math.isfinite(ub):
            return start
        return branch_bound(c.profile, c.setup.config, start, ub, time_limit=BRANCH_TIME * self.bound_time,
                            clock=self.clock)

    def note_goal(self, c: Candidate, goal: float) -> None:
        """Note whether the twin's bound stopped at ``goal`` (pipeline ms) below the best step time."""
        ms = c.twin.bound.bound_ms
        c.twin.short = (ms is not None and goal < (self.best - c.sync_floor_ms) * (1 - TIE)
                        and ms >= goal * (1 - TIE))

    def layouts(self, c: Candidate, start: SetupBound, ub: float, seconds: float, goal: float = math.inf
                ) -> SetupBound | None:
        return layout_bound(c.profile, c.setup.config, start, ub, time_limit=seconds, deterministic=self.deterministic,
                            enough_ms=goal, memo=c.twin.memo, clock=self.clock)

    def step_tighten(self, c: Candidate, i: int, goal: float) -> None:
        """``BOUNDED`` → ``TIGHTENED``: whole layouts (the strong bound, where they can be
        enumerated), else LP path rows; ``TIGHTENED`` → ``INTEGER``: the integer model. A twin
        already that far lends its bound."""
        twin, ub = c.twin, self.best - c.sync_floor_ms
        with self.timed("tighten", c):
            c.state = S(c.state + 1)
            if twin.level < c.state == S.TIGHTENED:
                tight = self.layouts(c, twin.bound, ub, self.bound_time, goal)
                if tight is None:  # too many layouts: path rows (the integer model next, then more rows)
                    quick = self.deterministic or self.best == math.inf
                    rows = pipeline_bound(c.profile, c.setup.config, max_rounds=FIRST_ROUNDS if quick else ROW_ROUNDS,
                                          time_limit=(1.0 if quick else ROW_TIME) * self.bound_time,
                                          deterministic=self.deterministic, enough_ms=goal, start=twin.bound,
                                          clock=self.clock)
                    twin.rows_done = self.deterministic or (not quick and rows.bound_ms < goal * (1 - TIE))
                    twin.set_bound(rows, S.TIGHTENED)
                else:  # whole layouts make the integer model needless
                    twin.set_bound(tight, S.INTEGER)
                twin.layouts = tight is not None
                twin.layout_ub = ub
                self.note_goal(c, goal)
                if not twin.short:  # whole layers per device, below the best
                    twin.set_bound(self.branch(c, twin.bound, ub))
            elif twin.level < c.state == S.INTEGER:
                twin.set_bound(integer_bound(c.profile, c.setup.config, twin.bound, time_limit=self.bound_time,
                                             deterministic=self.deterministic, clock=self.clock,
                                             enough_ms=math.inf if self.deterministic else goal), S.INTEGER)
            c.bound, c.layouts = twin.bound, twin.layouts
            c.state = max(c.state, twin.level)
        if c.bound.infeasible:
            c.row["reason"] = c.bound.reason
            self.decide(c, "infeasible")
            return
        self.push(c, i, float(c.bound.bound_ms) + c.sync_floor_ms)

    def step_retighten(self, c: Candidate, i: int, goal: float) -> None:
        """``INTEGER`` again: its layout bound was capped by a worse incumbent (or none), so the
        layouts are fewer now; or it stopped at a goal below the best step time and is first
        again; or its path LP (too many layouts) has not converged yet."""
        twin, ub = c.twin, self.best - c.sync_floor_ms
        with self.timed("tighten", c):
            if c.bound is twin.bound:
                more_rows = not twin.rows_done
                tight = None
                if ub < twin.layout_ub * (1 - TIE) or twin.layouts:
                    tight = self.layouts(c, c.bound, ub, self.bound_time, goal)
                    twin.layout_ub = ub
                    if tight is not None:
                        twin.set_bound(tight, S.INTEGER)
                        twin.layouts = True
                        twin.rows_done = True  # the layouts bound it now: no more path rows
                if tight is None and more_rows:  # more path rows, from every path found so far
                    rows = pipeline_bound(c.profile, c.setup.config, max_rounds=ROW_ROUNDS,
                                          time_limit=ROW_TIME * self.bound_time, enough_ms=goal, start=twin.bound,
                                          clock=self.clock)
                    twin.rows_done = rows.bound_ms < goal * (1 - TIE)  # converged, or out of time
                    twin.set_bound(rows, S.INTEGER)
                self.note_goal(c, goal)
                if not twin.short:  # whole layers per device, below the better best
                    twin.set_bound(self.branch(c, twin.bound, ub), S.INTEGER)
            c.bound, c.layouts = twin.bound, twin.layouts
        self.push(c, i, float(c.bound.bound_ms) + c.sync_floor_ms)

    # ------------------------------------------------------------------ BALANCED -> PROVING -> RETRIED
    def step_balanced(self, c: Candidate, i: int, lower: float) -> bool:
        """A balanced setup with a gap and a bound below the best: a longer layout bound below the
        best step time (again below a better best); then, within ``RETRY_WITHIN`` of the best, a
        second balance (True: balance it now); else it keeps its gap."""
        twin, ub = c.twin, self.best - c.sync_floor_ms
        if i == self.leader:
            self.parked.append((lower, i))
            return False
        if c.state is S.BALANCED or (c.state >= S.PROVING and not self.deterministic
                                     and ub < twin.long_ub * (1 - TIE)):
            c.state = max(c.state, S.PROVING)
            if not c.layouts and self.deterministic:  # too many layouts: a longer bound would not
                heapq.heappush(self.heap, (lower, i))  # enumerate them either
                return False
            with self.timed("prove", c):
                if twin.long_bound is None or ub < twin.long_ub * (1 - TIE):
                    twin.long_ub = ub
                    # the layouts again: also when they were too many below an earlier, worse best
                    # (fewer fit below this one)
                    tight = self.layouts(c, c.bound, ub, 4 * self.bound_time) \
                        if c.layouts or ub < twin.layout_ub * (1 - TIE) else None
                    if tight is not None and not c.layouts:
                        twin.layouts = c.layouts = True
                    if not c.layouts:
                        twin.layout_ub = ub
                    twin.long_bound = self.branch(c, c.bound if tight is None else tight, ub)
                c.bound = twin.long_bound
            self.push(c, i, float(c.bound.bound_ms) + c.sync_floor_ms)
            c.row["bound_ms"] = c.lower_ms
            return False
        if c.state is not S.PROVING or not self.retry or lower < self.best * (1 - RETRY_WITHIN):
            self.stalled.append((lower, i))  # bounded again below a better best, if one comes
            return False  # tried, or too far below to be proven by a longer balance: it keeps its gap
        c.state = S.RETRIED
        c.retry = True
        return True

    def balanced(self, i: int) -> None:
        """After a balance of candidate ``i`` (its row recorded): a better best step time brings
        back the parked and stalled setups; a balanced setup goes back into the queue to be proven."""
        c = self.candidates[i]
        step = c.row.get("step_time_ms")
        if step is not None and math.isfinite(step) and step < self.best:
            self.best, self.leader = step, i
            for item in self.parked + self.stalled:  # the old leader must now be proven slower like the rest
                heapq.heappush(self.heap, item)
            self.parked.clear()
            self.stalled.clear()
        if c.retry:
            c.retry = False
        else:
            self.done(c, c.row["status"])
        if c.row["status"] == "balanced":
            if not c.balanced:
                c.balanced, c.state = True, S.BALANCED
            if self.prove:  # back in the queue: a longer bound, a second balance
                heapq.heappush(self.heap, (c.lower_ms, i))
        elif c.state is not S.DECIDED and not c.balanced:
            c.state = S.DECIDED

"""``choose``: which pipeline setup to run, balanced best-bound-first and pruned by proofs.

::

    setups ──► bound (LP, certified) ──► heap by bound ──► tighten (integer model) ──► balance in batches
                     │                                         │                        (sweep engine: serial,
                     └─ infeasible (device, MB)                └─ pruned: bound ≥ best      processes, Dask; cache)

1. Every setup gets a proven lower bound on its step time (:mod:`sapptk.choosing.bounds`:
   the work with the least recompute that fits and the schedule's fill and drain, from its
   program) plus the least DP synchronisation any of its plans has; a setup that nothing
   fits is dropped with the device and the shortfall.
2. The setups are taken in order of bound. A setup whose bound is at or above the best step
   time found so far is pruned (and so is every later one). Before a setup is balanced its
   bound is tightened by whole layouts below the best step time
   (:func:`~sapptk.choosing.layout_bound.layout_bound`, again after every better incumbent)
   or, when the layouts are too many, by LP rows, the integer model
   (:func:`~sapptk.choosing.bounds.integer_bound`) and more LP rows from the rows found so
   far; then by branching on whole layers. Each tightening stops at a goal: the best step
   time, or ``_AHEAD`` past the next setup's bound in the queue, since a setup that is no
   longer first may be pruned before it is first again (then it is tightened on from there).
3. Survivors are balanced ``batch`` at a time (one until the first step time is known, when
   tightening) through
   the sweep engine's executors
   (:func:`sapptk.sweeps.solving.solve_point`), each starting from the fastest plan so far of
   the same shape (stages and chunks); a ``cache`` folder keeps every balanced row (Parquet),
   so an interrupted choice resumes. The batches do not depend on the executor, so serial,
   processes and Dask give the same frame (with ``deterministic=True``, the same plans).
4. A balanced setup whose bound stays below the best step time goes back into the queue:
   a longer layout bound, then (within ``_RETRY_WITHIN`` of the best) a second balance from
   its own plan with ``retry × time_limit``. With ``prove=False`` it keeps its gap.
5. The winner is proven when every other setup's bound (the balancer's own bound included)
   is at or above its step time.

The module is over 500 lines because the queue loop of steps 2-4 is one state machine whose
state (the heap, the twins' bounds and results, the best step time and its holder, the seeds,
the clock of :data:`STEPS`, parked and stalled entries) every step reads and changes; split into functions, each would
take most of that state as arguments.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from numbers import Real
from typing import Any

import numpy as np

from sapptk import checks
from sapptk.choosing.bounds import FIRST_ROUNDS, ROW_ROUNDS, ROW_TIME, SetupBound, integer_bound, pipeline_bound
from sapptk.choosing.branching import BRANCH_TIME, branch_bound
from sapptk.choosing.cards import hardware_bandwidth, is_model_card
from sapptk.choosing.layout_bound import layout_bound
from sapptk.choosing.records import all_infeasible, candidate_of, record, record_retry, sync_floor, twin_key
from sapptk.choosing.result import Choice, typed_choice
from sapptk.choosing.setups import (
    DEFAULT_GRADIENT_SHARE,
    Candidate,
    enumerate_setups,
)
from sapptk.errors import ConfigError, SapptkError
from sapptk.profile import resolve_profile
from sapptk.request import SolveRequest
from sapptk.solver.clock import Clock
from sapptk.sweeps.cache import LAYOUT_COLUMN, Cache
from sapptk.sweeps.executors import check_executor, default_workers, open_executor
from sapptk.sweeps.frame import input_row
from sapptk.sweeps.grid import CONFIG_FIELDS, point_key, profile_digest
from sapptk.sweeps.solving import Layout, PointResult, SweepTask, no_plan, solve_point

__all__ = ["STEPS", "choose", "choose_candidates"]

_TIE = 1e-9  # relative: a bound within this of the best step time counts as reaching it
STEPS: tuple[str, ...] = ("bound", "tighten", "balance", "prove", "retry", "other")
"""The steps of :attr:`Choice.timings <sapptk.choosing.result.Choice.timings>`: first bounds, bound
tightenings before a balance (and again below a better incumbent), first balances, the longer
layout bounds of balanced setups, second balances, and the rest (setup, cache, plans)."""

_AHEAD = 0.01
"""A bound tightened before any balance stops once it is this share past the next setup's bound
in the queue (or at the best step time): then another setup is first, and this one is tightened
again only when it is first again."""

_RETRY_WITHIN = 0.02
"""A balanced setup is balanced a second time only when its bound is within this share of the
best step time: a second balance at twice the time limit raised the balancer's bound by 1-1.5 %
of the step on the llama2_70b two-chunk setups (docs/benchmarks.md); farther ones stay unproven."""


def _check_float(name: str, value: Any, *, allow_none: bool = True, low: float = 0.0) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)) or value <= low:
        tail = " or None" if allow_none else ""
        raise ConfigError(f"{name} = {value!r}: expected a finite number > {low:g}{tail}")
    return float(value)


def choose(
    source: Any,
    *,
    devices: int,
    global_batch: int,
    memory_budget: float | None,
    micro_batch_size: int = 1,
    hardware: Any = None,
    schedules: Sequence[str] | None = None,
    stages: Sequence[int] | None = None,
    chunks: Sequence[int] | None = None,
    max_chunks: int = 4,
    recompute: Sequence[str] | None = None,
    constant_memory: float = 0,
    comm: float = 0,
    dp_bandwidth: float | None = None,
    gradient_share: float = DEFAULT_GRADIENT_SHARE,
    sequence_length: int | None = None,
    time_limit: float = 20.0,
    bound_time: float = 1.0,
    retry: float = 2.0,
    prove: bool = True,
    tighten: bool = True,
    batch: int = 2,
    executor: Any = "serial",
    workers: int | None = None,
    cache: Any = None,
    progress: bool = False,
    seed: int = 0,
    deterministic: bool = False,
    stop: threading.Event | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    **parallel: Any,
) -> Choice:
    """The fastest pipeline setup for ``global_batch`` samples on ``devices`` devices.

    Parameters
    ----------
    source: a :class:`~sapptk.profile.Profile` (or a bundled profile name or file): the
        pipeline dimensions vary (schedule, stages p dividing ``devices``, chunks v,
        micro-batches ``global_batch / (dp · micro_batch_size)``, dp = devices / p). A model
        card (``sapptk.models``) with ``hardware=``: tensor, context and expert parallelism
        and the optimizer sharding vary too (``tp=``, ``cp=``, ``ep=``, ``zero=`` restrict
        them), each setup with its own estimated profile.
    memory_budget: MB per device (None: unlimited).
    schedules, stages, chunks: restrict the dimensions (None: every schedule whose order is
        fixed, every divisor of ``devices``, every chunk count a schedule accepts up to
        ``max_chunks``).
    recompute, constant_memory, comm: as in :class:`~sapptk.config.PipelineConfig`.
    dp_bandwidth: MB per ms of each device's link for the DP gradient all-reduce; None
        leaves the synchronisation out (and the result's notes say so). ``gradient_share``:
        gradient MB per parameter MB of a bare profile.
    sequence_length: tokens per sample, for ``tokens_per_s_per_device``.
    time_limit: seconds per balanced setup; ``bound_time``: seconds per bound tightening (a
        balanced setup whose bound stays below the best step time gets one of 4 × that).
    retry: a balanced setup still unproven after that is balanced once more from its own plan
        with ``retry × time_limit`` (0: never), best bound first.
    prove: False spends nothing on proving balanced setups that kept a gap (neither the longer
        layout bound nor the second balance): every setup is still decided (balanced, or pruned
        by a bound computed before it would be balanced), the winner is proven only when those
        bounds already prove it. For throughput over many choices.
    tighten: False balances every setup its first bound (the LP over device work, one round)
        does not prune, without tightening it first (LP paths, whole layouts, integer model):
        for time limits so short that a balance costs about what a tightening does.
    batch: setups balanced per round (one until a step time is known, unless ``tighten=False``;
        fixed, so every executor gives the same frame).
    executor, workers, cache, progress, seed, deterministic: as in :func:`sapptk.sweep`.
    stop: a :class:`threading.Event`; once set, the choice ends within about a second (with the
        serial executor; with processes or Dask, when the running balances end) and returns what
        it has: the setups decided so far keep their rows, the others are ``undecided``, and
        ``Choice.status`` is ``"stopped"``.
    on_progress: called with a dict after each setup is decided (balanced, pruned, infeasible,
        invalid): ``decided``, ``balanced``, ``pruned``, ``total`` (setups) and ``elapsed_s``.

    Raises :class:`~sapptk.errors.ConfigError` for a bad argument, a device count no stage
    count divides, a global batch no setup divides, an empty list, or when every setup is
    infeasible (naming the nearest one, its device and the MB it lacks).
    """
    clock = Clock(math.inf, stop)
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ConfigError(f"stop = {stop!r}: expected a threading.Event (or None)")
    if on_progress is not None and not callable(on_progress):
        raise ConfigError(f"on_progress = {on_progress!r}: expected a function of one dict (or None)")
    bw = _check_float("dp_bandwidth", dp_bandwidth)
    share = _check_float("gradient_share", gradient_share, allow_none=False)
    if sequence_length is not None and (isinstance(sequence_length, bool) or not isinstance(sequence_length, int)
                                        or sequence_length < 1):
        raise ConfigError(f"sequence_length = {sequence_length!r}: expected an integer >= 1 or None")
    checks.solver_arguments(time_limit=time_limit, workers=workers, seed=seed, deterministic=deterministic)
    _check_float("bound_time", bound_time, allow_none=False)
    if isinstance(retry, bool) or not isinstance(retry, Real) or not math.isfinite(retry) or retry < 0:
        raise ConfigError(f"retry = {retry!r}: expected a finite number >= 0 (0: no second balance)")
    for name, flag in (("prove", prove), ("tighten", tighten)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{name} = {flag!r}: expected True or False")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch = {batch!r}: expected an integer >= 1")
    check_executor(executor)
    shape = {"devices": devices, "global_batch": global_batch, "micro_batch_size": micro_batch_size,
             "schedules": schedules, "stages": stages, "chunks": chunks, "memory_budget": memory_budget,
             "constant_memory": constant_memory, "comm": comm, "recompute": recompute, "max_chunks": max_chunks}
    notes: list[str] = []
    if is_model_card(source):
        from sapptk.choosing.cards import card_candidates

        candidates, card_notes = card_candidates(source, hardware, shape, parallel)
        notes += card_notes
        if sequence_length is None:
            sequence_length = int(parallel.get("seq_length", 4096))
        if bw is None and hardware is not None:
            bw = hardware_bandwidth(hardware)
    else:
        if parallel:
            name = next(iter(parallel))
            raise ConfigError(f"{name} = {parallel[name]!r}: only a model card varies tp, cp, ep or zero; a profile "
                              "fixes them (choose(card, hardware=...) to vary them)")
        if hardware is not None:
            raise ConfigError("hardware: only a model card takes a hardware card; a profile already holds the costs")
        profile = resolve_profile(source)
        candidates = [Candidate(setup=s, profile=profile, gradient_share=share)
                      for s in enumerate_setups(**shape)]
    if bw is None:
        notes.append("no DP gradient synchronisation counted (give dp_bandwidth= in MB/ms to count it)")
    return choose_candidates(candidates, global_batch=int(global_batch), devices=int(devices), dp_bandwidth=bw,
                             sequence_length=sequence_length, time_limit=float(time_limit),
                             bound_time=float(bound_time), retry=float(retry), prove=prove, tighten=tighten,
                             batch=batch, executor=executor, workers=workers,
                             cache=cache, progress=progress, seed=seed, deterministic=deterministic,
                             notes=notes, clock=clock, on_progress=on_progress)


def choose_candidates(
    candidates: list[Candidate],
    *,
    global_batch: int,
    devices: int,
    dp_bandwidth: float | None,
    sequence_length: int | None,
    time_limit: float,
    bound_time: float,
    batch: int,
    executor: Any,
    retry: float = 2.0,
    prove: bool = True,
    tighten: bool = True,
    workers: int | None,
    cache: Any,
    progress: bool,
    seed: int,
    deterministic: bool,
    notes: list[str],
    clock: Clock,
    on_row: Callable[[Candidate], None] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> Choice:
    """The engine behind :func:`choose` (see the module docstring), on prepared candidates."""
    from tqdm.auto import tqdm

    from sapptk.plan import make_plan

    extra = tuple(dict.fromkeys(k for c in candidates for k in c.columns))
    options = {"time_limit": float(time_limit), "seed": int(seed), "deterministic": bool(deterministic)}
    heap: list[tuple[float, int]] = []
    with ExitStack() as stack:
        bar = stack.enter_context(tqdm(total=len(candidates), desc="choose", unit="setup", disable=not progress))
        tally = {"balanced": 0, "pruned": 0, "infeasible": 0, "invalid": 0}

        def done(c: Candidate, status: str) -> None:
            c.row["status"] = status
            tally[status] = tally.get(status, 0) + 1
            bar.set_postfix(tally, refresh=False)
            bar.update()
            if on_row is not None:
                on_row(c)
            if on_progress is not None:
                decided = sum(n for k, n in tally.items() if k != "undecided")
                on_progress({"decided": decided, "balanced": tally["balanced"], "pruned": tally["pruned"],
                             "infeasible": tally["infeasible"], "invalid": tally["invalid"],
                             "total": len(candidates), "elapsed_s": clock.elapsed()})

        spent = dict.fromkeys(STEPS, 0.0)  # wall seconds by step (Choice.timings)

        digests: dict[int, str] = {}
        twins: dict[tuple[Any, ...], tuple[SetupBound, int]] = {}  # (bound, level) by program and profile
        for i, c in enumerate(candidates):
            cfg = c.setup.config
            c.row = {"schedule": cfg.schedule, "stages": cfg.stages, "chunks": cfg.chunks,
                     "micro_batches": cfg.micro_batches, "dp": c.setup.dp, **c.columns,
                     "memory_budget_mb": math.nan if cfg.memory_budget is None else cfg.memory_budget}
            if clock.expired():  # stopped (or out of time) before this setup was bounded
                continue
            t0 = clock.now()
            try:
                cfg.check(c.profile)
                c.twin = twin_key(c, digests.setdefault(id(c.profile), profile_digest(c.profile)))
                if c.twin not in twins:
                    twins[c.twin] = (pipeline_bound(c.profile, cfg, max_rounds=1, deterministic=deterministic,
                                                    clock=clock), 0)
                c.bound, c.level = twins[c.twin]
            except SapptkError as exc:
                c.row["reason"] = str(exc)
                done(c, "invalid")
                continue
            c.row["bound_seconds"] = clock.now() - t0
            spent["bound"] += c.row["bound_seconds"]
            if c.bound.infeasible:
                c.row["reason"] = c.bound.reason
                c.row["excess_mb"] = c.bound.excess_mb
                done(c, "infeasible")
                continue
            c.sync_floor_ms = sync_floor(c, dp_bandwidth)
            c.lower_ms = float(c.bound.bound_ms) + c.sync_floor_ms
            heapq.heappush(heap, (c.lower_ms, i))

        if not heap and not clock.expired():
            all_infeasible(candidates)

        store = Cache(cache) if cache is not None else None
        cached: dict[str, dict[str, Any]] = {}
        if store is not None:
            frame = store.read()
            if len(frame):
                for rec in frame[~frame["status"].astype(object).eq("error")].to_dict("records"):
                    cached[rec["key"]] = rec
            store.open()
            stack.callback(store.close)
        runner = None
        twin_results: dict[tuple[Any, ...], PointResult] = {}  # balanced results by program and profile
        retry_results: dict[tuple[Any, ...], PointResult] = {}  # the same, of the longer second balance
        long_bounds: dict[tuple[Any, ...], SetupBound] = {}  # the longer layout bound of a balanced setup
        long_ub: dict[tuple[Any, ...], float] = {}  # the incumbent (pipeline ms) it was computed below
        layouts_of: dict[tuple[Any, ...], bool] = {}  # whether the layout bound could enumerate the layouts
        layout_ub: dict[tuple[Any, ...], float] = {}  # the incumbent (pipeline ms) it was computed below
        best = math.inf
        leader: int | None = None  # the candidate holding the best step time
        parked: list[tuple[float, int]] = []  # the leader's own queue entry: it needs no proof against itself
        stalled: list[tuple[float, int]] = []  # balanced with a gap, nothing left to try below this best
        seeds: dict[tuple[int, int, int], tuple[float, list]] = {}
        short: dict[tuple[Any, ...], bool] = {}  # its last tightening stopped at a goal below the best step time
        memos: dict[tuple[Any, ...], dict[str, Any]] = {}  # layout_bound's problem and paths, by twin
        rows_done: dict[tuple[Any, ...], bool] = {}  # its path LP converged, or ran out of time (no layouts)

        def stop(c: Candidate, goal: float) -> None:
            """Note whether the twin's bound stopped at ``goal`` (pipeline ms) below the best step time."""
            ms = twins[c.twin][0].bound_ms
            short[c.twin] = (ms is not None and goal < (best - c.sync_floor_ms) * (1 - _TIE)
                             and ms >= goal * (1 - _TIE))

        def branch(c: Candidate, start: SetupBound, ub: float) -> SetupBound:
            """``start`` raised by branching on whole layers below ``ub`` (pipeline ms); timed, so
            not with ``deterministic``, and nothing to branch against without an incumbent."""
            if deterministic or not math.isfinite(ub):
                return start
            return branch_bound(c.profile, c.setup.config, start, ub, time_limit=BRANCH_TIME * bound_time,
                                clock=clock)

        while heap and not clock.expired():
            chosen: list[int] = []
            solves = 0  # setups of this batch that need a balance (a twin already balanced takes its result)
            deferred: list[tuple[float, int]] = []  # twins of a setup in this batch: they take its result
            # before any step time is known, one balance at a time: the second of a batch would be balanced
            # without the first's step time to prune it (on llama2_70b, a 10 s balance of a loser); not
            # with tighten=False, where hardly anything is pruned and a round less counts more
            while heap and solves < (batch if best < math.inf or not tighten else 1) and not clock.expired():
                lower, i = heap[0]
                if lower >= best * (1 - _TIE):
                    break
                heapq.heappop(heap)
                c = candidates[i]
                if c.balanced:  # balanced with a gap and a bound below the best: prove it, or improve it
                    if i == leader:
                        parked.append((lower, i))
                        continue
                    if c.level == 3 or (c.level >= 4 and not deterministic and best - c.sync_floor_ms
                                        < long_ub.get(c.twin, math.inf) * (1 - _TIE)):
                        # a longer bound below the best step time (again below a better best)
                        c.level = max(c.level, 4)
                        if not c.layouts and deterministic:  # too many layouts: a longer bound would not
                            heapq.heappush(heap, (lower, i))  # enumerate them either
                            continue
                        t0 = clock.now()
                        if c.twin not in long_bounds or best - c.sync_floor_ms < long_ub[c.twin] * (1 - _TIE):
                            long_ub[c.twin] = best - c.sync_floor_ms
                            tight = layout_bound(c.profile, c.setup.config, c.bound, best - c.sync_floor_ms,
                                                 time_limit=4 * bound_time, deterministic=deterministic,
                                                 memo=memos.setdefault(c.twin, {}), clock=clock) if c.layouts else None
                            long_bounds[c.twin] = branch(c, c.bound if tight is None else tight,
                                                         best - c.sync_floor_ms)
                        c.bound = long_bounds[c.twin]
                        dt = clock.now() - t0
                        spent["prove"] += dt
                        c.row["bound_seconds"] = c.row.get("bound_seconds", 0.0) + dt
                        c.lower_ms = max(c.lower_ms, float(c.bound.bound_ms) + c.sync_floor_ms)
                        c.row["bound_ms"] = c.lower_ms
                        heapq.heappush(heap, (c.lower_ms, i))
                        continue
                    if c.level != 4 or not retry or lower < best * (1 - _RETRY_WITHIN):
                        stalled.append((lower, i))  # bounded again below a better best, if one comes
                        continue  # tried, or too far below to be proven by a longer balance: it keeps its gap
                    c.level = 5
                    c.retry = True
                shared = twins[c.twin][0] if not c.balanced and c.twin in twins else None
                if shared is not None and shared is not c.bound and shared.bound_ms is not None:
                    c.bound = shared  # a twin tightened the bound they share
                    c.layouts = layouts_of.get(c.twin, False)
                    if shared.bound_ms + c.sync_floor_ms > c.lower_ms:
                        c.lower_ms = shared.bound_ms + c.sync_floor_ms
                        heapq.heappush(heap, (c.lower_ms, i))
                        continue
                # how far to tighten now: past the next setup in the queue by _AHEAD (then this one
                # is no longer first and may never be needed again), at most to the best step time
                goal = best - c.sync_floor_ms if deterministic else (
                    min(best, max(heap[0][0] if heap else math.inf, lower * (1 + _AHEAD))) - c.sync_floor_ms)
                more_rows = not rows_done.get(c.twin, True)
                if (c.level == 2 and c.twin not in twin_results
                        and (best - c.sync_floor_ms < layout_ub.get(c.twin, math.inf) * (1 - _TIE)
                             or short.get(c.twin, False) or more_rows)):
                    # its layout bound was capped by a worse incumbent (or none), so the layouts are fewer
                    # now; or it stopped at a goal below the best step time and is first again; or its
                    # path LP (too many layouts) has not converged yet
                    t0 = clock.now()
                    if c.bound is twins[c.twin][0]:
                        ub = best - c.sync_floor_ms
                        tight = None
                        if ub < layout_ub.get(c.twin, math.inf) * (1 - _TIE) or layouts_of.get(c.twin, False):
                            tight = layout_bound(c.profile, c.setup.config, c.bound, ub, time_limit=bound_time,
                                                 deterministic=deterministic, enough_ms=goal,
                                                 memo=memos.setdefault(c.twin, {}), clock=clock)
                            layout_ub[c.twin] = ub
                            if tight is not None:
                                twins[c.twin] = (tight, 2)
                                layouts_of[c.twin] = True
                                rows_done[c.twin] = True  # the layouts bound it now: no more path rows
                        if tight is None and more_rows:  # more path rows, from every path found so far
                            rows = pipeline_bound(c.profile, c.setup.config, max_rounds=ROW_ROUNDS,
                                                  time_limit=ROW_TIME * bound_time, enough_ms=goal,
                                                  start=twins[c.twin][0], clock=clock)
                            rows_done[c.twin] = rows.bound_ms < goal * (1 - _TIE)  # converged, or out of time
                            twins[c.twin] = (rows, 2)
                        stop(c, goal)
                        if not short[c.twin]:  # whole layers per device, below the better best
                            twins[c.twin] = (branch(c, twins[c.twin][0], ub), 2)
                    c.bound = twins[c.twin][0]
                    c.layouts = layouts_of.get(c.twin, False)
                    dt = clock.now() - t0
                    spent["tighten"] += dt
                    c.row["bound_seconds"] = c.row.get("bound_seconds", 0.0) + dt
                    c.lower_ms = max(c.lower_ms, float(c.bound.bound_ms) + c.sync_floor_ms)
                    heapq.heappush(heap, (c.lower_ms, i))
                    continue
                if tighten and c.level < 2 and c.twin not in twin_results:
                    t0 = clock.now()
                    c.level += 1
                    bound, level = twins[c.twin]
                    if level < c.level == 1:
                        # whole layouts first: where they can be enumerated, they are the strong bound
                        tight = layout_bound(c.profile, c.setup.config, bound, best - c.sync_floor_ms,
                                             time_limit=bound_time, deterministic=deterministic, enough_ms=goal,
                                             memo=memos.setdefault(c.twin, {}), clock=clock)
                        if tight is None:  # too many layouts: path rows (the integer model next, then more rows)
                            quick = deterministic or best == math.inf
                            rows = pipeline_bound(c.profile, c.setup.config,
                                                  max_rounds=FIRST_ROUNDS if quick else ROW_ROUNDS,
                                                  time_limit=(1.0 if quick else ROW_TIME) * bound_time,
                                                  deterministic=deterministic, enough_ms=goal, start=bound,
                                                  clock=clock)
                            rows_done[c.twin] = deterministic or (not quick and rows.bound_ms < goal * (1 - _TIE))
                        # whole layouts (when they could be enumerated) make the integer model needless
                        twins[c.twin] = (rows, 1) if tight is None else (tight, 2)
                        layouts_of[c.twin] = tight is not None
                        layout_ub[c.twin] = best - c.sync_floor_ms
                        stop(c, goal)
                        if not short[c.twin]:  # whole layers per device, below the best
                            twins[c.twin] = (branch(c, twins[c.twin][0], best - c.sync_floor_ms), twins[c.twin][1])
                    elif level < c.level == 2:
                        twins[c.twin] = (integer_bound(c.profile, c.setup.config, bound, time_limit=bound_time,
                                                       deterministic=deterministic, clock=clock), 2)
                    c.bound, level = twins[c.twin]
                    c.layouts = layouts_of.get(c.twin, False)
                    c.level = max(c.level, level)
                    dt = clock.now() - t0
                    spent["tighten"] += dt
                    c.row["bound_seconds"] = c.row.get("bound_seconds", 0.0) + dt
                    if c.bound.infeasible:
                        c.row["reason"] = c.bound.reason
                        done(c, "infeasible")
                        continue
                    c.lower_ms = max(c.lower_ms, float(c.bound.bound_ms) + c.sync_floor_ms)
                    heapq.heappush(heap, (c.lower_ms, i))
                    continue
                if any(candidates[j].twin == c.twin for j in chosen):
                    deferred.append((lower, i))
                    continue
                chosen.append(i)
                solves += c.twin not in (retry_results if c.retry else twin_results)
            for item in deferred:
                heapq.heappush(heap, item)
            if not chosen:
                break
            tasks = []
            for i in chosen:
                c = candidates[i]
                cfg = c.setup.config
                digest = digests.setdefault(id(c.profile), profile_digest(c.profile))
                fields = {f: getattr(cfg, f) for f in CONFIG_FIELDS}
                opts = {**options, "time_limit": retry * options["time_limit"]} if c.retry else options
                key = point_key(c.profile.name, digest, fields, opts)
                c.row["key"] = key
                shape_key = (cfg.stages, cfg.chunks, len(c.profile.body))
                if c.retry and c.counts is not None:
                    start = Layout(c.counts)  # its own plan: the second balance starts where the first ended
                else:
                    start = Layout(seeds[shape_key][1]) if shape_key in seeds else None
                tasks.append((key, c, digest, start))
            results: dict[str, PointResult] = {}
            for i, (key, _c, _d, _s) in zip(chosen, tasks, strict=True):
                done_twins = retry_results if candidates[i].retry else twin_results
                if candidates[i].twin in done_twins and key not in cached:
                    results[key] = done_twins[candidates[i].twin]
            left = [t for t in tasks if t[0] not in cached and t[0] not in results]
            for key, _c, _d, _s in tasks:
                if key in cached:
                    rec = cached[key]
                    results[key] = PointResult.from_row(rec, Layout.from_json(rec.get(LAYOUT_COLUMN)))
            if left:
                if runner is None:
                    # sized for a whole batch, though the first may hold fewer setups
                    runner, slots = open_executor(executor, (left * batch)[:batch], solve_point, workers, stack)
                    per_solve = workers or default_workers(min(slots, batch))
                todo = []
                for key, c, digest, start in left:
                    try:
                        opts = {**options, "time_limit": retry * options["time_limit"]} if c.retry else options
                        request = SolveRequest(c.profile, c.setup.config, workers=per_solve, stop=clock.stop, **opts)
                    except SapptkError as exc:
                        results[key] = no_plan(key, "invalid", str(exc))
                        continue
                    todo.append(SweepTask(key, c.profile.name, digest, request, start))
                t0 = clock.now()
                it = runner(todo, lambda r: None)
                try:
                    for res in it:
                        results[res.key] = res
                        if store is not None and res.status != "error" and not clock.stopped:
                            owner = candidate_of(candidates, chosen, res.key)
                            row = {**input_row(owner.profile.name,
                                               {f: getattr(owner.setup.config, f) for f in CONFIG_FIELDS},
                                               time_limit),
                                   **res.columns(), "key": res.key,
                                   LAYOUT_COLUMN: None if res.layout is None else res.layout.to_json()}
                            store.append(row)
                finally:
                    it.close()
                    _share_wall(spent, clock.now() - t0,
                                [(results.get(key), c.retry) for key, c, _d, _s in left])
            for i in chosen:  # in batch order: the same frame whatever the executor
                c = candidates[i]
                res = results.get(c.row["key"], no_plan(c.row["key"], "error", "not run"))
                done_twins = retry_results if c.retry else twin_results
                if c.twin not in done_twins and res.status != "error":
                    done_twins[c.twin] = res
                if c.retry:
                    record_retry(c, res, dp_bandwidth)
                else:
                    record(c, res, dp_bandwidth)
                if c.row.get("step_time_ms") is not None and math.isfinite(c.row["step_time_ms"]):
                    cfg = c.setup.config
                    shape_key = (cfg.stages, cfg.chunks, len(c.profile.body))
                    better = shape_key not in seeds or c.row["pipeline_ms"] < seeds[shape_key][0]
                    if better and res.layout is not None:
                        seeds[shape_key] = (c.row["pipeline_ms"], res.layout.counts)
                    if c.row["step_time_ms"] < best:
                        best, leader = c.row["step_time_ms"], i
                        for item in parked + stalled:  # the old leader must now be proven slower like the rest
                            heapq.heappush(heap, item)
                        parked.clear()
                        stalled.clear()
                if c.retry:
                    c.retry = False
                else:
                    done(c, c.row["status"])
                if c.row["status"] == "balanced":
                    if not c.balanced:
                        c.balanced, c.level = True, 3
                    if prove:  # back in the queue: a longer bound, a second balance
                        heapq.heappush(heap, (c.lower_ms, i))
        status = "stopped" if clock.stopped else "complete"
        for _lower, i in heap:
            c = candidates[i]
            if c.balanced:
                continue
            c.row["bound_ms"] = c.lower_ms
            if c.lower_ms < best * (1 - _TIE):  # the queue was left early: not proven slower
                c.row["reason"] = "stopped before it was decided"
                done(c, "undecided")
                continue
            c.row["reason"] = (f"pruned: proven bound {c.lower_ms:,.1f} ms >= best step time {best:,.1f} ms"
                               if best < math.inf else "not balanced")
            done(c, "pruned")
        for c in candidates:  # never bounded: the call was stopped first
            if "status" not in c.row:
                c.row["reason"] = "stopped before it was bounded"
                done(c, "undecided")
        if store is not None:
            store.compact()

    for c in candidates:
        if c.row.get("status") in ("balanced", "unsolved", "pruned"):
            c.row.setdefault("bound_ms", c.lower_ms)
        if c.row.get("status") == "balanced":
            step = c.row["step_time_ms"]
            c.row["gap"] = max(0.0, (step - c.row["bound_ms"]) / step) if step else 0.0
            c.row["samples_per_s_per_device"] = global_batch / (step / 1000.0) / devices
            if sequence_length is not None:
                c.row["tokens_per_s_per_device"] = c.row["samples_per_s_per_device"] * sequence_length
    balanced = [c for c in candidates if c.row.get("status") == "balanced"]
    if not balanced and status == "stopped":
        frame = typed_choice([c.row for c in candidates], extra)
        return Choice(frame=frame, best=None, proven=False, plans={}, seconds=clock.elapsed(), notes=notes,
                      timings=spent, status=status)
    if not balanced:
        reasons = "; ".join(sorted({str(c.row.get("reason")) for c in candidates})[:3])
        raise ConfigError(f"choose: no setup could be balanced within time_limit = {time_limit:g} s ({reasons})")
    winner = min(balanced, key=lambda c: (c.row["step_time_ms"], candidates.index(c)))
    best = winner.row["step_time_ms"]
    proven = all(c is winner or c.row.get("status") in ("infeasible", "invalid")
                 or (c.row.get("bound_ms") is not None and c.row["bound_ms"] >= best * (1 - _TIE))
                 for c in candidates)
    frame = typed_choice([c.row for c in candidates], extra)
    plans: dict[int, Any] = {}
    by_key = {c.row.get("key"): c for c in balanced}
    for idx, key in zip(frame.index, frame["key"], strict=True):
        c = by_key.get(key)
        if c is not None and frame.at[idx, "status"] == "balanced":
            plans[int(idx)] = make_plan(
                c.profile, c.setup.config, np.asarray(c.counts, dtype=np.int64), status=c.row["solver_status"],
                step_time=c.row["pipeline_ms"], bound=c.row.get("solver_bound_ms"), gap=c.row.get("solver_gap"),
                solve_seconds=c.row.get("solve_seconds") or 0.0, source=f"choose: {c.setup.label}")
    best_plan = plans[int(frame.index[0])]
    seconds = clock.elapsed()
    spent["other"] = max(0.0, seconds - sum(spent.values()))
    return Choice(frame=frame, best=best_plan, proven=proven, plans=plans, seconds=seconds, notes=notes,
                  timings=spent, status=status)


def _share_wall(spent: dict[str, float], wall: float, solves: list[tuple[PointResult | None, bool]]) -> None:
    """Book a batch's wall time to ``balance`` and ``retry`` in proportion to the seconds of its
    first and second balances (``(result, is_retry)`` each; in processes they overlap)."""
    seconds = {"balance": 0.0, "retry": 0.0}
    for res, is_retry in solves:
        seconds["retry" if is_retry else "balance"] += (res.solve_seconds or 0.0) if res is not None else 0.0
    total = sum(seconds.values())
    for step, sec in seconds.items():
        spent[step] += wall * (sec / total) if total else (wall if step == "balance" else 0.0)

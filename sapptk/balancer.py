"""``balance(profile, config, ...)`` → :class:`~sapptk.plan.Plan`: the public face of the search.

It checks every argument at the boundary (a :class:`~sapptk.errors.ConfigError` naming the
argument and its value, before any solving), runs :func:`sapptk.solver.search.search`, and
wraps what it found in a plan. A cost-driven schedule (its order depends on the op costs,
``zb-v-greedy``) is balanced together with its order (:func:`reorder_until_stable`). How the
search works, what its status, bound and gap mean, its options and its limits:
``docs/solver.md``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.errors import ConfigError
from sapptk.solver.settings import SearchOptions

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["MAX_SEED", "MAX_WORKERS", "OFFLOAD_BASE_SHARE", "OFFLOAD_FREE_SHARE", "REORDER_ROUNDS", "balance",
           "check_arguments", "reorder_until_stable", "with_offload"]

MAX_WORKERS = 64
"""Most CP-SAT worker threads a call may ask for."""

MAX_SEED = 2**31 - 1
"""Largest random seed (CP-SAT's seed is a 32-bit signed integer)."""


def balance(
    profile: Profile,
    config: PipelineConfig,
    *,
    time_limit: float = 30.0,
    workers: int = 2,
    seed: int = 0,
    deterministic: bool = False,
    allow_empty_stages: bool = False,
    start: Plan | np.ndarray | None = None,
    stop: threading.Event | None = None,
    options: SearchOptions | None = None,
    memory_margin: float | None = None,
    oom_risk: float | None = None,
    memory_error: Any = None,
    per_micro_batch: bool = False,
    stall_time: float | None = None,
    choose_splits: bool = False,
) -> Plan:
    """The plan with the shortest simulated step time that fits the memory budget.

    Parameters
    ----------
    profile, config: the model and the pipeline setup (validated first).
    time_limit: wall-clock seconds for the whole call, a finite number > 0. The call
        returns within about a second past it, at every size.
    workers: CP-SAT worker threads, 1 to :data:`MAX_WORKERS`.
    seed: random seed of the local search and CP-SAT, 0 to :data:`MAX_SEED`.
    deterministic: one sequential CP-SAT worker (``workers`` ignored) and a local search
        that counts its work instead of timing it, so the same input gives the same plan
        as long as the time limit does not cut the search short.
    allow_empty_stages: let virtual stages hold no body layer.
    start: a plan (or its counts array) for the same profile and the same schedule, stages,
        micro-batches, chunks and splits — for instance the plan of a smaller budget. It
        seeds the search when it fits this config's budget and recompute modes, so the
        answer is never slower than it; otherwise it is ignored (the message says so). A
        start plan with offload seeds the offload search with its own offload.
    stop: a :class:`threading.Event`; once set (from another thread), the search returns its
        best plan so far within about a second.
    options: the search's knobs (:class:`~sapptk.solver.settings.SearchOptions`).
    stall_time: seconds, or None (the default): return early, status ``feasible`` unless
        proven, once the search holds a plan that has not improved for this long
        (``SearchOptions.stall_time``; this keyword overrides it). Wall-clock, so with
        ``deterministic=True`` where it stops may vary. The message says when it stopped so.
    memory_margin, oom_risk, memory_error: plan for a safe budget below
        ``config.memory_budget`` (:func:`sapptk.sensitivity.robust_budget`): ``memory_margin``
        MB (>= 1) or a fraction of the budget (< 1) kept free on every device; ``oom_risk``
        the largest accepted chance that a device exceeds its budget when the memory figures
        are off by ``memory_error`` (a relative error, or a calibration / its residuals).
        The plan keeps ``config`` (so ``fits`` is against the real budget) and its message
        names the safe budget it was solved for.
    per_micro_batch: also let chosen micro-batches of a virtual stage recompute less
        (:mod:`sapptk.solver.micro_batches`): the per-stage search gets three quarters of
        the time limit, then an exact greedy search moves micro-batches to a second layout while the
        budget holds; the result is kept only when its simulation fits and is faster, so the
        plan is never slower than the per-stage plan it started from. The plan then carries
        an :class:`~sapptk.costs.AlternativeLayout` and its ``message`` says what was gained.

    With ``"offload"`` in ``config.recompute`` the usual solve gets :data:`OFFLOAD_BASE_SHARE`
    of the time, a solve without the memory budget :data:`OFFLOAD_FREE_SHARE`, and
    :func:`with_offload` the rest (from both plans): the plan may then send some mode-``"none"``
    layers' activations to host memory (``plan.offload``), when that is faster and fits.

    Returns
    -------
    A :class:`~sapptk.plan.Plan` with ``status`` "optimal" (step time proven optimal),
    "feasible" (time limit or stop came first; ``bound`` and ``gap`` say how far it may be
    from optimal), "infeasible" (nothing fits; ``message`` names the device and the
    shortfall) or "unknown" (no plan found in time). ``step_time`` is the simulated step
    time of the plan; ``bound`` a proven lower bound on the optimum.

    Raises
    ------
    ConfigError: a bad argument, or a config that does not suit the profile.
    """
    from sapptk.plan import Plan, make_plan
    from sapptk.schedules import get
    from sapptk.solver.search import search

    if stall_time is not None:
        if not isinstance(stall_time, Real) or isinstance(stall_time, bool) or not math.isfinite(stall_time) \
                or stall_time <= 0:
            raise ConfigError(f"stall_time = {stall_time!r}: expected a finite number of seconds > 0 (or None)")
        if options is not None and not isinstance(options, SearchOptions):
            raise ConfigError(f"options = {options!r}: expected a sapptk.SearchOptions (or None)")
        options = dataclasses.replace(options or SearchOptions(), stall_time=float(stall_time))
    safe_config, safety = safe_budget_config(config, memory_margin=memory_margin, oom_risk=oom_risk,
                                             memory_error=memory_error)
    counts = check_arguments(profile, safe_config, time_limit=time_limit, workers=workers, seed=seed,
                             deterministic=deterministic, allow_empty_stages=allow_empty_stages, start=start,
                             stop=stop, options=options)
    if not isinstance(per_micro_batch, (bool, np.bool_)):
        raise ConfigError(f"per_micro_batch = {per_micro_batch!r}: expected True or False")
    from sapptk.seq import is_sliced

    if not isinstance(choose_splits, (bool, np.bool_)):
        raise ConfigError(f"choose_splits = {choose_splits!r}: expected True or False")
    if choose_splits and not is_sliced(profile, config):
        raise ConfigError(f"choose_splits = True: splits = {config.splits} on profile {profile.name!r} (seq_length = "
                          f"{profile.seq_length}): expected k > 1 sequence slices and a profile with seq_length")
    if is_sliced(profile, config):
        from sapptk.config import OFFLOAD

        if per_micro_batch or OFFLOAD in config.recompute:
            lever = "per_micro_batch = True" if per_micro_batch else f"{OFFLOAD!r} in config.recompute"
            raise ConfigError(f"{lever}: not modelled with the sequence slices of a long-context profile "
                              f"(seq_length = {profile.seq_length}); expected per-stage recompute without offload")
        from sapptk.seq import solver_profile
        from sapptk.solver.slices import balance_sliced

        return balance_sliced(profile, safe_config, config, safety, time_limit=float(time_limit),
                               choose_splits=bool(choose_splits), deterministic=bool(deterministic),
                               given=lambda cfg, c: make_plan(profile, cfg, c, status="given"),
                               solve=lambda cfg, ratio, limit: balance(
                                   solver_profile(profile, ratio), cfg.replace(slice_lengths=None), time_limit=limit,
                                   workers=workers, seed=seed, deterministic=deterministic,
                                   allow_empty_stages=allow_empty_stages, start=counts, stop=stop, options=options))
    if per_micro_batch:
        from sapptk.config import OFFLOAD

        if OFFLOAD in config.recompute:
            raise ConfigError(f"per_micro_batch = True with {OFFLOAD!r} in config.recompute: expected one of the two "
                              "(a plan either offloads activations or varies its recompute per micro-batch)")
        return _balance_per_micro_batch(profile, config, time_limit=float(time_limit), stop=stop,
                                        budget=safe_config.memory_budget,
                                        solve=lambda limit: balance(
                                            profile, config, time_limit=limit, workers=workers, seed=seed,
                                            deterministic=deterministic, allow_empty_stages=allow_empty_stages,
                                            start=start, stop=stop, options=options, memory_margin=memory_margin,
                                            oom_risk=oom_risk, memory_error=memory_error))

    def solve_plan(cfg: PipelineConfig, limit: float, seed_counts: np.ndarray | None) -> Plan:
        res = search(
            profile, cfg, time_limit=limit, workers=int(workers), seed=int(seed), deterministic=bool(deterministic),
            allow_empty_stages=bool(allow_empty_stages), start=seed_counts, stop=stop, options=options,
        )
        return make_plan(
            profile,
            cfg,
            res.counts,
            status=res.status,
            step_time=res.step_time,
            bound=res.bound,
            gap=res.gap,
            solve_seconds=res.seconds,
            message=res.message,
            source="balance",
        )

    from sapptk.config import OFFLOAD

    began = time.perf_counter()
    offload = OFFLOAD in config.recompute
    limit = float(time_limit) * (OFFLOAD_BASE_SHARE if offload else 1.0)
    if config.custom_program is None and get(config.schedule).cost_driven:
        plan = reorder_until_stable(safe_config, solve_plan, time_limit=limit, start=counts, stop=stop)
    else:
        plan = solve_plan(safe_config, limit, counts)
    if offload:  # against the safe budget, when one was asked for
        starts = []
        if safe_config.memory_budget is not None and not (stop is not None and stop.is_set()):
            # the plan without a budget: offloading its activations may make it fit (even when nothing else does)
            free = solve_plan(plan.config.replace(memory_budget=None), float(time_limit) * OFFLOAD_FREE_SHARE, None)
            if free.solved:
                starts.append(np.asarray(free.counts))
        if isinstance(start, Plan) and start.offload is not None and start.profile == profile:
            starts.insert(0, (np.asarray(counts), np.asarray(start.offload)))  # its own offload, kept
        if not plan.solved:  # nothing fits without offload: the even splits are starts too
            from sapptk.baselines import distinct_recomputes, even_split

            starts += [even_split(profile, safe_config, mode) for mode in distinct_recomputes(profile, safe_config)
                       if mode in safe_config.recompute]
        plan = with_offload(plan, deadline=began + float(time_limit), stop=stop,
                            allow_empty_stages=bool(allow_empty_stages), starts=starts)
    if safety is None:
        return plan
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, memory_budget=config.memory_budget),
                               message=f"{safety}; {plan.message}" if plan.message else safety)


def safe_budget_config(
    config: Any, *, memory_margin: Any = None, oom_risk: Any = None, memory_error: Any = None
) -> tuple[Any, str | None]:
    """``config`` with the safe budget of :func:`sapptk.sensitivity.robust_budget`, and a note
    naming it (None, and ``config`` itself, when no safety was asked for)."""
    from sapptk.config import PipelineConfig

    if memory_margin is None and oom_risk is None and memory_error is None:
        return config, None
    if not isinstance(config, PipelineConfig):
        raise ConfigError(f"config = {_show(config)}: expected a sapptk PipelineConfig")
    from sapptk.sensitivity import robust_budget

    safe = robust_budget(config, memory_margin=memory_margin, oom_risk=oom_risk, memory_error=memory_error)
    asked = []
    if memory_margin is not None:
        asked.append(f"memory_margin={memory_margin!r}")
    if oom_risk is not None:
        asked.append(f"oom_risk={oom_risk!r}")
    note = (f"solved for a safe budget of {safe:.6g} MB per device ({', '.join(asked)}) "
            f"under the {config.memory_budget:.6g} MB budget")
    return dataclasses.replace(config, memory_budget=safe), note


OFFLOAD_BASE_SHARE = 0.45
"""With ``"offload"`` in ``recompute``: the share of the time limit the usual solve gets."""

OFFLOAD_FREE_SHARE = 0.15
"""With ``"offload"`` in ``recompute``: the share of the time limit for the solve without a
memory budget, whose plan (every mode-``"none"`` layer offloaded) is a second start of the
offload search. The search has the rest, and whatever the solves leave unused."""


def with_offload(plan: Plan, *, deadline: float, stop: threading.Event | None = None,
                 allow_empty_stages: bool = False,
                 starts: Sequence[np.ndarray | tuple[np.ndarray, np.ndarray]] = ()) -> Plan:
    """``plan`` improved by activation offload (:func:`sapptk.solver.offload_search.offload_search`,
    also from the assignments ``starts`` with every mode-``"none"`` layer offloaded, or with
    their own offload when a start is a pair ``(counts, offload)``) until
    ``deadline`` (a ``time.perf_counter`` time) or ``stop``; the plan itself (with a note in its
    message) when that is not strictly faster. A plan with no assignment (infeasible without
    offload) or one that does not fit is searched from ``starts`` only. The offload plan's
    status is "feasible" with no bound: the solve's bound holds for plans without offload
    only. ``plan.config`` must allow offload (a host bandwidth)."""
    from sapptk.plan import make_plan
    from sapptk.solver.offload_search import offload_search

    usable = plan.solved and plan.fits
    if not usable and not starts:
        return plan
    if plan.config.host_bandwidth is None:
        raise ConfigError("with_offload: the plan's config has host_bandwidth = None: expected the host link's MB "
                          "per ms (config.replace(host_bandwidth=..., recompute=(..., 'offload')))")
    res = offload_search(plan.profile, plan.config, np.asarray(plan.counts) if usable else None, deadline=deadline,
                         stop=stop, allow_empty_stages=allow_empty_stages, starts=starts)
    how = "a local optimum" if res.complete else "cut short by the time limit or stop"
    before = f"{res.base_step_time:.6g} ms" if usable else f"no plan ({plan.status})"
    note = (f"activation offload: {res.evaluations} candidates simulated in {res.seconds:.1f} s ({how}); "
            f"step time {before} -> {res.step_time:.6g} ms")
    if res.evaluations == 0:
        note = "activation offload: not tried (no time left for one simulation of this setup, or stopped)"
    if not res.improved:
        kept = "kept without offload" if usable else "nothing fits with offload either"
        return dataclasses.replace(plan, message=f"{plan.message}; {note} (no faster plan: {kept})")
    offloaded = int(res.offload.sum())
    bound = (f"the solve's bound {_ms(plan.bound)} holds without offload only" if usable
             else "without offload nothing fits")
    return make_plan(
        plan.profile, plan.config, res.counts, status="feasible", step_time=res.step_time, bound=None, gap=None,
        solve_seconds=plan.solve_seconds + res.seconds, source=plan.source, offload=res.offload if offloaded else None,
        message=f"{plan.message}; {note}; {offloaded} layers offload their activations ({bound})",
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g} ms"


PER_STAGE_SHARE = 0.75
"""Share of ``time_limit`` the per-stage search gets under ``per_micro_batch=True``."""


def _balance_per_micro_batch(
    profile: Profile, config: PipelineConfig, *, time_limit: float, stop: Any, budget: float | None,
    solve: Callable[[float], Plan]
) -> Plan:
    """The per-stage plan (:data:`PER_STAGE_SHARE` of the time), then recompute per micro-batch on it (the rest)."""
    from sapptk.plan import make_plan
    from sapptk.solver.micro_batches import improve_per_micro_batch

    began = time.monotonic()
    deadline = began + time_limit
    plan = solve(time_limit * PER_STAGE_SHARE)
    if not plan.solved or not plan.fits or plan.offload is not None:
        return plan
    # against the budget the per-stage plan was solved for (the safe one under memory_margin / oom_risk)
    search_config = dataclasses.replace(plan.config, memory_budget=budget)
    found = improve_per_micro_batch(profile, search_config, plan.counts, deadline=deadline, stop=stop)
    note = f"{plan.message}; {found.message}" if plan.message else found.message
    seconds = time.monotonic() - began
    if found.alternative is not None:
        better = make_plan(profile, plan.config, found.counts, status="given", alternative=found.alternative)
        within = budget is None or bool((better.simulation.peak_memory.to_numpy() <= budget + 1e-6).all())
        if better.fits and within and better.step_time < plan.step_time:
            # the per-stage bound does not bound per-micro-batch plans: no bound, not proven
            return dataclasses.replace(better, status="feasible", bound=None, gap=None, solve_seconds=seconds,
                                       message=note, source=f"{plan.source} (per micro-batch)")
        note += "; its simulation did not confirm the gain, the per-stage plan is kept"
    return dataclasses.replace(plan, message=note, solve_seconds=seconds)


# ------------------------------------------------------------ cost-driven schedules
REORDER_ROUNDS = 4
"""At most this many re-orderings of a cost-driven schedule after the first balance."""


def reorder_until_stable(
    config: PipelineConfig,
    solve_plan: Callable[[PipelineConfig, float, np.ndarray | None], Plan],
    *,
    time_limit: float,
    start: np.ndarray | None = None,
    stop: threading.Event | None = None,
) -> Plan:
    """Balance a cost-driven schedule (``zb-v-greedy``) and its order together.

    The order of such a schedule depends on the op costs, and the costs on the plan. So:
    balance on the order built at unit costs; rebuild the order at the plan's per-stage
    costs (and comm); balance again on that fixed order (a setup carrying the program),
    seeded with the layout in hand (so a solve cut short never comes back slower than it);
    repeat while the step time improves and the order is new, at most
    :data:`REORDER_ROUNDS` times, or until ``stop`` is set. Each solve gets half the time
    left, so the whole loop keeps ``time_limit``. The plan returned carries the program it
    was balanced on; its ``bound`` and ``gap`` are for that fixed order.
    ``solve_plan(config, seconds, start_counts)`` is one balance.
    """
    from sapptk.schedules import OpCosts, build

    deadline = time.monotonic() + time_limit
    plan = solve_plan(config, time_limit / 2, start)
    orders = {config.program().units}
    steps = [plan.step_time]
    for _ in range(REORDER_ROUNDS):
        left = deadline - time.monotonic()
        if not plan.solved or left < 0.2 or (stop is not None and stop.is_set()):
            break
        c = plan.costs
        costs = OpCosts(tuple(c.forward), tuple(c.backward), tuple(c.weight), float(c.comm))
        program = build(config.schedule, stages=config.stages, micro_batches=config.micro_batches,
                        chunks=config.chunks, splits=config.splits, costs=costs)
        if program.units in orders:
            break  # the order is stable at these costs
        orders.add(program.units)
        candidate = solve_plan(config.with_program(program), left / 2, np.asarray(plan.counts))
        if not candidate.solved or candidate.step_time >= plan.step_time - 1e-9:
            break
        plan = candidate
        steps.append(plan.step_time)
    if len(steps) > 1:
        history = " -> ".join(f"{t:.6g}" for t in steps)
        note = f"order re-built at the plan's costs {len(steps) - 1} time(s); step time {history} ms"
        plan = dataclasses.replace(plan, message=f"{plan.message}; {note}", source="balance (re-ordered)")
    return plan


def check_arguments(
    profile: Profile,
    config: PipelineConfig,
    *,
    time_limit: Any,
    workers: Any,
    seed: Any,
    deterministic: Any,
    allow_empty_stages: Any,
    start: Any,
    stop: Any,
    options: Any,
) -> np.ndarray | None:
    """Check :func:`balance`'s arguments; return ``start`` as counts (or None).

    Raises :class:`~sapptk.errors.ConfigError` naming the argument, its value and what was
    expected. ``config`` is checked against ``profile`` here too.
    """
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

    if not isinstance(profile, Profile):
        raise ConfigError(f"profile = {_show(profile)}: expected a sapptk Profile (sapptk.load_profile(path))")
    if not isinstance(config, PipelineConfig):
        raise ConfigError(f"config = {_show(config)}: expected a sapptk PipelineConfig")
    if (not isinstance(time_limit, Real) or isinstance(time_limit, bool) or not math.isfinite(float(time_limit))
            or float(time_limit) <= 0):
        raise ConfigError(f"time_limit = {time_limit!r}: expected a finite number of seconds > 0")
    if not _integer(workers) or not 1 <= int(workers) <= MAX_WORKERS:
        raise ConfigError(f"workers = {workers!r}: expected an integer from 1 to {MAX_WORKERS}")
    if not _integer(seed) or not 0 <= int(seed) <= MAX_SEED:
        raise ConfigError(f"seed = {seed!r}: expected an integer from 0 to {MAX_SEED} (2**31 - 1)")
    for name, value in (("deterministic", deterministic), ("allow_empty_stages", allow_empty_stages)):
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(f"{name} = {value!r}: expected True or False")
    if stop is not None and not (callable(getattr(stop, "is_set", None))):
        raise ConfigError(f"stop = {_show(stop)}: expected a threading.Event (or None)")
    if options is not None and not isinstance(options, SearchOptions):
        raise ConfigError(f"options = {_show(options)}: expected a sapptk.SearchOptions (or None)")
    config.check(profile, allow_empty_stages=bool(allow_empty_stages))
    if start is None:
        return None
    return _start_counts(profile, config, start)


def _start_counts(profile: Profile, config: PipelineConfig, start: Any) -> np.ndarray:
    """The counts of a start plan, checked to be for this profile and program."""
    from sapptk.costs import check_counts
    from sapptk.plan import Plan

    if isinstance(start, Plan):
        if start.profile != profile:
            raise ConfigError(f"start: the plan is for profile {start.profile.name!r}, not for {profile.name!r}")
        keys = ("schedule", "stages", "micro_batches", "chunks", "splits")
        mine = {k: getattr(config, k) for k in keys}
        theirs = {k: getattr(start.config, k) for k in keys}
        if mine != theirs:
            diff = ", ".join(f"{k} = {theirs[k]!r} (expected {mine[k]!r})" for k in keys if mine[k] != theirs[k])
            raise ConfigError(f"start: the plan is for another pipeline: {diff}")
        if not start.solved:
            raise ConfigError(f"start: the plan has status {start.status!r} and no layer assignment")
        counts: Any = start.counts
    else:
        counts = start
    try:
        return check_counts(profile, config, counts).copy()
    except ConfigError as exc:
        raise ConfigError(f"start: {exc}") from exc


def _integer(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{type(value).__name__} object"

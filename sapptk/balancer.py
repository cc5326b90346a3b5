"""``balance(profile, config, ...)`` → :class:`~sapptk.plan.Plan`: the public face of the search.

``balance`` is a thin adapter: it builds a :class:`~sapptk.request.SolveRequest` (every
argument checked there, once: a :class:`~sapptk.errors.ConfigError` naming the argument and
its value, before any solving) and hands it to :func:`solve`. ``solve`` runs the request's
phases on one clock (:mod:`sapptk.solver.pipeline`: the per-stage search, with its order for
a cost-driven schedule; offload; recompute per micro-batch; sequence slices) and builds the
one :class:`~sapptk.plan.Plan` of the call from what the last phase found. How the search
works, what its status, bound and gap mean, its options and its limits: ``docs/solver.md``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.errors import ConfigError
from sapptk.request import SolveRequest
from sapptk.solver.clock import Clock
from sapptk.solver.settings import SearchOptions

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["balance", "solve", "with_offload"]


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

    ``solve(SolveRequest(profile, config, **keywords))``: the keywords are the fields of
    :class:`~sapptk.request.SolveRequest` (documented there and in ``docs/solver.md``);
    ``time_limit`` is one promise for the whole call, every lever included. Returns a plan with
    ``status`` "optimal", "feasible" (``bound`` and ``gap`` say how far from optimal it may be),
    "infeasible" (``message`` names the device and the shortfall) or "unknown" (no plan in
    time). Raises :class:`~sapptk.errors.ConfigError` for a bad argument.
    """
    return solve(SolveRequest(
        profile, config, time_limit=time_limit, workers=workers, seed=seed, deterministic=deterministic,
        allow_empty_stages=allow_empty_stages, start=start, stop=stop, options=options, memory_margin=memory_margin,
        oom_risk=oom_risk, memory_error=memory_error, per_micro_batch=per_micro_batch, stall_time=stall_time,
        choose_splits=choose_splits))


def solve(request: SolveRequest) -> Plan:
    """Run a checked :class:`~sapptk.request.SolveRequest`: its phases on one clock
    (:func:`sapptk.solver.pipeline.run`), then the one :class:`~sapptk.plan.Plan` of the call.

    The plan keeps ``request.config`` (so ``fits`` is against the real budget, even when a
    ``memory_margin`` or ``oom_risk`` asked for a safe one; its ``message`` then names the safe
    budget) with the program a cost-driven schedule was balanced on and the slice lengths
    chosen; ``solve_seconds`` is the wall time of the whole call.
    """
    if not isinstance(request, SolveRequest):
        checks.fail(ConfigError, "request", request, "a sapptk.SolveRequest")
    clock = Clock(request.time_limit, request.stop)  # started before the solver stack (OR-Tools) is imported
    from sapptk.plan import make_plan
    from sapptk.solver.interrupt import interruptible
    from sapptk.solver.pipeline import run

    def search(stop: Any) -> Any:
        clock.stop = stop  # the caller's event, or one that SIGINT sets too
        return run(request, clock)

    found, seconds = interruptible(search, request.stop)
    config = found.config
    if request.safety is not None:
        config = dataclasses.replace(config, memory_budget=request.config.memory_budget)
    message = "; ".join(m for m in (request.safety, found.message) if m)
    return make_plan(request.profile, config, found.counts, status=found.status, step_time=found.step_time,
                     bound=found.bound, gap=found.gap, solve_seconds=seconds, message=message, source=found.source,
                     offload=found.offload, alternative=found.alternative)


def with_offload(plan: Plan, *, deadline: float, stop: threading.Event | None = None,
                 allow_empty_stages: bool = False,
                 starts: Sequence[np.ndarray | tuple[np.ndarray, np.ndarray]] = ()) -> Plan:
    """``plan`` improved by activation offload until ``deadline`` (a ``time.perf_counter`` time)
    or ``stop``: the offload phase of :func:`solve` (:func:`sapptk.solver.pipeline.offload_from`)
    on a plan in hand, also from the assignments ``starts`` (every mode-``"none"`` layer
    offloaded, or a pair ``(counts, offload)`` keeping its own). The plan itself, with a note in
    its message, when that is not strictly faster; the offload plan's status is "feasible" with
    no bound. ``plan.config`` must allow offload (a host bandwidth)."""
    from sapptk.plan import make_plan
    from sapptk.solver.pipeline import Found, offload_from

    began = time.perf_counter()
    given = Found(plan.config, plan.status, np.asarray(plan.counts) if plan.solved else None, plan.step_time,
                  plan.bound, plan.gap, plan.message, plan.source)
    found = offload_from(plan.profile, given, deadline=deadline, stop=stop, allow_empty_stages=allow_empty_stages,
                         starts=starts)
    if found is given:
        return plan
    if found.offload is None and found.status == plan.status and found.step_time == plan.step_time:
        return dataclasses.replace(plan, message=found.message)
    return make_plan(plan.profile, plan.config, found.counts, status=found.status, step_time=found.step_time,
                     bound=found.bound, gap=found.gap, solve_seconds=plan.solve_seconds + time.perf_counter() - began,
                     message=found.message, source=found.source, offload=found.offload)

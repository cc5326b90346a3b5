"""One solve as a pipeline of phases on one clock: what :func:`sapptk.solve` runs.

A :class:`~sapptk.request.SolveRequest` goes through these phases, in order, each asking the
call's one :class:`~sapptk.solver.clock.Clock` (one deadline, one stop event, one time source);
their time shares are :class:`~sapptk.solver.settings.SearchOptions` fields:

1. **Per-stage search** (:func:`sapptk.solver.search.search`) on the safe budget; for a
   cost-driven schedule (``zb-v-greedy``) together with its order (:func:`reorder`).
   With offload it gets ``offload_base_share`` of the limit, with ``per_micro_batch``
   ``per_stage_share``, else all of it.
2. **Offload** (``"offload"`` in ``config.recompute``): the search once more without the
   budget (``offload_free_share``), then :func:`sapptk.solver.offload_search.offload_search`
   from both plans until the deadline.
3. **Per micro-batch** (``per_micro_batch=True``): :func:`sapptk.solver.micro_batches.improve_per_micro_batch`
   on the per-stage plan until the deadline.

A long-context setup (sequence slices) runs :func:`sliced` instead: the per-stage search on
the solver's model of the slices, then the slice lengths and layer moves of
:mod:`sapptk.solver.slices`.

Phases pass a :class:`Found` (an assignment and what is known of it) from one to the next;
none builds a :class:`~sapptk.plan.Plan`. The caller builds the one plan of the call from the
last :class:`Found`. A phase keeps its input unless its result is strictly faster and fits, so
no lever makes a plan worse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.assignment import Assignment
from sapptk.costs import fits_budget, simulate_counts, stage_costs
from sapptk.solver.clock import Clock
from sapptk.solver.search import even_starts, search

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile
    from sapptk.request import SolveRequest

__all__ = ["REORDER_ROUNDS", "SLICED_SOLVES", "Found", "offload", "per_micro_batch", "per_stage",
           "reorder", "run", "sliced"]

REORDER_ROUNDS = 4
"""At most this many re-orderings of a cost-driven schedule after the first solve."""

SLICED_SOLVES = 4
"""At most this many solves of a sliced setup's layers (K/V weight 1, the safe weight, then bisection)."""



Found = Assignment
"""What a phase hands to the next (:class:`sapptk.assignment.Assignment`, which a Plan extends): an
assignment of ``config`` (the safe budget; the program a re-ordered schedule was balanced on;
chosen slice lengths) and what is known of it; ``counts`` is None when nothing was found."""


def run(request: SolveRequest, clock: Clock | None = None) -> tuple[Found, float]:
    """Every phase the request asks for, on one clock (the call's, or one made here for
    ``request.time_limit`` and ``request.stop``); the last result and the seconds used."""
    clock = clock or Clock(request.time_limit, request.stop)
    opts = request.search_options
    if request.sliced:
        return sliced(request, clock), clock.elapsed()
    share = opts.offload_base_share if request.offload else opts.per_stage_share if request.per_micro_batch else 1.0
    found = per_stage(request, request.profile, request.safe_config, clock.phase(share * clock.limit,
                                                                                 stall=opts.stall_time),
                      request.start_counts)
    if request.offload:
        found = offload(request, found, clock)
    elif request.per_micro_batch:
        found = per_micro_batch(request, found, clock)
    return found, clock.elapsed()


# ------------------------------------------------------------------ phase 1: per stage
def per_stage(request: SolveRequest, profile: Profile, config: PipelineConfig, clock: Clock,
              start: np.ndarray | None) -> Found:
    """The per-stage search of ``profile`` on ``config`` within ``clock`` (with its order, for a
    cost-driven schedule)."""
    from sapptk.schedules import get

    if config.custom_program is None and get(config.schedule).cost_driven:
        return reorder(request, profile, config, clock, start)
    return _search(request, profile, config, clock, start)


def _search(request: SolveRequest, profile: Profile, config: PipelineConfig, clock: Clock,
            start: np.ndarray | None) -> Found:
    res = search(profile, config, workers=request.workers, seed=request.seed, deterministic=request.deterministic,
                 allow_empty_stages=request.allow_empty_stages, start=start, options=request.search_options,
                 clock=clock)
    return Found(config, res.status, res.counts, res.step_time, res.bound, res.gap, res.message)


def reorder(request: SolveRequest, profile: Profile, config: PipelineConfig, clock: Clock,
            start: np.ndarray | None) -> Found:
    """Balance a cost-driven schedule (``zb-v-greedy``) and its order together.

    The order of such a schedule depends on the op costs, and the costs on the plan. So:
    balance on the order built at unit costs; rebuild the order at the plan's per-stage
    costs (and comm); balance again on that fixed order (a setup carrying the program),
    seeded with the layout in hand (so a solve cut short never comes back slower than it);
    repeat while the step time improves and the order is new, at most
    :data:`REORDER_ROUNDS` times, or until the clock says stop. Each solve gets
    ``SearchOptions.reorder_share`` of the time left. The result carries the program it was
    balanced on; its ``bound`` and ``gap`` are for that fixed order.
    """
    from sapptk.schedules import OpCosts, build

    share, stall = request.search_options.reorder_share, request.search_options.stall_time
    found = _search(request, profile, config, clock.phase(share * clock.limit, stall=stall), start)
    orders = {config.program().units}
    steps = [found.step_time]
    for _ in range(REORDER_ROUNDS):
        if not found.solved or clock.remaining() < 0.2:
            break
        c = stage_costs(profile, found.config, found.counts)
        costs = OpCosts(tuple(c.forward), tuple(c.backward), tuple(c.weight), float(c.comm))
        program = build(config.schedule, stages=config.stages, micro_batches=config.micro_batches,
                        chunks=config.chunks, splits=config.splits, costs=costs)
        if program.units in orders:
            break  # the order is stable at these costs
        orders.add(program.units)
        candidate = _search(request, profile, config.with_program(program),
                            clock.phase(share * clock.remaining(), stall=stall), np.asarray(found.counts))
        if not candidate.solved or candidate.step_time >= found.step_time - 1e-9:
            break
        found = candidate
        steps.append(found.step_time)
    if len(steps) > 1:
        history = " -> ".join(f"{t:.6g}" for t in steps)
        found = dataclasses.replace(found.noted(f"order re-built at the plan's costs {len(steps) - 1} time(s); "
                                                f"step time {history} ms"), source="balance (re-ordered)")
    return found


# ------------------------------------------------------------------ phase 2: offload
def offload(request: SolveRequest, found: Found, clock: Clock) -> Found:
    """The offload phase: a search without the budget for a second start, then the offload
    search from the per-stage plan and the starts, until the clock's deadline."""
    opts, profile = request.search_options, request.profile
    starts: list[np.ndarray | tuple[np.ndarray, np.ndarray]] = []
    if found.config.memory_budget is not None and not clock.expired():
        # the plan without a budget: offloading its activations may make it fit (even when nothing else does)
        free = _search(request, profile, found.config.replace(memory_budget=None),
                       clock.phase(opts.offload_free_share * clock.limit, stall=opts.stall_time), None)
        if free.solved:
            starts.append(np.asarray(free.counts))
    given = request.start
    if getattr(given, "offload", None) is not None and getattr(given, "profile", None) == profile:
        starts.insert(0, (np.asarray(request.start_counts), np.asarray(given.offload)))  # its own offload, kept
    if not found.solved:  # nothing fits without offload: the even splits are starts too
        starts += [counts for mode, counts in even_starts(profile, found.config) if mode in found.config.recompute]
    return offload_from(profile, found, deadline=clock.deadline, stop=clock.stop,
                        allow_empty_stages=request.allow_empty_stages, starts=starts)


def offload_from(profile: Profile, found: Found, *, deadline: float, stop: Any = None,
                 allow_empty_stages: bool = False,
                 starts: Sequence[np.ndarray | tuple[np.ndarray, np.ndarray]] = ()) -> Found:
    """``found`` improved by activation offload (:func:`sapptk.solver.offload_search.offload_search`,
    also from ``starts``) until ``deadline`` (a ``time.perf_counter`` time, the clock's) or
    ``stop``; ``found`` itself, with a note, when that is not strictly faster. A result with no
    assignment, or one that does not fit, is searched from ``starts`` only. The offload result's
    status is "feasible" with no bound: the solve's bound holds for plans without offload only."""
    from sapptk.errors import ConfigError
    from sapptk.solver.offload_search import offload_search

    usable = found.solved and fits(profile, found.config, found.counts)
    if not usable and not starts:
        return found
    if found.config.host_bandwidth is None:
        raise ConfigError("with_offload: the plan's config has host_bandwidth = None: expected the host link's MB "
                          "per ms (config.replace(host_bandwidth=..., recompute=(..., 'offload')))")
    res = offload_search(profile, found.config, np.asarray(found.counts) if usable else None, deadline=deadline,
                         stop=stop, allow_empty_stages=allow_empty_stages, starts=starts)
    how = "a local optimum" if res.complete else "cut short by the time limit or stop"
    before = f"{res.base_step_time:.6g} ms" if usable else f"no plan ({found.status})"
    note = (f"activation offload: {res.evaluations} candidates simulated in {res.seconds:.1f} s ({how}); "
            f"step time {before} -> {res.step_time:.6g} ms")
    if res.evaluations == 0:
        note = "activation offload: not tried (no time left for one simulation of this setup, or stopped)"
    if not res.improved:
        kept = "kept without offload" if usable else "nothing fits with offload either"
        return found.noted(f"{note} (no faster plan: {kept})")
    offloaded = int(res.offload.sum())
    bound = (f"the solve's bound {_ms(found.bound)} holds without offload only" if usable
             else "without offload nothing fits")
    return dataclasses.replace(
        found.noted(f"{note}; {offloaded} layers offload their activations ({bound})"), status="feasible",
        counts=res.counts, step_time=res.step_time, bound=None, gap=None, offload=res.offload if offloaded else None)


# ------------------------------------------------------------------ phase 3: per micro-batch
def per_micro_batch(request: SolveRequest, found: Found, clock: Clock) -> Found:
    """Recompute per micro-batch on the per-stage plan, until the clock's deadline; kept only
    when its simulation fits the (safe) budget and is faster."""
    from sapptk.solver.micro_batches import improve_per_micro_batch

    profile = request.profile
    if not found.solved or found.offload is not None or not fits(profile, found.config, found.counts):
        return found
    better = improve_per_micro_batch(profile, found.config, found.counts, deadline=clock.deadline, stop=clock.stop)
    out = found.noted(better.message)
    if better.alternative is None:
        return out
    sim = simulate_counts(profile, found.config, better.counts, better.alternative)
    if fits_budget(sim.peak_memory.to_numpy(), found.config.memory_budget) and sim.step_time < found.step_time:
        # the per-stage bound does not bound per-micro-batch plans: no bound, not proven
        return dataclasses.replace(out, status="feasible", counts=np.asarray(better.counts), step_time=sim.step_time,
                                   bound=None, gap=None, alternative=better.alternative,
                                   source=f"{found.source} (per micro-batch)")
    return out.noted("its simulation did not confirm the gain, the per-stage plan is kept")


# ------------------------------------------------------------------ long context
def sliced(request: SolveRequest, clock: Clock) -> Found:
    """A sliced setup (``docs/schedules.md``): the layers from the solver on its model of the setup
    (:func:`sapptk.seq.solver_profile`: equal, linear slices; each layer's activation raised by a
    weight × its K/V), then timed and measured by the simulator with causal slice costs and K/V.
    Weight 1 under-counts K/V, :func:`sapptk.seq.kv_ratio` over-counts it (its plans always fit):
    the first plan that fits by simulation wins, else bisection between them keeps the fastest
    that fits. Layers then move across stage boundaries while the exact step time falls
    (:func:`sapptk.solver.slices.move_layers`). With ``choose_splits`` the slice lengths are then
    chosen for the plan (:func:`sapptk.solver.slices.choose_slices`). The status is "feasible"
    with no bound (the solver's bound is for its model) or "infeasible"; step time and peaks are
    the simulated ones. With ``deterministic`` the two searches stop after
    ``slices.EVALUATIONS_PER_SECOND`` candidates per second of their share, not by the clock."""
    from sapptk.seq import kv_ratio, solver_profile
    from sapptk.solver.slices import EVALUATIONS_PER_SECOND, choose_slices, move_layers

    profile, safe, opts = request.profile, request.safe_config, request.search_options
    limit, deterministic = clock.limit, request.deterministic
    choose_splits = request.choose_splits
    solves_end = limit * (1 - opts.move_share - (opts.slice_share if choose_splits else 0.0))
    low, high = 1.0, max(1.0, kv_ratio(safe.program(), safe.slice_lengths))
    best: Found | None = None
    last: Found | None = None
    tried = []
    ratio = low
    for round_ in range(SLICED_SOLVES):
        left = solves_end - clock.elapsed()
        if round_ and left <= 0:
            break
        model = solver_profile(profile, ratio)
        solved = per_stage(request, model, safe.replace(slice_lengths=None),
                           clock.phase(max(left / (SLICED_SOLVES - round_), 0.01), stall=opts.stall_time),
                           request.start_counts)
        last = solved
        ok = False
        if solved.solved:
            step, ok = _simulated(profile, safe, solved.counts)
            if ok and (best is None or step < best.step_time):
                best = Found(safe, "given", np.asarray(solved.counts), step)
        tried.append(f"{ratio:.3g}: {'fits' if ok else solved.status if not solved.solved else 'over budget'}")
        if safe.memory_budget is None or (round_ == 0 and (ok or not solved.solved)) or high == low:
            break  # no budget, the best plan of the optimistic model fits, or even that model has none
        if solved.solved and not ok:
            low = ratio  # K/V under-counted: weigh it more
        else:
            high = ratio  # fits (try a lighter weight for a faster plan) or the model has no plan
        ratio = high if round_ == 0 else (low + high) / 2
    note = ("sequence slices: layers balanced by the solver with equal, linear slice costs and K/V counted as "
            f"activation with weights {', '.join(tried)}; step time and peaks simulated with causal slice costs "
            f"and K/V ({profile.seq_length} tokens in {safe.splits} slices)")
    if best is None:
        assert last is not None
        if last.solved:  # the plans found do not fit with their K/V: none is kept
            return Found(safe, "infeasible", None, None,
                         message=f"infeasible: every plan found is over the budget with its K/V; {note}")
        return dataclasses.replace(last, config=safe, counts=None).noted(note)
    found = best

    def choose(found: Found, seconds: float) -> tuple[Found, str]:
        equal = found.config.replace(splits=found.config.splits, slice_lengths=None)
        cap = max(20, int(EVALUATIONS_PER_SECOND * seconds)) if deterministic else None
        choice = choose_slices(profile, equal, found.counts, time_limit=max(seconds, 0.01), max_evaluations=cap)
        config = equal.replace(splits=list(choice.lengths))
        step, ok = _simulated(profile, config, found.counts)
        if not ok or step >= found.step_time:
            return found, ""
        return Found(config, "given", found.counts, step), (
            f"slice lengths chosen {list(choice.lengths)}: step {choice.equal_step_time:.6g} -> "
            f"{choice.step_time:.6g} ms, {100 * choice.bubble_gain:.1f} % less bubble than equal "
            f"lengths {list(choice.equal_lengths)} ({choice.evaluations} candidates)")

    steps = []
    if choose_splits:  # the lengths for the solver's layers, then the layers for those lengths, then again
        found, said = choose(found, limit * opts.slice_share / 2 if deterministic
                             else clock.remaining() / 2)  # what the solves left, shared
        steps.append(said)
    left = clock.remaining()
    moved, kept, timed = move_layers(profile, found.config, found.counts,
                                     deadline=clock.now() + max(left / 2 if choose_splits else left, 0.01),
                                     allow_empty_stages=safe.num_virtual_stages > profile.num_body_layers,
                                     max_evaluations=max(20, int(EVALUATIONS_PER_SECOND * limit * opts.move_share))
                                     if deterministic else None)
    if kept:
        step, ok = _simulated(profile, found.config, moved)
        if ok and step < found.step_time:
            steps.append(f"{kept} layer moves at the exact sliced step time ({timed} candidates): "
                         f"{found.step_time:.6g} -> {step:.6g} ms")
            found = Found(found.config, "given", moved, step)
            if choose_splits:
                found, said = choose(found, limit * opts.slice_share / 2 if deterministic else clock.remaining())
                steps.append(said)
    note = "; ".join([note, *(s for s in steps if s)])
    return dataclasses.replace(found, status="feasible", bound=None, gap=None, message=note)


# ------------------------------------------------------------------ helpers
def fits(profile: Profile, config: PipelineConfig, counts: Any) -> bool:
    """Whether the simulated peaks of ``counts`` are within ``config.memory_budget`` (always, without one)."""
    return config.memory_budget is None or _simulated(profile, config, counts)[1]


def _simulated(profile: Profile, config: PipelineConfig, counts: Any) -> tuple[float, bool]:
    """(simulated step ms, fits the budget) of ``counts`` on ``config``."""
    sim = simulate_counts(profile, config, counts)
    return float(sim.step_time), fits_budget(sim.peak_memory.to_numpy(), config.memory_budget)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g} ms"


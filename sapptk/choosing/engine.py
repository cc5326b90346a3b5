"""``choose``: which pipeline setup to run, balanced best-bound-first and pruned by proofs.

::

    ChooseRequest ──► setups (+ invalid rows) ──► ChoiceRun (bound, queue by bound, tighten,
    (checked once)                                 balance in batches, prove) ──► Choice (ranked frame)

1. The request (:class:`~sapptk.choosing.request.ChooseRequest`) is checked once; the setups
   are enumerated (:mod:`sapptk.choosing.setups`, :mod:`sapptk.choosing.cards`), those left
   out for a reason becoming ``invalid`` rows. With ``memory_margin`` or ``oom_risk`` every
   setup is bounded and balanced at the safe budget below ``memory_budget``
   (:func:`sapptk.sensitivity.robust_budget`): a bound at that budget holds for every plan
   that keeps the margin.
2. :class:`~sapptk.choosing.run.ChoiceRun` gives every setup a proven lower bound on its step
   time, takes the setups in order of bound, prunes those whose bound reaches the best step
   time found so far, tightens the bound of the first before balancing it, and balances in
   batches (:class:`~sapptk.choosing.balancing.Balancer`), one step per state
   (:class:`~sapptk.choosing.state.SetupState`).
3. The winner is proven when every other setup's bound (the balancer's own included) is at
   or above its step time. One :class:`~sapptk.solver.clock.Clock` holds the call's
   ``time_limit`` and ``stop`` event; every phase draws from it.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np

from sapptk.choosing.balancing import Balancer
from sapptk.choosing.records import all_infeasible
from sapptk.choosing.request import ChooseRequest
from sapptk.choosing.result import Choice, typed_choice
from sapptk.choosing.run import STEPS, TIE, ChoiceRun
from sapptk.choosing.setups import DEFAULT_GRADIENT_SHARE, Candidate, Setup, enumerate_setups
from sapptk.errors import ConfigError
from sapptk.solver.clock import Clock

__all__ = ["STEPS", "ChooseRequest", "choose", "choose_request"]

_REQUIRED: Any = object()


def choose(
    source: Any,
    *,
    devices: int = _REQUIRED,
    global_batch: int = _REQUIRED,
    memory_budget: float | None = _REQUIRED,
    micro_batch_size: int = 1,
    hardware: Any = None,
    schedules: Sequence[str] | None = None,
    stages: Sequence[int] | None = None,
    chunks: Sequence[int] | None = None,
    max_chunks: int = 4,
    recompute: Sequence[str] | None = None,
    constant_memory: float = 0,
    comm: float = 0,
    tp: Sequence[int] | None = None,
    cp: Sequence[int] | None = None,
    ep: Sequence[int] | None = None,
    zero: Sequence[str] | None = None,
    seq_length: int | None = None,
    dp_bandwidth: float | None = None,
    gradient_share: float = DEFAULT_GRADIENT_SHARE,
    sequence_length: int | None = None,
    memory_margin: float | None = None,
    oom_risk: float | None = None,
    memory_error: Any = None,
    per_micro_batch: bool = False,
    time_limit: float | None = None,
    setup_time_limit: float = 20.0,
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
    **unknown: Any,
) -> Choice:
    """The fastest pipeline setup for ``global_batch`` samples on ``devices`` devices.

    ``choose(request)`` takes a :class:`~sapptk.choosing.request.ChooseRequest`; the keywords
    build one (every argument checked once, with its limit in :mod:`sapptk.checks`).

    Parameters
    ----------
    source: a :class:`~sapptk.profile.Profile` (or a bundled profile name or file): the
        pipeline dimensions vary (schedule, stages p dividing ``devices``, chunks v,
        micro-batches ``global_batch / (dp · micro_batch_size)``, dp = devices / p). A model
        card (``sapptk.models``) with ``hardware=`` (a bundled name, a ``Hardware`` or a mapping
        of its fields): tensor, context and expert parallelism and the optimizer sharding vary
        too (``tp=``, ``cp=``, ``ep=``, ``zero=`` restrict them; ``seq_length=`` the tokens per
        sample), each setup with its own estimated profile.
    memory_budget: MB per device (None: unlimited; a model card's: the hardware's).
    schedules, stages, chunks: restrict the dimensions (None: every schedule whose order is
        fixed, every divisor of ``devices``, every chunk count a schedule accepts up to
        ``max_chunks``).
    recompute, constant_memory, comm: as in :class:`~sapptk.config.PipelineConfig`
        (``"offload"`` is refused: no valid bound exists for it here).
    dp_bandwidth: MB per ms of each device's link for the DP gradient all-reduce; None
        leaves the synchronisation out (and the result's notes say so). ``gradient_share``:
        gradient MB per parameter MB of a bare profile.
    sequence_length: tokens per sample, for ``tokens_per_s_per_device``.
    memory_margin, oom_risk, memory_error: plan every setup for the safe budget of
        :func:`sapptk.sensitivity.robust_budget` (MB kept free, or a share of the budget; an
        OOM probability under a relative memory error): no device of any plan is above it.
        ``per_micro_batch=True`` is refused (no valid bound exists for it here).
    time_limit: seconds for the whole call (None: until every setup is decided); when it runs
        out, the setups not yet decided are ``undecided`` rows and ``Choice.status`` says so.
    setup_time_limit: seconds per balanced setup; ``bound_time``: seconds per bound
        tightening (a balanced setup whose bound stays below the best step time gets one of 4 ×
        that).
    retry: a balanced setup still unproven after that is balanced once more from its own plan
        with ``retry × setup_time_limit`` (0: never), best bound first.
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
        invalid): ``decided``, ``balanced``, ``pruned``, ``infeasible``, ``invalid``, ``total``
        (setups) and ``elapsed_s``.

    Raises :class:`~sapptk.errors.ConfigError` for a bad argument (naming it and its limit,
    before anything is enumerated), a grid of more than :data:`sapptk.checks.MAX_SETUPS`
    setups, a device count no stage count divides, a global batch no setup divides, an empty
    list, or when every setup is infeasible (naming the nearest one, its device and the MB it
    lacks).
    """
    if unknown:
        name = next(iter(unknown))
        raise ConfigError(f"{name} = {unknown[name]!r}: unknown argument of choose")
    if isinstance(source, ChooseRequest):
        given = [k for k, v in locals().items() if k not in ("source", "unknown") and v is not _REQUIRED
                 and v != _DEFAULTS.get(k, _REQUIRED)]
        if given:
            raise ConfigError(f"{given[0]}: choose(request) takes no other argument; use request.replace("
                              f"{given[0]}=...)")
        return choose_request(source)
    args = {k: v for k, v in locals().items() if k not in ("source", "unknown", "args")}
    for name in ("devices", "global_batch", "memory_budget"):
        if args[name] is _REQUIRED:
            raise ConfigError(f"{name}: required (choose(source, devices=..., global_batch=..., memory_budget=...))")
    return choose_request(ChooseRequest(source, **args))


_DEFAULTS: dict[str, Any] = {k: v.default for k, v in inspect.signature(choose).parameters.items()
                             if v.default is not inspect.Parameter.empty}


def choose_request(request: ChooseRequest) -> Choice:
    """The engine behind :func:`choose` (the module docstring), on a checked request."""
    from tqdm.auto import tqdm

    clock = Clock(math.inf if request.time_limit is None else request.time_limit, request.stop)
    budget, safe, notes = _budgets(request)
    candidates, invalid, more_notes = _candidates(request, safe)
    if not candidates:
        reasons = "; ".join(dict.fromkeys(str(r["reason"]) for r in invalid))
        raise ConfigError(f"choose: every one of the {len(invalid)} setups is invalid ({reasons[:400]})")
    notes += more_notes
    bw = request.dp_bandwidth
    if request.card is not None and bw is None:
        from sapptk.choosing.cards import hardware_bandwidth

        bw = hardware_bandwidth(request.hardware_card)
    if bw is None:
        notes.append("no DP gradient synchronisation counted (give dp_bandwidth= in MB/ms to count it)")
    sequence_length = request.sequence_length
    if request.card is not None and sequence_length is None:
        sequence_length = request.seq_length or 4096
    extra = tuple(dict.fromkeys([k for c in candidates for k in c.columns] + [k for r in invalid for k in r
                                                                                if k in ("tp", "cp", "ep", "zero")]))
    for c in candidates:
        cfg = c.setup.config
        c.row = {"schedule": cfg.schedule, "stages": cfg.stages, "chunks": cfg.chunks,
                 "micro_batches": cfg.micro_batches, "dp": c.setup.dp, **c.columns,
                 "memory_budget_mb": math.nan if budget is None else budget,
                 "safe_budget_mb": math.nan if safe is None or safe == budget else safe}
    total = len(candidates) + len(invalid)
    tally = {"balanced": 0, "pruned": 0, "infeasible": 0, "invalid": 0}
    with ExitStack() as stack:
        bar = stack.enter_context(tqdm(total=total, desc="choose", unit="setup", disable=not request.progress))

        def done(c: Candidate | None, status: str) -> None:
            if c is not None:
                c.row["status"] = status
            tally[status] = tally.get(status, 0) + 1
            bar.set_postfix(tally, refresh=False)
            bar.update()
            if request.on_progress is not None:
                decided = sum(n for k, n in tally.items() if k != "undecided")
                request.on_progress({"decided": decided, "balanced": tally["balanced"], "pruned": tally["pruned"],
                                     "infeasible": tally["infeasible"], "invalid": tally["invalid"],
                                     "total": total, "elapsed_s": clock.elapsed()})

        rows = [{**r, "status": "invalid", "memory_budget_mb": math.nan if budget is None else budget} for r in invalid]
        for _ in rows:
            done(None, "invalid")
        balancer = Balancer(setup_time_limit=request.setup_time_limit, retry=request.retry, seed=request.seed,
                            deterministic=request.deterministic, executor=request.executor, workers=request.workers,
                            batch=request.batch, cache=request.cache, dp_bandwidth=bw, stack=stack)
        run = ChoiceRun(candidates, clock=clock, balancer=balancer, dp_bandwidth=bw, bound_time=request.bound_time,
                        retry=request.retry, prove=request.prove, tighten=request.tighten, batch=request.batch,
                        deterministic=request.deterministic, done=done)
        run.bound_all()
        run.run_queue()
        if not clock.expired() and all(c.row.get("status") in ("infeasible", "invalid") for c in candidates):
            all_infeasible(candidates)
        _leftovers(run, done)
        balancer.close()
    status = "stopped" if clock.stopped else "time limit" if clock.expired() and tally.get("undecided") else "complete"
    return _finish(request, candidates, rows, extra, run, clock, notes, status, sequence_length, safe, budget)


def _budgets(request: ChooseRequest) -> tuple[float | None, float | None, list[str]]:
    """The memory budget per device, the safe budget every setup is planned for, and a note."""
    budget = request.memory_budget
    constant = request.constant_memory
    if request.card is not None:
        budget = budget if budget is not None else request.hardware_card.memory_mb
        constant = constant or request.hardware_card.constant_mb
    if request.memory_margin is None and request.oom_risk is None:
        return budget, budget, []
    if budget is None:
        raise ConfigError("memory_margin / oom_risk: memory_budget = None: there is no budget to keep a margin "
                          "below; give memory_budget")
    from sapptk.config import PipelineConfig
    from sapptk.sensitivity import robust_budget

    safe = robust_budget(PipelineConfig(1, 1, memory_budget=budget, constant_memory=constant),
                         memory_margin=request.memory_margin, oom_risk=request.oom_risk,
                         memory_error=request.memory_error)
    asked = [f"{k}={getattr(request, k)!r}" for k in ("memory_margin", "oom_risk") if getattr(request, k) is not None]
    return budget, safe, [f"every setup planned for a safe budget of {safe:,.6g} MB per device ({', '.join(asked)}) "
                          f"under the {budget:,.6g} MB budget"]


def _candidates(request: ChooseRequest, safe: float | None) -> tuple[list[Candidate], list[dict[str, Any]],
                                                                     list[str]]:
    """The setups to decide, the rows of those left out for a reason, and notes."""
    if request.card is not None:
        from sapptk.choosing.cards import card_candidates

        return card_candidates(request, safe)
    invalid: list[dict[str, Any]] = []
    setups = enumerate_setups(devices=request.devices, global_batch=request.global_batch,
                              micro_batch_size=request.micro_batch_size, schedules=request.schedules,
                              stages=request.stages, chunks=request.chunks, memory_budget=safe,
                              constant_memory=request.constant_memory, comm=request.comm,
                              recompute=request.recompute, max_chunks=request.max_chunks, invalid=invalid)
    return ([Candidate(setup=Setup(config=s.config, dp=s.dp), profile=request.profile,
                       gradient_share=request.gradient_share) for s in setups], invalid, [])


def _leftovers(run: ChoiceRun, done: Callable[[Candidate, str], None]) -> None:
    """The setups left in the queue: pruned (a bound at or above the best step time), or
    undecided (the call was stopped or ran out of time first)."""
    best = run.best
    for _lower, i in run.heap:
        c = run.candidates[i]
        if c.balanced:
            continue
        c.row["bound_ms"] = c.lower_ms
        if c.lower_ms < best * (1 - TIE):  # the queue was left early: not proven slower
            c.row["reason"] = "stopped before it was decided" if run.clock.stopped else \
                "the time limit ran out before it was decided"
            done(c, "undecided")
            continue
        c.row["reason"] = (f"pruned: proven bound {c.lower_ms:,.1f} ms >= best step time {best:,.1f} ms"
                           if best < math.inf else "not balanced")
        done(c, "pruned")
    for c in run.candidates:  # never bounded: the call was stopped first
        if "status" not in c.row:
            c.row["reason"] = "stopped before it was bounded" if run.clock.stopped else \
                "the time limit ran out before it was bounded"
            done(c, "undecided")


def _finish(request: ChooseRequest, candidates: list[Candidate], invalid_rows: list[dict[str, Any]],
            extra: tuple[str, ...], run: ChoiceRun, clock: Clock, notes: list[str], status: str,
            sequence_length: int | None, safe: float | None, budget: float | None) -> Choice:
    """The ranked frame, the plans of the balanced setups, whether the winner is proven."""
    from sapptk.plan import make_plan

    devices, global_batch = request.devices, request.global_batch
    for c in candidates:
        if c.row.get("status") in ("balanced", "unsolved", "pruned"):
            c.row.setdefault("bound_ms", c.lower_ms)
        if c.row.get("status") == "balanced":
            step = c.row["step_time_ms"]
            c.row["gap"] = max(0.0, (step - c.row["bound_ms"]) / step) if step else 0.0
            c.row["samples_per_s_per_device"] = global_batch / (step / 1000.0) / devices
            if sequence_length is not None:
                c.row["tokens_per_s_per_device"] = c.row["samples_per_s_per_device"] * sequence_length
    rows = [c.row for c in candidates] + invalid_rows
    balanced = [c for c in candidates if c.row.get("status") == "balanced"]
    if not balanced and status != "complete":
        seconds = clock.elapsed()
        return Choice(frame=typed_choice(rows, extra), best=None, proven=False, plans={}, seconds=seconds,
                      notes=notes, timings=_timings(run, seconds), status=status)
    if not balanced:
        reasons = "; ".join(sorted({str(c.row.get("reason")) for c in candidates})[:3])
        raise ConfigError(f"choose: no setup could be balanced within setup_time_limit = "
                          f"{request.setup_time_limit:g} s ({reasons})")
    winner = min(balanced, key=lambda c: (c.row["step_time_ms"], candidates.index(c)))
    best = winner.row["step_time_ms"]
    proven = status == "complete" and all(
        c is winner or c.row.get("status") in ("infeasible", "invalid")
        or (c.row.get("bound_ms") is not None and c.row["bound_ms"] >= best * (1 - TIE)) for c in candidates)
    if safe is not None and safe != budget and not clock.expired():
        notes.append(_margin_price(request, winner, clock))
    frame = typed_choice(rows, extra)
    plans: dict[int, Any] = {}
    by_key = {c.row.get("key"): c for c in balanced}
    for idx, key in zip(frame.index, frame["key"], strict=True):
        c = by_key.get(key)
        if c is not None and frame.at[idx, "status"] == "balanced":
            plans[int(idx)] = make_plan(
                c.profile, c.setup.config, np.asarray(c.counts, dtype=np.int64), status=c.row["solver_status"],
                step_time=c.row["pipeline_ms"], bound=c.row.get("solver_bound_ms"), gap=c.row.get("solver_gap"),
                solve_seconds=c.row.get("solve_seconds") or 0.0, source=f"choose: {c.setup.label}")
    seconds = clock.elapsed()
    return Choice(frame=frame, best=plans[int(frame.index[0])], proven=proven, plans=plans, seconds=seconds,
                  notes=notes, timings=_timings(run, seconds), status=status)


def _timings(run: ChoiceRun, seconds: float) -> dict[str, float]:
    spent = dict(run.spent)
    spent["other"] = max(0.0, seconds - sum(spent.values()))
    return spent


def _margin_price(request: ChooseRequest, winner: Candidate, clock: Clock) -> str:
    """The winner's setup balanced once more at the full budget (from its own plan, which fits
    it): its step time there goes in the winner's ``step_time_ms_no_margin`` and a note says
    the margin's price. Other setups are not balanced at the full budget, so the price is a
    lower estimate of what the margin costs the choice."""
    import dataclasses

    from sapptk.balancer import solve
    from sapptk.request import SolveRequest

    cfg = winner.setup.config
    full = dataclasses.replace(cfg, memory_budget=request.memory_budget if request.card is None else
                               (request.memory_budget or request.hardware_card.memory_mb))
    limit = min(request.setup_time_limit, clock.remaining())
    plan = solve(SolveRequest(winner.profile, full, time_limit=max(0.05, limit), workers=request.workers or 2,
                              seed=request.seed, deterministic=request.deterministic, stop=clock.stop,
                              start=np.asarray(winner.counts, dtype=np.int64)))
    if not plan.solved or plan.step_time is None:
        return "memory margin's price: not known (the winner's setup found no plan at the full budget in time)"
    step = float(plan.step_time) + float(winner.row.get("dp_sync_ms") or 0.0)
    step = min(step, winner.row["step_time_ms"])
    winner.row["step_time_ms_no_margin"] = step
    price = winner.row["step_time_ms"] - step
    return (f"memory margin's price: the winner's setup at the full budget steps in {step:,.1f} ms, "
            f"{price:,.1f} ms ({price / winner.row['step_time_ms']:.1%}) faster; other setups were not balanced "
            "at the full budget (step_time_ms_no_margin)")

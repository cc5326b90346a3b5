"""The integer model's bound on a setup's step time: the LP bound of
:mod:`sapptk.choosing.bounds` tightened by integrality (CP-SAT over integer layer counts).

Its proven bound is a lower bound on every plan the balancer can return, because every such
plan is a solution of this model (contiguity relaxed).
"""

from __future__ import annotations

import math

import numpy as np

from sapptk.choosing.bounds import SetupBound, call_over, phase_clock
from sapptk.config import PipelineConfig
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, layer_coefficients
from sapptk.profile import Profile
from sapptk.solver.clock import Clock
from sapptk.solver.paths import live_rows, path_model

__all__ = ["integer_bound"]


def integer_bound(profile: Profile, config: PipelineConfig, start: SetupBound, *, time_limit: float = 2.0,
                  max_rounds: int = 12, workers: int = 1, deterministic: bool = False,
                  enough_ms: float = math.inf, clock: Clock | None = None) -> SetupBound:
    """``start`` tightened by integrality (:func:`_integer_bound`): first without the memory
    rows and every layer in its fastest allowed mode (a relaxation CP-SAT proves quickly),
    then with them in the time left; the largest proven bound. With ``deterministic``, one
    CP-SAT worker counts deterministic time instead of seconds (the same input gives the same
    bound, whatever the machine's load). ``enough_ms``: a caller that only needs to know the bound
    is at least that skips the memory rows once the first pass reaches it (the bound is then
    that pass's, never more than the full model's). ``clock``: the caller's, as in
    :func:`pipeline_bound`."""
    if start.infeasible or start.bound_ms is None:
        return start
    clk = phase_clock(clock, time_limit)
    free = _integer_bound(profile, config, start, time_limit=time_limit / 2, max_rounds=max_rounds,
                          workers=1 if deterministic else workers, memory=False, deterministic=deterministic,
                          clock=clk)
    left = time_limit / 2 if deterministic else clk.remaining()
    if config.memory_budget is None or left <= 0.1 or call_over(clk) or (
            free.bound_ms is not None and free.bound_ms >= enough_ms):
        return free
    return _integer_bound(profile, config, free, time_limit=left, max_rounds=max_rounds,
                          workers=1 if deterministic else workers, memory=True, deterministic=deterministic,
                          clock=clk)


def _integer_bound(profile: Profile, config: PipelineConfig, start: SetupBound, *, time_limit: float,
                   max_rounds: int, workers: int, memory: bool, deterministic: bool = False,
                   clock: Clock | None = None) -> SetupBound:
    """``start`` tightened by integrality: CP-SAT minimises the step time over integer layer
    counts per (group, mode, virtual stage) (contiguity relaxed; every virtual stage without
    head or tail holds a body layer, as :func:`sapptk.balance` requires) subject to the exact
    memory rows and the path rows found so far, adding the longest path of each solution.

    Its proven bound (``best_objective_bound``, exact integer arithmetic in ticks) is a lower
    bound on every plan the balancer can return, because every such plan is a solution of
    this model; the result is the larger of it and ``start``. Returns ``start`` unchanged
    for an infeasible setup.
    """
    from ortools.sat.python import cp_model

    if start.infeasible or start.bound_ms is None:
        return start
    clk = phase_clock(clock, time_limit)
    coef = layer_coefficients(profile, config)
    program = config.program()
    paths = path_model(program)
    live = live_rows(program)
    nvs = config.num_virtual_stages
    G, R = coef.allowed.shape
    allowed = coef.allowed.copy()
    if not memory:  # the fastest allowed mode of each group only: no plan is faster than with it
        fastest = np.where(allowed, coef.backward, np.iinfo(np.int64).max).argmin(axis=1)
        allowed[:] = False
        allowed[np.arange(G), fastest] = True
    model = cp_model.CpModel()
    n: dict[tuple[int, int, int], cp_model.IntVar] = {}
    for g in range(G):
        cells = []
        for r in range(R):
            if allowed[g, r]:
                for vs in range(nvs):
                    n[g, r, vs] = model.new_int_var(0, int(coef.counts[g]), f"n{g}_{r}_{vs}")
                    cells.append(n[g, r, vs])
        model.add(sum(cells) == int(coef.counts[g]))
    for vs in range(nvs):
        if coef.fixed_layers[vs] == 0:
            model.add(sum(v for (g, r, s), v in n.items() if s == vs) >= 1)

    def stage_terms(kind: str, vs: int) -> list[tuple[int, cp_model.IntVar]]:
        out = []
        for (g, r, s), v in n.items():
            if s != vs:
                continue
            c = {"f": coef.forward[g], "b": coef.backward[g, r], "w": coef.weight[g], "a": coef.activation[g, r],
                 "p": coef.params[g]}[kind]
            if c:
                out.append((int(c), v))
        return out

    terms = {k: [stage_terms(k, vs) for vs in range(nvs)] for k in "fbwap"}
    fixed = {"f": coef.fixed_forward, "b": coef.fixed_backward, "w": coef.fixed_weight, "a": coef.fixed_activation,
             "p": coef.fixed_params}
    if memory and config.memory_budget is not None:
        budget = math.floor(float(config.memory_budget) / MEMORY_UNIT_MB * live.scale + 1e-6)
        for d, stages in enumerate(program.device_stages):
            stages = list(stages)
            static = [(live.scale * c, v) for vs in stages for c, v in terms["p"][vs]]
            static_c = live.scale * (int(fixed["p"][stages].sum()) + int(coef.constant))
            for point in np.unique(live.rows[d], axis=0) if len(live.rows[d]) else []:
                expr = static + [(int(point[k]) * c, v) for k, vs in enumerate(stages) for c, v in terms["a"][vs]]
                const = static_c + sum(int(point[k]) * int(fixed["a"][vs]) for k, vs in enumerate(stages))
                model.add(sum(c * v for c, v in expr) + const <= budget)
    # no path is longer than every op of every column at its most expensive, plus comm on every unit
    total_work = sum(int(coef.counts[g]) * int(max(coef.forward[g] + coef.backward[g].max() + coef.weight[g], 0))
                     for g in range(G))
    horizon = (int(paths.unit_sig.sum(axis=0).max(initial=1)) * (total_work + int(coef.fixed_forward.sum())
               + int(coef.fixed_backward.sum()) + int(coef.fixed_weight.sum()))
               + int(program.graph.n_units) * int(coef.comm) * config.splits + 1)
    z = model.new_int_var(0, horizon, "z")
    seen: set[bytes] = set()

    def add(sig: np.ndarray, crossings: int) -> bool:
        sig = np.asarray(sig, dtype=np.int64)
        key = sig.tobytes() + int(crossings).to_bytes(8, "little")
        if key in seen:
            return False
        seen.add(key)
        expr, const = [], int(crossings) * int(coef.comm) * config.splits
        for cls, kind in enumerate("fbw"):
            for vs in range(nvs):
                k = int(sig[cls * nvs + vs])
                if k:
                    expr += [(k * c, v) for c, v in terms[kind][vs]]
                    const += k * int(fixed[kind][vs])
        model.add(z >= sum(c * v for c, v in expr) + const)
        return True

    for sig_bytes, crossings in start.paths:
        add(np.frombuffer(sig_bytes, dtype=np.int64), crossings)
    for sig in paths.device_sig:
        add(sig, 0)
    if memory and start.bound_ms is not None:  # the bound so far holds here too
        model.add(z >= int(math.floor(start.bound_ms / TIME_UNIT_MS * config.splits)))
    model.minimize(z)
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # SIGINT stays Python's (sapptk.solver.interrupt)
    solver.parameters.num_workers = int(workers)
    best_ticks = 0
    rounds = 0
    spent = 0.0  # deterministic time, when counted
    while rounds < max_rounds:
        left = (0.0 if call_over(clk) else time_limit - spent) if deterministic else clk.remaining()
        if left <= 0.05:
            break
        rounds += 1
        if deterministic:
            solver.parameters.max_deterministic_time = left
        else:
            solver.parameters.max_time_in_seconds = left
        status = solver.solve(model)
        spent += solver.deterministic_time
        if status == cp_model.INFEASIBLE and memory:  # nothing the balancer could return fits
            return SetupBound(None, infeasible=True, excess_mb=0.0, device=None, rounds=start.rounds + rounds,
                              seconds=start.seconds + clk.elapsed(), paths=start.paths, integer=True)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        best_ticks = max(best_ticks, int(math.floor(solver.best_objective_bound + 1e-9)))
        if status != cp_model.OPTIMAL:
            break
        counts = np.zeros((G, R, nvs), dtype=np.int64)
        for (g, r, vs), v in n.items():
            counts[g, r, vs] = solver.value(v)
        cost = np.concatenate([coef.per_stage(counts)[k] for k in ("forward", "backward", "weight")])
        step, found = paths.longest(cost[None, :], int(coef.comm))
        if int(step[0]) <= solver.objective_value or not add(*found[0]):
            break
    ms = best_ticks * TIME_UNIT_MS / config.splits
    found = tuple((k[:-8], int.from_bytes(k[-8:], "little")) for k in seen)
    return SetupBound(max(ms, start.bound_ms), rounds=start.rounds + rounds,
                      seconds=start.seconds + clk.elapsed(), paths=found, integer=True)

"""A stronger proven bound on a setup's step time, once an incumbent step time is known: whole
layers and exact memory per device.

The LP of :mod:`sapptk.choosing.bounds` lets a device hold fractional layers in fractional
recompute modes. Here every device holds a whole **layout** (layers of each group and modes
on each of its virtual stages) that fits its memory budget exactly, enumerated by the
balancer's own :func:`~sapptk.solver.layouts.device_layouts` (only layouts whose own op
chain is at most the incumbent ``ub``: a plan with a longer chain is slower than ``ub``
anyway, so every bound here is ``min(bound, ub)``). Three bounds, the largest is kept:

1. **Min-max of device chains (exact, integer).** A device's op chain is a path, and so is
   that chain extended by the fill before its first op and the drain after its last op
   through other devices' stages; each of those stages costs at least its head/tail plus
   (every stage holds a body layer) one layer in its cheapest mode. So every plan's step is
   at least ``max_d chain_d(layout_d) + e_d``, and the least of that over plans (one layout
   per device, the layers of every group adding up; group contiguity relaxed) is a dynamic
   program over devices with the layers placed so far as its state. Exact in integers.
2. **The layout LP** (:class:`~sapptk.solver.relaxation.LinearRelaxation`): one convex
   combination of layouts per device, every path of the program by row generation; its
   bound is a Lagrangian dynamic program in exact integer plans (the LP is not trusted).
3. **Branch and bound on device layer totals** (:class:`~sapptk.solver.totals_bound.TotalsBound`)
   in the time left (not with ``deterministic``: it is timed).

Every bound holds for every plan :func:`sapptk.balance` can return (no empty virtual stage).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sapptk.choosing.bounds import SetupBound, call_over, phase_clock
from sapptk.config import PipelineConfig
from sapptk.costs import TIME_UNIT_MS
from sapptk.profile import Profile
from sapptk.solver.clock import Clock
from sapptk.solver.layouts import DeviceLayouts, TooManyLayouts, device_layouts, layer_caps, stage_options
from sapptk.solver.problem import Problem, make_problem
from sapptk.solver.relaxation import LinearRelaxation
from sapptk.solver.settings import SearchOptions
from sapptk.solver.totals_bound import TotalsBound

__all__ = ["chain_minmax", "fill_drain", "layout_bound"]

_SEARCH = SearchOptions()
_PARTIAL = _SEARCH.max_partial_layouts // 5
"""Most partial layouts of one device before the enumeration gives up (then no bound here): a
fifth of what the balancer allows, since a bound that does not come quickly is not worth it."""

_STATES = _SEARCH.max_dp_states
"""Most states (layers placed per group) of the min-max dynamic program: the balancer's own cap
on its relaxation's dynamic program."""


def fill_drain(problem: Problem) -> list[tuple[int, np.ndarray, int]]:
    """Per device ``d``: ``(e_d, signature, crossings)`` of a path holding d's whole op chain,
    where ``e_d`` (ticks) is the least its other ops can last in any plan: each virtual stage
    of another device at its head/tail plus, unless empty stages are allowed and it has
    neither, one body layer in the cheapest forward, backward and weight of any group.
    ``e_d = 0`` (and the bare chain) when no such path is found."""
    coef, paths = problem.coef, problem.paths
    V = problem.num_virtual_stages
    need = (coef.fixed_layers == 0) & (not problem.allow_empty)
    cheapest_b = int(np.where(coef.allowed, coef.backward, np.iinfo(np.int64).max).min())
    low = np.concatenate([coef.fixed_forward + need * int(coef.forward.min()),
                          coef.fixed_backward + need * cheapest_b,
                          coef.fixed_weight + need * int(coef.weight.min())]).astype(np.int64)
    # weigh the device's own ops above everything else: the longest path then holds all of them
    heavy = int(low.sum()) * int(paths.unit_sig.sum(axis=0).max(initial=1)) + 1 + int(coef.comm) * problem.splits * (
        problem.program.graph.n_units + 1)
    out = []
    for d, stages in enumerate(problem.program.device_stages):
        own = np.zeros(3 * V, dtype=bool)
        for vs in stages:
            own[[vs, V + vs, 2 * V + vs]] = True
        cost = np.where(own, heavy, low)
        _, found = paths.longest(cost[None, :], int(coef.comm))
        sig, crossings = found[0]
        sig = np.asarray(sig, dtype=np.int64)
        if not np.array_equal(sig[own], paths.device_sig[d][own]):
            out.append((0, paths.device_sig[d], 0))
            continue
        out.append((int(sig[~own] @ low[~own]) + int(crossings) * int(coef.comm) * problem.splits, sig, int(crossings)))
    return out


def chain_minmax(layouts: list[DeviceLayouts], counts: np.ndarray, extra: list[int]) -> float:
    """``min over plans of max_d (chain_d + extra[d])`` (ticks), a plan being one layout per
    device with the layers of each group adding up to ``counts``; ``inf`` when no such plan
    exists among ``layouts``. Raises :class:`TooManyLayouts` above :data:`_STATES` states."""
    counts = np.asarray(counts, dtype=np.int64)
    size = counts + 1
    n_states = int(np.prod(size))
    if n_states > _STATES:
        raise TooManyLayouts(f"more than {_STATES} states")
    radix = np.concatenate([[1], np.cumprod(size)[:-1]]).astype(np.int64)
    digits = (np.arange(n_states)[:, None] // radix[None, :]) % size[None, :]
    big = np.iinfo(np.int64).max
    value = np.full(n_states, big, dtype=np.int64)
    value[0] = 0
    for d, lay in enumerate(layouts):
        if not len(lay):
            return math.inf
        totals = lay.comp.sum(axis=1)  # (k, G)
        keys, inverse = np.unique(totals, axis=0, return_inverse=True)
        chain = np.full(len(keys), big, dtype=np.int64)
        np.minimum.at(chain, inverse.ravel(), lay.chain.astype(np.int64) + int(extra[d]))
        new = np.full(n_states, big, dtype=np.int64)
        reached = value < big
        for key, c in zip(keys, chain, strict=True):
            ok = reached & np.all(digits + key[None, :] <= counts[None, :], axis=1)
            src = np.flatnonzero(ok)
            if len(src):
                np.minimum.at(new, src + int(key @ radix), np.maximum(value[src], c))
        value = new
    last = int(value[n_states - 1])
    return math.inf if last == big else float(last)


def layout_bound(profile: Profile, config: PipelineConfig, start: SetupBound, ub_ms: float, *,
                 time_limit: float = 1.0, deterministic: bool = False,
                 enough_ms: float = math.inf, memo: dict[str, Any] | None = None,
                 clock: Clock | None = None) -> SetupBound | None:
    """``start`` raised by whole layouts (module docstring), for every plan no slower than
    ``ub_ms`` (pipeline ms; ``inf``: every plan): the result is at most ``max(start, ub_ms)``
    with ``ub_ms`` rounded up to a whole tick of the setup's time unit.
    None when the layouts are too many to enumerate in ``time_limit`` (the caller keeps
    ``start``). The layout LP and the totals search stop once the bound reaches ``enough_ms``
    (a caller that only needs to know the bound is at least that asks no more); the result is
    then at least ``min(enough_ms, ub_ms)``, and may be lower than the full search would reach.

    ``memo``: a dict kept by the caller for one setup (or its twins: the same program, costs and
    budget) between calls; it keeps the setup's problem and fill-and-drain paths, which do not
    depend on ``ub_ms``.

    With ``deterministic``, the LP runs a fixed number of iterations and the totals search
    is left out, so the same input gives the same bound. ``clock``: the caller's (its deadline
    and stop event end the search too; then the result is ``start`` or None).
    """
    if start.infeasible or start.bound_ms is None:
        return start
    clk = phase_clock(clock, time_limit)
    began, deadline = clk.start, clk.deadline
    memo = {} if memo is None else memo
    if "problem" not in memo:
        memo["problem"] = make_problem(profile, config, allow_empty=False, options=SearchOptions())
    problem = memo["problem"]
    coef = problem.coef
    scale = TIME_UNIT_MS / problem.splits
    # the least whole tick at or above ub_ms: steps are whole ticks, so a plan no faster than that
    # tick is no faster than ub_ms (the floor would leave a bound up to a tick short of ub_ms, which
    # then proves nothing against an incumbent whose step has a fractional DP-sync share)
    ub = int(math.ceil(ub_ms / scale - 1e-9)) if math.isfinite(ub_ms) else None
    if (ub is not None and ub * scale <= start.bound_ms) or start.bound_ms >= enough_ms:
        return start
    cap = math.inf if ub is None else float(ub)
    enough = min(cap, math.ceil(enough_ms / scale - 1e-9)) if math.isfinite(enough_ms) else cap
    try:
        caps, work_cap = layer_caps(coef, problem.paths, ub, allow_empty=False)
        options = stage_options(coef, caps, work_cap=work_cap, max_options=_PARTIAL,
                                deadline=None if deterministic else deadline)
        layouts = device_layouts(coef, problem.program, options, ub=ub, budget=problem.budget, allow_empty=False,
                                 max_partial=_PARTIAL, deadline=None if deterministic else deadline,
                                 memory=problem.reduced_memory())
    except TooManyLayouts:
        return None
    rounds = 0
    if "ends" not in memo:
        memo["ends"] = fill_drain(problem)
    ends = memo["ends"]
    try:
        best = chain_minmax(layouts, coef.counts, [e for e, _, _ in ends])
    except TooManyLayouts:
        best = 0.0
    if best < enough and all(len(lay) for lay in layouts):
        lp = LinearRelaxation(coef, problem.paths, layouts, problem.comm_ticks)
        for sig in problem.paths.device_sig:
            lp.add(sig, 0)
        for _, sig, crossings in ends:
            lp.add(sig, crossings)
        for sig_bytes, crossings in start.paths:
            lp.add(np.frombuffer(sig_bytes, dtype=np.int64).copy(), crossings)
        until = began + (3600.0 if deterministic else max(time_limit / 2, clk.elapsed() + 0.1))
        relaxed = lp.run(until=min(until, clk.call_deadline or math.inf),
                         max_iterations=60 if deterministic else 1000,
                         stopped=None if clock is None and enough == math.inf
                         else (lambda: call_over(clk) or lp.best >= enough))
        rounds += relaxed.iterations
        best = max(best, float(relaxed.bound))
        if not deterministic and best < enough and Clock.now() < deadline - 0.05 and not clk.stopped:
            totals = TotalsBound(lp)
            found = totals.run(cutoff=2**62 if enough == math.inf else int(enough), until=deadline)
            best = max(best, float(found.bound))
    if not math.isfinite(min(best, cap)):
        return start  # no plan among the layouts, and no incumbent to cap the bound: the caller decides
    ms = min(best, cap) * scale
    return SetupBound(max(ms, start.bound_ms), rounds=start.rounds + rounds,
                      seconds=start.seconds + clk.elapsed(), paths=start.paths, integer=True)

"""Every tuning knob of the search in one frozen object, with its default and what it does.

``balance(..., options=SearchOptions(...))`` changes them for one call; the defaults are
what the benchmarks (``benchmarks/balance.py``) were measured with. None of them changes
what a plan *is* (exact memory, exact step time); they change how the time is spent and so
how good a plan the time limit buys, and how large a problem is handled by which method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from sapptk.errors import ConfigError

__all__ = ["SearchOptions"]


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of :func:`sapptk.solver.search.search` (and so of :func:`sapptk.balance`).

    Time shares (fractions of the time left when a phase starts)
    ----------------------------------------------------------------
    relaxation_share: 0.1 — the LP relaxation's row generation (the proven bound) before
        the local search (its paths sharpen the local search's filter)...
    relaxation_first_seconds: 1.0 — ...and at most this many seconds, so the plan improves
        early whatever the limit (a stop request then finds a good plan).
    relaxation_after_share: 0.25 — the same LP goes on after the local search, with the
        critical paths the local search found.
    local_search_share: 0.6 — the local search may use this much; it stops earlier on its
        own when kicks stop improving (on hard two-chunk instances the incumbent, not the
        master, is what improves).
    first_plan_share: 0.25 — first cap of a layer-count solve looking for a first plan when
        no even split (and no start plan) fits; doubled after every solve that ends without
        an answer.
    master_cap_share: 0.05 — first cap of a master solve, as a share of the *whole* time
        limit; doubled when a capped solve brings no new path.
    tie_break_share: 0.5 — the least-recompute tie-break may use this much of what is left
        once the step time is proven (the rest goes to the smallest deviation from the even
        split).
    totals_share: 0.9 — on schedules with two or more chunks per device, the share of the
        master phase's time (phase 6) given to the branch and bound on device layer totals
        (:mod:`sapptk.solver.totals_bound`), which raises the proven bound: after each capped
        master solve that brought no better plan, it runs for up to ``share / (1 − share)``
        times that solve's seconds (less while it raises the bound more slowly than the master:
        :class:`~sapptk.solver.totals_bound.BoundRates`). It takes time only where the plan
        stopped improving. 0: never;
        at most 0.9. Not used with ``deterministic=True`` (it is timed, not counted).
    diagnosis_seconds: 10.0 — most seconds spent explaining why nothing fits; never more
        than what the time limit leaves.
    stall_time: None — seconds; when set, the search ends early (status ``feasible`` unless
        already proven) once it holds a plan and that plan has not improved for this long.
        The time limit still holds. Short limits for demos and notebooks; the proof of
        optimality needs the whole limit.

    Lever phases (fractions of the *whole* time limit of the call; every phase asks the call's
    one :class:`~sapptk.solver.clock.Clock`, so none runs past the limit, and a phase that ends
    early leaves its time to the next)
    ----------------------------------------------------------------------------------------
    offload_base_share: 0.45 — with ``"offload"`` in ``config.recompute``: the per-stage search
        (no offload) under the memory budget...
    offload_free_share: 0.15 — ...then the same search without the budget, whose plan (every
        mode-``"none"`` layer offloaded) is a second start of the offload search; the offload
        search (:mod:`sapptk.solver.offload_search`) has the rest.
    per_stage_share: 0.75 — with ``per_micro_batch=True``: the per-stage search; the exact
        greedy search over micro-batches (:mod:`sapptk.solver.micro_batches`) has the rest.
    reorder_share: 0.5 — a cost-driven schedule (``zb-v-greedy``): each solve on an order gets
        this fraction of the time *left* when it starts (the order is then re-built at the
        plan's costs, at most ``sapptk.solver.pipeline.REORDER_ROUNDS`` times).
    slice_share: 0.25 — a long-context setup with ``choose_splits=True``: choosing the slice
        lengths (:func:`sapptk.solver.slices.choose_slices`)...
    move_share: 0.2 — ...and moving layers across stage boundaries at the exact sliced step
        time (:func:`sapptk.solver.slices.move_layers`); the solves of the layers have the rest.
        (With ``deterministic=True`` these two searches count candidates instead:
        ``sapptk.solver.slices.EVALUATIONS_PER_SECOND`` per second of their share.)

    Local search
    ------------
    kick_moves: (2, 4) — a kick makes between this many random moves (inclusive).
    sample_per_stage: 4 — after a kick, each climbing round tries this many random layer
        moves per virtual stage (instead of all of them).
    idle_kicks_per_stage: 0.5 — after this many kicks per virtual stage without an
        improvement, the kicks grow (twice as many moves)...
    max_kick_growth: 4 — ...up to this many times ``kick_moves``; when those stay idle too,
        the local search stops.
    batch: 64 — neighbours timed together; after each batch without an improvement the
        critical paths of its nearest misses rule out more of the rest.
    deterministic_evaluations_per_second: 1200 — with ``deterministic=True`` the local
        search's work is counted in evaluated plans, not seconds: this many per second of
        the time limit (times ``local_search_share``), so the same input gives the same plan.
    deterministic_relaxation_iterations_per_second: 10 — likewise, the relaxation's LP
        solves with ``deterministic=True``: this many per second of the time limit (times
        the relaxation's share; at least one).
    coarsen_tolerance: 0.05 — when the layouts of a profile's groups are too many, runs of
        consecutive groups whose figures differ by at most this (relative) are solved as one
        group with their largest figures (a first good plan) and with their smallest (a
        bound).

    Sizes (above them a cheaper method takes over, never a larger allocation)
    ---------------------------------------------------------------------------
    max_partial_layouts: 1,000,000 — layouts one device may have during enumeration;
        above it the layer-count master is used instead of the layout master.
    max_layouts: 200,000 — layouts kept over all devices for the layout master.
    max_layout_bytes: 64 MB — memory the stage contents and the kept layouts may take.
    max_dp_states: 2,000,000 — states of the relaxation's dynamic program over per-group
        layer counts; above it only the total layer count is tracked (still a bound).
    evaluation_bytes: 64 MB — working memory of one batch of exact step-time evaluations.
    max_relaxation_iterations: 1000 — LP solves of the relaxation's row generation.
    totals_lp_iterations: 3 — LP solves (row generation) for each node of the totals branch
        and bound; few and cheap measured better than converging each node.
    """

    relaxation_share: float = 0.1
    relaxation_first_seconds: float = 1.0
    relaxation_after_share: float = 0.25
    local_search_share: float = 0.6
    first_plan_share: float = 0.25
    master_cap_share: float = 0.05
    tie_break_share: float = 0.5
    totals_share: float = 0.9
    diagnosis_seconds: float = 10.0
    stall_time: float | None = None
    offload_base_share: float = 0.45
    offload_free_share: float = 0.15
    per_stage_share: float = 0.75
    reorder_share: float = 0.5
    slice_share: float = 0.25
    move_share: float = 0.2
    kick_moves: tuple[int, int] = (2, 4)
    sample_per_stage: int = 4
    idle_kicks_per_stage: float = 0.5
    max_kick_growth: int = 4
    batch: int = 64
    deterministic_evaluations_per_second: int = 1200
    deterministic_relaxation_iterations_per_second: int = 10
    coarsen_tolerance: float = 0.05
    max_partial_layouts: int = 1_000_000
    max_layouts: int = 200_000
    max_layout_bytes: int = 64 * 2**20
    max_dp_states: int = 2_000_000
    evaluation_bytes: int = 64 * 2**20
    max_relaxation_iterations: int = 1000
    totals_lp_iterations: int = 3

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _LEVER_SHARES:
                if not _real(value) or not 0 < value < 1:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected a fraction in (0, 1)")
            elif f.name == "totals_share":
                if not _real(value) or not 0 <= value <= 0.9:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected a fraction in [0, 0.9]")
            elif f.name.endswith("_share"):
                if not _real(value) or not 0 < value <= 1:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected a fraction in (0, 1]")
            elif f.name == "coarsen_tolerance":
                if not _real(value) or value < 0:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected a fraction >= 0")
            elif f.name in ("diagnosis_seconds", "relaxation_first_seconds"):
                if not _real(value) or value < 0:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected seconds >= 0")
            elif f.name == "stall_time":
                if value is not None and (not _real(value) or value <= 0):
                    raise ConfigError(f"SearchOptions.stall_time = {value!r}: expected seconds > 0 or None")
            elif f.name == "idle_kicks_per_stage":
                if not _real(value) or value < 0:
                    raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected a number >= 0")
            elif f.name == "kick_moves":
                ok = (isinstance(value, tuple) and len(value) == 2 and all(_int(v) for v in value)
                      and 1 <= value[0] <= value[1])
                if not ok:
                    raise ConfigError(
                        f"SearchOptions.kick_moves = {value!r}: expected a pair (low, high), 1 <= low <= high"
                    )
            elif not _int(value) or value < 1:
                raise ConfigError(f"SearchOptions.{f.name} = {value!r}: expected an integer >= 1")
        if self.offload_base_share + self.offload_free_share >= 1:
            raise ConfigError(f"SearchOptions.offload_base_share + offload_free_share = {self.offload_base_share!r} + "
                              f"{self.offload_free_share!r}: expected a sum < 1 (the offload search needs the rest)")
        if self.slice_share + self.move_share >= 1:
            raise ConfigError(f"SearchOptions.slice_share + move_share = {self.slice_share!r} + {self.move_share!r}: "
                              "expected a sum < 1 (the solves of the layers need the rest)")


_LEVER_SHARES = frozenset({"offload_base_share", "offload_free_share", "per_stage_share", "reorder_share",
                           "slice_share", "move_share"})


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

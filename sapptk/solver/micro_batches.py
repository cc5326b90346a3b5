"""Recompute per micro-batch: improve a per-stage plan by letting chosen micro-batches recompute less.

The model
---------
A per-stage plan gives every (virtual stage, micro-batch) cell the same layout. Here each
virtual stage has two layouts with the same layers per body group: the plan's ``counts``
(``base``) and a second one with less recompute (``weak``). A cell moved to ``weak`` has a
shorter backward and keeps more activation memory from its forward to its backward. Memory
is linear in the choice: the memory a device holds after each of its allocation and free
events (the op order alone fixes which cells are alive then) is the base layout's plus, for
every moved cell alive at that event, its extra activation. So a move is safe exactly when
no event of its device goes over the budget, whatever the durations; time comes from the
same longest-path kernel as the simulator, at the same integer costs, so the step time the
search predicts is the one the simulator measures.

The search
----------
Greedy and exact. In each round take every cell not yet moved whose move keeps its device
within the budget, time all of these single moves in one batched longest-path pass, and keep
those that shorten the step, sorted by the step they give (then by the backward they save).
Accept the longest prefix of that order that still fits (checked move by move) and whose
combined step is no worse than the best single move (halving the prefix until it is), or
else the best single move. Rounds end when no single move shortens the step, at the
deadline, or when ``stop`` is set.

It runs for several pairs of layouts (:data:`FAMILIES`): the per-stage plan with the least
recompute, or with one, two or three layers per group one mode down, as ``weak``; and, as
``base``, the per-stage plan itself or the plan with one or two layers one mode *up* (more
recompute for every micro-batch, which frees the memory that moving others down then
spends: the converse lever). Starting from the per-stage plan, a pair never gives a slower
result; a pair starting higher is kept only when it ends faster than the per-stage plan.
The fastest result wins; the caller keeps it only if its simulation fits and is faster.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.costs import (
    FIT_TOLERANCE_MB,
    MEMORY_UNIT_MB,
    TIME_UNIT_MS,
    AlternativeLayout,
    check_alternative,
    layer_coefficients,
)
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE, W_CODE
from sapptk.schedules.timing import longest_path
from sapptk.simulation import WEIGHT_HOLDS

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["MicroBatchResult", "improve_per_micro_batch", "weak_layout"]

_BATCH = 256  # candidate moves timed per longest-path pass (bounds the batch's memory)
_CHECK_EVERY = 1024  # candidate cells whose memory is checked between two looks at the clock


@dataclass(frozen=True)
class MicroBatchResult:
    """What the search found: ``counts`` (the plan's layout: the per-stage plan's, or one with
    more recompute that the alternative relieves) and ``alternative`` (None when no move
    helped), the integer-model step time in ms of the per-stage plan and of the result,
    rounds and moves made, and a note."""

    counts: np.ndarray
    alternative: AlternativeLayout | None
    base_step_ms: float
    step_ms: float
    moves: int
    rounds: int
    message: str


def weak_layout(
    profile: Profile, config: PipelineConfig, counts: np.ndarray, layers: int | None = None, *, up: bool = False
) -> np.ndarray:
    """``counts`` with less recompute (more with ``up``); the layers per group and virtual stage stay.

    ``layers=None``: every layer moves to its group's allowed mode with the shortest backward
    (ties: the smaller activation). ``layers=n``: on each virtual stage, at most ``n`` layers
    of each group move one allowed mode down (to the next shorter backward), the ones with the
    longest backward first; with ``up``, one allowed mode up, the ones with the shortest
    backward first. ``layers=0`` is ``counts``.
    """
    coef = layer_coefficients(profile, config)
    out = np.array(counts, dtype=np.int64, copy=True)
    for g in range(counts.shape[0]):
        allowed = np.flatnonzero(coef.allowed[g])
        if not len(allowed):  # nothing allowed: the plan's own modes stay
            continue
        ranked = allowed[np.lexsort((coef.activation[g, allowed], coef.backward[g, allowed]))]  # weakest first
        if layers is None:
            out[g] = 0
            out[g, int(ranked[0] if not up else ranked[-1])] = counts[g].sum(axis=0)
            continue
        steps = [(int(ranked[i]), int(ranked[i - 1])) for i in range(len(ranked) - 1, 0, -1)]  # strongest first
        if up:
            steps = [(b, a) for a, b in reversed(steps)]  # weakest first, one mode up
        for vs in range(counts.shape[2]):
            left = int(layers)
            for r, to in steps:
                n = min(left, int(out[g, r, vs]))
                out[g, r, vs] -= n
                out[g, to, vs] += n
                left -= n
    return out


FAMILIES: tuple[tuple[int, int | None], ...] = ((0, None), (0, 1), (0, 2), (1, 1), (1, None), (2, 2), (0, 3))
"""Pairs of layouts tried, in order: ``(up, down)`` — the plan's layout with ``up`` layers per
group and virtual stage one mode up (more recompute; 0: the per-stage plan itself) and the
second layout with ``down`` layers one mode down (None: the least recompute), both from the
per-stage plan (:func:`weak_layout`). The fastest result that beats the per-stage plan is kept."""


class _Model:
    """The integer time and memory model of (base, weak) layouts over the cells of a program."""

    def __init__(self, profile: Profile, config: PipelineConfig, counts: np.ndarray, weak: np.ndarray) -> None:
        coef = layer_coefficients(profile, config)
        program = config.program()
        g = program.graph
        self.graph = g
        self.m = m = config.micro_batches
        k = config.splits
        base, alt = coef.per_stage(counts), coef.per_stage(weak)
        self.d_backward = alt["backward"] - base["backward"]  # per virtual stage, time units
        self.d_activation = alt["activation"] - base["activation"]  # memory units
        # op durations in ticks (1/splits of a time unit: a slice lasts its stage's cost)
        table = np.stack([base["forward"], base["backward"] + base["weight"], base["backward"], base["weight"]])
        kind, vs, mb = g.op_kind, g.op_virtual_stage, g.op_micro_batch
        self.base_dur = table[kind, vs].astype(np.int64)
        self.op_delta = np.where((kind == B_CODE) | (kind == I_CODE), self.d_backward[vs], 0).astype(np.int64)
        self.op_cell = (vs * m + mb).astype(np.int64)
        self.comm = int(coef.comm) * k
        self.ticks_ms = TIME_UNIT_MS / k
        self.single_op_units = g.n_units == g.n_ops
        # memory, scaled by 2·splits so that every amount is an integer (weight_holds = 1/2)
        if WEIGHT_HOLDS != 0.5:  # pragma: no cover - the constant is fixed
            raise AssertionError("the scaled memory model assumes WEIGHT_HOLDS = 0.5")
        scale = 2 * k
        events = program.memory_events
        op = events.op
        step = np.zeros(4, dtype=np.int64)
        step[F_CODE], step[B_CODE], step[I_CODE], step[W_CODE] = 2, -2, -1, -1
        phi = step[kind[op]]
        ev_cell = self.op_cell[op]
        ev_amount = base["activation"][vs[op]]
        p = config.stages
        placement = np.asarray(program.placement)
        static = np.bincount(placement, weights=base["params"], minlength=p).astype(np.int64) + coef.constant
        budget = config.memory_budget
        self.cap = None if budget is None else (float(budget) + FIT_TOLERANCE_MB) / MEMORY_UNIT_MB * scale
        self.device_of_cell = np.repeat(placement, m)
        self.memory: list[np.ndarray] = []  # per device: scaled memory after each event (base layout)
        for d in range(p):
            a, b = events.ptr[d], events.ptr[d + 1]
            self.memory.append(scale * static[d] + np.cumsum(phi[a:b] * ev_amount[a:b]))
        # the events of each cell (all on its device), as positions within that device's events:
        # O(events) to build, O(events of a device) per move (a dense events x cells table per
        # device took seconds and gigabytes at 64 x 256 x 4)
        order = np.argsort(ev_cell, kind="stable")
        self.cell_ptr = np.searchsorted(ev_cell[order], np.arange(len(self.device_of_cell) + 1))
        self.cell_event = order
        self.event_local = np.arange(len(ev_cell)) - np.repeat(np.asarray(events.ptr[:-1]), np.diff(events.ptr))
        self.event_phi = phi

    # -------------------------------------------------------------- memory
    def move_memory(self, cell: int) -> tuple[int, np.ndarray]:
        """(device, the extra scaled memory after each of its events) when ``cell`` moves to weak."""
        d = int(self.device_of_cell[cell])
        extra = np.zeros(len(self.memory[d]), dtype=np.int64)
        mine = self.cell_event[self.cell_ptr[cell] : self.cell_ptr[cell + 1]]
        extra[self.event_local[mine]] = self.event_phi[mine]
        return d, np.cumsum(extra) * int(self.d_activation[cell // self.m])

    def fits(self, memory: np.ndarray) -> bool:
        return self.cap is None or (memory.max(initial=0) <= self.cap)

    # ---------------------------------------------------------------- time
    def steps(self, durations: np.ndarray) -> np.ndarray:
        """Step time in ticks of each column of op durations (ops, batch)."""
        g = self.graph
        unit = durations if self.single_op_units else np.add.reduceat(durations, g.unit_op_ptr[:-1], axis=0)
        end, _ = longest_path(g, unit, self.comm)
        return end.max(axis=0, initial=0)

    def durations(self, mask: np.ndarray) -> np.ndarray:
        """Op durations (ticks) with the cells of ``mask`` (flat, virtual stage × micro-batch) on weak."""
        return self.base_dur + self.op_delta * mask[self.op_cell]


def improve_per_micro_batch(
    profile: Profile, config: PipelineConfig, counts: Any, *, deadline: float, stop: Any = None
) -> MicroBatchResult:
    """Move micro-batches of ``counts`` (a per-stage plan that fits) to less recompute while the
    budget holds and the step time does not grow (see the module docstring), once for each
    second layout of :data:`FAMILIES` (the time left shared among those still to run); the
    fastest result. ``deadline`` is a :func:`time.perf_counter` time (the deadline of the solve's
    :class:`~sapptk.solver.clock.Clock`); ``stop`` an optional :class:`threading.Event`."""
    counts = np.asarray(counts, dtype=np.int64)
    best: MicroBatchResult | None = None
    tried: list[tuple[np.ndarray, np.ndarray]] = []
    reference: int | None = None
    for i, (up, down) in enumerate(FAMILIES):
        base = weak_layout(profile, config, counts, up, up=True) if up else counts
        weak = weak_layout(profile, config, counts, down)
        if np.array_equal(base, weak) or any(np.array_equal(base, b) and np.array_equal(weak, w) for b, w in tried):
            continue
        tried.append((base, weak))
        now = time.perf_counter()
        if now >= deadline or (stop is not None and stop.is_set()):
            if best is None:
                return MicroBatchResult(counts, None, 0.0, 0.0, 0, 0, "recompute per micro-batch: not tried (no "
                                        "time left after the per-stage search, or stopped)")
            break
        share = now + max(0.0, deadline - now) / (len(FAMILIES) - i)
        if reference is None:
            model = _Model(profile, config, counts, weak)
            reference = int(model.steps(model.durations(np.zeros(model.m * len(model.d_backward), dtype=bool))
                                        [:, None])[0])
        found = _greedy(profile, config, base, weak, reference=reference, deadline=share, stop=stop)
        if best is None or (found.alternative is not None and found.step_ms < best.step_ms):
            best = found
        if time.perf_counter() >= deadline or (stop is not None and stop.is_set()):
            break
    if best is None:
        return MicroBatchResult(counts, None, 0.0, 0.0, 0, 0, "recompute per micro-batch: the plan already "
                                "recomputes as little as allowed")
    return best


def _greedy(
    profile: Profile, config: PipelineConfig, counts: np.ndarray, weak: np.ndarray, *, reference: int,
    deadline: float, stop: Any
) -> MicroBatchResult:
    """The greedy search of the module docstring from ``counts`` towards ``weak``; a result only
    when it is faster than ``reference`` (the per-stage plan's step, in ticks)."""
    nvs, m = config.num_virtual_stages, config.micro_batches
    model = _Model(profile, config, counts, weak)
    mask = np.zeros(nvs * m, dtype=bool)
    start = int(model.steps(model.durations(mask)[:, None])[0])
    base_step = reference
    none = MicroBatchResult(counts, None, base_step * model.ticks_ms, base_step * model.ticks_ms, 0, 0, "")
    if np.array_equal(weak, counts) or not (model.d_backward < 0).any():
        return _with(none, "recompute per micro-batch: the plan already recomputes as little as allowed")
    if not all(model.fits(mem) for mem in model.memory):
        return _with(none, "recompute per micro-batch: the per-stage plan does not fit the budget; nothing to improve")
    useful = np.repeat(model.d_backward < 0, m)  # cells whose move saves time
    memory = [mem.copy() for mem in model.memory]
    step = start
    moves = rounds = 0
    cut = ""

    def out_of_time() -> bool:
        return time.perf_counter() >= deadline or (stop is not None and stop.is_set())

    while True:
        if out_of_time():
            cut = " (cut by the time limit or stop)"
            break
        rounds += 1
        cand, extras = [], []
        for n, cell in enumerate(np.flatnonzero(useful & ~mask)):
            if n % _CHECK_EVERY == 0 and n and out_of_time():  # bounded work between two looks at the clock
                break
            d, extra = model.move_memory(int(cell))
            if model.fits(memory[d] + extra):
                cand.append(int(cell))
                extras.append((d, extra))
        if out_of_time():
            cut = " (cut by the time limit or stop)"
            break
        if not cand:
            break
        current = model.durations(mask)
        singles = np.empty(len(cand), dtype=np.int64)
        for a in range(0, len(cand), _BATCH):
            if out_of_time():
                break
            part = cand[a : a + _BATCH]
            dur = np.repeat(current[:, None], len(part), axis=1)
            for j, cell in enumerate(part):
                ops = np.flatnonzero(model.op_cell == cell)
                dur[ops, j] += model.op_delta[ops]
            singles[a : a + len(part)] = model.steps(dur)
        else:
            a = None
        if a is not None:
            cut = " (cut by the time limit or stop)"
            break
        order = np.lexsort((model.d_backward[np.asarray(cand) // m], singles))
        best = int(singles[order[0]])
        if best < step:  # moves that shorten the step first; the others only once none does
            order = order[singles[order] < step]
        if best >= step:
            break
        chosen = _prefix(model, memory, [cand[i] for i in order], [extras[i] for i in order],
                         mask, best)
        for cell in chosen:
            d, extra = model.move_memory(cell)
            memory[d] = memory[d] + extra
            mask[cell] = True
        moves += len(chosen)
        step = int(model.steps(model.durations(mask)[:, None])[0])
    if moves == 0 or step >= base_step:
        return _with(none, f"recompute per micro-batch: no move of a micro-batch to less recompute shortens the "
                     f"step within the budget{cut}")
    alternative = check_alternative(profile, config, counts, weak, mask.reshape(nvs, m))
    gain = (base_step - step) / base_step
    msg = (f"recompute per micro-batch: {moves} of {int(useful.sum())} (virtual stage, micro-batch) cells recompute "
           f"less; step {base_step * model.ticks_ms:.6g} -> {step * model.ticks_ms:.6g} ms ({gain:.2%} faster) "
           f"in {rounds} round(s){cut}")
    if start != base_step:
        msg += " (from a layout with more recompute)"
    return MicroBatchResult(np.array(counts), alternative, base_step * model.ticks_ms, step * model.ticks_ms, moves,
                            rounds, msg)


def _prefix(model: _Model, memory: list[np.ndarray], cells: list[int], extras: list[tuple[int, np.ndarray]],
            mask: np.ndarray, best: int) -> list[int]:
    """The longest prefix of ``cells`` (best single moves first) that fits move by move and whose
    combined step is at most ``best``, halving until it is; at least the best single move."""
    size = len(cells)
    while size > 1:
        trial = [mem.copy() for mem in memory]
        taken = []
        for cell, (d, extra) in zip(cells[:size], extras[:size], strict=True):
            if model.fits(trial[d] + extra):
                trial[d] += extra
                taken.append(cell)
        combined = mask.copy()
        combined[taken] = True
        if int(model.steps(model.durations(combined)[:, None])[0]) <= best:
            return taken
        size //= 2
    return cells[:1]


def _with(result: MicroBatchResult, message: str) -> MicroBatchResult:
    return dataclasses.replace(result, message=message)

"""Slice boundaries for long context: the slice lengths that minimise a plan's step time.

With causal attention the later slices of a micro-batch cost more (:mod:`sapptk.seq`), so
equal lengths leave the pipeline waiting on the last slice. Seq1F1B (Sun et al., 2024) cuts
the sequence by computation instead: equal cost per slice. Here both are starts, and a
local search moves one boundary at a time (steps halving down to ``quantum`` tokens) while
the exact step time of the plan — its costs per (virtual stage, micro-batch, slice) timed by
the simulator's kernel — goes down and every device's simulated peak (K/V included) stays
within the budget. No OR-Tools; every candidate is timed exactly, so the result's step time
is the simulated one.

``balance`` on a sliced setup (:func:`sapptk.solver.pipeline.sliced`) runs the solver for the
layers, then :func:`move_layers`, then (``choose_splits=True``) :func:`choose_slices`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.costs import check_counts, fits_budget, layer_coefficients, simulate_counts, slice_costs
from sapptk.errors import ConfigError
from sapptk.seq import equal_lengths, is_sliced, time_attention
from sapptk.simulation import op_durations, simulate, unit_durations, unit_times

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["EVALUATIONS_PER_SECOND", "SliceChoice", "choose_slices", "equal_cost_lengths", "move_layers"]


@dataclass(frozen=True)
class SliceChoice:
    """The chosen slice lengths (tokens) of a plan and what they gain against equal lengths.

    ``step_time`` / ``equal_step_time`` (ms) and ``idle`` / ``equal_idle`` (device-ms of
    bubble; the busy time is the same for any lengths, since the slices of a micro-batch
    always add up to it); ``bubble_gain`` = 1 − idle / equal_idle; ``fits`` whether the
    chosen lengths keep every device within the budget; ``evaluations``, ``seconds``.
    """

    lengths: tuple[int, ...]
    step_time: float
    equal_lengths: tuple[int, ...]
    equal_step_time: float
    idle: float
    equal_idle: float
    fits: bool
    evaluations: int
    seconds: float

    @property
    def step_gain(self) -> float:
        """Fraction of the equal-length step time saved."""
        return 1.0 - self.step_time / self.equal_step_time if self.equal_step_time > 0 else 0.0

    @property
    def bubble_gain(self) -> float:
        """Fraction of the equal-length bubble (idle device time) saved."""
        return 1.0 - self.idle / self.equal_idle if self.equal_idle > 0 else 0.0


def equal_cost_lengths(seq_length: int, splits: int, attention_share: float, quantum: int = 1) -> np.ndarray:
    """Seq1F1B's cut: lengths whose slices cost the same when ``attention_share`` of the work is
    causal attention (boundary x_j/S solves (1 − a)·x + a·x² = j/k), rounded to ``quantum`` tokens."""
    a = float(attention_share)
    targets = np.arange(1, splits) / splits
    x = targets if a <= 0 else (-(1 - a) + np.sqrt((1 - a) ** 2 + 4 * a * targets)) / (2 * a)
    return _lengths(np.rint(x * seq_length / quantum).astype(np.int64) * quantum, seq_length, quantum)


def _lengths(bounds: np.ndarray, seq_length: int, quantum: int) -> np.ndarray:
    """Interior boundaries → lengths, each at least ``quantum`` (boundaries pushed apart if needed)."""
    b = np.asarray(bounds, dtype=np.int64).copy()
    k = len(b) + 1
    for j in range(len(b)):  # strictly increasing by at least a quantum, leaving room for the rest
        b[j] = min(max(b[j], (b[j - 1] if j else 0) + quantum), seq_length - (k - 1 - j) * quantum)
    return np.diff(np.r_[0, b, seq_length])


def choose_slices(
    profile: Profile,
    config: PipelineConfig,
    counts: Any,
    *,
    quantum: int | None = None,
    time_limit: float = 10.0,
    max_evaluations: int | None = None,
) -> SliceChoice:
    """The slice lengths minimising the step time of ``counts`` on ``config`` (a sliced setup:
    k > 1 slices and a profile with ``seq_length``), within ``config.memory_budget``.

    Boundaries are multiples of ``quantum`` tokens (default: the sequence over 64·k, at
    least 1). Never worse than equal lengths: the search starts from the better of equal
    lengths and Seq1F1B's equal-cost cut. It stops at ``time_limit`` seconds, or after
    ``max_evaluations`` candidates when given (then, and not by the clock, so the result
    does not depend on the machine's load). Raises :class:`ConfigError` for a setup that is not
    sliced or a bad ``quantum``.
    """
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

    began = time.perf_counter()
    if not isinstance(profile, Profile):
        checks.fail(ConfigError, "profile", profile, "a sapptk Profile")
    if not isinstance(config, PipelineConfig):
        checks.fail(ConfigError, "config", config, "a sapptk PipelineConfig")
    time_limit = checks.time_limit(time_limit)
    if max_evaluations is not None:
        max_evaluations = checks.integer(max_evaluations, "max_evaluations", error=ConfigError, low=1,
                                         high=checks.MAX_POINTS)
    if not is_sliced(profile, config):
        raise ConfigError(f"choose_slices: splits = {config.splits} on profile {profile.name!r} (seq_length = "
                          f"{profile.seq_length}): expected k > 1 slices and a profile with seq_length")
    config.check(profile, allow_empty_stages=True)
    seq, k = int(profile.seq_length), config.splits  # type: ignore[arg-type]
    if quantum is None:
        quantum = max(1, seq // (64 * k))
    if isinstance(quantum, bool) or not isinstance(quantum, int) or not 1 <= quantum <= seq // k:
        raise ConfigError(f"quantum = {quantum!r}: expected an integer number of tokens from 1 to seq_length / k "
                          f"= {seq // k}")
    program = config.program()
    budget = config.memory_budget
    evaluations = 0

    def measure(lengths: np.ndarray) -> tuple[float, float, bool]:
        nonlocal evaluations
        evaluations += 1
        costs = slice_costs(profile, config, counts, lengths=lengths.tolist())
        dur = unit_durations(program, op_durations(program, costs.forward, costs.backward, costs.weight))
        step = float(unit_times(program, dur, costs.comm)[1].max(initial=0.0))
        idle = step * program.stages - float(dur.sum())
        fits = budget is None or fits_budget(simulate(program, **costs.simulate_args()).peak_memory.to_numpy(), budget)
        return step, idle, fits

    equal = equal_lengths(seq, k)
    eq_step, eq_idle, eq_fits = measure(equal)
    share = _attention_share(profile, config, counts)
    best = equal_cost_lengths(seq, k, share, quantum)
    best_step, best_idle, best_fits = measure(best)
    if (best_fits, -best_step) < (eq_fits, -eq_step):
        best, best_step, best_idle, best_fits = equal.copy(), eq_step, eq_idle, eq_fits
    deadline = began + float(time_limit) if max_evaluations is None else math.inf

    def out_of_time() -> bool:
        return time.perf_counter() > deadline or (max_evaluations is not None and evaluations >= max_evaluations)

    step_size = max(quantum, (seq // (4 * k)) // quantum * quantum)
    while step_size >= quantum and not out_of_time():
        improved = False
        for j in range(k - 1):
            for sign in (1, -1):
                bounds = np.cumsum(best)[:-1]
                bounds[j] += sign * step_size
                trial = np.diff(np.r_[0, bounds, seq])
                if (trial < quantum).any() or out_of_time():
                    continue
                step, idle, fits = measure(trial)
                if (fits or not best_fits) and step < best_step - 1e-9:
                    best, best_step, best_idle, best_fits, improved = trial, step, idle, fits, True
        if not improved:
            step_size = step_size // 2 // quantum * quantum if step_size > quantum else 0
    return SliceChoice(
        lengths=tuple(int(n) for n in best), step_time=best_step, equal_lengths=tuple(int(n) for n in equal),
        equal_step_time=eq_step, idle=best_idle, equal_idle=eq_idle, fits=best_fits, evaluations=evaluations,
        seconds=time.perf_counter() - began,
    )


def _attention_share(profile: Profile, config: PipelineConfig, counts: Any) -> float:
    """The causal-attention share of the plan's forward and backward work, all stages together."""
    arr = check_counts(profile, config, counts)
    coef = layer_coefficients(profile, config)
    tot = coef.per_stage(arr)
    att = time_attention(profile, coef, arr)
    total = float(tot["forward"].sum() + tot["backward"].sum() + tot["weight"].sum())
    part = float(att["forward"].sum() + att["backward"].sum() + att["weight"].sum())
    return part / total if total > 0 and math.isfinite(part) else 0.0


EVALUATIONS_PER_SECOND = 50
"""With ``deterministic=True``: candidates the slice-length and layer-move searches time per second
of their share of the time limit (a step of p = 8, v = 2, m = 8, k = 8 is timed in a few ms)."""

def move_layers(profile: Profile, config: PipelineConfig, counts: Any, *, deadline: float,
                allow_empty_stages: bool = False, max_evaluations: int | None = None) -> tuple[np.ndarray, int, int]:
    """Hill climbing on a sliced setup's exact step time: move one layer (of the group and mode at
    the boundary) from a virtual stage to the next in model order or back, keep a move that
    shortens the simulated step and fits the budget, until none does or ``deadline`` (a
    ``time.perf_counter`` time; or after ``max_evaluations`` candidates, when given, instead of the
    clock). Returns ``(counts, moves kept, candidates timed)``."""
    if max_evaluations is not None:
        deadline = math.inf
    program = config.program()
    budget = config.memory_budget
    fixed = layer_coefficients(profile, config).fixed_layers

    def step_of(c: np.ndarray) -> float:
        costs = slice_costs(profile, config, c)
        dur = unit_durations(program, op_durations(program, costs.forward, costs.backward, costs.weight))
        return float(unit_times(program, dur, costs.comm)[1].max(initial=0.0))

    best = np.array(check_counts(profile, config, counts), dtype=np.int64)
    best_step = step_of(best)
    kept = timed = 0
    improved = True
    while improved and time.perf_counter() < deadline and (max_evaluations is None or timed < max_evaluations):
        improved = False
        for vs in range(best.shape[2] - 1):
            for source, target in ((vs, vs + 1), (vs + 1, vs)):
                present = np.flatnonzero(best[:, :, source].sum(axis=1))
                if not len(present):
                    continue
                g = int(present[-1] if target > source else present[0])  # the group at the boundary
                for r in np.flatnonzero(best[g, :, source]):
                    trial = best.copy()
                    trial[g, r, source] -= 1
                    trial[g, r, target] += 1
                    if not allow_empty_stages and (trial.sum(axis=(0, 1)) + fixed == 0).any():
                        continue
                    if time.perf_counter() > deadline or (max_evaluations is not None and timed >= max_evaluations):
                        return best, kept, timed
                    timed += 1
                    step = step_of(trial)
                    if step < best_step * (1 - 1e-12) and (
                            fits_budget(simulate_counts(profile, config, trial).peak_memory.to_numpy(), budget)):
                        best, best_step, improved = trial, step, True
                        kept += 1
                        break
    return best, kept, timed

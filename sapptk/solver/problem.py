"""One balance problem in the solver's integer units, and the exact yardsticks of a plan.

:class:`Problem` gathers what every phase of the search reads and nobody changes: the
integer per-layer costs (:mod:`sapptk.costs`, identical groups merged by
:mod:`sapptk.solver.groups`), the program, its path and memory models, and the budget in
the memory model's scaled units. Its methods measure an assignment exactly (step time in
ticks, peaks, fit, the two tie-break objectives), in batches whose working memory is bounded.

The solver's time unit is a *tick*, ``TIME_UNIT_MS / splits`` ms (a slice op of a stage
costing c time units lasts c ticks). Every integer the solver builds a model from is
checked here, once, to stay below :data:`MAX_INTEGER` (CP-SAT needs int64 sums, the LP
exact doubles), so no model can overflow whatever values the profile and setup hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sapptk import checks
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, LayerCoefficients, layer_coefficients
from sapptk.errors import ConfigError
from sapptk.schedules.program import Program
from sapptk.solver.groups import GroupMap, merge_groups
from sapptk.solver.paths import MemoryModel, PathModel, live_rows, path_model, reduce_live_points, stage_cost_vector
from sapptk.solver.settings import SearchOptions

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["MAX_INTEGER", "Problem", "make_problem"]

MAX_INTEGER = checks.MAX_SOLVER_INTEGER
"""Largest step time (ticks) or scaled peak memory a plan may reach for the solver to take the
problem: sums of such values stay exact in int64 and in doubles."""


@dataclass(frozen=True, eq=False)
class Problem:
    """A balance problem in integer units (see the module docstring).

    ``coef`` has identical consecutive groups merged (``groups`` maps back); ``budget`` is
    in memory units × ``memory.scale``, ``None`` when unlimited (or so large that no plan can
    exceed it). ``memory`` holds every distinct live point (exact peaks, built fast at any
    size); :meth:`reduced_memory` the Pareto-maximal ones the layouts and masters use.
    """

    profile: Profile
    config: PipelineConfig
    coef: LayerCoefficients
    groups: GroupMap
    program: Program
    paths: PathModel
    memory: MemoryModel
    budget: int | None
    allow_empty: bool
    options: SearchOptions
    _reduced: list[MemoryModel] = field(default_factory=list, repr=False)

    # ----------------------------------------------------------------- sizes
    @property
    def splits(self) -> int:
        return self.program.splits

    @property
    def ticks_ms(self) -> float:
        """ms per tick."""
        return TIME_UNIT_MS / self.program.splits

    @property
    def comm_ticks(self) -> int:
        return self.coef.comm * self.program.splits

    @property
    def num_virtual_stages(self) -> int:
        return len(self.coef.fixed_forward)

    # ------------------------------------------------------------ yardsticks
    def valid(self, counts: np.ndarray) -> bool:
        """Structure the masters enforce: allowed modes only, no empty stage unless allowed."""
        if (counts[~self.coef.allowed] != 0).any():
            return False
        if not self.allow_empty:
            empty = (counts.sum(axis=(0, 1)) == 0) & (self.coef.fixed_layers == 0)
            if empty.any():
                return False
        return True

    def peaks(self, counts: np.ndarray) -> np.ndarray:
        """Peak memory of every device in memory units × ``memory.scale`` (exact)."""
        return self.memory.peaks(self.coef, self.program, counts)

    def fits(self, counts: np.ndarray) -> bool:
        """Whether an assignment fits the budget (exact, from the live points)."""
        if self.budget is None:
            return True
        return bool((self.peaks(counts) <= self.budget).all())

    def cost_vectors(self, counts_list: list[np.ndarray]) -> np.ndarray:
        """Per-vs [F; BI; W] costs of each assignment, shape (len, 3·nvs)."""
        return np.stack([stage_cost_vector(self.coef, c) for c in counts_list])

    def step_ticks(self, costs: np.ndarray) -> np.ndarray:
        """Exact step ticks of each cost vector (rows of ``costs``), in bounded batches."""
        batch = self.paths.batch_size(self.options.evaluation_bytes)
        if len(costs) <= batch:
            return self.paths.steps(costs, self.coef.comm)
        return np.concatenate([self.paths.steps(costs[i : i + batch], self.coef.comm)
                               for i in range(0, len(costs), batch)])

    def critical_paths(self, costs: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
        """Exact step ticks and one critical path (signature, crossings) per cost vector."""
        batch = self.paths.batch_size(self.options.evaluation_bytes)
        steps, found = [], []
        for i in range(0, len(costs), batch):
            s, p = self.paths.longest(costs[i : i + batch], self.coef.comm)
            steps.append(s)
            found += p
        return np.concatenate(steps), found

    def overhead(self, counts: np.ndarray) -> int:
        """Recompute overhead (time units per micro-batch): the first tie-break."""
        return int(np.einsum("grv,gr->", counts, self.coef.overhead))

    def deviation(self, counts: np.ndarray) -> int:
        """``Σ_vs |V · layers_vs − N|``: the second tie-break."""
        V = counts.shape[2]
        return int(np.abs(V * counts.sum(axis=(0, 1)) - int(self.coef.counts.sum())).sum())

    def reduced_memory(self, deadline: float | None = None) -> MemoryModel:
        """The Pareto-maximal live points (same scale; computed once). Raises
        :class:`~sapptk.solver.paths.OutOfTime` past ``deadline``."""
        if not self._reduced:
            self._reduced.append(reduce_live_points(self.memory, deadline))
        return self._reduced[0]

    def budget_mb(self) -> float | None:
        return None if self.config.memory_budget is None else float(self.config.memory_budget)

    def scaled_to_mb(self, value: float) -> float:
        """Scaled memory units → MB."""
        return value / self.memory.scale * MEMORY_UNIT_MB


def make_problem(
    profile: Profile, config: PipelineConfig, *, allow_empty: bool, options: SearchOptions
) -> Problem:
    """The integer problem of ``profile`` on ``config`` (validated by the caller).

    Raises :class:`~sapptk.errors.ConfigError` when a plan's step time or peak memory could
    exceed :data:`MAX_INTEGER` in the solver's units, naming the largest value.
    """
    full = layer_coefficients(profile, config)
    coef, groups = merge_groups(full)
    program = config.program()
    paths = path_model(program)
    memory = live_rows(program)
    _check_time_range(coef, paths, program, config)
    most = _check_memory_range(coef, memory, program, config)
    budget = None
    if config.memory_budget is not None:
        scaled = math.floor(float(config.memory_budget) / MEMORY_UNIT_MB * memory.scale + 1e-6)
        budget = None if scaled >= most else int(scaled)  # no plan can reach it: unlimited
    return Problem(
        profile=profile, config=config, coef=coef, groups=groups, program=program, paths=paths,
        memory=memory, budget=budget, allow_empty=allow_empty, options=options,
    )


def _check_time_range(coef: LayerCoefficients, paths: PathModel, program: Program, config: PipelineConfig) -> None:
    """A path is at most every op's duration plus every latency: each layer sits on one stage,
    whose ops of each kind number at most the largest column of the unit signatures."""
    layers = [int(n) for n in coef.counts]
    per_pass = sum(n * (int(coef.forward[g]) + int(coef.backward[g].max(initial=0)) + int(coef.weight[g]))
                   for g, n in enumerate(layers))
    per_pass += int(coef.fixed_forward.sum()) + int(coef.fixed_backward.sum()) + int(coef.fixed_weight.sum())
    most_ops = int(paths.unit_sig.sum(axis=0).max(initial=0))
    worst = most_ops * per_pass + program.graph.n_units * int(coef.comm) * program.splits
    if worst >= MAX_INTEGER:
        ms = worst * TIME_UNIT_MS / program.splits
        raise ConfigError(
            f"the step time of some plan could reach {ms:.3g} ms ({program.num_ops} ops; "
            f"{per_pass * TIME_UNIT_MS:.3g} ms of layer work per micro-batch; comm = {config.comm!r} ms): more than "
            f"the solver's integer range of {MAX_INTEGER * TIME_UNIT_MS / program.splits:.3g} ms; expected "
            "smaller layer times, fewer micro-batches or a smaller comm"
        )


def _check_memory_range(coef: LayerCoefficients, memory: MemoryModel, program: Program, config: PipelineConfig) -> int:
    """Largest scaled peak any plan could have; raises when it is beyond :data:`MAX_INTEGER`."""
    layers = int(coef.counts.sum())
    params = layers * int(coef.params.max(initial=0)) + int(coef.fixed_params.sum()) + int(coef.constant)
    act = layers * int(coef.activation.max(initial=0)) + int(coef.fixed_activation.sum())
    live = max((int(rows.sum(axis=1).max()) for rows in memory.rows if len(rows)), default=0)
    worst = memory.scale * params + live * act
    if worst >= MAX_INTEGER:
        mb = worst / memory.scale * MEMORY_UNIT_MB
        raise ConfigError(
            f"the peak memory of some plan could reach {mb:.3g} MB (params, activations and "
            f"constant_memory = {config.constant_memory!r} MB over {layers} layers): more than the solver's integer "
            f"range of {MAX_INTEGER / memory.scale * MEMORY_UNIT_MB:.3g} MB; expected smaller memory figures"
        )
    return worst

"""One CP-SAT call on a master problem: :func:`run_master`, and the plans it reports.

Every solution CP-SAT reports on its way is a real, memory-feasible plan worth timing
exactly, so a callback keeps them all. The call is capped by the caller's clock (and an
optional per-call cap); a ``stop`` request ends it within a few tens of milliseconds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from sapptk.solver.clock import Clock
    from sapptk.solver.masters import Master

__all__ = ["MasterSolve", "SolutionCollector", "run_master"]

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "unknown",
}

MIN_SECONDS = 0.05
"""Shortest CP-SAT call: CP-SAT treats 0 as 'no time at all' and answers UNKNOWN at once."""


@dataclass
class MasterSolve:
    """What one CP-SAT call found: ``status`` ("optimal", "feasible", "infeasible" — proven
    within the master — or "unknown"), the objective value and best bound (when known),
    and every solution it reported, as layer counts."""

    status: str
    objective: float | None = None
    bound: float | None = None
    solutions: list[np.ndarray] = field(default_factory=list)


class SolutionCollector(cp_model.CpSolverSolutionCallback):
    """Keeps every solution CP-SAT reports; stops the search when the clock says so."""

    def __init__(self, variables: list[cp_model.IntVar], clock: Clock | None = None) -> None:
        super().__init__()
        self._vars = variables
        self._clock = clock
        self.solutions: list[list[int]] = []

    def on_solution_callback(self) -> None:
        self.solutions.append([self.value(v) for v in self._vars])
        if self._clock is not None and self._clock.stopped:
            self.stop_search()


def run_master(
    master: Master,
    clock: Clock,
    *,
    workers: int,
    seed: int,
    deterministic: bool,
    time_cap: float | None = None,
) -> MasterSolve:
    """Solve ``master`` once, within the clock's deadline and ``time_cap`` seconds.

    Deterministic: one sequential worker, and ``time_cap`` counted in CP-SAT's deterministic
    time (so the sequence of calls is reproducible; only the wall-clock deadline can cut it
    short). CP-SAT 9.15's ``interleave_search``, its documented deterministic parallel mode,
    aborts on some of these models ("Check failed: heuristics.fixed_search != nullptr").
    """
    if clock.expired():
        return MasterSolve("unknown")
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.catch_sigint_signal = False  # on, CP-SAT leaves SIGINT fatal after a solve (sapptk.solver.interrupt)
    prm.num_workers = 1 if deterministic else int(workers)
    prm.random_seed = int(seed)
    if deterministic:
        prm.max_time_in_seconds = max(MIN_SECONDS, clock.remaining())
        if time_cap is not None:
            prm.max_deterministic_time = max(MIN_SECONDS, time_cap)
    else:
        limit = clock.remaining() if time_cap is None else min(clock.remaining(), time_cap)
        prm.max_time_in_seconds = max(MIN_SECONDS, limit)
    collector = SolutionCollector(master.variables, clock)
    done = threading.Event()
    watcher = None
    if clock.stop is not None:
        watcher = threading.Thread(target=_watch, args=(clock, solver, done), daemon=True)
        watcher.start()
    try:
        code = solver.solve(master.model, collector)
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
    if code == cp_model.MODEL_INVALID:
        # every model is built from checked integers (sapptk.solver.problem): this is our bug
        raise RuntimeError(f"sapptk internal error: the solver built an invalid CP-SAT model: "
                           f"{master.model.validate()}")
    status = _STATUS.get(code, "unknown")
    out = MasterSolve(status, solutions=[master.counts_of(v) for v in collector.solutions])
    if status in ("optimal", "feasible"):
        out.objective = float(solver.objective_value)
        out.bound = float(solver.best_objective_bound)
        final = master.counts_of([solver.value(v) for v in master.variables])
        if not any(np.array_equal(final, s) for s in out.solutions[-1:]):
            out.solutions.append(final)
    elif status == "unknown":
        out.bound = float(solver.best_objective_bound)
    return out


def _watch(clock: Clock, solver: cp_model.CpSolver, done: threading.Event) -> None:
    """Stop ``solver`` as soon as the caller's stop event is set (until ``done``)."""
    while not done.wait(0.02):
        if clock.stopped:
            solver.stop_search()
            return

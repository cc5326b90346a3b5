"""Why nothing fits: the device that needs the most memory even in its best layout, and by how much.

Called when the search has proven that no plan fits the budget. It answers within the time
the caller's limit leaves (and at most ``SearchOptions.diagnosis_seconds``), never past it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sapptk.solver.cpsat import run_master
from sapptk.solver.masters import LayerMaster
from sapptk.solver.paths import OutOfTime
from sapptk.solver.problem import MAX_INTEGER

if TYPE_CHECKING:
    from sapptk.solver.clock import Clock
    from sapptk.solver.problem import Problem

__all__ = ["explain_infeasible"]


def explain_infeasible(problem: Problem, clock: Clock, *, workers: int = 2, seed: int = 0) -> str:
    """A message naming the device and the shortfall.

    First a direct bound: each device with the fewest layers it must hold (one per stage
    without head or tail), all in the group's lowest-activation allowed mode. If that already
    exceeds the budget, it names the device. Otherwise the shortfall is joint (the layers
    must go somewhere), and a small CP-SAT model looks for the least possible peak of the
    fullest device, in the time left.
    """
    coef, program, mem = problem.coef, problem.program, problem.memory
    budget_mb = problem.budget_mb()
    budget_mb = math.inf if budget_mb is None else budget_mb
    # a body layer needs at least the smallest params and the smallest activation any allowed mode has
    min_params = int(coef.params.min())
    min_act = int(np.where(coef.allowed, coef.activation, np.iinfo(np.int64).max).min())
    lowest = []
    for d, stages in enumerate(program.device_stages):
        static = coef.constant + sum(int(coef.fixed_params[vs]) for vs in stages)
        act = []
        for vs in stages:
            a = int(coef.fixed_activation[vs])
            if not problem.allow_empty and coef.fixed_layers[vs] == 0:
                static += min_params
                a += min_act
            act.append(a)
        rows = mem.rows[d]
        live = int((rows @ np.asarray(act, dtype=np.int64)).max()) if len(rows) else 0
        lowest.append(problem.scaled_to_mb(mem.scale * static + live))
    worst = int(np.argmax(lowest))
    if lowest[worst] > budget_mb:
        return (
            f"infeasible: device {worst} needs at least {lowest[worst]:.6g} MB even with the fewest layers it "
            f"must hold, in the strongest allowed recompute mode; the budget is {budget_mb:.6g} MB, "
            f"{lowest[worst] - budget_mb:.6g} MB short"
        )
    seconds = min(problem.options.diagnosis_seconds, clock.remaining())
    joint = f"infeasible: no layout fits the budget of {budget_mb:.6g} MB on every device at once"
    if seconds < 0.1:
        return joint + " (the least possible peak was not computed: the time limit ran out)"
    # joint shortfall: minimise the fullest device's peak
    try:
        memory = problem.reduced_memory(clock.deadline)
    except OutOfTime:
        return joint + " (the least possible peak was not computed: the time limit ran out)"
    master = LayerMaster(coef, program, problem.comm_ticks, budget=None, allow_empty=problem.allow_empty,
                         memory=memory)
    model = master.model
    peak = model.new_int_var(0, MAX_INTEGER, "peak")  # every peak is below it (checked by make_problem)
    for _, expr in master.peaks:
        model.add(peak >= expr)
    model.minimize(peak)
    found = run_master(master, clock, workers=workers, seed=seed, deterministic=False, time_cap=seconds)
    if found.status not in ("optimal", "feasible"):
        return joint
    counts = found.solutions[-1]
    peaks = [problem.scaled_to_mb(v) for v in problem.peaks(counts).tolist()]
    device = int(np.argmax(peaks))
    exact = found.status == "optimal"
    need = peaks[device] if exact else problem.scaled_to_mb(math.ceil((found.bound or 0.0) - 1e-9))
    return (
        f"infeasible: the layers must go somewhere, and every layout leaves some device over budget; the best "
        f"one still needs {need:.6g} MB on device {device} {'(proven least)' if exact else '(a lower bound)'}, "
        f"{need - budget_mb:.6g} MB over the budget of {budget_mb:.6g} MB"
    )

"""What a figure may be given: a :class:`~sapptk.plan.Plan` or a
:class:`~sapptk.simulation.Simulation`, and the memory budget that goes with it.

A plan stands for its simulation (``plan.simulation``). The budget line of a figure is
``budget="auto"`` by default: the plan's ``config.memory_budget``, or the simulation's
``memory_budget`` (set by ``simulate(..., memory_budget=...)`` and by ``Plan.simulate()``);
a number draws that budget instead, and ``None`` draws none.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Literal

from sapptk.errors import SapptkError
from sapptk.plan import Plan
from sapptk.simulation import Simulation

AUTO = "auto"
Budget = float | Literal["auto"] | None
"""A figure's ``budget=``: MB, ``"auto"`` (from the plan or simulation), or None (no line)."""


def simulation_of(subject: Any, where: str) -> Simulation:
    """The simulation a figure draws: the subject itself, or a plan's simulation."""
    if isinstance(subject, Simulation):
        return subject
    if isinstance(subject, Plan):
        return subject.simulation  # a plan without an assignment says so (ConfigError)
    raise SapptkError(f"{where}: expected a sapptk Plan or Simulation, got {type(subject).__name__}")


def own_budget(subject: Any) -> float | None:
    """The memory budget a plan or simulation carries (None when it has none)."""
    if isinstance(subject, Plan):
        return subject.config.memory_budget
    return getattr(subject, "memory_budget", None)


def budget_of(subject: Any, budget: Budget, where: str) -> float | None:
    """The budget line to draw for ``subject`` given the figure's ``budget=`` argument."""
    if isinstance(budget, str) and budget == AUTO:
        value = own_budget(subject)
        return None if value is None else float(value)
    return check_budget(budget, where)


def check_budget(budget: Any, where: str) -> float | None:
    """``budget`` as MB (None stays None), or a clear error."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, Real) or not math.isfinite(budget) or budget <= 0:
        raise SapptkError(
            f"{where}: budget = {budget!r}: expected MB > 0, None (no budget line) or 'auto' "
            "(the plan's or the simulation's own budget)"
        )
    return float(budget)

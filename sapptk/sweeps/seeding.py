"""Seeds within a sweep: the step time never rises with the budget.

A plan that fits one point fits every point of the same setup whose budget is at least as
large and whose recompute modes include its own (the same profile, schedule, sizes, comm
and constant memory, and the same solver options): a *family*. So the points of a family
are solved in order of budget, in *waves* (the first point of every family, then the second
...), each wave in parallel on the executor, and every point starts its search from the
fastest plan found so far in its family that it admits (``balance(..., start=...)``): its
answer is never slower than that plan, so within a family the step time never rises with
the budget or with more modes. Points read from the cache seed too (the cache keeps each
plan's layout, :data:`sapptk.sweeps.cache.LAYOUT_COLUMN`), so a resumed sweep keeps the
promise; only rows cached before layouts were kept seed nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sapptk.profile import MODES, mode_set
from sapptk.sweeps.solving import COUNTS_KEY, Result, Task

__all__ = ["Seeds", "admits", "family", "waves"]

_FREE = ("memory_budget", "recompute")  # the fields a seed's point may differ in


def family(task: Task) -> tuple[Any, ...]:
    """The points whose plans are interchangeable: everything but the budget and the modes."""
    config = task["config"]
    fixed = tuple(sorted((k, _hashable(v)) for k, v in config.items() if k not in _FREE))
    return (task["profile_digest"], task["time_limit"], task["seed"], task["deterministic"], fixed)


def _budget(task: Task) -> float | None:
    """The point's budget (inf: unlimited), or None when it is not a number (an invalid point)."""
    budget = task["config"].get("memory_budget")
    if budget is None:
        return math.inf
    if isinstance(budget, bool) or not isinstance(budget, int | float) or math.isnan(budget):
        return None
    return float(budget)


def _modes(task: Task) -> frozenset[str]:
    recompute = task["config"].get("recompute")
    modes = MODES if recompute is None else mode_set(recompute)
    return frozenset(modes) if isinstance(modes, tuple) else frozenset()


def admits(later: Task, earlier: Task) -> bool:
    """Whether a plan of ``earlier`` is a plan of ``later`` (same family, no smaller budget,
    a superset of its recompute modes)."""
    low, high = _budget(earlier), _budget(later)
    return (low is not None and high is not None and family(later) == family(earlier) and low <= high
            and _modes(earlier) <= _modes(later))


def waves(tasks: Sequence[Task]) -> list[list[Task]]:
    """The tasks in waves: wave ``i`` holds the ``i``-th point of every family in order of
    budget (then fewer modes first), so every point comes after the points it admits."""
    families: dict[tuple[Any, ...], list[Task]] = {}
    for task in tasks:
        families.setdefault(family(task), []).append(task)
    for members in families.values():
        members.sort(key=lambda t: (_budget(t) is None, _budget(t) or 0.0, len(_modes(t))))
    depth = max((len(m) for m in families.values()), default=0)
    return [[m[i] for m in families.values() if i < len(m)] for i in range(depth)]


class Seeds:
    """The plans found so far in a sweep, by family; :meth:`seed` gives a task its start."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], list[tuple[Task, list, float]]] = {}

    def keep(self, task: Task, result: Result) -> None:
        """Remember the plan of a finished point (if it has one)."""
        counts = result.get(COUNTS_KEY)
        step = result.get("step_time_ms")
        if counts is not None and step is not None and not math.isnan(float(step)):
            self._plans.setdefault(family(task), []).append((task, counts, float(step)))

    def seed(self, task: Task) -> None:
        """Set ``task["start"]`` to the fastest plan so far that the point admits (or leave it)."""
        fits = [(step, counts) for earlier, counts, step in self._plans.get(family(task), [])
                if admits(task, earlier)]
        if fits:
            task["start"] = min(fits, key=lambda f: f[0])[1]


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)  # an odd value (an invalid point): compared by how it prints
    return value

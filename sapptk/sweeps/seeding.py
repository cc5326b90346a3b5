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

The levers are part of the family (a point with another memory margin, OOM risk or
per-micro-batch setting is another question); a safe budget grows with the budget, so the
order holds under a margin or a risk too. Offload is a mode here: a plan without offload
seeds a point that allows it, never the other way round. A plan that recomputes per
micro-batch seeds with its per-stage layout, so there the promise holds for the per-stage
search only (the per-micro-batch phase then starts from the seeded per-stage plan).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sapptk.sweeps.grid import CONFIG_FIELDS, LEVER_FIELDS
from sapptk.sweeps.solving import Layout, PointResult, SweepTask

__all__ = ["Seeds", "admits", "family", "waves"]

_FREE = ("memory_budget", "recompute")  # the fields a seed's point may differ in


def family(task: SweepTask) -> tuple[Any, ...]:
    """The points whose plans are interchangeable: everything but the budget and the modes."""
    r = task.request
    fixed = tuple((f, _hashable(getattr(r.config, f))) for f in CONFIG_FIELDS if f not in _FREE)
    levers = tuple(_hashable(getattr(r, f)) for f in LEVER_FIELDS)
    return (task.profile_digest, r.time_limit, r.seed, r.deterministic, levers, fixed)


def _budget(task: SweepTask) -> float:
    """The point's budget (inf: unlimited)."""
    budget = task.request.config.memory_budget
    return math.inf if budget is None else float(budget)


def _modes(task: SweepTask) -> frozenset[str]:
    """The modes a plan of the point may use (``"offload"`` counted as one)."""
    return frozenset(task.request.config.recompute)


def admits(later: SweepTask, earlier: SweepTask) -> bool:
    """Whether a plan of ``earlier`` is a plan of ``later`` (same family, no smaller budget,
    a superset of its recompute modes)."""
    return (family(later) == family(earlier) and _budget(earlier) <= _budget(later)
            and _modes(earlier) <= _modes(later))


def waves(tasks: Sequence[SweepTask]) -> list[list[SweepTask]]:
    """The tasks in waves: wave ``i`` holds the ``i``-th point of every family in order of
    budget (then fewer modes first), so every point comes after the points it admits."""
    families: dict[tuple[Any, ...], list[SweepTask]] = {}
    for task in tasks:
        families.setdefault(family(task), []).append(task)
    for members in families.values():
        members.sort(key=lambda t: (_budget(t), len(_modes(t))))
    depth = max((len(m) for m in families.values()), default=0)
    return [[m[i] for m in families.values() if i < len(m)] for i in range(depth)]


class Seeds:
    """The plans found so far in a sweep, by family; :meth:`seed` gives a task its start."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], list[tuple[SweepTask, Layout, float]]] = {}

    def keep(self, task: SweepTask, result: PointResult) -> None:
        """Remember the plan of a finished point (if it has one)."""
        step = result.step_time_ms
        if result.layout is not None and step is not None and not math.isnan(float(step)):
            self._plans.setdefault(family(task), []).append((task, result.layout, float(step)))

    def seed(self, task: SweepTask) -> SweepTask:
        """``task`` starting from the fastest plan so far that the point admits (or as it is)."""
        fits = [(step, layout) for earlier, layout, step in self._plans.get(family(task), [])
                if admits(task, earlier)]
        if not fits:
            return task
        return task.with_start(min(fits, key=lambda f: f[0])[1])


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)  # an odd value (a calibration as memory error): compared by how it prints
    return value

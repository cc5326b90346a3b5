"""One point, solved: a typed task in, a typed result out.

A :class:`SweepTask` carries the point's checked :class:`~sapptk.request.SolveRequest` (its
profile, config, time limit, workers, seed, determinism and levers; never a ``stop`` event,
which a request drops when it is pickled), its cache key and profile name, the
:class:`Layout` of an earlier plan to start from, and the sweep's deadline (wall-clock
``time.time()`` seconds, or None): :func:`timed` does not start a point past it (status
``not_started``) and gives a point started near it only the time left (a result that is not
proven, ``feasible`` or ``unknown``, is then ``cut``: not cached). A :class:`PointResult` carries the frame's
result columns and the plan's :class:`Layout` (which seeds later points and is cached, but is
not a frame column). Both are frozen dataclasses of plain values, so they cross process and
machine boundaries unchanged; each worker builds its own CP-SAT model. A point that cannot be
solved becomes a result with its status and reason, never an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pickle
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.errors import SapptkError
from sapptk.request import SolveRequest
from sapptk.sweeps.frame import NOT_STARTED, RESULT_COLUMNS, SOLVED, STATUSES

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan
    from sapptk.profile import Profile

__all__ = ["MIN_SECONDS", "Layout", "PointResult", "Solve", "SweepTask", "capped", "not_started", "plan_row",
           "portable", "solve_point", "timed"]

FINAL = ("optimal", "infeasible", "invalid")
"""Statuses a longer time limit cannot change."""
MIN_SECONDS = 0.05
"""A point is not started with less than this many seconds of the sweep's time limit left."""


@dataclass(frozen=True)
class Layout:
    """A plan's layer assignment, kept to seed later points (:mod:`sapptk.sweeps.seeding`):
    ``counts`` as nested lists (virtual stage × group × mode) and, for a plan that offloads
    activations, ``offload`` (nested lists of the same shape but the mode)."""

    counts: list
    offload: list | None = None

    @classmethod
    def of_plan(cls, plan: Plan) -> Layout | None:
        """The layout of a plan with an assignment (None without one)."""
        if not plan.solved:
            return None
        offload = getattr(plan, "offload", None)
        return cls(np.asarray(plan.counts).tolist(), None if offload is None else np.asarray(offload).tolist())

    def to_json(self) -> str:
        """JSON as the cache stores it: the counts, or ``{"counts": ..., "offload": ...}``."""
        return json.dumps(self.counts if self.offload is None else {"counts": self.counts, "offload": self.offload})

    @classmethod
    def from_json(cls, text: Any) -> Layout | None:
        """A cached layout, or None when there is none or it is unreadable (a damaged part: that
        point just seeds nothing; a seed is checked again before use)."""
        if not isinstance(text, str):
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if isinstance(data, list):
            return cls(data)
        if isinstance(data, dict) and isinstance(data.get("counts"), list):
            offload = data.get("offload")
            return cls(data["counts"], offload if isinstance(offload, list) else None)
        return None

    def start(self, profile: Profile, config: PipelineConfig) -> np.ndarray | Plan | None:
        """The layout as a start of the search: counts, or a plan when it offloads (so the offload
        search starts from its own offload); None when it does not suit the point (a seed read
        from a damaged cache must not cost the point its answer)."""
        from sapptk.costs import check_counts
        from sapptk.plan import make_plan

        try:
            counts = check_counts(profile, config, np.asarray(self.counts, dtype=np.int64))
            if self.offload is None:
                return counts
            return make_plan(profile, config, counts, status="given", offload=np.asarray(self.offload, np.int64))
        except (SapptkError, ValueError, TypeError, OverflowError):
            return None


@dataclass(frozen=True)
class SweepTask:
    """One point to solve: its cache ``key``, the ``profile_name`` of its row, the profile's
    content hash ``profile_digest``, the checked ``request`` and the ``start`` layout (an
    earlier plan of its family, or None)."""

    key: str
    profile_name: str
    profile_digest: str
    request: SolveRequest
    start: Layout | None = None
    deadline: float | None = None
    sweep_limit: float | None = None

    def with_start(self, start: Layout | None) -> SweepTask:
        return dataclasses.replace(self, start=start)

    def with_deadline(self, deadline: float | None, sweep_limit: float | None) -> SweepTask:
        """The task with the sweep's deadline (``time.time()`` seconds) and its time limit (for messages)."""
        return dataclasses.replace(self, deadline=deadline, sweep_limit=sweep_limit)


@dataclass(frozen=True)
class PointResult:
    """What solving a point gave: the frame's result columns (see :mod:`sapptk.sweeps.frame`),
    the point's ``key``, the plan's ``layout`` (None without a plan), and whether the sweep's
    deadline ``cut`` its time limit short before it was proven (such a result is not cached)."""

    key: str
    status: str
    step_time_ms: float | None = None
    bound_ms: float | None = None
    gap: float | None = None
    bubble_of_compute: float | None = None
    bubble_of_step: float | None = None
    peak_mb_max: float | None = None
    peak_mb: tuple[float, ...] | None = None
    recompute_ms: float | None = None
    solve_seconds: float | None = None
    error: str | None = None
    layout: Layout | None = None
    cut: bool = False

    def columns(self) -> dict[str, Any]:
        """The result columns of the frame, by name."""
        row = {name: getattr(self, name) for name in RESULT_COLUMNS}
        row["peak_mb"] = None if self.peak_mb is None else list(self.peak_mb)
        return row

    @classmethod
    def of(cls, key: str, value: PointResult | Mapping[str, Any]) -> PointResult:
        """A solve function's answer for point ``key``: a :class:`PointResult`, or a mapping of
        result columns (what a hand-written ``solve`` may return); anything else, an unknown
        column or status, is an ``error`` result saying so."""
        if isinstance(value, PointResult):
            return dataclasses.replace(value, key=key)
        if not isinstance(value, Mapping):
            return no_plan(key, "error", f"the solve function returned {type(value).__name__}: expected a "
                                         "PointResult or a mapping of result columns")
        unknown = [k for k in value if k not in RESULT_COLUMNS and k not in ("key", "layout")]
        if unknown:
            return no_plan(key, "error", f"the solve function returned the unknown column {unknown[0]!r}: "
                                         f"expected some of {', '.join(RESULT_COLUMNS)}")
        if value.get("status") not in STATUSES:
            return no_plan(key, "error", f"the solve function returned status {value.get('status')!r}: expected "
                                         f"one of {', '.join(STATUSES)}")
        fields = {k: _plain(v) for k, v in value.items() if k != "key"}
        if fields.get("peak_mb") is not None:
            fields["peak_mb"] = tuple(float(x) for x in fields["peak_mb"])
        layout = fields.get("layout")
        if layout is not None and not isinstance(layout, Layout):
            return no_plan(key, "error", f"the solve function returned layout = {type(layout).__name__}: expected "
                                         "a sapptk.sweeps.solving.Layout or None")
        return cls(key=key, **fields)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], layout: Layout | None) -> PointResult:
        """A cached row's result (missing values as None)."""
        fields: dict[str, Any] = {}
        for name in RESULT_COLUMNS:
            value = row.get(name)
            if name == "peak_mb":
                value = None if not isinstance(value, list | tuple | np.ndarray) else tuple(float(x) for x in value)
            elif isinstance(value, float) and math.isnan(value):
                value = None
            fields[name] = value
        return cls(key=str(row["key"]), layout=layout, **fields)


Solve = Callable[[SweepTask], "PointResult | Mapping[str, Any]"]
"""A function that solves one point (:func:`solve_point`, or one of the user's)."""


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def no_plan(key: str, status: str, reason: str) -> PointResult:
    """The result of a point without a plan."""
    return PointResult(key=key, status=status, error=reason)


def not_started(key: str, sweep_limit: float | None) -> PointResult:
    """The result of a point the sweep's ``time_limit`` left no time to start."""
    return no_plan(key, NOT_STARTED, f"not started: the sweep's time_limit of {sweep_limit:g} s ran out before "
                                     "this point's turn (not cached: a rerun with the same cache solves it)")


def plan_row(plan: Any) -> dict[str, Any]:
    """The result columns of a :class:`~sapptk.plan.Plan` (simulated when it has a solution)."""
    row: dict[str, Any] = {
        "status": plan.status,
        "step_time_ms": plan.step_time,
        "bound_ms": plan.bound,
        "gap": plan.gap,
        "error": None,
    }
    if plan.status not in SOLVED:
        row["error"] = plan.message or f"solver status {plan.status}"
        return row
    sim = plan.simulate()
    peaks = tuple(float(x) for x in np.asarray(sim.peak_memory, dtype=float))
    devices = plan.devices
    row.update(
        bubble_of_compute=float(sim.bubble.of_compute),
        bubble_of_step=float(sim.bubble.of_step),
        peak_mb=peaks,
        peak_mb_max=max(peaks, default=math.nan),
        recompute_ms=float(devices["recompute_ms"].sum()) * plan.config.micro_batches,
    )
    return row


def solve_point(task: SweepTask) -> PointResult:
    """Solve and simulate one point (runs in workers): the task's request, started from its
    ``start`` layout when that suits the point. Errors become results:
    :class:`~sapptk.errors.SapptkError` gives ``invalid``, anything else ``error``."""
    from sapptk.balancer import solve  # the solver stack loads in the worker only

    try:
        late, cut = capped(task)  # the import may have taken seconds of the sweep's time limit
        request = task.request.replace(time_limit=MIN_SECONDS) if late is None else late.request
        cut = cut or late is None
        if task.start is not None:
            start = task.start.start(request.profile, request.safe_config)
            if start is not None:
                with contextlib.suppress(SapptkError):  # not a start of this point after all: search without it
                    request = request.replace(start=start)
        plan = solve(request)
        return PointResult(key=task.key, layout=Layout.of_plan(plan), cut=cut, **plan_row(plan))
    except SapptkError as exc:
        return no_plan(task.key, "invalid", str(exc))
    except Exception as exc:  # a row, not a lost sweep; the traceback's last line helps
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return no_plan(task.key, "error",
                       f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})")


class _ByValue:
    """A function shipped by value (cloudpickle): one defined in a notebook or script has no
    module a fresh worker process could import it from."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __call__(self, task: SweepTask) -> PointResult | Mapping[str, Any]:
        return pickle.loads(self.blob)(task)


def portable(solve: Solve) -> Solve:
    """``solve`` in a form a fresh process can unpickle: by reference when importable,
    else by value if cloudpickle (a Dask dependency) is installed."""
    if getattr(solve, "__module__", "__main__") != "__main__" and "<locals>" not in solve.__qualname__:
        return solve
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - then only importable functions work in processes
        return solve
    return _ByValue(cloudpickle.dumps(solve))


def capped(task: SweepTask) -> tuple[SweepTask | None, bool]:
    """The task with its solve's time limit capped at what is left of the sweep's (and whether
    it was capped); None when too little is left to start."""
    if task.deadline is None:
        return task, False
    left = task.deadline - time.time()
    if left <= MIN_SECONDS:
        return None, False
    if left < task.request.time_limit:
        return dataclasses.replace(task, request=task.request.replace(time_limit=left)), True
    return task, False


def timed(solve: Solve, task: SweepTask) -> PointResult:
    """Run ``solve`` on a task; its result with the key and wall time; never raise (but interrupts).

    Past the task's deadline the point is ``not_started``; nearer to it than the point's time
    limit, the solve gets only the time left and the result is ``cut``."""
    key, sweep_limit = task.key, task.sweep_limit
    t0 = time.perf_counter()
    task, cut = capped(task)
    if task is None:
        return not_started(key, sweep_limit)
    try:
        result = PointResult.of(task.key, solve(task))
    except Exception as exc:
        result = no_plan(task.key, "error", f"{type(exc).__name__}: {exc}")
    cut = (cut or result.cut) and result.status not in FINAL  # a proven answer holds whatever the limit
    if cut != result.cut:
        result = dataclasses.replace(result, cut=cut)
    if result.solve_seconds is None:
        result = dataclasses.replace(result, solve_seconds=time.perf_counter() - t0)
    return result

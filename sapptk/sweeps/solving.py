"""One point, solved: a plain task dict in, a plain result dict out.

Tasks and results are plain data (numbers, strings, lists, the profile as
``Profile.to_dict()``), so they cross process and machine boundaries unchanged; each
worker rebuilds the profile and config and builds its own CP-SAT model. A point that
cannot be solved becomes a result with its status and reason, never an exception.
"""

from __future__ import annotations

import math
import pickle
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk.config import PipelineConfig
from sapptk.errors import SapptkError
from sapptk.profile import Profile
from sapptk.sweeps.frame import SOLVED, no_plan

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["COUNTS_KEY", "Result", "Solve", "Task", "plan_row", "portable", "profile_of", "solve_point", "timed"]

Task = dict[str, Any]
Result = dict[str, Any]
Solve = Callable[[Task], Result]

COUNTS_KEY = "_counts"
"""Key of a result holding the plan's layer assignment, for seeding later points
(:mod:`sapptk.sweeps.seeding`): the counts as nested lists, or ``{"counts": ..., "offload":
...}`` for a plan that offloads activations. The driver keeps it out of the frame (the cache
stores it as JSON)."""

_PROFILES: dict[str, Profile] = {}  # per worker process: content hash -> rebuilt profile


def profile_of(task: Task) -> Profile:
    """The task's profile, rebuilt once per worker process (cached by content hash)."""
    digest = task["profile_digest"]
    profile = _PROFILES.get(digest)
    if profile is None:
        if len(_PROFILES) > 32:
            _PROFILES.clear()
        profile = _PROFILES[digest] = Profile.from_dict(task["profile"], source=f"<sweep: {task['profile_name']}>")
    return profile


def plan_row(plan: Any) -> Result:
    """The result columns of a :class:`~sapptk.plan.Plan` (simulated when it has a solution)."""
    row: Result = {
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
    peaks = [float(x) for x in np.asarray(sim.peak_memory, dtype=float)]
    devices = plan.devices
    row.update(
        bubble_of_compute=float(sim.bubble.of_compute),
        bubble_of_step=float(sim.bubble.of_step),
        peak_mb=peaks,
        peak_mb_max=max(peaks, default=math.nan),
        recompute_ms=float(devices["recompute_ms"].sum()) * plan.config.micro_batches,
    )
    return row


def _seed_start(profile: Profile, config: PipelineConfig, start: Any) -> np.ndarray | Plan | None:
    """A seed (see :data:`COUNTS_KEY`) as counts, or as a plan when it offloads (so the offload
    search starts from its own offload); None when it does not suit the point (a seed read from
    a damaged cache must not cost the point its answer: the search then starts without it)."""
    from sapptk.costs import check_counts
    from sapptk.plan import make_plan

    if start is None:
        return None
    try:
        if isinstance(start, dict):
            counts = check_counts(profile, config, np.asarray(start["counts"], dtype=np.int64))
            return make_plan(profile, config, counts, status="given", offload=np.asarray(start["offload"], np.int64))
        return check_counts(profile, config, np.asarray(start, dtype=np.int64))
    except (SapptkError, ValueError, TypeError, OverflowError, KeyError):
        return None


def solve_point(task: Task) -> Result:
    """Balance and simulate one point; plain dict in, plain dict out (runs in workers).

    ``task`` holds ``profile`` (``Profile.to_dict()``), ``profile_name``,
    ``profile_digest``, ``config`` (the :class:`PipelineConfig` fields), ``time_limit``,
    ``workers``, ``seed``, ``deterministic`` and, optionally, ``start`` (a layer assignment
    as nested lists: the search's first incumbent, :mod:`sapptk.sweeps.seeding`). The result
    holds the result columns, and the plan's layer assignment under :data:`COUNTS_KEY`. Errors
    become results: :class:`~sapptk.errors.SapptkError` gives ``invalid``, anything else
    ``error``.
    """
    from sapptk.balancer import balance  # the solver stack loads in the worker only

    try:
        profile = profile_of(task)
        config = PipelineConfig(**task["config"])
        config.check(profile)
        plan = balance(
            profile,
            config,
            time_limit=task["time_limit"],
            workers=task["workers"],
            seed=task["seed"],
            deterministic=task["deterministic"],
            start=_seed_start(profile, config, task.get("start")),
        )
        row = plan_row(plan)
        if plan.solved:
            counts = np.asarray(plan.counts).tolist()
            offload = getattr(plan, "offload", None)
            row[COUNTS_KEY] = counts if offload is None else {"counts": counts, "offload": np.asarray(offload).tolist()}
        return row
    except SapptkError as exc:
        return no_plan("invalid", str(exc))
    except Exception as exc:  # a row, not a lost sweep; the traceback's last line helps
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return no_plan("error", f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})")


class _ByValue:
    """A function shipped by value (cloudpickle): one defined in a notebook or script has no
    module a fresh worker process could import it from."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __call__(self, task: Task) -> Result:
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


def timed(solve: Solve, task: Task) -> Result:
    """Run ``solve`` on a task; add its key and wall time; never raise (but interrupts)."""
    t0 = time.perf_counter()
    try:
        result = dict(solve(task))
    except Exception as exc:
        result = no_plan("error", f"{type(exc).__name__}: {exc}")
    result.setdefault("solve_seconds", time.perf_counter() - t0)
    result["key"] = task["key"]
    return result

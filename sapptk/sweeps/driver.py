"""The :func:`sweep` function: a grid through an executor into the cache and one frame.

::

    grid ──► points ──► tasks (plain dicts) ──► executor ──► results (plain dicts) ──► frame
                                                   │                    │
                                   serial | process pool | Dask         └──► cache (journal, Parquet parts)

Everything the user gave is checked before the first point is solved: the arguments, the
grid (names and size), the executor (a Dask scheduler must answer), and the cache folder
(it must be writable when there is anything to compute).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from typing import Any

import pandas as pd

from sapptk import checks
from sapptk.config import PipelineConfig
from sapptk.profile import Profile
from sapptk.sweeps import solving
from sapptk.sweeps.cache import LAYOUT_COLUMN, Cache
from sapptk.sweeps.executors import check_executor, default_workers, open_executor
from sapptk.sweeps.frame import RESULT_COLUMNS, input_row, no_plan, typed
from sapptk.sweeps.grid import expand_grid, point_key, profile_digest, profiles_of
from sapptk.sweeps.seeding import Seeds, waves
from sapptk.sweeps.solving import COUNTS_KEY, Result, Solve, Task

__all__ = ["sweep"]


def _check_arguments(time_limit: Any, workers: Any, seed: Any) -> None:
    checks.solver_arguments(time_limit=time_limit, workers=workers, seed=seed)  # balance's limits and messages


def sweep(
    profile: Profile | str | os.PathLike[str] | Mapping[str, Profile],
    grid: Mapping[str, Any] | Iterable[PipelineConfig | Mapping[str, Any]],
    *,
    executor: Any = "serial",
    time_limit: float = 30,
    workers: int | None = None,
    cache: str | os.PathLike[str] | None = None,
    progress: bool = True,
    seed: int = 0,
    deterministic: bool = False,
    solve: Solve | None = None,
) -> pd.DataFrame:
    """Balance and simulate every point of a grid; one row per point (see :mod:`sapptk.sweeps.frame`).

    Parameters
    ----------
    profile: a :class:`Profile`, a bundled profile name or profile file, or a mapping
        name → profile to sweep several (the name goes in the ``profile`` column).
    grid: :class:`PipelineConfig` field → list of values (the product is swept), or a list
        of explicit points (:class:`PipelineConfig` or dicts); see
        :func:`~sapptk.sweeps.grid.expand_grid`.
    executor: ``"serial"``; ``"processes"`` (a local process pool, one process per core
        unless ``workers`` asks for more solver threads); ``"dask"`` (a local Dask cluster)
        or ``"dask://HOST:PORT"`` (a running scheduler); a ``distributed.Client``; or any
        :class:`concurrent.futures.Executor` (its processes must be able to import sapptk).
    time_limit: seconds per solve.
    workers: CP-SAT workers per solve; by default chosen so that parallel solves × workers
        do not exceed this machine's cores (see
        :func:`~sapptk.sweeps.executors.default_workers`).
    cache: a folder; every finished row is put on disk there as it arrives (see
        :mod:`sapptk.sweeps.cache`) and points already there (same profile content, config,
        time limit, seed, determinism) are not solved again.
    progress: show a ``tqdm.auto`` progress bar.
    seed, deterministic: passed to :func:`sapptk.balancer.balance`.
    solve: the function run per point instead of
        :func:`~sapptk.sweeps.solving.solve_point`: plain task dict in, result dict out.
        One defined in a notebook is shipped by value (cloudpickle).

    Invalid or infeasible points are rows with their reason in ``error``; a Ctrl-C keeps
    every finished row in the cache (and ends the running solves of ``"processes"``).
    """
    from tqdm.auto import tqdm

    _check_arguments(time_limit, workers, seed)
    check_executor(executor)
    solve = solve or solving.solve_point
    profiles = profiles_of(profile)
    points = expand_grid(grid)
    options = {"time_limit": float(time_limit), "seed": int(seed), "deterministic": bool(deterministic)}

    rows: list[dict[str, Any]] = []  # one per (profile, point), in order
    tasks: dict[str, Task] = {}  # unique points to solve, by key
    for name, prof in profiles.items():
        data, digest = prof.to_dict(), profile_digest(prof)
        for fields in points:
            key = point_key(name, digest, fields, options)
            rows.append({**input_row(name, fields, time_limit), "key": key})
            if key not in tasks:
                config = {f: list(v) if isinstance(v, tuple | set | frozenset) else v for f, v in fields.items()}
                tasks[key] = {"key": key, "profile": data, "profile_name": name, "profile_digest": digest,
                              "config": config, **options}

    store = Cache(cache) if cache is not None else None
    results: dict[str, Result] = {}
    seeds = Seeds()
    if store is not None:
        cached = store.read()
        wanted = cached[cached["key"].isin(tasks.keys()) & ~cached["status"].astype(object).eq("error")]
        for rec in wanted.to_dict("records"):
            results[rec["key"]] = {c: rec.get(c) for c in (*RESULT_COLUMNS, "key")}
            seeds.keep(tasks[rec["key"]], {**results[rec["key"]], COUNTS_KEY: _layout_of(rec.get(LAYOUT_COLUMN))})
    todo = [t for k, t in tasks.items() if k not in results]
    inputs = {row["key"]: row for row in rows}

    with ExitStack() as stack:
        if store is not None and todo:
            store.open()  # a read-only folder or a full disk fails here, before any solving
            stack.callback(store.close)
        runner, slots = open_executor(executor, todo, solve, workers, stack)  # a Dask scheduler must answer
        per_solve = workers or default_workers(slots)
        for task in todo:
            task["workers"] = per_solve
        bar = stack.enter_context(
            tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc="sweep", unit="pt", disable=not progress)
        )

        def record(result: Result) -> None:
            layout = result.get(COUNTS_KEY)  # the plan's layout seeds later points; a cache column, not a frame one
            result = {k: v for k, v in result.items() if k != COUNTS_KEY}
            results[result["key"]] = result
            if store is not None:  # on disk before the next point is awaited
                store.append({**inputs[result["key"]], **result,
                              LAYOUT_COLUMN: None if layout is None else json.dumps(layout)})

        counts: dict[str, int] = {}  # statuses of every point on the bar, those read from the cache too
        for key in tasks:
            if key in results:
                status = str(results[key].get("status"))
                counts[status] = counts.get(status, 0) + 1
        if counts:
            bar.set_postfix(counts, refresh=False)
        for wave in waves(todo):  # each point after those of its family with smaller budgets
            for task in wave:
                seeds.seed(task)
            by_key = {task["key"]: task for task in wave}
            results_iter = runner(wave, record)
            try:
                for result in results_iter:
                    seeds.keep(by_key[result["key"]], result)
                    record(result)
                    status = str(result.get("status"))
                    counts[status] = counts.get(status, 0) + 1
                    bar.set_postfix(counts, refresh=False)
                    bar.update()
            finally:
                results_iter.close()  # cancels what is left; finished results go to record()
    if store is not None and todo:
        store.compact()

    frame = pd.DataFrame([{**row, **results.get(row["key"], no_plan("error", "not run"))} for row in rows])
    order = {
        "profile": list(profiles),
        "schedule": list(dict.fromkeys(p["schedule"] for p in points if isinstance(p["schedule"], str))),
    }
    return typed(frame, order)


def _layout_of(text: Any) -> list | dict | None:
    """A cached layout (JSON: the counts, or counts and offload), or None when there is none or
    it is unreadable (a damaged part: that point just seeds nothing; a seed is checked again
    before use)."""
    if not isinstance(text, str):
        return None
    try:
        layout = json.loads(text)
    except ValueError:
        return None
    return layout if isinstance(layout, list | dict) else None

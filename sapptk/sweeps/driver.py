"""The :func:`sweep` function: a grid through an executor into the cache and one frame.

::

    grid ──► points ──► SweepTask (a checked SolveRequest) ──► executor ──► PointResult ──► frame
                                                                │                │
                                              serial | process pool | Dask       └──► cache (journal, Parquet parts)

Everything the user gave is checked before the first point is solved: the arguments (by
:mod:`sapptk.checks`, as every solve checks them), the grid (names and size), the executor
(a Dask scheduler must answer), and the cache folder (it must be writable when there is
anything to compute). A point whose request cannot be built (a bad combination of fields)
is an ``invalid`` row at once, with the request's own message; it never reaches a worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from typing import Any

import pandas as pd

from sapptk import checks
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError, SapptkError
from sapptk.levers import SWEPT
from sapptk.profile import Profile
from sapptk.request import SolveRequest
from sapptk.sweeps import solving
from sapptk.sweeps.cache import LAYOUT_COLUMN, Cache
from sapptk.sweeps.executors import check_executor, default_workers, open_executor
from sapptk.sweeps.frame import NOT_STARTED, input_row, typed
from sapptk.sweeps.grid import CONFIG_FIELDS, LEVER_FIELDS, expand_grid, point_key, profile_digest, profiles_of
from sapptk.sweeps.seeding import Seeds, waves
from sapptk.sweeps.solving import Layout, PointResult, Solve, SweepTask, no_plan, not_started

__all__ = ["sweep"]


def sweep(
    profile: Profile | str | os.PathLike[str] | Mapping[str, Profile],
    grid: Mapping[str, Any] | Iterable[PipelineConfig | Mapping[str, Any]],
    *,
    executor: Any = "serial",
    time_limit: float | None = None,
    point_time_limit: float = 30,
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
    grid: :class:`PipelineConfig` field or lever → list of values (the product is swept),
        or a list of explicit points (:class:`PipelineConfig` or dicts); see
        :func:`~sapptk.sweeps.grid.expand_grid`. The levers are ``per_micro_batch``,
        ``memory_margin``, ``oom_risk`` and ``memory_error`` (a relative error), as in
        :class:`~sapptk.request.SolveRequest`; offload is ``"offload"`` in a ``recompute``
        set with a ``host_bandwidth``. Each lever is a column of the frame.
    executor: ``"serial"``; ``"processes"`` (a local process pool, one process per core
        unless ``workers`` asks for more solver threads); ``"dask"`` (a local Dask cluster)
        or ``"dask://HOST:PORT"`` (a running scheduler); a ``distributed.Client``; or any
        :class:`concurrent.futures.Executor` (its processes must be able to import sapptk).
    time_limit: seconds for the whole sweep (None: no limit). A point not started when it runs
        out is a row with status ``not_started``; a point running then gets what is left (at
        most its ``point_time_limit``), so the sweep ends within about a second of the limit
        plus one simulation. Finished rows are never lost; points not started, and points cut
        short before their answer was proven, are not cached (a rerun solves them in full).
    point_time_limit: seconds per point's solve (the ``point_time_limit_s`` column; the
        ``setup_time_limit`` of :func:`sapptk.choose`).
    workers: CP-SAT workers per solve (1 to :data:`sapptk.checks.MAX_WORKERS`); by default
        chosen so that parallel solves × workers do not exceed this machine's cores (see
        :func:`~sapptk.sweeps.executors.default_workers`).
    cache: a folder; every finished row is put on disk there as it arrives (see
        :mod:`sapptk.sweeps.cache`) and points already there (same profile content, config,
        time limit, seed, determinism) are not solved again.
    progress: show a ``tqdm.auto`` progress bar.
    seed, deterministic: as in :class:`~sapptk.request.SolveRequest`.
    solve: the function run per point instead of
        :func:`~sapptk.sweeps.solving.solve_point`: a
        :class:`~sapptk.sweeps.solving.SweepTask` in (its ``request`` is the point's checked
        :class:`~sapptk.request.SolveRequest`), a
        :class:`~sapptk.sweeps.solving.PointResult` or a mapping of result columns out. One
        defined in a notebook is shipped by value (cloudpickle).

    Invalid or infeasible points are rows with their reason in ``error``; a Ctrl-C keeps
    every finished row in the cache (and ends the running solves of ``"processes"``).
    """
    from tqdm.auto import tqdm

    started = time.time()  # wall clock: a worker process (or a Dask machine) compares it with its own
    whole = None if time_limit is None else checks.time_limit(time_limit, "time_limit")
    limit = checks.time_limit(point_time_limit, "point_time_limit")
    _, workers, seed, deterministic = checks.solver_arguments(time_limit=limit, workers=workers, seed=seed,
                                                              deterministic=deterministic)
    deadline = None if whole is None else started + whole
    check_executor(executor)
    solve = solve or solving.solve_point
    profiles = profiles_of(profile)
    points = expand_grid(grid)
    options = {"time_limit": limit, "seed": seed, "deterministic": deterministic}

    rows: list[dict[str, Any]] = []  # one per (profile, point), in order
    unique: dict[str, tuple[str, str, Profile, dict[str, Any]]] = {}  # points to answer, by key
    for name, prof in profiles.items():
        digest = profile_digest(prof)
        for fields in points:
            key = point_key(name, digest, fields, options)
            rows.append({**input_row(name, fields, limit), "key": key})
            unique.setdefault(key, (name, digest, prof, fields))

    store = Cache(cache) if cache is not None else None
    results: dict[str, PointResult] = {}
    if store is not None:
        stored = store.read()
        wanted = stored[stored["key"].isin(unique.keys()) & ~stored["status"].astype(object).eq("error")]
        for rec in wanted.to_dict("records"):
            layout = Layout.from_json(rec.get(LAYOUT_COLUMN))
            results[rec["key"]] = PointResult.from_row(rec, layout)
    left = [key for key in unique if key not in results]
    inputs = {row["key"]: row for row in rows}

    with ExitStack() as stack:
        if store is not None and left:
            store.open()  # a read-only folder or a full disk fails here, before any solving
            stack.callback(store.close)
        runner, slots = open_executor(executor, left, solve, workers, stack)  # a Dask scheduler must answer
        per_solve = workers or default_workers(slots)
        bar = stack.enter_context(
            tqdm(total=len(unique), initial=len(unique) - len(left), desc="sweep", unit="pt", disable=not progress)
        )

        def record(result: PointResult) -> None:
            results[result.key] = result
            # on disk before the next point is awaited (not a point cut short or never started)
            if store is not None and not result.cut and result.status != NOT_STARTED:
                store.append({**inputs[result.key], **result.columns(),
                              LAYOUT_COLUMN: None if result.layout is None else result.layout.to_json()})

        counts: dict[str, int] = {}  # statuses of every point on the bar, those read from the cache too

        def count(result: PointResult) -> None:
            counts[result.status] = counts.get(result.status, 0) + 1
            bar.set_postfix(counts, refresh=False)

        for key in unique:
            if key in results:
                counts[results[key].status] = counts.get(results[key].status, 0) + 1
        if counts:
            bar.set_postfix(counts, refresh=False)
        todo: list[SweepTask] = []
        for key in left:  # each point's request, checked here: a point it refuses is an invalid row at once
            name, digest, prof, fields = unique[key]
            try:
                todo.append(SweepTask(key, name, digest, _request(prof, fields, options, per_solve)))
            except SapptkError as exc:
                record(no_plan(key, "invalid", str(exc)))
                count(results[key])
                bar.update()
        seeds = Seeds()
        by_key = {task.key: task for task in todo}
        shapes = {_shape(task.profile_digest, task.request.config) for task in todo}
        for key, result in results.items():  # cached plans seed the points of their families (if any is to solve)
            if key in by_key or key not in unique or result.layout is None:
                continue
            name, digest, prof, fields = unique[key]
            if (digest, *(_frozen(fields.get(f)) for f in _SHAPE)) not in shapes:
                continue  # no point to solve could take its plan: skip building its request
            try:
                seeds.keep(SweepTask(key, name, digest, _request(prof, fields, options, per_solve)), result)
            except SapptkError:
                continue
        for wave in waves(todo):  # each point after those of its family with smaller budgets
            if deadline is not None and time.time() >= deadline:  # out of time: the rest were never started
                for task in wave:
                    result = not_started(task.key, whole)
                    results[task.key] = result
                    count(result)
                    bar.update()
                continue
            wave = [seeds.seed(task).with_deadline(deadline, whole) for task in wave]
            results_iter = runner(wave, record)
            try:
                for result in results_iter:
                    seeds.keep(by_key[result.key], result)
                    record(result)
                    count(result)
                    bar.update()
            finally:
                results_iter.close()  # cancels what is left; finished results go to record()
    if store is not None and left:
        store.compact()

    frame = pd.DataFrame([{**row, **results.get(row["key"], no_plan(row["key"], "error", "not run")).columns()}
                          for row in rows])
    order = {
        "profile": list(profiles),
        "schedule": list(dict.fromkeys(p["schedule"] for p in points if isinstance(p["schedule"], str))),
    }
    return typed(frame, order)


_SHAPE = ("schedule", "stages", "micro_batches", "chunks", "splits")


def _shape(digest: str, config: PipelineConfig) -> tuple[Any, ...]:
    """What a seed's point must share with a point to solve (a quick filter before
    :func:`~sapptk.sweeps.seeding.admits`)."""
    return (digest, *(getattr(config, f) for f in _SHAPE))


def _frozen(value: Any) -> Any:
    """A grid value as a hashable one (a list of slice lengths as a tuple; anything else odd as its repr)."""
    if isinstance(value, list):
        value = tuple(value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _request(profile: Profile, fields: Mapping[str, Any], options: Mapping[str, Any], workers: int) -> SolveRequest:
    """The checked request of one point (a :class:`~sapptk.errors.SapptkError` if it is refused)."""
    for f in SWEPT:  # a number lever takes numbers only in a grid (memory_error's residuals are not a grid value)
        value = fields.get(f.name)
        if f.kind == "number" and value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{f.name} = {checks.show(value)}: expected a number in a sweep ({f.help})")
    try:
        config = PipelineConfig(**{f: v for f, v in fields.items() if f in CONFIG_FIELDS})
    except (TypeError, ValueError) as exc:  # a value no config can hold
        raise ConfigError(f"config: {exc}") from None
    levers = {f: fields[f] for f in LEVER_FIELDS if f in fields}
    return SolveRequest(profile, config, workers=workers, **options, **levers)

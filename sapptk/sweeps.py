"""Sweeps: many pipeline setups balanced and simulated, one row each, as one DataFrame.

A sweep expands a *grid* into *points* (one :class:`~sapptk.config.PipelineConfig` each,
per profile), turns every point into a plain-data *task*, runs the tasks through an
*executor* and collects one *row* per point::

    grid ──► points ──► tasks (plain dicts) ──► executor ──► results (plain dicts) ──► DataFrame
                                                   │
                                   serial | process pool | Dask client

Tasks and results are plain dicts (numbers, strings, lists, the profile as
``Profile.to_dict()``), so they cross process and machine boundaries unchanged; each worker
rebuilds the profile and config and builds its own CP-SAT model. A point that cannot be
solved becomes a row with its status and reason, never an exception that loses the others.

With ``cache=path`` every finished row is appended to a Parquet dataset (a directory of
part-files, each written atomically), so an interrupted sweep resumes where it stopped.

Interrupts and crashes: Ctrl-C (or a notebook's interrupt) keeps every finished row and,
with ``"processes"``, ends the running solves at once. A process that dies (a native
crash in the solver) only fails its points: the pool is rebuilt and they are retried, up
to :data:`MAX_ATTEMPTS` times, before they become ``error`` rows. In a serial sweep,
CP-SAT catches Ctrl-C itself: it ends the current solve (which then reports what it has),
not the sweep; use ``"processes"`` to stop a sweep promptly.

Frame columns (one row per grid point, in grid order)
------------------------------------------------------
Inputs:

``profile`` (categorical)
    the profile's name (the mapping key when several profiles are swept).
``stages``, ``micro_batches``, ``chunks``, ``splits``
    p, m, v, k of :class:`~sapptk.config.PipelineConfig`.
``schedule`` (categorical)
    the schedule name.
``memory_budget_mb``
    MB per device (NaN: unlimited).
``constant_memory_mb``, ``comm_ms``
    constant MB per device; point-to-point latency in ms.
``recompute`` (categorical)
    the allowed recompute modes, comma-joined in :data:`~sapptk.profile.MODES` order.
``time_limit_s``
    the solver's time limit per point, in seconds.

Results:

``status`` (categorical, :data:`STATUSES`)
    ``optimal``/``feasible``/``infeasible``/``unknown`` from the solver; ``invalid`` when
    the combination is rejected (a :class:`~sapptk.errors.SapptkError`, e.g. a schedule
    that does not accept that many chunks); ``error`` when the worker failed unexpectedly
    (such rows are not cached, so a rerun retries them).
``step_time_ms``, ``bound_ms``, ``gap``
    the plan's step time, the solver's proven lower bound, and their relative gap.
``bubble_of_compute``, ``bubble_of_step``
    idle / busy and idle / (p · step time) of the simulated plan.
``peak_mb_max``, ``peak_mb``
    the simulated peak memory of the fullest device, and per device (a list).
``recompute_ms``
    device time spent recomputing per step: the backward time above no recompute,
    summed over devices and micro-batches (0 when no layer recomputes).
``solve_seconds``
    wall time of the point (solve and simulation), in seconds.
``error``
    why the point has no plan (missing for plans).
``key``
    the point's cache key (profile name and content hash, config fields, solver options).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import pickle
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures import as_completed as futures_as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError, SapptkError
from sapptk.profile import Profile, mode_set, resolve_profile

__all__ = [
    "COLUMNS",
    "CONFIG_FIELDS",
    "STATUSES",
    "best",
    "default_workers",
    "expand_grid",
    "read_cache",
    "solve_point",
    "sweep",
]

Task = dict[str, Any]
Result = dict[str, Any]
Solve = Callable[[Task], Result]

CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PipelineConfig) if f.name != "custom_program")
"""The :class:`PipelineConfig` fields a grid may sweep (a carried program is not one)."""

_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(PipelineConfig)
    if f.default is not dataclasses.MISSING and f.name in CONFIG_FIELDS
}
_REQUIRED: tuple[str, ...] = tuple(f for f in CONFIG_FIELDS if f not in _DEFAULTS)

# config field -> frame column (units in the names)
_COLUMN = {"memory_budget": "memory_budget_mb", "constant_memory": "constant_memory_mb", "comm": "comm_ms"}
_FLOAT_FIELDS = ("memory_budget", "constant_memory", "comm")

STATUSES: tuple[str, ...] = ("optimal", "feasible", "infeasible", "unknown", "invalid", "error")
"""Every value of the ``status`` column, best first."""
SOLVED: tuple[str, ...] = ("optimal", "feasible")
"""Statuses of points that have a plan."""

INPUT_COLUMNS: tuple[str, ...] = ("profile", *(_COLUMN.get(f, f) for f in CONFIG_FIELDS), "time_limit_s")
RESULT_COLUMNS: tuple[str, ...] = (
    "status",
    "step_time_ms",
    "bound_ms",
    "gap",
    "bubble_of_compute",
    "bubble_of_step",
    "peak_mb_max",
    "peak_mb",
    "recompute_ms",
    "solve_seconds",
    "error",
)
COLUMNS: tuple[str, ...] = (*INPUT_COLUMNS, *RESULT_COLUMNS, "key")
"""The columns of a sweep frame, in order (see the module docstring)."""

MAX_ATTEMPTS = 3
"""How often the ``processes`` executor runs a point whose worker process died."""

MAX_SOLVER_WORKERS = 8
"""Cap on the default CP-SAT workers per solve (more rarely help models of this size)."""

_FLUSH_SECONDS = 2.0  # cache: write a part-file at most this often while solving ...
_FLUSH_ROWS = 256  # ... or when this many rows wait


# ----------------------------------------------------------------------------- grids
def _axis(name: str, value: Any) -> list[Any]:
    """The values of one grid axis: a list (range, array, ...) is swept, anything else is one value.

    For ``recompute`` only a *list* is an axis (its items are mode sets, a single name meaning
    a one-mode set); a tuple or set such as :data:`MODES` is one set of modes.
    """
    if name == "recompute":
        return list(value) if isinstance(value, list) else [value]
    if isinstance(value, str) or not isinstance(value, list | tuple | range | np.ndarray | pd.Series | pd.Index):
        return [value]
    return [v.item() if isinstance(v, np.generic) else v for v in value]


def _fields_of(item: Any, where: str) -> dict[str, Any]:
    """Config fields of an explicit point (a PipelineConfig or a mapping), defaults filled in."""
    if isinstance(item, PipelineConfig):
        if item.custom_program is not None:
            raise ConfigError(f"{where}: a setup carrying its own program ({item.schedule!r}) cannot be swept: sweep "
                              "registered schedules")
        return {f: getattr(item, f) for f in CONFIG_FIELDS}
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected a PipelineConfig or a mapping of its fields, got {item!r}")
    unknown = [k for k in item if k not in CONFIG_FIELDS]
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(CONFIG_FIELDS)}")
    missing = [k for k in _REQUIRED if k not in item]
    if missing:
        raise ConfigError(f"{where}: field {missing[0]!r} is required")
    return {**_DEFAULTS, **item}


def expand_grid(grid: Mapping[str, Any] | Iterable[PipelineConfig | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The points of a grid, each a dict of every :class:`PipelineConfig` field.

    ``grid`` is either a mapping of field → values, whose product is swept (the last field
    varies fastest; a non-list value is fixed), or an iterable of explicit points
    (:class:`PipelineConfig` objects or dicts of fields). Fields left out take the
    :class:`PipelineConfig` defaults. Values are not validated here: a bad combination
    becomes an ``invalid`` row when swept. Unknown or missing field names raise
    :class:`~sapptk.errors.ConfigError`.
    """
    if isinstance(grid, Mapping):
        fixed = _fields_of(grid, "grid")  # checks the names, fills the defaults
        names = list(grid)
        axes = [_axis(name, grid[name]) for name in names]
        return [{**fixed, **dict(zip(names, combo, strict=True))} for combo in product(*axes)]
    if isinstance(grid, str | bytes) or not isinstance(grid, Iterable):
        raise ConfigError(f"grid: expected a mapping of field -> values or a list of configs, got {grid!r}")
    return [_fields_of(item, f"grid[{i}]") for i, item in enumerate(grid)]


def _profiles(profile: Profile | str | os.PathLike[str] | Mapping[str, Profile]) -> dict[str, Profile]:
    """Name → Profile from one profile (anything :func:`~sapptk.profile.resolve_profile` takes) or a mapping."""
    if isinstance(profile, Mapping):
        return {str(name): resolve_profile(p) for name, p in profile.items()}
    loaded = resolve_profile(profile)
    return {loaded.name: loaded}


# --------------------------------------------------------------------------- keys
def recompute_label(value: Any) -> str:
    """The ``recompute`` column's label of a mode set, e.g. ``"none,full"``."""
    modes = mode_set(value)
    return ",".join(modes) if isinstance(modes, tuple) else str(modes)


def _canonical(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Config fields in a form whose JSON is the same for equal configs (40000 == 40000.0)."""
    out: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        value = fields[name]
        if name == "recompute":
            value = mode_set(value)
            value = list(value) if isinstance(value, tuple) else value
        elif name in _FLOAT_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
            value = float(value)
        out[name] = value
    return out


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def profile_digest(profile: Profile) -> str:
    """A content hash of a profile (its :meth:`Profile.to_dict`), 16 hex digits."""
    return _digest(profile.to_dict())[:16]


def point_key(name: str, digest: str, fields: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The cache key of a point: profile name and content hash, config fields, solver options."""
    return _digest({"profile": [name, digest], "config": _canonical(fields), "options": dict(options)})[:32]


# ------------------------------------------------------------------------- solving
_PROFILES: dict[str, Profile] = {}  # per worker process: content hash -> rebuilt profile


def _profile_of(task: Task) -> Profile:
    digest = task["profile_digest"]
    profile = _PROFILES.get(digest)
    if profile is None:
        if len(_PROFILES) > 32:
            _PROFILES.clear()
        profile = _PROFILES[digest] = Profile.from_dict(task["profile"], source=f"<sweep: {task['profile_name']}>")
    return profile


def _no_plan(status: str, reason: str) -> Result:
    return {"status": status, "error": reason}


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


def solve_point(task: Task) -> Result:
    """Balance and simulate one point; plain dict in, plain dict out (runs in workers).

    ``task`` holds ``profile`` (``Profile.to_dict()``), ``profile_name``,
    ``profile_digest``, ``config`` (the :class:`PipelineConfig` fields), ``time_limit``,
    ``workers``, ``seed`` and ``deterministic``. The result holds the result columns.
    Errors become results: :class:`~sapptk.errors.SapptkError` gives ``invalid``,
    anything else ``error``.
    """
    from sapptk.balancer import balance  # the solver stack loads in the worker only

    try:
        profile = _profile_of(task)
        config = PipelineConfig(**task["config"])
        config.check(profile)
        plan = balance(
            profile,
            config,
            time_limit=task["time_limit"],
            workers=task["workers"],
            seed=task["seed"],
            deterministic=task["deterministic"],
        )
        return plan_row(plan)
    except SapptkError as exc:
        return _no_plan("invalid", str(exc))
    except Exception as exc:  # a row, not a lost sweep; the traceback's last line helps
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return _no_plan("error", f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})")


class _ByValue:
    """A function shipped by value (cloudpickle): one defined in a notebook or script has no
    module a fresh worker process could import it from."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __call__(self, task: Task) -> Result:
        return pickle.loads(self.blob)(task)


def _portable(solve: Solve) -> Solve:
    """``solve`` in a form a fresh process can unpickle: by reference when importable,
    else by value if cloudpickle (a Dask dependency) is installed."""
    if getattr(solve, "__module__", "__main__") != "__main__" and "<locals>" not in solve.__qualname__:
        return solve
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - then only importable functions work in processes
        return solve
    return _ByValue(cloudpickle.dumps(solve))


def _timed(solve: Solve, task: Task) -> Result:
    """Run ``solve`` on a task; add its key and wall time; never raise (but interrupts)."""
    t0 = time.perf_counter()
    try:
        result = dict(solve(task))
    except Exception as exc:
        result = _no_plan("error", f"{type(exc).__name__}: {exc}")
    result.setdefault("solve_seconds", time.perf_counter() - t0)
    result["key"] = task["key"]
    return result


# ------------------------------------------------------------------------ executors
def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(slots: int, cores: int | None = None) -> int:
    """CP-SAT workers per solve when ``slots`` solves run at once on ``cores`` cores.

    ``slots × workers`` stays within the cores: serial gets them all (at most
    :data:`MAX_SOLVER_WORKERS`), a pool of one process per core gets 1 each.
    """
    cores = cores or _cores()
    return max(1, min(MAX_SOLVER_WORKERS, cores // max(1, slots)))


def _is_dask_client(executor: Any) -> bool:
    return type(executor).__name__ == "Client" and type(executor).__module__.startswith("distributed")


def _pool_context() -> multiprocessing.context.BaseContext:
    """forkserver where available, else spawn: children never inherit the caller's threads
    or state (a notebook's included). The fork server imports the solver stack once, so
    later pools start in milliseconds rather than seconds."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["sapptk.sweeps", "sapptk.balancer"])
        return ctx
    return multiprocessing.get_context("spawn")


def _run_serial(tasks: Sequence[Task], solve: Solve) -> Iterator[Result]:
    for task in tasks:
        yield _timed(solve, task)


def _drain(futures: Mapping[Any, Task], done: set[Any], result_of: Callable[[Any, Task], Result]) -> Iterator[Result]:
    """Results of futures that finished but were not yet collected (after an interrupt)."""
    for fut, task in futures.items():
        if fut not in done and fut.done():
            done.add(fut)
            yield result_of(fut, task)


def _future_result(fut: Future, task: Task) -> Result:
    """A finished future's result, or an ``error`` row if the worker failed."""
    try:
        return fut.result()
    except Exception as exc:  # a dead worker process, a cancelled task, ...
        return {**_no_plan("error", f"{type(exc).__name__}: {exc}"), "key": task["key"]}


def _run_futures(
    tasks: Sequence[Task],
    submit: Callable[[Task], Any],
    as_completed: Callable[[list[Any]], Iterable[Any]],
    cancel: Callable[[list[Any]], None],
    rescue: Callable[[Result], None],
    broken: list[Task] | None = None,
) -> Iterator[Result]:
    """Submit every task, yield results as they finish; on interrupt, hand finished results to
    ``rescue`` and cancel the rest. With ``broken``, tasks lost to a dead process pool go
    there instead of becoming ``error`` rows (the caller retries them)."""
    futures = {submit(task): task for task in tasks}
    done: set[Any] = set()
    try:
        for fut in as_completed(list(futures)):
            done.add(fut)
            if broken is not None and isinstance(fut.exception(), BrokenProcessPool):
                broken.append(futures[fut])
                continue
            yield _future_result(fut, futures[fut])
    finally:
        pending = [f for f in futures if f not in done]
        if pending:
            for result in _drain(futures, done, _future_result):
                if result.get("status") != "error":
                    rescue(result)
            cancel([f for f in pending if not f.done()])


def _cancel(pending: list[Future]) -> None:
    for f in pending:
        f.cancel()


def _ignore(pending: list[Future]) -> None:
    """No cancelling: :func:`_terminate` ends the pool as a whole."""


def _run_pool(
    tasks: Sequence[Task], solve: Solve, pool: Executor, rescue: Callable[[Result], None]
) -> Iterator[Result]:
    return _run_futures(tasks, lambda t: pool.submit(_timed, solve, t), futures_as_completed, _cancel, rescue)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End the worker processes now (running solves included) and drop the pool.

    The processes go first: the pool then fails its pending futures itself. (Cancelling
    them first trips CPython < 3.12, whose pool thread then fails on cancelled futures.)
    """
    if hasattr(pool, "terminate_workers"):  # Python >= 3.14
        pool.terminate_workers()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False)


def _run_processes(
    tasks: Sequence[Task], solve: Solve, slots: int, rescue: Callable[[Result], None]
) -> Iterator[Result]:
    """A local process pool. If a process dies (a native crash in a solver), the pool breaks:
    its unfinished points go to a fresh pool, up to :data:`MAX_ATTEMPTS` times each."""
    tries: dict[str, int] = {}
    queue = list(tasks)
    while queue:
        pool = ProcessPoolExecutor(max_workers=max(1, min(slots, len(queue))), mp_context=_pool_context())
        broken: list[Task] = []
        try:
            yield from _run_futures(
                queue, partial(pool.submit, _timed, solve), futures_as_completed, _ignore, rescue, broken
            )
        except BaseException:  # an interrupt: stop the running solves too
            _terminate(pool)
            raise
        pool.shutdown(wait=True)
        queue = []
        for task in broken:
            n = tries[task["key"]] = tries.get(task["key"], 0) + 1
            if n < MAX_ATTEMPTS:
                queue.append(task)
            else:
                reason = f"the worker process died {n} times while this point was running (a crash in the solver?)"
                yield {**_no_plan("error", reason), "key": task["key"]}


def _run_dask(tasks: Sequence[Task], solve: Solve, client: Any, rescue: Callable[[Result], None]) -> Iterator[Result]:
    from distributed import as_completed

    def submit(task: Task) -> Any:
        return client.submit(_timed, solve, task, pure=False, key=f"sapptk-sweep-{task['key']}-{uuid.uuid4().hex[:8]}")

    return _run_futures(tasks, submit, as_completed, client.cancel, rescue)


# ---------------------------------------------------------------------------- cache
def _arrow_schema() -> pa.Schema:
    label = pa.dictionary(pa.int32(), pa.string())
    types: dict[str, pa.DataType] = {
        "profile": label,
        "schedule": label,
        "recompute": label,
        "status": label,
        "peak_mb": pa.list_(pa.float64()),
        "error": pa.string(),
        "key": pa.string(),
        "stages": pa.int64(),
        "micro_batches": pa.int64(),
        "chunks": pa.int64(),
        "splits": pa.int64(),
    }
    return pa.schema([(c, types.get(c, pa.float64())) for c in COLUMNS])


class _Cache:
    """Rows of finished points in a directory of Parquet part-files.

    Each part is written to a hidden temporary name and renamed into place, so a reader
    (or a resumed sweep) only ever sees whole parts; duplicates keep the newest row.
    ``pandas.read_parquet(path)`` reads the directory as one table.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise SapptkError(f"cache = {os.fspath(path)!r}: expected a directory of Parquet part-files, found a file")
        self.path.mkdir(parents=True, exist_ok=True)

    def parts(self) -> list[Path]:
        return sorted(p for p in self.path.glob("part-*.parquet") if p.is_file())

    def read(self) -> pd.DataFrame:
        """Every cached row (newest per key), in the sweep frame's columns."""
        frames = []
        for part in self.parts():
            try:
                frames.append(pq.read_table(part).to_pandas())
            except (OSError, pa.ArrowException):  # a part deleted by a concurrent compaction
                continue
        if not frames:
            return pd.DataFrame(columns=list(COLUMNS))
        frame = pd.concat([f.astype({c: object for c in f.columns if isinstance(f[c].dtype, pd.CategoricalDtype)})
                           for f in frames], ignore_index=True)
        return frame.drop_duplicates("key", keep="last").reset_index(drop=True)

    def write(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write rows (full frame rows) as one new part-file, atomically."""
        if not rows:
            return None
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.path / f".{name}.tmp"
        pq.write_table(_to_arrow(frame), tmp)
        os.replace(tmp, self.path / name)
        return self.path / name

    def compact(self) -> None:
        """Merge all parts into one (new part first, then the old ones go)."""
        parts = self.parts()
        if len(parts) < 2:
            return
        frame = pd.concat([pq.read_table(p).to_pandas() for p in parts], ignore_index=True)
        frame = frame.astype({c: object for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)})
        self.write(frame.drop_duplicates("key", keep="last").to_dict("records"))
        for part in parts:
            part.unlink(missing_ok=True)


def _to_arrow(frame: pd.DataFrame) -> pa.Table:
    schema = _arrow_schema()
    arrays = []
    for f in schema:
        values = frame[f.name].astype(object).where(frame[f.name].notna(), None).tolist()
        if pa.types.is_dictionary(f.type):
            arrays.append(pa.array(values, type=pa.string()).dictionary_encode().cast(f.type))
        elif pa.types.is_list(f.type):
            arrays.append(pa.array([v if isinstance(v, list | tuple | np.ndarray) else None for v in values], f.type))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _cacheable(row: Mapping[str, Any]) -> bool:
    """Whether a row goes to the cache: not an ``error`` (those are retried), and inputs that
    fit the stored column types (a point with, say, ``stages="8"`` is simply recomputed)."""
    if row.get("status") == "error":
        return False
    ints = all(isinstance(row[c], int) and not isinstance(row[c], bool)
               for c in ("stages", "micro_batches", "chunks", "splits"))
    floats = all(row[c] is None or (isinstance(row[c], int | float) and not isinstance(row[c], bool))
                 for c in ("memory_budget_mb", "constant_memory_mb", "comm_ms"))
    labels = all(isinstance(row[c], str) for c in ("profile", "schedule", "recompute"))
    return ints and floats and labels


def read_cache(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every row stored in a sweep cache directory, as a sweep frame (any grid, any order)."""
    return _typed(_Cache(path).read())


# ---------------------------------------------------------------------------- frames
def _typed(frame: pd.DataFrame, order: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """Set the frame's dtypes: categorical labels (in ``order`` where given), floats, ints."""
    frame = frame.reindex(columns=list(COLUMNS))
    order = dict(order or {})
    order["status"] = STATUSES
    for col in ("profile", "schedule", "recompute", "status"):
        values = frame[col].astype(object)
        seen = [v for v in pd.unique(values) if isinstance(v, str)]
        cats = list(order.get(col, []))
        cats += [v for v in seen if v not in cats]
        frame[col] = pd.Categorical(values.where(values.notna(), None), categories=cats)
    for col in ("stages", "micro_batches", "chunks", "splits"):
        converted = pd.to_numeric(frame[col], errors="coerce")
        if converted.notna().all() and (converted == converted.round()).all():
            frame[col] = converted.astype("int64")
    for col in COLUMNS:
        if col in ("peak_mb", "error", "key") or col in ("stages", "micro_batches", "chunks", "splits"):
            continue
        if col in ("profile", "schedule", "recompute", "status"):
            continue
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["error"] = frame["error"].astype(object).where(frame["error"].notna(), None)
    frame["peak_mb"] = [list(v) if isinstance(v, list | tuple | np.ndarray) else None for v in frame["peak_mb"]]
    return frame


def _input_row(name: str, fields: Mapping[str, Any], time_limit: float) -> dict[str, Any]:
    row: dict[str, Any] = {"profile": name}
    for f in CONFIG_FIELDS:
        value = fields[f]
        if f == "recompute":
            value = recompute_label(value)
        elif f == "memory_budget" and value is None:
            value = math.nan
        row[_COLUMN.get(f, f)] = value
    row["time_limit_s"] = float(time_limit)
    return row


def best(frame: pd.DataFrame, by: str | Sequence[str] = "memory_budget_mb") -> pd.DataFrame:
    """The fastest solved point (least ``step_time_ms``) of each group of ``by``.

    Groups without a solved point are left out. Ties keep the earlier row.
    """
    by = [by] if isinstance(by, str) else list(by)
    solved = frame[frame["status"].isin(SOLVED) & frame["step_time_ms"].notna()]
    if solved.empty:
        return solved.copy()
    idx = solved.groupby(by, observed=True, dropna=False, sort=True)["step_time_ms"].idxmin()
    return frame.loc[list(idx)].reset_index(drop=True)


# ----------------------------------------------------------------------------- sweep
def sweep(
    profile: Profile | str | os.PathLike[str] | Mapping[str, Profile],
    grid: Mapping[str, Any] | Iterable[PipelineConfig | Mapping[str, Any]],
    *,
    executor: str | Executor | Any = "serial",
    time_limit: float = 30,
    workers: int | None = None,
    cache: str | os.PathLike[str] | None = None,
    progress: bool = True,
    seed: int = 0,
    deterministic: bool = False,
    solve: Solve | None = None,
) -> pd.DataFrame:
    """Balance and simulate every point of a grid; one row per point (see the module docstring).

    Parameters
    ----------
    profile: a :class:`Profile`, a bundled profile name or profile file, or a mapping
        name → profile to sweep several (the name goes in the ``profile`` column).
    grid: :class:`PipelineConfig` field → list of values (the product is swept), or a list
        of explicit points (:class:`PipelineConfig` or dicts); see :func:`expand_grid`.
    executor: ``"serial"``; ``"processes"`` (a local process pool, one process per core
        unless ``workers`` asks for more solver threads); ``"dask"`` (a local Dask cluster)
        or ``"dask://HOST:PORT"`` (a running scheduler); a ``distributed.Client``; or any
        :class:`concurrent.futures.Executor` (its processes must be able to import sapptk).
    time_limit: seconds per solve.
    workers: CP-SAT workers per solve; by default chosen so that parallel solves × workers
        do not exceed this machine's cores (see :func:`default_workers`; for Dask the
        parallel solves are the cluster's threads, so a cluster at least as big as this
        machine gets 1).
    cache: a directory; finished rows are appended there as Parquet part-files and points
        already there (same profile content, config, time limit, seed, determinism) are not
        solved again.
    progress: show a ``tqdm.auto`` progress bar.
    seed, deterministic: passed to :func:`sapptk.balancer.balance`.
    solve: the function run per point instead of :func:`solve_point`: plain task dict in,
        result dict out. One defined in a notebook is shipped by value (cloudpickle).
    """
    from tqdm.auto import tqdm

    if isinstance(time_limit, bool) or not isinstance(time_limit, int | float) or not time_limit > 0:
        raise ConfigError(f"time_limit = {time_limit!r}: expected seconds > 0")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers = {workers!r}: expected an integer >= 1")
    solve = solve or solve_point
    profiles = _profiles(profile)
    points = expand_grid(grid)
    options = {"time_limit": float(time_limit), "seed": int(seed), "deterministic": bool(deterministic)}

    rows: list[dict[str, Any]] = []  # one per (profile, point), in order
    tasks: dict[str, Task] = {}  # unique points to solve, by key
    for name, prof in profiles.items():
        data, digest = prof.to_dict(), profile_digest(prof)
        for fields in points:
            key = point_key(name, digest, fields, options)
            rows.append({**_input_row(name, fields, time_limit), "key": key})
            if key not in tasks:
                config = {f: list(v) if isinstance(v, tuple | set | frozenset) else v for f, v in fields.items()}
                tasks[key] = {"key": key, "profile": data, "profile_name": name, "profile_digest": digest,
                              "config": config, **options}

    store = _Cache(cache) if cache is not None else None
    results: dict[str, Result] = {}
    if store is not None:
        cached = store.read()
        wanted = cached[cached["key"].isin(tasks.keys()) & ~cached["status"].astype(object).eq("error")]
        for rec in wanted.to_dict("records"):
            results[rec["key"]] = {c: rec.get(c) for c in (*RESULT_COLUMNS, "key")}
    todo = [t for k, t in tasks.items() if k not in results]

    inputs = {row["key"]: row for row in rows}
    with ExitStack() as stack:
        runner, slots = _open(executor, todo, solve, workers, stack)
        per_solve = workers or default_workers(slots)
        for task in todo:
            task["workers"] = per_solve
        bar = stack.enter_context(
            tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc="sweep", unit="pt", disable=not progress)
        )
        pending: list[dict[str, Any]] = []
        last_flush = time.monotonic()

        def record(result: Result) -> None:
            results[result["key"]] = result
            row = {**inputs[result["key"]], **result}
            if store is not None and _cacheable(row):
                pending.append(row)

        def flush() -> None:
            nonlocal last_flush
            if store is not None and pending:
                store.write(pending)
                pending.clear()
            last_flush = time.monotonic()

        counts: dict[str, int] = {}
        results_iter = runner(todo, rescue=record)
        try:
            for result in results_iter:
                record(result)
                status = str(result.get("status"))
                counts[status] = counts.get(status, 0) + 1
                bar.set_postfix(counts, refresh=False)
                bar.update()
                if len(pending) >= _FLUSH_ROWS or time.monotonic() - last_flush >= _FLUSH_SECONDS:
                    flush()
        finally:
            results_iter.close()  # cancels what is left; finished results go to record()
            flush()
    if store is not None:
        store.compact()

    frame = pd.DataFrame([{**row, **results.get(row["key"], _no_plan("error", "not run"))} for row in rows])
    order = {
        "profile": list(profiles),
        "schedule": list(dict.fromkeys(p["schedule"] for p in points if isinstance(p["schedule"], str))),
    }
    return _typed(frame, order)


Runner = Callable[..., Iterator[Result]]


def _open(
    executor: Any, todo: Sequence[Task], solve: Solve, workers: int | None, stack: ExitStack
) -> tuple[Runner, int]:
    """A runner for the executor (closed by ``stack``) and how many solves it runs at once."""
    cores = _cores()
    if executor == "serial" or not todo:
        return (lambda tasks, rescue: _run_serial(tasks, solve)), 1
    if executor == "processes":
        slots = max(1, min(len(todo), cores // workers if workers else cores))
        portable = _portable(solve)
        return (lambda tasks, rescue: _run_processes(tasks, portable, slots, rescue)), slots
    if isinstance(executor, str) and (executor == "dask" or executor.startswith("dask://")):
        from distributed import Client, LocalCluster

        if executor == "dask":
            n = max(1, min(len(todo), cores // workers if workers else cores))
            cluster = stack.enter_context(LocalCluster(n_workers=n, threads_per_worker=1, processes=True))
            client = stack.enter_context(Client(cluster))
        else:
            client = stack.enter_context(Client("tcp://" + executor.removeprefix("dask://")))
        executor = client
    if _is_dask_client(executor):
        slots = sum(executor.nthreads().values()) or 1
        return (lambda tasks, rescue: _run_dask(tasks, solve, executor, rescue)), slots
    if isinstance(executor, Executor):
        slots = getattr(executor, "_max_workers", None) or cores
        portable = _portable(solve)
        return (lambda tasks, rescue: _run_pool(tasks, portable, executor, rescue)), slots
    raise ConfigError(
        f"executor = {executor!r}: expected 'serial', 'processes', 'dask', 'dask://HOST:PORT', "
        "a distributed.Client or a concurrent.futures.Executor"
    )

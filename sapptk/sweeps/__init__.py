"""Sweeps: many pipeline setups balanced and simulated, one row each, as one DataFrame.

The package's modules, one job each:

* :mod:`sapptk.sweeps.grid` — grids (config fields and levers) into points, and the cache
  key of a point;
* :mod:`sapptk.sweeps.frame` — the frame's columns and types, :func:`best`;
* :mod:`sapptk.sweeps.solving` — the typed task (:class:`SweepTask`, a checked
  :class:`~sapptk.request.SolveRequest` per point) and result (:class:`PointResult`), and one
  point solved in a worker (:func:`solve_point`);
* :mod:`sapptk.sweeps.seeding` — points of one setup solved in order of budget, each
  seeded with the fastest plan of a smaller budget: the step never rises with the budget;
* :mod:`sapptk.sweeps.cache` — the cache folder: a journal every finished row reaches at
  once, Parquet parts, damaged parts skipped with a warning;
* :mod:`sapptk.sweeps.executors` — serial, process pool, Dask: interrupts, dead workers,
  workers that exit when the sweeping process dies;
* :mod:`sapptk.sweeps.driver` — :func:`sweep` itself.

Rows are never lost: a finished row is on disk (with ``cache=``) before the next point is
awaited; Ctrl-C keeps every finished row; a crash or ``SIGKILL`` of the sweeping process
loses none, and its worker processes exit with it. See ``docs/limits.md``.
"""

from __future__ import annotations

from sapptk.checks import MAX_ATTEMPTS, MAX_POINTS, MAX_SOLVER_WORKERS
from sapptk.sweeps.cache import read_cache
from sapptk.sweeps.driver import sweep
from sapptk.sweeps.executors import DASK_CONNECT_SECONDS, default_workers
from sapptk.sweeps.frame import (
    COLUMNS,
    INPUT_COLUMNS,
    LEVER_COLUMNS,
    NOT_STARTED,
    RESULT_COLUMNS,
    SOLVED,
    STATUSES,
    best,
)
from sapptk.sweeps.grid import (
    CONFIG_FIELDS,
    GRID_FIELDS,
    LEVER_FIELDS,
    expand_grid,
    point_key,
    profile_digest,
    recompute_label,
)
from sapptk.sweeps.solving import Layout, PointResult, SweepTask, plan_row, solve_point

__all__ = [
    "COLUMNS",
    "CONFIG_FIELDS",
    "DASK_CONNECT_SECONDS",
    "GRID_FIELDS",
    "INPUT_COLUMNS",
    "LEVER_COLUMNS",
    "LEVER_FIELDS",
    "MAX_ATTEMPTS",
    "MAX_POINTS",
    "MAX_SOLVER_WORKERS",
    "NOT_STARTED",
    "RESULT_COLUMNS",
    "SOLVED",
    "STATUSES",
    "Layout",
    "PointResult",
    "SweepTask",
    "best",
    "default_workers",
    "expand_grid",
    "plan_row",
    "point_key",
    "profile_digest",
    "read_cache",
    "recompute_label",
    "solve_point",
    "sweep",
]

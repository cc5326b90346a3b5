"""The sweep frame: its columns, their types, and the fastest point per group.

One row per (profile, grid point), in grid order.

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
    the allowed recompute modes, comma-joined in :data:`~sapptk.profile.MODES` order
    (``offload`` last when the point lets the plan offload activations).
``host_bandwidth_mb_per_ms``
    the host link's bandwidth (NaN: none; the grid's ``host_bandwidth``).
``slice_lengths``
    the sequence slices' lengths (None: k equal slices).
``per_micro_batch`` (bool)
    whether chosen micro-batches of a virtual stage may recompute less.
``memory_margin``
    MB kept free on every device (>= 1) or a fraction of the budget (< 1); NaN: none.
``oom_risk``, ``memory_error``
    the largest accepted chance that a device exceeds its budget, under a relative error
    of the memory figures; NaN: none.

(The lever columns are the swept request fields of :mod:`sapptk.levers`, in its order: a
lever registered there is a column here.)
``point_time_limit_s``
    the solver's time limit per point, in seconds (``sweep(point_time_limit=...)``; not the
    whole sweep's ``time_limit``). Caches written before it was renamed call it ``time_limit_s``.

Results:

``status`` (categorical, :data:`STATUSES`)
    ``optimal``/``feasible``/``infeasible``/``unknown`` from the solver; ``invalid`` when
    the combination is rejected (a :class:`~sapptk.errors.SapptkError`, e.g. a schedule
    that does not accept that many chunks); ``not_started`` when the sweep's ``time_limit``
    ran out before the point started (not cached); ``error`` when the worker failed unexpectedly
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
    the point's cache key (:func:`~sapptk.sweeps.grid.point_key`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sapptk.levers import SWEPT
from sapptk.sweeps.grid import CONFIG_FIELDS, recompute_label

__all__ = [
    "COLUMNS",
    "INPUT_COLUMNS",
    "INT_COLUMNS",
    "LABEL_COLUMNS",
    "LEVER_COLUMNS",
    "NOT_STARTED",
    "RENAMED",
    "RESULT_COLUMNS",
    "SOLVED",
    "STATUSES",
    "best",
    "input_row",
    "typed",
]

# config field -> frame column (units in the names)
COLUMN_OF = {"memory_budget": "memory_budget_mb", "constant_memory": "constant_memory_mb", "comm": "comm_ms",
             "host_bandwidth": "host_bandwidth_mb_per_ms"}
RENAMED: dict[str, str] = {"host_bandwidth": "host_bandwidth_mb_per_ms", "time_limit_s": "point_time_limit_s"}
"""Columns renamed since caches were first written: old name -> new (read under the new one)."""

NOT_STARTED = "not_started"
"""The status of a point the sweep's whole ``time_limit`` left no time to start."""
STATUSES: tuple[str, ...] = ("optimal", "feasible", "infeasible", "unknown", "invalid", NOT_STARTED, "error")
"""Every value of the ``status`` column, best first."""
SOLVED: tuple[str, ...] = ("optimal", "feasible")
"""Statuses of points that have a plan."""

LEVER_COLUMNS: tuple[str, ...] = tuple(f.frame_column for f in SWEPT)
"""The levers' columns (absent from caches written before levers could be swept: read as off)."""
INPUT_COLUMNS: tuple[str, ...] = ("profile", *(COLUMN_OF.get(f, f) for f in CONFIG_FIELDS), *LEVER_COLUMNS,
                                  "point_time_limit_s")
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

LABEL_COLUMNS: tuple[str, ...] = ("profile", "schedule", "recompute", "status")
INT_COLUMNS: tuple[str, ...] = ("stages", "micro_batches", "chunks", "splits")
FLOAT_INPUTS: tuple[str, ...] = ("memory_budget_mb", "constant_memory_mb", "comm_ms", "host_bandwidth_mb_per_ms",
                                  *(f.frame_column for f in SWEPT if f.kind == "number"))
BOOL_COLUMNS: tuple[str, ...] = tuple(f.frame_column for f in SWEPT if f.kind == "flag")


def input_row(name: str, fields: Mapping[str, Any], time_limit: float) -> dict[str, Any]:
    """The input columns of a point."""
    row: dict[str, Any] = {"profile": name}
    for f in CONFIG_FIELDS:
        value = fields[f]
        if f == "recompute":
            value = recompute_label(value)
        elif f == "memory_budget" and value is None:
            value = math.nan
        row[COLUMN_OF.get(f, f)] = value
    for f in SWEPT:
        value = fields.get(f.name, f.default)
        row[f.frame_column] = math.nan if value is None else value
    row["point_time_limit_s"] = float(time_limit)
    return row


def typed(frame: pd.DataFrame, order: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """Set the frame's dtypes: categorical labels (in ``order`` where given), floats, ints."""
    frame = frame.reindex(columns=list(COLUMNS))
    order = dict(order or {})
    order["status"] = STATUSES
    for col in LABEL_COLUMNS:
        values = frame[col].astype(object)
        seen = [v for v in pd.unique(values) if isinstance(v, str)]
        cats = list(order.get(col, []))
        cats += [v for v in seen if v not in cats]
        frame[col] = pd.Categorical(values.where(values.notna(), None), categories=cats)
    for col in INT_COLUMNS:
        converted = pd.to_numeric(frame[col], errors="coerce")
        if converted.notna().all() and (converted == converted.round()).all() and converted.abs().lt(2**62).all():
            frame[col] = converted.astype("int64")
    for col in BOOL_COLUMNS:
        values = frame[col].astype(object).where(frame[col].notna(), False)
        frame[col] = values.astype(bool) if values.map(lambda v: isinstance(v, bool | np.bool_)).all() else values
    for col in COLUMNS:
        if col in (*LABEL_COLUMNS, *INT_COLUMNS, *BOOL_COLUMNS, "peak_mb", "error", "key"):
            continue
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["error"] = frame["error"].astype(object).where(frame["error"].notna(), None)
    frame["peak_mb"] = [list(v) if isinstance(v, list | tuple | np.ndarray) else None for v in frame["peak_mb"]]
    return frame


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

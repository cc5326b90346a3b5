"""Dry-run observations: the reference tool's calibration YAML and tidy tables, read and checked.

Two inputs describe the same thing, a set of dry runs and the peak memory each device
reported:

* the reference tool's calibration YAML (``pipeline_config``, ``recompute_config``,
  ``memory_usage``, optional ``time_config``), read by
  :func:`~sapptk.calibration.calibration_file.read_calibration_yaml`;
* a tidy table (a DataFrame or a CSV file), one row per (run, device), read by
  :func:`observations_from_frame`. Its columns:

  ========================  ==========================================================
  ``run``                   a label shared by the rows of one dry run
  ``device``                the device (pipeline stage) that reported the peak, from 0
  ``peak_mb``               the observed peak, MB
  ``schedule``              schedule name (default ``1f1b``)
  ``stages``                devices in the pipeline, p
  ``micro_batches``         micro-batches per step, m (default p); any m the schedule accepts
  ``chunks``                virtual stages per device, v (default 1)
  ``splits``                sequence slices, k (default 1)
  ``layers``                body layers of the model, N
  ``offset``, ``recompute``, ``select_recompute``, ``select_comm_recompute``
                            the run's MindFormers lists (v rows of p, or p values when
                            v = 1; a CSV cell holds them as YAML/JSON text); missing
                            means offset 0 and no recompute
  ========================  ==========================================================

Both give :class:`DryRuns`: every run's schedule and per-cell layer counts per recompute
mode (MindFormers semantics, :mod:`sapptk.formats.mindformers`), and the observations.
Every problem raises :class:`~sapptk.errors.CalibrationError` naming the file, the field
and what was expected; nothing the user gave is modified.

The calibration YAML is read by :mod:`sapptk.calibration.calibration_file`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.calibration.fields import fail, integer, peak_mb
from sapptk.config import build_program
from sapptk.errors import CalibrationError, SapptkError
from sapptk.files import load_yaml_text
from sapptk.formats.mindformers import decode
from sapptk.profile import MAX_LAYERS, MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import Program

__all__ = ["FRAME_COLUMNS", "LIST_COLUMNS", "DryRun", "DryRuns", "observations_from_frame"]

FRAME_COLUMNS: tuple[str, ...] = (
    "run", "device", "peak_mb", "schedule", "stages", "micro_batches", "chunks", "splits", "layers",
    "offset", "recompute", "select_recompute", "select_comm_recompute",
)
LIST_COLUMNS = ("offset", "recompute", "select_recompute", "select_comm_recompute")


@dataclass(frozen=True, eq=False)
class DryRun:
    """One dry run: its schedule instance and how many layers of each mode every cell held.

    ``cells[r, c, s]``: layers in recompute mode ``MODES[r]`` on device ``s``'s chunk ``c``.
    """

    label: Any
    schedule: str
    stages: int
    micro_batches: int
    chunks: int
    splits: int
    layers: int
    cells: np.ndarray
    lists: Mapping[str, Any] = field(default_factory=dict)

    @property
    def program(self) -> Program:
        return build_program(self.schedule, self.stages, self.micro_batches, self.chunks, self.splits)

    def device_cells(self, device: int) -> np.ndarray:
        """Layers per (mode, chunk) on ``device``, chunks in the device's order, shape (modes, v)."""
        return self.cells[:, :, device]


@dataclass(frozen=True, eq=False)
class DryRuns:
    """Dry runs and their observations.

    ``observations``: one row per observed peak: ``run`` (index into ``runs``), ``label``,
    ``device``, ``peak_mb``. ``times``: forward times from a ``time_config`` (ms by group
    ``head``/``body``/``tail``), when the input had one. ``source``: for messages.
    """

    runs: tuple[DryRun, ...]
    observations: pd.DataFrame
    times: Mapping[str, float]
    source: str
    name: str



# ------------------------------------------------------------------- the tidy table
def _cell_text(value: Any, source: str, label: str) -> Any:
    """A list column's cell: Python data as is; text (from CSV) parsed as YAML/JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, str):
        try:  # sapptk's YAML reader and its nesting guard: 10,000 brackets are refused, not a RecursionError
            return load_yaml_text(value, source=f"{source}: {label}", error=CalibrationError)
        except SapptkError:
            fail(source, label, value, "a MindFormers list written as YAML or JSON, e.g. [1, 0, -1, 0]")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _decode_profile(layers: int) -> Profile:
    """A one-group profile with every mode: lets :func:`sapptk.formats.mindformers.decode` read the lists."""
    modes = {m: ModeCost(0.0, 0.0) for m in MODES}
    return Profile("calibration", (LayerGroup("body", "body", layers, 0.0, 0.0, modes),))


def observations_from_frame(
    frame: pd.DataFrame, *, source: str = "<observations>", name: str = "calibrated"
) -> DryRuns:
    """A tidy table of observations (see the module docstring) as :class:`DryRuns`; ``frame`` is not modified."""
    if not isinstance(frame, pd.DataFrame):
        fail(source, "observations", type(frame).__name__, "a DataFrame with one row per (run, device)")
    missing = [c for c in ("run", "device", "peak_mb", "stages", "layers") if c not in frame.columns]
    if missing:
        raise CalibrationError(
            f"{source}: column {missing[0]!r} is missing: expected columns {', '.join(FRAME_COLUMNS)} "
            "(schedule, micro_batches, chunks, splits and the four lists are optional)"
        )
    unknown = [c for c in frame.columns if c not in FRAME_COLUMNS]
    if unknown:
        raise CalibrationError(f"{source}: unknown column {unknown[0]!r}: expected columns {', '.join(FRAME_COLUMNS)}")
    if frame.empty:
        raise CalibrationError(f"{source}: no observations: expected one row per (run, device) with its peak_mb")
    runs: list[DryRun] = []
    index: dict[Any, int] = {}
    signatures: dict[Any, str] = {}
    obs = []
    for i, row in enumerate(frame.to_dict("records")):
        where = f"row {i}"
        label = row["run"]
        values = {
            "schedule": row.get("schedule", "1f1b"),
            "stages": row["stages"],
            "micro_batches": row.get("micro_batches"),
            "chunks": row.get("chunks", 1),
            "splits": row.get("splits", 1),
            "layers": row["layers"],
        }
        for key in ("micro_batches", "chunks", "splits", "schedule"):
            value = values[key]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                values[key] = {"schedule": "1f1b", "chunks": 1, "splits": 1, "micro_batches": None}[key]
        lists = {k: _cell_text(row.get(k), source, f"{where}: {k}") for k in LIST_COLUMNS}
        key = label.item() if isinstance(label, np.generic) else label
        try:
            hash(key)
        except TypeError:
            fail(source, f"{where}: run", label, "a label (a number or a string)")
        signature = _make_signature(values, lists)
        if key not in index:
            checks.size(len(runs) + 1, f"{source}: {where}: dry runs", error=CalibrationError,
                        limit=checks.MAX_DESIGN_ROUNDS, what="runs", constant="sapptk.checks.MAX_DESIGN_ROUNDS")
            index[key] = len(runs)
            signatures[key] = signature
            runs.append(_make_run(key, values, lists, source))
        else:
            if signature != signatures[key]:
                raise CalibrationError(
                    f"{source}: {where}: run {key!r} is described differently than on its first row: expected the "
                    f"same schedule, sizes and MindFormers lists on every row of a run"
                )
        run = runs[index[key]]
        device = integer(row["device"], source, f"{where}: device", minimum=0)
        if device >= run.stages:
            fail(source, f"{where}: device", device, f"a device from 0 to {run.stages - 1} (run {key!r} has "
                  f"{run.stages} stages)")
        obs.append((index[key], key, device, peak_mb(row["peak_mb"], source, f"{where}: peak_mb")))
    observations = pd.DataFrame(obs, columns=["run", "label", "device", "peak_mb"])
    dup = observations.duplicated(["run", "device"], keep=False)
    if dup.any():
        first = observations[dup].iloc[0]
        raise CalibrationError(
            f"{source}: run {first['label']!r}, device {int(first['device'])} is observed twice: expected one peak "
            "per (run, device)"
        )
    return DryRuns(tuple(runs), observations, {}, source, name)


def _make_signature(values: Mapping[str, Any], lists: Mapping[str, Any]) -> str:
    clean = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in values.items()}
    return json.dumps([clean, {k: lists.get(k) for k in LIST_COLUMNS}], sort_keys=True, default=str)


def _make_run(label: Any, values: Mapping[str, Any], lists: Mapping[str, Any], source: str) -> DryRun:
    where = f"{source}: run {label!r}"
    schedule = values["schedule"]
    if not isinstance(schedule, str):
        fail(where, "schedule", schedule, "a schedule name")
    p = integer(values["stages"], where, "stages", minimum=1, maximum=checks.MAX_STAGES)
    v = integer(values["chunks"], where, "chunks", minimum=1, maximum=checks.MAX_STAGES)
    k = integer(values["splits"], where, "splits", minimum=1)
    n = integer(values["layers"], where, "layers", minimum=1, maximum=MAX_LAYERS)
    m = p if values["micro_batches"] is None else integer(values["micro_batches"], where, "micro_batches", minimum=1)
    try:
        program = build_program(schedule, p, m, v, k)
    except SapptkError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    try:
        counts = decode(_decode_profile(n), program, {key: lists.get(key) for key in LIST_COLUMNS},
                        file=source, name=f"run {label!r}")
    except SapptkError as exc:
        raise CalibrationError(str(exc)) from None
    grid = np.empty((v, p), dtype=np.int64)
    for s, stages in enumerate(program.device_stages):
        grid[:, s] = stages
    cells = counts[0][:, grid]  # (modes, v, p)
    return DryRun(label, schedule, p, m, v, k, n, cells, dict(lists))

"""Dry-run observations: the reference tool's calibration YAML and tidy tables, read and checked.

Two inputs describe the same thing, a set of dry runs and the peak memory each device
reported:

* the reference tool's calibration YAML (``pipeline_config``, ``recompute_config``,
  ``memory_usage``, optional ``time_config``), read by :func:`read_calibration_yaml`;
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

The calibration YAML, field by field (the reference format, with its quirks):

* ``pipeline_config``: ``pipeline_num`` (p), ``num_layer`` (N), ``offset``: ``0``, a list of
  p values, or a list of such lists, one per dry-run *round*. Stage s holds ⌊N/p⌋ +
  offset[s] layers, so the offsets sum to N mod p. Files whose offsets sum to N mod p − p
  (the stages then hold ⌈N/p⌉ + offset[s] layers, again N in all, as
  ``init_demo_pp4_rounds.yaml`` is written) are read that way. Optional (ours):
  ``schedule`` (default ``1f1b``), ``micro_batches`` (default p), ``chunks`` (default 1;
  with v > 1 each round's lists have v rows).
* ``recompute_config``: ``recompute``, ``select_recompute``, ``select_comm_recompute``, each
  a bool, a list, or (with rounds) a list with one bool or list per round.
* ``memory_usage``: ``head_memory`` (device 0's peak) and ``tail_memory`` (device p − 1's),
  both from the first round; ``body_memories``: ``stage_id`` and ``memories``, flat, or one
  list per round.
* ``time_config`` (optional): ``head``, ``body``, ``tail`` forward times, ms.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
import yaml

from sapptk.config import build_program
from sapptk.errors import CalibrationError, SapptkError
from sapptk.formats.mindformers import decode
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import Program

__all__ = [
    "FRAME_COLUMNS",
    "DryRun",
    "DryRuns",
    "observations_from_frame",
    "read_calibration_yaml",
    "read_observations",
]

FRAME_COLUMNS: tuple[str, ...] = (
    "run", "device", "peak_mb", "schedule", "stages", "micro_batches", "chunks", "splits", "layers",
    "offset", "recompute", "select_recompute", "select_comm_recompute",
)
_LIST_COLUMNS = ("offset", "recompute", "select_recompute", "select_comm_recompute")
_RUN_COLUMNS = ("schedule", "stages", "micro_batches", "chunks", "splits", "layers", *_LIST_COLUMNS)
_MAX_FILE_BYTES = 16 * 1024 * 1024


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


# ------------------------------------------------------------------------ small helpers
def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(source: str, field_name: str, value: Any, expected: str) -> NoReturn:
    raise CalibrationError(f"{source}: {field_name} = {_show(value)}: expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int(value: Any, source: str, field_name: str, *, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, np.integer):
        value = int(value)
    if not _is_int(value) or value < minimum:
        _fail(source, field_name, value, f"an integer >= {minimum}")
    return int(value)


def _mb(value: Any, source: str, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        _fail(source, field_name, value, "a peak memory in MB (a finite number)")
    return float(value)


def _load_yaml(path: Path, source: str) -> Any:
    """A user's YAML file through ``yaml.safe_load``, refusing unreadable, huge or invalid files."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CalibrationError(f"{source}: cannot read the file: no such file") from None
    except OSError as exc:
        raise CalibrationError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
    if path.is_dir():
        raise CalibrationError(f"{source}: cannot read the file: it is a directory")
    if size > _MAX_FILE_BYTES:
        raise CalibrationError(
            f"{source}: file is larger than {_MAX_FILE_BYTES // 2**20} MB: expected a calibration file"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"{source}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CalibrationError(f"{source}: invalid YAML{where}: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise CalibrationError(f"{source}: invalid YAML: {exc}") from None


def _mapping(data: Any, source: str, field_name: str, keys: Sequence[str], required: Sequence[str]) -> Mapping:
    if not isinstance(data, Mapping):
        _fail(source, field_name, data, f"a mapping with {', '.join(keys)}")
    for key in data:
        if key not in keys:
            raise CalibrationError(
                f"{source}: {field_name}: unknown field {_show(key)}: expected one of {', '.join(keys)}"
            )
    for key in required:
        if key not in data:
            raise CalibrationError(f"{source}: {field_name}.{key} is missing: expected it (see the calibration format)")
    return data


# ------------------------------------------------------------- the calibration YAML
_TOP = ("pipeline_config", "recompute_config", "memory_usage", "time_config")
_PIPELINE = ("pipeline_num", "num_layer", "offset", "schedule", "micro_batches", "chunks")
_RECOMPUTE_KEYS = ("recompute", "select_recompute", "select_comm_recompute")


def _depth(value: Any) -> int:
    """Nesting depth of lists: 0 for a scalar, 1 for a flat list, ..."""
    if isinstance(value, list) and value:
        return 1 + max(_depth(x) for x in value)
    return 1 if isinstance(value, list) else 0


def _grid(value: Any, source: str, label: str, v: int, p: int, *, offset: bool) -> np.ndarray | bool:
    """One round's list as ints (v, p), or a bool for a whole-run recompute flag."""
    if isinstance(value, bool):
        if offset:
            _fail(source, label, value, f"0 or a list of {p} integers")
        return value
    if offset and _is_int(value):
        if value != 0:
            _fail(source, label, value, f"0 or a list of {p} integers (one per stage)")
        return np.zeros((v, p), dtype=np.int64)
    if value is None and not offset:
        return False
    shape = f"a list of {p} integers (one per stage)" if v == 1 else f"{v} lists (chunks) of {p} integers (stages)"
    if not isinstance(value, list):
        _fail(source, label, value, ("true, false or " if not offset else "0 or ") + shape)
    rows = [value] if v == 1 else value
    if v > 1 and len(rows) != v:
        _fail(source, label, value, shape)
    out = np.zeros((v, p), dtype=np.int64)
    for c, row in enumerate(rows):
        row_label = label if v == 1 else f"{label}[{c}]"
        if not isinstance(row, list) or len(row) != p:
            got = f"{len(row)} entries" if isinstance(row, list) else _show(row)
            raise CalibrationError(
                f"{source}: {row_label} has {got}: expected {p} (one per stage, pipeline_num = {p})"
            )
        for s, x in enumerate(row):
            if not _is_int(x) or (not offset and x < 0):
                kind = "an integer" if offset else "a layer count >= 0"
                _fail(source, f"{row_label}[{s}]", x, kind)
            out[c, s] = int(x)
    return out


def _per_round(value: Any, rounds: int, source: str, label: str, depth_one_round: int) -> list[Any]:
    """A field given once for all rounds, or once per round."""
    if rounds == 1:
        return [value]
    if isinstance(value, bool) or value is None or (_is_int(value) and value == 0):
        return [value] * rounds
    if not isinstance(value, list) or len(value) != rounds or _depth(value) > depth_one_round + 1:
        _fail(source, label, value, f"one entry per dry-run round ({rounds} rounds, as pipeline_config.offset has)")
    return list(value)


def read_calibration_yaml(path: str | os.PathLike[str]) -> DryRuns:
    """The reference tool's calibration YAML as :class:`DryRuns` (see the module docstring)."""
    source = os.fspath(path)
    data = _load_yaml(Path(source), source)
    if data is None:
        raise CalibrationError(f"{source}: the file is empty: expected pipeline_config, recompute_config, memory_usage")
    top = _mapping(data, source, "top level", _TOP, ("pipeline_config", "memory_usage"))
    pipe = _mapping(top["pipeline_config"], source, "pipeline_config", _PIPELINE, ("pipeline_num", "num_layer"))
    p = _int(pipe["pipeline_num"], source, "pipeline_config.pipeline_num", minimum=1)
    n = _int(pipe["num_layer"], source, "pipeline_config.num_layer", minimum=1)
    v = _int(pipe.get("chunks", 1), source, "pipeline_config.chunks", minimum=1)
    m = _int(pipe.get("micro_batches", p), source, "pipeline_config.micro_batches", minimum=1)
    schedule = pipe.get("schedule", "1f1b")
    if not isinstance(schedule, str):
        _fail(source, "pipeline_config.schedule", schedule, "a schedule name such as '1f1b'")
    one = 1 if v == 1 else 2  # list depth of one round's list
    offset_raw = pipe.get("offset", 0)
    rounds = len(offset_raw) if isinstance(offset_raw, list) and _depth(offset_raw) == one + 1 else 1
    if rounds == 0:
        _fail(source, "pipeline_config.offset", offset_raw, "0, a list of offsets, or one list per round")
    cells_total = p * v
    base, rem = divmod(n, cells_total)
    offsets = []
    for r, raw in enumerate(_per_round(offset_raw, rounds, source, "pipeline_config.offset", one)):
        label = "pipeline_config.offset" + (f"[{r}]" if rounds > 1 else "")
        grid = _grid(raw, source, label, v, p, offset=True)
        total = int(grid.sum())
        if total == rem:
            layers = base + grid
        elif rem and total == rem - cells_total:  # written against ceil(N/p) (N in all all the same)
            layers = base + 1 + grid
        else:
            alt = f" (or {rem - cells_total}, offsets against ⌈N/(p·v)⌉)" if rem else ""
            raise CalibrationError(
                f"{source}: {label} sums to {total}: expected {rem}{alt}, so that the {cells_total} cells hold "
                f"num_layer = {n} layers ({base} per cell + offset)"
            )
        if (layers < 0).any():
            c, s = (int(x) for x in np.argwhere(layers < 0)[0])
            _fail(source, f"{label}[{s}]" if v == 1 else f"{label}[{c}][{s}]", int(grid[c, s]),
                  f"an offset leaving the stage >= 0 layers (it would hold {int(layers[c, s])})")
        offsets.append(layers)

    rec_cfg = top.get("recompute_config") or {}
    rec_cfg = _mapping(rec_cfg, source, "recompute_config", _RECOMPUTE_KEYS, ())
    runs = []
    for r in range(rounds):
        values = {}
        for key in _RECOMPUTE_KEYS:
            raw = _per_round(rec_cfg.get(key), rounds, source, f"recompute_config.{key}", one)[r]
            label = f"recompute_config.{key}" + (f"[{r}]" if rounds > 1 else "")
            grid = _grid(raw, source, label, v, p, offset=False)
            if isinstance(grid, bool):
                grid = offsets[r] if grid else np.zeros((v, p), dtype=np.int64)
            over = grid > offsets[r]
            if over.any():
                c, s = (int(x) for x in np.argwhere(over)[0])
                _fail(source, f"{label}[{s}]" if v == 1 else f"{label}[{c}][{s}]", int(grid[c, s]),
                      f"at most {int(offsets[r][c, s])}, the layers stage {s} holds in this round")
            values[key] = grid
        lists = {"offset": _rows(offsets[r] - base), **{k: _rows(values[k]) for k in _RECOMPUTE_KEYS}}
        runs.append((lists, offsets[r]))

    usage = _mapping(top["memory_usage"], source, "memory_usage", ("head_memory", "tail_memory", "body_memories"),
                     ("head_memory", "tail_memory"))
    rows = [
        (0, 0, _mb(usage["head_memory"], source, "memory_usage.head_memory")),
        (0, p - 1, _mb(usage["tail_memory"], source, "memory_usage.tail_memory")),
    ]
    body = usage.get("body_memories") or {}
    body = _mapping(body, source, "memory_usage.body_memories", ("stage_id", "memories"), ())
    ids = _per_round(body.get("stage_id", []), rounds, source, "memory_usage.body_memories.stage_id", 1)
    mems = _per_round(body.get("memories", []), rounds, source, "memory_usage.body_memories.memories", 1)
    for r in range(rounds):
        suffix = f"[{r}]" if rounds > 1 else ""
        id_label = f"memory_usage.body_memories.stage_id{suffix}"
        mem_label = f"memory_usage.body_memories.memories{suffix}"
        if not isinstance(ids[r], list):
            _fail(source, id_label, ids[r], "a list of stage ids")
        if not isinstance(mems[r], list) or len(mems[r]) != len(ids[r]):
            _fail(source, mem_label, mems[r], f"a list of {len(ids[r])} peaks in MB, one per entry of {id_label}")
        for i, (s, mb) in enumerate(zip(ids[r], mems[r], strict=True)):
            if not _is_int(s) or not 0 <= s < p:
                _fail(source, f"{id_label}[{i}]", s, f"a stage id from 0 to {p - 1} (pipeline_num = {p})")
            rows.append((r, int(s), _mb(mb, source, f"{mem_label}[{i}]")))

    times: dict[str, float] = {}
    if top.get("time_config") is not None:
        tc = _mapping(top["time_config"], source, "time_config", ("head", "body", "tail"), ())
        for key, value in tc.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (float(value) >= 0):
                _fail(source, f"time_config.{key}", value, "a forward time in ms >= 0")
            times[key] = float(value)

    frame = pd.DataFrame(
        {
            "run": [r for r, _, _ in rows],
            "device": [d for _, d, _ in rows],
            "peak_mb": [mb for _, _, mb in rows],
        }
    )
    for col, value in (("schedule", schedule), ("stages", p), ("micro_batches", m), ("chunks", v),
                       ("splits", 1), ("layers", n)):
        frame[col] = value
    for key in _LIST_COLUMNS:
        frame[key] = [runs[r][0][key] for r in frame["run"]]
    name = Path(source).stem or "calibrated"
    dry = observations_from_frame(frame, source=source, name=name)
    return DryRuns(dry.runs, dry.observations, times, source, name)


def _rows(grid: np.ndarray) -> list:
    rows = [[int(x) for x in row] for row in grid]
    return rows[0] if len(rows) == 1 else rows


# ------------------------------------------------------------------- the tidy table
def _cell_text(value: Any, source: str, label: str) -> Any:
    """A list column's cell: Python data as is; text (from CSV) parsed as YAML/JSON."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            _fail(source, label, value, "a MindFormers list written as YAML or JSON, e.g. [1, 0, -1, 0]")
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
        _fail(source, "observations", type(frame).__name__, "a DataFrame with one row per (run, device)")
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
        lists = {k: _cell_text(row.get(k), source, f"{where}: {k}") for k in _LIST_COLUMNS}
        key = label.item() if isinstance(label, np.generic) else label
        try:
            hash(key)
        except TypeError:
            _fail(source, f"{where}: run", label, "a label (a number or a string)")
        signature = _make_signature(values, lists)
        if key not in index:
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
        device = _int(row["device"], source, f"{where}: device", minimum=0)
        if device >= run.stages:
            _fail(source, f"{where}: device", device, f"a device from 0 to {run.stages - 1} (run {key!r} has "
                  f"{run.stages} stages)")
        obs.append((index[key], key, device, _mb(row["peak_mb"], source, f"{where}: peak_mb")))
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
    return json.dumps([clean, {k: lists.get(k) for k in _LIST_COLUMNS}], sort_keys=True, default=str)


def _make_run(label: Any, values: Mapping[str, Any], lists: Mapping[str, Any], source: str) -> DryRun:
    where = f"{source}: run {label!r}"
    schedule = values["schedule"]
    if not isinstance(schedule, str):
        _fail(where, "schedule", schedule, "a schedule name")
    p = _int(values["stages"], where, "stages", minimum=1)
    v = _int(values["chunks"], where, "chunks", minimum=1)
    k = _int(values["splits"], where, "splits", minimum=1)
    n = _int(values["layers"], where, "layers", minimum=1)
    m = p if values["micro_batches"] is None else _int(values["micro_batches"], where, "micro_batches", minimum=1)
    try:
        program = build_program(schedule, p, m, v, k)
    except SapptkError as exc:
        raise CalibrationError(f"{where}: {exc}") from None
    try:
        counts = decode(_decode_profile(n), program, {key: lists.get(key) for key in _LIST_COLUMNS},
                        file=source, name=f"run {label!r}")
    except SapptkError as exc:
        raise CalibrationError(str(exc)) from None
    grid = np.empty((v, p), dtype=np.int64)
    for s, stages in enumerate(program.device_stages):
        grid[:, s] = stages
    cells = counts[0][:, grid]  # (modes, v, p)
    return DryRun(label, schedule, p, m, v, k, n, cells, dict(lists))


def read_observations(source: str | os.PathLike[str] | pd.DataFrame) -> DryRuns:
    """Dry runs from a calibration YAML (``.yaml``/``.yml``), a CSV table (``.csv``) or a DataFrame."""
    if isinstance(source, pd.DataFrame):
        return observations_from_frame(source)
    if not isinstance(source, str | os.PathLike):
        _fail("calibrate", "source", source, "a calibration YAML, a CSV of observations or a DataFrame")
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return read_calibration_yaml(path)
    if suffix == ".csv":
        text = path.read_text(encoding="utf-8-sig") if path.is_file() else None
        if text is None:
            raise CalibrationError(f"{os.fspath(path)}: cannot read the file: no such file")
        try:
            frame = pd.read_csv(io.StringIO(text))
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise CalibrationError(f"{os.fspath(path)}: invalid CSV: {exc}") from None
        return observations_from_frame(frame, source=os.fspath(path), name=path.stem or "calibrated")
    raise CalibrationError(
        f"{os.fspath(path)}: file name ends in {suffix or '(nothing)'!r}: expected a calibration YAML (.yaml, .yml) "
        "or a CSV table of observations (.csv)"
    )

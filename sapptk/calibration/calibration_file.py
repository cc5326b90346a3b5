"""The reference tool's calibration YAML, read as :class:`~sapptk.calibration.observations.DryRuns`.

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
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.calibration.fields import fail, integer, is_int, load_yaml, mapping, peak_mb, show
from sapptk.calibration.observations import LIST_COLUMNS, DryRuns, observations_from_frame
from sapptk.errors import CalibrationError
from sapptk.profile import MAX_LAYERS

__all__ = ["read_calibration_yaml", "read_observations"]

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
            fail(source, label, value, f"0 or a list of {p} integers")
        return value
    if offset and is_int(value):
        if value != 0:
            fail(source, label, value, f"0 or a list of {p} integers (one per stage)")
        return np.zeros((v, p), dtype=np.int64)
    if value is None and not offset:
        return False
    shape = f"a list of {p} integers (one per stage)" if v == 1 else f"{v} lists (chunks) of {p} integers (stages)"
    if not isinstance(value, list):
        fail(source, label, value, ("true, false or " if not offset else "0 or ") + shape)
    rows = [value] if v == 1 else value
    if v > 1 and len(rows) != v:
        fail(source, label, value, shape)
    out = np.zeros((v, p), dtype=np.int64)
    for c, row in enumerate(rows):
        row_label = label if v == 1 else f"{label}[{c}]"
        if not isinstance(row, list) or len(row) != p:
            got = f"{len(row)} entries" if isinstance(row, list) else show(row)
            raise CalibrationError(
                f"{source}: {row_label} has {got}: expected {p} (one per stage, pipeline_num = {p})"
            )
        for s, x in enumerate(row):
            if not is_int(x) or (not offset and x < 0):
                kind = "an integer" if offset else "a layer count >= 0"
                fail(source, f"{row_label}[{s}]", x, kind)
            out[c, s] = int(x)
    return out


def _per_round(value: Any, rounds: int, source: str, label: str, depth_one_round: int) -> list[Any]:
    """A field given once for all rounds, or once per round."""
    if rounds == 1:
        return [value]
    if isinstance(value, bool) or value is None or (is_int(value) and value == 0):
        return [value] * rounds
    if not isinstance(value, list) or len(value) != rounds or _depth(value) > depth_one_round + 1:
        fail(source, label, value, f"one entry per dry-run round ({rounds} rounds, as pipeline_config.offset has)")
    return list(value)


def read_calibration_yaml(path: str | os.PathLike[str]) -> DryRuns:
    """The reference tool's calibration YAML as :class:`DryRuns` (see the module docstring)."""
    source = os.fspath(path)
    data = load_yaml(Path(source), source)
    if data is None:
        raise CalibrationError(f"{source}: the file is empty: expected pipeline_config, recompute_config, memory_usage")
    top = mapping(data, source, "top level", _TOP, ("pipeline_config", "memory_usage"))
    pipe = mapping(top["pipeline_config"], source, "pipeline_config", _PIPELINE, ("pipeline_num", "num_layer"))
    p = integer(pipe["pipeline_num"], source, "pipeline_config.pipeline_num", minimum=1, maximum=checks.MAX_STAGES)
    n = integer(pipe["num_layer"], source, "pipeline_config.num_layer", minimum=1, maximum=MAX_LAYERS)
    v = integer(pipe.get("chunks", 1), source, "pipeline_config.chunks", minimum=1, maximum=checks.MAX_STAGES)
    m = integer(pipe.get("micro_batches", p), source, "pipeline_config.micro_batches", minimum=1)
    schedule = pipe.get("schedule", "1f1b")
    if not isinstance(schedule, str):
        fail(source, "pipeline_config.schedule", schedule, "a schedule name such as '1f1b'")
    one = 1 if v == 1 else 2  # list depth of one round's list
    offset_raw = pipe.get("offset", 0)
    rounds = len(offset_raw) if isinstance(offset_raw, list) and _depth(offset_raw) == one + 1 else 1
    if rounds == 0:
        fail(source, "pipeline_config.offset", offset_raw, "0, a list of offsets, or one list per round")
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
            fail(source, f"{label}[{s}]" if v == 1 else f"{label}[{c}][{s}]", int(grid[c, s]),
                  f"an offset leaving the stage >= 0 layers (it would hold {int(layers[c, s])})")
        offsets.append(layers)

    rec_cfg = top.get("recompute_config") or {}
    rec_cfg = mapping(rec_cfg, source, "recompute_config", _RECOMPUTE_KEYS, ())
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
                fail(source, f"{label}[{s}]" if v == 1 else f"{label}[{c}][{s}]", int(grid[c, s]),
                      f"at most {int(offsets[r][c, s])}, the layers stage {s} holds in this round")
            values[key] = grid
        lists = {"offset": _rows(offsets[r] - base), **{k: _rows(values[k]) for k in _RECOMPUTE_KEYS}}
        runs.append((lists, offsets[r]))

    usage = mapping(top["memory_usage"], source, "memory_usage", ("head_memory", "tail_memory", "body_memories"),
                     ("head_memory", "tail_memory"))
    rows = [
        (0, 0, peak_mb(usage["head_memory"], source, "memory_usage.head_memory")),
        (0, p - 1, peak_mb(usage["tail_memory"], source, "memory_usage.tail_memory")),
    ]
    body = usage.get("body_memories") or {}
    body = mapping(body, source, "memory_usage.body_memories", ("stage_id", "memories"), ())
    ids = _per_round(body.get("stage_id", []), rounds, source, "memory_usage.body_memories.stage_id", 1)
    mems = _per_round(body.get("memories", []), rounds, source, "memory_usage.body_memories.memories", 1)
    for r in range(rounds):
        suffix = f"[{r}]" if rounds > 1 else ""
        id_label = f"memory_usage.body_memories.stage_id{suffix}"
        mem_label = f"memory_usage.body_memories.memories{suffix}"
        if not isinstance(ids[r], list):
            fail(source, id_label, ids[r], "a list of stage ids")
        if not isinstance(mems[r], list) or len(mems[r]) != len(ids[r]):
            fail(source, mem_label, mems[r], f"a list of {len(ids[r])} peaks in MB, one per entry of {id_label}")
        for i, (s, mb) in enumerate(zip(ids[r], mems[r], strict=True)):
            if not is_int(s) or not 0 <= s < p:
                fail(source, f"{id_label}[{i}]", s, f"a stage id from 0 to {p - 1} (pipeline_num = {p})")
            rows.append((r, int(s), peak_mb(mb, source, f"{mem_label}[{i}]")))

    times: dict[str, float] = {}
    if top.get("time_config") is not None:
        tc = mapping(top["time_config"], source, "time_config", ("head", "body", "tail"), ())
        for key, value in tc.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (float(value) >= 0):
                fail(source, f"time_config.{key}", value, "a forward time in ms >= 0")
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
    for key in LIST_COLUMNS:
        frame[key] = [runs[r][0][key] for r in frame["run"]]
    name = Path(source).stem or "calibrated"
    dry = observations_from_frame(frame, source=source, name=name)
    return DryRuns(dry.runs, dry.observations, times, source, name)


def _rows(grid: np.ndarray) -> list:
    rows = [[int(x) for x in row] for row in grid]
    return rows[0] if len(rows) == 1 else rows


def read_observations(source: str | os.PathLike[str] | pd.DataFrame) -> DryRuns:
    """Dry runs from a calibration YAML (``.yaml``/``.yml``), a CSV table (``.csv``) or a DataFrame."""
    if isinstance(source, pd.DataFrame):
        return observations_from_frame(source)
    if not isinstance(source, str | os.PathLike):
        fail("calibrate", "source", source, "a calibration YAML, a CSV of observations or a DataFrame")
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

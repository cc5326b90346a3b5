"""The MindFormers plan format: a layer assignment as offset/recompute lists.

Per body group, four lists, each ``v`` rows (chunks) of ``p`` entries (devices); the entry
``[c][s]`` describes the virtual stage that device ``s`` runs as its chunk ``c`` (for the
interleaved schedules that is virtual stage ``c·p + s``; for V-shaped placements chunk 1
runs the devices backwards, and ``[1][s]`` still means *device* ``s``):

``offset[c][s]``
    layers in the cell − ⌊N / (p·v)⌋. The offsets sum to ``N mod (p·v)``.
``recompute[c][s]``
    layers with full recompute.
``select_recompute[c][s]``
    layers with select, both or full recompute.
``select_comm_recompute[c][s]``
    layers with comm, both or full recompute.

Reading a cell back (MindFormers recomputes the *first* k layers of a cell for each key):
full = recompute; both = max(0, min(select − full, comm − full)); select-only =
max(0, select − full − both); comm-only = max(0, comm − full − both); none = the rest.

Accepted spellings of one list: missing / ``null`` (offset 0, no recompute); for the
recompute keys ``true`` (every layer of every cell) or ``false``; ``v`` rows of ``p``
entries, where a recompute row or entry may itself be ``true``/``false``; a flat list of
``p`` entries when ``v = 1``; for ``offset`` a single integer (the same offset everywhere,
MindFormers' default ``offset: 0``). Op-name patterns (``select_recompute: ['feed_forward\\.mul']``)
are refused: the profile measured one fixed operator set per mode.

Where the lists live
--------------------
* One body group: the four keys at the top level of a config, as MindFormers has them.
* Several body groups (canonical, what :func:`encode` writes): one mapping per group name,
  each holding that group's four lists, offsets relative to ⌊N_g / (p·v)⌋. The groups must
  stay contiguous in model order across the virtual stages.
* Several body groups, four keys at the top level: MindFormers' own meaning for a whole
  layer stack — offsets relative to ⌊N / (p·v)⌋ with N all body layers, and in each cell
  the first ``recompute`` layers (in model order) full, then both, then select- or
  comm-only. Read only; written plans always use the per-group form.
* A MindFormers training YAML (``model: model_config: offset`` and ``recompute_config:``)
  is read too; ``num_layers``, ``pp_interleave_num`` and ``pipeline_stage`` are checked
  against the profile and setup when present, every other key is ignored.

A file may hold one config or a mapping of named configs (``name: {offset: ..., ...}``).
A mapping is one config when it has any of the four keys, when all its keys are body group
names, or when it is a training YAML; otherwise each of its entries is a named config.

Every problem raises :class:`~sapptk.errors.ConfigError` naming the file, the config, the
key, the cell ``[c][s]``, the value and what was expected. Input data is never modified.

Plan level: :func:`plan_export` (``plan.export("mindformers", path)``) writes the lists as YAML
with a comment header; :func:`read_plan` and :func:`read_plans` (``sapptk.load_plan`` /
``sapptk.load_plans`` with ``format="mindformers"``) read one or every config of a file.

(Over 500 lines: the four lists, their accepted spellings, the reading of a training
YAML and the plan-level reader and writer are one format; the encoder and the decoder share
the cell grid.)
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import yaml

from sapptk.checks import show
from sapptk.errors import ConfigError
from sapptk.files import load_document
from sapptk.formats.base import (
    Export,
    check_inputs,
    check_path,
    make_export,
    need_solution,
    one_line,
    refuse_levers,
    write_files,
)
from sapptk.profile import MODES

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan
    from sapptk.profile import LayerGroup, Profile
    from sapptk.schedules import Program

__all__ = [
    "KEYS",
    "RECOMPUTE_KEYS",
    "cell_grid",
    "decode",
    "decode_cell",
    "encode",
    "load",
    "plan_export",
    "read_plan",
    "read_plans",
    "split_configs",
]

KEYS: tuple[str, ...] = ("offset", "recompute", "select_recompute", "select_comm_recompute")
RECOMPUTE_KEYS: tuple[str, ...] = KEYS[1:]

_NONE, _SELECT, _COMM, _BOTH, _FULL = (MODES.index(m) for m in ("none", "select", "comm", "both", "full"))


# ------------------------------------------------------------------------------ context
@dataclass(frozen=True)
class _Where:
    """Where a value came from, for messages: file, config name, group."""

    file: str | None = None
    config: str | None = None
    group: str | None = None

    def __str__(self) -> str:
        parts = [self.file or "<data>"]
        if self.config is not None:
            parts.append(f"config {self.config!r}")
        if self.group is not None:
            parts.append(f"group {self.group!r}")
        return ", ".join(parts)

    def fail(self, message: str) -> NoReturn:
        raise ConfigError(f"{self}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# ----------------------------------------------------------------------------- geometry
def cell_grid(program: Program) -> np.ndarray:
    """Virtual stage of every cell: ``grid[c, s]`` = the chunk-``c`` stage of device ``s``, shape (v, p)."""
    v, p = program.chunks, program.stages
    grid = np.empty((v, p), dtype=np.int64)
    for s, stages in enumerate(program.device_stages):
        if len(stages) != v:
            raise ConfigError(
                f"schedule {program.name!r}: device {s} holds {len(stages)} virtual stages: "
                f"expected {v} (one per chunk) for the MindFormers format"
            )
        grid[:, s] = stages
    return grid


# ------------------------------------------------------------------------------- encode
def _rows(grid: np.ndarray) -> list:
    """(v, p) ints as MindFormers lists: a flat list when v = 1."""
    rows = [[int(x) for x in row] for row in grid]
    return rows[0] if len(rows) == 1 else rows


def encode(profile: Profile, program: Program, counts: np.ndarray) -> dict[str, dict[str, list]]:
    """A validated assignment as ``{group name: {offset, recompute, select_recompute, select_comm_recompute}}``.

    Raises :class:`ConfigError` for a cell holding both select-only and comm-only layers:
    MindFormers recomputes the first k layers of a cell per key, so such a cell would read
    back as "both" layers.
    """
    grid = cell_grid(program)
    nvs = program.num_virtual_stages
    out: dict[str, dict[str, list]] = {}
    for g, group in enumerate(profile.body):
        cell = np.asarray(counts[g])[:, grid]  # (modes, v, p)
        clash = (cell[_SELECT] > 0) & (cell[_COMM] > 0)
        if clash.any():
            c, s = (int(x) for x in np.argwhere(clash)[0])
            raise ConfigError(
                f"group {group.name!r}, cell [{c}][{s}]: {int(cell[_SELECT, c, s])} select-only and "
                f"{int(cell[_COMM, c, s])} comm-only layers: the MindFormers lists cannot express both in one "
                "cell (layers counted in select_recompute and select_comm_recompute read back as 'both')"
            )
        layers = cell.sum(axis=0)
        out[group.name] = {
            "offset": _rows(layers - group.count // nvs),
            "recompute": _rows(cell[_FULL]),
            "select_recompute": _rows(cell[_SELECT] + cell[_BOTH] + cell[_FULL]),
            "select_comm_recompute": _rows(cell[_COMM] + cell[_BOTH] + cell[_FULL]),
        }
    return out


# ------------------------------------------------------------------------------- decode
def decode_cell(layers: int, full: int, select: int, comm: int) -> tuple[int, int, int, int, int]:
    """Layers per mode of one cell, in :data:`~sapptk.profile.MODES` order, from its four values."""
    both = max(0, min(select - full, comm - full))
    sel = max(0, select - full - both)
    com = max(0, comm - full - both)
    return (layers - full - both - sel - com, sel, com, both, full)


def _index(key: str, c: int, s: int, flat: bool) -> str:
    return f"{key}[{s}]" if flat else f"{key}[{c}][{s}]"


def _grid_of(
    value: Any, key: str, label: str, v: int, p: int, where: _Where, limit: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """One list as ``(ints (v, p), all_layers (v, p) bool, flat)``; ``all_layers`` marks ``true`` entries.

    Every integer is checked against ``limit`` (the layers of the stack) before it enters an
    int64 array, so no value can wrap around."""
    is_offset = key == "offset"

    def bounded(x: Any, cell_label: str) -> int:
        number = int(x)
        if abs(number) > limit:
            span = f"between -{limit} and {limit}" if is_offset else f"from 0 to {limit}"
            where.fail(f"{cell_label} = {number}: expected {'an offset' if is_offset else 'a layer count'} {span} "
                       f"(the stack has {limit} layers)")
        return number

    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    ints = np.zeros((v, p), dtype=np.int64)
    every = np.zeros((v, p), dtype=bool)
    if is_offset:
        expected = f"an integer, {v} rows (chunks) of {p} integers (stages)" + (
            f", or a flat list of {p} integers" if v == 1 else ""
        )
    else:
        expected = f"true, false, or {v} rows (chunks) of {p} layer counts (stages)" + (
            f", or a flat list of {p} layer counts" if v == 1 else ""
        )
    if value is None:
        return ints, every, v == 1
    if isinstance(value, bool):
        if is_offset:
            where.fail(f"{label} = {value!r}: expected {expected}")
        every[:] = value
        return ints, every, v == 1
    if _is_int(value):
        if not is_offset:
            where.fail(f"{label} = {value!r}: expected {expected}")
        ints[:] = bounded(value, label)
        return ints, every, v == 1
    if isinstance(value, Mapping) or (
        isinstance(value, Sequence) and not isinstance(value, str) and any(isinstance(x, str) for x in value)
    ):
        if not is_offset:
            where.fail(
                f"{label} = {show(value)}: operator-name patterns are not supported (the profile measured one "
                f"operator set per mode): expected {expected}"
            )
        where.fail(f"{label} = {show(value)}: expected {expected}")
    if isinstance(value, str) or not isinstance(value, Sequence):
        where.fail(f"{label} = {show(value)}: expected {expected}")

    def scalar(x: Any) -> bool:  # a number (a non-integer one is refused per cell below)
        return isinstance(x, numbers.Number)

    flat = len(value) > 0 and all(scalar(x) for x in value) and not (v > 1 and len(value) == v)
    rows: list[Any]
    if flat:
        if v != 1:
            where.fail(
                f"{label} is a flat list of {len(value)} values: expected {v} rows (one per chunk) of {p} "
                f"values (a flat list is accepted only when chunks = 1)"
            )
        rows = [value]
    else:
        rows = list(value)
        if len(rows) != v:
            where.fail(
                f"{label} has {len(rows)} rows: expected {v} (one per chunk), each of {p} values (one per stage)"
            )
    for c, row in enumerate(rows):
        if isinstance(row, bool) and not is_offset:
            every[c, :] = row
            continue
        if isinstance(row, str) or not isinstance(row, Sequence):
            where.fail(f"{label}[{c}] = {show(row)}: expected a list of {p} values (one per stage)")
        if len(row) != p:
            row_label = label if flat else f"{label}[{c}]"
            where.fail(f"{row_label} has {len(row)} entries: expected {p} (one per stage)")
        for s, x in enumerate(row):
            cell_label = _index(label, c, s, flat)
            if isinstance(x, bool):
                if is_offset:
                    where.fail(f"{cell_label} = {x!r}: expected an integer")
                every[c, s] = x
            elif _is_int(x):
                ints[c, s] = bounded(x, cell_label)
            else:
                kind = "an integer" if is_offset else "a layer count, true or false"
                where.fail(f"{cell_label} = {show(x)}: expected {kind}")
    return ints, every, flat


def _cell_values(
    config: Mapping[str, Any], labels: Mapping[str, str], total: int, v: int, p: int, where: _Where
) -> tuple[np.ndarray, np.ndarray]:
    """Layers per cell (v, p) and per-cell mode counts (modes, v, p) of a stack of ``total`` layers."""
    base = total // (v * p)
    offset, _, oflat = _grid_of(config.get("offset"), "offset", labels["offset"], v, p, where, total)
    layers = base + offset
    if (layers < 0).any():
        c, s = (int(x) for x in np.argwhere(layers < 0)[0])
        where.fail(
            f"{_index(labels['offset'], c, s, oflat)} = {int(offset[c, s])}: cell [{c}][{s}] would hold "
            f"{int(layers[c, s])} layers ({base} + {int(offset[c, s])}): expected an offset >= -{base}"
        )
    if int(layers.sum()) != total:
        rem = total % (v * p)
        where.fail(
            f"{labels['offset']} sums to {int(offset.sum())}, so the cells hold {int(layers.sum())} layers: "
            f"expected the offsets to sum to {total} mod ({p}·{v}) = {rem}, so that they hold the {total} layers "
            f"({base} per cell + offset)"
        )
    values = {}
    for key in RECOMPUTE_KEYS:
        ints, every, flat = _grid_of(config.get(key), key, labels[key], v, p, where, total)
        if (ints < 0).any():
            c, s = (int(x) for x in np.argwhere(ints < 0)[0])
            where.fail(f"{_index(labels[key], c, s, flat)} = {int(ints[c, s])}: expected a layer count >= 0")
        too_many = ~every & (ints > layers)
        if too_many.any():
            c, s = (int(x) for x in np.argwhere(too_many)[0])
            where.fail(
                f"{_index(labels[key], c, s, flat)} = {int(ints[c, s])}: expected at most {int(layers[c, s])}, "
                f"the layers in cell [{c}][{s}] ({base} + offset {int(offset[c, s])})"
            )
        values[key] = np.where(every, layers, ints)
    modes = np.zeros((len(MODES), v, p), dtype=np.int64)
    for c in range(v):
        for s in range(p):
            modes[:, c, s] = decode_cell(
                int(layers[c, s]),
                int(values["recompute"][c, s]),
                int(values["select_recompute"][c, s]),
                int(values["select_comm_recompute"][c, s]),
            )
    return layers, modes


_MODE_REASON = {
    "none": "layers without recompute (the rest of the cell)",
    "select": "select-only layers (select_recompute above recompute and select_comm_recompute)",
    "comm": "comm-only layers (select_comm_recompute above recompute and select_recompute)",
    "both": "layers with select and comm (counted in both select_recompute and select_comm_recompute)",
    "full": "layers with full recompute (recompute)",
}


def _check_modes(group: LayerGroup, cells: np.ndarray, where: _Where) -> None:
    """Every mode a cell uses must be one the profile offers for the group; cells is (modes, v, p)."""
    for r, mode in enumerate(MODES):
        if mode in group.modes or not cells[r].any():
            continue
        c, s = (int(x) for x in np.argwhere(cells[r] > 0)[0])
        where.fail(
            f"cell [{c}][{s}] has {int(cells[r, c, s])} {_MODE_REASON[mode]}, but the profile's group "
            f"{group.name!r} has no {mode!r} mode: expected only its modes {', '.join(group.modes)}"
        )


def _stack_to_groups(body: Sequence[LayerGroup], modes: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """MindFormers' whole-stack meaning: in each cell, layers in model order take full, both,
    select-only, comm-only, none in turn; groups follow in model order over the virtual stages."""
    nvs = grid.size
    counts = np.zeros((len(body), len(MODES), nvs), dtype=np.int64)
    bounds = np.cumsum([0] + [g.count for g in body])
    order = (_FULL, _BOTH, _SELECT, _COMM, _NONE)
    position = 0  # global index of the next layer, in model order
    cells = sorted((int(grid[c, s]), c, s) for c in range(grid.shape[0]) for s in range(grid.shape[1]))
    for vs, c, s in cells:
        for r in order:
            n = int(modes[r, c, s])
            while n:
                g = int(np.searchsorted(bounds, position, side="right") - 1)
                take = min(n, int(bounds[g + 1]) - position)
                counts[g, r, vs] += take
                position += take
                n -= take
    return counts


def decode(
    profile: Profile,
    program: Program,
    config: Any,
    *,
    file: str | None = None,
    name: str | None = None,
) -> np.ndarray:
    """One config (any accepted spelling) as a counts array (groups, modes, virtual stages).

    Shape, layer totals and modes are checked here; contiguity of several groups is left to
    :func:`sapptk.costs.check_counts`.
    """
    where = _Where(file, name)
    body = tuple(profile.body)
    grid = cell_grid(program)
    v, p = grid.shape
    nvs = grid.size
    per_group, labels, stacked = _per_group(profile, program, config, where)
    counts = np.zeros((len(body), len(MODES), nvs), dtype=np.int64)
    if stacked is not None:
        total = sum(g.count for g in body)
        _, modes = _cell_values(stacked, labels, total, v, p, where)
        counts = _stack_to_groups(body, modes, grid)
        for g, group in enumerate(body):
            _check_modes(group, counts[g][:, grid], where)
        return counts
    for g, group in enumerate(body):
        gwhere = _Where(file, name, group.name if len(body) > 1 else None)
        _, modes = _cell_values(per_group.get(group.name) or {}, labels, group.count, v, p, gwhere)
        _check_modes(group, modes, gwhere)
        counts[g][:, grid] = modes
    return counts


def _check_keys(data: Mapping[str, Any], where: _Where, what: str) -> None:
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        where.fail(f"unknown key {show(unknown[0])} in {what}: expected {', '.join(KEYS)}")


def _per_group(
    profile: Profile, program: Program, config: Any, where: _Where
) -> tuple[dict[str, Mapping[str, Any]], dict[str, str], Mapping[str, Any] | None]:
    """Normalise a config: ``(per-group lists, key labels for messages, whole-stack lists or None)``."""
    body = tuple(profile.body)
    names = [g.name for g in body]
    labels = {k: k for k in KEYS}
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        where.fail(f"config = {show(config)}: expected a mapping with keys {', '.join(KEYS)}")
    if _is_training(config):
        lists = _from_training(profile, program, config, where)
        labels = {"offset": "model.model_config.offset", **{k: f"recompute_config.{k}" for k in RECOMPUTE_KEYS}}
        if len(body) == 1:
            return {names[0]: lists}, labels, None
        return {}, labels, lists
    if not config or any(k in KEYS for k in config):
        _check_keys(config, where, "the config")
        if len(body) == 1:
            return {names[0]: config}, labels, None
        return {}, labels, config
    unknown = [k for k in config if k not in names]
    if unknown:
        where.fail(
            f"unknown key {show(unknown[0])}: expected {', '.join(KEYS)}"
            + (f", or body group names ({', '.join(names)}) mapping to those keys" if names else "")
        )
    out: dict[str, Mapping[str, Any]] = {}
    for gname, lists in config.items():
        gwhere = _Where(where.file, where.config, gname)
        if lists is None:
            lists = {}
        if not isinstance(lists, Mapping):
            gwhere.fail(f"{show(lists)}: expected a mapping with keys {', '.join(KEYS)}")
        _check_keys(lists, gwhere, f"group {gname!r}")
        out[gname] = lists
    return out, labels, None


def _is_training(config: Mapping[str, Any]) -> bool:
    if "recompute_config" in config:
        return True
    model = config.get("model")
    return isinstance(model, Mapping) and "model_config" in model


def _from_training(profile: Profile, program: Program, data: Mapping[str, Any], where: _Where) -> dict[str, Any]:
    """The four lists out of a MindFormers training YAML, after checking its shape keys."""
    model = data.get("model") or {}
    model_config = model.get("model_config") if isinstance(model, Mapping) else None
    model_config = model_config if isinstance(model_config, Mapping) else {}
    parallel = data.get("parallel_config")
    parallel = parallel if isinstance(parallel, Mapping) else {}
    checks = (
        ("model.model_config.num_layers", model_config.get("num_layers"), profile.num_body_layers,
         f"the profile's {profile.num_body_layers} body layers"),
        ("model.model_config.pp_interleave_num", model_config.get("pp_interleave_num"), program.chunks,
         f"chunks = {program.chunks}"),
        ("parallel_config.pipeline_stage", parallel.get("pipeline_stage"), program.stages,
         f"stages = {program.stages}"),
    )
    for label, value, want, text in checks:
        if value is not None and value != want:
            where.fail(f"{label} = {show(value)}: expected {want} ({text})")
    rc = data.get("recompute_config")
    if rc is None:
        rc = {}
    if isinstance(rc, bool):
        rc = {"recompute": rc}
    if not isinstance(rc, Mapping):
        where.fail(f"recompute_config = {show(rc)}: expected a mapping")
    lists: dict[str, Any] = {"offset": model_config.get("offset")}
    for key in RECOMPUTE_KEYS:
        lists[key] = rc.get(key)
    return lists


# --------------------------------------------------------------------------- files, names
def load(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML (or ``.json``) file with the guards of :mod:`sapptk.files` (size,
    encoding, nesting depth, aliases, no tags); a :class:`ConfigError` naming the file if
    that fails."""
    return load_document(path, what="file", error=ConfigError, suffixes=(".json",), default="yaml")


def split_configs(profile: Profile, data: Any, file: str | None = None) -> tuple[bool, dict[str | None, Any]]:
    """``(named, {name: config})``: one config (``named`` False, name ``None``) or named configs."""
    where = _Where(file)
    if data is None:
        where.fail("the file is empty: expected a config (offset, recompute, ...) or a mapping of named configs")
    if not isinstance(data, Mapping):
        where.fail(f"top level = {show(data)}: expected a config (a mapping with keys {', '.join(KEYS)}) "
                   "or a mapping of named configs")
    names = {g.name for g in profile.body}
    if not data or _is_training(data) or any(k in KEYS for k in data) or all(k in names for k in data):
        return False, {None: data}
    for key, value in data.items():
        if value is not None and not isinstance(value, Mapping):
            where.fail(
                f"key {show(key)} = {show(value)}: expected one of {', '.join(KEYS)}, or a named config "
                f"(a mapping with those keys)"
            )
    return True, dict(data)


# --------------------------------------------------------------------- plan level
def plan_export(plan: Plan, path: str | os.PathLike[str] | None = None) -> Export:
    """The plan's MindFormers lists as YAML (``texts["yaml"]``; ``data`` is :func:`encode`'s
    ``{group: {offset, recompute, select_recompute, select_comm_recompute}}``, always keyed by
    group), written to ``path`` when given.

    One body group: the four keys at the top level, ready to paste into MindFormers. Several:
    one mapping per group. A comment header records the setup and status; ``load_plan(...,
    format="mindformers")`` reads the text back to the same counts. Refused (ConfigError, saying
    why): no assignment, activation offload, recompute per micro-batch, unequal slice lengths.
    """
    out = check_path(path, "export('mindformers')")
    need_solution(plan, "a MindFormers config")
    refuse_levers(plan, "mindformers")  # offload, recompute per micro-batch (sapptk.levers)
    c = plan.config
    lengths = c.slice_lengths
    if lengths is not None and len(set(lengths)) > 1:
        raise ConfigError(
            f"a MindFormers config cannot express unequal slice lengths {list(lengths)}: MindFormers cuts the "
            f"sequence into parallel_config.seq_split_num = {c.splits} equal slices (seq_length // "
            "seq_split_num); export the plan with equal slices (plan.config.replace(splits=k)) or keep it as a "
            "sapptk plan (plan.export('sapptk'))"
        )
    data = encode(plan.profile, c.program(), plan.counts)
    body = plan.profile.body
    step = "n/a" if plan.step_time is None else f"{plan.step_time:.1f} ms"
    header = [
        f"# sapptk plan for MindFormers: profile '{one_line(plan.profile.name)}', schedule {c.schedule!r}",
        f"# pipeline_stage (p) = {c.stages}, pp_interleave_num (v) = {c.chunks}, micro_batch_num = "
        f"{c.micro_batches}",
        f"# status {plan.status}, step time {step}, source {one_line(plan.source)}",
        "# lists are [chunk][stage]; offset = layers in the cell - floor(N / (p*v));",
        "# select_recompute / select_comm_recompute count layers with select / comm, both or full",
    ]
    if c.splits > 1:
        header.insert(2, f"# sequence pipeline: parallel_config: {{seq_split_num: {c.splits}}} ({c.splits} equal "
                         "slices per micro-batch)")
    if len(body) == 1:
        payload: dict[str, Any] = data[body[0].name]
        header.append(f"# body group '{one_line(body[0].name)}': N = {body[0].count}")
    else:
        payload = data
        header.append("# one mapping per body group, offsets relative to floor(N_g / (p*v)): "
                      + ", ".join(f"{one_line(g.name)} N = {g.count}" for g in body))
    text = "\n".join(header) + "\n" + yaml.safe_dump(payload, sort_keys=False, default_flow_style=None, width=1000)
    written = {} if out is None else write_files("mindformers", {"yaml": (out, text)})
    step_ms = plan.simulation.step_time
    return make_export("mindformers", text, {"yaml": text}, written, step_time_ms=step_ms,
                       expressed_step_time_ms=step_ms, data=data)


def _configs(source: Any, profile: Profile) -> tuple[str | None, bool, dict[Any, Any]]:
    file: str | None = None
    data = source
    if isinstance(source, (str, os.PathLike)):
        file = os.fspath(source)
        data = load(file)
    named, configs = split_configs(profile, data, file)
    return file, named, configs


def _one(profile: Profile, config: PipelineConfig, key: Any, cfg: Any, file: str | None) -> dict[str, Any]:
    from pathlib import Path

    from sapptk.costs import check_counts

    label = str(key) if key is not None else (Path(file).stem if file else "config")
    counts = decode(profile, config.program(), cfg, file=file, name=None if key is None else str(key))
    where = (file or "<data>") + (f", config {str(key)!r}" if key is not None else "")
    try:
        check_counts(profile, config, counts)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return {"where": where, "profile": profile, "config": config, "counts": counts, "status": "given",
            "source": f"mindformers:{label}"}


def read_plan(source: Any, profile: Profile, config: PipelineConfig, *, name: str | None = None) -> dict[str, Any]:
    """One plan's :func:`sapptk.plan.make_plan` arguments (plus ``where``) from a MindFormers config.

    ``source`` is a path to a YAML/JSON file or a parsed mapping (never modified). A file
    holding one config gives its plan; a file of named configs needs ``name`` to pick one (a
    ConfigError lists the names otherwise; :func:`read_plans` reads them all). Source
    ``"mindformers:<name>"``, the file's stem for an unnamed config, ``config`` for parsed data.
    """
    check_inputs(profile, config, "load_plan(format='mindformers')")
    file, named, configs = _configs(source, profile)
    where = file or "<data>"
    if name is not None:
        if not named:
            raise ConfigError(f"{where}: holds one unnamed config, not named configs: cannot select {name!r}")
        if name not in configs:
            raise ConfigError(f"{where}: no config named {name!r}: expected one of {', '.join(map(str, configs))}")
        return _one(profile, config, name, configs[name], file)
    if named:
        raise ConfigError(
            f"{where}: holds {len(configs)} named configs ({', '.join(map(str, configs))}): pass name= to pick "
            "one, or read them all with sapptk.load_plans"
        )
    return _one(profile, config, None, configs[None], file)


def read_plans(source: Any, profile: Profile, config: PipelineConfig) -> list[dict[str, Any]]:
    """Every config of a MindFormers file or mapping, in file order, as :func:`read_plan` gives one."""
    check_inputs(profile, config, "load_plans(format='mindformers')")
    file, _, configs = _configs(source, profile)
    return [_one(profile, config, key, cfg, file) for key, cfg in configs.items()]

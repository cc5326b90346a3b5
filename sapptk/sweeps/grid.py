"""Grids and keys: a grid expands into points (every :class:`PipelineConfig` field of one
setup, and the solver's levers: :data:`LEVER_FIELDS`), and each point of a profile has a
cache key.

Levers are the fields of :mod:`sapptk.levers`: those living in the config (offload: ``"offload"``
in a ``recompute`` set, with a ``host_bandwidth``; sequence slices: ``splits``) are config
fields here; those of the request that the registry marks swept (:data:`sapptk.levers.SWEPT`:
``per_micro_batch``, ``memory_margin``, ``oom_risk`` with ``memory_error``, keywords of
:class:`~sapptk.request.SolveRequest`) are :data:`LEVER_FIELDS`, each a frame column.

A key is a hash of the profile's name and content, the config fields in a canonical form
(``40000 == 40000.0``, recompute modes as one ordered set), the levers that are on, and the
solver options that change the answer (time limit, seed, determinism), so equal points share
a key and a cached row is reused only for the same question (a point with every lever off
keeps the key it had before levers could be swept).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from itertools import product
from typing import Any

import numpy as np
import pandas as pd

from sapptk.checks import MAX_POINTS, show
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.levers import SWEPT
from sapptk.profile import Profile, mode_set, resolve_profile

__all__ = [
    "CONFIG_FIELDS",
    "GRID_FIELDS",
    "LEVER_FIELDS",
    "expand_grid",
    "point_key",
    "profile_digest",
    "profiles_of",
    "recompute_label",
]

CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PipelineConfig) if f.name != "custom_program")
"""The :class:`PipelineConfig` fields a grid may sweep (a carried program is not one)."""

DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(PipelineConfig)
    if f.default is not dataclasses.MISSING and f.name in CONFIG_FIELDS
}
LEVERS: dict[str, Any] = {f.name: f.default for f in SWEPT}
LEVER_FIELDS: tuple[str, ...] = tuple(LEVERS)
"""The solver's levers a grid may sweep besides the config fields (off by default): the swept
request fields of :mod:`sapptk.levers`. A number field (``memory_error`` too) takes numbers only."""
GRID_FIELDS: tuple[str, ...] = (*CONFIG_FIELDS, *LEVER_FIELDS)
"""Every name a grid may use."""
DEFAULTS.update(LEVERS)
_REQUIRED: tuple[str, ...] = tuple(f for f in CONFIG_FIELDS if f not in DEFAULTS)
FLOAT_FIELDS: tuple[str, ...] = ("memory_budget", "constant_memory", "comm",
                                 *(f.name for f in SWEPT if f.kind == "number"))


def _axis(name: str, value: Any) -> list[Any]:
    """The values of one grid axis: a list (range, array, ...) is swept, anything else is one value.

    For ``recompute`` only a *list* is an axis (its items are mode sets, a single name meaning
    a one-mode set); a tuple or set such as :data:`~sapptk.profile.MODES` is one set of modes.
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
        return {**{f: getattr(item, f) for f in CONFIG_FIELDS}, **LEVERS}
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected a PipelineConfig or a mapping of its fields, got {show(item)}")
    unknown = [k for k in item if k not in GRID_FIELDS]
    if unknown:
        raise ConfigError(f"{where}: unknown field {show(unknown[0])}; fields are {', '.join(GRID_FIELDS)}")
    missing = [k for k in _REQUIRED if k not in item]
    if missing:
        raise ConfigError(f"{where}: field {missing[0]!r} is required")
    return {**DEFAULTS, **item}


def expand_grid(grid: Mapping[str, Any] | Iterable[PipelineConfig | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The points of a grid, each a dict of every :class:`PipelineConfig` field and every lever
    (:data:`GRID_FIELDS`).

    ``grid`` is either a mapping of field → values, whose product is swept (the last field
    varies fastest; a non-list value is fixed), or an iterable of explicit points
    (:class:`PipelineConfig` objects or dicts of fields). Fields left out take the
    :class:`PipelineConfig` defaults, levers left out are off. Values are not validated here: a bad combination
    becomes an ``invalid`` row when swept. Unknown or missing field names, and grids of more
    than :data:`MAX_POINTS` points, raise :class:`~sapptk.errors.ConfigError`.
    """
    if isinstance(grid, Mapping):
        fixed = _fields_of(grid, "grid")  # checks the names, fills the defaults
        names = list(grid)
        axes = [_axis(name, grid[name]) for name in names]
        size = 1
        for axis in axes:
            size *= len(axis)
        if size > MAX_POINTS:
            shape = " × ".join(f"{len(a)} {n}" for n, a in zip(names, axes, strict=True) if len(a) > 1)
            raise ConfigError(f"grid: {shape} = {size:,} points: expected at most {MAX_POINTS:,} "
                              "(sapptk.checks.MAX_POINTS); split the sweep")
        return [{**fixed, **dict(zip(names, combo, strict=True))} for combo in product(*axes)]
    if isinstance(grid, str | bytes) or not isinstance(grid, Iterable):
        raise ConfigError(f"grid: expected a mapping of field -> values or a list of configs, got {show(grid)}")
    points = []
    for i, item in enumerate(grid):
        if i >= MAX_POINTS:
            raise ConfigError(f"grid: more than {MAX_POINTS:,} points (sapptk.checks.MAX_POINTS); split the sweep")
        points.append(_fields_of(item, f"grid[{i}]"))
    return points


def profiles_of(profile: Profile | str | os.PathLike[str] | Mapping[str, Profile]) -> dict[str, Profile]:
    """Name → Profile from one profile (anything :func:`~sapptk.profile.resolve_profile` takes) or a mapping."""
    if isinstance(profile, Mapping):
        return {str(name): resolve_profile(p) for name, p in profile.items()}
    loaded = resolve_profile(profile)
    return {loaded.name: loaded}


def recompute_label(value: Any) -> str:
    """The ``recompute`` column's label of a mode set, e.g. ``"none,full"``."""
    modes = mode_set(value)
    return ",".join(modes) if isinstance(modes, tuple) else str(modes)


def _canonical(fields: Mapping[str, Any], names: tuple[str, ...] = CONFIG_FIELDS) -> dict[str, Any]:
    """Fields in a form whose JSON is the same for equal configs (40000 == 40000.0)."""
    out: dict[str, Any] = {}
    for name in names:
        value = fields[name]
        if name == "recompute":
            value = mode_set(value)
            value = list(value) if isinstance(value, tuple) else value
        elif name in FLOAT_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an integer too large for a float: the point is invalid anyway
                value = repr(value)
        out[name] = value
    return out


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def profile_digest(profile: Profile) -> str:
    """A content hash of a profile (its :meth:`Profile.to_dict`), 16 hex digits."""
    return _digest(profile.to_dict())[:16]


def point_key(name: str, digest: str, fields: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The cache key of a point: profile name and content hash, config fields, the levers that
    are on (``fields`` may leave the levers out: they are off), solver options."""
    data = {"profile": [name, digest], "config": _canonical(fields), "options": dict(options)}
    on = [f.name for f in SWEPT if f.name in fields and not f.is_off(fields[f.name])]
    if on:
        data["levers"] = _canonical(fields, tuple(on))
    return _digest(data)[:32]


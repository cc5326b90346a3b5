"""Checks of user values, with messages that name the file, the field and what was expected."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sapptk import checks
from sapptk.checks import show
from sapptk.config import MAX_BUDGET_MB
from sapptk.errors import CalibrationError
from sapptk.files import load_document

__all__ = ["fail", "integer", "is_int", "load_yaml", "mapping", "peak_mb", "show"]

_MAX_FILE_BYTES = checks.MAX_CALIBRATION_BYTES


def fail(source: str, field_name: str, value: Any, expected: str) -> NoReturn:
    raise CalibrationError(f"{source}: {field_name} = {show(value)}: expected {expected}")


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(value: Any, source: str, field_name: str, *, minimum: int, maximum: int = checks.MAX_INDEX) -> int:
    """An integer (integral floats such as ``4.0`` accepted) from ``minimum`` to ``maximum``
    (:mod:`sapptk.checks`: sized before anything is allocated for it)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= checks.MAX_UNITS:
        value = int(value)
    return checks.integer(value, f"{source}: {field_name}", error=CalibrationError, low=minimum, high=maximum)


def peak_mb(value: Any, source: str, field_name: str) -> float:
    return checks.number(value, f"{source}: {field_name}", error=CalibrationError, low=-MAX_BUDGET_MB,
                         high=MAX_BUDGET_MB)


def load_yaml(path: Path, source: str) -> Any:
    """A user's YAML file through :mod:`sapptk.files` (regular files only, size, encoding, nesting,
    alias bombs, no tags), every problem a :class:`CalibrationError` naming the file."""
    return load_document(path, what="file", error=CalibrationError, suffixes=(), default="yaml",
                         max_bytes=_MAX_FILE_BYTES)


def mapping(data: Any, source: str, field_name: str, keys: Sequence[str], required: Sequence[str]) -> Mapping:
    if not isinstance(data, Mapping):
        fail(source, field_name, data, f"a mapping with {', '.join(keys)}")
    for key in data:
        if key not in keys:
            raise CalibrationError(
                f"{source}: {field_name}: unknown field {show(key)}: expected one of {', '.join(keys)}"
            )
    for key in required:
        if key not in data:
            raise CalibrationError(f"{source}: {field_name}.{key} is missing: expected it (see the calibration format)")
    return data

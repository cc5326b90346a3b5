"""Limits and bad-value messages, written once.

Every reader and entry point checks a user's value through these helpers, so a value is
judged the same way everywhere (type, sign, magnitude *before* any conversion, so a
400-digit integer is refused instead of overflowing) and every message has one shape:
``<where> = <value>: expected <what>``. The limits here are the ones of ``docs/limits.md``
that several readers share; a reader's own limits stay next to it and are listed there too.

The error type is the caller's (``TraceError`` for a trace, ``ConfigError`` for a plan,
...): each helper takes it as ``error``.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import stat
from pathlib import Path
from typing import Any, NoReturn

from sapptk.errors import SapptkError

__all__ = [
    "MAX_DESIGN_ROUNDS",
    "MAX_INDEX",
    "MAX_PROGRAM_OPS",
    "MAX_REGEX_CHARS",
    "MAX_STAGES",
    "MAX_TRACE_US",
    "fail",
    "integer",
    "number",
    "output_file",
    "regex",
    "show",
    "size",
]

MAX_STAGES = 10_000
"""Pipeline stages of a dry run, a calibration file or a ``design``: far beyond any real
pipeline; keeps their tables (stages × rounds × modes) small."""

MAX_DESIGN_ROUNDS = 1_000
"""Dry runs one ``design`` may ask for, and one calibration may hold."""

MAX_PROGRAM_OPS = 1_000_000
"""Most ops a schedule's program may have, built or read (``sapptk.config.MAX_PROGRAM_OPS``,
the schedule CSV reader)."""

MAX_INDEX = MAX_PROGRAM_OPS
"""A stage, rank or micro-batch index read from a file (schedule CSV, torchtitan, Megatron):
a program has at most ``sapptk.config.MAX_PROGRAM_OPS`` ops, so no valid index is larger."""

MAX_TRACE_US = 1e15
"""A time stamp or duration in a profiler trace, in µs (about 31 years)."""

MAX_REGEX_CHARS = 10_000
"""Characters of a regular expression a user gives (layer names, phases, steps)."""


def show(value: Any, width: int = 60) -> str:
    """A short, unambiguous rendering of a user value for messages (``repr``, cut to ``width``)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object whose repr fails is still named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def fail(error: type[SapptkError], where: str, value: Any, expected: str) -> NoReturn:
    """Raise the one message shape: ``<where> = <value>: expected <expected>``."""
    raise error(f"{where} = {show(value)}: expected {expected}")


def integer(value: Any, where: str, *, error: type[SapptkError], low: int | None = None,
            high: int | None = None, text: bool = False) -> int:
    """``value`` as an ``int`` within [low, high]. Bools and floats are refused; text too, unless
    ``text`` (then decimal digits, their count bounded before conversion, as command lines give them)."""
    if text and isinstance(value, str):
        digits = value.strip()
        bare = digits[1:] if digits[:1] in "+-" else digits
        if bare.isascii() and bare.isdigit() and len(bare) <= 30:
            value = int(digits)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(error, where, value, _range("an integer", low, high))
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        fail(error, where, value, _range("an integer", low, high))
    return number


def number(value: Any, where: str, *, error: type[SapptkError], low: float | None = None,
           high: float | None = None, above: float | None = None) -> float:
    """``value`` as a finite ``float`` within [low, high] (or > ``above``). Bools and text are
    refused; an integer's magnitude is checked before it is converted."""
    lower = f" > {above:g}" if above is not None else ""
    expected = _range("a finite number" + lower, low, high)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(error, where, value, expected)
    if isinstance(value, numbers.Integral) and high is not None and abs(int(value)) > max(abs(high), abs(low or 0)):
        fail(error, where, value, expected)
    result = float(value)
    if (not math.isfinite(result) or (low is not None and result < low) or (high is not None and result > high)
            or (above is not None and result <= above)):
        fail(error, where, value, expected)
    return result


def size(count: int, where: str, *, error: type[SapptkError], limit: int, what: str, constant: str) -> int:
    """Refuse ``count`` items above ``limit`` before anything is allocated for them."""
    if count > limit:
        raise error(f"{where}: {count:,} {what}: expected at most {limit:,} ({constant})")
    return count


def regex(text: Any, where: str, *, error: type[SapptkError]) -> re.Pattern[str]:
    """``text`` compiled as a Python regular expression, or ``error`` naming it."""
    if not isinstance(text, str):
        fail(error, where, text, "a regular expression (text)")
    if len(text) > MAX_REGEX_CHARS:
        fail(error, where, text, f"a regular expression of at most {MAX_REGEX_CHARS:,} characters")
    nested = _NESTED_REPEAT.search(text)
    if nested:
        raise error(f"{where} = {show(text)}: the repeated group {nested.group(0)!r} repeats inside: Python's regex "
                    "engine can take exponential time on it (a trace would appear to hang): expected a pattern "
                    "without a repeated group whose content ends in + or * (e.g. 'a+' instead of '(a+)+')")
    try:
        return re.compile(text)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise error(f"{where} = {show(text)}: not a valid regex ({exc})") from None


_NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[+*]\)[+*{]")
"""A group ending in ``+`` or ``*`` that is itself repeated (``(a+)+``, ``(x*)*``): catastrophic backtracking."""


def output_file(path: Any, where: str, *, error: type[SapptkError]) -> Path:
    """A path a file may be written to: not a folder, a FIFO or a device, in a folder that
    exists. Checked before anything is computed or opened (a FIFO would block forever)."""
    if not isinstance(path, (str, os.PathLike)):
        fail(error, where, path, "a file path")
    out = Path(path)
    try:
        mode = out.stat().st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as exc:
        raise error(f"{where} = {show(os.fspath(out))}: cannot write there ({exc})") from None
    if mode is not None and stat.S_ISDIR(mode):
        fail(error, where, os.fspath(out), "a file name, not a folder")
    if mode is not None and not stat.S_ISREG(mode):
        fail(error, where, os.fspath(out), "a regular file (not a FIFO, a device or a socket)")
    if not out.parent.is_dir():
        fail(error, where, os.fspath(out), f"a file in an existing folder (no folder {os.fspath(out.parent)!r})")
    return out


def _range(kind: str, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{kind} from {low:,} to {high:,}" if isinstance(low, int) else f"{kind} from {low:g} to {high:g}"
    if low is not None:
        return f"{kind} >= {low:g}"
    if high is not None:
        return f"{kind} <= {high:g}"
    return kind

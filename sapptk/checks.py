"""Limits and bad-value messages, written once.

Every reader and entry point checks a user's value through these helpers, so a value is
judged the same way everywhere (type, sign, magnitude *before* any conversion, so a
400-digit integer is refused instead of overflowing) and every message has one shape:
``<where> = <value>: expected <what>``, the value rendered by :func:`show` (the one way to
show a bad value). Every limit of the package is defined here, once (``docs/limits.md``
lists them); a module that names a limit of its own (``sapptk.profile.MAX_LAYERS``) binds
it to the constant here, and ``tests/test_limits.py`` refuses a limit literal elsewhere.
The solver's arguments (``workers``, ``seed``, ``time_limit``, flags) are checked by
:func:`solver_arguments`, the one check behind ``balance``, ``SolveRequest``, ``sweep``,
``choose`` and the command line.

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

from sapptk.errors import ConfigError, SapptkError

__all__ = [
    "MAX_INT64",
    "MAX_LAYOUT_CHARS",
    "MAX_NUMPY_SEED",
    "MAX_FIT_ROUNDS",
    "MAX_SOLVER_INTEGER",
    "MAX_ATTEMPTS",
    "MAX_BANDWIDTH",
    "MAX_CHOOSE_BATCH",
    "MAX_CHOOSE_CHUNKS",
    "MAX_DEVICES",
    "MAX_GLOBAL_BATCH",
    "MAX_GRADIENT_SHARE",
    "MAX_RETRY",
    "MAX_SECONDS",
    "MAX_SETUPS",
    "MAX_BUDGET_MB",
    "MAX_CALIBRATION_BYTES",
    "MAX_COEF",
    "MAX_COMM_MS",
    "MAX_DESIGN_PEAKS",
    "MAX_DESIGN_ROUNDS",
    "MAX_DIMENSION",
    "MAX_EXPLORER_CHUNKS",
    "MAX_EXPLORER_MICRO_BATCHES",
    "MAX_EXPLORER_SPLITS",
    "MAX_EXPLORER_STAGES",
    "MAX_FILE_BYTES",
    "MAX_LABELS",
    "MAX_LAYERS",
    "MAX_MB",
    "MAX_MS",
    "MAX_PARALLEL",
    "MAX_POINTS",
    "MAX_SCHEDULE_CSV_BYTES",
    "MAX_SEED",
    "MAX_SEQ_LENGTH",
    "MAX_SOLVER_WORKERS",
    "MAX_TRACE_BYTES",
    "MAX_UNITS",
    "MAX_WORKERS",
    "MAX_YAML_ALIASES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "MAX_INDEX",
    "MAX_PROGRAM_OPS",
    "MAX_REGEX_CHARS",
    "MAX_STAGES",
    "MAX_TRACE_US",
    "fail",
    "flag",
    "integer",
    "number",
    "output_file",
    "regex",
    "seed",
    "show",
    "size",
    "solver_arguments",
    "time_limit",
    "workers",
]

# ------------------------------------------------------------------ the solver's arguments
MAX_WORKERS = 64
"""Most CP-SAT worker threads one solve may ask for (``balance``, ``sweep``, ``choose``, the
command line): far beyond the cores of any machine this runs on."""

MAX_SEED = 2**31 - 1
"""Largest random seed (CP-SAT's seed is a 32-bit signed integer)."""

MAX_SOLVER_WORKERS = 8
"""Cap on the *default* CP-SAT workers per solve of a sweep (more rarely help models of this
size); a sweep may still ask for up to :data:`MAX_WORKERS`."""

MAX_ATTEMPTS = 3
"""Times a sweep point is run before it is recorded as failed (a worker process that died)."""

MAX_POINTS = 1_000_000
"""Most points one sweep may have (its rows, keys and tasks live in memory)."""

MAX_SECONDS = 1e9
"""Any time limit, seconds (about 31 years): a finite bound checked before conversion, so
``time_limit=10**400`` is a :class:`~sapptk.errors.ConfigError`, not an ``OverflowError``."""

# ------------------------------------------------------------------ choose
MAX_DEVICES = 2**20
"""Devices of one choice (``choose(devices=)``): their divisors are found by factorising."""

MAX_GLOBAL_BATCH = 2**31
"""Samples of one step (``choose(global_batch=)``, and ``micro_batch_size``)."""

MAX_SETUPS = 20_000
"""Setups one choice may range over, estimated before any is enumerated (each is a row, a bound
and perhaps a balance): a larger grid is refused with the estimate, before anything is built."""

MAX_CHOOSE_CHUNKS = 64
"""``choose(max_chunks=)``: chunks per device a choice tries by default (a schedule that takes any
chunk count is tried at 1 … ``max_chunks``)."""

MAX_CHOOSE_BATCH = 1024
"""``choose(batch=)``: setups balanced per round."""

MAX_RETRY = 1000.0
"""``choose(retry=)``: the second balance's time limit as a multiple of the first's."""

MAX_GRADIENT_SHARE = 100.0
"""``choose(gradient_share=)``: gradient MB per parameter MB of a bare profile."""

# ------------------------------------------------------------------ the Explorer's sliders
MAX_EXPLORER_STAGES = 64
"""Largest pipeline stage count on the Explorer's slider."""

MAX_EXPLORER_MICRO_BATCHES = 512
"""Largest micro-batch count on the Explorer's slider."""

MAX_EXPLORER_CHUNKS = 8
"""Largest chunk count on the Explorer's slider."""

MAX_EXPLORER_SPLITS = 8
"""Largest sequence-slice count on the Explorer's slider."""

# ------------------------------------------------------------------ profiles, setups, units
MAX_MS = 1e7
"""A time in a profile, ms."""

MAX_MB = 1e9
"""A memory figure in a profile, MB."""

MAX_COEF = 1e3
"""A backward coefficient in a profile."""

MAX_LAYERS = 1_000_000
"""Layers of one group of a profile."""

MAX_SEQ_LENGTH = 1 << 24
"""A profile's sequence length, tokens."""

MAX_BUDGET_MB = 1e12
"""A memory budget or constant per device, MB."""

MAX_COMM_MS = 1e7
"""A point-to-point latency, ms."""

MAX_BANDWIDTH = 1e9
"""A host link's bandwidth, MB per ms."""

MAX_UNITS = 2**53
"""Largest integer time or memory figure (float64 holds every integer up to it exactly)."""

MAX_DIMENSION = 10**9
"""A model card's single dimension (hidden size, vocabulary, ...)."""

MAX_PARALLEL = 1_000_000
"""A parallel layout's degree (tensor, data, expert, ...)."""

MAX_DESIGN_PEAKS = 100_000
"""Peaks (stages × rounds) one dry-run design may ask for."""

MAX_LABELS = 4000
"""Op labels drawn on a timeline (beyond it they would cover each other)."""

MAX_SOLVER_INTEGER = 2**52
"""Largest integer the solver's models hold (CP-SAT's domains, its step-time variable): every
figure of a plan in integer units stays below it, and float64 holds it exactly."""

MAX_FIT_ROUNDS = 100
"""Rounds of the calibration's fixed-point iteration (it converges in a handful)."""

MAX_INT64 = 2**63 - 1
"""Largest value of an int64 column (a sweep's cached inputs)."""

MAX_NUMPY_SEED = 2**64 - 1
"""Largest seed NumPy's generators take (a dry-run design's random draws)."""

# ------------------------------------------------------------------ files
MAX_FILE_BYTES = 8 * 2**20
"""A profile, plan, calibration or config file read whole (``sapptk.files``)."""

MAX_YAML_DEPTH = 100
"""Nesting of a JSON or YAML document."""

MAX_YAML_NODES = 200_000
"""Nodes of one YAML document."""

MAX_YAML_ALIASES = 100
"""Aliases of one YAML document (a billion-laughs document is refused)."""

MAX_SCHEDULE_CSV_BYTES = 16 * 2**20
"""A schedule CSV file."""

MAX_CALIBRATION_BYTES = 16 * 2**20
"""A dry-run calibration file."""

MAX_TRACE_BYTES = 2 * 2**30
"""A profiler trace (Chrome trace JSON)."""

MAX_LAYOUT_CHARS = 2 * MAX_LAYERS + 1_000
"""A Megatron ``--pipeline-model-parallel-layout`` string (two characters per layer at most,
plus the stage marks)."""

# ------------------------------------------------------------------ dry runs, programs, traces
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
    lower = f" > {above:g}" + (" and" if high is not None and low is None else "") if above is not None else ""
    expected = _range("a finite number" + lower, low, high)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(error, where, value, expected)
    if isinstance(value, numbers.Integral) and (
            int(value).bit_length() > 1000  # float() of it would overflow: refused before conversion
            or (high is not None and abs(int(value)) > max(abs(high), abs(low or 0)))):
        fail(error, where, value, expected)
    result = float(value)
    if (not math.isfinite(result) or (low is not None and result < low) or (high is not None and result > high)
            or (above is not None and result <= above)):
        fail(error, where, value, expected)
    return result


def flag(value: Any, where: str, *, error: type[SapptkError] = ConfigError) -> bool:
    """``value`` as a ``bool``: True or False only (NumPy's booleans too; not 0, 1 or text)."""
    if type(value).__name__ == "bool_" or isinstance(value, bool):
        return bool(value)
    fail(error, where, value, "True or False")


def workers(value: Any, where: str = "workers", *, error: type[SapptkError] = ConfigError,
            text: bool = False) -> int:
    """CP-SAT worker threads: an integer from 1 to :data:`MAX_WORKERS`."""
    return integer(value, where, error=error, low=1, high=MAX_WORKERS, text=text)


def seed(value: Any, where: str = "seed", *, error: type[SapptkError] = ConfigError, text: bool = False) -> int:
    """A random seed: an integer from 0 to :data:`MAX_SEED`."""
    return integer(value, where, error=error, low=0, high=MAX_SEED, text=text)


def time_limit(value: Any, where: str = "time_limit", *, error: type[SapptkError] = ConfigError) -> float:
    """Wall-clock seconds: a finite number > 0, at most :data:`MAX_SECONDS`."""
    return number(value, where, error=error, above=0.0, high=MAX_SECONDS)


def solver_arguments(*, time_limit: Any = 1.0, workers: Any = 1, seed: Any = 0, deterministic: Any = False,
                     error: type[SapptkError] = ConfigError) -> tuple[float, int | None, int, bool]:
    """The solver's arguments checked as every entry point checks them (``workers`` may be None:
    "choose for me", as ``sweep`` and ``choose`` allow); returned converted."""
    limit = _time_limit(time_limit, error=error)
    threads = None if workers is None else _workers(workers, error=error)
    return limit, threads, _seed(seed, error=error), flag(deterministic, "deterministic", error=error)


_time_limit, _workers, _seed = time_limit, workers, seed  # solver_arguments' parameters shadow them


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

"""Chrome trace event files (``chrome://tracing``, Perfetto, ``torch.profiler``, MindSpore): read and write.

Reading: :func:`read_trace` takes a ``.json`` or ``.json.gz`` file holding either a list of
events or an object with ``traceEvents`` (PyTorch's ``export_chrome_trace``, MindSpore's
``trace_view.json``), and returns a :class:`Trace`: the complete events (``ph: "X"``, and
``B``/``E`` pairs joined) as a DataFrame with times in µs as the format has them, plus the
process and thread names from the metadata events. Writing: :func:`write_trace` writes
events (gzipped when the name ends in ``.gz``); :func:`simulation_events` turns the frames of
a :class:`~sapptk.simulation.Simulation` into events: one complete event per op (device =
process, one thread per device) and a memory counter per device.

Bad files raise :class:`~sapptk.errors.TraceError` naming the file, the event (its index in
the list) and what was expected: a time that is not a number within ±``sapptk.checks.MAX_TRACE_US``
µs, a negative duration, an ``E`` with no open ``B`` or ending before it, a ``pid``/``tid``
that is not an integer or a name, ``args`` that are not a mapping. Writing refuses a folder,
a FIFO or a device as the target before anything is written.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sapptk import checks
from sapptk.errors import TraceError

__all__ = ["MAX_TRACE_BYTES", "Trace", "read_trace", "simulation_events", "write_trace"]

MAX_TRACE_BYTES = checks.MAX_TRACE_BYTES
"""Traces of real runs are large; anything above this (uncompressed) is refused."""

_COLUMNS = ("name", "cat", "pid", "tid", "ts", "dur", "args")


@dataclass(frozen=True, eq=False)
class Trace:
    """A Chrome trace: ``events`` (complete events: ``name``, ``cat``, ``pid``, ``tid``, ``ts``
    and ``dur`` in µs, ``args`` dicts; in file order), ``process_names`` and ``thread_names``
    from the metadata events, ``counters`` (``ph: "C"`` events: name, pid, ts, args)."""

    source: str
    events: pd.DataFrame
    process_names: Mapping[Any, str] = field(default_factory=dict)
    thread_names: Mapping[tuple[Any, Any], str] = field(default_factory=dict)
    counters: pd.DataFrame = field(default_factory=pd.DataFrame)


def _load(path: Path, source: str) -> Any:
    with contextlib.suppress(OSError):  # a FIFO or a device would block or never end: refuse it before opening
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise TraceError(f"{source}: cannot read the trace: it is not a regular file (a FIFO or a device)")
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
    except FileNotFoundError:
        raise TraceError(f"{source}: cannot read the trace: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{source}: cannot read the trace: it is a directory") from None
    except OSError as exc:
        raise TraceError(f"{source}: cannot read the trace: {exc.strerror or exc}") from None
    opener = gzip.open if head == b"\x1f\x8b" else open
    chunks, size = [], 0
    try:
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                size += len(chunk)
                if size > MAX_TRACE_BYTES:
                    raise TraceError(f"{source}: the trace is larger than {MAX_TRACE_BYTES >> 30} GB uncompressed")
                chunks.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{source}: cannot read the trace: {exc}") from None
    try:
        return json.loads(b"".join(chunks).decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{source}: not UTF-8 text (bad byte at offset {exc.start}): expected Chrome trace JSON"
        ) from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise TraceError(f"{source}: invalid JSON: nested too deeply") from None


def _number(value: Any, source: str, index: int, key: str, *, default: float | None = None) -> float:
    """A time field of event ``index`` in µs: a number (or numeric text, as MindSpore writes it)
    within ±:data:`sapptk.checks.MAX_TRACE_US`; ``default`` when absent (None: required)."""
    where = f"{source}: event {index}, {key}"
    if value is None and default is not None:
        return default
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            checks.fail(TraceError, where, value, "a time in µs")
    return checks.number(value, where, error=TraceError, low=-checks.MAX_TRACE_US, high=checks.MAX_TRACE_US)


def _ident(value: Any, source: str, index: int, key: str) -> Any:
    """A process or thread id: an integer or text (hashable, comparable), or None when absent."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        checks.fail(TraceError, f"{source}: event {index}, {key}", value, "an integer or a name")
    return value


def _args(value: Any, source: str, index: int) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        checks.fail(TraceError, f"{source}: event {index}, args", value, "a mapping (JSON object)")
    return dict(value)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a Chrome trace file (``.json`` or gzipped) into a :class:`Trace`."""
    if not isinstance(path, str | os.PathLike):
        checks.fail(TraceError, "trace path", path, "a file path")
    source = os.fspath(path)
    data = _load(Path(source), source)
    if isinstance(data, Mapping):
        if "traceEvents" not in data:
            raise TraceError(f"{source}: top level has no 'traceEvents': expected a Chrome trace (a list of events, "
                             "or an object with traceEvents)")
        events = data["traceEvents"]
    else:
        events = data
    if not isinstance(events, list):
        raise TraceError(f"{source}: traceEvents is {type(events).__name__}: expected a list of events")
    rows, counters = [], []
    open_spans: dict[tuple[Any, Any], list[tuple[int, Mapping, float, dict]]] = {}
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for index, e in enumerate(events):
        if not isinstance(e, Mapping):
            continue
        ph = e.get("ph")
        if ph not in ("X", "B", "E", "M", "C"):
            continue
        pid, tid = _ident(e.get("pid"), source, index, "pid"), _ident(e.get("tid"), source, index, "tid")
        args = _args(e.get("args"), source, index)
        if ph == "X":
            ts = _number(e.get("ts"), source, index, "ts")
            dur = _number(e.get("dur"), source, index, "dur", default=0.0)
            if dur < 0:
                checks.fail(TraceError, f"{source}: event {index} ({_name(e)}), dur", e.get("dur"),
                            "a duration >= 0 µs")
            rows.append((_name(e), e.get("cat", ""), pid, tid, ts, dur, args))
        elif ph == "B":
            open_spans.setdefault((pid, tid), []).append((index, e, _number(e.get("ts"), source, index, "ts"), args))
        elif ph == "E":
            end = _number(e.get("ts"), source, index, "ts")
            stack = open_spans.get((pid, tid))
            if not stack:
                raise TraceError(f"{source}: event {index} ({_name(e)}): an 'E' (end) event with no open 'B' (begin) "
                                 f"event on pid {pid!r}, tid {tid!r}: expected each E after its B")
            b_index, b, ts, b_args = stack.pop()
            if end < ts:
                raise TraceError(f"{source}: event {index} ({_name(e)}): ends at ts = {end:g} µs, before its 'B' "
                                 f"(event {b_index}) begins at {ts:g} µs: expected begin before end")
            rows.append((_name(b), b.get("cat", ""), pid, tid, ts, end - ts, {**b_args, **args}))
        elif ph == "M":
            name = args.get("name")
            if e.get("name") == "process_name" and isinstance(name, str):
                processes[pid] = name
            elif e.get("name") == "thread_name" and isinstance(name, str):
                threads[(pid, tid)] = name
        elif ph == "C":
            counters.append((_name(e), pid, _number(e.get("ts"), source, index, "ts"), args))
    frame = pd.DataFrame(rows, columns=list(_COLUMNS))
    frame["name"] = frame["name"].astype(str)
    frame["cat"] = frame["cat"].astype(str)
    return Trace(source, frame.reset_index(drop=True), processes, threads,
                 pd.DataFrame(counters, columns=["name", "pid", "ts", "args"]))


def _name(event: Mapping) -> str:
    name = event.get("name", "")
    return name if isinstance(name, str) else str(name)


# ---------------------------------------------------------------------------- writing
def write_trace(path: str | os.PathLike[str], events: Iterable[Mapping[str, Any]], *,
                metadata: Mapping[str, Any] | None = None) -> Path:
    """Write ``events`` as a Chrome trace object (``traceEvents``, ``displayTimeUnit: ms``);
    gzipped when ``path`` ends in ``.gz``. Returns the path."""
    out = checks.output_file(path, "trace path", error=TraceError)  # a folder or a FIFO: refused before writing
    data = {"traceEvents": list(events), "displayTimeUnit": "ms", **({"otherData": dict(metadata)} if metadata else {})}
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).encode("utf-8")
    try:
        if out.suffix == ".gz":
            with out.open("wb") as handle, gzip.GzipFile(out.stem, "wb", fileobj=handle, mtime=0) as gz:
                gz.write(text)
        else:
            out.write_bytes(text)
    except OSError as exc:
        raise TraceError(f"{os.fspath(out)}: cannot write the trace: {exc.strerror or exc}") from None
    return out


_KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-gradient", "W": "weight-gradient"}


def simulation_events(events: pd.DataFrame, memory: pd.DataFrame, *, name: str = "sapptk") -> list[dict[str, Any]]:
    """Chrome trace events of a simulation's ``events`` and ``memory`` frames.

    One process per device (``pid`` = device, ``tid`` 0), one complete event per op named
    ``"<kind> mb<micro_batch> vs<virtual_stage>"`` with ``cat`` the kind's long name and
    ``args`` = kind, micro_batch, virtual_stage, chunk, slice, unit; ops run overlapped as
    one unit share a slot and go on thread 1. A counter ``memory_mb`` per device follows the
    memory steps. Times: ms in the frames, µs in the trace.
    """
    out: list[dict[str, Any]] = []
    devices = sorted(set(events["device"].tolist()) | set(memory["device"].tolist()))
    for d in devices:
        out.append({"ph": "M", "name": "process_name", "pid": int(d), "tid": 0, "args": {"name": f"{name} device {d}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": int(d), "tid": 0, "args": {"sort_index": int(d)}})
        out.append({"ph": "M", "name": "thread_name", "pid": int(d), "tid": 0, "args": {"name": "compute"}})
    seen_units: set[int] = set()
    for row in events.sort_values(["device", "start_ms", "unit"], kind="stable").itertuples(index=False):
        kind = str(row.kind)
        tid = 1 if int(row.unit) in seen_units else 0
        seen_units.add(int(row.unit))
        out.append({
            "ph": "X",
            "name": f"{kind} mb{int(row.micro_batch)} vs{int(row.virtual_stage)}",
            "cat": _KIND_NAMES.get(kind, kind),
            "pid": int(row.device),
            "tid": tid,
            "ts": float(row.start_ms) * 1e3,
            "dur": (float(row.end_ms) - float(row.start_ms)) * 1e3,
            "args": {"kind": kind, "micro_batch": int(row.micro_batch), "virtual_stage": int(row.virtual_stage),
                     "chunk": int(row.chunk), "slice": int(row.slice), "unit": int(row.unit)},
        })
    for row in memory.itertuples(index=False):
        out.append({"ph": "C", "name": "memory_mb", "pid": int(row.device), "tid": 0, "ts": float(row.time_ms) * 1e3,
                    "args": {"memory_mb": float(row.memory_mb)}})
    return out

"""The sweep cache: a folder holding the rows of finished points, so an interrupted or
killed sweep resumes where it stopped.

Layout of the folder:

``part-<time>-<id>.parquet``
    rows as Parquet, each part written to a hidden name and renamed into place, so a
    reader only ever sees whole parts; ``pandas.read_parquet(folder)`` reads them all.
``_journal-<pid>-<id>.jsonl``
    the running sweep's journal: each finished row is appended (one JSON line, flushed to
    the operating system) as soon as it arrives, before the next point is awaited, so a
    crash or ``SIGKILL`` of the sweep loses no finished row. Every
    :data:`FLUSH_SECONDS` (or :data:`FLUSH_ROWS` rows) the journal's rows become a Parquet
    part and the journal is emptied; at the end it is removed. A journal left by a killed
    sweep is read like a part and merged into the parts by the next complete sweep. (Names
    starting with ``_`` are skipped by ``pandas.read_parquet``.)

Damage is contained: a part that is not readable Parquet, or not a sapptk sweep part, is
skipped with a :class:`~sapptk.errors.SapptkWarning` naming it (every good row is still
returned, and a later sweep recomputes only the missing points); a broken journal line (a
write cut short) is skipped; other files in the folder are ignored. Writing problems are
found early or contained: the folder is checked for writing before any solving starts
(:class:`~sapptk.errors.FileError`), and if the disk fills up during a sweep the rows stay
in the returned frame, a warning says how many could not be cached, and the journal is
retried with every later row.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.errors import FileError, SapptkWarning
from sapptk.files import writable_dir
from sapptk.sweeps.frame import (
    BOOL_COLUMNS,
    COLUMNS,
    FLOAT_INPUTS,
    INPUT_COLUMNS,
    INT_COLUMNS,
    LABEL_COLUMNS,
    LEVER_COLUMNS,
    NOT_STARTED,
    RENAMED,
    STATUSES,
    typed,
)

__all__ = ["FLUSH_ROWS", "FLUSH_SECONDS", "LAYOUT_COLUMN", "Cache", "cacheable", "read_cache"]

FLUSH_SECONDS = 2.0
"""A Parquet part is written from the journal at most this often while a sweep runs ..."""
FLUSH_ROWS = 256
"""... or as soon as this many rows wait in the journal."""

PART_GLOB = "part-*.parquet"
JOURNAL_GLOB = "_journal-*.jsonl"
_REQUIRED = ("key", "status", *(c for c in INPUT_COLUMNS if c not in LEVER_COLUMNS))  # parts of older sweeps too

LAYOUT_COLUMN = "layout_json"
"""A column of the cache only (not of the sweep frame): the plan's layer assignment as JSON
nested lists, so the points of a resumed sweep are seeded by cached plans too
(:mod:`sapptk.sweeps.seeding`). Parts written before it existed simply have no seeds."""
STORED = (*COLUMNS, LAYOUT_COLUMN)

try:  # POSIX: a live sweep holds a lock on its journal, so others know it is not abandoned
    import fcntl
except ImportError:  # pragma: no cover - Windows: journals of other sweeps are read, never merged
    fcntl = None  # type: ignore[assignment]


def _warn(message: str) -> None:
    warnings.warn(message, SapptkWarning, stacklevel=4)


def _plain(value: Any) -> Any:
    """JSON for values a custom solve function may return (numpy scalars and arrays)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {value!r} is not plain data")


def cacheable(row: Mapping[str, Any]) -> bool:
    """Whether a row goes to the cache: not an ``error`` or ``not_started`` (those are retried),
    and inputs that fit the stored column types (a point with, say, ``stages="8"`` is simply
    recomputed)."""
    if row.get("status") in ("error", NOT_STARTED):
        return False
    ints = all(isinstance(row[c], int) and not isinstance(row[c], bool) and abs(row[c]) <= checks.MAX_INT64
               for c in INT_COLUMNS)
    floats = all(row[c] is None or (isinstance(row[c], int | float) and not isinstance(row[c], bool)
                                    and abs(row[c]) < 1e308) or _is_nan(row[c]) for c in FLOAT_INPUTS)
    labels = all(isinstance(row[c], str) for c in ("profile", "schedule", "recompute"))
    flags = all(isinstance(row[c], bool | np.bool_) for c in BOOL_COLUMNS)
    return ints and floats and labels and flags


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _arrow_schema() -> Any:
    import pyarrow as pa

    label = pa.dictionary(pa.int32(), pa.string())
    types: dict[str, Any] = {
        **{c: label for c in LABEL_COLUMNS},
        **{c: pa.int64() for c in INT_COLUMNS},
        **{c: pa.bool_() for c in BOOL_COLUMNS},
        "peak_mb": pa.list_(pa.float64()),
        "error": pa.string(),
        "key": pa.string(),
        LAYOUT_COLUMN: pa.string(),
    }
    return pa.schema([(c, types.get(c, pa.float64())) for c in STORED])


def _to_arrow(frame: pd.DataFrame) -> Any:
    import pyarrow as pa

    schema = _arrow_schema()
    arrays = []
    for f in schema:
        values = frame[f.name].astype(object).where(frame[f.name].notna(), None).tolist()
        if pa.types.is_dictionary(f.type):
            arrays.append(pa.array(values, type=pa.string()).dictionary_encode().cast(f.type))
        elif pa.types.is_list(f.type):
            arrays.append(pa.array([v if isinstance(v, list | tuple | np.ndarray) else None for v in values], f.type))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _stored(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Frames of parts and journals in the stored columns; a lever a part does not have (written
    before levers could be swept) was off."""
    frame = pd.concat([f.reindex(columns=list(STORED)) for f in frames], ignore_index=True)
    for col in BOOL_COLUMNS:
        frame[col] = frame[col].astype(object).where(frame[col].notna(), False)
    return frame


def _plain_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.astype({c: object for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)})


def _good_rows(frame: pd.DataFrame) -> pd.Series:
    keys = frame["key"].astype(object)
    return keys.map(lambda k: isinstance(k, str) and bool(k)) & frame["status"].astype(object).isin(STATUSES)


class Cache:
    """A sweep cache folder (see the module docstring). Reading never writes; writing starts
    with :meth:`open`, which checks the folder and starts this sweep's journal."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            self.path = Path(os.fspath(path))
        except TypeError:
            raise FileError(f"cache = {path!r}: expected a folder path (str or os.PathLike)") from None
        if self.path.exists() and not self.path.is_dir():
            raise FileError(f"cache = {os.fspath(path)!r}: expected a directory of Parquet part-files, found a file")
        self._fd: int | None = None
        self._journal: Path | None = None
        self._pending: list[dict[str, Any]] = []  # rows in the journal, not yet in a part
        self._backlog: list[dict[str, Any]] = []  # rows not on disk yet (a write failed)
        self._failure: str | None = None
        self._last_part = time.monotonic()

    # ------------------------------------------------------------------ reading
    def parts(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob(PART_GLOB) if p.is_file())

    def journals(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob(JOURNAL_GLOB) if p.is_file())

    def _read_part(self, part: Path) -> pd.DataFrame | None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            frame = pq.read_table(part).to_pandas()
        except FileNotFoundError:  # merged away by a concurrent sweep
            return None
        except (OSError, pa.ArrowException, ValueError, TypeError) as exc:
            _warn(f"sweep cache {self.path}: skipped {part.name}: not a readable Parquet file "
                  f"({type(exc).__name__}: {str(exc)[:200]}); its points are recomputed (delete the file to "
                  "silence this warning)")
            return None
        frame = frame.rename(columns={old: new for old, new in RENAMED.items() if new not in frame.columns})
        missing = [c for c in _REQUIRED if c not in frame.columns]
        if missing:
            _warn(f"sweep cache {self.path}: skipped {part.name}: not a sapptk sweep part (no column "
                  f"{missing[0]!r}); its points are recomputed (move the file elsewhere to silence this warning)")
            return None
        frame = _plain_frame(frame)
        good = _good_rows(frame)
        if not good.all():
            _warn(f"sweep cache {self.path}: skipped {int((~good).sum())} of {len(frame)} rows of {part.name} "
                  "(no key or an unknown status)")
        return frame[good]

    @staticmethod
    def _read_journal(journal: Path) -> list[dict[str, Any]]:
        try:
            data = journal.read_bytes()
        except OSError:  # removed by its sweep as it ended, or unreadable: recompute
            return []
        rows = []
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:  # a write cut short (a kill or a full disk): that row was retried or is recomputed
                continue
            if isinstance(row, dict) and isinstance(row.get("key"), str) and row.get("status") in STATUSES:
                for old, new in RENAMED.items():  # written before the column was renamed
                    if old in row and new not in row:
                        row[new] = row.pop(old)
                rows.append(row)
        return rows

    def read(self) -> pd.DataFrame:
        """Every cached row (newest per key), in the sweep frame's columns (labels as objects)
        plus :data:`LAYOUT_COLUMN`."""
        frames = [f for f in (self._read_part(p) for p in self.parts()) if f is not None and len(f)]
        journal_rows = [row for j in self.journals() for row in self._read_journal(j)]
        if journal_rows:
            frames.append(pd.DataFrame(journal_rows))
        if not frames:
            return pd.DataFrame(columns=list(STORED))
        frame = _stored(frames)
        return frame.drop_duplicates("key", keep="last").reset_index(drop=True)

    # ------------------------------------------------------------------ writing
    def open(self) -> None:
        """Check the folder for writing (creating it) and start this sweep's journal; a
        :class:`~sapptk.errors.FileError` before any solving if that is impossible."""
        writable_dir(self.path, what="sweep cache folder", error=FileError)
        journal = self.path / f"_journal-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        try:
            fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        except OSError as exc:
            raise FileError(f"{self.path}: cannot write in the sweep cache folder: {exc.strerror or exc}") from None
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._fd, self._journal = fd, journal
        self._last_part = time.monotonic()

    def append(self, row: dict[str, Any]) -> None:
        """Put a finished row on disk now (the journal), and turn the journal into a Parquet
        part when :data:`FLUSH_SECONDS` or :data:`FLUSH_ROWS` says so."""
        if self._fd is None or not cacheable(row):
            return
        self._backlog.append(row)
        self._write_backlog()
        if len(self._pending) >= FLUSH_ROWS or time.monotonic() - self._last_part >= FLUSH_SECONDS:
            self.write_part()

    def _write_backlog(self) -> None:
        assert self._fd is not None
        while self._backlog:
            row = self._backlog[0]
            try:
                line = b"\n" + json.dumps(row, default=_plain, allow_nan=True).encode("utf-8", "surrogatepass")
            except (TypeError, ValueError) as exc:
                self._backlog.pop(0)
                _warn(f"sweep cache {self.path}: a row is not cached (its values are not plain data: {exc})")
                continue
            try:
                written = os.write(self._fd, line)
                if written != len(line):  # a partial write: the disk is full
                    raise OSError(28, "No space left on device (partial write)")
            except OSError as exc:
                if self._failure is None:
                    _warn(f"sweep cache {self.path}: cannot write finished rows ({exc.strerror or exc}); they are "
                          "kept in the returned frame and written as soon as the disk takes them")
                self._failure = exc.strerror or str(exc)
                return
            self._pending.append(self._backlog.pop(0))

    def write_part(self) -> Path | None:
        """The journal's rows as one Parquet part (atomic); the journal is emptied after."""
        self._last_part = time.monotonic()
        if not self._pending:
            return None
        part = self._write_rows(self._pending)
        if part is not None:
            self._pending.clear()
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
        return part

    def _write_rows(self, rows: Iterable[Mapping[str, Any]]) -> Path | None:
        """Rows (full frame rows) as one new part-file, written atomically; None if that failed."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = pd.DataFrame(list(rows), columns=list(STORED))
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.path / f".{name}.tmp"
        try:
            pq.write_table(_to_arrow(frame), tmp)
            os.replace(tmp, self.path / name)
        except (OSError, pa.ArrowException, ValueError, TypeError) as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if self._failure is None:
                _warn(f"sweep cache {self.path}: cannot write a Parquet part ({type(exc).__name__}: {exc}); the rows "
                      "stay in the journal and are read from there")
            self._failure = str(exc)
            return None
        return self.path / name

    def close(self) -> None:
        """End this sweep's writing: the last part, then the journal goes (it stays if its rows
        could not be moved to a part, and the next sweep reads it)."""
        if self._fd is None:
            return
        if self._backlog:
            self._write_backlog()
        part_ok = self.write_part() is not None or not self._pending
        os.close(self._fd)
        self._fd = None
        if part_ok and self._journal is not None:
            with contextlib.suppress(OSError):
                self._journal.unlink()
        if self._backlog:
            _warn(f"sweep cache {self.path}: {len(self._backlog)} finished row(s) could not be written "
                  f"({self._failure}); they are in the returned frame, and a rerun recomputes them")
            self._backlog.clear()

    def compact(self) -> None:
        """Merge every readable part and every abandoned journal into one part (the new part is
        written first, then the old files go). Damaged parts are left where they are."""
        if not self.path.is_dir() or not os.access(self.path, os.W_OK):
            return
        parts = [(p, f) for p in self.parts() if (f := self._read_part_quietly(p)) is not None]
        with contextlib.ExitStack() as locks:
            journals = [j for j in self.journals() if self._claim(j, locks)]
            rows = [row for j in journals for row in self._read_journal(j)]
            if len(parts) + len(journals) < 2 and not rows:
                return
            frames = [f for _, f in parts]
            if rows:
                frames.append(pd.DataFrame(rows))
            if not frames:
                return
            frame = _stored(frames).drop_duplicates("key", keep="last")
            merged = [r for r in frame.to_dict("records") if cacheable(r)]
            if merged and self._write_rows(merged) is None:
                return
            for old in [p for p, _ in parts] + journals:
                with contextlib.suppress(OSError):
                    old.unlink()

    def _read_part_quietly(self, part: Path) -> pd.DataFrame | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SapptkWarning)  # already said when the sweep read the cache
            return self._read_part(part)

    def _claim(self, journal: Path, locks: contextlib.ExitStack) -> bool:
        """Whether ``journal`` is abandoned (its sweep ended or was killed); if so, hold its lock."""
        if fcntl is None or journal == self._journal:
            return False
        try:
            fd = os.open(journal, os.O_RDONLY)
        except OSError:
            return False
        locks.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live sweep holds it
            return False
        return True


def read_cache(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every row stored in a sweep cache folder, as a sweep frame (any grid, any order).

    Damaged or foreign parts are skipped with a :class:`~sapptk.errors.SapptkWarning`."""
    cache = Cache(path)
    if not cache.path.is_dir():
        raise FileError(f"{cache.path}: no such sweep cache folder")
    return typed(cache.read().drop(columns=[LAYOUT_COLUMN]))

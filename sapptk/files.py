"""Safe reading (and writing) of the files users give sapptk: one reader for every JSON,
YAML and TOML document the package reads.

Everything here guards against what a user file may hold by mistake or by malice, and
answers with an error that names the file:

* the path: missing, a directory, a FIFO or device (refused before it is opened, so a
  FIFO never blocks), unreadable (permissions), a NUL character or a non-path;
* the size: over ``max_bytes`` (:data:`MAX_FILE_BYTES` unless the caller says otherwise),
  refused before parsing and read in chunks, never a limit-sized buffer;
* the bytes: a NUL byte (a binary file), UTF-16/32 text, anything that is not UTF-8
  (a leading UTF-8 byte-order mark is accepted);
* the structure: nesting deeper than :data:`MAX_DEPTH` levels, strings holding unpaired
  surrogates (JSON's ``"\\ud800"``, which no output could print);
* YAML only: more than :data:`MAX_YAML_NODES` nodes (pure-Python parsing of a few MB of
  tiny items would take minutes), more than :data:`MAX_YAML_ALIASES` aliases, aliases to
  nodes that themselves hold aliases (the "billion laughs" bomb), recursive aliases,
  explicit tags (``!!python/object``, ``!!binary``, ... — plain data only), duplicate keys,
  several documents in one file, characters YAML does not allow (control characters);
* JSON: duplicate keys, ``NaN``/``Infinity`` are read as floats (the callers' validation
  refuses them where a finite number is expected).

Each function takes ``error``, the :class:`~sapptk.errors.SapptkError` subclass to raise
(:class:`~sapptk.errors.FileError` by default), so a profile reader raises
:class:`~sapptk.errors.ProfileError` and a plan reader :class:`~sapptk.errors.ConfigError`;
messages start with the file's name. Writes (:func:`write_text`) are atomic (a temporary
file renamed into place) and explain a missing folder, a read-only folder or a full disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from sapptk import checks
from sapptk.checks import show
from sapptk.errors import FileError, SapptkError

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_NODES",
    "SUFFIXES",
    "decode_text",
    "load_document",
    "load_json_text",
    "load_toml_text",
    "load_yaml_text",
    "read_bytes",
    "read_text",
    "writable_dir",
    "write_text",
]

MAX_FILE_BYTES = checks.MAX_FILE_BYTES
"""Default size limit of a file read here (8 MiB): profiles and configs are a few KB."""

MAX_DEPTH = checks.MAX_YAML_DEPTH
"""Deepest nesting of lists and mappings accepted (real files nest fewer than 10 levels)."""

MAX_YAML_NODES = checks.MAX_YAML_NODES
"""Most YAML nodes (scalars, lists, mappings) in one document: YAML is parsed in pure Python,
so this bounds the parsing time of a file that is small in bytes but huge in items."""

MAX_YAML_ALIASES = checks.MAX_YAML_ALIASES
"""YAML alias (``*name``) uses allowed per document; nested aliases are always refused."""

SUFFIXES: Mapping[str, str] = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}
"""File name suffix → document format, for :func:`load_document`."""

_CHUNK = 64 * 1024
# explicit tags a plain document may carry (they only restate what the plain form means)
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "seq", "map"))

ErrorType = type[SapptkError]


def _source(path: Any, error: ErrorType, what: str) -> tuple[str, Path]:
    """The path as text for messages, and as a Path; clear errors for non-paths."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise error(f"{what}: expected a file path (str or os.PathLike), got {type(path).__name__} "
                    f"{show(path)}") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\x00" in text:
        raise error(f"{text!r}: a file path cannot contain a NUL character") from None
    if not text:
        raise error(f"{what}: expected a file path, got an empty string")
    return text, Path(text)


def _os_reason(exc: OSError) -> str:
    reasons = {
        errno.ENOENT: "no such file",
        errno.EISDIR: "it is a directory",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ELOOP: "too many levels of symbolic links",
        errno.ENAMETOOLONG: "the file name is too long",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENOSPC: "no space left on the device",
        errno.EROFS: "the file system is read-only",
        errno.EDQUOT: "disk quota exceeded",
    }
    return reasons.get(exc.errno or 0, exc.strerror or str(exc))


# ------------------------------------------------------------------------------ reading
def read_bytes(
    path: str | os.PathLike[str],
    *,
    what: str = "file",
    error: ErrorType = FileError,
    max_bytes: int = MAX_FILE_BYTES,
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ``what`` names it in messages
    (``"profile"``, ``"MindFormers config"``, ...)."""
    source, _ = _source(path, error, what)
    cannot = f"{source}: cannot read the {what}"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise error(f"{cannot}: {_os_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{cannot}: it is a directory")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket"
            raise error(f"{cannot}: it is {kind}, not a regular file")
        too_big = error(f"{source}: the {what} is larger than {_size(max_bytes)}: expected a smaller file "
                        f"(a {what} is usually a few KB)")
        if info.st_size > max_bytes:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, _CHUNK):  # chunks: never a limit-sized buffer
            size += len(chunk)
            if size > max_bytes:  # the file grew while we read it
                raise too_big
            chunks.append(chunk)
    except OSError as exc:
        raise error(f"{cannot}: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _size(n: int) -> str:
    mb = 2**20  # bytes per MB (a unit, not a limit)
    return f"{n // mb} MB" if n >= mb and n % mb == 0 else f"{n} bytes"


def _line_col(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def decode_text(data: bytes, *, source: str, what: str = "file", error: ErrorType = FileError) -> str:
    """UTF-8 bytes as text (a leading byte-order mark dropped); clear errors for binary data,
    UTF-16/32 and other encodings."""
    cannot = f"{source}: cannot read the {what}"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or data[:4] in (b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00"):
        raise error(f"{cannot}: it is UTF-16 or UTF-32 text: expected UTF-8 (save it as UTF-8)")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise error(f"{cannot}: NUL byte at offset {nul} (is this a binary file?): expected text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        head = data[: exc.start].decode("utf-8", errors="replace")
        raise error(
            f"{cannot}: not UTF-8 text (byte 0x{data[exc.start]:02x} at {_line_col(head, len(head))}, offset "
            f"{exc.start}): expected UTF-8"
        ) from None


def read_text(
    path: str | os.PathLike[str],
    *,
    what: str = "file",
    error: ErrorType = FileError,
    max_bytes: int = MAX_FILE_BYTES,
) -> str:
    """The UTF-8 text of a file, with every guard of :func:`read_bytes` and :func:`decode_text`."""
    source, _ = _source(path, error, what)
    return decode_text(read_bytes(source, what=what, error=error, max_bytes=max_bytes), source=source, what=what,
                       error=error)


# ------------------------------------------------------------------------ structure walk
def _check_tree(data: Any, source: str, error: ErrorType, fmt: str) -> Any:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and strings with unpaired surrogates
    (iteratively: the walk itself cannot overflow the stack)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    deepest: dict[int, int] = {}  # YAML aliases share nodes: walk one again only when reached deeper
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node, source, error, fmt)
        elif isinstance(node, Mapping | list | tuple):
            if deepest.get(id(node), -1) >= depth:
                continue
            deepest[id(node)] = depth
            if depth >= MAX_DEPTH:
                raise error(f"{source}: invalid {fmt}: nested more than {MAX_DEPTH} levels deep: expected plain "
                            "data (profiles and configs nest a few levels)")
            if isinstance(node, Mapping):
                for key, value in node.items():
                    if isinstance(key, str):
                        _check_string(key, source, error, fmt)
                    stack.append((value, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in node)
    return data


def _check_string(text: str, source: str, error: ErrorType, fmt: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{source}: invalid {fmt}: string {show(text)} holds an unpaired surrogate "
                    f"(U+{ord(text[exc.start]):04X}): expected valid Unicode text") from None


def _too_deep(source: str, fmt: str, error: ErrorType) -> SapptkError:
    return error(f"{source}: invalid {fmt}: nested more than {MAX_DEPTH} levels deep (nested too deeply): expected "
                 "plain data")


# -------------------------------------------------------------------------------- JSON
class _DuplicateKey(Exception):
    pass


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def load_json_text(text: str, *, source: str, error: ErrorType = FileError) -> Any:
    """Parse JSON text: duplicate keys, deep nesting and unpaired surrogates refused."""
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise error(f"{source}: invalid JSON: key {exc.args[0]!r} appears twice in one object: expected unique "
                    "keys") from None
    except RecursionError:
        raise _too_deep(source, "JSON", error) from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise error(f"{source}: invalid JSON: {exc}") from None
    return _check_tree(data, source, error, "JSON")


# -------------------------------------------------------------------------------- YAML
class _GuardedLoader(yaml.SafeLoader):
    """``SafeLoader`` with limits: nodes, depth, aliases (no nested or recursive ones),
    no explicit tags, no duplicate keys.

    A billion-laughs document nests aliases (an anchored node that itself uses aliases,
    referenced many times), so expanding it is exponential while parsing it is cheap: any
    alias to a node that contains an alias is refused, as is an alias to a node still being
    built (recursion) and more than :data:`MAX_YAML_ALIASES` aliases in all.
    """

    def __init__(self, stream: str, source: str, error: ErrorType) -> None:
        super().__init__(stream)
        self._source = source
        self._error = error
        self._alias_count = 0
        self._nodes = 0
        self._frames: list[bool] = []  # per node being composed: "contains an alias"
        self._anchor_has_alias: dict[str, bool] = {}
        self._open_anchors: set[str] = set()

    def refuse(self, mark: Any, why: str) -> NoReturn:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise self._error(f"{self._source}: unsafe YAML{where}: {why}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            self.refuse(event.start_mark, f"more than {MAX_YAML_NODES} values in one document: expected a smaller "
                                          "file")
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            self._alias_count += 1
            if self._alias_count > MAX_YAML_ALIASES:
                self.refuse(event.start_mark, f"more than {MAX_YAML_ALIASES} aliases: expected plain data (possible "
                                              "alias bomb)")
            if anchor in self._open_anchors:
                self.refuse(event.start_mark, f"alias *{anchor} refers to itself")
            if self._anchor_has_alias.get(anchor):
                self.refuse(event.start_mark, f"alias *{anchor} refers to a node that itself uses aliases: nested "
                                              "aliases are refused (possible alias bomb)")
            if self._frames:
                self._frames[-1] = True
            return super().compose_node(parent, index)
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _PLAIN_TAGS and tag != "!":
            self.refuse(event.start_mark, f"tag {tag!r}: tags are not allowed: expected plain data")
        if len(self._frames) >= MAX_DEPTH:
            self.refuse(event.start_mark, f"nested more than {MAX_DEPTH} levels deep (nested too deeply): expected "
                                          "plain data")
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        self._frames.append(False)
        try:
            node = super().compose_node(parent, index)
        finally:
            has_alias = self._frames.pop()
            if anchor is not None:
                self._open_anchors.discard(anchor)
        if has_alias and self._frames:
            self._frames[-1] = True
        if anchor is not None:
            self._anchor_has_alias[anchor] = has_alias
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    self.refuse(key_node.start_mark, f"key {key_node.value!r} appears twice in one mapping: expected "
                                                     "unique keys")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str, *, source: str, error: ErrorType = FileError) -> Any:
    """Parse one YAML document with the guards of :class:`_GuardedLoader` (``None`` when empty)."""
    loader = None
    try:
        loader = _GuardedLoader(text, source, error)  # the reader checks the characters here
        data = loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise error(f"{source}: invalid YAML at {_line_col(text, exc.position)}: character {char} is not allowed "
                    "in YAML (a control character): expected plain text") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = exc.problem or exc.context or "syntax error"
        raise error(f"{source}: invalid YAML{where}: {what}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: invalid YAML: {exc}") from None
    except RecursionError:
        raise _too_deep(source, "YAML", error) from None
    except SapptkError:  # our own refusals (a ValueError too)
        raise
    except ValueError as exc:  # an integer literal of more than 4300 digits, ...
        raise error(f"{source}: invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return _check_tree(data, source, error, "YAML")


# -------------------------------------------------------------------------------- TOML
def load_toml_text(text: str, *, source: str, error: ErrorType = FileError) -> Any:
    """Parse TOML text (``tomllib``); deep nesting refused."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source}: invalid TOML: {exc}") from None
    except RecursionError:
        raise _too_deep(source, "TOML", error) from None
    except ValueError as exc:
        raise error(f"{source}: invalid TOML: {exc}") from None
    return _check_tree(data, source, error, "TOML")


_LOADERS: dict[str, Callable[..., Any]] = {"json": load_json_text, "yaml": load_yaml_text, "toml": load_toml_text}


def load_document(
    path: str | os.PathLike[str],
    *,
    what: str = "file",
    error: ErrorType = FileError,
    suffixes: Iterable[str] | None = None,
    default: str | None = None,
    max_bytes: int = MAX_FILE_BYTES,
) -> Any:
    """Read and parse a JSON, YAML or TOML file, the format chosen by its suffix.

    ``suffixes`` limits the accepted suffixes (default: every key of :data:`SUFFIXES`);
    ``default`` (``"json"``, ``"yaml"`` or ``"toml"``) is the format of any other suffix,
    which are otherwise refused.
    """
    source, file = _source(path, error, what)
    allowed = [s.lower() for s in (suffixes if suffixes is not None else SUFFIXES)]
    suffix = file.suffix.lower()
    if suffix in allowed and suffix in SUFFIXES:
        fmt = SUFFIXES[suffix]
    elif default is not None:
        fmt = default
    else:
        expected = allowed[0] if len(allowed) == 1 else f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        raise error(f"{source}: file name ends in {file.suffix or '(nothing)'!r}: expected {expected}")
    text = read_text(source, what=what, error=error, max_bytes=max_bytes)
    return _LOADERS[fmt](text, source=source, error=error)


# ------------------------------------------------------------------------------ writing
def writable_dir(path: str | os.PathLike[str], *, what: str = "output folder", error: ErrorType = FileError,
                 create: bool = True) -> Path:
    """``path`` as a folder sapptk can write to, created (with its parents) when ``create``;
    checked by writing and removing a probe file, so a read-only folder or file system is
    found before any work starts."""
    source, folder = _source(path, error, what)
    if folder.exists() and not folder.is_dir():
        raise error(f"{source}: the {what} is a file: expected a folder (or a path that does not exist yet)")
    if not folder.exists():
        if not create:
            raise error(f"{source}: the {what} does not exist")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise error(f"{source}: cannot create the {what}: {_os_reason(exc)}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".sapptk-probe-", dir=folder)
    except OSError as exc:
        raise error(f"{source}: cannot write in the {what}: {_os_reason(exc)}") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as exc:
        raise error(f"{source}: cannot remove files in the {what}: {_os_reason(exc)}") from None
    return folder


def write_text(path: str | os.PathLike[str], text: str, *, what: str = "file", error: ErrorType = FileError) -> Path:
    """Write UTF-8 text atomically (a temporary file in the same folder, renamed into place):
    a reader sees the old file or the new one, never half of one; a failure leaves no
    temporary file behind and names the cause (missing folder, permissions, full disk). A
    directory, FIFO, device or socket at ``path`` is refused, never replaced."""
    source, file = _source(path, error, what)
    folder = file.parent
    try:
        mode: int | None = file.stat().st_mode  # followed: a link to /dev/null is a device too
    except (FileNotFoundError, NotADirectoryError):  # the folder checks below name what is missing
        mode = None
    except (OSError, ValueError) as exc:
        raise error(f"{source}: cannot write the {what}: {_os_reason(exc) if isinstance(exc, OSError) else exc}") \
            from None
    if mode is not None and stat.S_ISDIR(mode):
        raise error(f"{source}: cannot write the {what}: it is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise error(f"{source}: cannot write the {what}: it is {kind}, not a regular file (sapptk never replaces "
                    "one)")
    if not folder.is_dir():
        missing = "does not exist" if not folder.exists() else "is not a folder"
        raise error(f"{source}: cannot write the {what}: the folder {os.fspath(folder)!r} {missing}")
    data = text.encode("utf-8")
    tmp = folder / f".{file.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        # created like any new file (the umask applies), exclusively: never someone else's file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise error(f"{source}: cannot write the {what}: {_os_reason(exc)}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, file)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise error(f"{source}: cannot write the {what}: {_os_reason(exc)}") from None
    return file

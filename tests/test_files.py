"""The safe reader and writer (sapptk.files): every guard, each with the message it must give."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sapptk.files as files
from sapptk.errors import ConfigError, FileError, ProfileError, SapptkError


def fails(fn: Any, *fragments: str, error: type[Exception] = FileError) -> str:
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


# ------------------------------------------------------------------------- the path
def test_paths_that_are_not_files(tmp_path: Path) -> None:
    fails(lambda: files.read_text(tmp_path / "nope.json"), "nope.json: cannot read the file: no such file")
    fails(lambda: files.read_text(tmp_path), "cannot read the file: it is a directory")
    fails(lambda: files.read_text("a\x00b.json"), "cannot contain a NUL character")
    fails(lambda: files.read_text(42), "expected a file path", "int 42")  # type: ignore[arg-type]
    fails(lambda: files.read_text(""), "expected a file path")
    fails(lambda: files.read_text(tmp_path / ("x" * 300)), "the file name is too long")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    fails(lambda: files.read_text(loop), "too many levels of symbolic links")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    fails(lambda: files.read_text(fifo), "it is a FIFO, not a regular file")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_is_refused() -> None:
    fails(lambda: files.read_text("/dev/zero"), "/dev/zero: cannot read the file: it is a device or socket")


def test_permissions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "p.yaml", "a: 1\n")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.os, "open", refuse)
    fails(lambda: files.read_text(path, what="profile", error=ProfileError), "p.yaml: cannot read the profile: "
          "permission denied", error=ProfileError)


def test_size_limit_is_checked_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as handle:
        handle.truncate(2049)
    fails(lambda: files.read_text(path, max_bytes=2048), "big.yaml: the file is larger than 2048 bytes")
    assert files.read_text(write(tmp_path, "ok.yaml", "a" * 2048), max_bytes=2048) == "a" * 2048


# ------------------------------------------------------------------------ the bytes
@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (b'{"a": 1}\x00', ["NUL byte at offset 8", "binary file"]),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["NUL byte at offset 8"]),
        ('{"a": "é"}'.encode("utf-16"), ["UTF-16 or UTF-32", "expected UTF-8"]),
        (b'{"name": "caf\xe9"}', ["not UTF-8 text (byte 0xe9 at line 1, column 14, offset 13)"]),
        (b'a: 1\nb: "\xff"\n', ["byte 0xff at line 2, column 5"]),
    ],
)
def test_bytes_that_are_not_utf8_text(tmp_path: Path, data: bytes, fragments: list[str]) -> None:
    path = write(tmp_path, "f.json", data)
    fails(lambda: files.load_document(path), str(path), *fragments)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    assert files.load_document(write(tmp_path, "bom.json", b'\xef\xbb\xbf{"a": 1}')) == {"a": 1}


# --------------------------------------------------------------------------- JSON
@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ('{"a": 1,}', ["invalid JSON at line 1, column 9"]),
        ("", ["invalid JSON at line 1, column 1"]),
        ('{"a": 1, "a": 2}', ["key 'a' appears twice"]),
        ("[" * 100_000 + "]" * 100_000, ["nested more than 100 levels deep"]),
        ("[" * 101 + "]" * 101, ["nested more than 100 levels deep"]),
        ('{"name": "\\ud800"}', ["unpaired surrogate (U+D800)"]),
        ('{"n": ' + "9" * 5000 + "}", ["invalid JSON", "digits"]),
    ],
)
def test_json_guards(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "f.json", text)
    fails(lambda: files.load_document(path), "f.json: ", *fragments)


def test_json_keeps_what_it_may() -> None:
    deepest = files.load_json_text("[" * 100 + "]" * 100, source="s")  # 100 levels: the limit itself
    for _ in range(99):
        (deepest,) = deepest
    assert deepest == []
    data = files.load_json_text('{"a": NaN, "b": [1.5, "x"]}', source="s")
    assert data["b"] == [1.5, "x"] and data["a"] != data["a"]  # NaN, for the caller to refuse


# --------------------------------------------------------------------------- YAML
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("a: [1, 2\n", ["invalid YAML at line 2"]),
        ("a: 1\n---\nb: 2\n", ["invalid YAML at line 2"]),
        ("a: 1\na: 2\n", ["unsafe YAML at line 2, column 1", "key 'a' appears twice"]),
        ("a: \x07\n", ["invalid YAML at line 1, column 4", "U+0007", "control character"]),
        ("a: !!python/object/apply:os.system ['true']\n", ["tag 'tag:yaml.org,2002:python/object/apply:os.system'",
                                                            "not allowed"]),
        ("a: !!binary aGVsbG8=\n", ["tags are not allowed"]),
        ("a: !!float abc\n", ["tags are not allowed"]),
        ("a: !custom 1\n", ["tag '!custom'"]),
        (BOMB, ["line 3, column 5", "alias *b refers to a node that itself uses aliases"]),
        ("a: &a [1, *a]\n", ["alias *a refers to itself"]),
        ("x: &x 1\ny: [" + ", ".join(["*x"] * 101) + "]\n", ["more than 100 aliases"]),
        ("a: " + "[" * 101 + "]" * 101 + "\n", ["nested more than 100 levels deep"]),
        ("a: " + "[" * 50_000 + "]" * 50_000 + "\n", ["nested more than 100 levels deep"]),
        ("x: &x " + "[" * 60 + "]" * 60 + "\ny: " + "[" * 60 + "*x" + "]" * 60 + "\n",
         ["nested more than 100 levels deep"]),  # an alias placed deep adds its own depth
        ('a: "\\ud800"\n', ["unpaired surrogate"]),
        ("a: 2024-13-45\n", ["invalid YAML", "month must be in 1..12"]),
        ("a: " + "9" * 5000 + "\n", ["invalid YAML", "digits"]),
    ],
)
def test_yaml_guards(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "f.yaml", text)
    fails(lambda: files.load_document(path), "f.yaml: ", *fragments)


def test_yaml_node_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_YAML_NODES", 1000)
    fails(lambda: files.load_yaml_text("[" + ", ".join(["1"] * 1000) + "]", source="s"),
          "more than 1000 values in one document")
    assert len(files.load_yaml_text("[" + ", ".join(["1"] * 998) + "]", source="s")) == 998


def test_yaml_keeps_plain_data() -> None:
    text = "a: &base {x: 1}\nb: *base\nc: !!str 5\nd: [1, 2.5, null, true, 'é']\n<<: *base\n"
    assert files.load_yaml_text(text, source="s") == {"a": {"x": 1}, "b": {"x": 1}, "c": "5",
                                                      "d": [1, 2.5, None, True, "é"], "x": 1}
    assert files.load_yaml_text("# nothing\n", source="s") is None


# --------------------------------------------------------------------------- TOML
@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("a = [1, 2\n", ["invalid TOML"]),
        ("a = 1\na = 2\n", ["invalid TOML"]),
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", ["nested more than 100 levels deep"]),
    ],
)
def test_toml_guards(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "f.toml", text)
    fails(lambda: files.load_document(path), "f.toml: ", *fragments)


def test_documents_by_suffix(tmp_path: Path) -> None:
    assert files.load_document(write(tmp_path, "a.toml", "[x]\ny = 1\n")) == {"x": {"y": 1}}
    assert files.load_document(write(tmp_path, "a.YML", "x: 1\n")) == {"x": 1}
    fails(lambda: files.load_document(write(tmp_path, "a.txt", "x")),
          "ends in '.txt': expected .json, .yaml, .yml or .toml")
    fails(lambda: files.load_document(tmp_path / "a.toml", suffixes=(".json",)), "ends in '.toml': expected .json")
    assert files.load_document(write(tmp_path, "a.conf", "x: 1\n"), default="yaml") == {"x": 1}


def test_the_callers_error_type(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", "a: [\n")
    fails(lambda: files.load_document(bad, error=ConfigError), "bad.yaml", error=ConfigError)
    with pytest.raises(SapptkError):
        files.load_document(bad, error=ProfileError)


# ------------------------------------------------------------------------- writing
def test_write_text_is_atomic_and_explains_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.yaml"
    assert files.write_text(target, "a: 1\n") == target and target.read_text() == "a: 1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    fails(lambda: files.write_text(tmp_path / "missing" / "plan.yaml", "x"), "the folder", "does not exist")
    fails(lambda: files.write_text(tmp_path, "x"), "it is a directory")
    fails(lambda: files.write_text(target / "x.yaml", "x"), "is not a folder")

    real_open = os.fdopen

    class Full:
        def __init__(self, fd: int, mode: str) -> None:
            self.handle = real_open(fd, mode)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", Full)
    fails(lambda: files.write_text(target, "b: 2\n", what="plan"), "cannot write the plan: no space left on the device")
    assert target.read_text() == "a: 1\n"  # the old file is intact ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]  # ... and no temporary file is left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_writable_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = files.writable_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe is gone
    (tmp_path / "f").write_text("")
    fails(lambda: files.writable_dir(tmp_path / "f"), "is a file: expected a folder")
    fails(lambda: files.writable_dir(tmp_path / "new", create=False), "does not exist")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkstemp", refuse)
    fails(lambda: files.writable_dir(tmp_path, what="output folder (--out)"),
          "cannot write in the output folder (--out): the file system is read-only")


def test_no_import_time_work() -> None:
    code = "import sys, sapptk.files; print('tomllib' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

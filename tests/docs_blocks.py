"""The code blocks of README.md and docs/*.md, read the way tests/test_docs_code.py runs them.

Rules (docs/conventions.md, "Code in the docs"):

* A fenced block labelled ``python`` is run. Blocks labelled with a language of
  :data:`SHOWN` (shell commands, file contents, output, pseudo-code) are shown, never run.
  A fence without a label, or with any other label, is an error: every block says which it is.
* An indented (four-space) code block is an error too: it cannot carry a label.
* The Python blocks of one file run in order, in one namespace, in a fresh folder where the
  repository's ``data/`` and ``tests/data/`` are reachable under the same names.
* A block may carry directives, in HTML comments on the lines right above its fence:
  ``<!-- doc-test: replace `OLD` with `NEW` -->`` runs the block with that text replaced (a
  shorter time limit, a smaller grid); ``OLD`` must occur in the block. A ``doc-test``
  comment anywhere else, or an unknown directive, is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = frozenset({"python"})
"""Labels of blocks that are run."""

SHOWN = frozenset({"text", "console", "bash", "yaml", "toml", "json", "csv"})
"""Labels of blocks that are shown only: commands, file contents, output, pseudo-code."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*?)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
_REPLACE = re.compile(r"^replace `(?P<old>[^`]+)` with `(?P<new>[^`]*)`$")
_LIST_ITEM = re.compile(r"^\s*([*+-]|\d+[.)])\s")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of its opening fence), its label, its code."""

    path: Path
    line: int
    lang: str
    code: str
    replacements: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        return f"{relative(self.path)}:{self.line}"

    def source(self) -> str:
        """The code to run: the replacements applied, padded so line numbers are the file's."""
        code = self.code
        for old, new in self.replacements:
            code = code.replace(old, new)
        return "\n" * self.line + code


@dataclass
class Document:
    """A Markdown file's blocks and what is wrong with how they are written."""

    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.lang in RUN]


def relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def doc_files() -> list[Path]:
    """README.md and every docs/*.md, in a fixed order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path, text: str | None = None) -> Document:
    """The blocks of one Markdown file, and every rule it breaks (``file:line: what``)."""
    if text is None:
        text = path.read_text(encoding="utf-8")
    doc = Document(path)
    lines = text.splitlines()
    name = relative(path)
    used: set[int] = set()  # lines of directives that belong to a fence
    in_fence: list[int] = []  # lines inside fences
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, fence = i, m["indent"], m["fence"]
        lang = m["info"].split()[0].lower() if m["info"] else ""
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close["fence"][0] == fence[0] and len(close["fence"]) >= len(fence) and not close["info"]:
                break
            j += 1
        if j == len(lines):
            doc.problems.append(f"{name}:{start + 1}: the fence opened here is never closed")
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[start + 1:j]]
        in_fence.extend(range(start, j + 1))
        replacements: list[tuple[str, str]] = []
        k = start - 1
        while k >= 0 and (d := _DIRECTIVE.match(lines[k])):
            used.add(k)
            r = _REPLACE.match(d["body"])
            if r is None:
                doc.problems.append(f"{name}:{k + 1}: unknown doc-test directive {d['body']!r}: expected "
                                    "replace `OLD` with `NEW`")
            else:
                replacements.insert(0, (r["old"], r["new"]))
            k -= 1
        code = "\n".join(body) + "\n"
        if not lang:
            doc.problems.append(f"{name}:{start + 1}: a code block without a label: label it ```python (run) "
                                f"or one of {sorted(SHOWN)} (shown, not run)")
        elif lang not in RUN | SHOWN:
            doc.problems.append(f"{name}:{start + 1}: code block label {lang!r}: expected python (run) "
                                f"or one of {sorted(SHOWN)} (shown, not run)")
        if replacements and lang not in RUN:
            doc.problems.append(f"{name}:{start + 1}: doc-test directives on a block that is not run ({lang!r})")
        for old, _ in replacements:
            if old not in code:
                doc.problems.append(f"{name}:{start + 1}: doc-test replace `{old}`: not in the block")
        doc.blocks.append(Block(path, start + 1, lang, code, tuple(replacements)))
        i = j + 1
    fenced = set(in_fence)
    for k, line in enumerate(lines):
        if k not in used and k not in fenced and "doc-test" in line and _DIRECTIVE.match(line):
            doc.problems.append(f"{name}:{k + 1}: a doc-test directive must be right above a ```python fence")
    doc.problems.extend(_indented_blocks(name, lines, fenced))
    return doc


def _indented_blocks(name: str, lines: list[str], fenced: set[int]) -> list[str]:
    """Indented code blocks: a line indented four or more after a blank line that follows an
    unindented paragraph (not a list, whose continuations are indented)."""
    problems = []
    previous = ""  # the last non-blank line outside fences
    blank_before = True
    for k, line in enumerate(lines):
        if k in fenced:  # a fence counts as a line at its own indent
            previous, blank_before = line, False
            continue
        if not line.strip():
            blank_before = True
            continue
        if (line.startswith(("    ", "\t")) and blank_before and not previous.startswith((" ", "\t"))
                and not _LIST_ITEM.match(previous)):
            problems.append(f"{name}:{k + 1}: an indented code block: fence it and label it ```python (run) "
                            f"or one of {sorted(SHOWN)} (shown, not run)")
        previous, blank_before = line, False
    return problems

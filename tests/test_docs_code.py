"""Every Python block of README.md and docs/*.md runs (docs/conventions.md, "Code in the docs").

One test per ```python block, named ``file:line``; the blocks of one file run in order in one
namespace, in a fresh folder where ``data/`` and ``tests/data/`` are the repository's. A
failure names the file, the block's line and the error; its traceback points at the Markdown
lines. Running one block runs the blocks of its file before it first. How blocks are marked
(and the replace directive for shorter time limits) is checked here too: tests/docs_blocks.py.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from docs_blocks import ROOT, Block, Document, doc_files, parse, relative

import sapptk

SLOW = {"README.md", "docs/choose.md", "docs/estimation.md", "docs/figures.md", "docs/offload.md",
        "docs/micro_batch_recompute.md"}
"""Files whose blocks together take seconds (balances, a sweep, a choice, the Explorer, Chromium exports)."""

DOCS: list[Document] = [parse(path) for path in doc_files()]


@dataclass
class _Run:
    """The state of one file's blocks: its namespace, its folder, how far it got."""

    folder: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__doc__"})
    done: int = 0
    failed: str | None = None


_RUNS: dict[Path, _Run] = {}


def _folder(tmp_path_factory: pytest.TempPathFactory, doc: Document) -> Path:
    folder = tmp_path_factory.mktemp(relative(doc.path).replace("/", "_").removesuffix(".md"))
    (folder / "data").symlink_to(ROOT / "data", target_is_directory=True)
    (folder / "tests").mkdir()
    (folder / "tests" / "data").symlink_to(ROOT / "tests" / "data", target_is_directory=True)
    return folder


def _run_block(run: _Run, block: Block) -> str | None:
    """Run one block in its file's namespace and folder; what went wrong, or None."""
    code = compile(block.source(), str(block.path), "exec")
    before = Path.cwd()
    os.chdir(run.folder)
    try:
        exec(code, run.namespace)
    except Exception as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # from the block's own frame on
        frames = [f for f in traceback.extract_tb(tb) if f.filename == str(block.path)]
        line = frames[-1].lineno if frames else block.line
        shown = "".join(traceback.format_exception(type(exc), exc, tb)[-12:])
        return (f"{relative(block.path)}:{line} (the ```python block at line {block.line}) "
                f"raised {type(exc).__name__}: {exc}\n\n{shown}")
    finally:
        os.chdir(before)
    return None


def _cases() -> list[Any]:
    cases = []
    for doc in DOCS:
        marks = [pytest.mark.slow] if relative(doc.path) in SLOW else []
        for index, block in enumerate(doc.runnable):
            cases.append(pytest.param(doc, index, id=block.where, marks=marks))
    return cases


@pytest.mark.parametrize("doc", [pytest.param(d, id=relative(d.path)) for d in DOCS])
def test_blocks_are_marked(doc: Document) -> None:
    """Every block says whether it runs; directives sit right above a Python block and apply."""
    if doc.problems:
        pytest.fail("\n".join(doc.problems), pytrace=False)


@pytest.mark.parametrize(("doc", "index"), _cases())
def test_python_block_runs(doc: Document, index: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = _RUNS.get(doc.path)
    if run is None:
        run = _RUNS[doc.path] = _Run(_folder(tmp_path_factory, doc))
    blocks = doc.runnable
    while run.done <= index:
        if run.failed is not None:
            pytest.fail(f"{blocks[index].where}: not run, an earlier block of its file failed: {run.failed}",
                        pytrace=False)
        block = blocks[run.done]
        run.done += 1
        error = _run_block(run, block)
        if error is not None:
            run.failed = block.where
            pytest.fail(error, pytrace=False)


def _documented_signatures() -> list[Any]:
    """```text blocks that spell a public function's signature: ``name(arguments)``."""
    cases = []
    for doc in DOCS:
        for block in doc.blocks:
            head = block.code.lstrip()
            name = head.split("(", 1)[0]
            if block.lang == "text" and name.isidentifier() and name in sapptk.__all__ and head.rstrip().endswith(")"):
                cases.append(pytest.param(block, name, id=f"{block.where}:{name}"))
    return cases


@pytest.mark.parametrize(("block", "name"), _documented_signatures())
def test_documented_signature_is_the_code(block: Block, name: str) -> None:
    """A signature written out in the docs has the function's arguments, kinds, order and defaults."""
    documented = ast.parse(f"def {block.code.strip()}: pass").body[0].args
    real = inspect.signature(getattr(sapptk, name))
    positional = documented.posonlyargs + documented.args
    required = "(required)"
    shown = [(a.arg, "positional", d) for a, d in
             zip(positional, [None] * (len(positional) - len(documented.defaults)) + documented.defaults, strict=True)]
    shown += [(a.arg, "keyword", d) for a, d in zip(documented.kwonlyargs, documented.kw_defaults, strict=True)]
    want = [(p.name, "keyword" if p.kind is p.KEYWORD_ONLY else "positional",
             required if p.default is p.empty else p.default) for p in real.parameters.values()]
    got = [(n, kind, required if d is None else ast.literal_eval(d)) for n, kind, d in shown]
    assert got == want, f"{block.where}: the documented signature of {name} differs from the code's {real}"


# ------------------------------------------------------------------ the reader itself, on hand-written Markdown
def _parse(text: str) -> Document:
    return parse(ROOT / "docs" / "example.md", text)


def test_reader_finds_blocks_labels_lines_and_directives():
    doc = _parse("# t\n\n<!-- doc-test: replace `30` with `1` -->\n```python\nx = 30\n```\n\n- item\n\n  ```text\n"
                 "  shown\n  ```\n")
    assert not doc.problems
    run, shown = doc.blocks
    assert (run.lang, run.line, run.replacements, shown.lang, shown.line) == ("python", 4, (("30", "1"),), "text", 10)
    assert run.source() == "\n" * 4 + "x = 1\n"  # padded: line 5 of the file is line 5 of the code
    assert shown.code == "shown\n"  # a fence in a list item loses its indent
    assert [b.line for b in doc.runnable] == [4]


@pytest.mark.parametrize(("text", "problem"), [
    ("```\nx\n```\n", "example.md:1: a code block without a label"),
    ("```pyhton\nx\n```\n", "example.md:1: code block label 'pyhton'"),
    ("Text.\n\n    x = 1\n", "example.md:3: an indented code block"),
    ("<!-- doc-test: replace `a` with `b` -->\n\n```python\nx\n```\n", "example.md:1: a doc-test directive must be"),
    ("<!-- doc-test: replace `a` with `b` -->\n```python\nx\n```\n", "example.md:2: doc-test replace `a`: not in"),
    ("<!-- doc-test: skip -->\n```python\nx\n```\n", "example.md:1: unknown doc-test directive 'skip'"),
    ("<!-- doc-test: replace `x` with `y` -->\n```text\nx\n```\n", "directives on a block that is not run"),
    ("```python\nx\n", "example.md:1: the fence opened here is never closed"),
])
def test_reader_names_every_badly_marked_block(text: str, problem: str):
    assert any(p.startswith(problem) or problem in p for p in _parse(text).problems), _parse(text).problems


def test_list_continuations_are_not_code_blocks():
    assert not _parse("* item\n\n    more of the item\n\n1. one\n   two\n\n       deeper\n").problems


def test_a_failing_block_names_its_file_and_markdown_line(tmp_path):
    doc = _parse("# t\n\n```python\nx = 1\ny = x / 0\n```\n")
    error = _run_block(_Run(tmp_path), doc.runnable[0])
    assert error is not None and error.startswith("docs/example.md:5 (the ```python block at line 3) raised "
                                                  "ZeroDivisionError: division by zero")


def test_the_readme_best_known_plan_is_the_one_benchmarks_record():
    """README's "best known" figure is one docs/benchmarks.md records, and none it records for the
    headline case (llama2_70b interleaved 16 stages, 56000 MB, the --certify table) is better."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    claimed = [int(n.replace(",", "")) for n in re.findall(r"best known, ([\d,]+) ms", readme)]
    assert claimed, "README.md no longer names the best known plan: update this test"
    row = r"^\| llama2_70b \| interleaved \| 16 \| 56000 \| \d+ \| ([\d,]+) \| [\d.]+ \| ([\d,]+) \|"
    rows = re.findall(row, bench, flags=re.MULTILINE)
    recorded = {int(n.replace(",", "")) for row in rows for n in row}
    assert rows and min(recorded) == min(claimed), (claimed, sorted(recorded))


def _top_level_keywords(args: str) -> list[str]:
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:  # `build(name, stages=, chunks=)`: keywords named, values left out
        while re.search(r"\([^()]*\)", args):
            args = re.sub(r"\([^()]*\)", "", args)
        return re.findall(r"(?<![\w.])([A-Za-z_]\w*)\s*=(?!=)", args)
    assert isinstance(call, ast.Call)
    return [k.arg for k in call.keywords if k.arg is not None]


def _callable(name: str) -> Any:
    """The sapptk function or method a name in the prose means (``plan.x`` is ``Plan.x``), or None."""
    from sapptk import viz
    from sapptk.calibration.fitting import Calibration
    from sapptk.choosing.result import Choice
    from sapptk.plan import Plan
    from sapptk.simulation import Simulation

    roots = {"sapptk": sapptk, "viz": viz, "plan": Plan, "sim": Simulation, "cal": Calibration, "choice": Choice}
    head, *rest = name.split(".")
    obj = roots.get(head, getattr(sapptk, head) if head in sapptk.__all__ else None)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def _inline_calls() -> list[Any]:
    """Calls to sapptk written inline in the docs' prose with keywords: `balance(..., stall_time=3)`."""
    cases = []
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"`([A-Za-z_][\w.]*)\(([^`]*)\)`", text):
            keywords, func = _top_level_keywords(m.group(2)), _callable(m.group(1))
            if keywords and func is not None and not any(
                    p.kind is p.VAR_KEYWORD for p in inspect.signature(func).parameters.values()):  # choose(**parallel)
                line = text.count("\n", 0, m.start()) + 1
                cases.append(pytest.param(m.group(0), func, keywords, id=f"{relative(path)}:{line}:{m.group(1)}"))
    return cases


@pytest.mark.parametrize(("text", "func", "keywords"), _inline_calls())
def test_inline_calls_use_real_keywords(text: str, func: Any, keywords: list[str]) -> None:
    """A call written in the prose names only keywords its function has (at its first level)."""
    params = inspect.signature(func).parameters
    unknown = [k for k in keywords if k not in params]
    assert not unknown, f"{text}: no keyword {unknown}; it takes {list(params)}"

"""The package's shape: imports only go downward, and ``import sapptk`` stays light.

``LAYERS`` is the table in ``docs/internals.md``: a module may import modules of earlier
layers, and modules of its own package in the same layer (without cycles). Imports under
``if TYPE_CHECKING:`` are for type checkers only and are not counted.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sapptk"

# lowest first; a module belongs to the layer of the longest prefix that names it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sapptk.errors",),
    ("sapptk.checks",),  # row 0 of docs/internals.md: every limit and the one way to show a bad value
    ("sapptk.files", "sapptk.pareto"),  # row 0 too: guarded file I/O, the Pareto filter; they raise the error types
    ("sapptk.profile",),
    ("sapptk.models",),  # model cards, layouts, hardware: estimate_profile builds a Profile
    ("sapptk.schedules",),
    ("sapptk.formats.chrome_trace",),
    ("sapptk.simulation",),
    ("sapptk.config",),
    ("sapptk.seq",),
    ("sapptk.costs",),
    ("sapptk.assignment",),  # row 6¼: the record a solver phase hands on and a Plan extends
    ("sapptk.sensitivity",),
    ("sapptk.levers",),  # row 6¾: one description per lever, read by formats, request, sweeps, choosing, explorer, cli
    ("sapptk.formats",),
    ("sapptk.baselines",),  # the even splits: below the solver and the plan
    ("sapptk.plan",),
    ("sapptk.solver",),
    ("sapptk.request",),  # the typed SolveRequest: above the solver (its SearchOptions), below every caller
    ("sapptk.balancer",),
    ("sapptk.calibration",),
    ("sapptk.sweeps",),
    ("sapptk.choosing",),
    ("sapptk.models.hardware_fit",),  # fits a hardware card on measured runs: plans and simulates each run
    ("sapptk.trials",),  # row 12¾: trial folders of a choice, their runs ingested, the choice re-ranked
    ("sapptk.viz",),
    ("sapptk.explorer",),  # row 14 of docs/internals.md: the Explorer, one package (its modules on one floor)
    ("sapptk.widgets",),  # the Explorer's former address, re-exporting sapptk.explorer
    ("sapptk.cli",),
    ("sapptk.__main__",),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the prefix that placed it) for a sapptk module."""
    best: tuple[int, str] | None = None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (i, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it (and to docs/internals.md)")
    return best


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported sapptk module) for every import in the file, function bodies included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "sapptk"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "sapptk":
                continue
            for alias in node.names:  # "from sapptk.x import y" may name the submodule y
                sub = f"{target}.{alias.name}"
                where = ROOT / Path(*sub.split("."))
                is_module = where.is_dir() or where.with_suffix(".py").is_file()
                found.append((node.lineno, sub if is_module else target))
    return found


def _graph() -> dict[str, list[tuple[int, str]]]:
    return {_module_name(p): _imports(p, _module_name(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    for module in _graph():
        if module != "sapptk":
            _layer(module)


def test_imports_only_go_downward():
    bad = []
    for module, imports in _graph().items():
        if module == "sapptk":
            continue
        own, own_prefix = _layer(module)
        for line, target in imports:
            if target == "sapptk":
                bad.append(f"{module}:{line} imports the package root (import the defining module)")
                continue
            layer, prefix = _layer(target)
            if layer > own or (layer == own and prefix != own_prefix):
                bad.append(f"{module}:{line} imports {target} (layer {layer} {prefix}) from layer {own} {own_prefix}")
    assert not bad, "\n".join(bad)


# pairs (importer prefix, imported prefix) refused even where the rows would allow them
FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("sapptk.solver", "sapptk.plan"),  # the search returns counts; the balancer builds the Plan
)


def test_forbidden_imports():
    bad = []
    for module, imports in _graph().items():
        for line, target in imports:
            for importer, imported in FORBIDDEN:
                if (module == importer or module.startswith(importer + ".")) and (
                        target == imported or target.startswith(imported + ".")):
                    bad.append(f"{module}:{line} imports {target} ({importer} -> {imported} is forbidden)")
    assert not bad, "\n".join(bad)


PUBLIC_API_ONLY = ("sapptk/sensitivity.py",)
"""Modules that use other modules' public names only: no ``from x import _y``, no ``obj._attr``."""


@pytest.mark.parametrize("path", PUBLIC_API_ONLY)
def test_public_api_only(path):
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            private += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name.startswith("_")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            private.append(f"line {node.lineno}: uses .{node.attr}")
    assert not private, f"{path}: " + "; ".join(private)


def test_no_import_cycles():
    graph = {m: {t for _, t in imps if t in _graph_names()} for m, imps in _graph().items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def _graph_names() -> set[str]:
    return {_module_name(p) for p in PACKAGE.rglob("*.py")}


def test_package_root_imports_nothing_at_import_time():
    root = _imports(PACKAGE / "__init__.py", "sapptk")
    assert root == [], root


# pandas 3 imports pyarrow itself (its default string dtype), so pyarrow is only absent
# while pandas is
@pytest.mark.slow
@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        ("import sapptk", ("ortools", "pyarrow", "bokeh", "ipywidgets", "matplotlib", "sapptk.viz", "sapptk.explorer",
                           "sapptk.widgets")),
        ("import sapptk.cli", ("ortools", "bokeh", "ipywidgets", "matplotlib")),
        ("from sapptk import Plan, PipelineConfig, simulate", ("ortools", "bokeh", "ipywidgets")),
    ],
)
def test_heavy_libraries_load_on_first_use(statement, absent):
    code = f"import sys\n{statement}\nprint([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]", f"{statement} loaded {out.strip()}"


@pytest.mark.slow
def test_functions_stay_functions_after_their_modules_are_imported():
    code = (
        "import sapptk.balancer, sapptk.sweeps, sapptk.simulation, sapptk.cli\n"
        "import sapptk\n"
        "for name in ('balance', 'sweep', 'simulate'):\n"
        "    assert callable(getattr(sapptk, name)) and not isinstance(getattr(sapptk, name), type(sapptk)), name\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_export_exists():
    import sapptk

    for name in sapptk.__all__:  # each public name is the object its defining module holds
        if name in sapptk._EXPORTS:
            assert getattr(sapptk, name) is getattr(importlib.import_module(sapptk._EXPORTS[name]), name), name
        else:
            assert getattr(sapptk, name) is importlib.import_module(f"sapptk.{name}"), name
    with pytest.raises(AttributeError):
        sapptk.no_such_name  # noqa: B018


LONG_MODULE_LINES = 500


def test_a_long_module_says_why_in_its_docstring():
    """The house rule: a module over ~500 lines gives the reason in its docstring."""
    unexplained = []
    for path in sorted((ROOT / "sapptk").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "500 lines" not in doc:
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"over {LONG_MODULE_LINES} lines with no reason in the docstring: {unexplained}"

"""Every limit is defined once, in ``sapptk/checks.py``: a limit literal anywhere else fails here.

A *limit* is a module constant named ``MAX_...`` / ``_MAX_...`` / ``..._MAX``, a bound in a
comparison, or the ``high=`` / ``max=`` / ``maximum=`` of a check or a widget. Outside
``checks.py`` such a value must name a constant (``checks.MAX_WORKERS``), never spell a number:
numbers like 64, 1024 or 2**31 written in two places drift apart (the command line once allowed
1024 workers and ``balance`` 64).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sapptk"
LIMIT_NAME = re.compile(r"^_?MAX_[A-Z0-9_]+$|^[A-Z0-9_]+_MAX$")
LIMIT_KEYWORDS = {"high", "max", "maximum", "limit"}
SUSPECT = {64, 512, 1024, 2**31 - 1, 2**31, 2**32, 2**52, 2**53, 2**63, 2**64 - 1, 2**64}


def _fold(node: ast.AST) -> int | float | None:
    """The value of a constant arithmetic expression (2**31 - 1, 16 * 1024 * 1024), else None."""
    if isinstance(node, ast.Constant):
        value = node.value
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _fold(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp):
        left, right = _fold(node.left), _fold(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Pow):
            return left**right if abs(right) <= 128 else None
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.LShift: lambda a, b: a << b if b <= 128 else None}
        fn = ops.get(type(node.op))
        return None if fn is None else fn(left, right)
    return None


def _numbers(node: ast.AST) -> list[int | float]:
    """The value of a constant expression, or the numeric literals inside a larger one."""
    folded = _fold(node)
    if folded is not None:
        return [folded]
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, int | float)
            and not isinstance(n.value, bool)]


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(PACKAGE.parent)
    bad = []
    for node in tree.body:  # module constants named as limits
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        for target in targets:
            if isinstance(target, ast.Name) and LIMIT_NAME.match(target.id) and node.value is not None \
                    and _numbers(node.value):
                bad.append(f"{where}:{node.lineno}: {target.id} = {ast.unparse(node.value)}")
    for node in ast.walk(tree):  # limit values in comparisons and in high= / max= keywords
        if isinstance(node, ast.Compare):
            exprs = [node.left, *node.comparators]
        elif isinstance(node, ast.keyword) and node.arg in LIMIT_KEYWORDS:
            exprs = [node.value]
        else:
            continue
        for expr in exprs:
            if isinstance(expr, ast.Constant | ast.BinOp | ast.UnaryOp):
                hits = [v for v in _numbers(expr) if v in SUSPECT]
                if hits:
                    bad.append(f"{where}:{expr.lineno}: {ast.unparse(expr)} (a limit: name it in sapptk/checks.py)")
    return bad


def test_limits_live_only_in_the_checks_module():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "checks.py" and path.parent == PACKAGE:
            continue
        bad += _offences(path)
    assert not bad, "limit literals outside sapptk/checks.py:\n" + "\n".join(bad)


def test_the_scan_finds_what_it_is_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("MAX_WORKERS = 64\n_MAX_SEED = 2**31 - 1\nZ_MAX = 2**52\n"
                      "def f(w):\n    return 1 <= w <= 1024\n"
                      "def g(v):\n    return check(v, high=2**31 - 1)\n"
                      "MAX_OK = checks.MAX_WORKERS\nBATCH = 64\n", encoding="utf-8")
    found = _offences_at(sample)
    assert len(found) == 5, found


def _offences_at(path: Path) -> list[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, path.parent / "pkg"
    try:
        return _offences(path)
    finally:
        PACKAGE = saved


def test_one_way_to_show_a_bad_value():
    """``sapptk.checks.show`` is the only helper that cuts a value's repr for a message."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "checks.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "repr"
                    for n in ast.walk(node)) and any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
                    for n in ast.walk(node)) and any(isinstance(n, ast.Subscript) for n in ast.walk(node)):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name}")
    assert not bad, "helpers that cut a repr for messages (use sapptk.checks.show):\n" + "\n".join(bad)

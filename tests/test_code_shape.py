"""Shape rules: no function over 60 lines (docstring not counted) in the library, the apps, the scripts
and the benchmark package; no module over 600 lines in the library and the apps. (The layering
contracts of ``pyproject.toml [tool.importlinter]`` run in ``.ci/run``.)"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 60
MAX_MODULE_LINES = 600
FUNCTION_ROOTS = ("fedprivacy", "server", "clients", "scripts", "fedprivacy_bench")
MODULE_ROOTS = ("fedprivacy", "server", "clients")


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function, its docstring not counted."""
    n = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0] if node.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        n -= (first.end_lineno or first.lineno) - first.lineno + 1
    return n


def _sources(roots: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))
            for root in roots for path in sorted((REPO / root).rglob("*.py"))]


def _long_functions() -> dict[str, int]:
    found = {}
    for rel, text in _sources(FUNCTION_ROOTS):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _length(node) > MAX_LINES:
                found[f"{rel}::{node.name}"] = _length(node)
    return found


def test_no_function_is_longer_than_60_lines() -> None:
    long = _long_functions()
    assert long == {}, f"functions over {MAX_LINES} lines (split them): {long}"


def test_no_module_is_longer_than_600_lines() -> None:
    long = {rel: text.count("\n") for rel, text in _sources(MODULE_ROOTS) if text.count("\n") > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines (split them along their seams): {long}"


def test_the_length_rule_counts_what_it_says() -> None:
    src = "def f():\n    '''doc\n    more'''\n" + "    x = 1\n" * 61
    (node,) = ast.parse(src).body
    assert isinstance(node, ast.FunctionDef) and _length(node) == 62

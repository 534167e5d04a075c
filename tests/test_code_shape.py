"""The code's seams, read from its syntax trees: what a change at one seam must not need elsewhere.

A constructor called with many positional arguments must be called again in the same order after
every change of its signature; an import circle makes two modules one.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRODUCT = ("backend", "ui", "app.py")
"""The product's code (tests, benchmarks and scripts are its users)."""

POSITIONAL_MAX = 4
"""Most positional arguments of a constructor call; the rest go by name."""


def product_files() -> Iterator[Path]:
    """Every Python file of the product."""
    for part in PRODUCT:
        path = ROOT / part
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def trees() -> Iterator[tuple[Path, ast.Module]]:
    """Each product file and its syntax tree."""
    for path in product_files():
        yield path, ast.parse(path.read_text(), str(path))


def constructor_calls(tree: ast.Module) -> Iterator[tuple[str, ast.Call]]:
    """Calls of a capitalised name (a class, by this code's naming) and the name called."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name[:1].isupper():
                yield name, node


def test_no_constructor_takes_more_than_four_arguments_by_position() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{call.lineno} {name} with {len(call.args)}"
        for path, tree in trees()
        for name, call in constructor_calls(tree)
        if len(call.args) > POSITIONAL_MAX
    ]
    assert not found, "name the arguments past the fourth: " + "; ".join(found)


def module_name(path: Path) -> str:
    """`backend/serving/server.py` -> `backend.serving.server` (a package's `__init__`: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.Module, modules: set[str]) -> set[str]:
    """The product modules `tree` imports, at its top, in a function, or for type checkers only
    (`if TYPE_CHECKING:`): a circle that only the type checker walks is still two modules that
    cannot be read apart."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names
            )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found & modules


def test_no_import_circle() -> None:
    parsed = {module_name(path): tree for path, tree in trees() if path.name != "app.py"}
    modules = set(parsed)
    graph = graphlib.TopologicalSorter(
        {name: imported(tree, modules) - {name} for name, tree in parsed.items()}
    )
    try:
        graph.prepare()
    except graphlib.CycleError as circle:
        raise AssertionError(f"an import circle: {' -> '.join(circle.args[1])}") from None


FUNCTION_LINES_MAX = 60
"""A function a screen long at most: one that does more is several steps, each worth a name."""


def test_every_function_is_a_screen_long() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > FUNCTION_LINES_MAX
    ]
    assert not long, "split these into named steps: " + "; ".join(long)


def test_the_settings_import_nothing_outside_them() -> None:
    """`backend/config/` is the ground floor of settings: what assembles a command line from them
    (engines, servers) lives upstairs, beside what it builds."""
    parsed = {module_name(path): tree for path, tree in trees() if path.name != "app.py"}
    modules = set(parsed)
    outside = {
        name: sorted(m for m in imported(tree, modules) if not m.startswith("backend.config"))
        for name, tree in parsed.items()
        if name.startswith("backend.config")
    }
    assert not any(outside.values()), outside


def test_tests_import_nothing_from_the_benchmarks() -> None:
    """What tests and benchmarks share lives in `devkit/`: a benchmark stays free to change."""
    found = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        for module in (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        if module == "bench" or module.startswith("bench.")
    ]
    assert not found, found

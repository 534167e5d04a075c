"""The code's seams, read from its syntax trees: what a change at one seam must not need elsewhere.

A constructor called with many positional arguments must be called again in the same order after
every change of its signature; an import circle makes two modules one.
"""

from __future__ import annotations

import ast
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

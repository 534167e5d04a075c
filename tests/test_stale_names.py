"""No stale name in prose: every file path and module the docs, comments and docstrings name exists.

A module renamed or removed leaves its old name in the comments and docs that described it; this
finds each file path under the project's folders and each dotted module name of its packages that
Markdown, C sources and Python comments and docstrings name (not Python code, where a variable may be
called `backend`), and fails on one the tree does not have. A dotted name may go on past its module
into a name the module defines (`backend.trace.frames.digest_ring`); that name must then appear in
the module's source.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

from devkit.local import ROOT

PACKAGES = ("backend", "ui", "bench", "devkit", "tests", "scripts")

PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")/[\w/.-]*\w\.(?:py|c|h|sh|md|json))\b")
MODULE = re.compile(r"(?<![\w./-])((?:backend|ui|bench|devkit)(?:\.[A-Za-z_]\w*)+)")


def tracked(*suffixes: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in names.split() if name.endswith(suffixes) and (ROOT / name).exists()]


def python_prose(source: str) -> str:
    """The comments and docstrings of a Python file."""
    parts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        # docstrings: a string on its own as a statement (a module's, a function's, an attribute's)
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    if isinstance(statement.value.value, str):
                        parts.append(statement.value.value)
    return "\n".join(parts)


def prose(path: Path) -> str:
    text = path.read_text(errors="replace")
    return python_prose(text) if path.suffix == ".py" else text


def module_problem(name: str) -> str | None:
    """Why the dotted `name` names nothing in the tree, or None."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if source.exists() or base.with_suffix(".c").exists():
            if k == 1 and len(parts) > 1:
                break
            rest = parts[k:]
            if rest and source.exists():
                text = source.read_text()
                if not re.search(rf"\b{re.escape(rest[0])}\b", text):
                    return f"{'.'.join(parts[:k])} has no {rest[0]}"
            return None
        native = list(base.parent.glob(f"{base.name}.*.so")) if base.parent.exists() else []
        if native or (base.parent / f"{base.name.lstrip('_')}.c").exists():
            return None
    return "no such module"


def test_every_path_and_module_named_in_prose_exists() -> None:
    stale = []
    for path in [*tracked(".py", ".md", ".c", ".h", ".sh", ".toml"), ROOT / "Makefile"]:
        text = prose(path)
        where = path.relative_to(ROOT)
        for match in PATH.finditer(text):
            if not (ROOT / match.group(1)).exists():
                stale.append(f"{where}: {match.group(1)} does not exist")
        for match in MODULE.finditer(text):
            problem = module_problem(match.group(1))
            if problem is not None:
                stale.append(f"{where}: {match.group(1)}: {problem}")
    assert not stale, "stale names:\n" + "\n".join(sorted(set(stale)))


LINK = re.compile(r"\]\(([^)#\s]*\.md)?#([^)\s]+)\)")


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_into_a_section_of_the_docs_lands_on_one() -> None:
    broken = []
    for path in tracked(".md"):
        for match in LINK.finditer(path.read_text()):
            target = path.parent / match.group(1) if match.group(1) else path
            headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M) if target.exists() else []
            if match.group(2) not in {heading_anchor(h) for h in headings}:
                broken.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert not broken, "links to sections that do not exist:\n" + "\n".join(broken)


def test_the_check_finds_a_stale_name() -> None:
    assert module_problem("backend.trace.frames.digest_ring") is None
    assert module_problem("backend.serving.experiments") is None
    assert module_problem("backend._step_recorder") == "no such module"
    assert (
        module_problem("backend.trace.frames.no_such_function")
        == "backend.trace.frames has no no_such_function"
    )
    assert PATH.findall("see backend/trace.py and ui/app.py") == ["backend/trace.py", "ui/app.py"]
    assert (
        heading_anchor("How fast is it against `generate`, on each CPU")
        == "how-fast-is-it-against-generate-on-each-cpu"
    )
    assert (
        python_prose('"""doc: backend.x"""\nbackend.url = 1  # comment ui.y\n')
        == "# comment ui.y\ndoc: backend.x"
    )

"""The README's module map is the tree's: every module of `backend/` and `ui/` is in it, and it names
nothing that is not there."""

from __future__ import annotations

import re

from devkit.local import ROOT

SOURCES = (".py", ".c", ".h")


def module_map() -> dict[str, set[str]]:
    """The files the README's module map names, by package folder (a row with an empty package
    column belongs to the package above it)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| package | module | holds |")
    named: dict[str, set[str]] = {}
    package = ""
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0]:
            package = cells[0].strip("`")
        named.setdefault(package, set()).update(re.findall(r"`([\w.]+\.(?:py|c|h))`", cells[1]))
    return named


def tree() -> dict[str, set[str]]:
    """The source files of each package folder under backend/ and ui/ (an `__init__.py` that only
    says what its package holds is not a module of its own)."""
    found: dict[str, set[str]] = {}
    for top in ("backend", "ui"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in SOURCES or "__pycache__" in path.parts:
                continue
            if path.name == "__init__.py" and len(path.read_text().strip().splitlines()) <= 12:
                continue
            if path.name == "__main__.py":
                continue
            folder = path.parent.relative_to(ROOT).as_posix() + "/"
            found.setdefault(folder, set()).add(path.name)
    return found


def test_every_module_is_in_the_readmes_map_and_the_map_names_only_modules() -> None:
    named, present = module_map(), tree()
    missing = {folder: sorted(files - named.get(folder, set())) for folder, files in present.items()}
    missing = {folder: files for folder, files in missing.items() if files}
    assert not missing, f"modules missing from the README's module map: {missing}"
    gone = {folder: sorted(files - present.get(folder, set())) for folder, files in named.items()}
    gone = {folder: files for folder, files in gone.items() if files}
    assert not gone, f"the README's module map names files that do not exist: {gone}"


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_engines_page_says_what_is_in_at_most_300_lines() -> None:
    text = (ROOT / "docs" / "engines.md").read_text()
    assert len(text.splitlines()) <= 300
    removed = [name for name in ("fp32-rows", "fp32-torch", "int4-torch") if text.count(name) > 1]
    assert not removed, (
        f"docs/engines.md describes removed compute paths beyond saying they are gone: {removed}"
    )


def test_the_benchmarks_page_gives_todays_figures_not_their_history() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= 400
    commit = r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}"  # hex with a letter and a digit
    history = re.findall(rf"\b(?:{commit}|20\d\d-\d\d-\d\d|(?:second|latest|earlier) run)\b", text, re.I)
    assert not history, f"commit hashes, dates or runs by their order in docs/benchmarks.md: {history}"


def test_the_readmes_settings_table_is_the_declared_settings() -> None:
    import app
    from backend.config.declared import markdown_table

    text = (ROOT / "README.md").read_text()
    start = text.index("| flag | environment | default | what |")
    lines = text[start:].splitlines()
    table = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))])
    expected = markdown_table(app.readme_settings())
    assert table == expected, f"the README's table differs from the declarations; it should read:\n{expected}"

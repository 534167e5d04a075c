"""A setting declared once: its flag, environment variables, type, default, what it does and who reads it.

Each `Setting` gives the parser its argument (`add_settings`: the first environment variable that is
set and not empty is the default, then the declared default), the README its table row
(`table_row`; tests/test_readme.py fails where the README's table and the declarations differ),
and, for the engines' settings, the name of the `EngineOptions` field the engines read, typed. The
parser is the standard library's argparse: the parsed namespace crosses into the backend's spawned
child process as it is, and `app.py` and `python -m backend` share the same declarations.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One command-line setting."""

    name: str
    """The parsed attribute (and, for an engine setting, its `EngineOptions` field)."""
    flag: str
    env: tuple[str, ...]
    """Environment variables read for its default, first set one first."""
    what: str
    """What it does, in a line: the README's table and the start of `--help`."""
    default: Any = None
    """The default, or a function giving it (read when the parser is built: `SPACE_ID` may change it)."""
    kind: type = str
    choices: tuple[str, ...] | None = None
    default_words: str | None = None
    """The default as the README says it, where it is not the plain value."""

    def default_value(self) -> Any:
        """The default now: the first environment variable set, else the declared default."""
        for name in self.env:
            value = os.environ.get(name)
            if value:
                return self.kind(value)
        return self.default() if callable(self.default) else self.default

    def table_row(self) -> str:
        """The README's table row: flag, environment, default, what."""
        env = ", ".join(f"`{name}`" for name in self.env)
        if self.default_words is not None:
            default = self.default_words
        elif self.default in (None, ""):
            default = ""
        else:
            default = f"`{self.default}`" if self.kind is str else f"{self.default:g}"
        return f"| `{self.flag}` | {env} | {default} | {self.what} |"


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """An argument for each setting, its default from its environment."""
    for setting in settings:
        env = " or ".join(setting.env)
        shown = setting.default_words or "%(default)s"
        default = f"; default {shown}" if setting.default not in (None, "") else ""
        parser.add_argument(
            setting.flag,
            dest=setting.name,
            type=setting.kind,
            default=setting.default_value(),
            choices=setting.choices,
            help=f"{setting.what} (env {env}{default})",
        )


def markdown_table(settings: Iterable[Setting]) -> str:
    """The README's table of `settings`, header included."""
    rows = [setting.table_row() for setting in settings]
    return "\n".join(["| flag | environment | default | what |", "|---|---|---|---|", *rows])


def in_a_space(inside: Any, outside: Any) -> Callable[[], Any]:
    """A default that is `inside` in a Hugging Face Space (`SPACE_ID` set) and `outside` elsewhere."""
    return lambda: inside if os.environ.get("SPACE_ID") else outside

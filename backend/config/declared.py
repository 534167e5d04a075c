"""A setting declared once: its flag, environment variables, type, default, what it does and who reads it.

Each `Setting` gives the parser its argument (`add_settings`: the first environment variable that is
set and not empty is the default, then the declared default), `--help` its line, the README its
table row (`table_row`; tests/test_readme.py fails where the README's table and the declarations
differ), and the program the value under `name`, typed. A switch (`kind=bool`) is a flag without a
value, on where its variable is `1`; a `repeatable` setting takes its flag again and again, and a
comma-separated list from its variable. The parser is the standard library's argparse: the parsed
namespace crosses into the backend's spawned child process as it is, and `app.py` and
`python -m backend` share the same declarations.
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
    """The parsed attribute, and the name the program reads it by (an engine: `EngineOptions`)."""
    flag: str
    env: tuple[str, ...]
    """Environment variables read for its default, first set one first."""
    what: str
    """What it does, in a line: the README's table and the start of `--help`."""
    default: Any = None
    """The default, or a function giving it (read when the parser is built: `SPACE_ID` may change it)."""
    kind: type = str
    """The value's type; `bool`: a switch, on with its flag or with its variable set to `1`."""
    choices: tuple[str, ...] | None = None
    default_words: str | None = None
    """The default as the README says it, where it is not the plain value."""
    repeatable: bool = False
    """The flag may be given again and again (a tuple of values; the variable: comma-separated)."""

    def declared_default(self) -> Any:
        """The default as declared, whatever the environment says."""
        value = self.default() if callable(self.default) else self.default
        return tuple(value or ()) if self.repeatable else value

    def default_value(self) -> Any:
        """The default now: the first environment variable set, else the declared default."""
        for name in self.env:
            value = os.environ.get(name)
            if value:
                if self.kind is bool:
                    return value == "1"
                if self.repeatable:
                    return tuple(self.kind(part) for part in value.split(",") if part)
                return self.kind(value)
        return self.declared_default()

    def table_row(self) -> str:
        """The README's table row: flag, environment, default, what."""
        env = ", ".join(f"`{name}`" for name in self.env)
        if self.default_words is not None:
            default = self.default_words
        elif _unset(self.default):
            default = ""
        else:
            default = f"`{self.default}`" if self.kind is str else f"{self.default:g}"
        return f"| `{self.flag}` | {env} | {default} | {self.what} |"

    def add_to(self, parser: argparse.ArgumentParser, flag: str | None = None) -> None:
        """This setting's argument on `parser`, its default from its environment (under another `flag`
        where a program spells it differently)."""
        env = " or ".join(self.env)
        shown = self.default_words or "%(default)s"
        default = "" if _unset(self.default) else f"; default {shown}"
        words = f"{self.what} (env {env}{'=1' if self.kind is bool else ''}{default})"
        arguments: dict[str, Any] = {"dest": self.name, "default": self.default_value(), "help": words}
        if self.kind is bool:
            arguments["action"] = "store_true"
        else:
            arguments.update(type=self.kind, choices=self.choices)
            if self.repeatable:
                arguments["action"] = _Append
        parser.add_argument(flag or self.flag, **arguments)


def _unset(default: Any) -> bool:
    """Whether a default says nothing (none, off, empty), so the table and `--help` give none."""
    return default is None or default is False or default == "" or default == ()


class _Append(argparse.Action):
    """A repeatable setting's flag: each value added to the tuple (the environment's values first)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, (*(getattr(namespace, self.dest, None) or ()), values))


def add_settings(parser: argparse.ArgumentParser, settings: Iterable[Setting]) -> None:
    """An argument for each setting, its default from its environment."""
    for setting in settings:
        setting.add_to(parser)


def markdown_table(settings: Iterable[Setting]) -> str:
    """The README's table of `settings`, header included."""
    rows = [setting.table_row() for setting in settings]
    return "\n".join(["| flag | environment | default | what |", "|---|---|---|---|", *rows])


def in_a_space(inside: Any, outside: Any) -> Callable[[], Any]:
    """A default that is `inside` in a Hugging Face Space (`SPACE_ID` set) and `outside` elsewhere."""
    return lambda: inside if os.environ.get("SPACE_ID") else outside

"""The engines' command-line settings, shared by `python -m backend` and `app.py`: `--engine`, then what
each registered engine declares (`backend.engines`)."""

from __future__ import annotations

import argparse
import dataclasses

from backend.config.declared import Setting, add_settings
from backend.engines import ENGINES, EngineOptions, auto, create_engine, engine_settings
from backend.engines.base import Engine

DEFAULT_ENGINE = auto.AUTO
"""The engine when neither --engine nor DASHBOARD_ENGINE names one."""

ENGINE = Setting(
    "engine",
    "--engine",
    ("DASHBOARD_ENGINE",),
    "engine that produces the samples: `auto`, `embedded`, `sglang`, `sglang-engine`, `openai`, "
    "`synthetic`, `replay` ([docs/engines.md](docs/engines.md))",
    default=DEFAULT_ENGINE,
)
"""`--engine`; its choices are the registered engines' names, read when a parser is built."""


def all_engine_settings() -> tuple[Setting, ...]:
    """`--engine` (its choices today's `ENGINES`), then every engine's settings."""
    return (dataclasses.replace(ENGINE, choices=(auto.AUTO, *sorted(ENGINES))), *engine_settings())


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine and the engines' own settings, each defaulting to its environment variable."""
    add_settings(parser, all_engine_settings())


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the parsed arguments name, configured from them."""
    options = EngineOptions(**{s.name: getattr(args, s.name) for s in engine_settings()})
    if args.engine == auto.AUTO:
        return auto.auto_engine(options)
    return create_engine(args.engine, options)

"""Engines by name: adding one is a module in this package and one line in `ENGINES`.

An engine's module declares the engine class and `SETTINGS`, the command-line settings it reads
(`backend.config.declared.Setting`, each with its flag, environment variable, type and default);
the parser, `--help`, the README's table and the `EngineOptions` an engine is built from all come
from those declarations. A module that imports much (torch) keeps its declarations in a light module
and hands out its class lazily (`backend.engines.embedded`).
The registry itself (names, settings, `EngineOptions`) is `registry`'s; this module builds engines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.engines.registry import (
    ENGINES,
    MODEL,
    EngineOptions,
    declared_settings,
    declaring_module,
    engine_settings,
)

if TYPE_CHECKING:
    from backend.engines.base import Engine
    from backend.saved_run import SavedRun


def engine_class(name: str) -> type[Engine]:
    """The class registered as `name`, imported now; ValueError names the choices when it is unknown."""
    module = declaring_module(name)
    return getattr(module, ENGINES[name].split(":")[1])


def create_engine(name: str, options: EngineOptions | None = None) -> Engine:
    """Build the engine registered as `name`; ValueError names the choices when it is unknown."""
    return engine_class(name).from_options(options or EngineOptions())


def replaying(run: SavedRun, speed: float) -> Engine:
    """An engine that streams the saved `run` again, `speed` times as fast (a `replay` frame's)."""
    return engine_class("replay")(run, speed)  # type: ignore[call-arg]


__all__ = [
    "ENGINES",
    "MODEL",
    "EngineOptions",
    "create_engine",
    "declared_settings",
    "declaring_module",
    "engine_class",
    "engine_settings",
    "replaying",
]

"""The engines' registry without the engines: their names, the settings each declares, and the
options an engine is built from (`EngineOptions`). It imports no engine and not the Engine
interface, so `backend.engines.base` can name `EngineOptions` without a circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from backend.config.declared import Setting

ENGINES: dict[str, str] = {
    "synthetic": "backend.engines.synthetic:SyntheticEngine",
    "embedded": "backend.engines.embedded:EmbeddedEngine",
    "sglang": "backend.engines.http.sglang:SGLangEngine",
    "sglang-engine": "backend.engines.sglang_inprocess:SGLangInProcessEngine",
    "openai": "backend.engines.http.openai:OpenAIEngine",
    "replay": "backend.engines.replay:ReplayEngine",
}
"""Engine name -> "module:Class"; the module declares `SETTINGS`, and the class is imported only when
chosen, so heavy engines cost nothing idle."""

MODEL = Setting(
    "model",
    "--model",
    ("DASHBOARD_MODEL",),
    "embedded engine: a local HF-format Llama folder instead (a hub id where the hub is reachable); "
    "`openai`: the served model name (default the first listed); `sglang-engine` and `auto` on a "
    "GPU: the model SGLang loads, a folder or a hub id (without it, the bundled copy where the hub "
    "is out of reach)",
    default="",
    default_words="SmolLM2-135M-Instruct",
)
"""The one setting several engines read: the model they load, launch or ask for."""


def declaring_module(name: str) -> ModuleType:
    """The module that declares engine `name` (its settings; its class, imported when asked)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of: {', '.join(sorted(ENGINES))}")
    return importlib.import_module(ENGINES[name].split(":")[0])


def declared_settings(modules: Iterable[ModuleType]) -> tuple[Setting, ...]:
    """The settings `modules` declare (`SETTINGS`), each once, in their order; TypeError where two
    different declarations share a name."""
    found: dict[str, Setting] = {}
    for module in modules:
        for setting in getattr(module, "SETTINGS", ()):
            if found.setdefault(setting.name, setting) is not setting:
                raise TypeError(f"setting {setting.name!r} is declared twice ({module.__name__})")
    return tuple(found.values())


def engine_settings() -> tuple[Setting, ...]:
    """Every registered engine's settings, in `ENGINES`' order."""
    return declared_settings(declaring_module(name) for name in ENGINES)


class EngineOptions:
    """The engines' settings as parsed, read by name (`options.rate`): each engine reads its own.

    Built with any of the declared settings by name (`EngineOptions(rate=50)`); the others keep their
    declared defaults. A name no engine declares is a TypeError.
    """

    def __init__(self, **values: Any) -> None:
        declared = {s.name: s for s in engine_settings()}
        unknown = sorted(set(values) - set(declared))
        if unknown:
            raise TypeError(f"no engine declares a setting {unknown[0]!r}")
        self._values = {name: setting.declared_default() for name, setting in declared.items()}
        self._values.update(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"no engine declares a setting {name!r}") from None

    def __repr__(self) -> str:
        return f"EngineOptions({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

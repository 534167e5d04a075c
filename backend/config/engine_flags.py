"""Command-line and environment settings shared by `python -m backend` and `app.py`."""

from __future__ import annotations

import argparse
import dataclasses
import os

from backend.config.declared import Setting, add_settings, in_a_space
from backend.engines import ENGINES, EngineOptions, create_engine
from backend.engines.auto import AUTO, auto_engine
from backend.engines.base import Engine
from backend.engines.embedded.compute import COMPUTE_CHOICES
from backend.engines.http.sglang_launch import FIRST_START_TIMEOUT_S, STARTUP_TIMEOUT_S

DEFAULT_ENGINE = AUTO
"""The engine when neither --engine nor DASHBOARD_ENGINE names one."""

DEFAULT_BACKEND_PORT = 8765


def env(name: str, default: str) -> str:
    """An environment setting, or `default` when it is unset or empty."""
    return os.environ.get(name) or default


ENGINE_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "engine",
        "--engine",
        ("DASHBOARD_ENGINE",),
        "engine that produces the samples: `auto`, `embedded`, `sglang`, `sglang-engine`, `openai`, "
        "`synthetic`, `replay` ([docs/engines.md](docs/engines.md))",
        default=DEFAULT_ENGINE,
        choices=(AUTO, *sorted(ENGINES)),
    ),
    Setting(
        "sglang_url",
        "--sglang-url",
        ("SGLANG_URL",),
        "engine `sglang` (and `auto`): an SGLang server or router",
    ),
    Setting(
        "sglang_api_key",
        "--sglang-api-key",
        ("SGLANG_API_KEY",),
        "engine `sglang`: the key of a server started with `--api-key` (sent as a bearer token; prefer "
        "the variable, a flag shows in `ps`)",
    ),
    Setting(
        "openai_url",
        "--openai-url",
        ("OPENAI_URL",),
        "engine `openai` (and `auto`): an OpenAI-compatible server such as vLLM",
    ),
    Setting(
        "openai_api_key",
        "--openai-api-key",
        ("OPENAI_API_KEY",),
        "engine `openai`: the server's API key (vLLM's `--api-key`)",
    ),
    Setting("rate", "--rate", ("SYNTHETIC_RATE",), "synthetic engine: tokens/s per sample"),
    Setting(
        "jitter",
        "--jitter",
        ("SYNTHETIC_JITTER",),
        "synthetic engine: each token interval varies by ± this fraction",
    ),
    Setting(
        "run",
        "--run",
        ("DASHBOARD_RUN",),
        'engine `replay`: the saved run to stream ([docs/protocol.md](docs/protocol.md), "Saved runs")',
    ),
    Setting(
        "replay_speed",
        "--replay-speed",
        ("REPLAY_SPEED",),
        "engine `replay`: how many times faster than recorded",
    ),
    Setting(
        "sglang_args",
        "--sglang-args",
        ("SGLANG_ENGINE_ARGS",),
        "engine `sglang-engine`: `sglang.Engine` arguments as a JSON object, e.g. "
        '`{"tp_size": 2, "mem_fraction_static": 0.8}`',
    ),
    Setting(
        "sglang_server_args",
        "--sglang-server-args",
        ("SGLANG_SERVER_ARGS",),
        "engine `auto` where it starts an SGLang server: more `launch_server` flags, shell-quoted, "
        "e.g. `--tp-size 2`",
    ),
    Setting(
        "sglang_start_timeout",
        "--sglang-start-timeout",
        ("SGLANG_START_TIMEOUT",),
        "engine `auto` where it starts an SGLang server: seconds it may take to answer `/health` "
        "before it is stopped and the engine fails",
        kind=float,
        default_words=f"{STARTUP_TIMEOUT_S:g}, or {FIRST_START_TIMEOUT_S:g} on a first start (SGLang's "
        "compile cache empty)",
    ),
    Setting(
        "default_model",
        "--default-model",
        ("DASHBOARD_DEFAULT_MODEL",),
        "embedded engine without `--model`: SmolLM2-135M-Instruct from the bundled GGUF, or from the "
        "Hugging Face Hub (falling back to the bundled GGUF)",
        default=in_a_space("hub", "bundled"),
        choices=("bundled", "hub"),
        default_words="`hub` in a Space, else `bundled`",
    ),
    Setting(
        "model",
        "--model",
        ("DASHBOARD_MODEL",),
        "embedded engine: a local HF-format Llama folder instead (a hub id where the hub is reachable); "
        "`openai`: the served model name (default the first listed); `sglang-engine` and `auto` on a "
        "GPU: the model SGLang loads",
        default_words="SmolLM2-135M-Instruct",
    ),
    Setting("threads", "--threads", ("EMBEDDED_THREADS",), "embedded engine: torch threads per step"),
    Setting(
        "compute",
        "--compute",
        ("EMBEDDED_COMPUTE",),
        "embedded engine: the compute path, `auto`, `fp32-blocks`, `fp32-rows`, `fp32-torch` or "
        "`bf16-torch`; `auto` is the fastest batch-invariant path this machine runs, timed at start "
        "([docs/engines.md](docs/engines.md#the-embedded-engine))",
        choices=tuple(COMPUTE_CHOICES),
    ),
    Setting(
        "max_rows",
        "--max-rows",
        ("EMBEDDED_MAX_ROWS",),
        "embedded engine: samples decoding at once across requests; more requests queue",
    ),
    Setting(
        "context",
        "--context",
        ("EMBEDDED_CONTEXT",),
        "embedded engine: prompt + max_tokens per sample",
    ),
)
"""The engines' settings: `--engine`, then one per `EngineOptions` field (its type and default)."""


def _with_option_defaults(settings: tuple[Setting, ...]) -> tuple[Setting, ...]:
    """Each engine setting's type and default from its `EngineOptions` field (a default that depends on
    where it runs stays the setting's own)."""
    fields = {f.name: f for f in dataclasses.fields(EngineOptions)}
    declared = []
    for setting in settings:
        field = fields.get(setting.name)
        if field is not None:
            default = setting.default if callable(setting.default) else field.default
            kind = setting.kind if field.default is None else type(field.default)
            setting = dataclasses.replace(setting, default=default, kind=kind)
        declared.append(setting)
    missing = set(fields) - {s.name for s in declared}
    if missing:
        raise TypeError(f"EngineOptions fields without a setting: {sorted(missing)}")
    return tuple(declared)


ENGINE_SETTINGS = _with_option_defaults(ENGINE_SETTINGS)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine and the engines' own options, each defaulting to its environment variable."""
    add_settings(parser, ENGINE_SETTINGS)


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the parsed arguments name, configured from them."""
    options = EngineOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineOptions)})
    if args.engine == AUTO:
        return auto_engine(options, ENGINES)
    return create_engine(args.engine, options)

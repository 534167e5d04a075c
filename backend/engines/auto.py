"""`--engine auto`: pick the engine from what this machine has and what the command line gives.

A server URL given -> that server's engine. Else CUDA and an importable SGLang -> start an SGLang
server as a child process for `--model` and use the `sglang` engine on it. Else the embedded CPU
model, or the synthetic engine where the embedded one is not installed. The choice itself is a pure
function, so it is tested without any of those machines.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.config.settings import CACHE_ROOT, DEFAULT_MODEL_ID
from backend.engines.base import Engine

if TYPE_CHECKING:
    from backend.engines import EngineOptions

AUTO = "auto"
"""The --engine value that chooses by itself."""

LAUNCHED_SERVER_LOG = CACHE_ROOT / "sglang-server.log"
"""Where the SGLang server that `--engine auto` starts writes its output (appended; a failed start
quotes its end)."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine to build, and whether an SGLang server must be started for it."""

    name: str
    launch_sglang: bool = False
    why: str = ""


def choose_engine(
    *, sglang_url: str, openai_url: str, cuda: bool, sglang_importable: bool, registered: Collection[str]
) -> EngineChoice:
    """The engine `--engine auto` means on a machine with these facts."""
    if sglang_url:
        return EngineChoice("sglang", why=f"--sglang-url {sglang_url}")
    if openai_url:
        return EngineChoice("openai", why=f"--openai-url {openai_url}")
    if cuda and sglang_importable:
        return EngineChoice("sglang", launch_sglang=True, why="CUDA and SGLang are available")
    if "embedded" in registered:
        return EngineChoice("embedded", why="no server URL and no CUDA with SGLang")
    return EngineChoice("synthetic", why="no server URL, no CUDA with SGLang, no embedded engine")


ASSUME_CUDA_ENV = "DASHBOARD_ASSUME_CUDA"
"""Tests only: set to 1, `--engine auto` takes the GPU path (starts an SGLang server) on a machine
without CUDA, so the launcher's whole life runs on SGLang's CPU build through the same code."""


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False where torch is missing; True where ASSUME_CUDA_ENV is 1)."""
    if os.environ.get(ASSUME_CUDA_ENV) == "1":
        return True
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def sglang_importable() -> bool:
    """Whether SGLang is installed, found without importing it (that takes seconds)."""
    return importlib.util.find_spec("sglang") is not None


def auto_engine(options: EngineOptions, registered: Collection[str]) -> Engine:
    """Build the engine `choose_engine` picks on this machine, configured from `options`."""
    from backend.engines import create_engine

    choice = choose_engine(
        sglang_url=options.sglang_url,
        openai_url=options.openai_url,
        cuda=cuda_available(),
        sglang_importable=sglang_importable(),
        registered=registered,
    )
    if choice.launch_sglang:
        from backend.engines.http.sglang import SGLangEngine
        from backend.engines.http.sglang_launch import SGLangServerProcess

        # Incremental: each event holds only the new text, not the sample's whole text and ids again
        # (bench/sglang_stream_bytes.py measures what that saves). Sleep on idle: an idle scheduler
        # otherwise polls for work nonstop, a CPU core taken from the backend and the page.
        try:
            more = shlex.split(options.sglang_server_args)
        except ValueError as exc:
            raise ValueError(f"--sglang-server-args (SGLANG_SERVER_ARGS) cannot be read: {exc}") from None
        extra = ["--incremental-streaming-output", "--sleep-on-idle", *more]
        server = SGLangServerProcess(
            options.model or DEFAULT_MODEL_ID,
            extra_args=extra,
            log_path=LAUNCHED_SERVER_LOG,
            start_timeout=options.sglang_start_timeout,
        )
        return SGLangEngine(server.url, launcher=server, api_key=options.sglang_api_key)
    return create_engine(choice.name, options)  # type: ignore[arg-type]

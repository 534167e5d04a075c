"""`--engine auto`: pick the engine from what this machine has and what the command line gives.

A server URL given -> that server's engine. Else a GPU SGLang can use -> start an SGLang server as
a child process for `--model` and use the `sglang` engine on it. Else the embedded CPU model, or the
synthetic engine where the embedded one is not installed. On a machine with an NVIDIA device the GPU
preflight (`backend.engines.gpu_preflight`) decides whether SGLang can use it; where it cannot, the
CPU model serves and the page's engine line says why, naming what to install or set. The choice
itself is a pure function, so it is tested without any of those machines.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
from collections.abc import Callable, Collection
from dataclasses import dataclass

from backend.config.settings import CACHE_ROOT, DEFAULT_MODEL_ID
from backend.engines import ENGINES, EngineOptions, create_engine, engine_class, gpu_probe
from backend.engines.base import Engine
from backend.engines.gpu_preflight import GpuFacts, Preflight, check, needs_fp16
from backend.engines.http.sglang_launch import SGLangServerProcess
from backend.engines.sglang_settings import launch_flags

log = logging.getLogger("backend.engines.auto")

AUTO = "auto"
"""The --engine value that chooses by itself."""


LAUNCHED_SERVER_LOG = CACHE_ROOT / "sglang-server.log"
"""Where the SGLang server that `--engine auto` starts writes its output (rotated, see
`sglang_launch`; a failed start quotes its end)."""

LAUNCHED_RECORDS = CACHE_ROOT / "launched"
"""Where the SGLang servers that `--engine auto` starts are recorded, so that a later start finds
one left running by a backend that was killed (`backend.engines.http.launched`)."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine to build, and whether an SGLang server must be started for it."""

    name: str
    launch_sglang: bool = False
    why: str = ""
    notice: str = ""
    """What the page's engine line warns of: why a machine with a GPU serves the CPU model, or what
    the preflight found that does not stop SGLang."""


def choose_engine(
    *,
    sglang_url: str,
    openai_url: str,
    cuda: bool,
    sglang_importable: bool,
    registered: Collection[str],
    preflight: Preflight | None = None,
) -> EngineChoice:
    """The engine `--engine auto` means on a machine with these facts. `preflight`: the GPU check on
    a machine with an NVIDIA device, which then decides instead of `cuda` and `sglang_importable`."""
    if sglang_url:
        return EngineChoice("sglang", why=f"--sglang-url {sglang_url}")
    if openai_url:
        return EngineChoice("openai", why=f"--openai-url {openai_url}")
    cpu = "embedded" if "embedded" in registered else "synthetic"
    if preflight is not None and preflight.facts.has_device:
        if preflight.ready:
            return EngineChoice(
                "sglang",
                launch_sglang=True,
                why="an NVIDIA GPU that SGLang can use",
                notice=preflight.summary() if preflight.findings else "",
            )
        notice = (
            "this machine has an NVIDIA GPU, but SGLang cannot use it, so the CPU model serves: "
            + preflight.summary(preflight.blocking)
        )
        return EngineChoice(cpu, why="a GPU that SGLang cannot use", notice=notice)
    if cuda and sglang_importable:
        return EngineChoice("sglang", launch_sglang=True, why="CUDA and SGLang are available")
    if cpu == "embedded":
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


def auto_engine(
    options: EngineOptions,
    registered: Collection[str] = tuple(ENGINES),
    probe: Callable[[], GpuFacts] = gpu_probe.probe,
) -> Engine:
    """Build the engine `choose_engine` picks on this machine, configured from `options`."""
    facts = GpuFacts() if os.environ.get(ASSUME_CUDA_ENV) == "1" else probe()
    preflight = check(facts) if facts.has_device else None
    choice = choose_engine(
        sglang_url=options.sglang_url,
        openai_url=options.openai_url,
        cuda=preflight is None and cuda_available(),
        sglang_importable=sglang_importable(),
        registered=registered,
        preflight=preflight,
    )
    for finding in preflight.findings if preflight is not None else ():
        log.warning("GPU preflight: %s", finding.sentence())
    log.info("engine auto: %s (%s)", choice.name, choice.why)
    engine = launched_sglang(options, facts) if choice.launch_sglang else create_engine(choice.name, options)
    engine.notice = choice.notice
    return engine


def launched_sglang(options: EngineOptions, facts: GpuFacts) -> Engine:
    """The `sglang` engine on an SGLang server started for `--model` (found before the start, the
    bundled model where none is given and the hub is out of reach: `backend.engines.sglang_model`),
    with the flags this GPU needs (`backend.engines.sglang_settings.launch_flags`) and the user's
    `--sglang-server-args` after them."""
    try:
        more = shlex.split(options.sglang_server_args)
    except ValueError as exc:
        raise ValueError(f"--sglang-server-args (SGLANG_SERVER_ARGS) cannot be read: {exc}") from None
    server = SGLangServerProcess(
        options.model or DEFAULT_MODEL_ID,
        extra_args=launch_flags(more, fp16=needs_fp16(facts)),
        log_path=LAUNCHED_SERVER_LOG,
        start_timeout=options.sglang_start_timeout,
        records=LAUNCHED_RECORDS,
    )
    return engine_class("sglang")(  # type: ignore[call-arg]
        server.url, launcher=server, api_key=options.sglang_api_key, model_request=options.model
    )

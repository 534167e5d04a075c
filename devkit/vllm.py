"""vLLM's OpenAI server on this CPU, from the environment `scripts/prepare-engine-envs.sh` caches, on
the converted model: the one launch of the real-engine tests (tests/test_engines_real.py) and of
bench/embedded_vs_vllm.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from devkit.local import CONVERTED_MODEL, ENGINE_CACHE, SERVED_NAME, SERVER_START_S, free_port, start_logged

VLLM_PYTHON = ENGINE_CACHE / "envs" / "vllm" / "bin" / "python"
COMPILED_START_S = 1800.0
"""Longest wait for a compiled vLLM server to answer /health (its compile took over 5 minutes here)."""


def thread_binding(threads: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `threads` OpenMP threads on cores 0..threads-1."""
    return "0" if threads == 1 else f"0-{threads - 1}"


def vllm_command(
    port: int, dtype: str = "auto", eager: bool = False, api_key: str | None = None
) -> list[str]:
    """The server's command line on 127.0.0.1:`port` (a 2048-token context): `eager` adds
    --enforce-eager (compiled, vLLM started in 209 s on this idle CPU; eager, ~60)."""
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(CONVERTED_MODEL),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--dtype", dtype,
    ]  # fmt: skip
    if eager:
        command.append("--enforce-eager")
    if api_key is not None:
        command += ["--api-key", api_key]
    return command


def vllm_env(threads: int = 1, bind: bool = False) -> dict[str, str]:
    """The server's environment: a 1 GiB KV cache, `threads` OpenMP threads (bound to the first
    cores where `bind`, else where vLLM puts them)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["OMP_NUM_THREADS"] = str(threads)
    if bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = thread_binding(threads)
    return env


def start_vllm(
    log: Path,
    dtype: str = "auto",
    eager: bool = False,
    threads: int = 1,
    bind: bool = False,
    api_key: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """The server on a free port, in a process group of its own (`devkit.local.stop_process_group`
    stops it), its output in `log`, once /health answers; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    limit_s = SERVER_START_S if eager else COMPILED_START_S
    command = vllm_command(port, dtype, eager, api_key)
    return start_logged(command, log, url + "/health", vllm_env(threads, bind), limit_s=limit_s), url

"""The dashboard's processes on this machine, for tests, benchmarks and scripts: free ports, app.py and
the backend started and stopped, chromium, and where the real-engine environments are cached."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# The one free-port finder: the SGLang launcher needs it at run time, so it lives in the backend.
from backend.engines.http.sglang_launch import free_port as free_port

ROOT = Path(__file__).resolve().parent.parent

ENGINE_CACHE = Path(
    os.environ.get("DASHBOARD_CACHE") or Path.home() / ".cache" / "parallel-sampling-dashboard"
)
"""Where scripts/prepare-engine-envs.sh keeps the engine environments and the converted model, and
tests/test_space.py the Space's environment (DASHBOARD_CACHE, as the script reads it)."""

CONVERTED_MODEL = ENGINE_CACHE / "models" / "SmolLM2-135M-Instruct"
"""SmolLM2-135M-Instruct in Hugging Face format, converted from the bundled GGUF for the real servers."""

SERVED_NAME = "smollm2"
"""The name the real test servers serve the model under."""

SERVER_START_S = 600.0
"""A cold real-server start on 2 shared cores: SGLang ~1 min, vLLM a few minutes."""

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
"""Flags for Debian's chromium on a machine without a display or outside network."""


def chromium_path() -> str | None:
    """Debian's chromium binary, if installed."""
    return shutil.which("chromium")


def wait_for_http(url: str, process: subprocess.Popen[bytes], limit_s: float = 90.0) -> None:
    """Poll `url` until it answers 200; fail early if `process` exits."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {limit_s:g} s")


LOCAL_LOAD_FLAGS = ("--max-connections-per-address", "100000", "--requests-per-minute", "100000")
"""Backend flags for many clients from this one host: lift the per-address limits for a test or benchmark."""


def same_layout_launch() -> tuple[tuple[str, ...], dict[str, str]]:
    """A command prefix and environment that start Python processes with the same memory layout and
    hash seed each time (no address randomisation where `setarch` can turn it off): for benchmarks
    that compare processes, which otherwise differ by a few per cent from their layouts alone."""
    prefix = ("setarch", platform.machine(), "-R") if shutil.which("setarch") else ()
    return prefix, {**os.environ, "PYTHONHASHSEED": "0"}


def start_backend(
    flags: list[str] | tuple[str, ...],
    root: Path = ROOT,
    limit_s: float = 60.0,
    same_layout: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m backend FLAGS` (from checkout `root`) on a free port, once its /health answers;
    with `same_layout`, started by `same_layout_launch()`; with `env`, in that environment."""
    port = free_port()
    prefix, layout_env = same_layout_launch() if same_layout else ((), None)
    env = {**(layout_env or os.environ), **env} if env is not None else layout_env
    process = subprocess.Popen(
        [*prefix, sys.executable, "-m", "backend", "--port", str(port), *flags],
        cwd=root,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", process, limit_s)
    except BaseException:
        stop_process(process)
        raise
    return process, port


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate a process a test or benchmark started, and wait for it (kill if it lingers)."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def start_app(
    port: int, rate: float = 20.0, backend_port: int | None = None, extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """`python app.py` on the synthetic engine, waited for until the page answers."""
    args = [
        sys.executable,
        str(ROOT / "app.py"),
        "--engine",
        "synthetic",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-port",
        str(backend_port if backend_port is not None else free_port()),
        "--rate",
        str(rate),
        *(extra or []),
    ]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(args, cwd=ROOT, env=env)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", process)
    except BaseException:
        process.terminate()
        process.wait(10)
        raise
    return process


def start_logged(
    command: list[str], log: Path, url: str, env: dict[str, str], cwd: Path = ROOT, limit_s: float = 240.0
) -> subprocess.Popen[bytes]:
    """`command` in a process group of its own, its output in `log`, once `url` answers 200; its
    group stopped (`stop_process_group`) where it does not within `limit_s`."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for_http(url, process, limit_s)
    except BaseException:
        stop_process_group(process)
        raise
    return process


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started in its own process group, children included (vLLM's engine core is a
    child SIGTERM may leave behind): SIGTERM, up to 30 s, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()

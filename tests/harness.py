"""Helpers the tests and scripts share: free ports, starting app.py and the backend, chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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

"""An SGLang server as a child process: started for a model, waited for until healthy, stopped.

`--engine auto` on a GPU machine uses it to run SGLang for `--model`; the integration tests use it
to run the real server on this CPU. Blocking calls (the engine runs them in a worker thread).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

STARTUP_TIMEOUT_S = 600.0
"""How long a fresh SGLang server may take to load weights and warm up before it counts as failed."""

STOP_TIMEOUT_S = 20.0
"""How long the server may take to exit after SIGTERM before it is killed."""

LOG_TAIL_LINES = 20
"""Lines of the server's output quoted when it fails to start."""

HEALTH_POLL_S = 1.0
"""Pause between /health polls while the server starts."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SGLangServerProcess:
    """`python -m sglang.launch_server --model-path MODEL` on 127.0.0.1 at a free port."""

    def __init__(
        self,
        model: str,
        *,
        python: str = sys.executable,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        start_timeout: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.model = model
        self.python = python
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        self.start_timeout = start_timeout
        """Seconds `start` waits for /health before it stops the server and fails."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self, timeout: float | None = None) -> None:
        """Start the server and return once /health answers 200 (within `timeout`, by default
        `start_timeout`); RuntimeError if it exits first, TimeoutError (the server stopped) if slower."""
        timeout = self.start_timeout if timeout is None else timeout
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        output = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, **self.env} if self.env is not None else None
        # Its own process group, so stop() ends the scheduler and detokenizer processes it spawns too.
        process = self.process = subprocess.Popen(
            self.command(), stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not process:  # `stop` ran (the dashboard is stopping) while it started
                raise RuntimeError("the SGLang server was stopped while it started")
            if process.poll() is not None:
                raise RuntimeError(
                    f"the SGLang server exited with {process.returncode} while starting{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise TimeoutError(f"the SGLang server did not answer /health within {timeout:g} s{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server's output, to quote in an error ("" without a log)."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"; its output was to go to {self.log_path}, which cannot be read"
        return f"; the end of its output ({self.log_path}):\n" + "\n".join(text)

    def stop(self) -> None:
        """Terminate the server's process group; kill it if it does not exit in time, and kill
        what is left of the group (a scheduler still loading) once the server itself has exited."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

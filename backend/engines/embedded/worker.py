"""The embedded engine's own process, seen from the backend: start it, send it commands, read its steps.

The scheduler's Python work per step (sampling, detokenizing, building chunks) holds the GIL; on a
thread of the backend's process it stalled the backend's event loop (measured: lag max 0.46 s at
n=8, 1.7 s at n=32). Here it runs in a child process, as SGLang runs its scheduler. The child is
started with `subprocess` (the backend may itself be a daemonic `multiprocessing` child, which may
not have `multiprocessing` children of its own) and gets one pipe for commands and one for results,
as `multiprocessing.connection.Connection`s:

- commands, parent to child: a `WorkerSetup` first, then `("submit", id, prompt_ids, n, params)`,
  `("abort", id, index)` and `("stop",)`;
- results, child to parent: `("ready", stats)` or `("failed", error class, message)` after loading,
  then one `("step", outputs, positions, stats)` per scheduler pass that produced anything, where
  `outputs` is `[(id, [(index, text, tokens, finish_reason, meta), ...]), ...]`, `positions` is
  `[(id, queue position), ...]` and `stats` the scheduler's `snapshot()`.

The child's side is `child`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

log = logging.getLogger("backend.embedded")

LOAD_TIMEOUT_S = 300.0
"""How long the parent waits for the child to load the weights (~2 s idle, far more under load)."""

STOP_TIMEOUT_S = 10.0
"""How long `stop` waits for the child to finish its step and exit before killing it."""

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
"""The folder holding the `backend` package, put on the child's import path."""

CHILD_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""glibc's allocator settings for the child (a caller's own values win): blocks up to 32 MiB come
from the heap and freed memory stays there. By default glibc maps blocks from 128 KiB up afresh and
unmaps them when freed, so every step's logits and the sampler's [rows, vocabulary] tensors (6 MB
each at 32 rows) came back as new pages, each faulted in again: sampling 32 rows took 20 ms a step
instead of 6 on the AVX2 development machine (1.7 ms instead of 5 at 8 rows). Other C libraries
ignore these variables."""


@dataclass(frozen=True)
class WorkerSetup:
    """What the child loads: an HF-format folder (already resolved and converted by the parent)."""

    folder: str
    compute: str
    """A `--compute` choice (compute.py)."""
    threads: int
    max_rows: int
    context: int
    gguf: str = ""
    """The GGUF the folder was converted from, if it was (its blocks are read beside the folder)."""
    block_rows: int = 0
    """A PyTorch path's block of rows (compute.Choice.block); 0: timed and checked at start."""


class WorkerProcess:
    """The parent's handle on the child: start it, send it commands, hand its results to `on_message`.

    `on_message` runs on a reader thread of this process, once per message; after the child's last
    message it gets `("exited", returncode)`.
    """

    def __init__(self, setup: WorkerSetup, on_message: Callable[[tuple[Any, ...]], None]) -> None:
        self.setup = setup
        self.on_message = on_message
        self.process: subprocess.Popen[bytes] | None = None
        self._commands: Connection | None = None
        self._results: Connection | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id (None before `start`)."""
        return None if self.process is None else self.process.pid

    def start(self, timeout: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
        """Start the child and wait until it has loaded the model; its first figures, or what kept it
        from loading, raised."""
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the child and send it the setup; it loads the model while this process goes on."""
        command_read, command_write = os.pipe()
        result_read, result_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
        env = {**CHILD_MALLOC, **env}
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "backend.engines.embedded.child",
                    str(command_read),
                    str(result_write),
                    str(os.getpid()),
                ],
                pass_fds=(command_read, result_write),
                env=env,
            )
        finally:
            # Only the child may hold these ends: then each side sees EOF when the other is gone.
            os.close(command_read)
            os.close(result_write)
        self._commands = Connection(command_write, readable=False)
        self._results = Connection(result_read, writable=False)
        self.send(self.setup)

    def wait_ready(self, timeout: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the spawned child has loaded the model; its first figures, or what kept it from
        loading, raised."""
        assert self.process is not None and self._results is not None, "spawn() first"
        if not self._results.poll(timeout):
            self.stop()
            raise OSError(f"the embedded engine's process did not load the model within {timeout:g} s")
        try:
            status = self._results.recv()
        except EOFError:
            code = self.process.wait()
            self._close()
            raise OSError(
                f"the embedded engine's process exited with status {code} while loading (see its log)"
            ) from None
        if status[0] != "ready":
            self.stop()
            raise load_error(status[1], status[2])
        self._reader = threading.Thread(target=self._read, name="embedded-results", daemon=True)
        self._reader.start()
        return status[1]

    def send(self, message: Any) -> bool:
        """Send one command; False if the child is gone (its requests have ended or will)."""
        if self._commands is None:
            return False
        try:
            with self._send_lock:
                self._commands.send(message)
        except OSError:
            return False
        return True

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the child to abort its requests and exit; kill it if it does not, then wait for it."""
        if self.process is None:
            return
        self.send(("stop",))
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the embedded engine's process did not stop within %g s; killing it", timeout)
            self.process.kill()
            self.process.wait()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout)
        self._close()

    def _close(self) -> None:
        with self._send_lock:
            for connection in (self._commands, self._results):
                if connection is not None:
                    connection.close()
            self._commands = self._results = None

    def _read(self) -> None:
        results = self._results
        assert results is not None and self.process is not None
        while True:
            try:
                message = results.recv()
            except (EOFError, OSError):
                break
            self.on_message(message)
        self.on_message(("exited", self.process.wait()))


def load_error(kind: str, message: str) -> Exception:
    """The child's loading failure as the exception the backend's start-up reports plainly."""
    from backend.engines.embedded.weights import ModelFileError

    if kind == "ModelFileError":
        return ModelFileError(message)
    if kind == "ValueError":
        return ValueError(message)
    return OSError(f"the embedded engine could not load the model ({kind}: {message})")

"""An SGLang server as a child process: started for a model, waited for until healthy, stopped.

`--engine auto` on a GPU machine uses it to run SGLang for `--model`; the integration tests use it
to run the real server on this CPU. Blocking calls (the engine runs them in a worker thread).

The server's output goes through a pipe to a thread that writes it to a rotating log (`log_path`,
then `log_path.1`), so it stays under LOG_MAX_BYTES * (LOG_BACKUPS + 1) however long the server
runs; only that thread holds the file, and closes it when the server's output ends. Stopping it
fits a container's 10 s grace:
SIGTERM to its process group, STOP_TIMEOUT_S, then SIGKILL to the group.

The server runs under a keeper (`backend.lifetime`) in a session of its own, so that it ends with
this process however this process dies: the keeper stops the group the same way when this process
is gone, and the server dies with the keeper. With `records`, a launch is recorded there and the
servers of earlier runs are looked for first (`launched`): an orphan is stopped, another running
dashboard's server named (`earlier`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import logging
import logging.handlers
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from backend import lifetime
from backend.config.declared import Setting
from backend.engines.http import launched

STARTUP_TIMEOUT_S = 600.0
"""How long an SGLang server may take to load weights and warm up before it counts as failed."""

FIRST_START_TIMEOUT_S = 1800.0
"""The same on a first start, when SGLang's compile cache is empty: on a GPU it then downloads the
model, compiles its JIT kernels (and FlashInfer's) and captures CUDA graphs."""

SERVER_ARGS = Setting(
    "sglang_server_args",
    "--sglang-server-args",
    ("SGLANG_SERVER_ARGS",),
    "engine `auto` where it starts an SGLang server: more `launch_server` flags, shell-quoted, "
    "e.g. `--tp-size 2`",
    default="",
)
START_TIMEOUT = Setting(
    "sglang_start_timeout",
    "--sglang-start-timeout",
    ("SGLANG_START_TIMEOUT",),
    "engine `auto` where it starts an SGLang server: seconds it may take to answer `/health` "
    "before it is stopped and the engine fails",
    kind=float,
    default_words=f"{STARTUP_TIMEOUT_S:g}, or {FIRST_START_TIMEOUT_S:g} on a first start (SGLang's "
    "compile cache empty)",
)
"""None: STARTUP_TIMEOUT_S, or FIRST_START_TIMEOUT_S where SGLang's compile cache is empty
(`sglang_launch.start_timeout`)."""

STOP_TIMEOUT_S = 3.0
"""How long the server may take to exit after SIGTERM before its process group is killed: short, so
that app.py, its backend and this server are all gone within a container's 10 s grace."""

LOG_MAX_BYTES = 4 * 1024 * 1024
"""Size at which the server's log is rotated."""

LOG_BACKUPS = 1
"""Rotated logs kept beside the current one (`log_path.1`)."""

LOG_TAIL_LINES = 20
"""Lines of the server's output quoted when it fails to start."""

HEALTH_POLL_S = 1.0
"""Pause between /health polls while the server starts."""

PORT_ATTEMPTS = 3
"""Ports tried in turn when another program takes the chosen one before SGLang binds it."""

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux says which ports it hands out by itself."""

PICKED_PORTS = 12_000
"""How many ports under the kernel's ephemeral range `free_port` picks from."""

PICK_TRIES = 20
"""Random ports `free_port` tries before it lets the kernel assign one."""


def compile_cache(env: Mapping[str, str] = os.environ) -> Path:
    """Where SGLang keeps its compiled JIT kernels (SGLANG_JIT_CACHE_DIR, by default ~/.cache/sglang/jit)."""
    return Path(env.get("SGLANG_JIT_CACHE_DIR") or "~/.cache/sglang/jit").expanduser()


def first_start(cache: Path) -> bool:
    """Whether SGLang starts with an empty compile cache (it compiles its kernels during the start)."""
    try:
        return not any(cache.iterdir())
    except OSError:
        return True


def start_timeout_of(given: float | None, first: bool) -> float:
    """The start's time limit: the one given, else FIRST_START_TIMEOUT_S on a first start, else
    STARTUP_TIMEOUT_S."""
    if given is not None:
        return given
    return FIRST_START_TIMEOUT_S if first else STARTUP_TIMEOUT_S


def rotating_log(path: Path) -> logging.Logger:
    """A logger of its own writing bare lines to `path`, rotated at LOG_MAX_BYTES."""
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger(f"sglang-server:{path}", logging.INFO)  # not registered: no propagation
    logger.addHandler(handler)
    return logger


def copy_output(pipe: IO[bytes], path: Path) -> None:
    """Write the lines read from `pipe` to the rotating log at `path` until the pipe closes, then
    close both (a thread's body)."""
    logger = rotating_log(path)
    try:
        for line in iter(pipe.readline, b""):
            logger.info(line.decode(errors="replace").rstrip("\n"))
    finally:
        pipe.close()
        for handler in logger.handlers:
            handler.close()


def exit_words(code: int) -> str:
    """A process's exit status in words: "exit status 1", "killed by SIGKILL"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def ephemeral_ports() -> tuple[int, int]:
    """The range of ports the kernel assigns by itself (a bind to port 0, an outgoing connection),
    from /proc; Linux's default where it cannot be read."""
    try:
        low, high = (int(word) for word in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, chosen at random below the
    kernel's ephemeral range where there is room (PICKED_PORTS ports under it), so that a server
    which binds it seconds later (SGLang binds once its model is loaded) does not lose it to a
    program that asks the kernel for any free port in between. Else one the kernel assigns."""
    low, _ = ephemeral_ports()
    candidates = range(max(1024, low - PICKED_PORTS), low)
    for port in random.sample(candidates, min(PICK_TRIES, len(candidates))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    """Whether a program accepts TCP connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def http_status(url: str) -> int | None:
    """The HTTP status a GET of `url` answers with, None where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


def api_key_of(args: Sequence[str]) -> str | None:
    """The `--api-key` among launch_server's flags, None where none is given."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--api-key")
    known, _ = parser.parse_known_args(list(args))
    return known.api_key


def port_holder(url: str, api_key: str | None = None) -> str | None:
    """None where the server at `url` answers as SGLang does, or nothing answers there; else what
    answered, in words: the port is held by another program. SGLang's /model_info names a model_path
    (its OpenAI model list is asked where /model_info is not found); a server that refuses the key
    (HTTP 401 or 403) is taken for SGLang started with another one."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    said = ""
    for path, field in (("/model_info", "model_path"), ("/v1/models", "data")):
        try:
            request = urllib.request.Request(url + path, headers=headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                body = response.read(65536)
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                return None
            said += f"{'; ' if said else ''}GET {path} answered HTTP {error.code}"
            if error.code == 404:
                continue
            return said
        except (urllib.error.URLError, OSError):
            return None
        try:
            info = json.loads(body)
        except ValueError:
            return f"GET {path} answered something other than JSON"
        if isinstance(info, dict) and field in info:
            return None
        return f"GET {path} answered without a {field}"
    return said


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
        start_timeout: float | None = STARTUP_TIMEOUT_S,
        records: Path | None = None,
    ) -> None:
        self.model = model
        self.python = python
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.api_key = api_key_of(self.extra_args)
        """The server's `--api-key`, sent when the launcher asks it what it serves."""
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        cache = compile_cache({**os.environ, **(self.env or {})})
        self.first_start = start_timeout is None and first_start(cache)
        """Whether this is a first start (no compile cache), which gets FIRST_START_TIMEOUT_S."""
        self.start_timeout = start_timeout_of(start_timeout, self.first_start)
        """Seconds `start` waits for /health before it stops the server and fails."""
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        """time.monotonic() at the start, None before it."""
        self.exit_code: int | None = None
        """The server's exit status once it has exited on its own while serving, else None."""
        self.records = records
        """The folder where launches are recorded (`launched`); None: none recorded or looked for."""
        self.earlier = ""
        """What the start found of earlier runs' servers, in words ("" where nothing)."""
        self._record: Path | None = None
        self._copier: threading.Thread | None = None

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
        """Start the server and return once it answers as SGLang (within `timeout`, by default
        `start_timeout`); RuntimeError if it exits first, TimeoutError (the server stopped) if slower.

        The port was free when chosen, but another program may bind it before SGLang does (SGLang
        binds only once its model is loaded). A port answered by something other than SGLang, or one
        that SGLang exited on while something else held it, is given up for a fresh one, up to
        PORT_ATTEMPTS times, within the same time limit."""
        timeout = self.start_timeout if timeout is None else timeout
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.records is not None:
            self.earlier = launched.settle(self.records)
            if self.earlier:
                self._log_line(f"[dashboard] {self.earlier}")
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        taken: list[str] = []
        try:
            for _ in range(PORT_ATTEMPTS):
                process = self._spawn()
                holder = self._wait_until_serving(process, deadline, timeout)
                if holder is None:
                    return
                taken.append(f"port {self.port}: {holder}")
                self.stop()
                self._log_line(f"[dashboard] port {self.port} is held by another program ({holder}); next")
                self.port = free_port()
        except (RuntimeError, TimeoutError) as exc:
            if self.earlier:  # the likely cause of a GPU found full
                raise type(exc)(f"{exc}\n(found at this start: {self.earlier})") from None
            raise
        raise RuntimeError(
            "the SGLang server could not keep a port: another program took each one first"
            f" ({'; '.join(taken)})"
        )

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the server's process under its keeper (in a process group of their own), record it,
        and start the thread that logs its output."""
        env = {**os.environ, **self.env} if self.env is not None else None
        if shutil.which(self.python) is None:  # said here, not as the keeper's exit status
            raise FileNotFoundError(errno.ENOENT, "no Python to run the SGLang server", self.python)
        # Its own process group, so stop() ends the scheduler and detokenizer processes it spawns too.
        process = self.process = subprocess.Popen(
            lifetime.keeper_command(self.command(), STOP_TIMEOUT_S),
            stdout=subprocess.PIPE if self.log_path else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        if self.records is not None:
            self._record = launched.record(self.records, process.pid, self.port, self.model)
        if self.started_at is None:
            self.started_at = time.monotonic()
        if self.log_path is not None:
            assert process.stdout is not None
            self._copier = threading.Thread(
                target=copy_output,
                args=(process.stdout, self.log_path),
                name="sglang-server-log",
                daemon=True,
            )
            self._copier.start()
        return process

    def _wait_until_serving(
        self, process: subprocess.Popen[bytes], deadline: float, timeout: float
    ) -> str | None:
        """Poll until SGLang serves at the port (None) or another program is found holding it (what
        answered there); RuntimeError if the server exits or is stopped, TimeoutError (`timeout` s
        after the start) at `deadline`."""
        while time.monotonic() < deadline:
            if self.process is not process:  # `stop` ran (the dashboard is stopping) while it started
                raise RuntimeError("the SGLang server was stopped while it started")
            if process.poll() is not None:
                self._drain_output()
                if listening(self.port):  # it exited, and another program holds its port
                    return port_holder(self.url, self.api_key) or "a program listening there"
                raise RuntimeError(
                    f"the SGLang server exited with {process.returncode} while starting{self.log_tail()}"
                )
            if http_status(self.url + "/health") == 200:
                holder = port_holder(self.url, self.api_key)
                if holder is None:
                    return None
                if process.poll() is None:  # SGLang still loading: the answer came from someone else
                    return holder
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise TimeoutError(f"the SGLang server did not answer /health within {timeout:g} s{self.log_tail()}")

    def _log_line(self, line: str) -> None:
        """Add a line of the dashboard's own to the server's log (where there is one)."""
        if self.log_path is not None:
            with contextlib.suppress(OSError), self.log_path.open("a") as log:
                log.write(line + "\n")

    def starting_words(self, now: float | None = None) -> str:
        """How far the start is, for the page while it counts: seconds so far, of how many, and why
        that many on a first start."""
        if self.started_at is None:
            return "not started yet"
        elapsed = (time.monotonic() if now is None else now) - self.started_at
        why = (
            " (a first start: SGLang compiles its kernels, its compile cache being empty)"
            if self.first_start
            else ""
        )
        return f"{elapsed:.0f} s of at most {self.start_timeout:g} s{why}"

    def exited(self) -> int | None:
        """The server's exit status where it has exited by itself (not stopped by `stop`), else None."""
        process = self.process
        if process is None or process.poll() is None:
            return None
        self.exit_code = process.returncode
        self._drain_output()
        return self.exit_code

    def _drain_output(self, limit_s: float = 2.0) -> None:
        """Wait (briefly) until the server's last output is in its log."""
        if self._copier is not None:
            self._copier.join(limit_s)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server's output, to quote in an error ("" without a log)."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
            if len(text) < lines:  # just rotated: the lines before are in the backup
                backup = self.log_path.with_name(self.log_path.name + ".1")
                if backup.exists():
                    text = backup.read_text(errors="replace").splitlines() + text
        except OSError:
            return f"; its output was to go to {self.log_path}, which cannot be read"
        return f"; the end of its output ({self.log_path}):\n" + "\n".join(text[-lines:])

    def stop(self) -> None:
        """Terminate the server's process group; kill the group if the server does not exit within
        STOP_TIMEOUT_S, and kill what is left of it (a scheduler still loading) once it has."""
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
        launched.forget(self._record)
        self._record = None
        self._drain_output()

"""The backend in a child process, for app.py: its loop shares no interpreter lock with Gradio.

In one process, the page's threads and the backend's loop take turns holding the GIL, and the
trace then shows the page's work as stalls of the loop (tens of ms, measured). In its own process
the backend's loop only ever waits for its own work, which is what the trace is there to show.
The child builds the engine and servers (`servers`) from the parsed command line, listens, sends
their URLs (or why it could not listen) through a pipe, starts the engine, and serves until it is
terminated. The
engine starts after the server listens, so the page comes up at once and says what a long first
start is doing (a model download, a conversion) or why it failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection

from backend import lifetime

START_TIMEOUT_S = 60.0
"""How long app.py waits for the backend to listen (the engine then starts while the page runs)."""


STOP_TIMEOUT_S = 7.0
"""How long the backend may take to stop after SIGTERM before it is killed: longer than an SGLang
server it started takes to stop (3 s, then killed), so that server never outlives it, and short
enough that app.py and all it started are gone within a container's 10 s grace."""

CHILD_FAILED = "one of the engine's processes failed and sent SIGQUIT (the backend's log has its traceback)"
"""What the page says when an engine's child process signals that it failed (SGLang's scheduler
does, for one that cannot load the model)."""


def _stop_when_orphaned(parent: int, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Tie the backend to app.py's life (`backend.lifetime`): once app.py is gone, however it died,
    stop as on SIGTERM (the engine and a launched SGLang server stopped in turn), and exit outright
    after STOP_TIMEOUT_S if that stop hangs (what it started is tied to this process in turn)."""

    def gone() -> None:
        loop.call_soon_threadsafe(stop.set)
        threading.Timer(STOP_TIMEOUT_S, os._exit, (1,)).start()

    lifetime.tie_to_parent(parent, gone)


def _serve(args: argparse.Namespace, host: str, port: int, ready: Connection, parent: int) -> None:
    """Child process: build, start, report the URL, serve until SIGTERM or until app.py is gone."""
    import logging

    from backend.serving.flags import servers_from_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    closed: list[bool] = []
    """Holds True once the server closed (the engine stopped), also where Ctrl-C cut the run short."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        _stop_when_orphaned(parent, loop, stop)
        try:
            servers = servers_from_args(args, host, port)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which says it plainly
            ready.send(("error", str(exc) or type(exc).__name__, None))
            return

        def handle_signals() -> None:
            loop.add_signal_handler(signal.SIGTERM, stop.set)
            # An engine's child process (SGLang's scheduler) sends SIGQUIT when it fails; by default
            # that would end this process without a word.
            main = servers.main
            loop.add_signal_handler(
                signal.SIGQUIT, lambda: main.engine_lost(main.engine.lost_cause() or CHILD_FAILED)
            )

        handle_signals()
        try:
            # Listen at once: the page then shows what a long first start does, or why it failed.
            await servers.start(engine_in_background=True)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which says it plainly
            ready.send(("error", str(exc) or type(exc).__name__, None))
            return
        ready.send(("ready", servers.url, servers.experiment_url))
        settled = asyncio.create_task(servers.main.engine_settled(), name="engine settled")
        # An engine may put its own handlers on the loop as it starts (in-process SGLang does): this
        # process's stop stays this process's.
        settled.add_done_callback(lambda _: handle_signals())
        try:
            await stop.wait()
        finally:
            settled.cancel()
            await servers.close()
            closed.append(True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    if closed:
        # The engine and the server are stopped: exit without the interpreter's teardown (seconds
        # with torch loaded on a busy machine, out of a container's 10 s stop grace). Otherwise the
        # normal exit runs the atexit stops (a launched SGLang server's).
        logging.shutdown()
        os._exit(0)


class BackendProcess:
    """Starts the backend in a child process and waits until it serves."""

    def __init__(self, args: argparse.Namespace, host: str, port: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._parent, child = context.Pipe(duplex=False)
        # Not a daemon: a daemonic process may not start processes of its own, and in-process SGLang
        # starts its scheduler and detokenizer as children. `_stop_when_orphaned` ends it if app.py dies.
        self._process = context.Process(
            target=_serve, args=(args, host, port, child, os.getpid()), name="backend", daemon=False
        )
        self.experiment_url: str | None = None
        """The backend's experiment server (blocking-consumer runs on a loop of their own), once it serves."""

    def start_and_wait(self, timeout: float = START_TIMEOUT_S) -> str:
        """Start the child; its websocket URL once it serves, or RuntimeError saying why not."""
        self._process.start()
        if not self._parent.poll(timeout):
            self.stop()
            raise TimeoutError(f"the backend did not start within {timeout:g} s")
        try:
            status, detail, self.experiment_url = self._parent.recv()
        except EOFError:
            raise RuntimeError(
                f"the backend exited with status {self._process.exitcode} before serving"
            ) from None
        if status != "ready":
            self.stop()
            raise RuntimeError(f"the backend could not start: {detail}")
        return detail

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Terminate the child (it aborts its requests and stops its engine) and wait for it."""
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout)

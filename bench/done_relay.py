"""A websocket relay between a Gradio app and the backend that notes when each `done` frame passes.

The benchmarks that measure the page's end of stream (`bench/browser.py`, `bench/transport.py`'s
(c)) point `app.py --backend-url` at it: the backend's `done` for a request is then a time on this
host's monotonic clock, the same clock the benchmark reads the page's or client's updates on.
A helper those benchmarks import, not a benchmark: it prints nothing of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.request

from websockets.asyncio.client import connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from backend.frames import frames_in

RELAY_MAX_BYTES = 1 << 26
"""Largest frame the relay passes on: the app's own limit (ui/client.py), a full trace export."""


class DoneRelay:
    """A websocket relay between the app and the backend that notes when each `done` frame passes.

    Runs its own asyncio loop on a thread; the app is pointed at `url` with `--backend-url`. The
    backend's /health is passed through too (the page's engine line reads it).
    """

    def __init__(self, backend_port: int) -> None:
        self.backend = f"127.0.0.1:{backend_port}"
        self.done_at: dict[str, float] = {}
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="done relay", daemon=True)

    @property
    def url(self) -> str:
        """The websocket URL the app connects to."""
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self) -> None:
        """Listen on a free loopback port; returns once it does."""
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Close the server and end the thread."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._listen())
        self._ready.set()
        self._loop.run_forever()

    async def _listen(self) -> None:
        self._server = await serve(
            self._relay,
            "127.0.0.1",
            0,
            process_request=self._health,
            max_size=RELAY_MAX_BYTES,
            compression=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _health(self, connection: ServerConnection, request: Request) -> Response | None:
        if not request.path.startswith("/health"):
            return None

        def fetch() -> str:
            with urllib.request.urlopen(f"http://{self.backend}/health", timeout=5) as response:
                return response.read().decode()

        return connection.respond(200, await asyncio.to_thread(fetch))

    async def _relay(self, app: ServerConnection) -> None:
        assert app.request is not None
        headers = {
            k: app.request.headers[k]
            for k in ("Authorization", "X-Forwarded-For")
            if k in app.request.headers
        }
        async with connect(
            f"ws://{self.backend}/ws", additional_headers=headers, max_size=RELAY_MAX_BYTES, compression=None
        ) as backend:

            async def upstream() -> None:
                async for message in app:
                    await backend.send(message)

            async def downstream() -> None:
                async for message in backend:
                    if isinstance(message, str) and '"done"' in message:
                        now = time.monotonic()
                        for frame in frames_in(message):
                            if frame.get("type") == "done":
                                self.done_at[frame["id"]] = now
                    await app.send(message)

            tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

"""The UI's websocket client: one run = one connection to the backend, read by a background task.

The reader task applies every frame to a `RunView` as it arrives; `updates()` hands the view to the
page at most `1 / interval` times a second, so however fast tokens come, the browser gets a steady
frame rate. The reader belongs to the run, not to the Gradio event, so a Cancel (which Gradio
delivers by cancelling the Generate event) still sees the backend's final `finish` frames. After
`done` the connection stays open until `close()`, so the run's trace can still be exported. Every
frame also goes to the run's `RunRecorder`, so a finished run can be saved (`saved_run`) and replayed
(`replay`: a saved run streamed again by the backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from backend.frames import cancel_frame, encode, export_trace_frame, frames_in, generate_frame, replay_frame
from backend.saved_run import SavedRun, saved_run_dict
from ui.loop_watch import WATCH_EVERY_S, LoopWatch
from ui.run_recorder import RunRecorder
from ui.view import RunView

log = logging.getLogger("ui")

CONNECT_TIMEOUT_S = 5.0
"""How long to wait for the backend's websocket handshake before calling it unreachable."""

ACCEPT_TIMEOUT_S = 30.0
"""How long to wait for `accepted` (or an error) after sending `generate`."""

KEEPALIVE_S = 20.0
"""Keepalive ping interval (and timeout) of a run's connection: a backend that hangs is noticed."""

CLOSE_TIMEOUT_S = 10.0
"""How long a cancelled run keeps its connection open to collect the final frames."""

EXPORT_TIMEOUT_S = 30.0
"""How long to wait for a trace export (a large run's export is a few MB of JSON)."""

MAX_FRAME_BYTES = 1 << 26
"""Largest frame accepted from the backend: a trace export of a full ring buffer fits."""


def _reason(exc: BaseException) -> str:
    """Why a connection failed, without addresses (the page does not show the backend's)."""
    if isinstance(exc, InvalidStatus):
        return f"it answered HTTP {exc.response.status_code}"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc):
        return "connection refused"
    return type(exc).__name__


class BackendError(Exception):
    """The backend could not be reached, or refused the request; the message says which and why."""


class BackendRun:
    """One `generate` request and its connection, with a `RunView` kept current."""

    def __init__(
        self,
        url: str,
        request_id: str | None = None,
        token: str | None = None,
        client_address: str | None = None,
        blocks_loop: bool = False,
        watch: str | None = None,
    ) -> None:
        """`blocks_loop`: the run blocks the backend's loop on purpose (the blocking-consumer
        experiment), so its connection goes without keepalive pings; `watch`: the URL of the
        backend's watch of that loop (`ui.loop_watch`), read every WATCH_EVERY_S while it streams."""
        self.url = url
        self.blocks_loop = blocks_loop
        self.watch = watch
        self._watcher: asyncio.Task[None] | None = None
        self.token = token
        self.client_address = client_address
        self.request_id = request_id or f"r-{uuid.uuid4().hex[:8]}"
        self.view = RunView(self.request_id, started_at=time.monotonic())
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()
        self._exports: list[asyncio.Future[list[dict[str, Any]]]] = []
        self.recorder: RunRecorder | None = None
        """The run as a saved run, once it has started (`RunRecorder`)."""

    async def start(
        self, prompt: str, n: int, params: dict[str, Any], options: dict[str, Any] | None = None
    ) -> RunView:
        """Connect, send `generate` (with `options` such as consumer and fanout), wait for `accepted`.

        BackendError says why if that fails.
        """
        return await self._open(generate_frame(self.request_id, prompt, n, params, **(options or {})))

    async def replay(
        self, run: SavedRun, speed: float = 1.0, options: dict[str, Any] | None = None
    ) -> RunView:
        """Connect, send `replay` (the saved `run`, streamed `speed` times as fast as it was
        recorded, with `options` such as consumer and fanout), wait for `accepted`; as `start`. A
        continuation goes as a run of its own (the frame holds one run, not the one it continued)."""
        alone = dataclasses.replace(run, continues=None)
        frame = replay_frame(self.request_id, saved_run_dict(alone), speed=speed, **(options or {}))
        return await self._open(frame)

    async def _open(self, frame: dict[str, Any]) -> RunView:
        """Connect, send `frame`, wait for `accepted`; BackendError says why if that fails."""
        headers = {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.client_address:
            # The backend's per-address limits then apply to the page's user, not to this app.
            headers["X-Forwarded-For"] = self.client_address
        try:
            self._ws = await connect(
                self.url,
                open_timeout=CONNECT_TIMEOUT_S,
                max_size=MAX_FRAME_BYTES,
                additional_headers=headers,
                # A run that blocks the backend's loop on purpose (an experiment) would miss the
                # keepalive's pongs and be dropped; a backend that dies still closes the socket.
                ping_interval=None if self.blocks_loop else KEEPALIVE_S,
            )
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
            log.warning("cannot reach the backend at %s: %s", self.url, exc)
            raise BackendError(f"the backend is unreachable ({_reason(exc)}); is it running?") from None
        recorder = self.recorder = RunRecorder(frame)
        try:
            await self._ws.send(encode(frame))
            async with asyncio.timeout(ACCEPT_TIMEOUT_S):
                while not self.view.accepted:
                    # A batch may carry the first chunks with `accepted`: the view takes them all.
                    for reply in frames_in(await self._ws.recv()):
                        self.view.apply(reply, time.monotonic())
                        recorder.apply(reply)
                        if reply.get("type") == "error":
                            raise BackendError(f"the backend refused the request: {reply.get('message')}")
        except BackendError:
            await self.close()
            raise
        except (ConnectionClosed, TimeoutError, ValueError) as exc:
            await self.close()
            raise BackendError(f"the backend did not accept the request: {exc or 'timed out'}") from None
        self.view.started_at = time.monotonic()
        self._reader = asyncio.create_task(self._read(), name=f"run {self.request_id}")
        if self.watch is not None:
            self._watcher = asyncio.create_task(self._watch(self.watch), name=f"watch {self.request_id}")
        return self.view

    async def _watch(self, url: str) -> None:
        """Read the backend's watch of the blocked loop until the run ends; a failed reading is
        skipped (the run's own frames still say how it ends)."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(timeout=WATCH_EVERY_S * 4, headers=headers) as client:
            while not self.view.finished:
                try:
                    response = await client.get(url)
                    reading = LoopWatch.from_json(response.json(), time.monotonic())
                except (httpx.HTTPError, ValueError):
                    reading = None
                if reading is not None and not self.view.finished:
                    self.view.watched(reading)
                    self._changed.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WATCH_EVERY_S):
                        await self._finished.wait()

    async def _read(self) -> None:
        assert self._ws is not None and self.recorder is not None
        record = self.recorder.apply
        reason = None
        try:
            async for message in self._ws:
                now = time.monotonic()
                for frame in frames_in(message):  # orjson: ~3x json.loads; errors are ValueErrors
                    if frame.get("type") == "trace_export" or (
                        frame.get("type") == "error" and self._exports
                    ):
                        self._settle_export(frame)
                        continue
                    self.view.apply(frame, now)
                    record(frame)
                self._changed.set()
                if self.view.done_stats is not None:
                    self._finished.set()
        except ConnectionClosed as exc:
            reason = f"the backend closed the connection before the run ended ({exc})"
        except ValueError as exc:
            reason = f"the backend sent a message that is not a protocol frame: {exc}"
        else:
            if self.view.done_stats is None:
                reason = "the backend closed the connection before the run ended"
        finally:
            self.view.close(reason)
            self._finished.set()
            self._changed.set()
            self._settle_export({"type": "error", "message": "the connection to the backend closed"})
            await self._ws.close()

    def _settle_export(self, frame: dict[str, Any]) -> None:
        while self._exports:
            future = self._exports.pop(0)
            if future.done():
                continue
            if frame.get("type") == "trace_export":
                future.set_result(frame["traceEvents"])
            else:
                future.set_exception(BackendError(f"the trace could not be exported: {frame.get('message')}"))
            return

    async def export_trace(self) -> list[dict[str, Any]]:
        """The run's trace in Chrome trace-event format, asked of the backend on this connection."""
        if self._ws is None or self._reader is None or self._reader.done():
            raise BackendError("this run's connection is closed; generate again to export a trace")
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._exports.append(future)
        await self._ws.send(encode(export_trace_frame(self.request_id)))
        try:
            async with asyncio.timeout(EXPORT_TIMEOUT_S):
                return await future
        except TimeoutError:
            raise BackendError(f"the backend did not send the trace within {EXPORT_TIMEOUT_S:g} s") from None

    async def updates(self, interval: float) -> AsyncIterator[RunView]:
        """The view each time it changed, at most once per `interval` seconds, until the run ends."""
        loop = asyncio.get_running_loop()
        while True:
            await self._changed.wait()
            self._changed.clear()
            # Decided before yielding: the run may end while the consumer renders, and that
            # final state must still be yielded once more.
            finished = self.view.finished
            yielded_at = loop.time()
            yield self.view
            if finished:
                return
            # A frame clock: the consumer's render time counts toward the interval (sleeping a
            # whole interval after each render gave the page 5-7 updates a second, not 15), and
            # the end of the run is shown at once instead of at the next tick.
            remaining = yielded_at + interval - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._finished.wait()

    async def cancel(self, index: int | None = None) -> None:
        """Ask the backend to stop every sample, or only sample `index`."""
        if self._ws is None or self.view.finished:
            return
        if index is None:
            self.view.cancel_pressed(time.monotonic())
            self._changed.set()
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(encode(cancel_frame(self.request_id, index)))

    async def wait_finished(self, limit_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until the run has ended; False if it had not after `limit_s` seconds."""
        if self._reader is None:
            return True
        try:
            async with asyncio.timeout(limit_s):
                await self._finished.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Drop the connection (the backend then aborts whatever still runs)."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            await self._ws.close()

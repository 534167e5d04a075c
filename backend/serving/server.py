"""The websocket server: protocol v2 at ws://HOST:PORT/ws, on its own plain asyncio loop.

A thin I/O shell: each connection is a `ClientSession` (`connection`); the server listens, admits
connections (`admission`), answers `GET /health` with the engine's load and the tracer's cost,
checks the token and Origin, starts the engine (at once, or on a task while it listens) and says
when it is lost. The loop is traced by `LoopTracer`, and one `trace` task (`trace.feed`) sends every
traced connection its live frames.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import socket
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from backend.config.settings import SEND_BUFFER_BYTES, WS_MAX_MESSAGE_BYTES, ServerOptions
from backend.engines.base import Engine
from backend.frames import encode, error_frame
from backend.serving.admission import Admission, client_address
from backend.serving.connection import ClientSession, ServerSide
from backend.trace.feed import TraceFeed
from backend.trace.recorder import NOT_BUILT as TRACER_NOT_BUILT
from backend.trace.recorder import LoopTracer
from backend.trace.recorder import available as tracer_available

log = logging.getLogger("backend")

STARTING, READY, FAILED, LOST = "starting", "ready", "failed", "lost"
"""The engine's state as /health reports it (`BackendServer.engine_state`): LOST is an engine that
was serving when a process of its own died."""

LOST_CHECK_S = 1.0
"""How often the backend asks a ready engine whether a process of its own has gone."""

WS_PATH = "/ws"
HEALTH_PATH = "/health"
EXPERIMENT_LOOP_PATH = "/experiment/loop"
"""The experiment loop watched from this server's loop (`ExperimentServer.watch`), as JSON."""


class BackendServer:
    """The websocket server in front of an engine, on the running loop.

    It starts the engine (`start`) and watches it, but does not stop it: the engine is its owner's
    (`backend.serving.servers.Servers`), which may put more than one server in front of it.
    """

    def __init__(self, engine: Engine, options: ServerOptions | None = None) -> None:
        """`options.trace`: trace this loop, where the tracer's C parts are built (else it serves
        untraced and says why in `trace_off` and `/health`)."""
        options = options or ServerOptions()
        self.engine = engine
        self.options = options
        self.limits = options.limits
        self.host = options.host
        self.port = options.port
        self.sessions: set[ClientSession] = set()
        self.trace_off: str | None = None
        """Why this server does not trace its loop, or None when it does."""
        if not options.trace:
            self.trace_off = "tracing is off on this server (--no-trace)"
        elif not tracer_available():
            self.trace_off = f"tracing is off on this server: {TRACER_NOT_BUILT}"
            log.warning("%s", self.trace_off)
        self.tracer = LoopTracer() if self.trace_off is None else None
        self.feed = TraceFeed(self.tracer) if self.tracer is not None else None
        self._feed_task: asyncio.Task[None] | None = None
        self.admission = Admission(self.limits)
        self.experiment_url: str | None = None
        """Where this server's clients send blocking-consumer runs (they are refused here, with this
        URL), or None: it runs them itself. Set by whoever runs that server, before `start`."""
        self.experiment_watch: Callable[[], dict[str, Any]] | None = None
        """That server's loop read from outside (`ExperimentServer.watch`), answered at
        EXPERIMENT_LOOP_PATH; None where there is none."""
        self._side: ServerSide | None = None
        self._server: Server | None = None
        self._labels = itertools.count(1)
        self.engine_state = STARTING
        """STARTING until the engine's start returned, then READY, or FAILED with `engine_error`."""
        self.engine_error: str | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._lost_watch: asyncio.Task[None] | None = None

    async def start(self, engine_in_background: bool = False) -> None:
        """Trace this loop, start the engine, then listen; `port` becomes the bound port.

        With `engine_in_background` (app.py's backend), listen at once and start the engine on a
        task: the page can then say what a long first start is doing (a download, a conversion),
        and what went wrong where it fails, while requests get an `engine_not_ready` error.
        """
        if self.tracer is not None:
            self.tracer.install(asyncio.get_running_loop())
        if self.feed is not None:
            self._feed_task = asyncio.create_task(self.feed.run(), name="trace")
        self._side = ServerSide(
            self.engine,
            limits=self.limits,
            tracer=self.tracer,
            feed=self.feed,
            admission=self.admission,
            log_prompts=self.options.log_prompts,
            trace_off=self.trace_off or "tracing is off on this server",
            engine_problem=self.engine_problem,
            experiment_url=self.experiment_url,
        )
        if engine_in_background:
            self._engine_task = asyncio.create_task(self._start_engine(), name="engine start")
        else:
            await self.engine.start()
            self.engine_state = READY
        self._lost_watch = asyncio.create_task(self._watch_engine(), name="engine watch")
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._process_request,
            max_size=WS_MAX_MESSAGE_BYTES,
            # permessage-deflate cost more CPU per small chunk frame than the rest of its sending,
            # and its clients are on the same host (the page's server side) or a LAN.
            compression=None,
            # Browsers send Origin: only the listed pages may connect; clients without one (the
            # Gradio app's server side, scripts) may. This stops other sites' pages hijacking it.
            origins=[None, *self.options.allowed_origins],
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("serving %s engine (%s) at %s", self.engine.name, self.engine.model, self.url)

    def engine_problem(self) -> str | None:
        """Why the engine cannot take requests now (still starting, failed to, or lost), or None."""
        if self.engine_state == READY:
            cause = self.engine.lost_cause()
            if cause is None:
                return None
            self.engine_lost(cause)
        if self.engine_state == FAILED:
            return f"the {self.engine.name} engine could not start: {self.engine_error}"
        if self.engine_state == LOST:
            return (
                f"the {self.engine.name} engine stopped working: {self.engine_error}; restart the dashboard"
            )
        detail = self.engine.health().get("loading_status")
        doing = f" ({detail})" if detail else ""
        return f"the {self.engine.name} engine is still starting{doing}; try again in a moment"

    async def engine_settled(self) -> None:
        """Return once the engine's start has ended, ready or failed (at once without a background start)."""
        if self._engine_task is not None:
            await asyncio.gather(asyncio.shield(self._engine_task), return_exceptions=True)

    def engine_lost(self, reason: str) -> None:
        """The engine can no longer serve (a process of its own died): say so to /health and to every
        new request, instead of going on as if it could, and end the requests it was running with
        an `engine_lost` error (they would wait for chunks that never come). The first cause stays."""
        if self.engine_state == LOST:
            return
        self.engine_error = reason
        if self.engine_state != READY:
            self.engine_state = FAILED  # the start then fails, saying this
            log.error("the %s engine failed while starting: %s", self.engine.name, reason)
            return
        self.engine_state = LOST
        log.error("the %s engine failed while serving: %s", self.engine.name, reason)
        for session in self.sessions:
            session.end_requests("engine_lost", self.engine_problem() or reason)

    async def _watch_engine(self) -> None:
        """Ask the ready engine every LOST_CHECK_S whether a process of its own has gone
        (`Engine.lost_cause`); the first cause ends its running requests (`engine_lost`)."""
        while True:
            await asyncio.sleep(LOST_CHECK_S)
            if self.engine_state != READY:
                continue
            cause = self.engine.lost_cause()
            if cause is not None:
                self.engine_lost(cause)
                return

    async def _start_engine(self) -> None:
        try:
            await self.engine.start()
        except Exception as exc:  # noqa: BLE001 - kept for /health and every request's error frame
            reason = str(exc) or type(exc).__name__
            if self.engine_error:  # what was seen while it started (a child process that died)
                reason = f"{reason} ({self.engine_error})"
            self.engine_error = reason
            self.engine_state = FAILED
            log.error("the %s engine could not start: %s", self.engine.name, self.engine_error)
            return
        if self.engine_state == FAILED:
            return
        self.engine_state = READY
        log.info("the %s engine is ready (%s)", self.engine.name, self.engine.model)

    @property
    def url(self) -> str:
        """The websocket URL clients connect to."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}{WS_PATH}"

    async def close(self) -> None:
        """Stop listening and close every connection (aborting its requests); the engine stays
        (its owner stops it)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in (self._engine_task, self._lost_watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._feed_task is not None:
            self._feed_task.cancel()
            await asyncio.gather(self._feed_task, return_exceptions=True)
        if self.tracer is not None:
            self.tracer.uninstall()

    def health(self) -> dict[str, Any]:
        """What /health reports: the engine's load and the open connections."""
        return {
            "status": "ok",
            **self.engine.health(),
            "engine_state": self.engine_state,
            "engine_error": self.engine_error,
            "connections": len(self.sessions),
            "active_requests": sum(len(s.requests) for s in self.sessions),
            "n_max": self.limits.n_max,
            "max_tokens_max": self.limits.max_tokens_max,
            "experiment_url": self.experiment_url,
            "trace": {"off": self.trace_off}
            if self.tracer is None
            else {
                "events_recorded": self.tracer.recorded,
                "events_kept": self.tracer.kept,
                "overhead_per_event_ns": round(self.tracer.overhead_per_event_ns(), 1),
            },
        }

    async def _handle(self, ws: ServerConnection) -> None:
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        peer = str(ws.remote_address[0]) if ws.remote_address else ""
        address = client_address(peer, ws.request.headers.get("X-Forwarded-For") if ws.request else None)
        refusal = self.admission.connect(address)
        if refusal is not None:
            log.warning("refusing a connection from %s: %s", address, refusal)
            await ws.send(encode(error_frame("too_many_connections", refusal)))
            await ws.close(1008, "too many connections")
            return
        assert self._side is not None, "connections come only once the server started"
        session = ClientSession(ws, self._side, f"c{next(self._labels)}", address)
        self.sessions.add(session)
        if self.feed is not None:
            self.feed.add(session)
        log.info("client %s connected from %s", session.label, address)
        try:
            await session.serve()
        finally:
            self.sessions.discard(session)
            if self.feed is not None:
                self.feed.discard(session)
            self.admission.disconnect(address)
            log.info("client %s left", session.label)

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == HEALTH_PATH:
            return _json_response(HTTPStatus.OK, self.health())
        if path not in (WS_PATH, EXPERIMENT_LOOP_PATH):
            return connection.respond(HTTPStatus.NOT_FOUND, f"the websocket endpoint is {WS_PATH}\n")
        if self.options.token is not None and not self._authorised(request):
            return connection.respond(
                HTTPStatus.UNAUTHORIZED, "this backend needs its token: Authorization: Bearer <token>\n"
            )
        if path == EXPERIMENT_LOOP_PATH:
            if self.experiment_watch is None:
                return connection.respond(HTTPStatus.NOT_FOUND, "this backend runs no experiment server\n")
            return _json_response(HTTPStatus.OK, self.experiment_watch())
        return None

    def _authorised(self, request: Request) -> bool:
        token = self.options.token
        assert token is not None
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        return hmac.compare_digest(given.encode(), token.encode())


def _json_response(status: HTTPStatus, body: dict[str, Any]) -> Response:
    data = (encode(body) + "\n").encode()
    headers = Headers(
        [("Content-Type", "application/json"), ("Content-Length", str(len(data))), ("Connection", "close")]
    )
    return Response(status.value, status.phrase, headers, data)

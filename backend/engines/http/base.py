"""What the HTTP engines (SGLang's native API, OpenAI-compatible servers) share.

`HTTPEngine` owns one async HTTP client per server, checks the server at start-up and every few
seconds after (so the page can say it is down, and the dashboard recovers when it comes back), and
reports that in `model` and `health()`. `StreamingGeneration` reads one streamed response on a task
of its own into a queue; the parsing is the sans-I/O parser of `backend.engines.http.streams`. Closing
the response (cancelling that task) closes the connection, which makes both SGLang and vLLM abort
the request's samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from backend.engines.base import Engine, QueuedGeneration
from backend.engines.http.streams import SSEDecoder, StreamProtocolError, StreamState
from backend.vocabulary import Chunk

# httpx is imported in the functions that use it: `import httpx` loads its command line too (rich,
# click, pygments: 7 MB and 130 modules), and every backend imports this module for its settings.
if TYPE_CHECKING:
    import httpx

log = logging.getLogger("backend.engines.http")

CONNECT_TIMEOUT_S = 5.0
"""How long to wait for a TCP connection to the server: a dead host must fail fast, not hang the request."""

PROBE_TIMEOUT_S = 10.0
"""Limit of one health/model probe; a server busy generating still answers these within it."""

CONTROL_TIMEOUT_S = 10.0
"""Limit of an abort call: the server answers it at once, even while generating."""

HEALTH_INTERVAL_S = 5.0
"""Seconds between health checks: how soon the page learns the server went away or came back."""

ABORT_GRACE_S = 10.0
"""After a cancel, how long the server may take to end the stream before it is cut off locally."""

MAX_CONNECTIONS = 256
"""Open connections to the server at once: one per running request plus abort calls."""


class EngineUnavailable(RuntimeError):
    """The server could not be reached or refused the request; the message says which and why."""


def refused_key(status: int, api_key: str, setting: str) -> str:
    """What an HTTP status says about the API key, in words for the page, or "" when it is not about
    the key: 401 and 403 are the servers' answers to a missing or wrong key."""
    if status not in (401, 403):
        return ""
    if not api_key:
        return f"the server refused the request without an API key (HTTP {status}); set {setting}"
    return f"the server refused the API key (HTTP {status}); check {setting}"


class HTTPEngine(Engine):
    """An engine that is a server at `url`, checked at start-up and every HEALTH_INTERVAL_S after."""

    label = "server"
    """How the server is named in messages ("SGLang", "OpenAI-compatible server")."""

    key_setting = "the API key"
    """Where the user sets the server's API key (a flag and its environment variable)."""

    def __init__(self, url: str, api_key: str = "") -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the {self.label} URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.api_key = api_key
        """Sent as `Authorization: Bearer` on every call, for a server started with an API key."""
        self.served_model: str | None = None
        self.server_error: str | None = "not checked yet"
        self._client: httpx.AsyncClient | None = None
        self._monitor: asyncio.Task[None] | None = None
        self.generations: set[StreamingGeneration] = set()
        self.has_template: bool | None = None
        """Whether the served model has a chat template, as the server's /tokenize said (None: not
        asked yet, or the server has no /tokenize)."""
        self.no_template_note = ""
        self._template_model: str | None = None
        """The model `has_template` was asked for: asked again when the server serves another."""

    @property
    def client(self) -> httpx.AsyncClient:
        """The HTTP client, made on first use on the running loop."""
        import httpx

        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=headers,
                timeout=httpx.Timeout(PROBE_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=16),
            )
        return self._client

    @property
    def model(self) -> str:
        if self.server_error is not None:
            return f"{self.label} at {self.url}: {self.server_error}"
        return self.served_model or f"{self.label} at {self.url}"

    async def start(self) -> None:
        """Check the server once (a failure is reported, not raised), then keep checking."""
        await self.check()
        self._monitor = asyncio.create_task(self._watch(), name=f"{self.name}-health")

    async def stop(self) -> None:
        """Stop checking, close every running request's stream and the client."""
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        await asyncio.gather(*(g.aclose() for g in list(self.generations)), return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def chat_template(self) -> bool | None:
        return self.has_template

    @property
    def template_note(self) -> str:
        return self.no_template_note

    async def check(self) -> bool:
        """Probe the server now; afterwards `server_error` is None when it is healthy."""
        import httpx

        try:
            self.served_model = await self.probe()
            if self.served_model != self._template_model:
                await self.probe_template()
                self._template_model = self.served_model
        except (httpx.HTTPError, EngineUnavailable, ValueError) as exc:
            error = describe_http_error(exc)
            if error != self.server_error:
                log.warning("%s at %s: %s", self.label, self.url, error)
            self.server_error = error
            return False
        if self.server_error is not None:
            log.info("%s at %s is up, serving %s", self.label, self.url, self.served_model)
        self.server_error = None
        return True

    @abstractmethod
    async def probe(self) -> str:
        """Ask the server whether it is healthy and what it serves; the model name, or raise."""

    async def probe_template(self) -> None:
        """Ask the server's `/tokenize` (SGLang and vLLM both have it) to render a chat turn: whether
        the served model has a chat template, and if not what the server says."""
        body = {"model": self.served_model, "messages": [{"role": "user", "content": "Hello"}]}
        response = await self.post_tokenize(body)
        if response.status_code == 200:
            self.has_template, self.no_template_note = True, ""
        elif response.status_code in (404, 405):
            self.has_template, self.no_template_note = None, "the server has no /tokenize to ask"
        elif refused := self.refused(response.status_code):
            raise EngineUnavailable(refused)
        elif response.status_code < 500:
            self.has_template = False
            self.no_template_note = f"the server says: {error_detail(response.text)}"
        else:
            raise EngineUnavailable(
                f"POST /tokenize answered HTTP {response.status_code}: {response.text[:200]}"
            )

    async def post_tokenize(self, body: dict[str, Any]) -> httpx.Response:
        """`POST /tokenize` with `body` to the server (an engine behind a router that does not
        forward it sends it to a worker)."""
        return await self.client.post("/tokenize", json=body)

    async def chat_token_ids(self, messages: list[dict[str, str]], continued: bool = False) -> list[int]:
        """The prompt tokens of `messages` in the served model's chat template, rendered by the
        server's `/tokenize` with the assistant's turn opened; `continued`: the last message is the
        start of the assistant's answer, continued rather than closed (`continue_final_message`)."""
        import httpx

        # Without add_generation_prompt both servers render as for a chat completion: the
        # assistant's turn opened (SGLang refuses the flag for its own named templates).
        body: dict[str, Any] = {"model": self.served_model, "messages": messages}
        if continued:
            body["continue_final_message"] = True
        try:
            response = await self.post_tokenize(body)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(
                f"{self.label} could not render the chat template: {describe_http_error(exc)}"
            ) from exc
        if response.status_code != 200:
            detail = self.refused(response.status_code) or error_detail(response.text)
            raise EngineUnavailable(
                f"{self.label} could not render the chat template (POST /tokenize answered HTTP "
                f"{response.status_code}: {detail})"
            )
        tokens = response.json().get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineUnavailable(f"{self.label}'s /tokenize answered without a token list")
        return tokens

    async def get_json(self, path: str) -> Any:
        """GET `path` as JSON; EngineUnavailable on a non-2xx answer."""
        response = await self.client.get(path)
        if refused := self.refused(response.status_code):
            raise EngineUnavailable(refused)
        if response.status_code >= 300:
            raise EngineUnavailable(f"GET {path} answered HTTP {response.status_code}: {response.text[:200]}")
        return response.json()

    def refused(self, status: int) -> str:
        """`refused_key` for this server's key and setting."""
        return refused_key(status, self.api_key, self.key_setting)

    def mark_unreachable(self, error: str) -> None:
        """A request failed to connect: report the server down until the next good check."""
        self.server_error = error

    def health(self) -> dict[str, Any]:
        return {
            **super().health(),
            "server": self.url,
            "server_ok": self.server_error is None,
            "server_error": self.server_error,
            "running_requests": len(self.generations),
            "running_samples": sum(len(g.state.unfinished) for g in self.generations),
        }

    async def failure_cause(self) -> str | None:
        """What is known of why a stream from the server broke (a server this dashboard started
        that exited), to say with the transport's error; None where nothing more is known."""
        return None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self.check()


def error_detail(body: str) -> str:
    """The message of a server's JSON error body (OpenAI-style `{"error": {"message"}}`, FastAPI's
    `{"detail"}`, SGLang's `{"message"}`), or the body's start."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:300]
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        for key in ("message", "detail", "error"):
            if isinstance(payload.get(key), str):
                return payload[key][:300]
    return body[:300]


def describe_http_error(exc: BaseException) -> str:
    """A one-line reason for a failed call, without a traceback."""
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"unreachable ({exc or 'connection refused'})"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer in time ({type(exc).__name__})"
    return str(exc) or type(exc).__name__


class StreamingGeneration(QueuedGeneration):
    """One streamed request: a reader task feeds parsed chunks (or the failure) into a queue."""

    def __init__(self, engine: HTTPEngine, state: StreamState) -> None:
        self.engine = engine
        self.state = state
        super().__init__(state.n, engine.generations)
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._reader = asyncio.create_task(self._read(), name=f"{engine.name}-stream")

    @abstractmethod
    def request(self) -> tuple[str, dict[str, Any]]:
        """The path and JSON body of the streaming request."""

    def on_payload(self, payload: str) -> list[Chunk]:
        """Parse one SSE payload; subclasses hook in here to act on what they learn."""
        return self.state.feed(payload)  # type: ignore[attr-defined]

    def tail(self) -> list[Chunk]:
        """Chunks the parser still holds when the stream ended."""
        return []

    async def prepare(self) -> None:
        """Work before the streaming request is sent (say, rendering the chat template)."""

    async def _read(self) -> None:
        import httpx

        label, url = self.engine.label, self.engine.url
        try:
            await self.prepare()
        except EngineUnavailable as exc:
            self._queue.put_nowait(exc)
            return
        path, body = self.request()
        try:
            async with self.engine.client.stream(
                "POST", path, json=body, timeout=self._timeout()
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:500]
                    detail = self.engine.refused(response.status_code) or detail
                    raise EngineUnavailable(
                        f"{label} answered POST {path} with HTTP {response.status_code}: {detail}"
                    )
                decoder = SSEDecoder()
                async for data in response.aiter_bytes():
                    for payload in decoder.feed(data):
                        self._put(self.on_payload(payload))
                    if self.state.done:
                        break
                for payload in decoder.close():
                    self._put(self.on_payload(payload))
            self._put(self.tail())
            if self.state.unfinished:
                cause = await self.engine.failure_cause()
                because = f"; {cause}" if cause else ""
                self._put(
                    self.state.fail_unfinished(
                        f"{label} ended the stream before the sample finished{because}"
                    )
                )
        except httpx.HTTPError as exc:
            reason = describe_http_error(exc)
            if isinstance(exc, httpx.ConnectError):
                self.engine.mark_unreachable(reason)
            cause = await self.engine.failure_cause()
            because = f"; {cause}" if cause else ""
            self._queue.put_nowait(EngineUnavailable(f"{label} at {url}: {reason}{because}"))
        except (EngineUnavailable, StreamProtocolError) as exc:
            self._queue.put_nowait(exc)

    def _timeout(self) -> httpx.Timeout:
        # No read limit: a queued request may wait long for its first token; cancel ends it instead.
        import httpx

        return httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)

    def _put(self, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            self._queue.put_nowait(chunk)

    async def close_stream(self, finish_as: str = "abort") -> None:
        """Close the connection (the server aborts what still runs); open samples end as `finish_as`."""
        if not self._reader.done():
            self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        for index in self.state.unfinished:
            self.state.samples[index].finished = True
            self._queue.put_nowait(Chunk(index, "", 0, finish_as))

    def spawn(self, coroutine: Any) -> None:
        """Run a side call (an abort) that aclose waits for."""
        task = asyncio.create_task(coroutine)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def cut_off_after_grace(self) -> None:
        """After a cancel: let the server end the stream, or close it after ABORT_GRACE_S."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), ABORT_GRACE_S)
            return
        log.warning(
            "%s did not end the stream %g s after a cancel; closing it", self.engine.label, ABORT_GRACE_S
        )
        await self.close_stream("abort")

    async def aclose(self) -> None:
        await self.close_stream("abort")
        # Abort calls in flight end by themselves (CONTROL_TIMEOUT_S); cutting them off could leave
        # a sample running on the server.
        await asyncio.gather(*self._side_tasks, return_exceptions=True)
        self.engine.generations.discard(self)

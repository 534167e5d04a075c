"""A loop of its own for experiments that block: the page's blocking-consumer runs, apart from everyone else.

The "blocking" consumer holds the loop that consumes its streams for `block_ms` per chunk, on
purpose: that is the lesson. On the loop every client shares, one person's experiment stalled
every other person's columns for as long as it ran (32 s measured, `python -m bench.blocking_neighbour`).
So the backend runs a second websocket server, the experiment server, on a second asyncio loop in
a thread of the same process, traced by a tracer of its own. The page sends blocking runs there:
the experimenter's loop is really blocked, measured and shown in their trace, while the main loop
goes on serving everyone else's streams; one blocking experiment runs there at a time
(`Limits.max_blocking_requests`), so two experimenters do not stall each other either.

Both servers drive the one engine: the experiment server's engine is a `BridgedEngine`, which
starts each generation on the main loop (the engine's own) and hands its chunks across with
`call_soon_threadsafe`, as the embedded engine's reader thread hands chunks to the main loop.
Both loops are Python threads of one process: while the experiment's loop blocks, the main loop
gets the interpreter lock back at every switch interval (`sys.getswitchinterval()`, 5 ms), so the
other clients' streams go on, a few milliseconds slower per step (docs/trace.md, "Other clients").

A blocked loop sends nothing, not even its own trace: `watch` reads it from outside, on the main
loop's thread (the main server's `/experiment/loop`, which the page asks twice a second while a
blocking run streams): how long the step running now has run, how late its heartbeat is, the
chunks it took in that step (their frames wait for it) and the chunks the engine has handed over
that it has not yet taken (`BridgedEngine.waiting`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from backend.config.settings import ServerOptions
from backend.engines.base import Engine, FormatChoice, Generation, RequestRejected
from backend.saved_run import SavedRun
from backend.serving.server import BackendServer
from backend.trace.frames import loop_watch
from backend.vocabulary import Chunk, Prompt, SamplingParams

log = logging.getLogger("backend")

START_TIMEOUT_S = 10.0
"""How long the main server waits for the experiment server's thread to listen."""

_END = object()
"""Put on a bridged generation's queue after the engine's last chunk."""


class BridgedEngine(Engine):
    """An engine of another loop as seen from the experiment loop: generations run on `engine_loop`."""

    def __init__(
        self,
        engine: Engine,
        engine_loop: asyncio.AbstractEventLoop,
        engine_problem: Callable[[], str | None],
    ) -> None:
        """`engine_problem`: why the engine cannot take requests now (the main server knows: the
        engine starts there), or None."""
        self.engine = engine
        self.engine_loop = engine_loop
        self.engine_problem = engine_problem
        self.name = self.engine.name
        self.handed = 0
        """Chunks handed across to this loop (counted on the engine's loop)."""
        self.taken = 0
        """Chunks this loop has taken (counted on this loop)."""

    @property
    def waiting(self) -> int:
        """Chunks the engine has produced that this loop has not taken yet: a blocked loop's backlog."""
        return self.handed - self.taken

    @property
    def model(self) -> str:
        """The main engine's model."""
        return self.engine.model

    @property
    def chat_template(self) -> bool | None:
        """The main engine's answer."""
        return self.engine.chat_template

    @property
    def template_note(self) -> str:
        """The main engine's note."""
        return self.engine.template_note

    @property
    def plays(self) -> SavedRun | None:  # type: ignore[override]
        """The main engine's saved run, where it plays one."""
        return self.engine.plays

    @property
    def task_prefix(self) -> str:
        """The main engine's: its tasks run on the main loop."""
        return self.engine.task_prefix

    def choose_format(self, text: str, requested: str | None, system: str = "") -> FormatChoice:
        """As the main engine chooses."""
        return self.engine.choose_format(text, requested, system)

    def validate(self, prompt: Prompt, n: int, params: SamplingParams) -> None:
        """The main engine must be ready (it starts on the main loop), then its own checks."""
        problem = self.engine_problem()
        if problem is not None:
            raise RequestRejected("engine_not_ready", problem)
        self.engine.validate(prompt, n, params)

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        """Start the request on the engine's loop; its chunks arrive on this loop."""
        return BridgedGeneration(self, lambda: self.engine.generate(prompt, n, params))

    def health(self) -> dict[str, Any]:
        """The main engine's figures."""
        return self.engine.health()


class BridgedGeneration(Generation):
    """A generation running on the engine's loop, iterated from the experiment loop."""

    def __init__(self, bridge: BridgedEngine, start: Callable[[], Generation]) -> None:
        self._bridge = bridge
        self._engine_loop = bridge.engine_loop
        self._here = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._inner: Generation | None = None
        self._listener: Callable[[int], None] | None = None
        self._pump: Future[None] = asyncio.run_coroutine_threadsafe(self._run(start), self._engine_loop)

    def _hand_over(self, item: Any) -> None:
        self._here.call_soon_threadsafe(self._queue.put_nowait, item)

    async def _run(self, start: Callable[[], Generation]) -> None:
        """On the engine's loop: start the generation and pass each chunk (or its failure) across."""
        try:
            self._inner = start()
            if self._listener is not None:
                listener, here = self._listener, self._here
                self._inner.watch_queue(lambda position: here.call_soon_threadsafe(listener, position))
            async for chunk in self._inner:
                self._bridge.handed += 1
                self._hand_over(chunk)
        except Exception as exc:  # noqa: BLE001 - raised again on the experiment loop
            self._hand_over(exc)
        finally:
            self._hand_over(_END)

    async def __anext__(self) -> Chunk:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stays ended
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        self._bridge.taken += 1
        return item

    def watch_queue(self, listener: Callable[[int], None]) -> None:
        """Queue positions, called on the experiment loop."""
        self._listener = listener

    async def _on_engine_loop(self, call: Callable[[Generation], Coroutine[Any, Any, None]]) -> None:
        async def run() -> None:
            if self._inner is not None:
                await call(self._inner)

        if self._engine_loop.is_closed():
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._engine_loop))

    async def abort(self, index: int | None = None) -> None:
        """Abort on the engine's loop."""
        await self._on_engine_loop(lambda inner: inner.abort(index))

    async def aclose(self) -> None:
        """Close on the engine's loop, then stop passing chunks across."""
        await self._on_engine_loop(lambda inner: inner.aclose())
        self._pump.cancel()


class ExperimentServer:
    """The experiment server: a `BackendServer` for `engine` on a loop of its own, in a thread of this
    process; `options` are the main server's (its port is `options.experiment_port`)."""

    def __init__(
        self, engine: Engine, engine_problem: Callable[[], str | None], options: ServerOptions
    ) -> None:
        self.engine = engine
        self.engine_problem = engine_problem
        # One experiment at a time, one request's worth of samples: it has this loop to itself.
        limits = replace(options.limits, max_blocking_requests=1, max_total_samples=options.limits.n_max)
        self.options = replace(
            options, limits=limits, port=options.experiment_port or 0, experiment_port=None
        )
        self.server: BackendServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str | None:
        """Its websocket URL once it listens."""
        return self.server.url if self.server is not None else None

    async def start(self) -> None:
        """Start the thread and wait (without blocking the main loop) until it listens."""
        engine_loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._serve, args=(engine_loop,), name="experiment loop", daemon=True
        )
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, START_TIMEOUT_S)
        if self._error is not None:
            raise RuntimeError(f"the experiment server could not start: {self._error}")
        if not ready:
            raise RuntimeError(f"the experiment server did not listen within {START_TIMEOUT_S:g} s")
        log.info("blocking experiments run on their own loop at %s", self.url)

    def _engine_here(self, engine_loop: asyncio.AbstractEventLoop) -> Engine:
        """The engine as this loop drives it: bridged to its own loop, unless it holds nothing on one."""
        if self.engine.runs_on_any_loop:
            return self.engine
        return BridgedEngine(self.engine, engine_loop, self.engine_problem)

    def _serve(self, engine_loop: asyncio.AbstractEventLoop) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            server = BackendServer(self._engine_here(engine_loop), self.options)
            try:
                await server.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                raise
            self.server = server
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await server.close()

        try:
            asyncio.run(main())
        except Exception:  # reported through `_error`, or logged
            if self._ready.is_set() and self._error is None:
                log.exception("the experiment server failed")

    def watch(self) -> dict[str, Any]:
        """Its loop now, read from another thread (`trace.frames.loop_watch`): the step running and
        how long it has run, the heartbeat's lag, the chunks taken in that step and the chunks still
        waiting in the engine's hand-over. A loop without a tracer says why not."""
        server = self.server
        if server is None or server.tracer is None:
            why = server.trace_off if server is not None else None
            return {"off": why or "the experiment loop is not up"}
        tracer = server.tracer
        now = time.perf_counter_ns()
        engine = server.engine
        waiting = engine.waiting if isinstance(engine, BridgedEngine) else None
        try:
            running = [rid for session in list(server.sessions) for rid in list(session.requests)]
        except RuntimeError:  # changed while read: the loop is not blocked then
            running = []
        return loop_watch(tracer.stall(now), now, tracer.origin_ns, waiting, running)

    async def close(self) -> None:
        """Close its connections (aborting their requests) and end the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, START_TIMEOUT_S)

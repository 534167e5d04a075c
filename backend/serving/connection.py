"""One websocket client's connection: its receive loop, its send loop and a task per request.

`ClientSession` parses each frame (`protocol`), starts, cancels and exports requests, consumes each
request's engine stream in a task of its own (`consume r1 @c1`) with the teaching modes (cooperative,
greedy, blocking), and writes frames through its outbox (`outbox`) from one send loop
(`send @c1`): the frames ready at a write go as one message, a batch (`frames.batch_messages`).
Closing the connection aborts its requests in the engine.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from backend.config.settings import (
    OUTBOX_MAX_FRAMES,
    SEED_MAX,
    Limits,
)
from backend.engines import replaying
from backend.engines.base import Engine, Generation, RequestRejected
from backend.engines.cumulative import CumulativeGeneration, DeltaReader
from backend.frames import (
    accepted_frame,
    batch_messages,
    cancel_ack_frame,
    error_frame,
    logprob_pieces,
    queued_frame,
    trace_export_frame,
)
from backend.protocol import (
    CancelCommand,
    ExportTraceCommand,
    GenerateCommand,
    ProtocolError,
    parse_client_frame,
    replayed_command,
)
from backend.serving.admission import Admission
from backend.serving.fanout import FanoutGeneration
from backend.serving.outbox import Outbox
from backend.serving.request import RequestState, RunningRequest
from backend.trace.feed import TraceFeed
from backend.trace.frames import chrome_trace
from backend.trace.prefill import PrefillLog
from backend.trace.reads import ReadLog
from backend.trace.recorder import LoopTracer
from backend.vocabulary import Chunk, Prompt, SamplingParams

log = logging.getLogger("backend")

SEND_INTERVAL_S = 0.004
"""Longest a connection's pending frames wait for more to join them in one socket write.

Every write costs a system call and a wake-up of the reader; written per token, n = 64 samples at
500 tokens/s each were 32,000 writes a second, more than the whole server could do. The send loop
writes when a burst of frames ends (a loop iteration adds none), so chunks that come together
(all samples of a step) go in one write at once; while frames keep coming (see BURST_POLLS) it
writes this often.
"""

BURST_POLL_S = 0.001
BURST_POLLS = 16
"""When the send loop takes frames as a stream: still coming after BURST_POLL_S and BURST_POLLS
loop iterations. It then sleeps out the rest of SEND_INTERVAL_S instead of checking every iteration.

A burst of chunks (all samples of an engine step, one per iteration while the consumer yields)
ends within these and is written at once; both must pass, so one long step (a trace frame's
digest) in the middle of a burst does not make it a stream. Frames that keep coming are a stream:
checking every iteration then cost a task step (and its trace event) per chunk, for a write that
waited for SEND_INTERVAL_S anyway. Once a write was part of a stream, frames that come within
SEND_INTERVAL_S of it are taken as more of it, without polling for a burst's end again.
"""

EXPORT_HISTORY = 32
"""Finished requests per connection whose trace can still be exported (their time windows)."""


def _end_nap(nap: asyncio.Future[None]) -> None:
    if not nap.done():
        nap.set_result(None)


def _block(seconds: float) -> None:
    """Busy CPU work on the calling thread: what a blocking call does to an event loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _no_problem() -> str | None:
    return None


@dataclass(frozen=True)
class ServerSide:
    """What every connection of one server shares: its engine, limits, tracer, admission and rules."""

    engine: Engine
    limits: Limits = field(default_factory=Limits)
    tracer: LoopTracer | None = None
    feed: TraceFeed | None = None
    """The live trace frames' feed, where the server traces its loop."""
    admission: Admission | None = None
    """The server's admission (None: one for this connection alone)."""
    log_prompts: bool = False
    trace_off: str = "tracing is off on this server"
    """Why there is no `tracer`, for `export_trace` to answer."""
    engine_problem: Callable[[], str | None] = _no_problem
    """Why the engine cannot take requests now, or None (default: it can)."""
    experiment_url: str | None = None
    """Where blocking-consumer runs go (`blocking_elsewhere`), or None: this server runs them."""


class ClientSession:
    """One websocket client: any number of requests (up to the limit), told apart by `id`."""

    def __init__(
        self, ws: ServerConnection, server: ServerSide, label: str = "c0", address: str = ""
    ) -> None:
        """`label` names the connection in task names and the trace; `address` is the client's,
        for the per-address limits."""
        self.trace_off = server.trace_off
        self.ws = ws
        self.engine_problem = server.engine_problem
        self.engine = server.engine
        self.limits = server.limits
        self.label = label
        self.tracer = server.tracer
        self.admission = server.admission or Admission(server.limits)
        self.address = address
        self.log_prompts = server.log_prompts
        self.experiment_url = server.experiment_url
        self.requests: dict[str, RunningRequest] = {}
        self.outbox = Outbox()
        self.reads = ReadLog()
        """What this connection's traced consumers read per engine output, for the next trace frame."""
        self.prefills = PrefillLog()
        """Its traced requests' prefill spans (handed to the engine until the first chunk)."""
        self.windows: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """Time windows (ns) of finished requests, for `export_trace`."""
        self._wake = asyncio.Event()
        self._nap: asyncio.Future[None] | None = None
        """While the send loop waits out SEND_INTERVAL_S: what ends the wait early (see `send`)."""
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.feed = server.feed

    async def serve(self) -> None:
        """Read frames until the client leaves, then abort whatever it left running."""
        current = asyncio.current_task()
        if current is not None:
            current.set_name(f"ws reader @{self.label}")
        sender = asyncio.create_task(self._send_loop(), name=f"send @{self.label}")
        try:
            async for message in self.ws:
                self.handle_message(message)
        except ConnectionClosed:
            pass
        finally:
            running = [r.task for r in self.requests.values() if r.task is not None]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, *self._side_tasks, return_exceptions=True)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def handle_message(self, message: str | bytes) -> None:
        """Act on one client frame; every rejection, and any failure while acting on it, becomes
        an `error` frame: no frame can end the connection (or the server) with an internal error."""
        request_id: str | None = None
        try:
            command = parse_client_frame(message, self.limits)
            request_id = command.id
            if isinstance(command, GenerateCommand):
                self._start(command)
            elif isinstance(command, CancelCommand):
                self._cancel(command)
            else:
                self._export(command)
        except ProtocolError as exc:
            self.send(error_frame(exc.code, exc.message, exc.request_id))
        except Exception as exc:
            log.exception("internal error while handling a frame of request %s", request_id)
            self.send(
                error_frame(
                    "internal_error",
                    f"the server failed on this frame ({type(exc).__name__}: {exc}); "
                    "the connection is still usable",
                    request_id,
                )
            )

    def send(self, frame: dict[str, Any], now: bool = False) -> None:
        """Queue a frame for the send loop; never blocks the caller.

        With `now` (a request's `done`), the send loop writes it without waiting out the rest of
        SEND_INTERVAL_S: a request ends when its client has `done`, and the wait only groups frames.
        """
        self._queued(self.outbox.push(frame))
        if now and self._nap is not None:
            _end_nap(self._nap)

    def send_encoded(self, data: bytes) -> None:
        """Queue a frame already encoded (a live trace frame); never blocks."""
        self._queued(self.outbox.push_encoded(data))

    def send_chunk(self, request_id: str, chunk: Chunk, at: float) -> None:
        """Queue `chunk_frame(request_id, chunk.index, chunk.text, chunk.tokens, at, ...)` (its
        logprobs and alternatives where it has them) without building it; never blocks."""
        # `_queued` written out: this runs for every token.
        logprobs = chunk.logprobs
        pieces = None if logprobs is None else logprob_pieces(chunk.text, logprobs, chunk.alternatives)
        queued = self.outbox.push_chunk(request_id, chunk.index, chunk.text, chunk.tokens, at, pieces)
        self._wake.set()
        if queued > OUTBOX_MAX_FRAMES:
            self._close_stalled()

    def _queued(self, frames: int) -> None:
        """A frame was queued (`frames` are now waiting): wake the send loop; drop a client that
        stopped reading."""
        self._wake.set()
        if frames > OUTBOX_MAX_FRAMES:
            self._close_stalled()

    def _close_stalled(self) -> None:
        if not self._closing:
            self._closing = True
            log.warning("closing a client that stopped reading (%d frames queued)", len(self.outbox))
            self._spawn(self.ws.close(1008, "client is not reading its frames"))

    def end_requests(self, code: str, message: str) -> None:
        """End every running request now: an `error` frame with `code` and `message`, then its
        unfinished samples finish `error` and its `done` follows (the engine can no longer end them)."""
        for running in list(self.requests.values()):
            self.send(error_frame(code, message, running.state.request_id))
            if running.task is not None:
                running.task.cancel()

    def _start(self, command: GenerateCommand) -> None:
        """Check `command`, start its generation in the engine, answer `accepted` and consume it."""
        self._check_room(command)
        engine, command = self._engine_for(command)
        seed = command.params.seed
        if seed is None:
            seed = random.randrange(SEED_MAX - self.limits.n_max)
        params = replace(command.params, seed=seed)
        choice = engine.choose_format(command.prompt, command.format, command.system)
        prompt = choice.prompt
        if command.prefix and engine.plays is None:
            # A continuation: in the format the request runs in (a replay runs its recorded prompt).
            prompt = replace(prompt, prefix=command.prefix)
        try:
            engine.validate(prompt, command.n, params)
        except RequestRejected as exc:
            raise ProtocolError(exc.code, str(exc), command.id) from None
        loop = asyncio.get_running_loop()
        self.admission.start_request(
            self.address, command.n, loop.time(), command.id, command.consumer.blocks
        )
        handed_ns = time.perf_counter_ns()  # the tracer's clock: the prefill span starts here
        generation = self._generation(engine, command, prompt, params)
        if self.log_prompts:
            log.info(
                "request %s from %s: n=%d prompt=%r", command.id, self.address, command.n, command.prompt
            )
        if self.feed is not None and command.trace:
            self.feed.request_started()
        state = RequestState(command.id, command.n, params, loop.time())
        running = RunningRequest(command, state, generation, handed_ns)
        if self.feed is not None and command.trace:
            self.prefills.handed(command.id, handed_ns, command.n if command.fanout == "requests" else 1)
        self.requests[command.id] = running
        self.send(
            accepted_frame(
                command.id,
                command.n,
                engine.name,
                engine.model,
                params,
                prompt_format=prompt.format,
                format_reason=choice.reason,
                trace_off=self.trace_off if command.trace and self.feed is None else None,
                at=state.started_at,
                engine_tasks=engine.task_prefix,
            )
        )
        request_id = command.id
        generation.watch_queue(lambda position: self.send(queued_frame(request_id, position)))
        running.task = asyncio.create_task(self._run(running), name=f"consume {command.id} @{self.label}")

    def _check_room(self, command: GenerateCommand) -> None:
        """ProtocolError where this connection cannot take `command`: its id runs, the connection runs
        its most requests, or it blocks and this server runs blocking experiments elsewhere."""
        if command.id in self.requests:
            raise ProtocolError(
                "duplicate_id",
                f"request {command.id!r} is still running; use a new id or wait for its done",
                command.id,
            )
        if len(self.requests) >= self.limits.max_requests_per_connection:
            raise ProtocolError(
                "too_many_requests",
                f"{self.limits.max_requests_per_connection} requests are already running on this "
                "connection; wait for one to finish",
                command.id,
            )
        if command.consumer.blocks and self.experiment_url is not None:
            raise ProtocolError(
                "blocking_elsewhere",
                "a blocking consumer holds the loop it runs on, so this server runs blocking "
                f"experiments on a loop of their own: send this request to {self.experiment_url}",
                command.id,
            )

    def _engine_for(self, command: GenerateCommand) -> tuple[Engine, GenerateCommand]:
        """The engine that runs `command`, and the request it runs: a `replay` frame's run on an engine
        of its own; else the server's engine, once ready, with a saved run's request where it plays one."""
        if command.replay is not None:
            # The server's engine, ready or not, takes no part.
            return replaying(command.replay.run, command.replay.speed), command
        problem = self.engine_problem()
        if problem is not None:
            raise ProtocolError("engine_not_ready", problem, command.id)
        if self.engine.plays is not None:
            command = replayed_command(command, self.engine.plays, self.limits)
        return self.engine, command

    def _generation(
        self, engine: Engine, command: GenerateCommand, prompt: Prompt, params: SamplingParams
    ) -> Generation:
        """The engine's generation of `command` (n requests of one sample for fan-out `requests`,
        cumulative outputs where asked); ProtocolError `engine_error`, its admission undone, where
        the engine could not start it."""
        try:
            if command.fanout == "requests":
                label = f"{command.id} @{self.label}"
                generation: Generation = FanoutGeneration(engine, prompt, command.n, params, label=label)
            else:
                generation = engine.generate(prompt, command.n, params)
            if command.output_kind == "cumulative":
                generation = CumulativeGeneration(generation)
        except Exception as exc:
            self.admission.end_request(command.n, command.consumer.blocks)
            log.exception("engine refused request %s", command.id)
            raise ProtocolError("engine_error", f"the engine could not start: {exc}", command.id) from None
        return generation

    async def _run(self, running: RunningRequest) -> None:
        state, command = running.state, running.command
        consumer = command.consumer
        key = (self.label, state.request_id)
        tracer = self.tracer
        block_s = consumer.block_ms / 1000
        loop = asyncio.get_running_loop()
        request_id, on_text, send_chunk = state.request_id, state.on_text, self.send_chunk
        # Cumulative outputs (a teaching control): what is new in each is worked out here, and what
        # the consumer read is noted for the trace's read lane. Delta outputs, the default, pay
        # for neither (a clock read and a note per token were 5-10 % of the loop at n = 64).
        cumulative = DeltaReader() if command.output_kind == "cumulative" else None
        reads = self.reads if cumulative is not None and command.trace and self.feed is not None else None
        clock = time.perf_counter_ns
        cancel_after = command.cancel_after
        counted = [0] * state.n  # tokens of each sample, as this consumer counts them
        generation = running.generation
        prefills = self.prefills if command.trace and self.feed is not None else None
        awaiting_first = prefills.awaiting(request_id) if prefills is not None else 0
        try:
            async for chunk in generation:
                if tracer is not None:
                    tracer.chunk(key, chunk.index, chunk.tokens)
                if awaiting_first and prefills is not None:
                    awaiting_first -= prefills.first_chunk(request_id, chunk.index, clock())
                if cumulative is not None:
                    # The output holds the whole text so far: only what is new goes on.
                    taken = clock()
                    size = len(chunk.text.encode())
                    chunk = cumulative.delta(chunk)
                if chunk.finish_reason is None:
                    # Nearly every chunk: its text goes straight to the outbox, no frame dict.
                    now = loop.time()
                    if on_text(chunk.index, chunk.text, chunk.tokens, now):
                        send_chunk(request_id, chunk, now)
                    if cancel_after is not None and 0 <= chunk.index < state.n:
                        counted[chunk.index] += chunk.tokens
                        if counted[chunk.index] >= cancel_after:
                            self._cancel_sample(running, chunk.index)
                else:
                    self._finish_sample(running, chunk, loop.time())
                if reads is not None:
                    reads.add(taken, request_id, chunk.index, size, clock() - taken)
                # Only a finish can end the request; `finished` looks at all n samples.
                if chunk.finish_reason is not None and state.finished:
                    break
                # The teaching control: what the consumer does between chunks.
                if consumer.mode == "cooperative":
                    await asyncio.sleep(0)
                elif consumer.mode == "blocking" and chunk.index not in state.abort_requested:
                    _block(block_s)  # not for a cancelled sample's chunks: its backlog goes at once
        except Exception as exc:
            log.exception("engine failed during request %s", state.request_id)
            self.send(error_frame("engine_error", f"the engine failed: {exc}", state.request_id))
        finally:
            try:
                await generation.aclose()
            finally:
                self._end(running)

    def _finish_sample(self, running: RunningRequest, chunk: Chunk, now: float) -> None:
        """A sample's last chunk: its frames go (an abort's traced as the cancel chain's `finished`),
        and the engine's figures on it label the trace's prefill span."""
        state = running.state
        if chunk.meta and running.command.trace and self.feed is not None:
            self.prefills.reported(state.request_id, chunk.meta, chunk.index)
        for frame in state.on_chunk(chunk, now):
            self.send(frame)
            if self.tracer is not None and frame.get("reason") == "abort":
                self.tracer.cancel((self.label, state.request_id), "finished", frame["index"])

    def _end(self, running: RunningRequest) -> None:
        """The request has ended: its unfinished samples finish, its trace window is kept for
        `export_trace`, the last of its trace and its `done` go, and its admission ends."""
        state = running.state
        for frame in state.finish_unfinished():
            self.send(frame)
        self.windows[state.request_id] = (running.start_ns, time.perf_counter_ns())
        while len(self.windows) > EXPORT_HISTORY:
            self.windows.popitem(last=False)
        if running.command.trace and self.feed is not None:
            self.prefills.ended(state.request_id)
            self.feed.flush()  # the last of the trace goes before `done`
        self.send(state.done(asyncio.get_running_loop().time()), now=True)
        del self.requests[state.request_id]
        self.admission.end_request(state.n, running.command.consumer.blocks)

    def _cancel(self, command: CancelCommand) -> None:
        running = self.requests.get(command.id)
        if running is None:
            if command.id in self.windows:  # it finished before this loop read the cancel
                self.send(cancel_ack_frame(command.id, command.index, [], self._trace_ms()))
                return
            raise ProtocolError(
                "unknown_id", f"no running request has id {command.id!r}; it may have finished", command.id
            )
        n = running.state.n
        if command.index is not None and not 0 <= command.index < n:
            raise ProtocolError(
                "index_out_of_range",
                f"index must be between 0 and {n - 1} for request {command.id!r}, got {command.index}",
                command.id,
            )
        if self.tracer is not None:
            self.tracer.cancel((self.label, command.id), "received", command.index)
        aborting = running.state.request_abort(command.index)
        self.send(cancel_ack_frame(command.id, command.index, aborting, self._trace_ms()))
        if aborting:
            self._spawn(self._abort(running, command.index))

    def _trace_ms(self) -> float | None:
        """Now on the trace's clock (ms since the tracer's origin), where this server traces its loop."""
        if self.tracer is None:
            return None
        return (time.perf_counter_ns() - self.tracer.origin_ns) // 1000 / 1000

    def _cancel_sample(self, running: RunningRequest, index: int) -> None:
        """`cancel_after`: the consumer itself cancels sample `index` (once), as a `cancel` would."""
        if index in running.state.abort_requested or running.state.reasons[index] is not None:
            return
        if self.tracer is not None:
            self.tracer.cancel((self.label, running.state.request_id), "received", index)
        if running.state.request_abort(index):
            self._spawn(self._abort(running, index))

    def _export(self, command: ExportTraceCommand) -> None:
        if self.tracer is None:
            raise ProtocolError("trace_disabled", self.trace_off, command.id)
        running = self.requests.get(command.id)
        if running is not None:
            window = (running.start_ns, time.perf_counter_ns())
        elif command.id in self.windows:
            window = self.windows[command.id]
        else:
            raise ProtocolError(
                "unknown_id",
                f"no running or recently finished request has id {command.id!r} on this connection",
                command.id,
            )
        prefills = [span for span in self.prefills.spans.get(command.id, ()) if span.end_ns is not None]
        events = chrome_trace(
            self.tracer.events, self.tracer.origin_ns, self.label, command.id, window, prefills
        )
        self.send(trace_export_frame(command.id, events))

    async def _abort(self, running: RunningRequest, index: int | None) -> None:
        try:
            await running.generation.abort(index)
            if self.tracer is not None:
                self.tracer.cancel((self.label, running.state.request_id), "aborted", index)
        except Exception as exc:
            log.exception("abort failed for request %s", running.state.request_id)
            self.send(
                error_frame("abort_failed", f"the engine did not abort: {exc}", running.state.request_id)
            )

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _send_loop(self) -> None:
        tracer = self.tracer
        loop = asyncio.get_running_loop()
        outbox = self.outbox
        stream_until = 0.0  # frames that come before this are the stream the last write was part of
        try:
            while True:
                await self._wake.wait()
                now = loop.time()
                deadline = now + SEND_INTERVAL_S
                streamed = now < stream_until
                if streamed:
                    # Still the stream of the last write: wait out the interval without polling
                    # again for the end of a burst (BURST_POLLS task steps every interval).
                    await self._wait_out(deadline - now)
                else:
                    # Let the rest of this burst join the write: yield while each loop iteration
                    # adds frames; if they still come after BURST_POLL_S, wait out the interval.
                    streaming = now + BURST_POLL_S
                    pushed, polls = -1, 0
                    while outbox.pushed != pushed:
                        now = loop.time()
                        if polls >= BURST_POLLS and now >= streaming:
                            streamed = True
                            await self._wait_out(deadline - now)
                            break
                        pushed = outbox.pushed
                        polls += 1
                        await asyncio.sleep(0)
                self._wake.clear()
                frames = outbox.drain_encoded()
                # Awaiting the socket here lets chunks merge in the outbox meanwhile; a client
                # that takes nothing for `send_stall_s` is dropped (its requests then abort).
                try:
                    async with asyncio.timeout(self.limits.send_stall_s):
                        for message in batch_messages(frames):
                            await self.ws.send(message, text=True)
                except TimeoutError:
                    log.warning("dropping %s: it read nothing for %g s", self.label, self.limits.send_stall_s)
                    self.ws.transport.abort()
                    return
                if tracer is not None:
                    tracer.frames(self.label, len(frames), sum(map(len, frames)))
                stream_until = loop.time() + SEND_INTERVAL_S if streamed else 0.0
        except ConnectionClosed:
            pass

    async def _wait_out(self, seconds: float) -> None:
        """Sleep `seconds`, or less if a frame that ends a request is queued meanwhile."""
        loop = asyncio.get_running_loop()
        nap = self._nap = loop.create_future()
        timer = loop.call_later(seconds, _end_nap, nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None

    def take_reads(self, origin_ns: int) -> list[list[Any]]:
        """The consumer reads since the last trace frame (`ReadLog.take`)."""
        return self.reads.take(origin_ns)

    def take_prefills(self, origin_ns: int) -> list[list[Any]]:
        """The prefill spans that changed since the last trace frame (`PrefillLog.take`)."""
        return self.prefills.take(origin_ns)

    @property
    def wants_trace(self) -> bool:
        """Whether a request that asked for live trace frames is running on this connection."""
        return any(r.command.trace for r in self.requests.values())

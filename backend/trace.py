"""The event-loop tracer: what the backend's asyncio loop really did, measured while it runs.

Hooks, all on one plain asyncio loop (uvloop's handles are not Python objects, so it is not used):

- every callback the loop runs goes through `asyncio.events.Handle._run`; a task step is such a
  callback whose `_callback.__self__` is the task (true of CPython's C Task too). The patched
  `_run` times it when its loop carries a tracer and does nothing else otherwise;
- the loop's selector is wrapped so that each `select()` call, the loop's idle wait, is timed;
- a heartbeat task sleeps a fixed interval and records how late it woke (loop lag);
- the server records chunks, frames and the cancel chain through `chunk`, `frame`, `cancel`.

Events go to a ring buffer (`collections.deque` with `maxlen`), so memory is bounded whatever the
load. Each event is a tuple `(kind, start_ns, duration_ns, subject, detail)` with times from
`time.perf_counter_ns()`. Steps are stored under their task's name (or the callback's qualified
name), never as objects. The tracer measures its own cost per step event (on a sample of them).
"""

from __future__ import annotations

import asyncio
import itertools
import selectors
import time
from collections import deque
from collections.abc import Callable
from typing import Any

STEP = 0
"""A callback or task step ran: subject is its name (the task's), duration its run time."""
IDLE = 1
"""The loop waited in select(): detail is how many events it returned."""
LAG = 2
"""A heartbeat woke late by duration_ns."""
CHUNK = 3
"""A chunk arrived from the engine: subject is the request key, detail (index, tokens)."""
FRAME = 4
"""A frame was written to a socket: subject is the connection label, detail (type, bytes)."""
CANCEL = 5
"""A step of the cancel chain: subject is the request key, detail (stage, index)."""

TRACE_CAPACITY = 200_000
"""Events kept (about 100 bytes each): bounds the tracer's memory; the oldest are dropped."""

HEARTBEAT_INTERVAL_S = 0.02
"""How often the heartbeat checks the loop's lateness; each wake-up is one more event."""

Event = tuple[int, int, int, Any, Any]

_TRACER_ATTRIBUTE = "_loop_tracer"
_original_handle_run: Callable[[asyncio.Handle], None] | None = None


_Task = asyncio.Task
_names: dict[Any, str] = {}

OVERHEAD_SAMPLE = 32
"""The tracer times its own recording on one step event in 32 (a clock read costs ~0.1-0.3 us)."""


def _other_name(callback: Any) -> str:
    """The name of a callback that is not a task step, cached per underlying function."""
    key = getattr(callback, "__func__", callback)
    name = _names.get(key)
    if name is None:
        if len(_names) > 10_000:  # callbacks that are new objects every time: keep the cache bounded
            _names.clear()
        name = _names[key] = callback_name(callback)
    return name


def _traced_handle_run(handle: asyncio.Handle) -> None:
    """Handle._run, timed when the handle's loop is traced."""
    tracer: LoopTracer | None = getattr(handle._loop, _TRACER_ATTRIBUTE, None)  # type: ignore[attr-defined]
    if tracer is None:
        _original_handle_run(handle)  # type: ignore[misc]
        return
    start = _clock()
    _original_handle_run(handle)  # type: ignore[misc]
    end = _clock()
    callback = handle._callback  # type: ignore[attr-defined]
    owner = getattr(callback, "__self__", None)
    # Only ints and a str go into the ring: the garbage collector stops tracking such tuples, so a
    # full ring costs no collection time (storing the callbacks themselves cost about 10%).
    name = owner.get_name() if isinstance(owner, _Task) else _other_name(callback)
    tracer._append((STEP, start, end - start, name, None))
    tracer.recorded += 1
    if not tracer.recorded % OVERHEAD_SAMPLE:
        tracer.overhead_ns += (_clock() - end) * OVERHEAD_SAMPLE


_clock = time.perf_counter_ns


def _patch_handles() -> None:
    global _original_handle_run
    if _original_handle_run is None:
        _original_handle_run = asyncio.events.Handle._run
        asyncio.events.Handle._run = _traced_handle_run  # type: ignore[method-assign]


class _TimedSelector:
    """The loop's selector, with each select() (the loop's idle wait) recorded."""

    def __init__(self, selector: selectors.BaseSelector, tracer: LoopTracer) -> None:
        self._selector = selector
        self._tracer = tracer

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        start = time.perf_counter_ns()
        ready = self._selector.select(timeout)
        end = time.perf_counter_ns()
        self._tracer._record((IDLE, start, end - start, None, len(ready)))
        return ready

    def __getattr__(self, name: str) -> Any:
        return getattr(self._selector, name)


class LoopTracer:
    """Records what one asyncio loop runs, its idle waits and its lag, into a ring buffer."""

    def __init__(self, capacity: int = TRACE_CAPACITY, heartbeat_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.events: deque[Event] = deque(maxlen=capacity)
        self._append = self.events.append
        self.recorded = 0
        """Events recorded since install (the ring holds the last `capacity` of them)."""
        self.overhead_ns = 0
        """Time spent recording step events: measured on one in `OVERHEAD_SAMPLE`, scaled up."""
        self.heartbeat_s = heartbeat_s
        self.origin_ns = time.perf_counter_ns()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def _record(self, event: Event) -> None:
        self.events.append(event)
        self.recorded += 1

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start tracing `loop` (a plain asyncio selector loop); call from that loop."""
        selector = getattr(loop, "_selector", None)
        if selector is None:
            raise TypeError(f"{type(loop).__name__} has no selector to trace; use a plain asyncio loop")
        _patch_handles()
        self.loop = loop
        self.origin_ns = time.perf_counter_ns()
        setattr(loop, _TRACER_ATTRIBUTE, self)
        loop._selector = _TimedSelector(selector, self)  # type: ignore[attr-defined]
        self._heartbeat = loop.create_task(self._beat(), name="heartbeat")

    def uninstall(self) -> None:
        """Stop tracing; the recorded events stay readable."""
        loop = self.loop
        if loop is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if getattr(loop, _TRACER_ATTRIBUTE, None) is self:
            delattr(loop, _TRACER_ATTRIBUTE)
        selector = getattr(loop, "_selector", None)
        if isinstance(selector, _TimedSelector):
            loop._selector = selector._selector  # type: ignore[attr-defined]
        self.loop = None

    async def _beat(self) -> None:
        interval_ns = int(self.heartbeat_s * 1e9)
        due = time.perf_counter_ns() + interval_ns
        while True:
            await asyncio.sleep(max(0, due - time.perf_counter_ns()) / 1e9)
            now = time.perf_counter_ns()
            self._record((LAG, now, max(0, now - due), None, None))
            due = now + interval_ns

    def chunk(self, request_key: Any, index: int, tokens: int) -> None:
        """A chunk of sample `index` of a request arrived from the engine."""
        self._record((CHUNK, time.perf_counter_ns(), 0, request_key, (index, tokens)))

    def frame(self, connection: str, kind: str, size: int) -> None:
        """A frame of `size` bytes was handed to a connection's socket."""
        self._record((FRAME, time.perf_counter_ns(), 0, connection, (kind, size)))

    def cancel(self, request_key: Any, stage: str, index: int | None) -> None:
        """A step of the cancel chain: "received", "aborted" (engine told), "finished" (last chunk)."""
        self._record((CANCEL, time.perf_counter_ns(), 0, request_key, (stage, index)))

    def since(self, recorded: int) -> tuple[list[Event], int]:
        """Events recorded after the first `recorded` ones (those still in the ring), and the new count."""
        total = self.recorded
        missing = total - recorded
        if missing <= 0:
            return [], total
        available = min(missing, len(self.events))
        # From the right end: copying the whole ring (200,000 events) for the newest few thousand
        # cost more than everything else a trace frame does.
        newest = list(itertools.islice(reversed(self.events), available))
        newest.reverse()
        return newest, total

    def overhead_per_event_ns(self) -> float:
        """Mean measured cost of recording one step event."""
        steps = sum(1 for event in self.events if event[0] == STEP)
        return self.overhead_ns / steps if steps else 0.0


def callback_name(callback: Any) -> str:
    """What a callback is: its task's name for a task step, else the callback's qualified name."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return owner.get_name()
    name = getattr(callback, "__qualname__", None)
    if name is None:
        inner = getattr(callback, "func", None)  # functools.partial
        name = getattr(inner, "__qualname__", None) or type(callback).__qualname__
    return _FRIENDLY_NAMES.get(name, name)


_FRIENDLY_NAMES = {
    "_SelectorSocketTransport._read_ready": "socket read",
    "_SelectorSocketTransport._read_ready__data_received": "socket read",
    "_SelectorSocketTransport._read_ready__get_buffer": "socket read",
    "_SelectorSocketTransport._write_ready": "socket write",
    "_SelectorSocketTransport._call_connection_lost": "socket closed",
    "BaseSelectorEventLoop._accept_connection": "accept",
    "Future.set_result": "future done",
    "_set_result_unless_cancelled": "timer wake-up",
}

"""The event-loop tracer: what the backend's asyncio loop really did, measured while it runs.

Hooks, all on one plain asyncio loop (uvloop's handles are not Python objects, so it is not used):

- every callback the loop runs goes through `asyncio.events.Handle._run`; a task step is such a
  callback whose `_callback.__self__` is the task (true of CPython's C Task too). While a loop is
  traced, `_run` is wrapped by a closure bound to that loop; callbacks of other loops go straight
  through;
- the loop's selector is wrapped so that each `select()` call, the loop's idle wait, is timed;
- a heartbeat task sleeps a fixed interval and records how late it woke (loop lag);
- the server records chunks, frames and the cancel chain through `chunk`, `frame`, `cancel`.

Recording a step is the cost that matters (the loop runs tens of thousands a second), so it is one
clock read and two stores: the loop runs callbacks back to back after each `select()`, so a step
starts where the previous step or idle wait ended, and only its end is read. The ring is a
preallocated array of times and a preallocated list of items (a step's item being its task's name),
filled in place: no tuple, no int object, nothing for the garbage collector. `since()` and `events`
turn the ring back into `(kind, start_ns, duration_ns, subject, detail)` tuples, with times from
`time.perf_counter_ns()`. The tracer measures its own recording cost on a sample of steps.

The step recorder is C (backend/trace/step_recorder.c, built in place by `python setup.py build_ext
--inplace`, which `make` runs, or at start-up in a Space): it runs asyncio's handles itself, so a
step costs no Python frame. Where it is not built there is no tracer (`available()`); docs/trace.md
gives the figures that decided against a Python fallback.
"""

from __future__ import annotations

import array
import asyncio
import selectors
import statistics
import time
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

try:
    from backend.trace._step_recorder import StepRecorder as _CStepRecorder
except ImportError:  # not built (no C compiler where it was installed): no tracer (see NOT_BUILT)
    _CStepRecorder = None

STEP = 0
"""A callback or task step ran: subject is its name (the task's), duration its run time."""
IDLE = 1
"""The loop waited in select(): detail is how many events it returned. A poll with timeout 0 (the
loop had callbacks ready) is not recorded: its few microseconds go to the step after it."""
LAG = 2
"""A heartbeat woke late by duration_ns (recorded when it woke)."""
CHUNK = 3
"""A chunk arrived from the engine: subject is the request key, detail (index, tokens)."""
FRAME = 4
"""Frames were written to a socket in one write: subject is the connection label, detail (frames,
bytes)."""
CANCEL = 5
"""A step of the cancel chain: subject is the request key, detail (stage, index)."""

TRACE_CAPACITY = 200_000
"""Events kept (about 30 bytes each in the ring, plus other events' tuples): bounds the tracer's
memory; the oldest are overwritten."""

HEARTBEAT_INTERVAL_S = 0.02
"""How often the heartbeat checks the loop's lateness; each wake-up is one more event."""

OVERHEAD_SAMPLE = 32
"""The tracer times its own recording on one step in 32 (a clock read costs ~0.1 us here)."""

RECENT_SAMPLES = 64
"""Recording times kept; the tracer reports their median. A mean was thrown by the rare sample
that took the process's time slice or named a callback for the first time (microseconds)."""

Event = tuple[int, int, int, Any, Any]

STALL_SCAN = 100_000
"""Ring entries `LoopTracer.stall` reads back at most for the current step's start (a blocked
step's chunks are recorded inside it: 240 tokens x 32 samples is 7,680 of them)."""


class Stall(NamedTuple):
    """The loop now, as `LoopTracer.stall` reads it: times in perf_counter ns."""

    since_ns: int
    """When the step running now began (-1: not known)."""
    stall_ns: int
    """How long it has run: the loop has run nothing else since."""
    lag_ns: int
    """How late the heartbeat is now."""
    taken: int
    """Chunks taken from the engine in this step so far (their frames wait for the loop)."""


_names: dict[types.CodeType, str] = {}
"""Names of callbacks that are not task steps, by their function's code (see `_other_name`)."""

_ASYNCIO_HANDLE_RUN = asyncio.events.Handle._run
"""asyncio's own `Handle._run`, which the C recorder may run handles in place of."""


def _report_callback_error(handle: asyncio.Handle, exc: BaseException) -> None:
    """A callback raised `exc`: to the loop's exception handler, as asyncio's `Handle._run` does (the C
    recorder runs callbacks itself and calls this)."""
    callback, args = handle._callback, handle._args  # type: ignore[attr-defined]
    source = asyncio.format_helpers._format_callback_source(callback, args)  # type: ignore[attr-defined]
    context: dict[str, Any] = {
        "message": f"Exception in callback {source}",
        "exception": exc,
        "handle": handle,
    }
    if handle._source_traceback:  # type: ignore[attr-defined]
        context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
    handle._loop.call_exception_handler(context)  # type: ignore[attr-defined]


def _other_name(callback: Any) -> str:
    """The name of a callback that is not a task step, cached per code object.

    Keyed by the function's code, not the function: asyncio's gather and wait make a new closure per
    call as a done-callback, and a cache keyed by those kept each one alive, with the futures,
    tasks and connections it reaches (every connection of a traced backend stayed in memory).
    Callbacks without Python code (a partial, a builtin method bound to one object) are named each
    time, not cached. backend/trace/step_recorder.c looks the cache up the same way.
    """
    function = getattr(callback, "__func__", callback)
    code = function.__code__ if isinstance(function, types.FunctionType) else None
    if code is None:
        return callback_name(callback)
    name = _names.get(code)
    if name is None:
        if len(_names) > 10_000:  # code made at run time (exec, lambdas built from strings): bounded
            _names.clear()
        name = _names[code] = callback_name(callback)
    return name


NOT_BUILT = (
    "the tracer's C parts are not built (`python setup.py build_ext --inplace`, which `make` runs, "
    "needs a C compiler and Python's headers)"
)
"""Why a LoopTracer cannot be made here, when the C step recorder is missing."""


def available() -> bool:
    """Whether the tracer's C step recorder is built, so that a LoopTracer can be made."""
    return _CStepRecorder is not None


class LoopTracer:
    """Records what one asyncio loop runs, its idle waits and its lag, into a ring buffer."""

    def __init__(
        self,
        capacity: int = TRACE_CAPACITY,
        heartbeat_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        """Raises RuntimeError (saying why) where the C step recorder is not built."""
        if _CStepRecorder is None:
            raise RuntimeError(NOT_BUILT)
        self.capacity = capacity
        self.heartbeat_s = heartbeat_s
        self.origin_ns = time.perf_counter_ns()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.beat_ns = 0
        """When the heartbeat last woke (perf_counter ns; 0 before it has)."""
        self._times = array.array("q", bytes(8 * capacity))
        """When each event happened (ns): an array, so that a step stores no int object."""
        self._items: list[Any] = [None] * capacity
        self._recorder = _CStepRecorder(
            self._times,
            self._items,
            asyncio.Task,
            _names,
            _other_name,
            _report_callback_error,
            OVERHEAD_SAMPLE,
        )
        self._push = self._recorder.push
        """Record an event other than a step: `_push(at, (kind, duration_ns, subject, detail))`."""
        self._push_now = self._recorder.push_now
        self.chunk = self._recorder.push_chunk
        """`chunk(request_key, index, tokens)`: a chunk of sample `index` of a request arrived from the
        engine (the recorder's own method: this runs for every chunk)."""
        self._wrapper: Callable[[asyncio.Handle], None] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._untimed_select: Callable[[float | None], list[Any]] | None = None
        self._timed_select: Callable[[float | None], list[Any]] | None = None
        self._previous_run: Callable[[asyncio.Handle], None] | None = None

    @property
    def recorded(self) -> int:
        """Events recorded since the tracer was made (the ring holds the last `capacity` of them)."""
        return self._recorder.recorded

    @property
    def kept(self) -> int:
        """Events the ring holds now (at most `capacity`)."""
        return min(self._recorder.recorded, self.capacity)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start tracing `loop` (a plain asyncio selector loop); call from that loop."""
        selector = getattr(loop, "_selector", None)
        if selector is None or not hasattr(selector, "__dict__"):
            raise TypeError(f"{type(loop).__name__} has no selector to trace; use a plain asyncio loop")
        self.loop = loop
        self.origin_ns = time.perf_counter_ns()
        self._previous_run = previous = asyncio.events.Handle._run
        recorder = self._recorder
        recorder.attach(previous, loop, previous is _ASYNCIO_HANDLE_RUN, asyncio.Handle, asyncio.TimerHandle)
        self._wrapper = recorder.handle_run
        asyncio.events.Handle._run = self._wrapper  # type: ignore[method-assign]
        # The loop calls select() once per iteration (once per chunk in cooperative mode). The timed
        # one is set on the selector itself: a wrapper object forwarding the loop's other calls
        # (get_key, modify...) through __getattr__ cost the traced loop more than the timing did.
        self._selector = selector
        self._untimed_select = vars(selector).get("select")  # another tracer's, else the method
        self._timed_select = recorder.timed_select(selector.select)
        selector.select = self._timed_select
        self._heartbeat = loop.create_task(self._beat(), name="heartbeat")

    def uninstall(self) -> None:
        """Stop tracing; the recorded events stay readable."""
        loop = self.loop
        if loop is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._recorder.disable()
        if asyncio.events.Handle._run is self._wrapper:
            asyncio.events.Handle._run = self._previous_run  # type: ignore[method-assign]
        # Otherwise another tracer wrapped ours since: the disabled wrapper stays in its chain and
        # only passes callbacks on.
        selector = self._selector
        if selector is not None and vars(selector).get("select") is self._timed_select:
            if self._untimed_select is None:
                del selector.select
            else:
                selector.select = self._untimed_select
        self._selector = None
        self.loop = None

    async def _beat(self) -> None:
        interval_ns = int(self.heartbeat_s * 1e9)
        due = time.perf_counter_ns() + interval_ns
        while True:
            await asyncio.sleep(max(0, due - time.perf_counter_ns()) / 1e9)
            now = time.perf_counter_ns()
            self._push(now, (LAG, max(0, now - due), None, None))
            self.beat_ns = now
            due = now + interval_ns

    def frames(self, connection: str, count: int, size: int) -> None:
        """`count` frames, `size` bytes in all, were handed to a connection's socket in one write."""
        self._push_now((FRAME, 0, connection, (count, size)))

    def cancel(self, request_key: Any, stage: str, index: int | None) -> None:
        """A step of the cancel chain: "received", "aborted" (engine told), "finished" (last chunk)."""
        self._push_now((CANCEL, 0, request_key, (stage, index)))

    def stall(self, now_ns: int, scan: int = STALL_SCAN) -> Stall:
        """What the loop is doing now, read from another thread (the loop itself may be blocked):
        when its current step began (the end of the last step or idle wait recorded), how late its
        heartbeat is, and the chunks it took since that step began (recorded inside it, not yet sent
        on). Reads the ring back from its newest entry, at most `scan` entries."""
        times, items, capacity = self._times, self._items, self.capacity
        total = self._recorder.recorded
        since_ns, taken = -1, 0
        position = total - 1
        oldest = max(0, total - capacity, total - scan)
        while position >= oldest:
            slot = position % capacity
            item = items[slot]
            if item.__class__ is str:
                since_ns = times[slot]
                break
            if item[0] == IDLE:
                since_ns = times[slot] + item[1]
                break
            if item[0] == CHUNK:
                taken += 1
            position -= 1
        due = self.beat_ns + int(self.heartbeat_s * 1e9) if self.beat_ns else now_ns
        return Stall(since_ns, max(0, now_ns - since_ns) if since_ns >= 0 else 0, max(0, now_ns - due), taken)

    def since(self, recorded: int) -> tuple[list[Event], int]:
        """Events recorded after the first `recorded` ones (those still in the ring), and the new count."""
        times, items, boundary, total = self.raw_since(recorded)
        return self._decode(times, items, boundary), total

    @property
    def events(self) -> list[Event]:
        """Every event still in the ring, oldest first."""
        return self.since(0)[0]

    def raw_since(self, recorded: int) -> tuple[Sequence[int], list[Any], int, int]:
        """The ring's entries after the first `recorded` ones: their times, their items, where the
        first step among them started (-1 if that is no longer known), and the new count.

        An item is a task name for a step (which ended at its time) or `(kind, duration, subject,
        detail)` for any other event (which started at its time)."""
        total = self._recorder.recorded
        capacity = self.capacity
        oldest = max(0, total - capacity)
        first = max(recorded, oldest)
        if first >= total:
            return [], [], -1, total
        count = total - first
        head = first % capacity
        if head + count <= capacity:
            times = self._times[head : head + count]
            items = self._items[head : head + count]
        else:
            tail = head + count - capacity
            times = self._times[head:] + self._times[:tail]
            items = self._items[head:] + self._items[:tail]
        return times, items, self._boundary_before(first, oldest), total

    def _boundary_before(self, position: int, oldest: int) -> int:
        """The end of the last step or idle wait recorded before ring position `position`, or -1."""
        times, items, capacity = self._times, self._items, self.capacity
        position -= 1
        while position >= oldest:
            slot = position % capacity
            item = items[slot]
            if item.__class__ is str:
                return times[slot]
            if item[0] == IDLE:
                return times[slot] + item[1]
            position -= 1
        return -1

    @staticmethod
    def _decode(times: Sequence[int], items: list[Any], boundary: int) -> list[Event]:
        """Raw entries as event tuples; a step whose start is unknown is left out."""
        out: list[Event] = []
        append = out.append
        for at, item in zip(times, items, strict=True):
            if item.__class__ is str:
                if boundary >= 0:
                    append((STEP, boundary, at - boundary, item, None))
                boundary = at
            else:
                kind, duration, subject, detail = item
                append((kind, at, duration, subject, detail))
                if kind == IDLE:
                    boundary = at + duration
        return out

    def overhead_per_event_ns(self) -> float:
        """Median cost of recording one step over the last RECENT_SAMPLES timed (after the step ends:
        name, stores, counter)."""
        recent = self._recorder.recent_ns
        return float(statistics.median(recent)) if recent else 0.0


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
    "SyntheticGeneration._deadline_passed": "timer wake-up",
    "_SelectorSocketTransport._read_ready": "socket read",
    "_SelectorSocketTransport._read_ready__data_received": "socket read",
    "_SelectorSocketTransport._read_ready__get_buffer": "socket read",
    "_SelectorSocketTransport._write_ready": "socket write",
    "_SelectorSocketTransport._call_connection_lost": "socket closed",
    "BaseSelectorEventLoop._accept_connection": "accept",
    "Future.set_result": "future done",
    "_set_result_unless_cancelled": "timer wake-up",
}

"""Live trace frames for every connection that asks for them, from one digest of the tracer's events.

Each frame interval the feed reads what the tracer recorded since its last read, reduces it once
(`trace.frames.digest_ring`), and cuts a frame for each connection with a traced request running
(`trace.frames.connection_frame`), so the trace's cost grows with events, not events x
connections (which would be about 4 ms of CPU per chunk at 256 connections).
Frames are queued as the JSON they are sent as, made while the garbage collector is paused (see
`flush`).
"""

from __future__ import annotations

import asyncio
import functools
import gc
from typing import Any, Protocol

from backend.frames import encode_bytes
from backend.trace.frames import connection_frame, digest_ring, task_label
from backend.trace.recorder import LoopTracer
from backend.trace.tasks import render, snapshot

TASK_TREE_EVERY = 5
"""Every 5th trace frame (once a second) carries the loop's task tree (`trace.tasks`): a snapshot
costs 15-25 us a task, so at the frame rate it would be most of the feed's cost with hundreds of
tasks, while the tree a person reads changes at the rate of requests, not of tokens."""

TRACE_FRAMES_PER_S = 5
"""Live trace frames per second to each traced connection. The page redraws its trace panel about
twice a second (ui/handlers.py: every TRACE_EVERY-th of UPDATES_PER_S updates), so five give every
redraw new events. Each frame digests what the loop did since the last one, and also costs 0.1-0.2
ms whatever it holds (reading the ring, cutting and encoding each connection's frame): at ten a
second that fixed part would be about 2 % of a lightly loaded loop's CPU (n = 8 at 500 tok/s), for
no more on the page."""


class TraceSubscriber(Protocol):
    """A connection as the feed sees it."""

    label: str

    @property
    def wants_trace(self) -> bool:
        """Whether a request that asked for the trace is running on it."""

    def send_encoded(self, data: bytes) -> None:
        """Queue a frame to it, already encoded (frames.encode_bytes)."""

    def take_reads(self, origin_ns: int) -> list[list[Any]]:
        """Its consumers' reads since its last frame (trace.reads.ReadLog.take)."""

    def take_prefills(self, origin_ns: int) -> list[list[Any]]:
        """Its requests' prefill spans that changed since its last frame (trace.prefill.PrefillLog.take)."""


class TraceFeed:
    """Digests the tracer's new events once per interval and sends each traced connection its frame."""

    def __init__(self, tracer: LoopTracer) -> None:
        self.tracer = tracer
        self.subscribers: set[TraceSubscriber] = set()
        self._cursor = tracer.recorded
        self._flushes = 0

    def add(self, subscriber: TraceSubscriber) -> None:
        """Start considering a connection (it gets frames while `wants_trace`)."""
        self.subscribers.add(subscriber)

    def discard(self, subscriber: TraceSubscriber) -> None:
        """Forget a connection that left."""
        self.subscribers.discard(subscriber)

    def request_started(self) -> None:
        """A traced request is about to start: when no one was traced, frames begin from now, not with
        the idle time (or other work) since the last traced request."""
        if not any(s.wants_trace for s in self.subscribers):
            self._cursor = self.tracer.recorded

    def flush(self) -> None:
        """Send every traced connection what the loop did since the last flush, if anything.

        The digest and each connection's frame are thousands of lists, all freed by reference
        counting once the frames are JSON. Made with the collector running, they set off a young
        collection per frame that found nothing to free (at n = 64 the traced loop ran twice the
        untraced one's collections, ~0.9 % of its time); paused, the count of live objects is
        back where it was when it resumes.
        """
        collecting = gc.isenabled()
        gc.disable()
        try:
            frames = self._frames()
        finally:
            if collecting:
                gc.enable()
        for subscriber, data in frames:
            subscriber.send_encoded(data)

    def _frames(self) -> list[tuple[TraceSubscriber, bytes]]:
        """Each traced connection's frame since the last flush, encoded; none if nothing is new."""
        times, items, boundary, self._cursor = self.tracer.raw_since(self._cursor)
        if not times:
            return []
        traced = [s for s in self.subscribers if s.wants_trace]
        if not traced:
            return []
        origin = self.tracer.origin_ns
        digest = digest_ring(times, items, boundary, origin)
        self._flushes += 1
        tree = snapshot() if self._flushes % TASK_TREE_EVERY == 1 else None
        # What tracing itself costs, for the page to show beside what it measures.
        tracer = {"record_ns": round(self.tracer.overhead_per_event_ns())}
        frames = []
        for subscriber in traced:
            frame = connection_frame(digest, origin, subscriber.label)
            frame["counts"].update(tracer)
            frame["reads"] = subscriber.take_reads(origin)
            frame["prefills"] = subscriber.take_prefills(origin)
            if tree is not None:
                label = subscriber.label
                frame["tasks"] = render(tree, functools.partial(task_label, connection=label))
            frames.append((subscriber, encode_bytes(frame)))
        return frames

    async def run(self) -> None:
        """Flush at the frame rate while any connection is traced; until cancelled."""
        while True:
            await asyncio.sleep(1 / TRACE_FRAMES_PER_S)
            if any(s.wants_trace for s in self.subscribers):
                self.flush()

"""A blocked loop as the page sees it, without I/O: the backend's watch of it, and a Cancel's timing.

A blocking-consumer run blocks the loop that would send its chunks, its trace and read its Cancel,
so while it is blocked nothing comes on the run's own connection. The backend's main loop watches
that loop from outside (`ExperimentServer.watch`, at `/experiment/loop`), and the page reads the
watch every WATCH_EVERY_S while the run streams (`ui.client.BackendRun`): `LoopWatch` is one
reading, in the trace's clock (ms). A Cancel pressed meanwhile waits for the loop to read it;
`CancelTiming` holds when it was pressed and when the loop read it (the `cancel_ack` frame), and
what it did. `blocked_words` and `cancel_words` say both in the status line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

WATCH_EVERY_S = 0.25
"""How often the page reads the watch while a blocking run streams (the trace panel then redraws at
each reading: twice a second or more)."""

BLOCKED_AFTER_MS = 500.0
"""A step that has run this long counts as the loop being blocked, for the words and the panel."""

EXPERIMENT_LOOP_PATH = "/experiment/loop"
"""The backend's watch of its experiment loop (`backend.serving.server.EXPERIMENT_LOOP_PATH`)."""


def watch_url(backend_url: str) -> str:
    """The HTTP URL of the watch, on the backend whose websocket is at `backend_url`."""
    parts = urlsplit(backend_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, EXPERIMENT_LOOP_PATH, "", ""))


@dataclass(frozen=True)
class LoopWatch:
    """One reading of the watched loop: times in the trace's ms, `read_at` on this process's clock."""

    at_ms: float
    since_ms: float | None
    """When the step running now began (None: not known)."""
    stall_ms: float
    """How long that step has run."""
    lag_ms: float
    """How late the loop's heartbeat is."""
    taken: int
    """Chunks the loop took in that step: their frames wait for it."""
    waiting: int | None
    """Chunks the engine handed over that the loop has not taken yet (None: not counted)."""
    read_at: float

    @classmethod
    def from_json(cls, data: Any, read_at: float) -> LoopWatch | None:
        """A reading from the watch's JSON; None where it is not one (the loop is not traced)."""
        if not isinstance(data, dict) or "at_ms" not in data:
            return None
        try:
            since = data.get("since_ms")
            waiting = data.get("waiting")
            return cls(
                float(data["at_ms"]),
                None if since is None else float(since),
                float(data["stall_ms"]),
                float(data["lag_ms"]),
                int(data["taken"]),
                None if waiting is None else int(waiting),
                read_at,
            )
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def blocked(self) -> bool:
        """Whether the loop's current step has run BLOCKED_AFTER_MS or more."""
        return self.stall_ms >= BLOCKED_AFTER_MS


@dataclass
class CancelTiming:
    """A Cancel of the run: when it was pressed and when the backend's loop read it (this process's
    monotonic clock), the samples it stopped, and when it was read on the trace's clock."""

    pressed_at: float
    read_at: float | None = None
    aborting: list[int] | None = None
    """The samples the Cancel stopped; [] where the run (or the sample) had already finished."""
    read_ms: float | None = None

    @property
    def delay_s(self) -> float | None:
        """Seconds from the press until the loop read it (None while it has not)."""
        return None if self.read_at is None else self.read_at - self.pressed_at

    def read(self, frame: dict[str, Any], now: float) -> None:
        """The backend's `cancel_ack` for it arrived at `now`."""
        if self.read_at is not None:
            return
        self.read_at = now
        aborting = frame.get("aborting")
        self.aborting = [i for i in aborting if isinstance(i, int)] if isinstance(aborting, list) else []
        t_ms = frame.get("t_ms")
        self.read_ms = float(t_ms) if isinstance(t_ms, int | float) else None


def blocked_words(watch: LoopWatch | None, last_chunk_at: float | None, now: float | None = None) -> str:
    """The status line's words for a blocked loop ("" where it is not blocked): how long since the
    page's last chunk, how long the loop's step has run, and the chunks waiting behind it."""
    if watch is None or not watch.blocked:
        return ""
    now = time.monotonic() if now is None else now
    since_chunk = now - last_chunk_at if last_chunk_at is not None else watch.stall_ms / 1000
    behind = []
    if watch.waiting:
        behind.append(f"{watch.waiting} chunks wait in the engine's queue")
    if watch.taken:
        behind.append(f"{watch.taken} it took wait to be sent")
    more = f"; {' and '.join(behind)}" if behind else ""
    return (
        f"⏳ **The loop is blocked: {since_chunk:.1f} s since its last chunk.** Its current step has run "
        f"{watch.stall_ms / 1000:.1f} s without yielding{more}."
    )


def cancel_words(
    cancel: CancelTiming | None, run_started: float, finished: bool, now: float | None = None
) -> str:
    """The status line's words for a Cancel: pressed and waiting for the loop, or read (with the
    delay measured) and what it did ("" without a Cancel)."""
    if cancel is None:
        return ""
    pressed = cancel.pressed_at - run_started
    if cancel.read_at is None:
        now = time.monotonic() if now is None else now
        if finished:
            return f"Cancel pressed {pressed:.1f} s into the run; the run ended before the backend read it."
        return (
            f"Cancel pressed {pressed:.1f} s into the run: waiting for the blocked loop to read it "
            f"({now - cancel.pressed_at:.1f} s so far)."
        )
    did = (
        f"it stopped {len(cancel.aborting)} sample{'s' if len(cancel.aborting) != 1 else ''}"
        if cancel.aborting
        else "the run had already finished, so there was nothing to stop"
    )
    return (
        f"Cancel pressed {pressed:.1f} s into the run; the loop read it {cancel.delay_s or 0:.1f} s later "
        f"(cancel latency): {did}."
    )

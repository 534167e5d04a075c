"""What the page keeps of one run's trace, without I/O: the server's live `trace` frames folded in
(slices, idle waits, lag, chunk ticks, the cancel chain, reads, prefill spans), the blocked loop's
watch (`ui.loop_watch`), and the loop figures they give. `ui.trace_view` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backend.serving.stats import percentile
from ui.loop_watch import CancelTiming, LoopWatch

WINDOW_MS = 60_000.0
"""Trace kept and drawn: the last 60 s (bounds the page's memory; the SVG's size follows its pixel
columns, not the time it spans)."""

TICK_MS = 20.0
"""A sample's chunk arrivals within one 20 ms bucket are kept (and drawn) as one tick: the panel's
pixels are 50 ms or more of a 20 s window, and keeping every entry made each redraw at n=32 walk
tens of thousands of them."""


@dataclass
class TraceView:
    """What the page keeps of one run's trace frames."""

    request_id: str
    slices: list[tuple[float, float, float, str, int, float]] = field(default_factory=list)
    idle: list[tuple[float, float]] = field(default_factory=list)
    lag: list[tuple[float, float]] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """Chunk ticks: a sample's first arrival in each TICK_MS bucket."""
    _tick_bucket: dict[int, int] = field(default_factory=dict, repr=False)
    cancels: list[tuple[float, int | None, str]] = field(default_factory=list)
    steps: int = 0
    busy_ms: float = 0.0
    idle_ms: float = 0.0
    frames: int = 0
    chunk_count: int = 0
    first_ms: float | None = None
    last_ms: float | None = None
    longest_step_ms: float = 0.0
    record_ns: float | None = None
    """The tracer's own cost per recorded step, from the latest frame."""
    off: str | None = None
    engine_tasks: str = ""
    """How the run's engine's task names begin, as its `accepted` frame says (`Engine.task_prefix`)."""
    """Why the backend sends no trace for this run (from `accepted`), or None."""
    reads: list[tuple[float, int, int, float]] = field(default_factory=list)
    """The consumer's reads of this run: (t ms, index, largest output's bytes, us per output)."""
    tasks: str = ""
    """The loop's task tree from the latest frame that carried one."""
    prefill: tuple[float, float, int | None, int | None, bool] | None = None
    """This run's prefill span: (start ms, end ms, prompt tokens, of them cached, request ended)."""
    sub_prefills: dict[int, tuple[float, float, int | None, int | None, bool]] = field(default_factory=dict)
    """Fan-out's: each sub-request's prefill span, by sample."""
    live: LoopWatch | None = None
    """The latest reading of the blocked loop's watch while the run streams (None: not watched)."""
    watched_lag: list[tuple[float, float]] = field(default_factory=list)
    """The heartbeat's lag as the watch read it: (t ms, lag ms)."""
    cancel_band: tuple[float, float] | None = None
    """A Cancel that waited for the loop: (pressed, read) in the trace's ms."""
    cancel_delay_ms: float | None = None
    """How long the Cancel waited for the loop to read it, as the page measured it."""
    consume_steps: int = 0
    consume_ms: float = 0.0
    consumer: str = ""
    """The run's consumer mode (cooperative, greedy, blocking), as the page asked for it."""
    compare: tuple[str, dict[str, float | None]] | None = None
    """The session's previous run's consumer mode and figures, shown beside this run's where the
    mode differs (greedy beside cooperative)."""

    def watch(self, reading: LoopWatch | None) -> None:
        """A reading of the blocked loop's watch (None: the run is over, or not watched)."""
        self.live = reading
        if reading is not None:
            self.watched_lag.append((reading.at_ms, reading.lag_ms))
            if self.first_ms is None and reading.since_ms is not None:
                self.first_ms = reading.since_ms

    def cancel_read(self, cancel: CancelTiming) -> None:
        """The run's Cancel was read by the loop: its wait, drawn and counted as the cancel latency."""
        if cancel.delay_s is None:
            return
        self.cancel_delay_ms = cancel.delay_s * 1000
        if cancel.read_ms is not None:
            self.cancel_band = (cancel.read_ms - self.cancel_delay_ms, cancel.read_ms)

    def apply(self, frame: dict[str, Any]) -> None:
        """Fold one `trace` frame in; drop what fell out of the window."""
        if frame.get("start_ms") is None:
            return
        names = frame["names"]
        for start, end, busy, name, count, longest in frame["slices"]:
            self.slices.append((start, end, busy, names[name], count, longest))
            self.longest_step_ms = max(self.longest_step_ms, longest)
            if names[name].startswith("consume"):
                self.consume_steps += count
                self.consume_ms += busy
        self.idle.extend((start, dur) for start, dur in frame["idle"])
        self.lag.extend((t, ms) for t, ms in frame["lag"])
        for t, request_id, index, _tokens, *count in frame["chunks"]:
            if request_id == self.request_id:
                bucket = int(t // TICK_MS)
                if self._tick_bucket.get(index) != bucket:
                    self._tick_bucket[index] = bucket
                    self.chunks.append((t, index))
                # an entry stands for `count` chunks of the sample (one before the backend merged them)
                self.chunk_count += count[0] if count else 1
        for t, request_id, index, stage in frame["cancels"]:
            if request_id == self.request_id:
                self.cancels.append((t, index, stage))
        for t, request_id, index, size, us, _count in frame.get("reads", ()):
            if request_id == self.request_id:
                self.reads.append((t, index, size, us))
        if frame.get("tasks"):
            self.tasks = frame["tasks"]
        counts = frame["counts"]
        self.steps += counts["steps"]
        self.busy_ms += counts["busy_ms"]
        self.idle_ms += counts["idle_ms"]
        self.frames += counts["frames"]
        self.record_ns = counts.get("record_ns", self.record_ns)
        self.first_ms = frame["start_ms"] if self.first_ms is None else min(self.first_ms, frame["start_ms"])
        self.last_ms = frame["end_ms"] if self.last_ms is None else max(self.last_ms, frame["end_ms"])
        for start, end, request_id, prompt, cached, ended in frame.get("prefills", ()):
            if end is None:
                continue
            span = (start, end, prompt, cached, ended)
            if request_id == self.request_id:
                self.prefill = span
            elif request_id.startswith(f"{self.request_id}/"):  # fan-out: sub-request i's
                self.sub_prefills[int(request_id.rpartition("/")[2])] = span
            else:
                continue
            self.first_ms = min(self.first_ms, start)  # the plot starts where the prefill did
        self._forget_before(self.last_ms - WINDOW_MS)

    def _forget_before(self, cutoff: float) -> None:
        if self.slices and self.slices[0][1] < cutoff:
            self.slices = [s for s in self.slices if s[1] >= cutoff]
            self.idle = [i for i in self.idle if i[0] + i[1] >= cutoff]
            self.lag = [x for x in self.lag if x[0] >= cutoff]
            self.watched_lag = [x for x in self.watched_lag if x[0] >= cutoff]
            self.chunks = [c for c in self.chunks if c[0] >= cutoff]
            self.reads = [r for r in self.reads if r[0] >= cutoff]

    def figures(self) -> dict[str, float | None]:
        """Loop utilisation, lag p50/p99/max, longest stall, rates, cancel latency, the latest read
        (largest output in bytes, consumer time per output)."""
        span_s = ((self.last_ms or 0) - (self.first_ms or 0)) / 1000
        lags = [ms for _, ms in self.lag]
        measured = self.busy_ms + self.idle_ms
        received = [t for t, _, stage in self.cancels if stage == "received"]
        finished = [t for t, _, stage in self.cancels if stage == "finished"]
        cancel_ms = self.cancel_delay_ms
        if cancel_ms is None and received and finished and max(finished) >= min(received):
            cancel_ms = max(finished) - min(received)
        return {
            "utilisation": self.busy_ms / measured if measured else None,
            "lag_p50_ms": percentile(lags, 50),
            "lag_p99_ms": percentile(lags, 99),
            "lag_max_ms": max(lags) if lags else None,
            "longest_stall_ms": self.longest_step_ms or None,
            "callbacks_per_s": self.steps / span_s if span_s > 0 else None,
            "chunks_per_s": self.chunk_count / span_s if span_s > 0 else None,
            "frames_per_s": self.frames / span_s if span_s > 0 else None,
            "cancel_latency_ms": cancel_ms,
            "consume_steps": self.consume_steps or None,
            "consume_step_ms": self.consume_ms / self.consume_steps if self.consume_steps else None,
            "read_bytes": self.reads[-1][2] if self.reads else None,
            "read_us": self.reads[-1][3] if self.reads else None,
        }

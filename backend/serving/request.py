"""One request on a connection: its state without I/O (engine chunks in, protocol frames out), and
what the connection keeps of it while it runs (`RunningRequest`).

`RequestState` holds the promise of protocol v2: every accepted request gets exactly one `finish`
per index, then one `done`, and the text deltas of an index concatenate to that sample's output.
Chunks that arrive for an already finished sample (an engine racing an abort) are dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from backend.engines.base import Generation
from backend.frames import chunk_frame, done_frame, finish_frame
from backend.protocol import GenerateCommand
from backend.serving.stats import SampleTimer, request_stats
from backend.vocabulary import FINISH_REASONS, Chunk, SamplingParams


class RequestState:
    """Finish bookkeeping and stats of one accepted request."""

    def __init__(self, request_id: str, n: int, params: SamplingParams, started_at: float) -> None:
        self.request_id = request_id
        self.n = n
        self.started_at = started_at
        self.timers = [SampleTimer(started_at, params.sample_seed(i)) for i in range(n)]
        self.reasons: list[str | None] = [None] * n
        self._finished = 0
        self.abort_requested: set[int] = set()
        self.ended_at: float | None = None

    @property
    def finished(self) -> bool:
        """Every sample has its finish reason."""
        return self._finished == self.n

    def request_abort(self, index: int | None) -> list[int]:
        """Note a cancel; returns the indices it concerns that are still running."""
        targets = range(self.n) if index is None else [index]
        running = [i for i in targets if self.reasons[i] is None]
        self.abort_requested.update(running)
        return running

    def on_text(self, index: int, text: str, tokens: int, now: float) -> bool:
        """Note the text of a chunk of sample `index` that arrived at `now`; whether it is to be sent
        (`chunk_frame(request_id, index, text, tokens, now)`): not if it is empty, or the sample is
        unknown or finished. The server's path for chunks that do not finish their sample."""
        if not 0 <= index < self.n or self.reasons[index] is not None or not (text or tokens):
            return False
        self.timers[index].on_chunk(now, tokens)
        return True

    def on_chunk(self, chunk: Chunk, now: float) -> list[dict[str, Any]]:
        """Frames for one engine chunk: its text (if any), then its finish (if it ends the sample)."""
        index = chunk.index
        if not 0 <= index < self.n or self.reasons[index] is not None:
            return []
        frames: list[dict[str, Any]] = []
        if self.on_text(index, chunk.text, chunk.tokens, now):
            frames.append(
                chunk_frame(
                    self.request_id, index, chunk.text, chunk.tokens, now, chunk.logprobs, chunk.alternatives
                )
            )
        if chunk.finish_reason is not None:
            reason = chunk.finish_reason if chunk.finish_reason in FINISH_REASONS else "error"
            finish = self._finish(index, reason)
            if chunk.meta:
                # The engine's own figures (token counts, latency, an error message) for the UI.
                finish["engine"] = dict(chunk.meta)
            frames.append(finish)
        return frames

    def finish_unfinished(self) -> list[dict[str, Any]]:
        """Finish every sample the engine left open: "abort" if a cancel asked, else "error"."""
        return [
            self._finish(i, "abort" if i in self.abort_requested else "error")
            for i in range(self.n)
            if self.reasons[i] is None
        ]

    def done(self, now: float) -> dict[str, Any]:
        """The request's `done` frame; call once, after every sample finished."""
        self.ended_at = now
        stats = request_stats(self.timers, self.started_at, now)
        stats["finish_reasons"] = {
            reason: self.reasons.count(reason) for reason in FINISH_REASONS if reason in self.reasons
        }
        return done_frame(self.request_id, stats)

    def _finish(self, index: int, reason: str) -> dict[str, Any]:
        self.reasons[index] = reason
        self._finished += 1
        return finish_frame(self.request_id, index, reason, self.timers[index].stats())


@dataclass
class RunningRequest:
    """An accepted request: its bookkeeping, the engine's generation and the task consuming it."""

    command: GenerateCommand
    state: RequestState
    generation: Generation
    start_ns: int
    task: asyncio.Task[None] | None = None

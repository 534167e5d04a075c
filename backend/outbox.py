"""Frames waiting to go to one client, without I/O: a slow reader never stalls the engine.

While the socket is busy, chunks keep arriving; a new chunk of a sample whose previous chunk is
still queued is merged into it (texts concatenated, token counts added), as vLLM's per-request
collector merges deltas when its consumer lags. So the queue holds at most one chunk frame per
running sample, whatever the token rate, and the per-index order of text and `finish` is kept.
"""

from __future__ import annotations

from typing import Any

ChunkKey = tuple[str, int]


class Outbox:
    """Ordered frames for one connection, merging queued chunk frames of the same sample."""

    def __init__(self) -> None:
        self._frames: list[dict[str, Any]] = []
        self._queued_chunks: dict[ChunkKey, dict[str, Any]] = {}
        self.merged = 0
        """Chunk frames folded into an earlier queued one (how far the client lagged)."""
        self.pushed = 0
        """Frames pushed so far, merged or not: the send loop watches it to see a burst end."""

    def __len__(self) -> int:
        return len(self._frames)

    def push(self, frame: dict[str, Any]) -> None:
        """Queue a frame; a chunk may merge into its sample's queued chunk instead."""
        self.pushed += 1
        kind = frame.get("type")
        if kind == "chunk":
            key = (frame["id"], frame["index"])
            queued = self._queued_chunks.get(key)
            if queued is not None:
                queued["text"] += frame["text"]
                queued["tokens"] += frame["tokens"]
                self.merged += 1
                return
            frame = dict(frame)
            self._queued_chunks[key] = frame
        elif kind == "finish":
            # Later text of this sample (there is none by the protocol) must not jump the finish.
            self._queued_chunks.pop((frame["id"], frame["index"]), None)
        self._frames.append(frame)

    def drain(self) -> list[dict[str, Any]]:
        """Take every queued frame, in order; merging starts afresh."""
        frames, self._frames = self._frames, []
        self._queued_chunks.clear()
        return frames

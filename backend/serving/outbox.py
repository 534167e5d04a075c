"""Frames waiting to go to one client, without I/O: a slow reader never stalls the engine.

While the socket is busy, chunks keep arriving; a new chunk of a sample whose previous chunk is
still queued is merged into it (texts concatenated, token counts added), as vLLM's per-request
collector merges deltas when its consumer lags. So the queue holds at most one chunk frame per
running sample, whatever the token rate, and the per-index order of text and `finish` is kept.

Chunks are nearly every frame, so they are queued as compact entries (`push_chunk`: no frame dict
per token) and made frames only when drained; other frames are queued as dicts, or as the bytes
they are sent as (`push_encoded`).
"""

from __future__ import annotations

from typing import Any

import orjson

from backend.frames import chunk_frame, encode_bytes, to_microseconds

ChunkKey = tuple[str, int]


class _QueuedChunk:
    """A chunk frame waiting in the outbox; later chunks of its sample merge into it."""

    __slots__ = ("at", "index", "logprobs", "request_id", "text", "tokens")

    def __init__(
        self,
        request_id: str,
        index: int,
        text: str,
        tokens: int,
        at: float | None,
        logprobs: list[Any] | None,
    ) -> None:
        self.request_id = request_id
        self.index = index
        self.text = text
        self.tokens = tokens
        self.at = at
        self.logprobs = logprobs
        """The frame's `logprobs` pieces, where the request asked for them."""


class Outbox:
    """Ordered frames for one connection, merging queued chunk frames of the same sample."""

    def __init__(self) -> None:
        self._frames: list[dict[str, Any] | _QueuedChunk | bytes] = []
        self._queued_chunks: dict[ChunkKey, _QueuedChunk] = {}
        self.merged = 0
        """Chunk frames folded into an earlier queued one (how far the client lagged)."""
        self.pushed = 0
        """Frames pushed so far, merged or not: the send loop watches it to see a burst end."""

    def __len__(self) -> int:
        return len(self._frames)

    def push_chunk(
        self,
        request_id: str,
        index: int,
        text: str,
        tokens: int,
        at: float | None,
        pieces: list[Any] | None = None,
    ) -> int:
        """Queue the chunk frame `chunk_frame(request_id, index, text, tokens, at)` with its
        `logprobs` pieces (`[[text, [logprob, ...]], ...]`, where the request asked for them), or
        merge it into its sample's queued one; returns how many frames are queued."""
        self.pushed += 1
        key = (request_id, index)
        queued = self._queued_chunks.get(key)
        if queued is not None:
            queued.text += text
            queued.tokens += tokens
            if pieces is not None:
                if queued.logprobs is None:
                    queued.logprobs = []
                queued.logprobs.extend(pieces)
            self.merged += 1
        else:
            pieces = None if pieces is None else list(pieces)  # its own list, extended as chunks merge
            queued = self._queued_chunks[key] = _QueuedChunk(request_id, index, text, tokens, at, pieces)
            self._frames.append(queued)
        return len(self._frames)

    def push(self, frame: dict[str, Any]) -> int:
        """Queue a frame (a chunk may merge into its sample's queued chunk); returns how many frames
        are queued."""
        kind = frame.get("type")
        if kind == "chunk" and frame.keys() <= _CHUNK_FIELDS:
            request_id, index, text, tokens = frame["id"], frame["index"], frame["text"], frame["tokens"]
            return self.push_chunk(request_id, index, text, tokens, frame.get("at"), frame.get("logprobs"))
        self.pushed += 1
        if kind == "finish":
            # Later text of this sample (there is none by the protocol) must not jump the finish.
            self._queued_chunks.pop((frame["id"], frame["index"]), None)
        self._frames.append(frame)
        return len(self._frames)

    def push_encoded(self, data: bytes) -> int:
        """Queue a frame already encoded (frames.encode_bytes); returns how many frames are queued."""
        self.pushed += 1
        self._frames.append(data)
        return len(self._frames)

    def drain(self) -> list[dict[str, Any]]:
        """Take every queued frame, in order, as dicts; merging starts afresh."""
        return [_as_dict(entry) for entry in self._take()]

    def drain_encoded(self) -> list[bytes]:
        """Take every queued frame, in order, as the UTF-8 JSON text sent on the wire."""
        # One comprehension, the chunk frame's dict written out in it: this runs for every chunk
        # frame sent (tens of thousands a second), where a call to chunk_frame per chunk costs a
        # sixth more and a loop with appends a fifth more. Entries are queued chunks, frames
        # already encoded (bytes), or frame dicts.
        return [
            encode_bytes(
                {
                    "type": "chunk",
                    "id": e.request_id,
                    "index": e.index,
                    "text": e.text,
                    "tokens": e.tokens,
                    "at": to_microseconds(e.at),
                }
            )
            if e.__class__ is _QueuedChunk and e.at is not None and e.logprobs is None  # type: ignore[union-attr]
            else (e if e.__class__ is bytes else encode_bytes(_as_dict(e)))  # type: ignore[misc]
            for e in self._take()
        ]

    def _take(self) -> list[dict[str, Any] | _QueuedChunk | bytes]:
        frames, self._frames = self._frames, []
        self._queued_chunks.clear()
        return frames


_CHUNK_FIELDS = {"type", "id", "index", "text", "tokens", "at", "logprobs"}


def _as_dict(entry: dict[str, Any] | _QueuedChunk | bytes) -> dict[str, Any]:
    if isinstance(entry, _QueuedChunk):
        frame = chunk_frame(entry.request_id, entry.index, entry.text, entry.tokens, entry.at)
        if entry.logprobs is not None:
            frame["logprobs"] = entry.logprobs
        return frame
    if isinstance(entry, bytes):
        frame: dict[str, Any] = orjson.loads(entry)
        return frame
    return entry

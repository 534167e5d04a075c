"""Websocket protocol v2's frames on the wire, without I/O: how frames are encoded and batched into
messages and read back, and the frames themselves built (docs/protocol.md).

Client to server: `generate`, `replay`, `cancel` and `export_trace`, built by every client with
`generate_frame`, `replay_frame`, `cancel_frame` and `export_trace_frame` (backend.protocol parses
and checks them). Server to client: `accepted`, `queued`, `chunk`, `finish`, `done`, `trace`,
`trace_export`, `cancel_ack`, `error`.

A server message is one frame (a JSON object) or a batch of frames (a JSON array of them, in
order): the server writes the frames that are ready together as one message (`batch_messages`),
and clients read every message with `frames_in`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from backend.vocabulary import Alternatives, SamplingParams

BATCH_BYTES_MAX = 256 * 1024
"""A batch message holds frames up to about this many bytes (a frame bigger than this goes alone):
well under the 1 MiB websocket clients accept by default, and large enough that a send writes every
frame that is ready at n = 64 in one message."""


def encode_bytes(frame: dict[str, Any]) -> bytes:
    """A server frame as the UTF-8 JSON sent on the wire.

    orjson writes the same compact JSON as `json.dumps(separators=(",", ":"), ensure_ascii=False)`
    up to how a float is spelled (`1e-6` for `1e-06`), and non-finite floats as null, which JSON
    has no other word for. It costs a tenth of json.dumps on a live trace frame (36 us against 650
    at n = 64) and on a finish frame.
    A value orjson does not take (a key that is not a str, an int past 64 bits, a float subclass, a
    lone surrogate) goes through json.dumps, with what UTF-8 cannot carry replaced.
    """
    try:
        return orjson.dumps(frame)
    except TypeError:  # orjson.JSONEncodeError
        text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str)
        return text.encode("utf-8", "replace")


def batch_messages(frames: list[bytes], limit: int = BATCH_BYTES_MAX) -> list[bytes]:
    """Encoded frames (`encode_bytes`) as the server's messages, in order: a lone frame as itself,
    several as one JSON array, a new array whenever the next frame would take one past `limit`."""
    if len(frames) == 1:
        return frames
    messages: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for frame in frames:
        if batch and size + len(frame) > limit:
            messages.append(frame_batch(batch))
            batch, size = [], 0
        batch.append(frame)
        size += len(frame) + 1
    if batch:
        messages.append(frame_batch(batch))
    return messages


def frame_batch(frames: list[bytes]) -> bytes:
    """Encoded frames as one message: a lone frame as itself, several as a JSON array."""
    return frames[0] if len(frames) == 1 else b"[" + b",".join(frames) + b"]"


def frames_in(message: str | bytes) -> list[dict[str, Any]]:
    """The frames of one server message, in order (a client's reading of `batch_messages`).

    Raises ValueError when the message is not JSON, or not a frame or an array of frames."""
    value = orjson.loads(message)
    frames = value if isinstance(value, list) else [value]
    if not all(isinstance(frame, dict) for frame in frames):
        raise ValueError("a server message is a JSON object (one frame) or an array of objects")
    return frames


def encode(frame: dict[str, Any]) -> str:
    """A server frame as the JSON text sent on the wire (`encode_bytes`, decoded)."""
    return encode_bytes(frame).decode()


GENERATE_OPTIONS = (
    "format",
    "system",
    "prefix",
    "logprobs",
    "alternatives",
    "consumer",
    "fanout",
    "trace",
    "output_kind",
    "cancel_after",
)
"""A `generate` frame's fields besides `id`, `prompt`, `n` and `params`, as the frame spells them."""

REPLAY_OPTIONS = ("speed", "consumer", "fanout", "trace", "output_kind", "cancel_after")
"""A `replay` frame's fields besides `id` and `run`."""


def _client_frame(
    kind: str, request_id: str, known: tuple[str, ...], options: dict[str, Any]
) -> dict[str, Any]:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"a {kind} frame has no field {unknown[0]!r}; its fields: {', '.join(known)}")
    return {"type": kind, "id": request_id, **{k: v for k, v in options.items() if v is not None}}


def generate_frame(
    request_id: str, prompt: str, n: int = 1, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    """A client's `generate` frame: `n` samples of `prompt`, with `params` (PARAM_NAMES) and the frame's
    other fields (GENERATE_OPTIONS, as the frame spells them: `consumer={"mode": "blocking",
    "block_ms": 20}`); a field left None is left out, so the server's default applies. A name the
    protocol does not know is a TypeError where the frame is built, not an error frame later."""
    frame = _client_frame("generate", request_id, GENERATE_OPTIONS, options)
    frame["prompt"] = prompt
    frame["n"] = n
    if params:
        frame["params"] = params
    return frame


def replay_frame(request_id: str, run: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A client's `replay` frame: the saved run `run` (`backend.saved_run`'s JSON object) streamed
    again as request `request_id`, with REPLAY_OPTIONS (`speed`, the consumer, ...) as `generate_frame`."""
    frame = _client_frame("replay", request_id, REPLAY_OPTIONS, options)
    frame["run"] = run
    return frame


def cancel_frame(request_id: str, index: int | None = None) -> dict[str, Any]:
    """A client's `cancel` frame: every sample of the request, or only sample `index` (a column's Stop)."""
    frame: dict[str, Any] = {"type": "cancel", "id": request_id}
    if index is not None:
        frame["index"] = index
    return frame


def export_trace_frame(request_id: str) -> dict[str, Any]:
    """A client's `export_trace` frame: the request's trace, answered with a `trace_export` frame."""
    return {"type": "export_trace", "id": request_id}


def accepted_frame(
    request_id: str,
    n: int,
    engine: str,
    model: str,
    params: SamplingParams,
    *,
    prompt_format: str = "chat",
    format_reason: str = "",
    trace_off: str | None = None,
    at: float | None = None,
    engine_tasks: str = "",
) -> dict[str, Any]:
    """The server took the request; `params` echo what it will run with (the resolved seed too),
    `format` the prompt format it runs in and `format_reason` why; `trace_off`, when the request
    asked for the trace and the server has none, says why; `at` is when the request started, on the
    clock of the chunk frames' `at` (so a client has each chunk's time into the request);
    `engine_tasks` how the engine's task names begin (`Engine.task_prefix`), for the client's trace."""
    frame = {
        "type": "accepted",
        "id": request_id,
        "n": n,
        "engine": engine,
        "model": model,
        "engine_tasks": engine_tasks,
        "format": prompt_format,
        "format_reason": format_reason,
        "params": {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
        },
    }
    if trace_off is not None:
        frame["trace_off"] = trace_off
    if at is not None:
        frame["at"] = to_microseconds(at)
    return frame


def chunk_frame(
    request_id: str,
    index: int,
    text: str,
    tokens: int,
    at: float | None = None,
    logprobs: tuple[float, ...] | None = None,
    alternatives: tuple[Alternatives, ...] | None = None,
) -> dict[str, Any]:
    """New text of sample `index`; `tokens` counts the tokens in `text` (frames may coalesce).

    `at` is when the server got the (first) chunk from the engine, in seconds of the host's
    monotonic clock, so a client on the same host can measure the delivery latency. With
    `logprobs` (the chunk's tokens' log probabilities) the frame carries `"logprobs": [[text,
    [logprob, ...]]]`: pieces of the text, each with its tokens' log probabilities (a frame that
    coalesces chunks has a piece per chunk); with `alternatives` too, each piece carries its
    tokens' alternatives (`logprob_pieces`).
    """
    frame: dict[str, Any] = {
        "type": "chunk",
        "id": request_id,
        "index": index,
        "text": text,
        "tokens": tokens,
    }
    if at is not None:
        frame["at"] = to_microseconds(at)
    if logprobs is not None:
        frame["logprobs"] = logprob_pieces(text, logprobs, alternatives)
    return frame


def logprob_pieces(
    text: str, logprobs: tuple[float, ...], alternatives: tuple[Alternatives, ...] | None = None
) -> list[Any]:
    """A chunk's `logprobs` pieces: `[[text, [logprob, ...]]]`, and with alternatives
    `[[text, [logprob, ...], [[drawn, [[token, logprob], ...]], ...]]]`, one entry per token (the
    engine's tuples as they are: JSON writes them as arrays, and the engine rounded them)."""
    if alternatives is None:
        return [[text, list(logprobs)]]
    return [[text, list(logprobs), alternatives]]


def to_microseconds(seconds: float) -> float:
    """`seconds` to the nearest microsecond, written with at most 6 decimals (round(seconds, 6) in
    half its time; they differ by 1 us in a few of 100,000 values that are within rounding of a tie)."""
    return round(seconds * 1_000_000) / 1_000_000


def finish_frame(request_id: str, index: int, reason: str, stats: dict[str, Any]) -> dict[str, Any]:
    """Sample `index` ended; sent exactly once per index."""
    return {"type": "finish", "id": request_id, "index": index, "reason": reason, "stats": stats}


def done_frame(request_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    """Every sample of the request has finished; the last frame of a request."""
    return {"type": "done", "id": request_id, "stats": stats}


def trace_export_frame(request_id: str, trace_events: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace of one request in Chrome trace-event format (Perfetto opens it)."""
    return {"type": "trace_export", "id": request_id, "traceEvents": trace_events}


def cancel_ack_frame(
    request_id: str, index: int | None, aborting: list[int], t_ms: float | None = None
) -> dict[str, Any]:
    """The server's loop read a `cancel` (of every sample, or of sample `index`): `aborting` lists the
    samples it stops, empty where the request or the sample had already finished; `t_ms` is when
    it was read, on the trace's clock, where the server traces its loop."""
    frame: dict[str, Any] = {"type": "cancel_ack", "id": request_id, "index": index, "aborting": aborting}
    if t_ms is not None:
        frame["t_ms"] = t_ms
    return frame


def queued_frame(request_id: str, position: int) -> dict[str, Any]:
    """The request waits for room in the engine: `position` 1 is next in line; 0 means it started."""
    return {"type": "queued", "id": request_id, "position": position}


def error_frame(code: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """Something the server could not do; the connection stays usable."""
    return {"type": "error", "id": request_id, "code": code, "message": message}

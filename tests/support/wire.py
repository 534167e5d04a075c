"""What the tests send a backend's websocket and read back: a generate frame, the next frame of a
kind, every frame up to a request's `done`, and the texts, tokens and finishes in those frames."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection

from backend.frames import generate_frame
from devkit.frames import recv_frame

Frame = dict[str, Any]
OnFrame = Callable[[Frame, list[Frame]], Awaitable[None]]
"""Called with each frame of the request read until done, and the request's frames so far."""


def generate(
    request_id: str = "r1",
    n: int = 2,
    prompt: str = "hi",
    params: dict[str, Any] | None = None,
    **fields: Any,
) -> str:
    """A `generate` frame's text: `n` samples of `prompt` with `params` and the frame's other `fields`."""
    return json.dumps(generate_frame(request_id, prompt, n, params, **fields))


async def recv(ws: ClientConnection, limit_s: float | None = 10.0, skip_trace: bool = False) -> Frame:
    """The next frame (the next that is not a live trace frame, with `skip_trace`), waiting at most
    `limit_s` seconds for each message."""
    while True:
        frame = await recv_frame(ws, limit_s)
        if not (skip_trace and frame["type"] == "trace"):
            return frame


async def next_of(ws: ClientConnection, kind: str, limit_s: float = 10.0) -> Frame:
    """The next frame of type `kind`, the frames before it dropped; at most `limit_s` seconds in all."""
    async with asyncio.timeout(limit_s):
        while (frame := await recv_frame(ws))["type"] != kind:
            pass
    return frame


async def until_done(
    ws: ClientConnection,
    request_id: str | None = None,
    limit_s: float | None = 30.0,
    frame_s: float | None = 10.0,
    skip_trace: bool = False,
    stop_on_error: bool = False,
    on_frame: OnFrame | None = None,
) -> list[Frame]:
    """Every frame up to and including the `done` of `request_id` (of any request where None), or
    the first `error` with `stop_on_error`: other requests' frames included, live trace frames too
    unless `skip_trace`. At most `limit_s` seconds in all (None: no bound) and `frame_s` for each
    message; `on_frame` sees each of the request's frames as it comes."""
    frames: list[Frame] = []
    async with asyncio.timeout(limit_s):
        while True:
            frame = await recv(ws, frame_s, skip_trace)
            frames.append(frame)
            ours = request_id is None or frame.get("id") == request_id
            if ours and (frame["type"] == "done" or (stop_on_error and frame["type"] == "error")):
                return frames
            if ours and on_frame is not None:
                await on_frame(frame, frames)


def of_request(frames: list[Frame], kind: str, request_id: str | None = None) -> list[Frame]:
    """The frames of type `kind` (of `request_id` only, unless None)."""
    return [f for f in frames if f["type"] == kind and (request_id is None or f.get("id") == request_id)]


def texts_of(frames: list[Frame], request_id: str | None = None) -> dict[int, str]:
    """Each sample's text, its chunks joined (of `request_id` only, unless None)."""
    texts: dict[int, str] = {}
    for f in of_request(frames, "chunk", request_id):
        texts[f["index"]] = texts.get(f["index"], "") + f["text"]
    return texts


def tokens_of(frames: list[Frame], request_id: str | None = None) -> dict[int, int]:
    """Each sample's token count, its chunks' counts summed (of `request_id` only, unless None)."""
    tokens: dict[int, int] = {}
    for f in of_request(frames, "chunk", request_id):
        tokens[f["index"]] = tokens.get(f["index"], 0) + f["tokens"]
    return tokens


def finishes_of(frames: list[Frame], request_id: str | None = None) -> list[Frame]:
    """The `finish` frames (of `request_id` only, unless None)."""
    return of_request(frames, "finish", request_id)

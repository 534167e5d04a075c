"""Reading a backend's websocket one frame at a time, as tests and benchmarks do: each message's
frames (one, or a batch: `backend.frames.frames_in`) handed out in order."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any
from weakref import WeakKeyDictionary

from websockets.asyncio.client import ClientConnection

from backend.frames import frames_in

_pending: WeakKeyDictionary[ClientConnection, deque[dict[str, Any]]] = WeakKeyDictionary()
"""Frames received on a connection and not handed out yet (the rest of a batch)."""


async def recv_frame(ws: ClientConnection, limit_s: float | None = None) -> dict[str, Any]:
    """The next frame from `ws`; waits at most `limit_s` seconds for a message (TimeoutError)."""
    pending = _pending.get(ws)
    if pending is None:
        pending = _pending[ws] = deque()
    while not pending:
        message = await (ws.recv() if limit_s is None else asyncio.wait_for(ws.recv(), limit_s))
        pending.extend(frames_in(message))
    return pending.popleft()


def pending_frames(ws: ClientConnection) -> int:
    """Frames already received on `ws` and not handed out yet."""
    pending = _pending.get(ws)
    return len(pending) if pending else 0

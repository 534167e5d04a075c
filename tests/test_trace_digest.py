"""The live trace's digest in C gives exactly what the Python digest gives, on real and made rings."""

from __future__ import annotations

import array
import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines.synthetic import SyntheticEngine
from backend.serving.server import BackendServer
from backend.trace.frames import DIGESTS, connection_frame, digest_ring
from backend.trace.recorder import CANCEL, CHUNK, FRAME, IDLE, LAG, STEP

pytestmark = pytest.mark.skipif("c" not in DIGESTS, reason="the C digest is not built here")


def assert_same_digests(times: Any, items: list[Any], boundary: int, origin: int) -> None:
    python = digest_ring(times, items, boundary, origin, "python")
    c = digest_ring(times, items, boundary, origin, "c")
    assert c == python
    for connection in {*python.buckets_by_owner, *python.chunks, "nobody"}:
        assert connection_frame(c, origin, connection) == connection_frame(python, origin, connection)


async def _generate(port: int, request_id: str, cancel: dict[str, Any] | None, mode: str) -> None:
    async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
        frame = {"type": "generate", "id": request_id, "prompt": "hi", "n": 4, "trace": True}
        frame["params"] = {"max_tokens": 120, "seed": 5}
        frame["consumer"] = {"mode": mode, "block_ms": 2}
        await ws.send(json.dumps(frame))
        received = 0
        while True:
            reply = json.loads(await ws.recv())
            if reply["type"] == "chunk":
                received += 1
                # Early, while the request surely runs: when this client lags, chunks merge, and a
                # request of a few hundred tokens can arrive in only a few frames.
                if cancel is not None and received == 3:
                    await ws.send(json.dumps({"type": "cancel", "id": request_id, **cancel}))
            if reply["type"] == "done":
                return


async def test_c_digest_equals_python_digest_on_a_real_servers_ring() -> None:
    server = BackendServer(SyntheticEngine(rate=300, jitter=0.3), port=0)
    await server.start()
    try:
        await asyncio.gather(
            _generate(server.port, "a", None, "cooperative"),
            _generate(server.port, "b", {"index": 1}, "greedy"),
            _generate(server.port, "c", {}, "blocking"),
        )
        await asyncio.sleep(0.05)  # idle waits and heartbeats after the runs
        tracer = server.tracer
        assert tracer is not None
        times, items, boundary, _ = tracer.raw_since(0)
    finally:
        await server.close()
    kinds = {item[0] for item in items if item.__class__ is not str}
    assert {IDLE, LAG, CHUNK, FRAME, CANCEL} <= kinds
    python = digest_ring(times, items, boundary, tracer.origin_ns, "python")
    assert len(python.buckets_by_owner) >= 3  # three connections' tasks
    for cut in (0, 1, 2, len(items) // 3, len(items) // 2, len(items) - 5):
        start_boundary = boundary if cut == 0 else -1
        assert_same_digests(times[cut:], items[cut:], start_boundary, tracer.origin_ns)
        assert_same_digests(list(times[cut:]), items[cut:], times[cut - 1] if cut else -1, tracer.origin_ns)


def test_c_digest_equals_python_digest_on_edge_cases() -> None:
    ms = 1_000_000
    times: list[int] = []
    items: list[Any] = []

    def add(at: int, item: Any) -> None:
        times.append(at)
        items.append(item)

    add(10 * ms, "engine-sample-1")  # start unknown: left out
    add(11 * ms, "engine-sample-2")
    add(12 * ms, "consume r1 @c1")
    add(13 * ms, "consume r1 @c2")
    add(13 * ms, (CHUNK, 0, ("c1", "r1"), (0, 2)))
    add(14 * ms, (CHUNK, 0, ("c1", "r1"), (0, 3)))
    add(40 * ms, (CHUNK, 0, ("c1", "r1"), (0, 1)))  # past the bin: a new entry
    add(15 * ms, "send @c1")
    add(16 * ms, (IDLE, 3 * ms, None, 2))
    add(19 * ms, (IDLE, 10_000, None, 0))  # too short to draw, still counted
    add(20 * ms, "consume r1 @c2")
    add(2 * ms, (STEP, 1 * ms, "consume r1 @c1", None))  # a step with its own start, back in time
    add(21 * ms, (LAG, 4 * ms, None, None))
    add(22 * ms, (FRAME, 0, "c1", (3, 120)))
    add(23 * ms, (FRAME, 0, "c1", (1, 40)))
    add(24 * ms, (CANCEL, 0, ("c2", "r1"), ("received", None)))
    add(25 * ms, (CANCEL, 0, ("c2", "r1"), ("aborted", 1)))
    add(90 * ms, "consume r1 @c1")  # past the merge gap: a new slice
    add(91 * ms, "Task-7")
    add(92 * ms, "heartbeat")
    add(93 * ms, (7, 0, None, None))  # an unknown kind is ignored by both
    for boundary in (-1, 9 * ms):
        assert_same_digests(array.array("q", times), items, boundary, 5 * ms)
        assert_same_digests(times, items, boundary, 5 * ms)
    assert_same_digests([], [], -1, 0)


def test_c_digest_refuses_a_malformed_ring_instead_of_crashing() -> None:
    with pytest.raises(TypeError):
        digest_ring([1, 2], ["ok", ("too", "short")], 0, 0, "c")
    with pytest.raises(ValueError):
        digest_ring([1, 2, 3], ["a", "b"], 0, 0, "c")
    with pytest.raises(ValueError, match="digest must be one of"):
        digest_ring([], [], 0, 0, "fortran")

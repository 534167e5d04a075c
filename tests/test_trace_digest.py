"""The live trace's digest (backend/trace/trace_digest.c): a hand-checked ring, a real server's ring
(its totals against the raw events, split rings adding up), and malformed rings refused."""

from __future__ import annotations

import array
import asyncio
import json
import os
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.frames import cancel_frame
from backend.trace import recorder
from backend.trace.frames import connection_frame, digest_ring
from backend.trace.recorder import CANCEL, CHUNK, FRAME, IDLE, LAG, STEP
from tests.support.backends import synthetic_serving
from tests.support.wire import generate, of_request, until_done

pytestmark = pytest.mark.skipif(
    not recorder.available() and not os.environ.get("CI"), reason="the tracer's C parts are not built here"
)

MS = 1_000_000


async def _generate(port: int, request_id: str, cancel: dict[str, Any] | None, mode: str) -> None:
    async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
        consumer = {"mode": mode, "block_ms": 2}
        await ws.send(
            generate(request_id, 4, "hi", {"max_tokens": 120, "seed": 5}, trace=True, consumer=consumer)
        )

        async def on_frame(frame: dict[str, Any], frames: list[dict[str, Any]]) -> None:
            # Early, while the request surely runs: when this client lags, chunks merge, and a
            # request of a few hundred tokens can arrive in only a few frames.
            if cancel is not None and frame["type"] == "chunk" and len(of_request(frames, "chunk")) == 3:
                await ws.send(json.dumps(cancel_frame(request_id, cancel.get("index"))))

        await until_done(ws, limit_s=None, frame_s=None, on_frame=on_frame)


async def test_a_real_servers_ring_digests_to_its_own_totals() -> None:
    async with synthetic_serving(300, 0.3) as server:
        await asyncio.gather(
            _generate(server.port, "a", None, "cooperative"),
            _generate(server.port, "b", {"index": 1}, "greedy"),
            _generate(server.port, "c", {}, "blocking"),
        )
        await asyncio.sleep(0.05)  # idle waits and heartbeats after the runs
        tracer = server.tracer
        assert tracer is not None
        times, items, boundary, _ = tracer.raw_since(0)
    kinds = {item[0] for item in items if item.__class__ is not str}
    assert {IDLE, LAG, CHUNK, FRAME, CANCEL} <= kinds
    origin = tracer.origin_ns
    digest = digest_ring(times, items, boundary, origin)
    assert len(digest.buckets_by_owner) == 3  # three connections' tasks
    assert (digest.steps, digest.busy_ns) == _step_totals(times, items, boundary)
    assert digest.idle_ns == sum(i[1] for i in items if i.__class__ is not str and i[0] == IDLE)
    chunk_tokens = sum(i[3][1] for i in items if i.__class__ is not str and i[0] == CHUNK)
    assert sum(entry[3] for entries in digest.chunks.values() for entry in entries) == chunk_tokens
    written = [i for i in items if i.__class__ is not str and i[0] == FRAME]
    for label, (frames, size) in digest.frames.items():
        assert frames == sum(i[3][0] for i in written if i[2] == label)
        assert size == sum(i[3][1] for i in written if i[2] == label)
    assert sorted(digest.cancels) == ["c2", "c3"]  # "b" stopped one sample, "c" cancelled all
    for connection in [*digest.buckets_by_owner, "nobody"]:
        frame = connection_frame(digest, origin, connection)
        # Every step is in the frame once: its own lanes, the unowned ones, or "other connection".
        assert sum(s[4] for s in frame["slices"]) == digest.steps
        assert sum(s[2] for s in frame["slices"]) == pytest.approx(
            digest.busy_ns / 1e6, abs=0.01 * digest.steps
        )
    # A ring read in two parts (as the feed reads it, frame by frame) digests to the same totals.
    for cut in (1, len(items) // 3, len(items) // 2, len(items) - 5):
        first = digest_ring(times[:cut], items[:cut], boundary, origin)
        rest = digest_ring(
            list(times[cut:]), items[cut:], _boundary_after(times[:cut], items[:cut], boundary), origin
        )
        assert first.steps + rest.steps == digest.steps
        assert first.busy_ns + rest.busy_ns == digest.busy_ns
        assert first.idle_ns + rest.idle_ns == digest.idle_ns


def _step_totals(times: Any, items: list[Any], boundary: int) -> tuple[int, int]:
    """The ring's steps and their time, each str step starting where the previous step or idle wait
    ended (and left out while that is unknown, boundary -1)."""
    steps = busy = 0
    for at, item in zip(times, items, strict=True):
        if item.__class__ is str:
            if boundary >= 0:
                steps += 1
                busy += at - boundary
            boundary = at
        elif item[0] == STEP:
            steps += 1
            busy += item[1]
            boundary = at + item[1]
        elif item[0] == IDLE:
            boundary = at + item[1]
    return steps, busy


def _boundary_after(times: Any, items: list[Any], boundary: int) -> int:
    """Where the step after these entries starts: the end of their last step or idle wait."""
    for at, item in zip(times, items, strict=True):
        if item.__class__ is str:
            boundary = at
        elif item[0] in (STEP, IDLE):
            boundary = at + item[1]
    return boundary


def _hand_made_ring() -> tuple[list[int], list[Any]]:
    times: list[int] = []
    items: list[Any] = []

    def add(at: int, item: Any) -> None:
        times.append(at)
        items.append(item)

    add(10 * MS, "engine-sample-1")  # start unknown (boundary -1): left out
    add(11 * MS, "engine-sample-2")  # 10-11
    add(12 * MS, "consume r1 @c1")  # 11-12
    add(13 * MS, "consume r1 @c2")  # 12-13
    add(13 * MS, (CHUNK, 0, ("c1", "r1"), (0, 2)))
    add(14 * MS, (CHUNK, 0, ("c1", "r1"), (0, 3)))  # within 20 ms of the first: merged
    add(40 * MS, (CHUNK, 0, ("c1", "r1"), (0, 1)))  # past the bin: a new entry
    add(15 * MS, "send @c1")  # 13-15
    add(16 * MS, (IDLE, 3 * MS, None, 2))  # 16-19
    add(19 * MS, (IDLE, 10_000, None, 0))  # too short to draw, still counted
    add(20 * MS, "consume r1 @c2")  # 19.01-20
    add(2 * MS, (STEP, 1 * MS, "consume r1 @c1", None))  # a step with its own start, back in time
    add(21 * MS, (LAG, 4 * MS, None, None))
    add(22 * MS, (FRAME, 0, "c1", (3, 120)))
    add(23 * MS, (FRAME, 0, "c1", (1, 40)))
    add(24 * MS, (CANCEL, 0, ("c2", "r1"), ("received", None)))
    add(25 * MS, (CANCEL, 0, ("c2", "r1"), ("aborted", 1)))
    add(90 * MS, "consume r1 @c1")  # 3-90 (after the step at 2-3): past the merge gap, a new slice
    add(91 * MS, "Task-7")  # 90-91
    add(92 * MS, "heartbeat")  # 91-92
    add(93 * MS, (7, 0, None, None))  # an unknown kind is ignored
    return times, items


def test_a_hand_made_ring_digests_as_worked_out() -> None:
    times, items = _hand_made_ring()
    for ring_times in (times, array.array("q", times)):
        digest = digest_ring(ring_times, items, -1, 5 * MS)
        assert (digest.start_ns, digest.end_ns, digest.steps) == (10 * MS, 93 * MS, 9)
        assert (digest.busy_ns, digest.idle_ns) == (95_990_000, 3_010_000)
        assert digest.names == [
            "engine-sample",
            "consume r1 @c1",
            "consume r1 @c2",
            "send @c1",
            "Task",
            "heartbeat",
        ]
        assert digest.names_by_owner == {None: [0, 4, 5], "c1": [1, 3], "c2": [2]}
        assert digest.slices_by_owner == {
            None: [
                [10 * MS, 11 * MS, MS, 0, 1, MS],
                [90 * MS, 91 * MS, MS, 4, 1, MS],
                [91 * MS, 92 * MS, MS, 5, 1, MS],
            ],
            "c1": [[11 * MS, 90 * MS, 89 * MS, 1, 3, 87 * MS], [13 * MS, 15 * MS, 2 * MS, 3, 1, 2 * MS]],
            "c2": [[12 * MS, 13 * MS, MS, 2, 1, MS], [19_010_000, 20 * MS, 990_000, 2, 1, 990_000]],
        }
        assert digest.owned_buckets == {
            0: [88 * MS, 2, 87 * MS, "c1", 0],
            2: [4 * MS, 3, 2 * MS, "c1", MS],
            3: [990_000, 1, 990_000, "c2", 0],
        }
        assert digest.buckets_by_owner == {
            "c1": {0: [88 * MS, 2], 2: [3 * MS, 2]},
            "c2": {2: [MS, 1], 3: [990_000, 1]},
        }
        assert digest.idle == [[11.0, 3.0]] and digest.lag == [[16.0, 4.0]]
        assert digest.chunks == {"c1": [[13 * MS, "r1", 0, 5, 2], [40 * MS, "r1", 0, 1, 1]]}
        assert digest.cancels == {"c2": [[19.0, "r1", None, "received"], [20.0, "r1", 1, "aborted"]]}
        assert digest.frames == {"c1": [4, 160]}
    # With the first step's start known (9 ms), it counts too.
    digest = digest_ring(times, items, 9 * MS, 5 * MS)
    assert (digest.start_ns, digest.steps, digest.busy_ns) == (9 * MS, 10, 96_990_000)
    assert digest.slices_by_owner[None][0] == [9 * MS, 11 * MS, 2 * MS, 0, 2, MS]


def test_each_connection_sees_its_own_work_and_others_as_other_connection() -> None:
    times, items = _hand_made_ring()
    digest = digest_ring(times, items, -1, 5 * MS)
    c1 = connection_frame(digest, 5 * MS, "c1")
    assert c1["names"] == ["engine-sample", "Task", "heartbeat", "consume r1", "send", "other connection"]
    assert c1["chunks"] == [[8.0, "r1", 0, 5, 2], [35.0, "r1", 0, 1, 1]] and c1["cancels"] == []
    assert c1["counts"] == {"steps": 9, "busy_ms": 95.99, "idle_ms": 3.01, "frames": 4, "frame_bytes": 160}
    assert c1["slices"] == [
        [5.0, 6.0, 1.0, 0, 1, 1.0],
        [5.0, 10.0, 1.0, 5, 1, 1.0],  # c2's step at 12-13, in its 5 ms bucket
        [6.0, 85.0, 89.0, 3, 3, 87.0],
        [8.0, 10.0, 2.0, 4, 1, 2.0],
        [10.0, 15.0, 0.99, 5, 1, 0.99],
        [85.0, 86.0, 1.0, 1, 1, 1.0],
        [86.0, 87.0, 1.0, 2, 1, 1.0],
    ]
    assert (c1["start_ms"], c1["end_ms"], c1["idle"], c1["lag"]) == (5.0, 88.0, [[11.0, 3.0]], [[16.0, 4.0]])
    c2 = connection_frame(digest, 5 * MS, "c2")
    assert c2["chunks"] == [] and c2["cancels"] == [
        [19.0, "r1", None, "received"],
        [20.0, "r1", 1, "aborted"],
    ]
    assert [5.0, 10.0, 3.0, 4, 2, 2.0] in c2["slices"]  # c1's two steps in the 5-10 ms bucket
    nobody = connection_frame(digest, 5 * MS, "nobody")
    assert nobody["names"] == ["engine-sample", "Task", "heartbeat", "other connection"]
    assert [-5.0, 0.0, 88.0, 3, 2, 87.0] in nobody["slices"]  # bucket 0: c1's 87 ms step and its 1 ms one
    assert sum(s[4] for s in nobody["slices"]) == 9


def test_an_empty_ring_digests_to_nothing() -> None:
    digest = digest_ring([], [], -1, 0)
    assert (digest.steps, digest.busy_ns, digest.start_ns, digest.end_ns) == (0, 0, -1, -1)
    assert connection_frame(digest, 0, "c1")["slices"] == []


def test_a_malformed_ring_is_refused_instead_of_crashing() -> None:
    with pytest.raises(TypeError):
        digest_ring([1, 2], ["ok", ("too", "short")], 0, 0)
    with pytest.raises(ValueError):
        digest_ring([1, 2, 3], ["a", "b"], 0, 0)

"""Request bookkeeping and the outbox, without a socket."""

from __future__ import annotations

import json

import orjson

from backend.frames import chunk_frame, done_frame, finish_frame
from backend.serving.outbox import Outbox
from backend.serving.request import RequestState
from backend.vocabulary import Chunk, SamplingParams

PARAMS = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.95, seed=100)


def test_chunks_then_one_finish_per_index_then_done() -> None:
    state = RequestState("r1", 2, PARAMS, started_at=0.0)
    frames = state.on_chunk(Chunk(0, "Hello", 1), 0.1)
    frames += state.on_chunk(Chunk(1, "Hi", 1), 0.1)
    frames += state.on_chunk(Chunk(0, " there", 1, "stop"), 0.2)
    assert not state.finished
    frames += state.on_chunk(Chunk(1, "", 0, "length"), 0.3)
    assert state.finished
    assert [f["type"] for f in frames] == ["chunk", "chunk", "chunk", "finish", "finish"]
    finishes = [f for f in frames if f["type"] == "finish"]
    assert [(f["index"], f["reason"]) for f in finishes] == [(0, "stop"), (1, "length")]
    assert finishes[0]["stats"]["seed"] == 100 and finishes[1]["stats"]["seed"] == 101
    done = state.done(0.4)
    assert done["type"] == "done"
    assert done["stats"]["tokens"] == 3
    assert done["stats"]["finish_reasons"] == {"stop": 1, "length": 1}


def test_every_frame_of_a_request_is_plain_json_for_orjson() -> None:
    # Stats come from numpy: a numpy float left in a frame would send it down json.dumps's slow path.
    state = RequestState("r1", 3, PARAMS, started_at=0.0)
    frames = []
    for step in range(1, 40):
        for index in range(3):
            reason = "stop" if step == 39 else None
            frames += state.on_chunk(Chunk(index, " word", 1, reason), step * 0.02 + index * 0.001)
    frames.append(state.done(1.0))
    for frame in frames:
        assert json.loads(orjson.dumps(frame)) == frame


def test_chunks_after_a_finish_are_dropped() -> None:
    state = RequestState("r1", 1, PARAMS, 0.0)
    state.on_chunk(Chunk(0, "", 0, "abort"), 0.1)
    assert state.on_chunk(Chunk(0, "late", 1), 0.2) == []
    assert state.on_chunk(Chunk(0, "", 0, "stop"), 0.2) == []
    assert state.on_chunk(Chunk(5, "bad index", 1), 0.2) == []


def test_unknown_finish_reasons_become_error() -> None:
    state = RequestState("r1", 1, PARAMS, 0.0)
    (frame,) = state.on_chunk(Chunk(0, "", 0, "exploded"), 0.1)
    assert frame["reason"] == "error"


def test_samples_the_engine_left_open_finish_as_abort_or_error() -> None:
    state = RequestState("r1", 3, PARAMS, 0.0)
    state.on_chunk(Chunk(0, "x", 1, "stop"), 0.1)
    assert state.request_abort(1) == [1]
    assert state.request_abort(0) == []  # already finished
    frames = state.finish_unfinished()
    assert [(f["index"], f["reason"]) for f in frames] == [(1, "abort"), (2, "error")]
    assert state.finished
    assert state.finish_unfinished() == []


def test_outbox_merges_queued_chunks_of_one_sample() -> None:
    outbox = Outbox()
    outbox.push(chunk_frame("r1", 0, "a", 1))
    outbox.push(chunk_frame("r1", 1, "x", 1))
    outbox.push(chunk_frame("r1", 0, "b", 1))
    outbox.push(chunk_frame("r1", 0, "c", 2))
    outbox.push(finish_frame("r1", 0, "stop", {}))
    outbox.push(chunk_frame("r1", 1, "y", 1))
    outbox.push(done_frame("r1", {}))
    frames = outbox.drain()
    assert [(f["type"], f.get("index"), f.get("text")) for f in frames] == [
        ("chunk", 0, "abc"),
        ("chunk", 1, "xy"),
        ("finish", 0, None),
        ("done", None, None),
    ]
    assert frames[0]["tokens"] == 4
    assert outbox.merged == 3
    assert len(outbox) == 0


def test_encoded_frames_keep_their_place_in_the_outbox() -> None:
    outbox = Outbox()
    outbox.push(chunk_frame("r1", 0, "a", 1, 1.5))
    outbox.push_encoded(b'{"type":"trace","names":[]}')
    outbox.push(chunk_frame("r1", 0, "b", 1, 1.6))  # merges into the queued chunk, before the trace
    outbox.push(done_frame("r1", {}))
    assert [json.loads(m) for m in outbox.drain_encoded()] == [
        chunk_frame("r1", 0, "ab", 2, 1.5),
        {"type": "trace", "names": []},
        done_frame("r1", {}),
    ]
    outbox.push_encoded(b'{"type":"trace","names":["x"]}')
    assert outbox.drain() == [{"type": "trace", "names": ["x"]}]


def test_outbox_does_not_merge_across_a_drain_or_mutate_pushed_frames() -> None:
    outbox = Outbox()
    first = chunk_frame("r1", 0, "a", 1)
    outbox.push(first)
    assert outbox.drain()[0]["text"] == "a"
    outbox.push(chunk_frame("r1", 0, "b", 1))
    outbox.push(chunk_frame("r1", 0, "c", 1))
    assert [f["text"] for f in outbox.drain()] == ["bc"]
    assert first["text"] == "a"


def test_outbox_keeps_requests_apart() -> None:
    outbox = Outbox()
    outbox.push(chunk_frame("r1", 0, "a", 1))
    outbox.push(chunk_frame("r2", 0, "b", 1))
    assert [(f["id"], f["text"]) for f in outbox.drain()] == [("r1", "a"), ("r2", "b")]


def test_outbox_chunks_pushed_without_a_frame_merge_like_frames() -> None:
    outbox = Outbox()
    outbox.push_chunk("r1", 0, "a", 1, 0.5)
    outbox.push(chunk_frame("r1", 0, "b", 1, 0.6))
    outbox.push_chunk("r1", 1, "x", 1, 0.7)
    outbox.push(finish_frame("r1", 0, "stop", {}))
    assert outbox.push_chunk("r1", 0, "late", 1, 0.8) == 4  # after the finish: its own frame
    assert outbox.merged == 1
    frames = outbox.drain()
    assert frames[0] == chunk_frame("r1", 0, "ab", 2, 0.5)
    assert [(f["type"], f.get("index"), f.get("text")) for f in frames[1:]] == [
        ("chunk", 1, "x"),
        ("finish", 0, None),
        ("chunk", 0, "late"),
    ]


def test_outbox_encodes_what_it_drains() -> None:
    pushes = [
        chunk_frame("r1", 0, "a", 1, 1.25),
        chunk_frame("r1", 0, ' "b"', 1, 1.5),
        chunk_frame("r1", 1, "no at", 1),
        finish_frame("r1", 0, "stop", {"tokens": 2}),
        done_frame("r1", {"n": 2}),
    ]
    first, second = Outbox(), Outbox()
    for frame in pushes:
        first.push(frame)
        second.push(frame)
    assert [json.loads(message) for message in first.drain_encoded()] == second.drain()


def test_on_text_records_only_text_of_running_samples() -> None:
    state = RequestState("r1", 2, PARAMS, 0.0)
    assert state.on_text(0, "a", 1, 0.1)
    assert not state.on_text(0, "", 0, 0.2)  # nothing to send
    assert not state.on_text(2, "x", 1, 0.2)  # no such sample
    state.on_chunk(Chunk(1, "", 0, "abort"), 0.2)
    assert not state.on_text(1, "late", 1, 0.3)
    assert state.timers[0].tokens == 1 and state.timers[1].tokens == 0

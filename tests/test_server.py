"""The backend through a real websocket client: streams, cancel, disconnect, every bad input."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.config.settings import Limits
from backend.engines.base import Generation
from backend.engines.synthetic import SyntheticEngine, synthetic_tokens
from backend.frames import cancel_frame, frames_in, generate_frame
from backend.serving import connection as connection_module
from backend.serving.connection import ClientSession, ServerSide
from backend.serving.server import BackendServer
from devkit.local import ROOT, free_port
from tests.support import wire
from tests.support.backends import serving
from tests.support.wire import finishes_of, generate, texts_of

STORY = "Tell a story."

SERVER_JITTER = 0.3
SERVER_LIMITS = Limits(max_requests_per_connection=3)
"""The conftest `server` fixture's engine and limits: a connection may make three requests."""

recv = functools.partial(wire.recv, skip_trace=True)
"""The next frame that is not a live trace frame (tests/test_trace.py covers those)."""
until_done = functools.partial(wire.until_done, skip_trace=True)


def health(backend: BackendServer) -> dict[str, Any]:
    url = f"http://127.0.0.1:{backend.port}/health"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def test_n4_streams_each_sample_exactly(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 4, STORY, {"max_tokens": 30, "seed": 7}))
        accepted = await recv(ws)
        assert accepted["type"] == "accepted"
        assert (accepted["id"], accepted["n"], accepted["engine"]) == ("r1", 4, "synthetic")
        assert accepted["params"]["seed"] == 7
        frames = await until_done(ws, "r1")
    finishes = finishes_of(frames, "r1")
    assert sorted(f["index"] for f in finishes) == [0, 1, 2, 3]
    texts = texts_of(frames, "r1")
    for finish in finishes:
        index = finish["index"]
        tokens, reason = synthetic_tokens(7 + index, 30, 0.8)
        assert texts[index] == "".join(tokens)
        assert finish["reason"] == reason
        stats = finish["stats"]
        assert stats["seed"] == 7 + index
        assert stats["tokens"] == len(tokens)
        assert stats["ttft_ms"] > 0 and stats["itl_p50_ms"] > 0 and stats["tpot_ms"] > 0
        assert stats["itl_p99_ms"] >= stats["itl_p50_ms"]
        assert 20 < stats["tokens_per_s"] < 150  # 100 tok/s per sample, measured
    # nothing of an index comes after its finish
    for finish in finishes:
        position = frames.index(finish)
        assert not [f for f in frames[position + 1 :] if f.get("index") == finish["index"]]
    done = frames[-1]
    assert done["stats"]["n"] == 4
    assert done["stats"]["tokens"] == sum(f["stats"]["tokens"] for f in finishes)


async def test_random_seed_is_reported(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 2, STORY, {"max_tokens": 3}))
        accepted = await recv(ws)
        seed = accepted["params"]["seed"]
        assert isinstance(seed, int)
        frames = await until_done(ws, "r1")
    assert sorted(f["stats"]["seed"] for f in finishes_of(frames, "r1")) == [seed, seed + 1]


async def test_cancel_one_sample_leaves_the_others_running(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(
            generate("r1", 4, STORY, {"max_tokens": 60, "seed": 1, "temperature": 0})
        )  # every sample runs to length
        assert (await recv(ws))["type"] == "accepted"
        frames: list[dict[str, Any]] = []
        while len([f for f in frames if f["type"] == "chunk"]) < 8:
            frames.append(await recv(ws))
        await ws.send(json.dumps(cancel_frame("r1", 2)))
        frames += await until_done(ws, "r1")
    reasons = {f["index"]: f["reason"] for f in finishes_of(frames, "r1")}
    assert reasons == {0: "length", 1: "length", 2: "abort", 3: "length"}
    tokens = {f["index"]: f["stats"]["tokens"] for f in finishes_of(frames, "r1")}
    assert tokens[2] < 60 and tokens[0] == tokens[1] == tokens[3] == 60
    assert texts_of(frames, "r1")[2] == "".join(synthetic_tokens(0, 60, 0)[0][: tokens[2]])


async def test_cancel_all_stops_the_engine(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 4, STORY, {"max_tokens": 1000, "seed": 1, "temperature": 0}))
        assert (await recv(ws))["type"] == "accepted"
        for _ in range(6):
            await recv(ws)
        assert server.engine.health()["running_samples"] == 4
        await ws.send(json.dumps(cancel_frame("r1")))
        frames = await until_done(ws, "r1", limit_s=2.0)
        assert {f["reason"] for f in finishes_of(frames, "r1")} == {"abort"}
        assert len(finishes_of(frames, "r1")) == 4
        assert server.engine.health()["running_samples"] == 0
        assert frames[-1]["stats"]["finish_reasons"] == {"abort": 4}
        # the connection is still usable
        await ws.send(generate("r2", 1, STORY, {"max_tokens": 2}))
        assert (await recv(ws))["type"] == "accepted"
        await until_done(ws, "r2")


async def test_disconnect_aborts_requests_in_the_engine(server: BackendServer) -> None:
    ws = await connect(server.url)
    await ws.send(generate("a", 4, STORY, {"max_tokens": 1000}))
    await ws.send(generate("b", 3, STORY, {"max_tokens": 1000}))
    for _ in range(10):
        await recv(ws)
    assert server.engine.health()["running_samples"] == 7
    assert (await asyncio.to_thread(health, server))["active_requests"] == 2
    await ws.close()
    async with asyncio.timeout(2):
        while server.engine.health()["running_samples"] or server.sessions:  # noqa: ASYNC110 - no event to await
            await asyncio.sleep(0.01)
    report = await asyncio.to_thread(health, server)
    assert report["running_samples"] == 0 and report["connections"] == 0 and report["active_requests"] == 0


async def test_several_requests_share_one_connection(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("a", 2, STORY, {"max_tokens": 20, "seed": 1}))
        await ws.send(generate("b", 3, STORY, {"max_tokens": 10, "seed": 2}))
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(20):
            while len([f for f in frames if f["type"] == "done"]) < 2:
                frames.append(await recv(ws))
    assert len(finishes_of(frames, "a")) == 2 and len(finishes_of(frames, "b")) == 3
    assert texts_of(frames, "b")[2] == "".join(synthetic_tokens(4, 10, 0.8)[0])
    # the two requests interleaved on the wire
    ids = [f["id"] for f in frames if f["type"] == "chunk"]
    first_b = ids.index("b")
    assert "a" in ids[first_b:]


BAD_FRAMES = [
    ("not json at all", "bad_json"),
    ('{"type": "dance", "id": "x"}', "unknown_type"),
    ('{"type": "generate", "id": "x"}', "missing_field"),
    ('{"type": "generate", "id": "x", "prompt": 3}', "bad_field"),
    ('{"type": "generate", "id": "x", "prompt": "hi", "n": 0}', "n_out_of_range"),
    ('{"type": "generate", "id": "x", "prompt": "hi", "n": 33}', "n_out_of_range"),
    ('{"type": "generate", "id": "x", "prompt": ""}', "empty_prompt"),
    (json.dumps(generate_frame("x", "y" * 20_000)), "prompt_too_long"),
    (json.dumps(generate_frame("x", "y" * 100_000)), "frame_too_large"),
    (
        '{"type": "generate", "id": "x", "prompt": "hi", "params": {"max_tokens": 0}}',
        "max_tokens_out_of_range",
    ),
    (
        '{"type": "generate", "id": "x", "prompt": "hi", "params": {"max_tokens": 99999}}',
        "max_tokens_out_of_range",
    ),
    ('{"type": "generate", "id": "x", "prompt": "hi", "params": {"top_p": 2}}', "top_p_out_of_range"),
    ('{"type": "cancel", "id": "nobody"}', "unknown_id"),
]


async def test_every_bad_input_gets_an_error_and_the_connection_keeps_working(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        for raw, code in BAD_FRAMES:
            await ws.send(raw)
            frame = await recv(ws)
            assert frame["type"] == "error", raw
            assert frame["code"] == code, raw
            assert frame["message"]
        await ws.send(b"\x00\x01binary")
        assert (await recv(ws))["code"] == "bad_frame"
        # a valid request afterwards runs normally
        await ws.send(generate("ok", 2, STORY, {"max_tokens": 5}))
        assert (await recv(ws))["type"] == "accepted"
        frames = await until_done(ws, "ok")
        assert len(finishes_of(frames, "ok")) == 2


async def test_duplicate_id_index_out_of_range_and_request_limit(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 2, STORY, {"max_tokens": 1000}))
        assert (await recv(ws))["type"] == "accepted"
        await ws.send(generate("r1", 2, STORY, {"max_tokens": 5}))
        frame = await recv(ws)
        while frame["type"] == "chunk":
            frame = await recv(ws)
        assert (frame["type"], frame["code"], frame["id"]) == ("error", "duplicate_id", "r1")

        await ws.send(json.dumps(cancel_frame("r1", 2)))
        frame = await recv(ws)
        while frame["type"] == "chunk":
            frame = await recv(ws)
        assert frame["code"] == "index_out_of_range"

        for request_id in ("r2", "r3"):
            await ws.send(generate(request_id, 1, STORY, {"max_tokens": 1000}))
        await ws.send(generate("r4", 1, STORY, {"max_tokens": 5}))
        codes = []
        async with asyncio.timeout(5):
            while "too_many_requests" not in codes:
                frame = await recv(ws)
                codes.append(frame.get("code"))
        for request_id in ("r1", "r2", "r3"):
            await ws.send(json.dumps(cancel_frame(request_id)))
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(5):
            while len([f for f in frames if f["type"] == "done"]) < 3:
                frames.append(await recv(ws))
        # the id is free again once its request is done
        await ws.send(generate("r1", 1, STORY, {"max_tokens": 2}))
        assert (await recv(ws))["type"] == "accepted"


async def test_a_message_over_the_hard_cap_closes_only_that_connection(server: BackendServer) -> None:
    async with connect(server.url, max_size=None) as bystander:
        ws = await connect(server.url)
        await ws.send("x" * (2 << 20))
        with pytest.raises(Exception):  # noqa: B017 - the library closes with 1009
            await recv(ws, 5)
        await bystander.send(generate("ok", 1, STORY, {"max_tokens": 3}))
        assert (await recv(bystander))["type"] == "accepted"


async def test_http_routes(server: BackendServer) -> None:
    report = await asyncio.to_thread(health, server)
    assert report["status"] == "ok" and report["engine"] == "synthetic" and report["n_max"] == 32
    with pytest.raises(urllib.error.HTTPError) as caught:
        await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{server.port}/nope", None, 5)
    assert caught.value.code == 404
    caught.value.close()


def test_python_m_backend_serves_alone() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backend",
            "--engine",
            "synthetic",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--rate",
            "200",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    async def talk() -> list[dict[str, Any]]:
        async with asyncio.timeout(30):
            while True:
                try:
                    ws = await connect(f"ws://127.0.0.1:{port}/ws")
                    break
                except OSError:
                    await asyncio.sleep(0.2)
        async with ws:
            await ws.send(generate("cli", 2, STORY, {"max_tokens": 10, "seed": 3}))
            return await until_done(ws, "cli")

    try:
        frames = asyncio.run(talk())
    finally:
        process.terminate()
        output = process.communicate(timeout=10)[0].decode()
    assert frames[0]["type"] == "accepted"
    assert texts_of(frames, "cli")[1] == "".join(synthetic_tokens(4, 10, 0.8)[0])
    assert "serving synthetic engine" in output


def test_python_m_backend_rejects_bad_settings() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "backend",
            "--engine",
            "synthetic",
            "--rate",
            "-1",
            "--port",
            str(free_port()),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--rate must be > 0" in result.stderr


class FailingGeneration(Generation):
    """Wraps a real synthetic generation and raises after `after` chunks, as a crashing engine would."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.left = inner, after

    async def __anext__(self) -> Any:
        if self.left == 0:
            raise RuntimeError("GPU fell off the bus")
        self.left -= 1
        return await self.inner.__anext__()

    async def abort(self, index: int | None = None) -> None:
        await self.inner.abort(index)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FailingEngine(SyntheticEngine):
    def generate(self, prompt: Any, n: int, params: Any) -> Any:
        if prompt.text == "refuse":
            raise RuntimeError("out of memory")
        return FailingGeneration(super().generate(prompt, n, params), after=5)


async def test_an_engine_failure_ends_the_request_with_errors_and_keeps_serving() -> None:
    async with serving(FailingEngine(rate=200)) as backend:
        async with connect(backend.url) as ws:
            await ws.send(json.dumps(generate_frame("r1", "refuse", 2)))
            frame = await recv(ws)
            assert (frame["type"], frame["code"], frame["id"]) == ("error", "engine_error", "r1")
            assert "out of memory" in frame["message"]

            await ws.send(generate("r2", 3, STORY, {"max_tokens": 50}))
            assert (await recv(ws))["type"] == "accepted"
            frames = await until_done(ws, "r2")
            errors = [f for f in frames if f["type"] == "error"]
            assert [e["code"] for e in errors] == ["engine_error"]
            assert "GPU fell off the bus" in errors[0]["message"]
            assert sorted(f["index"] for f in finishes_of(frames, "r2")) == [0, 1, 2]
            assert {f["reason"] for f in finishes_of(frames, "r2")} == {"error"}
            assert backend.engine.health()["running_samples"] == 0


class _RecordingSocket:
    """Stands in for a connection: records when each message was sent, and its frames."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, list[dict[str, Any]]]] = []

    async def send(self, message: bytes, text: bool | None = None) -> None:
        assert text is True  # JSON frames go as text messages
        self.writes.append((time.monotonic(), frames_in(message)))


async def test_done_is_written_without_waiting_out_the_send_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    # Frames that keep coming make the send loop wait SEND_INTERVAL_S between writes; a request's
    # `done` cuts that wait short, other frames do not.
    monkeypatch.setattr(connection_module, "SEND_INTERVAL_S", 5.0)
    monkeypatch.setattr(connection_module, "BURST_POLL_S", 0.0)
    monkeypatch.setattr(connection_module, "BURST_POLLS", 1)
    for kind in ("finish", "done"):
        socket = _RecordingSocket()
        session = ClientSession(socket, ServerSide(SyntheticEngine()))  # type: ignore[arg-type]
        sender = asyncio.create_task(session._send_loop())
        try:
            async with asyncio.timeout(2):
                while session._nap is None:  # frames keep coming until the loop waits them out
                    session.send({"type": "chunk", "id": "r1", "index": 0, "text": "x", "tokens": 1})
                    await asyncio.sleep(0)
            assert socket.writes == []
            sent = time.monotonic()
            frame = {"type": kind, "id": "r1"}
            if kind == "finish":
                frame.update(index=0, reason="stop", stats={})
            session.send(frame, now=kind == "done")
            await asyncio.sleep(0.3)
            if kind == "finish":
                assert socket.writes == []  # still waiting out the interval
            else:
                [(at, messages)] = socket.writes
                assert at - sent < 0.3 and messages[-1]["type"] == "done"
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


async def test_a_stream_of_frames_is_written_once_an_interval_without_polling_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once a write was part of a stream, a frame within SEND_INTERVAL_S of it waits out the interval
    # at once (no burst polling); a frame after a pause is written as soon as its burst ends.
    monkeypatch.setattr(connection_module, "SEND_INTERVAL_S", 0.3)
    monkeypatch.setattr(connection_module, "BURST_POLL_S", 0.0)
    monkeypatch.setattr(connection_module, "BURST_POLLS", 1)
    socket = _RecordingSocket()
    session = ClientSession(socket, ServerSide(SyntheticEngine()))  # type: ignore[arg-type]
    sender = asyncio.create_task(session._send_loop())
    chunk = {"type": "chunk", "id": "r1", "index": 0, "text": "x", "tokens": 1}
    try:
        async with asyncio.timeout(2):
            while not socket.writes:  # frames keep coming: a stream, written after the interval
                session.send(chunk)
                await asyncio.sleep(0)
            session.send(chunk)
            for _ in range(3):
                await asyncio.sleep(0)
            assert session._nap is not None and len(socket.writes) == 1  # more of the same stream
            await asyncio.sleep(0.5)  # the nap ends 0.3 s after it began, a few steps before this
            assert len(socket.writes) == 2
            await asyncio.sleep(0.4)  # a pause longer than the interval ends the stream
            session.send(chunk)
            for _ in range(5):
                await asyncio.sleep(0)
            assert session._nap is None and len(socket.writes) == 3  # a lone burst, written at once
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


class BrokenValidationEngine(SyntheticEngine):
    """An engine whose checks fail with an error it did not mean to raise, for one prompt."""

    def validate(self, prompt: Any, n: int, params: Any) -> None:
        if prompt.text == "break":
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")


async def test_an_internal_error_on_a_frame_is_an_error_frame_and_the_connection_stays() -> None:
    async with serving(BrokenValidationEngine(rate=200)) as backend:
        async with connect(backend.url) as ws:
            await ws.send(json.dumps(generate_frame("r1", "break", 2)))
            frame = await recv(ws)
            assert (frame["type"], frame["code"], frame["id"]) == ("error", "internal_error", "r1")
            assert "chat_template is not set" in frame["message"] and "still usable" in frame["message"]
            await ws.send(generate("r2", 2, STORY, {"max_tokens": 5}))
            accepted = await recv(ws)
            assert accepted["type"] == "accepted" and accepted["format"] == "chat"
            frames = await until_done(ws, "r2")
            reasons = [f["reason"] for f in finishes_of(frames, "r2")]
            assert len(reasons) == 2 and set(reasons) <= {"length", "stop"}
        assert backend.health()["active_requests"] == 0


async def test_accepted_says_which_format_and_why(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(json.dumps(generate_frame("a", "Hi", 1, format="raw")))
        accepted = await recv(ws)
        assert (accepted["format"], accepted["format_reason"]) == ("raw", "plain completion, as asked")
        await until_done(ws, "a")
        frame = generate_frame("b", "Hi", 1, system="Be brief.")
        await ws.send(json.dumps(frame))
        accepted = await recv(ws)
        assert accepted["format"] == "chat" and "with the system prompt" in accepted["format_reason"]
        await until_done(ws, "b")

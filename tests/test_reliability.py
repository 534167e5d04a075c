"""Reliability and access: load, slow and vanished clients, limits, origins, tokens, fuzzed frames."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from backend.config.settings import Limits
from backend.frames import cancel_frame, generate_frame
from backend.protocol import (
    CancelCommand,
    ExportTraceCommand,
    GenerateCommand,
    ProtocolError,
    parse_client_frame,
)
from backend.serving.admission import Admission, client_address
from backend.serving.server import BackendServer
from devkit.frames import recv_frame
from devkit.load import rss_mb, run_load, start_backend
from devkit.local import ROOT, free_port
from tests.support.backends import serving, synthetic_serving
from tests.support.wire import generate, next_of

LIMITS = Limits()


SERVER_RATE = 200.0
"""The conftest `server` fixture's synthetic tokens/s per sample."""


# Admission, without sockets.


def test_forwarded_addresses_are_believed_only_from_this_machine() -> None:
    assert client_address("127.0.0.1", "203.0.113.9, 10.0.0.1") == "203.0.113.9"
    assert client_address("198.51.100.7", "203.0.113.9") == "198.51.100.7"
    assert client_address("::1", None) == "::1"


def test_admission_counts_connections_rate_and_samples() -> None:
    admission = Admission(Limits(max_connections_per_address=2, requests_per_minute=3, max_total_samples=10))
    assert admission.connect("a") is None and admission.connect("a") is None
    assert "too many connections" in (admission.connect("a") or "")
    assert admission.connect("b") is None
    admission.disconnect("a")
    assert admission.connect("a") is None
    for t in (0.0, 1.0, 2.0):
        admission.start_request("a", 3, t, "r")
    with pytest.raises(ProtocolError) as caught:
        admission.start_request("a", 1, 3.0, "r")
    assert caught.value.code == "rate_limited" and "retry in 57 s" in caught.value.message
    admission.start_request("a", 1, 60.5, "r")  # the first start left the window
    with pytest.raises(ProtocolError) as caught:
        admission.start_request("b", 1, 61.0, "r")
    assert caught.value.code == "server_busy" and "10" in caught.value.message
    admission.end_request(3)
    admission.start_request("b", 1, 61.0, "r")


# Limits and access on a real server.


async def test_server_wide_limits_say_which_limit() -> None:
    async with synthetic_serving(
        SERVER_RATE, limits=Limits(max_total_samples=5, requests_per_minute=2, max_connections_per_address=2)
    ) as backend:
        async with connect(backend.url) as a, connect(backend.url) as b:
            await a.send(generate("big", 4, "hi", {"max_tokens": 1000}))
            await next_of(a, "accepted")
            await b.send(generate("more", 2, "hi", {"max_tokens": 20}))
            error = await next_of(b, "error")
            assert error["code"] == "server_busy" and error["id"] == "more"
            await b.send(generate("fits", 1, "hi", {"max_tokens": 20}))
            await next_of(b, "done")
            await b.send(generate("fourth", 1, "hi", {"max_tokens": 20}))
            assert (await next_of(b, "error"))["code"] == "rate_limited"
            third = await connect(backend.url)
            refusal = await next_of(third, "error")
            assert refusal["code"] == "too_many_connections"
            with pytest.raises(ConnectionClosed):
                await third.recv()
            assert third.close_code == 1008


async def test_origins_and_token() -> None:
    async with synthetic_serving(
        SERVER_RATE, allowed_origins=("http://127.0.0.1:7860",), token="s3cret"
    ) as backend:
        with pytest.raises(InvalidStatus) as caught:
            await connect(backend.url)
        assert caught.value.response.status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        with pytest.raises(InvalidStatus) as caught:
            await connect(backend.url, additional_headers={**auth, "Origin": "https://evil.example"})
        assert caught.value.response.status_code == 403
        for headers in (auth, {**auth, "Origin": "http://127.0.0.1:7860"}):
            async with connect(backend.url, additional_headers=headers) as ws:
                await ws.send(generate("ok", 2, "hi", {"max_tokens": 20}))
                await next_of(ws, "done")
        with pytest.raises(InvalidStatus):
            await connect(backend.url, additional_headers={"Authorization": "Bearer wrong"})


# Clients that stop reading, vanish, or send garbage.


async def test_a_client_that_stops_reading_is_dropped_without_slowing_others() -> None:
    async with synthetic_serving(rate=400, limits=Limits(send_stall_s=1.0)) as backend:
        stalled = await connect(backend.url, max_queue=1, ping_interval=None)
        await stalled.send(
            json.dumps(generate_frame("flood", "x", 32, {"max_tokens": 2048, "temperature": 0}))
        )
        # it never reads again; meanwhile another client streams normally
        async with connect(backend.url) as other:
            for i in range(3):
                await other.send(generate(f"r{i}", 2, "hi", {"max_tokens": 20}))
                done = await next_of(other, "done", limit_s=10)
                assert done["stats"]["tokens"] > 0
        async with asyncio.timeout(20):
            while backend.sessions and any(s.requests for s in backend.sessions):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert backend.engine.health()["running_samples"] == 0
        await stalled.close()


def test_a_killed_client_process_aborts_its_work() -> None:
    process, url = start_backend(rate=50)
    port = url.split(":")[2].split("/")[0]
    script = (
        "import asyncio, json, websockets.asyncio.client as c\n"
        "from backend.frames import generate_frame\n"
        "async def main():\n"
        f"    ws = await c.connect('{url}')\n"
        "    frame = generate_frame('r', 'x', 4, {'max_tokens': 2000})\n"
        "    await ws.send(json.dumps(frame))\n"
        "    while True:\n"
        "        message = json.loads(await ws.recv())  # one frame, or a batch of them\n"
        "        frames = message if isinstance(message, list) else [message]\n"
        "        if any(f['type'] == 'chunk' for f in frames): print('streaming', flush=True)\n"
        "asyncio.run(main())\n"
    )
    client = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "streaming"
        health_url = f"http://127.0.0.1:{port}/health"
        import urllib.request

        def running() -> int:
            with urllib.request.urlopen(health_url, timeout=5) as response:
                return json.loads(response.read())["running_samples"]

        assert running() == 4
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
        import time

        deadline = time.monotonic() + 10
        while running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running() == 0
    finally:
        client.kill()
        process.terminate()
        process.wait(10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda children: (
                st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda value: json.dumps(value)),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["generate", "cancel", "export_trace", "x"])},
            optional={
                "id": st.one_of(st.text(max_size=5), st.integers(), st.none()),
                "prompt": st.one_of(st.text(max_size=20), st.integers(), st.none()),
                "n": st.one_of(
                    st.integers(-(10**30), 10**30), st.floats(), st.text(max_size=3), st.booleans()
                ),
                "index": st.one_of(st.integers(-(10**20), 10**20), st.none(), st.text(max_size=3)),
                "params": st.one_of(
                    st.dictionaries(
                        st.sampled_from(["max_tokens", "temperature", "top_p", "seed", "other"]),
                        st.one_of(
                            st.integers(-(10**40), 10**40), st.floats(), st.text(max_size=3), st.none()
                        ),
                    ),
                    st.integers(),
                ),
                "consumer": st.one_of(
                    st.none(), st.integers(), st.dictionaries(st.text(max_size=6), st.integers())
                ),
                "fanout": st.one_of(st.text(max_size=8), st.integers()),
            },
        ).map(json.dumps),
    )
)
def test_any_frame_parses_or_is_refused_with_a_code(data: str | bytes) -> None:
    try:
        command = parse_client_frame(data, LIMITS)
    except ProtocolError as exc:
        assert exc.code and exc.message
    else:  # what parses is a command of the protocol, with the id its answers will carry
        assert isinstance(command, GenerateCommand | CancelCommand | ExportTraceCommand), command
        assert isinstance(command.id, str) and command.id, command


def test_deep_nesting_and_huge_numbers_are_refused() -> None:
    for raw in (
        "[" * 50_000 + "]" * 50_000,
        '{"type":"generate","id":"r","prompt":"x","n":' + "9" * 5000 + "}",
    ):
        with pytest.raises(ProtocolError) as caught:
            parse_client_frame(raw, Limits(max_frame_bytes=1 << 20))
        assert caught.value.code == "bad_json"


async def test_a_flood_of_fuzzed_frames_never_breaks_the_connection(server: BackendServer) -> None:
    frames = [
        "[" * 20_000 + "]" * 20_000,
        '{"type":"cancel","id":"ghost"}',
        '{"type":"generate","id":"r","prompt":"x","n":1e400}',
        b"\xff\xfe",
        '{"type":"generate","id":"r","prompt":"x","params":{"seed":123456789012345678901234567890}}',
        '{"type":"export_trace","id":42}',
    ] * 20
    async with connect(server.url) as ws:
        await ws.send(generate("live", 2, "hi", {"max_tokens": 200}))
        await next_of(ws, "accepted")
        for frame in frames:
            await ws.send(frame)
        for _ in range(50):  # a flood of cancels for a running request, then for a finished one
            await ws.send(json.dumps(cancel_frame("live")))
        errors = 0
        async with asyncio.timeout(20):
            while errors < len(frames):
                frame = await recv_frame(ws)
                errors += frame["type"] == "error" and frame["id"] != "live"
        await next_of(ws, "done")
        await ws.send(generate("after", 1, "hi", {"max_tokens": 5}))
        assert (await next_of(ws, "done"))["id"] == "after"


def test_load_nothing_lost_and_memory_flat() -> None:
    process, url = start_backend(rate=150)
    try:
        first = asyncio.run(run_load(url, clients=64, n=4, max_tokens=40, cancel_every=8))
        _, peak_after_first = rss_mb(process.pid)
        second = asyncio.run(run_load(url, clients=64, n=4, max_tokens=40, cancel_every=8))
        _, peak = rss_mb(process.pid)
    finally:
        process.terminate()
        process.wait(10)
    for report in (first, second):
        assert report.clients == 64 and report.samples == 256 and report.cancelled == 8
        assert report.lost == 0
        assert report.errors == [] and report.broken_promises == []
    assert peak - peak_after_first < 20, "a second identical round must not grow the server's memory"


async def embedded_round(url: str, clients: int) -> dict[str, str]:
    """Each client one request of n=2; returns text by (client, index), checking the promises."""
    texts: dict[str, str] = {}

    async def client(index: int) -> None:
        request = generate_frame(
            f"e{index}",
            f"Name a colour. ({index})",
            2,
            {"max_tokens": 8, "seed": 100 + 2 * index, "temperature": 0.8},
            trace=False,
        )
        finishes: dict[int, str] = {}
        async with connect(url) as ws:
            await ws.send(json.dumps(request))
            async with asyncio.timeout(180):
                while True:
                    frame = await recv_frame(ws)
                    assert frame["type"] != "error", frame
                    if frame["type"] == "chunk":
                        assert frame["index"] not in finishes
                        key = f"{index}:{frame['index']}"
                        texts[key] = texts.get(key, "") + frame["text"]
                    elif frame["type"] == "finish":
                        assert frame["index"] not in finishes
                        finishes[frame["index"]] = frame["reason"]
                    elif frame["type"] == "done":
                        break
        assert sorted(finishes) == [0, 1] and set(finishes.values()) <= {"stop", "length"}

    await asyncio.gather(*(client(i) for i in range(clients)))
    return texts


def test_load_on_the_embedded_engine_at_a_smaller_scale() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "backend", "--engine", "embedded", "--port", str(port), "--no-trace"],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    url = f"ws://127.0.0.1:{port}/ws"
    try:

        async def both_rounds() -> tuple[dict[str, str], dict[str, str]]:
            async with asyncio.timeout(300):
                while True:  # the first start may convert the model
                    try:
                        async with connect(url):
                            break
                    except OSError:
                        assert process.poll() is None, "the embedded backend exited"
                        await asyncio.sleep(0.5)
            return await embedded_round(url, 4), await embedded_round(url, 4)

        first, second = asyncio.run(both_rounds())
    finally:
        process.terminate()
        process.wait(30)
    assert len(first) == 8 and all(first.values())
    assert first == second  # every sample reassembles to the same text when its seed repeats


class DyingSGLang:
    """An HTTP server on 127.0.0.1 that answers like SGLang, then dies in the middle of a stream.

    /health, /model_info and /tokenize answer as the real server did; POST /generate sends the first part of
    a stream recorded from a real SGLang server (tests/fixtures) and then drops the connection,
    as a server that crashes or restarts mid-stream does.
    """

    def __init__(self) -> None:
        fixtures = ROOT / "tests" / "fixtures"
        self.stream = (fixtures / "sglang-generate-n4-cumulative.sse").read_bytes()
        self.model_info = (fixtures / "sglang-model_info.json").read_bytes()
        self.tokenize = (fixtures / "sglang-tokenize-chat.json").read_bytes()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line = head.split(b"\r\n")[0].decode()
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if request_line.startswith("POST /generate"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                    )
                    cut = self.stream.index(b"\n\n", len(self.stream) // 3) + 2
                    writer.write(self.stream[:cut])
                    await writer.drain()
                    writer.transport.abort()  # the server dies mid-stream
                    return
                answers = {"/model_info": self.model_info, "/tokenize": self.tokenize}
                body = next((v for k, v in answers.items() if k in request_line), b'{"ok": true}')
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_an_sglang_server_dying_mid_stream_ends_the_samples_with_error() -> None:
    from backend.engines.http.sglang import SGLangEngine

    dying = DyingSGLang()
    url = await dying.start()
    try:
        async with serving(SGLangEngine(url)) as backend, connect(backend.url) as ws:
            for rid in ("first", "second"):  # and the backend keeps serving the next request
                await ws.send(generate(rid, 4, "hi", {"max_tokens": 32}))
                frames = []
                async with asyncio.timeout(30):
                    while True:
                        frame = await recv_frame(ws)
                        frames.append(frame)
                        if frame["type"] == "done":
                            break
                chunks = [f for f in frames if f["type"] == "chunk"]
                finishes = [f for f in frames if f["type"] == "finish"]
                assert chunks, "what streamed before the failure reached the client"
                assert sorted(f["index"] for f in finishes) == [0, 1, 2, 3]
                assert {f["reason"] for f in finishes} == {"error"}
                # each affected sample says what happened
                assert all("ended the stream" in f["engine"]["error"] for f in finishes)
    finally:
        await dying.close()

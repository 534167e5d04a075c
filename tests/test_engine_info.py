"""The page's engine line, read from a real backend's /health, and an engine that starts slowly or fails."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines.http.base import refused_key
from backend.engines.http.sglang import SGLangEngine
from backend.engines.http.sglang_launch import free_port
from backend.engines.synthetic import SyntheticEngine
from backend.frames import generate_frame
from devkit.frames import recv_frame
from tests.support.backends import serving
from tests.support.wire import until_done
from ui.engine_info import (
    EngineStartTimeout,
    engine_line_now,
    health_url,
    not_started_message,
    wait_until_started,
    waiting_line,
)


def test_health_url_from_the_websocket_url() -> None:
    assert health_url("ws://127.0.0.1:8765/ws") == "http://127.0.0.1:8765/health"
    assert health_url("wss://example.org/ws?token=x") == "https://example.org/health"


async def test_the_line_names_engine_and_model() -> None:
    async with serving(SyntheticEngine()) as server:
        line, starting = await engine_line_now(server.url)
    assert "synthetic" in line and "tok/s" in line and "⚠️" not in line and not starting


async def test_an_unreachable_engine_server_is_said_in_the_page() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with serving(SGLangEngine(dead)) as server:
        line, _ = await engine_line_now(server.url)
    assert line.startswith("⚠️") and "unreachable" in line and dead in line


async def test_a_backend_that_does_not_answer_is_said_in_the_page() -> None:
    line, starting = await engine_line_now(f"ws://127.0.0.1:{free_port()}/ws")
    assert line.startswith("⚠️") and "did not answer" in line and not starting


class SlowStartEngine(SyntheticEngine):
    """A synthetic engine whose start waits for the test, then succeeds or fails."""

    def __init__(self, failure: str | None = None) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.failure = failure

    async def start(self) -> None:
        await self.go.wait()
        if self.failure:
            raise RuntimeError(self.failure)

    def health(self) -> dict[str, Any]:
        return {**super().health(), "loading_status": "downloading weights"}


async def test_a_starting_engine_is_said_and_requests_are_refused_until_it_is_ready() -> None:
    engine = SlowStartEngine()
    async with serving(engine, background=True) as server:
        line, starting = await engine_line_now(server.url)
        assert starting and line.startswith("⏳") and "downloading weights" in line
        async with connect(server.url) as ws:
            await ws.send(json.dumps(generate_frame("r1", "Hi", 2)))
            frame = await recv_frame(ws)
            assert (frame["type"], frame["code"], frame["id"]) == ("error", "engine_not_ready", "r1")
            assert "still starting (downloading weights)" in frame["message"]
            engine.go.set()
            await asyncio.sleep(0.05)
            line, starting = await engine_line_now(server.url)
            assert not starting and "synthetic" in line and "⏳" not in line
            await ws.send(json.dumps(generate_frame("r2", "Hi", 2)))
            assert (await recv_frame(ws))["type"] == "accepted"


async def test_an_engine_that_failed_to_start_is_said_and_the_backend_keeps_answering() -> None:
    engine = SlowStartEngine(failure="the embedded model is not installed; set DASHBOARD_MODEL")
    engine.go.set()
    async with serving(engine, background=True) as server:
        await asyncio.sleep(0.05)
        line, starting = await engine_line_now(server.url)
        assert not starting and line.startswith("⚠️") and "could not start" in line
        assert "set DASHBOARD_MODEL" in line
        async with connect(server.url) as ws:
            for request_id in ("r1", "r2"):
                await ws.send(json.dumps(generate_frame(request_id, "Hi", 1)))
                frame = await recv_frame(ws)
                assert (frame["code"], frame["id"]) == ("engine_not_ready", request_id)
                assert "could not start: the embedded model is not installed" in frame["message"]


def test_what_a_refused_api_key_says() -> None:
    setting = "--sglang-api-key or SGLANG_API_KEY"
    assert refused_key(200, "", setting) == "" and refused_key(404, "k", setting) == ""
    assert refused_key(401, "", setting) == (
        "the server refused the request without an API key (HTTP 401); set --sglang-api-key or SGLANG_API_KEY"
    )
    assert "refused the API key (HTTP 403); check --sglang-api-key" in refused_key(403, "k", setting)


async def test_an_engine_lost_while_serving_ends_every_running_request_and_says_so() -> None:
    """What a dying SGLang scheduler's SIGQUIT leads to: each connection's running request gets an
    `engine_lost` error and finishes `error`; new requests are refused; the page's line says so."""
    async with serving(SyntheticEngine(rate=5.0), background=True) as server:
        await server.engine_settled()
        async with connect(server.url) as first, connect(server.url) as second:
            for ws, request_id in ((first, "a"), (second, "b")):
                frame = generate_frame(request_id, "Hi", 2)
                await ws.send(json.dumps(frame | {"params": {"max_tokens": 500}}))
                assert (await recv_frame(ws))["type"] == "accepted"
                while (await recv_frame(ws))["type"] != "chunk":
                    pass
            server.engine_lost("the scheduler died")
            for ws, request_id in ((first, "a"), (second, "b")):
                frames = await until_done(ws, limit_s=None)
                errors = [f for f in frames if f["type"] == "error"]
                assert [(e["code"], e["id"]) for e in errors] == [("engine_lost", request_id)]
                assert "stopped working: the scheduler died" in errors[0]["message"]
                finishes = sorted((f["index"], f["reason"]) for f in frames if f["type"] == "finish")
                assert finishes == [(0, "error"), (1, "error")]
            await first.send(json.dumps(generate_frame("c", "Hi", 1)))
            refused = await recv_frame(first)
            assert (refused["code"], refused["id"]) == ("engine_not_ready", "c")
        line, _ = await engine_line_now(server.url)
        assert line.startswith("⚠️") and "stopped working while serving: the scheduler died" in line
        assert server.health()["engine_state"] == "lost" and server.health()["active_requests"] == 0


def test_the_waiting_line_and_the_give_up_message_say_what_the_engine_does() -> None:
    health = {"engine": "embedded", "engine_state": "starting", "loading_status": "downloading weights"}
    assert waiting_line(health, 12.4) == (
        "⏳ Waiting for the **embedded** engine to start (12 s): downloading weights ... "
        "The samples start once it is ready; Cancel stops waiting."
    )
    assert "to start (0 s) ... The samples" in waiting_line({"engine": "sglang"}, 0.2)
    assert not_started_message(health, 600) == (
        "the embedded engine did not start within 600 s (it was downloading weights); "
        "press Generate again to wait longer"
    )


async def test_a_wait_for_a_starting_engine_lasts_until_it_is_ready() -> None:
    engine = SlowStartEngine()
    async with serving(engine, background=True) as server:
        lines = []
        async for line in wait_until_started(server.url, asyncio.Event(), poll_s=0.05):
            lines.append(line)
            if len(lines) == 3:
                engine.go.set()
        assert len(lines) == 3 and all("Waiting for the **synthetic** engine" in line for line in lines)
        assert "downloading weights" in lines[0] and server.engine_state == "ready"
        assert [
            line async for line in wait_until_started(server.url, asyncio.Event())
        ] == []  # ready: no wait


async def test_a_wait_ends_when_stopped_when_the_start_fails_and_after_its_limit() -> None:
    failing = SlowStartEngine(failure="no weights")
    async with serving(failing, background=True) as server:
        stop = asyncio.Event()
        lines = []
        async for line in wait_until_started(server.url, stop, poll_s=10):
            lines.append(line)
            asyncio.get_running_loop().call_later(0.05, stop.set)  # Cancel, well before the next poll
        assert len(lines) == 1 and server.engine_state == "starting"

        with pytest.raises(
            EngineStartTimeout, match=r"did not start within 0.2 s \(it was downloading weights\)"
        ):
            async for _ in wait_until_started(server.url, asyncio.Event(), limit_s=0.2, poll_s=0.05):
                pass

        failing.go.set()
        await server.engine_settled()
        assert [line async for line in wait_until_started(server.url, asyncio.Event())] == []
        assert server.engine_state == "failed"  # the request's refusal says why (see above)
    assert [line async for line in wait_until_started(server.url, asyncio.Event())] == []  # no backend

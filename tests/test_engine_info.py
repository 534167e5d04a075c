"""The page's engine line, read from a real backend's /health."""

from __future__ import annotations

from backend.engines.sglang import SGLangEngine
from backend.engines.sglang_launch import free_port
from backend.engines.synthetic import SyntheticEngine
from backend.server import BackendServer
from ui.engine_info import engine_line_now, health_url


def test_health_url_from_the_websocket_url() -> None:
    assert health_url("ws://127.0.0.1:8765/ws") == "http://127.0.0.1:8765/health"
    assert health_url("wss://example.org/ws?token=x") == "https://example.org/health"


async def test_the_line_names_engine_and_model() -> None:
    server = BackendServer(SyntheticEngine(), port=0)
    await server.start()
    try:
        line = await engine_line_now(server.url)
    finally:
        await server.close()
    assert "synthetic" in line and "tok/s" in line and "⚠️" not in line


async def test_an_unreachable_engine_server_is_said_in_the_page() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    server = BackendServer(SGLangEngine(dead), port=0)
    await server.start()
    try:
        line = await engine_line_now(server.url)
    finally:
        await server.close()
    assert line.startswith("⚠️") and "unreachable" in line and dead in line


async def test_a_backend_that_does_not_answer_is_said_in_the_page() -> None:
    line = await engine_line_now(f"ws://127.0.0.1:{free_port()}/ws")
    assert line.startswith("⚠️") and "did not answer" in line

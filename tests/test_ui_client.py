"""The page's websocket client and view state, against a real backend on this loop."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.server import ServerConnection, serve

from backend.engines.synthetic import synthetic_tokens
from backend.frames import accepted_frame, encode
from backend.serving.server import BackendServer
from backend.vocabulary import SamplingParams
from devkit.local import free_port
from ui.client import BackendError, BackendRun
from ui.view import (
    WAITING_HINT_S,
    WAITING_TURN,
    RunView,
    sample_header,
    samples_value,
    status_markdown,
    summary_markdown,
)

SERVER_JITTER = 0.3
"""The conftest `server` fixture's synthetic engine: 100 tokens/s per sample, each interval ± 30 %."""


async def test_run_streams_into_the_view(server: BackendServer) -> None:
    run = BackendRun(server.url)
    view = await run.start("Hello", 3, {"max_tokens": 20, "temperature": 0.8, "seed": 9})
    assert view.accepted and view.n == 3 and view.params["seed"] == 9
    async for _ in run.updates(0.05):
        pass
    assert view.done_stats is not None and view.finished
    for sample in view.samples:
        tokens, reason = synthetic_tokens(9 + sample.index, 20, 0.8)
        assert sample.text == "".join(tokens) and sample.status == reason
        assert sample.stats is not None and sample.stats["tokens"] == len(tokens)
    assert "finished" in status_markdown(view)
    assert "| 2 |" in summary_markdown(view) and "**Request:**" in summary_markdown(view)


async def test_the_status_line_says_a_cancelled_run_was_cancelled(server: BackendServer) -> None:
    """Cancel (every sample aborted) reads "cancelled", a run with one column stopped says how many
    of its samples were stopped; neither reads plain "finished"."""
    for stop_all in (True, False):
        run = BackendRun(server.url)
        view = await run.start("Hello", 3, {"max_tokens": 400, "seed": 4})
        async for _ in run.updates(0.05):
            if any(sample.text for sample in view.samples):
                break
        await (run.cancel() if stop_all else run.cancel(0))
        async for _ in run.updates(0.05):
            pass
        said = status_markdown(view).splitlines()[0]
        if stop_all:
            assert said.endswith("· seed **4** · cancelled."), said
        else:
            assert said.endswith("· seed **4** · finished, 1 of 3 samples stopped."), said


async def test_the_final_state_is_yielded_even_if_the_run_ends_while_the_consumer_is_busy(
    server: BackendServer,
) -> None:
    run = BackendRun(server.url)
    await run.start("Hello", 2, {"max_tokens": 5, "seed": 1})
    seen_finished = []
    async for view in run.updates(0.01):
        seen_finished.append(view.finished)  # what a renderer sees at that moment
        await asyncio.sleep(0.3)  # a slow renderer: the run ends meanwhile
    assert seen_finished[-1] is True


async def test_updates_are_capped_at_the_frame_rate(server: BackendServer) -> None:
    run = BackendRun(server.url)
    await run.start("Hello", 8, {"max_tokens": 60, "temperature": 0, "seed": 1})
    loop = asyncio.get_running_loop()
    started = loop.time()
    updates = 0
    async for _ in run.updates(0.1):
        updates += 1
    elapsed = loop.time() - started
    tokens = sum(s.tokens for s in run.view.samples)
    assert tokens == 8 * 60
    assert updates <= elapsed / 0.1 + 2
    assert updates < tokens / 10


async def test_cancel_one_then_all(server: BackendServer) -> None:
    run = BackendRun(server.url)
    await run.start("Hello", 3, {"max_tokens": 1000, "seed": 1})
    updates = run.updates(0.02)
    await anext(updates)
    await run.cancel(1)
    await asyncio.sleep(0.2)
    assert run.view.samples[1].status == "abort"
    assert run.view.samples[0].status == "streaming"
    await run.cancel()
    assert await run.wait_finished(5)
    assert [s.status for s in run.view.samples] == ["abort"] * 3
    await updates.aclose()


async def test_unreachable_backend_and_refused_request(server: BackendServer) -> None:
    dead = f"ws://127.0.0.1:{free_port()}/ws"
    with pytest.raises(BackendError, match="the backend is unreachable"):
        await BackendRun(dead).start("Hello", 1, {})
    with pytest.raises(BackendError, match="n must be between 1 and 32"):
        await BackendRun(server.url).start("Hello", 99, {})


def test_view_ignores_other_requests_and_reports_errors() -> None:
    view = RunView("r1", started_at=0.0)
    view.apply({"type": "accepted", "id": "r1", "n": 2, "engine": "synthetic", "model": "m"}, 0.0)
    view.apply({"type": "chunk", "id": "other", "index": 0, "text": "x", "tokens": 1}, 0.1)
    view.apply({"type": "chunk", "id": "r1", "index": 7, "text": "x", "tokens": 1}, 0.1)
    view.apply({"type": "chunk", "id": "r1", "index": 0, "text": "Hi", "tokens": 1}, 0.2)
    view.apply({"type": "chunk", "id": "r1", "index": 0, "text": " there", "tokens": 1}, 0.4)
    assert [s.text for s in view.samples] == ["Hi there", ""]
    header = sample_header(view.samples[0], view.started_at, now=0.5)
    assert header.startswith("#0 · streaming · 2 tok")
    assert "5.0 tok/s" in header and "TTFT 200 ms" in header
    assert "#1 · waiting" in sample_header(view.samples[1], view.started_at, now=0.5)
    grid = samples_value(view, now=0.5)["samples"]
    assert [(s["index"], s["status"], s["text"]) for s in grid] == [
        (0, "streaming", "Hi there"),
        (1, "waiting", ""),
    ]
    assert grid[0]["header"] == header
    view.apply(
        {"type": "finish", "id": "r1", "index": 1, "reason": "error", "engine": {"error": "boom"}}, 0.6
    )
    view.apply(
        {"type": "finish", "id": "r1", "index": 0, "reason": "error", "engine": {"error": "boom"}}, 0.6
    )
    assert view.errors == ["boom"]  # an engine's message, once
    view.close("the backend closed the connection before the run ended")
    assert view.finished
    assert [s.status for s in view.samples] == ["error", "error"]
    assert "**Error:** boom" in status_markdown(view)


async def test_a_frame_that_is_not_json_ends_the_run_with_a_clear_error() -> None:
    async def handler(ws: ServerConnection) -> None:
        request = json.loads(await ws.recv())
        params = SamplingParams(max_tokens=5, temperature=0.0, top_p=1.0, seed=1)
        await ws.send(encode(accepted_frame(request["id"], 1, "synthetic", "test", params)))
        await ws.send('{"type": "chunk", "id": ')  # cut off: not JSON
        await asyncio.sleep(1)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        run = BackendRun(f"ws://127.0.0.1:{port}/ws")
        await run.start("Hello", 1, {"max_tokens": 5, "seed": 1})
        assert await run.wait_finished(5)
    assert run.view.done_stats is None
    assert any(
        "the backend sent a message that is not a protocol frame" in error for error in run.view.errors
    )


def test_a_run_without_a_first_token_past_the_hint_says_it_waits_its_turn() -> None:
    """Accepted, no sample has a token after WAITING_HINT_S: the engine is full, and the status line
    says the run waits its turn (other visitors' runs not named); once a token comes, it streams."""
    view = RunView("r-wait", started_at=100.0)
    view.apply({"type": "accepted", "id": "r-wait", "n": 2, "params": {"seed": 3}}, 100.0)
    assert "streaming 2 of 2 samples" in status_markdown(view, 100.0 + WAITING_HINT_S / 2)
    waiting = status_markdown(view, 100.0 + WAITING_HINT_S)
    assert WAITING_TURN in waiting and "waiting for its turn" in waiting
    view.apply({"type": "chunk", "id": "r-wait", "index": 0, "text": "Once", "tokens": 1}, 102.0)
    assert "streaming 2 of 2 samples" in status_markdown(view, 110.0)

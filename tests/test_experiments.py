"""Blocking experiments on a loop of their own: the experimenter's loop blocks, nobody else's stream waits.

Against `python -m backend` in its own process (so the test's clients share no loop with it), on
the synthetic engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.config.settings import BLOCK_MS_MAX, Limits
from backend.frames import generate_frame
from backend.protocol import ProtocolError
from backend.serving.admission import Admission
from devkit.frames import recv_frame
from devkit.local import LOCAL_LOAD_FLAGS, start_backend, stop_process
from tests.support.wire import texts_of, until_done


def test_one_blocking_experiment_at_a_time() -> None:
    admission = Admission(Limits(max_blocking_requests=1))
    admission.start_request("a", 2, 0.0, "r1", blocking=True)
    admission.start_request("b", 2, 0.0, "r2")  # other consumers are not counted
    with pytest.raises(ProtocolError) as caught:
        admission.start_request("b", 1, 0.0, "r3", blocking=True)
    assert caught.value.code == "experiment_busy" and "retry when it ends" in caught.value.message
    admission.end_request(2, blocking=True)
    admission.start_request("b", 1, 0.0, "r3", blocking=True)


@pytest.fixture(scope="module")
def backend() -> Iterator[dict[str, str]]:
    process, port = start_backend(["--engine", "synthetic", "--rate", "50", *LOCAL_LOAD_FLAGS])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            health = json.load(response)
        yield {
            "main": f"ws://127.0.0.1:{port}/ws",
            "experiments": health["experiment_url"],
            "watch": f"http://127.0.0.1:{port}/experiment/loop",
        }
    finally:
        stop_process(process)


def generate(request_id: str, n: int, max_tokens: int, mode: str = "cooperative", block_ms: float = 0) -> str:
    return json.dumps(
        generate_frame(
            request_id,
            "neighbours",
            n,
            {"max_tokens": max_tokens, "seed": 3},
            consumer={"mode": mode, "block_ms": block_ms},
        )
    )


async def blocked_and_watched(urls: dict[str, str]) -> dict[str, Any]:
    """A, a direct client of the main server, asks it for a blocking run, is refused with the
    experiment server's URL, and runs there, blocking at the most per chunk; B streams on the main
    server meanwhile."""
    async with connect(urls["main"], max_size=None, ping_interval=None) as door:
        await door.send(generate("a", 2, 30, "blocking", BLOCK_MS_MAX))
        refusal = await recv_frame(door, 30)
    [sent_to] = re.findall(r"ws://\S+/ws", refusal.get("message", ""))
    async with connect(sent_to, max_size=None, ping_interval=None) as a:
        await a.send(generate("a", 2, 30, "blocking", BLOCK_MS_MAX))
        while (await recv_frame(a, 30))["type"] != "chunk":
            pass
        arrivals: list[float] = []
        texts = ["", ""]
        async with connect(urls["main"], max_size=None) as b:
            await b.send(generate("b", 2, 100))
            while (frame := await recv_frame(b, 30))["type"] != "done":
                if frame["type"] == "chunk":
                    arrivals.append(time.perf_counter())
                    texts[frame["index"]] += frame["text"]
        lags: list[float] = []
        while (frame := await recv_frame(a, 60))["type"] != "done":
            if frame["type"] == "trace":
                lags.extend(lag for _, lag in frame["lag"])
    return {
        "refusal": refusal,
        "sent_to": sent_to,
        "gaps": [later - earlier for earlier, later in itertools.pairwise(arrivals)],
        "texts": texts,
        "a_lag_ms": max(lags, default=0.0),
    }


def test_a_blocking_experiment_blocks_its_own_loop_and_no_one_elses(backend: dict[str, str]) -> None:
    seen = asyncio.run(blocked_and_watched(backend))
    # the main server runs no blocking consumer: it names the loop where one runs
    assert seen["refusal"]["type"] == "error" and seen["refusal"]["code"] == "blocking_elsewhere"
    assert seen["refusal"]["id"] == "a" and seen["sent_to"] == backend["experiments"]
    # B's two samples streamed to the end with no long wait between chunks (on a loop shared with
    # the experiment, B waited for its whole backlog: `python -m bench.blocking_neighbour`)
    assert all(len(text.split()) > 20 for text in seen["texts"])
    assert max(seen["gaps"]) < 1.0, f"B waited {max(seen['gaps']):.2f} s for a chunk"
    # and the experiment is real for the one who runs it: their loop woke late by a block or more
    assert seen["a_lag_ms"] >= 0.75 * BLOCK_MS_MAX


def test_a_second_blocking_experiment_is_refused_while_one_runs(backend: dict[str, str]) -> None:
    async def second() -> dict[str, Any]:
        async with connect(backend["experiments"]) as a, connect(backend["experiments"]) as c:
            await a.send(generate("a", 1, 60, "blocking", 2))
            while (await recv_frame(a, 30))["type"] != "chunk":
                pass
            await c.send(generate("c", 1, 5, "blocking", 1))
            while (frame := await recv_frame(c, 30))["type"] not in ("error", "accepted"):
                pass
            return frame

    third = asyncio.run(second())
    assert third["type"] == "error" and third["code"] == "experiment_busy"


def test_the_experiment_loop_serves_the_engines_samples(backend: dict[str, str]) -> None:
    # The same request, cooperative on the main loop and blocking on the experiment loop, gets the
    # same samples: both loops drive the one engine.
    async def both() -> list[dict[int, str]]:
        results = []
        for url, mode in ((backend["main"], "cooperative"), (backend["experiments"], "blocking")):
            async with connect(url) as ws:
                await ws.send(generate("same", 3, 30, mode, 1))
                frames = await until_done(ws, limit_s=None, frame_s=30)
                texts = {0: "", 1: "", 2: "", **texts_of(frames)}
                assert any(f["type"] == "trace" for f in frames), "both loops are traced"
                results.append(texts)
        return results

    on_main, on_experiments = asyncio.run(both())
    assert on_main == on_experiments and all(on_main.values())


def test_the_main_loop_watches_the_blocked_loop_and_every_cancel_is_answered(backend: dict[str, str]) -> None:
    """While a blocking run holds the experiment loop, the main server's /experiment/loop reads it:
    the step running, growing, and the chunks waiting behind it. A cancel is answered with
    `cancel_ack` once the loop reads it; one read after the run ended stops nothing, and says so."""

    def watch() -> dict[str, Any]:
        with urllib.request.urlopen(backend["watch"], timeout=5) as response:
            return json.load(response)

    async def blocked() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        readings = []
        async with connect(backend["experiments"], max_size=None, ping_interval=None) as ws:
            await ws.send(generate("w", 2, 40, "blocking", 100))
            while (await recv_frame(ws, 30))["type"] != "chunk":
                pass
            for _ in range(12):
                readings.append(await asyncio.to_thread(watch))
                await asyncio.sleep(0.1)
            await ws.send(json.dumps({"type": "cancel", "id": "w"}))
            frames = []
            # The loop reads the cancel when its step ends: before the run's end, or after it.
            while not {"done", "cancel_ack"} <= {f["type"] for f in frames}:
                frames.append(await recv_frame(ws, 60))
            await ws.send(json.dumps({"type": "cancel", "id": "w"}))
            while (frame := await recv_frame(ws, 30))["type"] == "trace":
                pass
            frames.append(frame)
        return readings, frames

    readings, frames = asyncio.run(blocked())
    stalls = [r["stall_ms"] for r in readings]
    assert max(stalls) >= 500, stalls  # 100 ms a chunk, chunks every 20 ms: the steps grow
    assert any(later > earlier for earlier, later in itertools.pairwise(stalls)), stalls  # live
    assert any(r["waiting"] > 0 and r["taken"] > 0 for r in readings), readings
    assert all(r["running"] == ["w"] for r in readings), readings
    (ack,) = [f for f in frames[:-1] if f["type"] == "cancel_ack"]
    assert ack["id"] == "w" and ack["index"] is None and isinstance(ack["t_ms"], float)
    # It stops the samples still running when the loop read it: none where the run had ended.
    finished_before = {f["index"] for f in frames[: frames.index(ack)] if f["type"] == "finish"}
    assert ack["aborting"] == sorted({0, 1} - finished_before), (ack, finished_before)
    reasons = {f["index"]: f["reason"] for f in frames if f["type"] == "finish"}
    assert all(reasons[i] == "abort" for i in ack["aborting"]), reasons
    late = frames[-1]
    assert late == {"type": "cancel_ack", "id": "w", "index": None, "aborting": [], "t_ms": late["t_ms"]}
    assert watch()["running"] == [] and watch()["stall_ms"] < 500

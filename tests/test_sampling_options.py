"""The `generate` options that teach what parallel sampling is and costs: `output_kind`,
`cancel_after` and `logprobs`, through the real websocket server on the synthetic engine."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines.synthetic import synthetic_logprobs, synthetic_tokens
from backend.frames import generate_frame
from backend.serving.server import BackendServer
from devkit.frames import recv_frame
from tests.support.backends import synthetic_serving
from tests.support.wire import generate, texts_of, tokens_of, until_done

SEED = 11


SERVER_RATE = 400.0
"""The conftest `server` fixture's synthetic tokens/s per sample."""


async def run(
    backend: BackendServer, n: int = 3, max_tokens: int = 40, **options: Any
) -> list[dict[str, Any]]:
    """Every frame of one request, up to its `done` (or the first error)."""
    params = {"max_tokens": max_tokens, "seed": SEED, "temperature": 1.0}
    async with connect(backend.url) as ws:
        await ws.send(generate("r1", n, "Tell a story.", params, **options))
        return await until_done(ws, limit_s=None, frame_s=20, stop_on_error=True)


async def test_cumulative_outputs_reach_the_client_as_the_same_deltas(server: BackendServer) -> None:
    delta = await run(server)
    cumulative = await run(server, output_kind="cumulative")
    assert texts_of(cumulative) == texts_of(delta) and tokens_of(cumulative) == tokens_of(delta)
    expected = "".join(synthetic_tokens(SEED + 1, 40)[0])
    assert texts_of(cumulative)[1] == expected  # deltas, not the text repeated: exactly the sample's text
    assert [f["reason"] for f in cumulative if f["type"] == "finish"] == [
        f["reason"] for f in delta if f["type"] == "finish"
    ]


async def test_the_trace_shows_what_a_cumulative_consumer_reads_grow_with_the_text(
    server: BackendServer,
) -> None:
    def reads(frames: list[dict[str, Any]]) -> list[list[Any]]:
        return [entry for f in frames if f["type"] == "trace" for entry in f["reads"]]

    delta = reads(await run(server, n=2, max_tokens=120))
    cumulative = reads(await run(server, n=2, max_tokens=120, output_kind="cumulative"))
    assert delta == []  # delta outputs are the default path: nothing extra is measured per token
    # [t_ms, id, index, largest output's bytes, consumer us per output, outputs]
    sizes = [e[3] for e in cumulative if e[2] == 0]
    assert sizes == sorted(sizes) and sizes[-1] > 300  # the whole text so far, growing
    assert all(e[4] >= 0 and e[5] >= 1 for e in cumulative)
    assert sum(e[5] for e in cumulative) >= 2 * 40  # every output counted


async def test_cancel_after_stops_each_sample_from_the_consumer_side() -> None:
    # 10 tokens/s a sample (100 ms a token): at 400, make test's loaded machine delayed the consumer
    # by a few ms and up to 4 tokens, made before the abort, were already waiting for it (counts 6-9);
    # at 25 (40 ms a token) a clean-clone CI run once saw one sample reach 8.
    async with synthetic_serving(10) as backend:
        frames = await run(backend, n=4, max_tokens=200, cancel_after=5)
    finishes = {f["index"]: f for f in frames if f["type"] == "finish"}
    assert {f["reason"] for f in finishes.values()} == {"abort"}
    # The engine may have a token or two in flight when the abort lands (a synthetic sample's
    # next token is already due): never more than that.
    assert all(5 <= count <= 7 for count in tokens_of(frames).values()), tokens_of(frames)
    cancels = [entry for f in frames if f["type"] == "trace" for entry in f["cancels"]]
    stages = {(entry[2], entry[3]) for entry in cancels}
    for index in range(4):
        assert {(index, "received"), (index, "aborted"), (index, "finished")} <= stages


async def test_logprobs_come_with_each_token_and_match_the_engines_distribution(
    server: BackendServer,
) -> None:
    frames = await run(server, n=2, max_tokens=30, logprobs=True)
    pieces: dict[int, list[Any]] = {}
    for f in frames:
        if f["type"] == "chunk":
            assert "".join(text for text, _ in f["logprobs"]) == f["text"]
            pieces.setdefault(f["index"], []).extend(f["logprobs"])
    for index, got in pieces.items():
        words, _ = synthetic_tokens(SEED + index, 30)
        assert [text for text, _ in got] == words
        assert [lp for _, lps in got for lp in lps] == pytest.approx(list(synthetic_logprobs(words)))
        assert all(math.exp(lp) < 1 for _, lps in got for lp in lps)
    plain = await run(server, n=2, max_tokens=30)
    assert not any("logprobs" in f for f in plain if f["type"] == "chunk")


async def test_logprobs_and_cumulative_together(server: BackendServer) -> None:
    frames = await run(server, n=2, max_tokens=30, logprobs=True, output_kind="cumulative")
    counts = [len(lps) for f in frames if f["type"] == "chunk" for _, lps in f["logprobs"]]
    assert sum(counts) == sum(tokens_of(frames).values())  # each token's logprob once, not again and again


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"output_kind": "streamed"}, '"output_kind" must be one of delta, cumulative'),
        ({"cancel_after": 0}, '"cancel_after" must be a whole number of tokens from 1 to 39'),
        ({"cancel_after": 10**12}, '"cancel_after" must be a whole number of tokens from 1 to 39'),
        ({"cancel_after": 40}, "under max_tokens, 40"),
        ({"cancel_after": 2.5}, '"cancel_after" must be a whole number'),
        ({"logprobs": "yes"}, '"logprobs" must be true or false'),
    ],
)
async def test_bad_values_get_a_clear_error_and_the_connection_serves_on(
    server: BackendServer, options: dict[str, Any], message: str
) -> None:
    frame = generate_frame("bad", "x", 2, {"max_tokens": 40}, **options)
    async with connect(server.url) as ws:
        await ws.send(json.dumps(frame))
        error = await recv_frame(ws, 10)
        assert error["type"] == "error" and error["code"] == "bad_field" and error["id"] == "bad"
        assert message in error["message"]
        good = {**frame, "id": "good"}
        for key in options:
            good.pop(key)
        await ws.send(json.dumps(good))
        while (reply := await recv_frame(ws, 10))["type"] != "done":
            assert reply["type"] != "error"

"""The synthetic engine as an Engine: determinism, both finish reasons, rate, abort, close."""

from __future__ import annotations

import asyncio
import time

import pytest

from backend.engines import create_engine
from backend.engines.synthetic import SyntheticEngine, cut_at_stop, synthetic_tokens, token_intervals
from backend.vocabulary import Chunk, Prompt, SamplingParams


def params(max_tokens: int = 40, seed: int = 33, temperature: float = 0.8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed)


async def collect(engine: SyntheticEngine, n: int, p: SamplingParams) -> list[Chunk]:
    return [chunk async for chunk in engine.generate(Prompt("prompt"), n, p)]


def test_text_is_deterministic_per_sample_seed() -> None:
    assert synthetic_tokens(34, 50) == synthetic_tokens(34, 50)
    assert synthetic_tokens(34, 50) != synthetic_tokens(35, 50)
    tokens, _ = synthetic_tokens(34, 50)
    assert tokens[0][0].isupper() and not tokens[0].startswith(" ")
    assert all(t.startswith(" ") for t in tokens[1:])


def test_temperature_zero_makes_every_sample_the_same() -> None:
    assert synthetic_tokens(1, 30, temperature=0) == synthetic_tokens(2, 30, temperature=0)


def test_both_finish_reasons_occur() -> None:
    reasons = {synthetic_tokens(seed, 60)[1] for seed in range(40)}
    assert reasons == {"stop", "length"}
    for seed in range(40):
        tokens, reason = synthetic_tokens(seed, 60)
        assert len(tokens) <= 60
        if reason == "length":
            assert len(tokens) == 60
        else:
            assert tokens[-1].endswith(".") and len(tokens) >= 24


def test_intervals_follow_rate_and_jitter() -> None:
    intervals = token_intervals(5, 1000, rate=50.0, jitter=0.2)
    assert all(0.8 / 50 <= i <= 1.2 / 50 for i in intervals)
    assert sum(intervals) / len(intervals) == pytest.approx(1 / 50, rel=0.03)
    assert token_intervals(5, 10, 50.0, 0.0) == [0.02] * 10


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        SyntheticEngine(rate=0)
    with pytest.raises(ValueError, match="jitter"):
        SyntheticEngine(jitter=1.5)
    with pytest.raises(ValueError, match="unknown engine"):
        create_engine("nope")


async def test_stream_yields_each_sample_text_and_one_finish() -> None:
    engine = SyntheticEngine(rate=500, jitter=0.3)
    chunks = await collect(engine, 4, params())
    for index in range(4):
        mine = [c for c in chunks if c.index == index]
        tokens, reason = synthetic_tokens(33 + index, 40)
        assert "".join(c.text for c in mine) == "".join(tokens)
        assert [c.finish_reason for c in mine if c.finish_reason] == [reason]
        assert mine[-1].finish_reason == reason
    # samples interleave on the loop rather than running one after another
    assert [c.index for c in chunks[:8]] != sorted(c.index for c in chunks[:8])
    assert engine.health()["running_samples"] == 0


async def test_rate_is_per_sample() -> None:
    engine = SyntheticEngine(rate=100, jitter=0.0)
    start = time.monotonic()
    chunks = await collect(engine, 8, params(max_tokens=20, seed=1, temperature=0))
    elapsed = time.monotonic() - start
    assert len([c for c in chunks if c.tokens]) == 8 * 20
    # 20 tokens at 100 tok/s take 0.2 s whether 1 or 8 samples run
    assert 0.18 <= elapsed < 2.0


async def test_abort_one_sample_then_all() -> None:
    engine = SyntheticEngine(rate=200, jitter=0.0)
    generation = engine.generate(Prompt("prompt"), 3, params(max_tokens=1000))
    seen: list[Chunk] = []
    async for chunk in generation:
        seen.append(chunk)
        if len(seen) == 6:
            await generation.abort(1)
        if len([c for c in seen if c.index == 0]) == 10:
            await generation.abort()
    finishes = {c.index: c.finish_reason for c in seen if c.finish_reason}
    assert finishes == {0: "abort", 1: "abort", 2: "abort"}
    tokens_of = {i: sum(c.tokens for c in seen if c.index == i) for i in range(3)}
    assert tokens_of[1] < tokens_of[0]
    assert engine.health()["running_samples"] == 0


async def test_aclose_stops_every_sample_task() -> None:
    engine = SyntheticEngine(rate=100)
    generation = engine.generate(Prompt("prompt"), 5, params(max_tokens=1000))
    await generation.__anext__()
    assert engine.health()["running_samples"] == 5
    await generation.aclose()
    assert engine.health() == {
        "engine": "synthetic",
        "model": engine.model,
        "running_requests": 0,
        "running_samples": 0,
        "batch_invariant": True,  # a sample's text depends on its seed alone
    }
    await asyncio.sleep(0.05)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("synthetic-sample")]


def test_stop_strings_cut_the_text_before_them() -> None:
    tokens = ["Hello", " big", " world.", " Bye"]
    assert cut_at_stop(tokens, "length", ()) == (tokens, "length")
    assert cut_at_stop(tokens, "length", ("wor",)) == (["Hello", " big", " "], "stop")
    assert cut_at_stop(tokens, "length", (" Bye", "big")) == (["Hello", " "], "stop")
    assert cut_at_stop(tokens, "length", ("Hello",)) == ([], "stop")
    assert cut_at_stop(tokens, "length", ("absent",)) == (tokens, "length")


async def test_the_engine_honours_stop_strings() -> None:
    engine = SyntheticEngine(rate=500)
    full = "".join(synthetic_tokens(33, 40)[0])
    stop = full.split()[3]
    p = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=33, stop=(stop,))
    chunks = await collect(engine, 1, p)
    assert "".join(c.text for c in chunks) == full[: full.find(stop)]
    assert chunks[-1].finish_reason == "stop"


def test_intervals_without_jitter_are_all_one_over_rate() -> None:
    assert token_intervals(5, 4, rate=50.0, jitter=0.0) == [0.02] * 4
    assert token_intervals(5, 4, rate=50.0, jitter=0.0) == token_intervals(6, 4, rate=50.0, jitter=0.0)

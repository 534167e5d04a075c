"""Serving statistics: percentile and the TTFT / ITL / TPOT arithmetic, from fixed times."""

from __future__ import annotations

import random
from array import array

import pytest

from backend.serving.stats import SampleTimer, percentile, percentiles, percentiles_in_place, request_stats


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_sample_stats_follow_the_benchmark_definitions() -> None:
    timer = SampleTimer(started_at=10.0, seed=7)
    timer.on_chunk(10.2, 1)  # first token after 200 ms
    timer.on_chunk(10.3, 1)
    timer.on_chunk(10.5, 2)  # a coalesced chunk of two tokens
    timer.on_chunk(10.6, 0)  # an empty chunk does not count as output
    stats = timer.stats()
    assert stats["tokens"] == 4
    assert stats["chunks"] == 3
    assert stats["ttft_ms"] == pytest.approx(200.0)
    assert stats["e2e_ms"] == pytest.approx(500.0)
    # TPOT = (E2E - TTFT) / (tokens - 1) = 300 ms / 3
    assert stats["tpot_ms"] == pytest.approx(100.0)
    # inter-chunk gaps: 100 ms and 200 ms
    assert stats["itl_p50_ms"] == pytest.approx(150.0)
    assert stats["itl_p99_ms"] == pytest.approx(199.0)
    assert stats["tokens_per_s"] == pytest.approx(8.0)
    assert stats["seed"] == 7


def test_a_sample_without_output_has_no_timings() -> None:
    stats = SampleTimer(0.0, 1).stats()
    assert stats["tokens"] == 0
    assert stats["ttft_ms"] is None and stats["tpot_ms"] is None and stats["tokens_per_s"] is None


def test_one_token_has_no_tpot() -> None:
    timer = SampleTimer(0.0, 1)
    timer.on_chunk(0.05, 1)
    assert timer.stats()["tpot_ms"] is None
    assert timer.stats()["ttft_ms"] == pytest.approx(50.0)


def test_request_stats_aggregate_over_samples() -> None:
    a, b = SampleTimer(0.0, 1), SampleTimer(0.0, 2)
    for t in (0.1, 0.2, 0.3):
        a.on_chunk(t, 1)
    for t in (0.3, 0.7):
        b.on_chunk(t, 1)
    stats = request_stats([a, b], 0.0, 1.0)
    assert stats["n"] == 2
    assert stats["tokens"] == 5
    assert stats["tokens_per_s"] == pytest.approx(5.0)
    assert stats["ttft_mean_ms"] == pytest.approx(200.0)
    assert stats["tpot_mean_ms"] == pytest.approx((100.0 + 400.0) / 2)
    assert stats["itl_p50_ms"] == pytest.approx(100.0)  # gaps 100, 100, 400
    assert stats["duration_ms"] == pytest.approx(1000.0)


def test_percentiles_are_each_percentile_from_one_sort() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 9.5]
    qs = (0, 50, 90, 99, 100)
    assert percentiles(values, qs) == [percentile(values, q) for q in qs]
    assert percentiles([], (50, 99)) == [None, None]


def test_selection_gives_exactly_the_sorted_percentiles() -> None:
    rng = random.Random(3)
    qs = (0, 1, 50, 90, 99, 99.9, 100)
    for count in (1, 2, 3, 7, 270, 1001):
        values = [rng.uniform(0.001, 0.003) for _ in range(count)]
        values += values[: count // 3]  # ties, as gaps of a steady engine have
        assert percentiles_in_place(array("d", values), qs) == percentiles(values, qs)
    assert percentiles_in_place(array("d"), (50, 99)) == [None, None]


def test_stats_leave_the_gaps_appendable_and_the_request_sees_every_gap() -> None:
    rng = random.Random(5)
    timers = [SampleTimer(0.0, i) for i in range(5)]
    gaps: list[float] = []
    for timer in timers:
        now = rng.uniform(0.01, 0.1)
        timer.on_chunk(now, 1)
        for _ in range(rng.randint(0, 40)):
            gap = rng.uniform(0.001, 0.02)
            gaps.append(gap)
            now += gap
            timer.on_chunk(now, 1)
        timer.stats()
    stats = request_stats(timers, 0.0, 1.0)
    p50, p99 = percentiles(gaps, (50, 99))
    assert stats["itl_p50_ms"] == round(p50 * 1000, 2) and stats["itl_p99_ms"] == round(p99 * 1000, 2)
    timers[0].on_chunk(2.0, 1)  # no numpy view of the gaps outlives the stats that took it

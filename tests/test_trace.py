"""The event-loop tracer, its live frames and its export, on real loops and a real server."""

from __future__ import annotations

import asyncio
import functools
import gc
import html
import json
import time
import weakref
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines.synthetic import synthetic_tokens
from backend.frames import cancel_frame, export_trace_frame
from backend.serving import server as server_module
from backend.serving.server import BackendServer
from backend.trace.feed import TraceFeed
from backend.trace.frames import OTHER_CONNECTION, chrome_trace, live_frame, task_label
from backend.trace.prefill import KEPT_ENDED, PrefillLog, PrefillSpan, prefill_counts
from backend.trace.recorder import LAG, STEP, LoopTracer
from devkit.frames import recv_frame
from tests.support.backends import synthetic_serving
from tests.support.wire import generate, until_done
from ui.trace_view import TraceView, panel_html
from ui.view import RunView

PARAMS = {"max_tokens": 30, "seed": 3}
"""A request's sampling settings where a test names none."""


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_steps_are_attributed_to_their_tasks_and_a_block_shows_as_stall_and_lag() -> None:
    tracer = LoopTracer(heartbeat_s=0.01)
    tracer.install(asyncio.get_running_loop())

    async def worker() -> None:
        await asyncio.sleep(0.03)
        _spin(0.05)  # an injected 50 ms block on the loop
        await asyncio.sleep(0.03)

    await asyncio.create_task(worker(), name="blocker")
    tracer.uninstall()
    steps = [(e[3], e[2] / 1e6) for e in tracer.events if e[0] == STEP]
    blocker = [ms for name, ms in steps if name == "blocker"]
    assert len(blocker) >= 3
    assert 45 <= max(blocker) <= 80
    assert "heartbeat" in {name for name, _ in steps}
    lags = [e[2] / 1e6 for e in tracer.events if e[0] == LAG]
    assert max(lags) >= 30  # the heartbeat that was due during the block woke that late
    assert tracer.overhead_per_event_ns() > 0


async def test_the_ring_buffer_bounds_memory() -> None:
    tracer = LoopTracer(capacity=500)
    tracer.install(asyncio.get_running_loop())
    for _ in range(3000):
        await asyncio.sleep(0)
    tracer.uninstall()
    assert tracer.kept == 500 and len(tracer._times) == len(tracer._items) == 500
    assert tracer.recorded > 2500
    events, cursor = tracer.since(0)
    # The oldest kept step may be left out: the event before it, where it started, was overwritten.
    assert 499 <= len(events) <= 500 and cursor == tracer.recorded
    assert tracer.events == events
    assert tracer.since(cursor) == ([], cursor)
    newest, _ = tracer.since(cursor - 10)
    assert newest == events[-10:]


def test_connections_see_their_own_tasks_and_others_anonymously() -> None:
    assert task_label("consume r1 @c2", "c2") == "consume r1"
    assert task_label("consume secret @c3", "c2") == OTHER_CONNECTION
    assert task_label("heartbeat", "c2") == "heartbeat"
    frame = live_frame([], 0, "c1")
    assert frame["type"] == "trace" and frame["slices"] == [] and frame["counts"]["steps"] == 0


async def test_live_trace_frames_name_tasks_and_count_every_chunk(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 3, "hi", PARAMS))
        frames = await until_done(ws, "r1")
    traces = [f for f in frames if f["type"] == "trace"]
    assert traces, "trace frames arrive while the request runs"
    assert frames.index(traces[-1]) < frames.index(frames[-1])  # the last trace comes before done
    names = {name for f in traces for name in f["names"]}
    assert {"consume r1", "send", "ws reader", "heartbeat"} <= names
    assert not any("@" in name for name in names)
    tokens_in_trace: dict[int, int] = {}
    for f in traces:
        for _, request_id, index, tokens, count in f["chunks"]:
            assert count >= 1
            assert request_id == "r1"
            tokens_in_trace[index] = tokens_in_trace.get(index, 0) + tokens
    finishes = {f["index"]: f["stats"]["tokens"] for f in frames if f["type"] == "finish"}
    assert tokens_in_trace == finishes
    assert sum(f["counts"]["frames"] for f in traces) > 0
    for f in traces:
        for start, end, busy, name, count, longest in f["slices"]:
            assert start <= end and 0 <= busy <= end - start + 0.01 and count >= 1
            assert 0 <= longest <= busy + 0.001
            assert 0 <= name < len(f["names"])


async def test_export_is_a_chrome_trace_with_every_event_kind(server: BackendServer) -> None:
    async with connect(server.url, max_size=None) as ws:
        await ws.send(generate("r1", 2, "hi", PARAMS))
        await until_done(ws, "r1")
        await ws.send(json.dumps(export_trace_frame("r1")))
        async with asyncio.timeout(10):
            while (export := await recv_frame(ws))["type"] != "trace_export":
                pass
        await ws.send(json.dumps(export_trace_frame("nope")))
        async with asyncio.timeout(10):
            while (error := await recv_frame(ws))["type"] != "error":
                pass
    assert error["code"] == "unknown_id"
    events = export["traceEvents"]
    json.dumps(events)
    kinds = {(e["ph"], e.get("cat")) for e in events}
    assert {("X", "loop"), ("X", "idle"), ("i", "chunk"), ("C", None), ("M", None)} <= kinds
    chunk_indices = {e["args"]["index"] for e in events if e.get("cat") == "chunk"}
    assert chunk_indices == {0, 1}
    lane_names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"event loop", "sample 0", "sample 1"} <= lane_names
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert any(e["name"] == "consume r1" for e in events if e["ph"] == "X")


async def cancel_latency_ms(server: BackendServer, mode: str) -> float:
    """Client-side time from sending cancel to receiving `done`, under a consumer mode."""
    async with connect(server.url) as ws:
        params = {"max_tokens": 1000, "seed": 1, "temperature": 0}
        await ws.send(generate("r", 4, "hi", params, consumer={"mode": mode, "block_ms": 15}))
        chunks = 0
        while chunks < 40:
            if (await recv_frame(ws))["type"] == "chunk":
                chunks += 1
        sent = time.perf_counter()
        await ws.send(json.dumps(cancel_frame("r")))
        frames = await until_done(ws, "r")
        assert {f["reason"] for f in frames if f["type"] == "finish"} == {"abort"}
        return (time.perf_counter() - sent) * 1000


async def test_blocking_consumer_raises_cancel_latency(server: BackendServer) -> None:
    cooperative = await cancel_latency_ms(server, "cooperative")
    blocking = await cancel_latency_ms(server, "blocking")
    assert blocking > cooperative + 15


async def test_cancel_chain_is_traced(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("r1", 2, "hi", {"max_tokens": 1000, "seed": 1}))
        while (await recv_frame(ws))["type"] != "chunk":
            pass
        await ws.send(json.dumps(cancel_frame("r1", 1)))
        await asyncio.sleep(0.1)
        await ws.send(json.dumps(cancel_frame("r1")))
        frames = await until_done(ws, "r1")
    cancels = [c for f in frames if f["type"] == "trace" for c in f["cancels"]]
    stages = [(stage, index) for _, _, index, stage in cancels]
    assert ("received", 1) in stages and ("aborted", 1) in stages and ("finished", 1) in stages
    assert ("received", None) in stages and ("finished", 0) in stages


async def test_fanout_requests_gives_the_same_samples(server: BackendServer) -> None:
    async with connect(server.url) as ws:
        await ws.send(generate("a", 3, "hi", PARAMS, fanout="requests"))
        frames = await until_done(ws, "a")
    texts: dict[int, str] = {}
    for f in frames:
        if f["type"] == "chunk":
            texts[f["index"]] = texts.get(f["index"], "") + f["text"]
    for index in range(3):
        assert texts[index] == "".join(synthetic_tokens(3 + index, 30, 0.8)[0])
    assert sorted(f["stats"]["seed"] for f in frames if f["type"] == "finish") == [3, 4, 5]


async def test_greedy_consumer_runs_in_longer_steps_than_cooperative(server: BackendServer) -> None:
    async def mean_steps_per_slice(mode: str) -> float:
        async with connect(server.url) as ws:
            await ws.send(generate(mode, 8, "hi", {"max_tokens": 40, "seed": 1}, consumer={"mode": mode}))
            frames = await until_done(ws, mode)
        slices = [
            s
            for f in frames
            if f["type"] == "trace"
            for s in f["slices"]
            if f["names"][s[3]] == f"consume {mode}"
        ]
        return sum(s[4] for s in slices) / len(slices)

    # cooperative yields after every chunk: more, shorter steps of the consumer task
    assert await mean_steps_per_slice("cooperative") > await mean_steps_per_slice("greedy")


async def test_tracing_can_be_turned_off() -> None:
    async with synthetic_serving(200, 0.3, trace=False) as backend:
        async with connect(backend.url) as ws:
            await ws.send(generate("r1", 2, "hi", PARAMS))
            frames = await until_done(ws, "r1")
            assert not [f for f in frames if f["type"] == "trace"]
            accepted = next(f for f in frames if f["type"] == "accepted")
            assert accepted["trace_off"] == "tracing is off on this server (--no-trace)"
            await ws.send(json.dumps(export_trace_frame("r1")))
            assert (await recv_frame(ws))["code"] == "trace_disabled"


async def test_without_the_c_parts_the_server_serves_untraced_and_the_page_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "tracer_available", lambda: False)
    async with synthetic_serving(200, 0.3) as backend:
        assert "C parts are not built" in backend.health()["trace"]["off"]
        async with connect(backend.url) as ws:
            await ws.send(generate("r1", 2, "hi", PARAMS))
            frames = await until_done(ws, "r1")
            assert [f["type"] for f in frames].count("chunk") > 0
            assert not [f for f in frames if f["type"] == "trace"]
        view = RunView("r1", started_at=0.0)
        for frame in frames:
            view.apply(frame, 0.0)
        shown = html.unescape(panel_html(view.trace, view.n))
        assert "No event-loop trace: tracing is off on this server: the tracer's C parts" in shown


class _Subscriber:
    def __init__(self, label: str, traced: bool = True) -> None:
        self.label = label
        self.traced = traced
        self.sent: list[bytes] = []

    @property
    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(data) for data in self.sent]

    @property
    def wants_trace(self) -> bool:
        return self.traced

    def send_encoded(self, data: bytes) -> None:
        self.sent.append(data)

    def take_reads(self, origin_ns: int) -> list[list[Any]]:
        return []

    def take_prefills(self, origin_ns: int) -> list[list[Any]]:
        return []


async def test_one_digest_feeds_each_traced_connection_its_own_frame() -> None:
    tracer = LoopTracer()
    tracer.install(asyncio.get_running_loop())
    feed = TraceFeed(tracer)
    one, two, idle = _Subscriber("c1"), _Subscriber("c2"), _Subscriber("c3", traced=False)
    for subscriber in (one, two, idle):
        feed.add(subscriber)

    async def consume(connection: str, chunks: int) -> None:
        for _ in range(chunks):
            tracer.chunk((connection, "r1"), 0, 2)
            await asyncio.sleep(0.001)

    feed.request_started()
    await asyncio.gather(
        asyncio.create_task(consume("c1", 5), name="consume r1 @c1"),
        asyncio.create_task(consume("c2", 3), name="consume r1 @c2"),
    )
    feed.flush()
    tracer.uninstall()
    assert idle.frames == []
    (frame_one,), (frame_two,) = one.frames, two.frames
    assert sum(tokens for _, _, _, tokens, _ in frame_one["chunks"]) == 10
    assert sum(tokens for _, _, _, tokens, _ in frame_two["chunks"]) == 6
    assert "consume r1" in frame_one["names"] and OTHER_CONNECTION in frame_one["names"]
    assert frame_one["counts"] == frame_two["counts"]  # the loop's work is the same for both
    assert frame_one["counts"]["record_ns"] > 0
    steps = [slice_ for slice_ in frame_one["slices"] if frame_one["names"][slice_[3]] == "consume r1"]
    assert sum(count for *_, count, _longest in steps) >= 5  # each step, merged into slices, counted
    feed.flush()  # nothing new since: nothing sent
    assert len(one.frames) == 1


async def test_a_flush_sets_off_no_garbage_collection() -> None:
    tracer = LoopTracer()
    tracer.install(asyncio.get_running_loop())
    feed = TraceFeed(tracer)
    subscriber = _Subscriber("c1")
    feed.add(subscriber)
    feed.request_started()

    async def consume() -> None:  # 64 samples over ~100 ms: a frame of hundreds of chunk runs
        for _ in range(50):
            for index in range(64):
                tracer.chunk(("c1", "r1"), index, 1)
            await asyncio.sleep(0.002)

    await asyncio.create_task(consume(), name="consume r1 @c1")
    feed.flush()  # the first one fills the digest's caches of names, which stay
    await asyncio.create_task(consume(), name="consume r1 @c1")
    collections: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.collect()  # young generation count back to 0
    gc.callbacks.append(note)
    gc.set_threshold(200)  # 200 new containers alive at once would set a collection off
    try:
        feed.flush()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(note)
        tracer.uninstall()
    assert collections == []
    assert gc.isenabled()
    _, second = subscriber.frames
    assert sum(tokens for _, _, _, tokens, _ in second["chunks"]) == 50 * 64


class _Held:
    """Something a callback reaches; the test watches whether it is freed."""


async def test_the_tracer_keeps_no_callback_alive() -> None:
    # asyncio.gather and wait make a closure per call as a done-callback, and a partial or a lambda is
    # a new object each time: naming them must not keep them, or what they reach, alive.
    tracer = LoopTracer()
    loop = asyncio.get_running_loop()
    tracer.install(loop)
    refs: list[weakref.ref[_Held]] = []

    async def result(held: _Held) -> _Held:
        return held

    def keep(held: _Held, done: asyncio.Event) -> None:
        done.set()

    try:
        for _ in range(3):
            held = _Held()
            refs.append(weakref.ref(held))
            await asyncio.gather(result(held))
            await asyncio.wait([asyncio.create_task(result(held))])
            done = asyncio.Event()
            loop.call_soon(functools.partial(keep, held, done))
            await done.wait()
            other = _Held()
            refs.append(weakref.ref(other))
            done = asyncio.Event()
            loop.call_soon(lambda other=other, done=done: keep(other, done))
            await done.wait()
            del held, other
        names = {name for _, _, _, name, _ in tracer.events if isinstance(name, str)}
    finally:
        tracer.uninstall()
    gc.collect()
    assert [ref() for ref in refs] == [None] * len(refs)
    assert "gather.<locals>._done_callback" in names  # still named


async def test_trace_frames_carry_the_loops_task_tree_once_a_second() -> None:
    async with synthetic_serving(100, 0.3) as backend:
        async with connect(backend.url) as ws, connect(backend.url) as other:
            # another connection's request, running beside this one
            await other.send(generate("o1", 2, "hi", {"max_tokens": 200, "seed": 1}))
            await ws.send(generate("r1", 2, "hi", {"max_tokens": 200, "seed": 2}))
            frames = await until_done(ws, "r1")
            await until_done(other, "o1")
    trees = [f["tasks"] for f in frames if f["type"] == "trace" and "tasks" in f]
    traced = [f for f in frames if f["type"] == "trace"]
    assert 1 <= len(trees) <= len(traced) // 4 + 1  # about one frame in five
    tree = next(t for t in trees if "consume r1" in t)
    # This connection's consumer, its coroutine, and what it waits on, as pstree draws them.
    assert "(T) consume r1\n" in tree and "_run connection.py:" in tree
    assert "(T) send\n" in tree and "(T) trace\n" in tree
    assert "@c" not in tree  # other connections' tasks are not named
    assert "(T) other connection" in tree


def test_a_prefill_span_runs_from_hand_over_to_first_chunk_and_takes_the_first_reported_counts() -> None:
    log = PrefillLog()
    origin = 1_000_000_000
    log.handed("r1", origin + 5_000_000)
    assert log.take(origin) == []  # no first chunk yet: nothing to draw
    assert log.awaiting("r1") == 1
    assert log.first_chunk("r1", 2, origin + 84_250_000)  # any sample's first chunk ends it
    assert not log.first_chunk("r1", 0, origin + 90_000_000)  # a later chunk does not move the end
    assert log.awaiting("r1") == 0
    assert log.take(origin) == [[5.0, 84.25, "r1", None, None, False]]
    assert log.take(origin) == []  # unchanged since the last frame
    log.reported("r1", {"prompt_tokens": 247, "cached_tokens": 246})
    log.reported("r1", {"prompt_tokens": 247, "cached_tokens": 0})  # the first report labels it
    log.ended("r1")
    assert log.take(origin) == [[5.0, 84.25, "r1", 247, 246, True]]
    log.handed("r2", origin)
    log.ended("r2")  # ended before any chunk (cancelled, failed): no span
    assert log.take(origin) == []
    log.reported("nope", {"cached_tokens": 1})  # an unknown request changes nothing
    assert log.take(origin) == []
    log.handed("running", origin)
    for number in range(100):  # a long run's neighbours come and go: the ended ones kept are bounded
        log.handed(f"q{number}", origin)
        log.ended(f"q{number}")
    assert len(log.spans) <= KEPT_ENDED + 2 and "running" in log.spans and "q99" in log.spans


def test_fan_out_has_a_prefill_span_per_request() -> None:
    """Fan-out sends n requests of one sample: each has its span, from the hand-over to its own
    sample's first chunk, labelled by its own sample's figures."""
    log = PrefillLog()
    origin = 0
    log.handed("r1", 1_000_000, requests=3)
    assert log.awaiting("r1") == 3
    assert log.first_chunk("r1", 1, 20_000_000) and log.first_chunk("r1", 0, 35_000_000)
    assert not log.first_chunk("r1", 1, 40_000_000)
    assert log.take(origin) == [
        [1.0, 35.0, "r1/0", None, None, False],
        [1.0, 20.0, "r1/1", None, None, False],
    ]
    log.reported("r1", {"prompt_tokens": 30, "cached_tokens": 24}, index=1)
    log.first_chunk("r1", 2, 50_000_000)
    log.ended("r1")
    assert log.take(origin) == [
        [1.0, 35.0, "r1/0", None, None, True],
        [1.0, 20.0, "r1/1", 30, 24, True],
        [1.0, 50.0, "r1/2", None, None, True],
    ]
    events = chrome_trace([], 0, "c1", "r1", (0, 60_000_000), log.spans["r1"])
    prefills = [e for e in events if e.get("cat") == "prefill"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert len({e["tid"] for e in prefills}) == 3 and all("of request" in lanes[e["tid"]] for e in prefills)


def test_prefill_counts_read_each_engines_figures_and_never_invent_a_zero() -> None:
    assert prefill_counts({"prompt_tokens": 30, "cached_tokens": 24, "e2e_latency": 0.2}) == (30, 24)
    usage = {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 8}}
    assert prefill_counts({"usage": usage}) == (12, 8)
    assert prefill_counts({"usage": {"prompt_tokens": 12, "prompt_tokens_details": None}}) is None
    assert prefill_counts({"prompt_tokens": 30}) is None  # no cached count: not reported, not 0
    assert prefill_counts({}) is None
    assert prefill_counts({"prompt_tokens": 3, "cached_tokens": 4}) is None  # impossible figures
    assert prefill_counts({"prompt_tokens": True, "cached_tokens": 0}) is None


def test_the_export_puts_the_prefill_on_a_lane_of_its_own() -> None:
    span = PrefillSpan(2_000_000, 9_500_000, (40, 30), True)
    events = chrome_trace([], 0, "c1", "r1", (0, 10_000_000), [span])
    (prefill,) = [e for e in events if e.get("cat") == "prefill"]
    assert prefill["ph"] == "X" and prefill["ts"] == 2000.0 and prefill["dur"] == 7500.0
    assert prefill["args"] == {"prompt_tokens": 40, "computed": 10, "reused": 30}
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert lanes[prefill["tid"]].startswith("prefill")
    assert not [e for e in chrome_trace([], 0, "c1", "r1", (0, 1), [PrefillSpan(0)]) if e.get("cat")]


async def test_a_requests_trace_frames_carry_its_prefill_span(server: BackendServer) -> None:
    async with connect(server.url, max_size=None) as ws:
        await ws.send(generate("r1", 3, "hi", PARAMS))
        frames = await until_done(ws, "r1")
        await ws.send(json.dumps(export_trace_frame("r1")))
        async with asyncio.timeout(10):
            while (export := await recv_frame(ws))["type"] != "trace_export":
                pass
    traces = [f for f in frames if f["type"] == "trace"]
    spans = [p for f in traces for p in f["prefills"]]
    assert spans and all(p[2] == "r1" for p in spans)
    start, end = spans[-1][:2]
    assert spans[-1] == [*spans[0][:2], "r1", None, None, True]  # the synthetic engine reports none
    first_chunk = min(t for f in traces for t, *_ in f["chunks"])
    # handed to the engine before the first chunk; the span ends where the consumer took it
    assert 0 < start < first_chunk <= end < first_chunk + 50
    assert end - start < 5_000
    html = panel_html(_view_of(traces, "r1"), n=3)
    assert "trace-prefill" in html and "tokens not reported" in html
    (exported,) = [e for e in export["traceEvents"] if e.get("cat") == "prefill"]
    assert exported["ts"] == pytest.approx(start * 1000, abs=1)
    assert exported["args"]["computed"] is None


def _view_of(traces: list[dict[str, Any]], request_id: str) -> TraceView:
    view = TraceView(request_id)
    for frame in traces:
        view.apply(frame)
    return view


def test_a_blocked_loop_is_read_from_another_thread() -> None:
    """`LoopTracer.stall` read from outside while the traced loop blocks in one step: the step's
    start, how long it has run, the heartbeat's lag, and the chunks it took inside it."""
    import threading

    blocking = threading.Event()
    release = threading.Event()
    tracer = LoopTracer()

    async def main() -> None:
        tracer.install(asyncio.get_running_loop())
        await asyncio.sleep(0.1)  # a few heartbeats and idle waits first
        blocking.set()
        for index in range(3):
            tracer.chunk(("c1", "r1"), index, 1)
        release.wait(10)  # one step that does not yield, as a blocking consumer's
        await asyncio.sleep(0.05)
        tracer.uninstall()

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    assert blocking.wait(10)
    time.sleep(0.3)
    first = tracer.stall(time.perf_counter_ns())
    time.sleep(0.2)
    second = tracer.stall(time.perf_counter_ns())
    release.set()
    thread.join(10)
    assert first.since_ns == second.since_ns > 0 and second.taken == first.taken == 3
    assert 0.25e9 < first.stall_ns < second.stall_ns and second.stall_ns - first.stall_ns >= 0.15e9
    assert second.lag_ns > 0.4e9  # the heartbeat (every 20 ms) is as late as the step is long
    after = tracer.stall(time.perf_counter_ns())
    assert after.stall_ns < 0.2e9 and after.taken == 0  # the loop ran on: nothing is blocked

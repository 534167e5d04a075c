"""The page's trace panel: live frames folded into figures and a swimlane SVG, without I/O."""

from __future__ import annotations

from backend.trace.frames import live_frame
from backend.trace.recorder import CANCEL, CHUNK, FRAME, IDLE, LAG, STEP
from ui.loop_watch import CancelTiming, LoopWatch, blocked_words, cancel_words, watch_url
from ui.trace_view import TraceView, category, panel_html

MS = 1_000_000


def frame_of(events: list[tuple]) -> dict:
    return live_frame(events, 0, "c1")


def test_figures_follow_the_measurements() -> None:
    events = [
        (STEP, 0 * MS, 2 * MS, "consume r1 @c1", None),
        (STEP, 2 * MS, 1 * MS, "send @c1", None),
        (IDLE, 3 * MS, 7 * MS, None, 0),
        (STEP, 10 * MS, 30 * MS, "consume r1 @c1", None),  # a 30 ms stall
        (LAG, 40 * MS, 25 * MS, None, None),
        (LAG, 60 * MS, 1 * MS, None, None),
        (CHUNK, 1 * MS, 0, ("c1", "r1"), (0, 1)),
        (CHUNK, 11 * MS, 0, ("c1", "r1"), (1, 1)),
        (CHUNK, 12 * MS, 0, ("c2", "secret"), (0, 1)),  # another connection's chunk
        (FRAME, 12 * MS, 0, "c1", (1, 80)),
        (CANCEL, 20 * MS, 0, ("c1", "r1"), ("received", None)),
        (CANCEL, 45 * MS, 0, ("c1", "r1"), ("finished", 1)),
        (IDLE, 61 * MS, 39 * MS, None, 0),
    ]
    view = TraceView("r1")
    view.apply(frame_of(events))
    figures = view.figures()
    assert figures["utilisation"] == (33 / (33 + 46))
    assert figures["longest_stall_ms"] == 30
    assert figures["lag_max_ms"] == 25
    assert figures["cancel_latency_ms"] == 25
    assert view.chunk_count == 2  # the other connection's chunk is not ours
    assert figures["chunks_per_s"] == 2 / 0.1
    html = panel_html(view, n=2)
    assert "<svg" in html and "#0" in html and "#1" in html and "cancel received" in html
    assert "30.0 ms" in html  # longest stall shown


def test_categories_colour_the_loop_lane() -> None:
    assert category("consume r1") == "consume"
    assert category("send") == "send"
    assert category("ws reader") == "socket" and category("socket read") == "socket"
    # an engine's tasks are the engine's by the names its run's `accepted` frame gives, whatever engine
    assert category("synthetic-sample-3", "synthetic-") == "engine"
    assert category("replay-sample-0", "replay-") == "engine"
    assert category("synthetic-sample-3", "replay-") == "other"  # another engine: another client's
    assert category("fanout 2 r1 @c1", "replay-") == "engine"  # the server's fan-out drives the engine
    assert category("heartbeat") == "tracer"
    assert category("other connection") == "other"


def test_an_empty_trace_says_so() -> None:
    assert "appears here" in panel_html(TraceView("r1"), n=4)


def test_close_chunks_of_a_sample_share_an_entry_and_still_count() -> None:
    events = [(CHUNK, t * MS, 0, ("c1", "r1"), (0, 2)) for t in (0, 3, 6, 9)]  # within one bin
    events += [(CHUNK, 4 * MS, 0, ("c1", "r1"), (1, 1)), (CHUNK, 30 * MS, 0, ("c1", "r1"), (0, 1))]
    frame = frame_of(events)
    assert frame["chunks"] == [[0.0, "r1", 0, 8, 4], [4.0, "r1", 1, 1, 1], [30.0, "r1", 0, 1, 1]]
    view = TraceView("r1")
    view.apply(frame)
    assert view.chunk_count == 6
    assert sorted(view.chunks) == [(0.0, 0), (4.0, 1), (30.0, 0)]


def test_other_connections_work_is_one_lane_without_this_connections_own() -> None:
    events = [
        (STEP, 0 * MS, 3 * MS, "consume r1 @c1", None),
        (STEP, 3 * MS, 1 * MS, "consume r1 @c2", None),
        (STEP, 4 * MS, 2 * MS, "send @c3", None),
        (STEP, 6 * MS, 1 * MS, "heartbeat", None),
    ]

    def lanes(connection: str) -> dict[str, tuple[float, int, float]]:
        frame = live_frame(events, 0, connection)
        out: dict[str, tuple[float, int, float]] = {}
        for _start, _end, busy, name, count, longest in frame["slices"]:
            label = frame["names"][name]
            before = out.get(label, (0.0, 0, 0.0))
            out[label] = (before[0] + busy, before[1] + count, max(before[2], longest))
        return out

    assert lanes("c1") == {
        "consume r1": (3.0, 1, 3.0),
        "other connection": (3.0, 2, 2.0),
        "heartbeat": (1.0, 1, 1.0),
    }
    assert lanes("c2")["other connection"] == (5.0, 2, 3.0)
    assert lanes("c3")["other connection"] == (4.0, 2, 3.0) and lanes("c3")["send"] == (2.0, 1, 2.0)


def test_the_tracers_own_cost_is_shown() -> None:
    frame = frame_of([(STEP, 0, 2 * MS, "consume r1 @c1", None), (IDLE, 2 * MS, 5 * MS, None, 0)])
    view = TraceView("r1")
    view.apply(frame)
    assert "<span>tracer cost</span><b>-</b>" in panel_html(view, n=1)  # no figure from the backend yet
    frame["counts"].update({"record_ns": 131})
    view.apply(frame)
    assert "<span>tracer cost</span><b>131 ns/step</b>" in panel_html(view, n=1)


def test_the_prefill_span_is_drawn_with_the_counts_once_reported() -> None:
    frame = frame_of([(STEP, 10 * MS, 2 * MS, "consume r1 @c1", None), (IDLE, 12 * MS, 88 * MS, None, 0)])
    view = TraceView("r1")
    view.apply({**frame, "prefills": [[2.0, 30.0, "r1", None, None, False], [1.0, 5.0, "r9", 9, 9, True]]})
    assert view.prefill == (2.0, 30.0, None, None, False) and view.first_ms == 2.0  # the plot starts there
    assert "prefill 28 ms: tokens …" in panel_html(view, n=1)
    view.apply({**frame, "prefills": [[2.0, 30.0, "r1", 247, 246, True]]})
    html = panel_html(view, n=1)
    assert 'class="trace-prefill"' in html and "prefill 28 ms: 1 computed / 246 reused" in html
    view.apply({**frame, "prefills": [[2.0, 30.0, "r1", None, None, True]]})
    assert "prefill 28 ms: tokens not reported" in panel_html(view, n=1)  # never a made-up 0


def test_a_long_lag_keeps_the_stall_it_follows_in_the_window() -> None:
    """A lag is recorded when the heartbeat woke: a 30 s stall's lag must not push the window's end
    30 s on and drop the stall (the panel then drew nothing of a blocking run)."""
    events = [
        (STEP, 0, 2 * MS, "consume r1 @c1", None),
        (STEP, 2 * MS, 30_000 * MS, "consume r1 @c1", None),
        (LAG, 30_002 * MS, 29_990 * MS, None, None),
    ]
    view = TraceView("r1")
    view.apply(frame_of(events))
    assert view.last_ms == 30_002
    figures = view.figures()
    assert figures["longest_stall_ms"] == 30_000 and figures["lag_max_ms"] == 29_990
    html = panel_html(view, 1)
    assert 'class="trace-stall" data-ms="30000.0"' in html and "30.0 s step" in html


def test_the_watched_loop_is_drawn_live_and_said_in_words() -> None:
    view = TraceView("r1")
    view.apply(frame_of([(STEP, 0, 2 * MS, "consume r1 @c1", None)]))
    assert "trace-stall" not in panel_html(view, 1)
    data = {
        "at_ms": 3_500.0,
        "since_ms": 1_000.0,
        "stall_ms": 2_500.0,
        "lag_ms": 2_480.0,
        "taken": 7,
        "waiting": 40,
    }
    reading = LoopWatch.from_json(data, read_at=100.0)
    assert reading is not None and reading.blocked
    view.watch(reading)
    html = panel_html(view, 1)
    assert 'class="trace-stall live" data-ms="2500.0"' in html and "blocked 2.5 s step" in html
    assert "blocked now" in html and "2.5 s, 40 chunks waiting" in html
    assert 'stroke-dasharray="3,2"' in html  # the watched lag
    words = blocked_words(reading, last_chunk_at=97.0, now=100.5)
    assert "The loop is blocked: 3.5 s since its last chunk" in words and "40 chunks wait" in words
    assert blocked_words(LoopWatch.from_json({**data, "stall_ms": 20.0}, 0.0), None) == ""
    assert LoopWatch.from_json({"off": "tracing is off"}, 0.0) is None
    assert LoopWatch.from_json({**data, "taken": "x"}, 0.0) is None
    view.watch(None)
    assert "trace-stall live" not in panel_html(view, 1)


def test_a_cancel_says_when_the_loop_read_it_and_what_it_stopped() -> None:
    cancel = CancelTiming(pressed_at=10.0)
    assert "waiting for the blocked loop to read it (2.0 s so far)" in cancel_words(
        cancel, 4.0, False, now=12.0
    )
    cancel.read({"type": "cancel_ack", "aborting": [0, 2], "t_ms": 9_000.0}, now=16.5)
    said = cancel_words(cancel, 4.0, True)
    assert said == (
        "Cancel pressed 6.0 s into the run; the loop read it 6.5 s later (cancel latency): "
        "it stopped 2 samples."
    )
    late = CancelTiming(pressed_at=10.0)
    late.read({"type": "cancel_ack", "aborting": []}, now=11.0)
    assert "the run had already finished, so there was nothing to stop" in cancel_words(late, 4.0, True)
    view = TraceView("r1")
    view.apply(frame_of([(STEP, 0, 9_000 * MS, "consume r1 @c1", None)]))
    view.cancel_read(cancel)
    assert view.figures()["cancel_latency_ms"] == 6_500.0 and view.cancel_band == (2_500.0, 9_000.0)
    assert "trace-cancel-wait" in panel_html(view, 1)
    assert watch_url("ws://127.0.0.1:8765/ws") == "http://127.0.0.1:8765/experiment/loop"
    assert watch_url("wss://host/ws") == "https://host/experiment/loop"


def test_fan_out_draws_a_prefill_bar_per_request() -> None:
    view = TraceView("r1")
    frame = frame_of([(STEP, 0, 2 * MS, "consume r1 @c1", None)])
    frame["prefills"] = [
        [0.0, 30.0, "r1/0", 20, 0, True],
        [0.0, 55.0, "r1/1", 20, 0, True],
        [0.0, 9.0, "r2", 5, 0, True],
    ]
    view.apply(frame)
    assert sorted(view.sub_prefills) == [0, 1] and view.prefill is None
    html = panel_html(view, 2)
    assert (
        html.count('class="trace-prefill" data-sample=') == 2
        and "2 prefills, one per request: 30-55 ms" in html
    )


def test_a_consumer_stands_beside_the_last_runs_where_it_differs() -> None:
    view = TraceView("r1")
    view.apply(
        frame_of([(STEP, 0, 2 * MS, "consume r1 @c1", None), (STEP, 10 * MS, 4 * MS, "consume r1 @c1", None)])
    )
    view.consumer = "greedy"
    view.compare = ("cooperative", {"consume_steps": 40.0, "consume_step_ms": 0.5, "longest_stall_ms": 1.0})
    html = panel_html(view, 1)
    assert "this run (greedy)" in html and "last run (cooperative)" in html
    assert "<td>consumer steps</td><td>2</td><td>40</td>" in html
    view.compare = ("greedy", {})
    assert "trace-compare" not in panel_html(view, 1)

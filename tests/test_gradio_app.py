"""The Gradio app through gradio_client, against `python app.py` on the synthetic engine."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from gradio_client import Client

from backend.engines.synthetic import synthetic_tokens
from devkit.local import ROOT, free_port, start_app
from tests.support.backends import RunningApp
from tests.support.vote_chart import drawn_bars
from ui.sample_tree import WORD_UNITS
from ui.sample_tree_view import value_rows

SAMPLES, STATUS, SUMMARY, TRACE = range(4)


def texts(output: Any) -> list[str]:
    """Each column's text in one output of /generate."""
    return [sample["text"] for sample in output[SAMPLES]["samples"]]


def statuses(output: Any) -> list[str]:
    """Each column's status (streaming, stop, length, stopped, error) in one output."""
    return [sample["status"] for sample in output[SAMPLES]["samples"]]


def headers(output: Any) -> list[str]:
    """Each column's header line in one output."""
    return [sample["header"] for sample in output[SAMPLES]["samples"]]


def running_samples(synthetic_app: RunningApp) -> int:
    with urllib.request.urlopen(synthetic_app.health, timeout=5) as response:
        return json.loads(response.read())["running_samples"]


def wait_for(predicate: Any, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_generate_streams_n_columns(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    job = client.submit("Tell a story.", 4, 40, 0.8, 0.95, 5, api_name="/generate")
    final = job.result(timeout=60)
    outputs = job.outputs()
    assert len(outputs) >= 4, "the page gets intermediate updates, not only the end"
    streamed = [texts(o) for o in outputs if o[SAMPLES]["samples"]]
    # each column only grows
    for before, after in itertools.pairwise(streamed):
        for a, b in zip(before, after, strict=True):
            assert b.startswith(a)
    for index in range(4):
        tokens, reason = synthetic_tokens(5 + index, 40, 0.8)
        assert texts(final)[index] == "".join(tokens)
        assert statuses(final)[index] == reason and f"{len(tokens)} tok" in headers(final)[index]
    assert "finished" in final[STATUS]
    assert "Run summary" in final[SUMMARY] and "| 3 |" in final[SUMMARY]
    assert "<svg" in final[TRACE] and "loop busy" in final[TRACE] and "#3" in final[TRACE]
    # far fewer page updates than tokens: chunks are coalesced at a frame rate
    assert len(outputs) < sum(len(synthetic_tokens(5 + i, 40, 0.8)[0]) for i in range(4)) / 2


def test_cancel_stops_every_sample_in_the_engine(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    job = client.submit("Tell a long story.", 4, 1000, 0.8, 0.95, 1, api_name="/generate")
    wait_for(lambda: len(job.outputs()) >= 3)
    assert running_samples(synthetic_app) == 4
    final = client.predict(api_name="/cancel")
    for index in range(4):
        assert statuses(final)[index] == "stopped"
        assert 0 < len(texts(final)[index]) < 1000 * 4
    assert running_samples(synthetic_app) == 0
    assert statuses(job.result(timeout=15)) == statuses(final)  # Generate ends with the run drawn


def test_stop_one_column(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    job = client.submit("Tell a story.", 3, 60, 0, 0.95, 1, api_name="/generate")
    wait_for(lambda: len(job.outputs()) >= 2)
    client.predict(1, api_name="/stop_sample")
    final = job.result(timeout=30)
    assert statuses(final) == ["length", "stopped", "length"]


def test_a_cancelled_event_aborts_the_backend_request(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    job = client.submit("Tell a long story.", 2, 1000, 0.8, 0.95, 1, api_name="/generate")
    wait_for(lambda: len(job.outputs()) >= 2)
    assert running_samples(synthetic_app) == 2
    job.cancel()  # what Gradio does for cancels=[...] and for a closed tab
    wait_for(lambda: running_samples(synthetic_app) == 0, limit_s=10)


def test_backend_errors_are_shown(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    final = client.predict("   ", 4, 40, 0.8, 0.95, 5, api_name="/generate")
    assert "the prompt is empty" in final[STATUS]


def test_unreachable_backend_is_said_plainly() -> None:
    port, dead = free_port(), free_port()
    process = start_app(port, extra=["--backend-url", f"ws://127.0.0.1:{dead}/ws"])
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        final = client.predict("Hello", 2, 10, 0.8, 0.95, 5, api_name="/generate")
        assert "the backend is unreachable (connection refused)" in final[STATUS]
        assert str(dead) not in final[STATUS]  # the page does not show the backend's address
    finally:
        process.terminate()
        process.wait(15)


def start_synthetic_backend(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "backend", "--engine", "synthetic", "--port", str(port), "--rate", "20"],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )


def test_a_backend_that_dies_mid_run_is_reported_and_the_next_run_works_after_a_restart() -> None:
    backend_port, port = free_port(), free_port()
    backend = start_synthetic_backend(backend_port)
    process = start_app(port, extra=["--backend-url", f"ws://127.0.0.1:{backend_port}/ws"])
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        job = client.submit("Hello", 2, 1000, 0.8, 0.95, 5, api_name="/generate")
        wait_for(lambda: len(job.outputs()) >= 2, limit_s=30)
        backend.kill()
        backend.wait(10)
        final = job.result(timeout=30)
        assert "the backend closed the connection before the run ended" in final[STATUS]
        assert statuses(final) == ["error", "error"]
        assert texts(final)[0]  # what streamed before stays on the page

        down = client.predict("Hello", 2, 10, 0.8, 0.95, 5, api_name="/generate")
        assert "the backend is unreachable" in down[STATUS]

        backend = start_synthetic_backend(backend_port)  # the backend restarts; the page is still open
        deadline = time.monotonic() + 30
        while True:
            again = client.predict("Hello", 2, 10, 0.8, 0.95, 5, api_name="/generate")
            if "finished" in again[STATUS] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "finished" in again[STATUS]
        assert texts(again)[1] == "".join(synthetic_tokens(6, 10, 0.8)[0])
    finally:
        backend.kill()
        process.terminate()
        process.wait(15)


def test_several_people_generate_at_once(synthetic_app: RunningApp) -> None:
    clients = [Client(synthetic_app.url, verbose=False) for _ in range(3)]
    jobs = [c.submit("Hello", 2, 1000, 0.8, 0.95, i, api_name="/generate") for i, c in enumerate(clients)]
    # all three stream at the same time: none waits for another to finish
    wait_for(lambda: all(len(job.outputs()) >= 3 for job in jobs), limit_s=30)
    assert not any(job.done() for job in jobs)
    assert running_samples(synthetic_app) == 6
    for client, job in zip(clients, jobs, strict=True):
        client.predict(api_name="/cancel")
        job.result(timeout=15)
    wait_for(lambda: running_samples(synthetic_app) == 0)


def test_the_trace_of_a_run_exports_for_perfetto(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    final = client.predict("Hello", 2, 20, 0.8, 0.95, 4, "blocking", 5, "requests", api_name="/generate")
    assert "finished" in final[STATUS]
    update = client.predict(api_name="/export_trace")  # the file, downloaded, and shown in the page
    assert update["visible"] is True
    path = update["value"]
    with open(path) as handle:
        events = json.load(handle)["traceEvents"]
    kinds = {(e["ph"], e.get("cat")) for e in events}
    assert {("X", "loop"), ("i", "chunk"), ("C", None), ("M", None)} <= kinds
    assert {e["args"]["index"] for e in events if e.get("cat") == "chunk"} == {0, 1}
    # the blocking consumer shows up as loop slices of about block_ms
    consume = [e["dur"] for e in events if e["ph"] == "X" and e["name"].startswith("consume")]
    assert consume and max(consume) >= 4_000


def children_of(pid: int) -> list[int]:
    """Child process ids, from /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_the_backend_process_ends_with_the_app(signal_name: str) -> None:
    import signal as signals

    process = start_app(free_port())
    backends = [pid for pid in children_of(process.pid) if alive(pid)]
    assert backends, "app.py runs its backend in a child process"
    process.send_signal(getattr(signals, signal_name))
    process.wait(15)
    wait_for(lambda: not any(alive(pid) for pid in backends), limit_s=10)


def test_a_page_port_in_use_or_a_bad_host_is_said_in_one_line() -> None:
    # Checked before the backend or Gradio start: a clear line and exit status 2, no traceback.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            ("--port", str(port)): f"the page cannot listen on 127.0.0.1:{port} (Address already in use)",
            (
                "--host",
                "no-such-host.invalid",
            ): "'no-such-host.invalid' (--host, DASHBOARD_HOST) does not resolve",
        }
        for flags, message in cases.items():
            result = subprocess.run(
                [sys.executable, "app.py", "--engine", "synthetic", "--backend-port", "0", *flags],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 2, result.stderr
            assert message in result.stderr and "Traceback" not in result.stderr
            assert "backend" not in result.stdout  # nothing was started


def test_a_page_slow_to_answer_gradios_own_check_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Gradio's launch raises when its one 3 s request to the new page times out (a loaded machine):
    # app.py closes the server and launches it again, on the same port, a bounded number of times.
    import gradio as gr
    import gradio.networking

    import app

    checks: list[str] = []
    real_url_ok = gradio.networking.url_ok

    def slow_first(url: str) -> bool:
        checks.append(url)
        return len(checks) > 1 and real_url_ok(url)

    monkeypatch.setattr(gradio.networking, "url_ok", slow_first)
    with gr.Blocks() as demo:
        gr.Markdown("The relaunched page answers.")
    port = free_port()
    app.launch_page(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        assert len(checks) == 2 and all(f":{port}" in url for url in checks), checks
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=10) as response:
            assert b"The relaunched page answers." in response.read()  # what the page shows
    finally:
        demo.close()

    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: False)
    with pytest.raises(ValueError, match="localhost is not accessible"):
        app.launch_page(demo, attempts=2, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True)
    demo.close()


ANSWERS_CHART, ANSWERS_LINE, TREE = 4, 5, 6
EXPERIMENTS = ("cooperative", 0, "n", "chat", "")
"""consumer, block ms, fan-out, prompt format, system prompt: the defaults, before the options below."""


def test_token_confidence_parting_points_and_the_answer_vote(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    # Temperature 0: four identical samples, none parts from the others, all vote the same.
    same = client.predict(
        "Tell a story.", 4, 30, 0, 0.95, 5, *EXPERIMENTS, "delta", 0, True, r"(\w+)\.", api_name="/generate"
    )
    words, _ = synthetic_tokens(5, 30, 0)
    last = [w.strip(" .") for w in words if w.endswith(".")][-1]
    assert f"majority: `{last}`" in same[ANSWERS_LINE] or f"majority: {last}" in same[ANSWERS_LINE]
    assert "(4 of 4 answers, 100%)" in same[ANSWERS_LINE]
    chart = same[ANSWERS_CHART]
    assert [(bar["answer"], bar["votes"]) for bar in drawn_bars(chart)] == [(last, 4)], chart
    for column in same[SAMPLES]["samples"]:
        assert column["parts_at"] is None
        assert "mean logprob -" in column["header"] and "perplexity" in column["header"]
        ends = [end for end, _p in column["marks"]]
        assert ends == sorted(ends) and ends[-1] == len(column["text"])
        assert all(0 < p < 1 for _end, p in column["marks"])
    # The token tree: one branch all four took, its first token's probability with it.
    rows = value_rows(same[TREE])
    assert same[TREE]["unit"] == "token" and [row["count"] for row in rows] == [4, 4]
    assert rows[1]["samples"] == [0, 1, 2, 3] and 0 < rows[1]["p"] < 1 and rows[1]["ends"] == 4
    assert f" {rows[1]['size']} tok " in same[SAMPLES]["samples"][0]["header"]  # a token a unit
    # Temperature 0.8: each sample parts from all the others at its first word no other shares.
    varied = client.predict("Tell a story.", 4, 30, 0.8, 0.95, 5, *EXPERIMENTS, api_name="/generate")
    words = [WORD_UNITS.findall(text) for text in texts(varied)]
    for index, column in enumerate(varied[SAMPLES]["samples"]):
        shared = max(
            len(os.path.commonprefix([words[index], other]))  # noqa: RUF071 - word lists, not paths
            for other in words[:index] + words[index + 1 :]
        )
        expected = len("".join(words[index][:shared])) if shared < len(words[index]) else None
        assert column["parts_at"] == expected
        assert "marks" not in column and "logprob" not in column["header"]  # not asked for
    rows = value_rows(varied[TREE])
    assert varied[TREE]["unit"] == "word" and rows[0]["count"] == 4
    assert sum(row["count"] for row in rows if row["level"] == 1) == 4


def test_a_bad_answer_pattern_is_said_and_the_run_goes_on(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    final = client.predict(
        "Tell a story.",
        2,
        20,
        0.8,
        0.95,
        5,
        *EXPERIMENTS,
        "delta",
        0,
        False,
        "(unclosed",
        api_name="/generate",
    )
    assert "finished" in final[STATUS] and all(texts(final))
    assert 'the answer pattern "(unclosed" does not compile' in final[ANSWERS_LINE]
    assert "the vote uses the last number instead" in final[ANSWERS_LINE]


def test_cancel_after_and_cumulative_outputs_through_the_page(synthetic_app: RunningApp) -> None:
    client = Client(synthetic_app.url, verbose=False)
    cut = client.predict(
        "Tell a story.", 3, 200, 0.8, 0.95, 5, *EXPERIMENTS, "delta", 4, api_name="/generate"
    )
    assert statuses(cut) == ["stopped"] * 3 and "· cancelled." in cut[STATUS]
    for column in cut[SAMPLES]["samples"]:
        count = int(column["header"].split(" tok")[0].rsplit(" ", 1)[1])
        # Tokens that fell due while the abort was on its way still come: the engine keeps its own
        # deadlines (40 ms apart here), so a moment's stall of app or server lets several out at
        # once (3 seen on a loaded 2-core host). 12 is far below the run's 200.
        assert 4 <= count <= 12, column["header"]
    cumulative = client.predict(
        "Tell a story.", 3, 30, 0.8, 0.95, 5, *EXPERIMENTS, "cumulative", api_name="/generate"
    )
    assert texts(cumulative) == ["".join(synthetic_tokens(5 + i, 30, 0.8)[0]) for i in range(3)]
    assert "read per output" in cumulative[TRACE]
    too_late = client.predict(
        "Tell a story.", 2, 20, 0.8, 0.95, 5, *EXPERIMENTS, "delta", 500, api_name="/generate"
    )
    assert '"cancel_after" must be a whole number of tokens from 1 to 19' in too_late[STATUS]


async def test_cancel_answers_once_generate_has_drawn_the_end_of_the_run() -> None:
    """The page's Cancel: its answer (the final view) comes only after the Generate handler has
    yielded the run's end and returned, so no update of Generate can land after it and leave a
    column "streaming"; the page then cancels the (ended) Generate event."""
    import asyncio

    from tests.support.backends import synthetic_serving
    from tests.support.page_events import page as visitor
    from ui.handlers import Handlers

    async with synthetic_serving(50, 0.2) as backend:
        handlers = Handlers(backend.url)
        request = visitor()
        drawn: list[list[Any]] = []
        streaming = asyncio.Event()

        async def page() -> None:
            settings = {"prompt": "Tell a long story.", "n": 3, "max_tokens": 1000, "temperature": 0.8}
            settings.update(top_p=0.95, seed=1, consumer="cooperative", block_ms=0, fanout="n", format="chat")
            async for outputs in handlers.generate(request, **settings):
                drawn.append(outputs)
                if len(drawn) == 3:
                    streaming.set()
                await asyncio.sleep(0.3)  # a loaded Gradio, slow to send each update on

        generating = asyncio.create_task(page())
        await asyncio.wait_for(streaming.wait(), 15)
        final = await handlers.cancel(request)
        assert generating.done(), "Cancel answered while Generate could still draw"
        await generating
        for outputs in (final, drawn[-1]):
            assert [s["status"] for s in outputs[0]["samples"]] == ["stopped"] * 3
            assert "· cancelled." in outputs[1]
            # what each column shows: the text it streamed before the Cancel, words of it
            assert all(len(s["text"].split()) >= 2 for s in outputs[0]["samples"]), outputs[0]


async def test_cancel_after_the_run_ended_says_nothing_runs_once_generate_has_drawn_its_end() -> None:
    """A Cancel pressed when the run has finished but its Generate event has not yet drawn its last
    update (a loaded Gradio): it waits for that update, then says nothing is running, so the
    message is not drawn over."""
    import asyncio

    from tests.support.backends import synthetic_serving
    from tests.support.page_events import PAGE_SETTINGS, page
    from ui.handlers import NOTHING_TO_CANCEL, Handlers

    async with synthetic_serving(200, 0.2) as backend:
        handlers = Handlers(backend.url)
        request = page()
        settings = {**PAGE_SETTINGS, "prompt": "Say hi.", "format": "chat", "system": "", "max_tokens": 4}
        generate = handlers.generate(request, **settings)
        async for outputs in generate:  # up to the finished run's view, its last update not pulled
            if statuses(outputs) and set(statuses(outputs)) <= {"stop", "length"}:
                break
        assert len(statuses(outputs)) == 2 and set(statuses(outputs)) <= {"stop", "length"}, outputs
        cancel = asyncio.create_task(handlers.cancel(request))
        await asyncio.sleep(0.3)
        assert not cancel.done(), "Cancel answered while Generate could still draw"
        async for _ in generate:  # its last update, then its end
            pass
        answer = await asyncio.wait_for(cancel, 5)
        assert NOTHING_TO_CANCEL in answer[1], answer[1]

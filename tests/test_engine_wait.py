"""Generate pressed while the engine starts: the page waits for it, says so, then runs.

The app (`python app.py --backend-url`) talks to a backend in a process of its own whose engine
takes seconds to start (tests.support.slow_start), started by each test just before it presses
Generate; through gradio_client as a script would, and in chromium as a person would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from gradio_client import Client
from playwright.sync_api import Browser, expect

from backend.engines.synthetic import synthetic_tokens
from devkit.local import chromium_path, free_port, start_app, stop_process
from tests.support.slow_start import start_slow_backend
from ui.handlers import CANCELLED_WAIT

SAMPLES, STATUS = 0, 1
WAITING = "Waiting for the **synthetic** engine to start"


@pytest.fixture(scope="module")
def app() -> Iterator[dict[str, Any]]:
    """The page, and the port its backend is to listen on (nothing listens there yet)."""
    port, backend_port = free_port(), free_port()
    process = start_app(port, extra=["--backend-url", f"ws://127.0.0.1:{backend_port}/ws"])
    try:
        yield {"url": f"http://127.0.0.1:{port}/", "backend_port": backend_port}
    finally:
        stop_process(process)


@pytest.fixture
def slow_backend(app: dict[str, Any]) -> Iterator[Any]:
    """Starts the app's backend with an engine start of the given seconds (and failure)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(start_s: float, failure: str = "") -> None:
        started.append(start_slow_backend(app["backend_port"], start_s, failure))

    yield start
    for process in started:
        stop_process(process)


def health(app: dict[str, Any]) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{app['backend_port']}/health", timeout=5) as response:
        return json.loads(response.read())


def test_generate_during_the_start_waits_then_runs(app: dict[str, Any], slow_backend: Any) -> None:
    slow_backend(6)
    job = Client(app["url"], verbose=False).submit("Tell a story.", 3, 12, 0.8, 0.95, 5, api_name="/generate")
    final = job.result(timeout=60)
    statuses = [output[STATUS] for output in job.outputs()]
    waiting = [s for s in statuses if WAITING in s]
    assert len(waiting) >= 3, statuses  # about one a second, each with the time waited so far
    assert "downloading weights" in waiting[0] and "Cancel stops waiting" in waiting[0]
    seconds = [int(re.search(r"to start \((\d+) s\)", s).group(1)) for s in waiting]
    assert seconds[0] == 0 and seconds == sorted(seconds) and seconds[-1] >= 3, seconds
    assert "finished" in final[STATUS] and "Error" not in final[STATUS]
    texts = [sample["text"] for sample in final[SAMPLES]["samples"]]
    assert texts == ["".join(synthetic_tokens(5 + i, 12, 0.8)[0]) for i in range(3)]


def test_cancel_stops_the_wait_and_nothing_runs(app: dict[str, Any], slow_backend: Any) -> None:
    slow_backend(30)
    client = Client(app["url"], verbose=False)
    job = client.submit("Tell a story.", 2, 12, 0.8, 0.95, 5, api_name="/generate")
    deadline = time.monotonic() + 30
    while not any(WAITING in output[STATUS] for output in job.outputs()):
        assert time.monotonic() < deadline and not job.done(), job.outputs()
        time.sleep(0.1)
    cancelled = client.predict(api_name="/cancel")
    assert cancelled[STATUS] == CANCELLED_WAIT
    job.result(timeout=15)  # the Generate event ends: it does not go on waiting
    assert all(WAITING in o[STATUS] or o[STATUS] == CANCELLED_WAIT for o in job.outputs())
    assert health(app)["engine_state"] == "starting" and health(app)["active_requests"] == 0


def test_an_engine_that_fails_to_start_is_said_after_the_wait(app: dict[str, Any], slow_backend: Any) -> None:
    slow_backend(3, failure="the model's weights are not installed")
    job = Client(app["url"], verbose=False).submit("Tell a story.", 2, 12, 0.8, 0.95, 5, api_name="/generate")
    final = job.result(timeout=60)
    assert any(WAITING in output[STATUS] for output in job.outputs())
    assert "the synthetic engine could not start: the model's weights are not installed" in final[STATUS]


@pytest.mark.skipif(chromium_path() is None and not os.environ.get("CI"), reason="chromium is not installed")
def test_in_chromium_generate_during_the_start_shows_the_wait_then_the_columns_fill(
    browser: Browser, app: dict[str, Any], slow_backend: Any
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        slow_backend(12)
        page.goto(app["url"])
        expect(page.locator("#generate")).to_be_visible(timeout=30_000)
        expect(page.locator("#engine-info")).to_contain_text("is starting", timeout=10_000)
        status = page.locator("#status")
        page.locator("#generate").click()
        expect(status).to_contain_text("Waiting for the synthetic engine to start", timeout=10_000)
        page.locator("#cancel").click()  # Cancel stops the wait, and says so
        expect(status).to_have_text(CANCELLED_WAIT.replace("**", ""), timeout=10_000)
        page.wait_for_timeout(2_000)
        expect(status).to_have_text(CANCELLED_WAIT.replace("**", ""))  # no waiting line comes back
        page.locator("#generate").click()
        expect(status).to_contain_text("Waiting for the synthetic engine to start", timeout=10_000)
        expect(status).to_contain_text("downloading weights")
        first = status.inner_text()
        expect(status).not_to_have_text(first, timeout=5_000)  # the seconds count up
        expect(status).to_contain_text("streaming", timeout=30_000)
        for index in range(4):
            expect(page.locator(f"#sample-{index}")).not_to_have_text("", timeout=15_000)
        expect(status).to_contain_text("finished", timeout=60_000)
        words = (page.locator("#sample-0").text_content() or "").split()
        assert len(words) > 5, words
        expect(page.locator("#engine-info")).to_contain_text("Engine synthetic", timeout=10_000)
    finally:
        page.close()

"""The blocking lesson in chromium, on the embedded engine (SmolLM2-135M on this CPU): the blocking
example's stall shown live from outside the blocked loop, the columns saying why they are still, a
Cancel's wait measured and its outcome said, and the finished trace drawing the stall to scale."""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from devkit.local import free_port, start_app, stop_process
from devkit.panels import EXAMPLES as EXAMPLES_PANEL
from devkit.panels import EXPERIMENTS, open_panel
from tests.support.chromium import require_chromium
from ui.examples import EXAMPLES

require_chromium()

BLOCKING = next(e for e in EXAMPLES if e.label.startswith("Blocking the loop"))


@pytest.fixture(scope="module")
def embedded_app() -> Iterator[str]:
    """app.py on the embedded engine, once its engine is ready: the page's URL."""
    port, backend_port = free_port(), free_port()
    process = start_app(port, backend_port=backend_port, extra=["--engine", "embedded"])
    try:
        deadline = time.monotonic() + 300
        while health(backend_port)["engine_state"] == "starting":
            assert time.monotonic() < deadline, "the embedded engine did not start"
            time.sleep(0.5)
        assert health(backend_port)["engine_state"] == "ready"
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_process(process)


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.loads(response.read())


def open_ready(browser: Browser, url: str) -> Page:
    """The page at 1600 x 1000."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(url)
    expect(page.locator("#generate")).to_be_visible(timeout=60_000)
    return page


def stall_spans(page: Page, selector: str) -> list[float]:
    """The drawn stalls' lengths (ms) in the trace panel matching `selector`."""
    return [float(ms) for ms in page.locator(selector).evaluate_all("gs => gs.map(g => g.dataset.ms)")]


def figure(page: Page, name: str) -> str:
    """The trace panel's figure called `name`, as shown."""
    cell = page.locator("#trace .trace-figures div", has=page.locator("span", has_text=name))
    return cell.locator("b").inner_text()


def run_example(page: Page) -> float:
    """Click the blocking example, then Generate; when Generate was pressed (monotonic)."""
    open_panel(page, EXAMPLES_PANEL)
    page.locator("#examples").get_by_text(BLOCKING.label).click()
    expect(page.locator("#prompt textarea")).to_have_value(BLOCKING.prompt, timeout=20_000)
    page.locator("#generate").click()
    return time.monotonic()


def test_the_stall_is_shown_live_and_a_cancel_says_how_long_the_loop_took_to_read_it(
    browser: Browser, embedded_app: str
) -> None:
    page = open_ready(browser, embedded_app)
    try:
        pressed = run_example(page)
        live = page.locator("#trace .trace-stall.live")
        expect(live).to_be_visible(timeout=5_000)
        page.wait_for_function(
            "() => [...document.querySelectorAll('#trace .trace-stall.live')]"
            ".some(g => +g.dataset.ms > 1000)",
            timeout=max(1_000, 5_000 - (time.monotonic() - pressed) * 1000),
        )
        shown_after = time.monotonic() - pressed
        blocked_now = figure(page, "blocked now")
        assert float(blocked_now.split()[0]) >= 1.0, blocked_now
        status = page.locator("#status")
        expect(status).to_contain_text("The loop is blocked:")
        # The count goes on, live (the loop may run between two long steps: it starts again then).
        counts = []
        for _ in range(12):
            said = re.search(r"The loop is blocked: ([\d.]+) s since its last chunk", status.inner_text())
            counts.append(float(said.group(1)) if said else None)
            page.wait_for_timeout(250)
        assert any(a is not None and b is not None and b > a for a, b in itertools.pairwise(counts)), counts
        print(f"stall over 1 s drawn {shown_after:.1f} s after Generate; blocked now: {blocked_now}")

        page.locator("#cancel").click()
        expect(status).to_contain_text("waiting for the blocked loop to read it", timeout=5_000)
        expect(status).to_contain_text("the loop read it", timeout=60_000)
        line = status.inner_text()
        read = re.search(r"the loop read it ([\d.]+) s later \(cancel latency\): (.+?)\.", line)
        assert read, line
        assert "unknown_id" not in line and "Error" not in line, line
        outcome = read.group(2)
        assert re.fullmatch(r"it stopped \d+ samples?|the run had already finished.*", outcome), outcome
        expect(status).not_to_contain_text("streaming", timeout=30_000)
        latency = figure(page, "cancel latency")
        assert latency != "-" and abs(float(latency.split()[0]) / 1000 - float(read.group(1))) < 0.1, latency
        expect(page.locator("#trace .trace-cancel-wait")).to_have_count(1)
        print(f"cancel read {read.group(1)} s after it was pressed: {outcome}")
    finally:
        page.close()


def test_the_example_ends_by_itself_and_its_finished_trace_draws_the_stall(
    browser: Browser, embedded_app: str
) -> None:
    page = open_ready(browser, embedded_app)
    try:
        pressed = run_example(page)
        status = page.locator("#status")
        expect(status).to_contain_text("finished", timeout=60_000)
        took = time.monotonic() - pressed
        # About 15 s on an idle 2-core machine (4 x 120 chunks of 30 ms each); a bound, not a timing.
        assert took < 60, f"the example took {took:.1f} s"
        expect(page.locator("#trace .trace-stall.live")).to_have_count(0)
        longest = figure(page, "longest stall")
        longest_ms = float(longest.split()[0])
        assert longest_ms > 1000, longest
        drawn = stall_spans(page, "#trace .trace-stall")
        assert drawn and max(drawn) >= 0.8 * longest_ms, (drawn, longest)
        lag = figure(page, "lag p50 / p99 / max")
        assert "-" not in lag.split(" / ")[-1] and float(lag.split(" / ")[-1].split()[0]) > 1000, lag
        assert figure(page, "frames/s") != "-", figure(page, "frames/s")
        assert "lag ≤" in (page.locator("#trace svg").text_content() or "")
        print(f"blocking example finished {took:.1f} s after Generate; longest stall {longest}, lag {lag}")
    finally:
        page.close()


def test_greedy_stands_beside_cooperative_with_fewer_longer_steps(
    browser: Browser, embedded_app: str
) -> None:
    """The Cooperative example, then the Greedy one: the trace sets the greedy run's consumer figures
    beside the cooperative run's, measured: fewer consumer steps, each longer."""
    page = open_ready(browser, embedded_app)
    try:
        open_panel(page, EXAMPLES_PANEL)
        status = page.locator("#status")
        for label in ("Cooperative", "Greedy"):
            example = next(e for e in EXAMPLES if e.label.startswith(label))
            page.locator("#examples").get_by_text(example.label).click()
            expect(page.locator("#example-lesson textarea")).to_have_value(example.lesson, timeout=20_000)
            page.locator("#generate").click()
            expect(status).to_contain_text("streaming", timeout=30_000)
            expect(status).to_contain_text("finished", timeout=120_000)
        table = page.locator("#trace table.trace-compare")
        expect(table).to_contain_text("this run (greedy)")
        expect(table).to_contain_text("last run (cooperative)")
        rows = {
            row[0]: row[1:]
            for row in table.locator("tr").evaluate_all(
                "rows => rows.map(r => [...r.children].map(c => c.textContent))"
            )
        }
        greedy_steps, cooperative_steps = (float(cell) for cell in rows["consumer steps"])
        greedy_mean, cooperative_mean = (float(cell.split()[0]) for cell in rows["mean consumer step"])
        assert greedy_steps < cooperative_steps and greedy_mean > cooperative_mean, rows
        print(f"consumer steps greedy {greedy_steps:.0f} / cooperative {cooperative_steps:.0f}; {rows}")
    finally:
        page.close()


def test_fan_out_as_requests_draws_a_prefill_bar_per_request(browser: Browser, embedded_app: str) -> None:
    page = open_ready(browser, embedded_app)
    try:
        page.locator("#prompt textarea").fill("Name a colour.")
        box = page.locator("#max-tokens input[type=number]")
        box.fill("8")
        box.press("Enter")
        open_panel(page, EXPERIMENTS)
        page.locator("#fanout input[value=requests]").check()
        page.locator("#generate").click()
        expect(page.locator("#status")).to_contain_text("finished", timeout=120_000)
        bars = page.locator("#trace g.trace-prefill[data-sample]")
        expect(bars).to_have_count(4)
        samples = sorted(int(s) for s in bars.evaluate_all("gs => gs.map(g => g.dataset.sample)"))
        assert samples == [0, 1, 2, 3], samples
        expect(page.locator("#trace svg")).to_contain_text("4 prefills, one per request")
    finally:
        page.close()

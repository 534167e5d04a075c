"""The page on the embedded engine (SmolLM2-135M on this CPU) in chromium, from the moment it starts:
a person clicks the sheep example while the model still loads, presses Generate, and reads the
wait, then answers to the question, then the vote over them."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from devkit.local import free_port, start_app, stop_process
from devkit.panels import EXAMPLES as EXAMPLES_PANEL
from devkit.panels import SETTINGS, open_panel
from tests.support.chromium import require_chromium
from ui.examples import EXAMPLES, SHEEP

require_chromium()

ON_TOPIC = re.compile(r"\d|sheep", re.IGNORECASE)
"""An answer to the sheep question names a number or the sheep."""


@pytest.fixture(scope="module")
def embedded_app() -> Iterator[dict[str, str]]:
    """app.py on the embedded engine, as soon as its page answers (the model may still be loading)."""
    port, backend_port = free_port(), free_port()
    process = start_app(port, backend_port=backend_port, extra=["--engine", "embedded"])
    try:
        yield {"url": f"http://127.0.0.1:{port}/", "health": f"http://127.0.0.1:{backend_port}/health"}
    finally:
        stop_process(process)


def set_seed(page: Page, seed: int) -> None:
    """Type `seed` in the settings' seed box (the page's own is random), as a person would."""
    open_panel(page, SETTINGS)
    box = page.locator("#seed input")
    box.fill(str(seed))
    box.press("Enter")


def test_the_sheep_example_pressed_while_the_model_loads_waits_then_answers_and_votes(
    browser: Browser, embedded_app: dict[str, str]
) -> None:
    sheep = next(e for e in EXAMPLES if e.label.startswith("Self-consistency"))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(embedded_app["url"])
        expect(page.locator("#generate")).to_be_visible(timeout=60_000)
        open_panel(page, EXAMPLES_PANEL)
        page.locator("#examples").get_by_text(sheep.label).click()
        expect(page.locator("#prompt textarea")).to_have_value(SHEEP)
        expect(page.locator("#n input[type=number]")).to_have_value(str(sheep.n))
        # The page's seed is random, and a sample may then answer in one word ("Sammy!"): with seed 3
        # all eight answers are longer and name a number or the sheep, on int8-exact, fp32-blocks and
        # bf16-torch, also held to AVX2.
        set_seed(page, 3)
        page.locator("#generate").click()
        with urllib.request.urlopen(embedded_app["health"], timeout=10) as response:
            starting = json.loads(response.read())["engine_state"] == "starting"
        status = page.locator("#status")
        # Still starting once Generate was pressed: the page waits, and says so. (A model that loads
        # faster than the page answers, or ready between a look and the click, leaves nothing to wait for.)
        if starting:
            expect(status).to_contain_text("Waiting for the embedded engine to start", timeout=10_000)
        expect(status).to_contain_text("streaming", timeout=300_000)
        expect(status).to_contain_text("finished", timeout=300_000)
        texts = [page.locator(f"#sample-{i}").text_content() or "" for i in range(sheep.n)]
        assert all(len(text.split()) > 1 for text in texts), texts
        on_topic = [text for text in texts if ON_TOPIC.search(text)]
        assert len(on_topic) >= sheep.n - 1, texts
        expect(page.locator("#answers-line")).to_contain_text(f"of {sheep.n} samples finished")
        bars = page.locator("#answers-chart path[aria-roledescription=bar]")
        expect(bars.first).to_be_visible(timeout=10_000)
        heights = bars.evaluate_all("paths => paths.map(p => p.getBoundingClientRect().height)")
        assert heights and all(height > 0 for height in heights), heights
    finally:
        page.close()


def test_a_branch_continued_on_the_model_reuses_the_branchs_cache_and_says_so(
    browser: Browser, embedded_app: dict[str, str]
) -> None:
    """Generate on the model, click a sample's branch of the tree, Continue from here: four new
    columns go on from that sample's text (shown above them) in the chat template, and the run
    summary says the engine reused that text from its cache and computed little of the prompt."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(embedded_app["url"])
        expect(page.locator("#generate")).to_be_visible(timeout=60_000)
        page.locator("#prompt textarea").fill("Write one sentence about a lighthouse keeper.")
        box = page.locator("#max-tokens input[type=number]")
        box.fill("24")
        box.press("Enter")
        # The page's seed is random; the figures below were read with this one (with a random seed a
        # run once reused 39 of 60 prompt tokens: the cache is kept only as far as the branch's text,
        # tokenized again, matches the tokens drawn).
        set_seed(page, 33)
        page.locator("#generate").click()
        status = page.locator("#status")
        expect(status).to_contain_text("finished", timeout=300_000)
        summary = page.locator("#summary")
        expect(summary).to_contain_text("Prefix cache:")
        first = summary.inner_text()
        fresh = re.search(r"prompt (\d+) tokens: (\d+) reused from the engine's cache, (\d+) computed", first)
        assert fresh, first
        # The deepest branch one sample alone took: its text is that sample's whole answer.
        leaf = page.locator(
            "#sample-tree button.tree-node", has=page.locator(".tree-count", has_text="1")
        ).first
        sample = int(leaf.get_attribute("data-samples"))
        text = page.locator(f"#sample-{sample}").text_content() or ""
        assert len(text.split()) > 3, text
        leaf.click()
        page.locator("#tree-continue").click()
        expect(status).to_contain_text("Continuing from a branch", timeout=30_000)
        expect(status).to_contain_text("finished", timeout=300_000)
        for index in range(4):
            expect(page.locator(f"#prefix-{index}")).to_have_text(
                text[-160:] if len(text) <= 160 else "…" + text[-160:]
            )
        continued = summary.inner_text()
        found = re.search(
            r"prompt (\d+) tokens: (\d+) reused from the engine's cache, (\d+) computed", continued
        )
        assert found, continued
        prompt, reused, computed = map(int, found.groups())
        assert prompt > int(fresh.group(1)) + 3  # the prompt and the sample's text
        assert reused > int(fresh.group(2)) and computed <= 3, continued  # the sample's text was kept
    finally:
        page.close()


def test_stop_when_decided_ends_the_run_early_and_says_what_it_saved(
    browser: Browser, embedded_app: dict[str, str]
) -> None:
    """The "Stop when decided" example on the model (seed 33): once the leading answer can no
    longer lose, the samples still running stop in the engine; the answers panel marks the moment
    and the rule, those columns read "stopped by the vote", and the summary says what it saved."""
    decided = next(e for e in EXAMPLES if e.label.startswith("Stop when decided"))
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(embedded_app["url"])
        expect(page.locator("#generate")).to_be_visible(timeout=60_000)
        open_panel(page, EXAMPLES_PANEL)
        page.locator("#examples").get_by_text(decided.label).click()
        expect(page.locator("#prompt textarea")).to_have_value(decided.prompt, timeout=20_000)
        set_seed(page, 33)
        page.locator("#generate").click()
        status = page.locator("#status")
        expect(status).to_contain_text("finished", timeout=300_000)
        line = page.locator("#answers-line")
        expect(line).to_contain_text(
            "Stopped when decided: decided on '7' by the leading answer can no longer lose"
        )
        stopped = [
            i
            for i in range(decided.n)
            if "stopped by the vote" in (page.locator(f"#column-{i}").inner_text())
        ]
        assert len(stopped) >= 2, stopped
        expect(page.locator("#summary")).to_contain_text(
            f"Stopped when decided: {len(stopped)} samples stopped early"
        )
    finally:
        page.close()


def test_the_first_run_on_the_model_has_no_vote_and_its_link_gives_the_same_samples(
    browser: Browser, embedded_app: dict[str, str]
) -> None:
    """The page's own prompt on the model at 1366 x 768: the engine line one line, what auto chose
    one click away; the stories (seed 10) get no vote; Copy link, opened in a new page, runs the same four
    texts and says the engine is batch-invariant."""
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=embedded_app["url"].rstrip("/"))
    page = context.new_page()
    try:
        page.goto(embedded_app["url"])
        engine = page.locator("#engine-info")
        expect(engine).to_contain_text("Engine embedded", timeout=300_000)
        expect(engine).to_contain_text("SmolLM2-135M-Instruct")
        height = engine.bounding_box()["height"]  # type: ignore[index]
        assert height < 1.6 * engine.evaluate(
            "e => parseFloat(getComputedStyle(e.querySelector('p')).lineHeight)"
        )
        page.locator("#engine-why summary").click()
        expect(page.locator("#engine-why")).to_contain_text("timed")
        # The page's seed is random, and one sentence in a few names a number ("juggled 21 balls"):
        # two of four would make a vote. Seed 10's four sentences name none on int8-exact,
        # fp32-blocks and bf16-torch (read with the engine on this prompt, 128 tokens).
        set_seed(page, 10)
        page.locator("#generate").click()
        status = page.locator("#status")
        expect(status).to_contain_text("finished", timeout=300_000)
        assert "embedded" not in status.inner_text()  # the request line does not repeat the engine
        expect(page.locator("#answers-line")).to_contain_text("Free text")
        expect(page.locator("#answers-chart svg")).to_have_count(0)
        shown = [page.locator(f"#sample-{i}").text_content() for i in range(4)]
        page.locator("#copy-link").click()
        link_box = page.locator("#run-link textarea, #run-link input").first
        expect(link_box).to_have_value(re.compile(r"^http://127\.0\.0\.1:\d+/\?prompt="), timeout=10_000)
        again = context.new_page()
        again.goto(link_box.input_value())
        expect(again.locator("#status")).to_contain_text("finished", timeout=300_000)
        expect(again.locator("#status")).to_contain_text("is batch-invariant, so these are the same samples")
        assert [again.locator(f"#sample-{i}").text_content() for i in range(4)] == shown
    finally:
        context.close()


def test_the_token_confidence_example_gets_colours_from_most_samples(
    browser: Browser, embedded_app: dict[str, str]
) -> None:
    """The token-confidence example on the model: most samples name a colour, so the panel votes,
    and each column's first word, the colour, is a coloured token with its probability."""
    example = next(e for e in EXAMPLES if e.label.startswith("Token confidence"))
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(embedded_app["url"])
        expect(page.locator("#engine-info")).to_contain_text("Engine embedded", timeout=300_000)
        open_panel(page, EXAMPLES_PANEL)
        page.locator("#examples").get_by_text(example.label).click()
        expect(page.locator("#prompt textarea")).to_have_value(example.prompt)
        page.locator("#generate").click()
        expect(page.locator("#status")).to_contain_text("finished", timeout=300_000)
        line = page.locator("#answers-line")
        expect(line).to_contain_text(f"of {example.n} samples finished")
        assert "majority" in line.inner_text() or "tie between" in line.inner_text()
        expect(page.locator("#sample-0 .tok").first).to_have_attribute("title", re.compile(r"^p = "))
    finally:
        page.close()

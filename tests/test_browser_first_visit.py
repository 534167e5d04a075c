"""What a first-time visitor meets, in headless chromium at 1440 x 900, 1366 x 768 and 390 x 844
(the synthetic engine, batch-invariant like the embedded one): a one-line engine line with what it
runs one click away; no vote on the page's own free-text prompt; the run summary within the
viewport; a copied link that, opened, runs the same samples and says so; a malformed link's
message; Ctrl+Enter and Escape; and the rough edges: an input error keeps the run, a random seed
that Keep this seed fixes, Continue said while the run streams, Cancel with nothing running, the
panels and the trace's text on a phone, the sliders' labels at 1366 px, a column continuation's
words and the tree's units after it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from devkit.panels import SETTINGS, open_panel
from tests.support.backends import RunningApp
from tests.support.chromium import require_chromium
from ui.handlers import NOTHING_TO_CANCEL
from ui.run_link import AUTO_RUN_PROMPT_CHARS

require_chromium()

APP_RATE = 40.0
"""Tokens/s per sample: a 60-token run streams for about a second and a half."""

SIZES = [(1440, 900), (1366, 768), (390, 844)]
IDS = ["1440x900", "1366x768", "390x844"]


@pytest.fixture
def context(browser: Browser, synthetic_app: RunningApp) -> Iterator[BrowserContext]:
    """A browser context whose pages may use the clipboard (Copy link writes to it)."""
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=synthetic_app.url.rstrip("/"))
    yield context
    context.close()


def opened(context: BrowserContext, url: str, size: tuple[int, int] = (1366, 768)) -> Page:
    page = context.new_page()
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.goto(url)
    expect(page.locator("#engine-info")).to_contain_text("Engine synthetic", timeout=30_000)
    return page


def texts(page: Page, n: int) -> list[str]:
    return [page.locator(f"#sample-{i}").evaluate("e => e.textContent") for i in range(n)]


def finished(page: Page, timeout: float = 30_000) -> None:
    expect(page.locator("#status")).to_contain_text("finished", timeout=timeout)


def line_height(page: Page, selector: str) -> float:
    return page.locator(selector).evaluate(
        "e => { const s = getComputedStyle(e.querySelector('p') || e);"
        " return parseFloat(s.lineHeight) || 1.5 * parseFloat(s.fontSize); }"
    )


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_the_first_screen_the_vote_and_the_summary_at_each_size(
    context: BrowserContext, synthetic_app: RunningApp, size: tuple[int, int]
) -> None:
    """The engine line: one line on a laptop, two at most on a phone, what it runs one click away
    (closed); Generate on the page's own prompt: no vote (free text, the example with answers
    offered), the request line without the engine, the summary's every figure inside the viewport."""
    page = opened(context, synthetic_app.url, size)
    try:
        engine = page.locator("#engine-info")
        lines = engine.bounding_box()["height"] / line_height(page, "#engine-info")  # type: ignore[index]
        assert lines < (1.6 if size[0] > 640 else 2.6), lines
        how = page.locator("#engine-why")
        expect(how).to_have_count(1)
        assert not how.evaluate("e => e.open")
        assert how.bounding_box()["y"] < page.locator("#prompt").bounding_box()["y"]  # type: ignore[index]
        page.locator("#generate").click()
        finished(page)
        status = page.locator("#status").inner_text()
        assert "seed" in status and "engine" not in status.lower().split("prompt format")[0], status
        answers = page.locator("#answers-line")
        expect(answers).to_contain_text("Free text")
        assert "majority" not in answers.inner_text()
        expect(page.locator("#answers-chart svg")).to_have_count(0)
        expect(page.locator("#answers-example")).to_be_visible()
        width = size[0]
        edges = page.locator("#summary td, #summary th:visible").evaluate_all(
            "cells => cells.map(c => c.getBoundingClientRect().right)"
        )
        assert edges and max(edges) <= width, (max(edges), width)
        summary = page.locator("#summary table")
        assert summary.evaluate("t => t.scrollWidth <= t.clientWidth + 1")
        page.locator("#answers-example").click()
        expect(page.locator("#prompt textarea")).to_have_value(
            "A farmer has 17 sheep. All but 9 run away. How many sheep are left? Answer with a number."
        )
    finally:
        page.close()


def test_a_copied_link_opened_in_a_new_page_runs_the_same_samples_and_says_so(
    context: BrowserContext, synthetic_app: RunningApp
) -> None:
    page = opened(context, synthetic_app.url)
    try:
        page.locator("#prompt textarea").fill("Tell me about rivers.")
        for elem_id, value in (("n", 3), ("max-tokens", 30)):
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.locator("#generate").click()
        finished(page)
        seed = page.locator("#status strong").first.inner_text()
        shown = texts(page, 3)
        page.locator("#copy-link").click()
        link_box = page.locator("#run-link textarea, #run-link input").first
        expect(link_box).to_have_value(
            re.compile(f"^{re.escape(synthetic_app.url)}\\?.*seed={seed}$"), timeout=10_000
        )
        link = link_box.input_value()
        assert page.evaluate("navigator.clipboard.readText()") == link
        assert "n=3" in link and "max_tokens=30" in link and "prompt=Tell+me+about+rivers." in link
        again = opened(context, link)
        try:
            finished(again)
            expect(again.locator("#status")).to_contain_text("Opened from a link")
            expect(again.locator("#status")).to_contain_text("batch-invariant, so these are the same samples")
            assert texts(again, 3) == shown
            expect(again.locator("#prompt textarea")).to_have_value("Tell me about rivers.")
            expect(again.locator("#n input[type=number]")).to_have_value("3")
        finally:
            again.close()
    finally:
        page.close()


def test_a_malformed_link_opens_the_defaults_and_names_what_it_ignored(
    context: BrowserContext, synthetic_app: RunningApp
) -> None:
    page = opened(context, synthetic_app.url + "?prompt=Hello&n=2.5&temperature=9&max_tokens=99999&x=1")
    try:
        status = page.locator("#status")
        expect(status).to_contain_text("This link's values were ignored", timeout=15_000)
        for words in ("n '2.5'", "temperature '9'", "max_tokens '99999'", "'x' is not a setting"):
            expect(status).to_contain_text(words)
        expect(status).to_contain_text("press Generate to run it")
        expect(page.locator("#prompt textarea")).to_have_value("Hello")
        expect(page.locator("#n input[type=number]")).to_have_value("4")  # the page's default
        expect(page.locator("#column-0")).to_have_count(0)  # not run
    finally:
        page.close()
    long = "word " * (AUTO_RUN_PROMPT_CHARS // 5 + 10)
    page = opened(context, f"{synthetic_app.url}?prompt={long.strip().replace(' ', '+')}&n=2")
    try:
        expect(page.locator("#status")).to_contain_text("it is shown, not run", timeout=15_000)
        expect(page.locator("#column-0")).to_have_count(0)
        page.locator("#generate").click()
        finished(page)
        expect(page.locator("#column-1")).to_be_visible()
    finally:
        page.close()


def test_ctrl_enter_generates_escape_cancels_and_the_buttons_say_so(
    context: BrowserContext, synthetic_app: RunningApp
) -> None:
    page = opened(context, synthetic_app.url)
    try:
        expect(page.locator("#generate")).to_have_attribute(
            "title", re.compile(r"Ctrl\+Enter"), timeout=5_000
        )
        expect(page.locator("#cancel")).to_have_attribute("title", re.compile("Escape"))
        box = page.locator("#max-tokens input[type=number]")
        box.fill("1000")
        box.press("Enter")
        page.locator("#prompt textarea").press("Control+Enter")
        expect(page.locator("#status")).to_contain_text("streaming", timeout=15_000)
        expect(page.locator("#sample-0")).not_to_have_text("", timeout=15_000)
        page.keyboard.press("Escape")
        expect(page.locator("#status")).to_contain_text("cancelled", timeout=15_000)
        expect(page.locator("#header-0")).to_contain_text("stopped")
        # Cancel with nothing running says so, and the run stays on the page.
        page.locator("#cancel").click()
        expect(page.locator("#status")).to_contain_text(NOTHING_TO_CANCEL, timeout=10_000)
        expect(page.locator("#status")).to_contain_text("cancelled")
        expect(page.locator("#column-0")).to_be_visible()
    finally:
        page.close()


def test_the_rough_edges_of_a_run(context: BrowserContext, synthetic_app: RunningApp) -> None:
    """A random seed each run, kept with one click (the same samples again); an input error keeps
    the run on the page; Continue from here says why not while the run streams."""
    page = opened(context, synthetic_app.url)
    try:
        page.locator("#generate").click()
        finished(page)
        first_seed = page.locator("#status strong").first.inner_text()
        first = texts(page, 4)
        page.locator("#generate").click()
        expect(page.locator("#status strong").first).not_to_have_text(first_seed, timeout=15_000)
        finished(page)
        second_seed = page.locator("#status strong").first.inner_text()
        assert texts(page, 4) != first
        # Keep this seed: the seed box gets the run's seed, and Generate repeats its samples.
        kept = texts(page, 4)
        page.locator("#keep-seed").click()
        open_panel(page, SETTINGS)
        expect(page.locator("#seed input")).to_have_value(second_seed, timeout=10_000)
        page.locator("#generate").click()
        expect(page.locator("#status")).to_contain_text("streaming", timeout=15_000)
        finished(page)
        assert texts(page, 4) == kept
        # An input error (an empty prompt) is said; the run stays.
        page.locator("#prompt textarea").fill("   ")
        page.locator("#generate").click()
        expect(page.locator("#status")).to_contain_text("the prompt is empty", timeout=15_000)
        assert texts(page, 4) == kept
        expect(page.locator("#sample-tree button.tree-node").first).to_be_visible()
        expect(page.locator("#summary")).to_contain_text("Run summary")
        # While a run streams, Continue from here says why not, disabled; once finished it is offered.
        page.locator("#prompt textarea").fill("Tell me a long story.")
        box = page.locator("#max-tokens input[type=number]")
        box.fill("2000")  # streams for minutes: still streaming when the column is clicked
        box.press("Enter")
        page.locator("#generate").click()
        # Until the new run's first update the columns still hold the kept run, finished, which
        # Continue from here may continue: the click waits for the new run.
        expect(page.locator("#status")).to_contain_text("streaming", timeout=15_000)
        expect(page.locator("#sample-0")).not_to_have_text("", timeout=15_000)
        page.locator("#sample-0").click(position={"x": 6, "y": 6})  # its first word, whatever its length
        offer = page.locator("#column-continue")
        expect(offer).to_be_disabled()
        expect(offer).to_have_text("Continue: once the run has finished")
        assert "still streaming" in (offer.get_attribute("title") or "")
        page.locator("#cancel").click()
        expect(page.locator("#status")).to_contain_text("cancelled", timeout=15_000)
        expect(page.locator("#column-continue")).to_be_enabled()  # the same button, offered now
        expect(page.locator("#column-continue")).to_have_text("Continue from here ▸")
    finally:
        page.close()


def test_at_1366_no_slider_label_is_cut_and_at_390_no_trace_or_chart_text_is_under_10_px(
    context: BrowserContext, synthetic_app: RunningApp
) -> None:
    page = opened(context, synthetic_app.url, (1366, 768))
    try:
        labels: list[Any] = page.locator("#n span, #max-tokens span, #temperature span").evaluate_all(
            "spans => spans.filter(s => /min_value|max_value/.test(s.className)).map(s => {"
            " const r = s.getBoundingClientRect(); const block = s.closest('.block').getBoundingClientRect();"
            " return [s.textContent, s.scrollWidth <= s.clientWidth + 1, r.right <= block.right + 0.5]; })"
        )
        assert len(labels) == 4 and all(whole and inside for _, whole, inside in labels), labels
    finally:
        page.close()
    page = opened(context, synthetic_app.url, (390, 844))
    try:
        page.locator("#prompt textarea").fill("Say 1, 2 or 3.")
        open_panel(page, "why-n")
        page.locator("#answer-pattern textarea").fill(r"(\w+)\.")
        page.locator("#generate").click()
        finished(page)
        expect(page.locator("#answers-chart svg")).to_have_count(1)
        sizes = page.evaluate(
            """() => [...document.querySelectorAll('#trace svg text, #answers-chart svg text')].map(t => {
                const svg = t.ownerSVGElement;
                const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
                return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * scale];
            })"""
        )
        assert len(sizes) > 10
        small = [(text, size) for text, size in sizes if size < 10]
        assert not small, small
        figures = page.locator("#trace .trace-figures div").evaluate_all(
            "rows => rows.map(r => [r.children[0].getBoundingClientRect().right,"
            " r.children[1].getBoundingClientRect().left])"
        )
        assert all(label <= value for label, value in figures), figures  # no label runs into its value
    finally:
        page.close()


def test_a_column_continuation_shows_its_words_and_earlier_sizes_keep_their_unit(
    context: BrowserContext, synthetic_app: RunningApp
) -> None:
    """A run with token confidence (sizes in tokens), then a column continued from its third token
    without it (a tree of words): one prompt row, a row of the words the new run goes on from, and
    the earlier run's rows still in tokens."""
    page = opened(context, synthetic_app.url, (1440, 900))
    try:
        open_panel(page, "why-n")
        page.locator("#logprobs input[type=checkbox]").check()
        page.locator("#prompt textarea").fill("Tell me about rivers.")
        for elem_id, value in (("n", 2), ("max-tokens", 12)):
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.locator("#generate").click()
        finished(page)
        earlier_sizes = page.locator("#sample-tree .tree-size:visible").all_inner_texts()
        assert earlier_sizes and all(size.endswith(" tok") for size in earlier_sizes), earlier_sizes
        page.locator("#logprobs input[type=checkbox]").uncheck()
        third = page.locator("#sample-0 .tok").nth(2)
        words = page.locator("#sample-0 .tok").evaluate_all(
            "spans => spans.slice(0, 3).map(s => s.textContent).join('')"
        )
        third.click()
        page.locator("#column-continue").click()
        expect(page.locator("#status")).to_contain_text("Continuing from a branch", timeout=15_000)
        finished(page)
        nodes = page.locator("#sample-tree button.tree-node")
        texts_shown = nodes.locator(".tree-text").all_inner_texts()
        assert texts_shown.count("prompt") == 1, texts_shown
        assert f"+ {words}" in texts_shown, (words, texts_shown)
        dimmed = page.locator("#sample-tree button.tree-node.earlier .tree-size:visible").all_inner_texts()
        assert dimmed and all(size.endswith(" tok") for size in dimmed), dimmed
        mine = page.locator(
            "#sample-tree button.tree-node:not(.earlier) .tree-size:visible"
        ).all_inner_texts()
        assert mine and all(size.endswith(" ch") for size in mine), mine
    finally:
        page.close()

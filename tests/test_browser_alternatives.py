"""Alternatives at a token, in chromium on the embedded engine, as a person uses them: generate with
token confidence on, click a token of a column, read the alternatives and their percentages, pick
one, and see n new columns start with it and the token tree grow from that token, the token marked
as chosen by hand."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from devkit.local import free_port, start_app, stop_process
from devkit.panels import SETTINGS, WHY_N, open_panel
from tests.support.chromium import require_chromium

require_chromium()


@pytest.fixture(scope="module")
def embedded_app() -> Iterator[str]:
    """app.py on the embedded engine; its page's URL."""
    port, backend_port = free_port(), free_port()
    process = start_app(port, backend_port=backend_port, extra=["--engine", "embedded"])
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_process(process)


def test_a_tokens_alternative_picked_starts_n_columns_with_it(browser: Browser, embedded_app: str) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    try:
        page.goto(embedded_app)
        expect(page.locator("#generate")).to_be_visible(timeout=60_000)
        page.locator("#prompt textarea").fill("Give me a name for a small bakery.")
        box = page.locator("#max-tokens input[type=number]")
        box.fill("12")
        box.press("Enter")
        open_panel(page, SETTINGS)
        seed = page.locator("#seed input")
        seed.fill("33")
        seed.press("Enter")
        open_panel(page, WHY_N)
        page.locator("#logprobs input").check()
        page.locator("#generate").click()
        status = page.locator("#status")
        expect(status).to_contain_text("finished", timeout=300_000)
        # The second token of the first column: its alternatives, the drawn one marked.
        token = page.locator("#sample-0 .tok[data-alts]").nth(1)
        before = page.locator("#sample-0").evaluate(
            "(el, tok) => el.textContent.slice(0, Number(tok.dataset.start))", token.element_handle()
        )
        token.click()
        popup = page.locator("#token-alternatives")
        expect(popup).to_be_visible()
        rows = popup.locator(".alt-row")
        expect(rows).to_have_count(5)
        percentages = [rows.nth(i).locator(".alt-pct").inner_text() for i in range(5)]
        assert all(re.fullmatch(r"\d+\.\d %", p) for p in percentages), percentages
        values = [float(p.split()[0]) for p in percentages]
        assert values == sorted(values, reverse=True) and 0 < sum(values) <= 100.05, values
        drawn = popup.locator(".alt-row.drawn")
        if drawn.count():
            assert token.inner_text().startswith(drawn.get_attribute("data-token") or "\0")
        # Pick one that was not drawn: a new run of n columns starts with it.
        other = popup.locator(".alt-row:not(.drawn)").first
        chosen = other.get_attribute("data-token") or ""
        assert chosen
        other.click()
        expect(status).to_contain_text("Continuing from a branch", timeout=30_000)
        expect(status).to_contain_text("finished", timeout=300_000)
        expected = before + chosen
        shown = expected if len(expected) <= 160 else "…" + expected[-160:]
        for index in range(4):
            expect(page.locator(f"#prefix-{index}")).to_have_text(shown)
            assert (page.locator(f"#sample-{index}").text_content() or "").strip()
        # The tree grows the new run from that token, marked as chosen by hand.
        expect(page.locator("#sample-tree")).to_contain_text("chosen by hand")
        expect(page.locator("#sample-tree .tree-node", has_text="chosen by hand")).to_contain_text(
            chosen.strip()
        )
        # A node of the new run: its first token's alternatives, under it.
        node = page.locator(
            "#sample-tree button.tree-node:not(.earlier)", has=page.locator(".tree-p:visible")
        )
        node.first.click()
        expect(page.locator("#tree-alternatives .alt-row")).to_have_count(5)
        expect(page.locator("#tree-alternatives")).to_contain_text("%")
    finally:
        page.close()


def test_a_run_on_an_engine_without_alternatives_says_so(page: Page) -> None:
    """The synthetic engine gives token confidence but no alternatives: a token's popup, and a tree
    node's, say so instead of an empty list."""
    open_panel(page, WHY_N)
    page.locator("#logprobs input[type=checkbox]").check()
    page.locator("#prompt textarea").fill("Tell me about lighthouses.")
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    page.locator("#sample-0 .tok").nth(2).click()
    expect(page.locator("#token-alternatives")).to_have_text("this engine gives no alternatives")
    page.locator("#sample-tree button.tree-node", has=page.locator(".tree-p:visible")).first.click()
    expect(page.locator("#tree-alternatives")).to_have_text("this engine gives no alternatives")

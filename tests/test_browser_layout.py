"""The page's layout in headless chromium at a laptop's, a small laptop's and a phone's size: Generate
in view where the page opens, and once it is pressed the show (the first row of columns, the loop
trace beside them) in view while the run streams, with nothing scrolled; the settings, examples,
lessons and experiments one click away."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.backends import RunningApp
from tests.support.chromium import require_chromium

require_chromium()

APP_RATE = 8.0
"""Tokens/s per sample: a run streams on while the page is measured."""

PANELS = {
    "settings": "#temperature",
    "examples-panel": "#examples",
    "why-n": "#logprobs",
    "experiments": "#consumer",
}
"""Each closed panel of the controls, and a control it holds."""

CONTROLS = ("#prompt", "#n", "#generate", "#cancel")
"""What a person needs in reach to run and stop: the prompt, n, Generate and Cancel."""


def box(page: Page, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not laid out"
    return found


def in_view(page: Page, selector: str) -> bool:
    """Whether the element's whole box is inside the viewport."""
    viewport: Any = page.viewport_size
    b = box(page, selector)
    return (
        b["x"] >= 0
        and b["y"] >= 0
        and b["x"] + b["width"] <= viewport["width"] + 0.5
        and b["y"] + b["height"] <= viewport["height"] + 0.5
    )


def open_at(browser: Browser, app: RunningApp, width: int, height: int) -> Page:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(app.url)
    expect(page.locator("#generate")).to_be_visible(timeout=30_000)
    # The page as a person meets it: loaded, the engine line read from the backend.
    expect(page.locator("#engine-info")).to_contain_text("Engine synthetic", timeout=30_000)
    return page


def press_generate_where_the_page_opens(page: Page) -> None:
    """Generate, where it is when the page opens (in view, nothing scrolled), pressed; the run's
    four columns then stream (long enough to be measured, and cancelled, while they do)."""
    box_max = page.locator("#max-tokens input[type=number]")
    box_max.fill("1000")
    box_max.press("Enter")
    assert in_view(page, "#generate"), box(page, "#generate")
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("streaming", timeout=15_000)
    for index in range(4):
        expect(page.locator(f"#sample-{index}")).not_to_have_text("", timeout=15_000)
    expect(page.locator("#trace svg")).to_be_visible(timeout=10_000)
    assert page.evaluate("[window.scrollX, window.scrollY]") == [0, 0]


@pytest.mark.parametrize("size", [(1440, 900), (1366, 768)], ids=["1440x900", "1366x768"])
def test_on_a_laptop_the_columns_and_the_trace_are_in_view_as_the_run_streams(
    browser: Browser, synthetic_app: RunningApp, size: tuple[int, int]
) -> None:
    page = open_at(browser, synthetic_app, *size)
    try:
        for selector in CONTROLS:
            assert in_view(page, selector), (selector, box(page, selector))
        press_generate_where_the_page_opens(page)
        expect(page.locator("#status")).to_contain_text("streaming")  # still streaming as measured
        # The first row of columns: every column level with the first one, each whole in view.
        first = box(page, "#column-0")
        row = [i for i in range(4) if abs(box(page, f"#column-{i}")["y"] - first["y"]) < 1]
        assert len(row) >= 2, [box(page, f"#column-{i}") for i in range(4)]
        for index in row:
            assert in_view(page, f"#column-{index}"), (index, box(page, f"#column-{index}"))
        # The loop trace beside them, its drawing whole in view, level with the columns.
        assert in_view(page, "#trace svg"), box(page, "#trace svg")
        trace = box(page, "#trace svg")
        assert trace["x"] >= first["x"] + first["width"], (trace, first)
        assert trace["y"] < first["y"] + first["height"], (trace, first)
        # Still in reach while it streams: the prompt, n, Generate and Cancel.
        for selector in CONTROLS:
            assert in_view(page, selector), (selector, box(page, selector))
        # The rest one click away: each panel's header in view, and one click shows what it holds.
        for panel, control in PANELS.items():
            assert in_view(page, f"#{panel}"), (panel, box(page, f"#{panel}"))
            expect(page.locator(control)).to_be_hidden()
            page.locator(f"#{panel} > button.label-wrap").click()
            expect(page.locator(control)).to_be_visible()
            page.locator(f"#{panel} > button.label-wrap").click()
        page.locator("#cancel").click()
        expect(page.locator("#status")).to_contain_text("cancelled", timeout=15_000)
    finally:
        page.close()


def test_on_a_phone_the_panels_are_one_tap_away_and_the_columns_follow(
    browser: Browser, synthetic_app: RunningApp
) -> None:
    """390 px wide everything is one column: the prompt, n, Generate and Cancel, the closed panels
    two a row (each one tap, in the first screen), then the status line and the sample columns, the
    first column's header in view; the trace after the columns."""
    page = open_at(browser, synthetic_app, 390, 844)
    try:
        for selector in CONTROLS:
            assert in_view(page, selector), (selector, box(page, selector))
        for panel in PANELS:
            assert in_view(page, f"#{panel}"), (panel, box(page, f"#{panel}"))
        press_generate_where_the_page_opens(page)
        buttons = max(box(page, s)["y"] + box(page, s)["height"] for s in ("#generate", "#cancel"))
        panels = max(box(page, f"#{panel}")["y"] + box(page, f"#{panel}")["height"] for panel in PANELS)
        column = box(page, "#column-0")
        assert column["y"] >= panels >= buttons, (column, panels, buttons)
        # The first column starts in view: its header and its first line.
        assert column["y"] + 40 <= 844, column
        expect(page.locator("#header-0")).to_be_in_viewport()
        # Between the panels and the columns: the status line and the run's tools.
        status = box(page, "#status")
        assert panels <= status["y"] and status["y"] + status["height"] <= column["y"], (status, column)
        last_column = box(page, "#column-3")
        assert box(page, "#trace")["y"] >= last_column["y"] + last_column["height"]
        # Each panel opens with one tap, across the page's width.
        for panel, control in PANELS.items():
            page.locator(f"#{panel} > button.label-wrap").click()
            expect(page.locator(control)).to_be_visible()
            assert box(page, f"#{panel}")["width"] > 300, panel
            page.locator(f"#{panel} > button.label-wrap").click()
        page.locator("#cancel").click()
        expect(page.locator("#status")).to_contain_text("cancelled", timeout=15_000)
    finally:
        page.close()

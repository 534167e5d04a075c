"""The page's closed panels (Gradio accordions) opened in chromium, as a person opens them: one click
on the panel's header."""

from __future__ import annotations

from playwright.sync_api import Page

SETTINGS = "settings"
EXAMPLES = "examples-panel"
WHY_N = "why-n"
EXPERIMENTS = "experiments"
"""The panels' element ids: the prompt's format and the sampling settings; the examples; token
confidence and the answer pattern; the event-loop experiments."""

SETTLED_MS = 500
"""How long an opened panel's controls take to settle: Gradio mounts a closed panel's controls when
it first opens and sets their values then, so a value typed in the first moments was seen to be
replaced by the control's initial one (a person cannot type that fast)."""


def open_panel(page: Page, elem_id: str) -> None:
    """Open the panel `elem_id` with a click on its header, unless it is open already, and let its
    controls settle."""
    header = page.locator(f"#{elem_id} > button.label-wrap")
    if "open" not in (header.get_attribute("class") or "").split():
        header.click()
        page.wait_for_timeout(SETTLED_MS)

"""Take a screenshot of the dashboard with a run on it: `python -m scripts.screenshot [OUT.png]`.

Starts `app.py` on free ports replaying the shipped SGLang run `docs/runs/lighthouse-sglang-cpu.json`
(n = 4 samples of SmolLM2-135M-Instruct with their logprobs, at their recorded pace), drives
Debian's chromium with Playwright (token confidence on, Generate), and saves the page once the
samples have streamed their text: coloured tokens, where each sample parts from the others, the
token tree, the trace with its task tree.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent

from devkit.local import CHROMIUM_ARGS, chromium_path, free_port, start_app  # noqa: E402


def main(out: str = "docs/screenshot.png") -> int:
    """Save a screenshot of the replayed run to `out`."""
    port = free_port()
    run = ROOT / "docs" / "runs" / "lighthouse-sglang-cpu.json"
    app = start_app(port, extra=["--engine", "replay", "--run", str(run)])
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            # Tall enough for the whole page: blocks of text off screen are not painted
            # (content-visibility), so a full-page capture of a shorter viewport leaves them blank.
            page = browser.new_page(viewport={"width": 1440, "height": 2300})
            page.goto(f"http://127.0.0.1:{port}/")
            why_n = page.get_by_role("button", name="Why sample n times")
            why_n.click()
            page.locator("#logprobs input[type=checkbox]").check()
            why_n.click()  # closed again: the page as a visitor finds it
            page.locator("#generate").click()
            page.wait_for_function(
                "document.querySelector('#sample-3')?.textContent.length > 150", timeout=60_000
            )
            page.wait_for_selector("#trace pre", timeout=30_000)  # the task tree, once a second
            time.sleep(1.0)
            # The page down to the end of the token tree under the columns.
            bottom = page.locator("#tree-panel").evaluate("e => e.getBoundingClientRect().bottom")
            page.screenshot(path=str(ROOT / out), clip={"x": 0, "y": 0, "width": 1440, "height": bottom + 16})
            browser.close()
    finally:
        app.terminate()
        app.wait(10)
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

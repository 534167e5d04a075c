"""Where the page's main thread goes during one run: a CDP trace and JS profile of the real page.

`python -m bench.page_profile [--n 32] [--rate 500] [--max-tokens 2000] [--runs 1]` starts `python
-m backend` (synthetic engine, no jitter) and `python app.py --backend-url` pointed at it, opens the
page in Debian's chromium, presses Generate `--runs` times, one run after another in the same page,
and for the last run, until its status says finished, records a CDP trace (`devtools.timeline`)
and a sampling JS profile. It prints:

- main-thread time by trace event name (nested events each count: `RunTask` holds the rest);
- every `Layout` of the run: its ms and how many layout objects were dirty of how many;
- JS self time by function (file and line), top 25.

A profile, not a benchmark: one run, on a machine whose other jobs move every figure. Compare runs
made one after the other.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from typing import Any

from playwright.sync_api import sync_playwright

from bench.browser import set_number
from devkit.local import (
    CHROMIUM_ARGS,
    LOCAL_LOAD_FLAGS,
    chromium_path,
    free_port,
    start_app,
    start_backend,
    stop_process,
)

TRACE_CATEGORIES = "devtools.timeline,v8.execute,blink,disabled-by-default-devtools.timeline"
RUN_LIMIT_MS = 120_000

REQUEST_ID_JS = (
    "() => { const m = document.querySelector('#status').textContent.match(/Request (r-[0-9a-f]+)/);"
    " return m ? m[1] : null; }"
)
"""The request id the status line names (`ui.view.status_markdown`)."""


def run_once(page: Any) -> float:
    """Press Generate and wait until the status says a new run finished; seconds taken."""
    last = page.evaluate(REQUEST_ID_JS)
    started = time.monotonic()
    page.locator("#generate").click()
    page.wait_for_function(
        f"last => {{ const id = ({REQUEST_ID_JS})();"
        " return id && id !== last && document.querySelector('#status').textContent.includes('finished'); }",
        arg=last,
        timeout=RUN_LIMIT_MS,
    )
    return time.monotonic() - started


def record(
    n: int, rate: float, max_tokens: int, runs: int = 1
) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """Trace events and JS profile of the last of `runs` runs, and its seconds from Generate to
    finished."""
    backend, backend_port = start_backend(
        ["--engine", "synthetic", "--rate", str(rate), "--jitter", "0", "--n-max", str(n), *LOCAL_LOAD_FLAGS]
    )
    port = free_port()
    app = start_app(port, extra=["--backend-url", f"ws://127.0.0.1:{backend_port}/ws", "--n-max", str(n)])
    events: list[dict[str, Any]] = []
    complete: list[bool] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("#generate").wait_for(timeout=60_000)
            set_number(page, "n", n)
            set_number(page, "max-tokens", max_tokens)
            for _ in range(runs - 1):
                run_once(page)
            cdp = page.context.new_cdp_session(page)
            cdp.on("Tracing.dataCollected", lambda e: events.extend(e["value"]))
            cdp.on("Tracing.tracingComplete", lambda _e: complete.append(True))
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 500})
            cdp.send("Tracing.start", {"categories": TRACE_CATEGORIES, "transferMode": "ReportEvents"})
            cdp.send("Profiler.start")
            seconds = run_once(page)
            profile = cdp.send("Profiler.stop")["profile"]
            cdp.send("Tracing.end")
            while not complete:
                page.wait_for_timeout(100)  # Playwright delivers CDP events while it waits
            browser.close()
    finally:
        stop_process(app)
        stop_process(backend)
    return events, profile, seconds


def report(events: list[dict[str, Any]], profile: dict[str, Any]) -> None:
    """Print the three tables."""
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    main = {key for key, name in threads.items() if name == "CrRendererMain"}
    on_main = [
        e for e in events if (e.get("pid"), e.get("tid")) in main and e.get("ph") == "X" and "dur" in e
    ]
    by_name: collections.Counter[str] = collections.Counter()
    for event in on_main:
        by_name[event["name"]] += event["dur"] / 1e3
    print("main thread, ms by trace event (nested events each count)")
    for name, ms in by_name.most_common(20):
        print(f"  {name:<44}{ms:>9.0f}")
    layouts = [e for e in on_main if e["name"] == "Layout"]
    print(f"\n{len(layouts)} layouts (ms, dirty objects / all):")
    print(
        "  "
        + ", ".join(
            f"{e['dur'] / 1e3:.1f} {e['args']['beginData'].get('dirtyObjects')}"
            f"/{e['args']['beginData'].get('totalObjects')}"
            for e in layouts
        )
    )
    nodes = {node["id"]: node for node in profile["nodes"]}
    self_ms: collections.Counter[tuple[str, str, int]] = collections.Counter()
    for sample, delta in zip(profile["samples"], profile["timeDeltas"], strict=True):
        frame = nodes[sample]["callFrame"]
        key = (frame["functionName"] or "(anonymous)", frame["url"].rsplit("/", 1)[-1], frame["lineNumber"])
        self_ms[key] += delta / 1e3
    print("\nJS self time, ms")
    for (function, url, line), ms in self_ms.most_common(25):
        print(f"  {ms:>8.0f}  {function} {url}:{line}")


def main() -> int:
    """Record one run and print where its main-thread time went."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--rate", type=float, default=500.0, help="synthetic tokens/s per sample")
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1, help="runs in the same page; the last is profiled")
    args = parser.parse_args()
    events, profile, seconds = record(args.n, args.rate, args.max_tokens, args.runs)
    print(
        f"n={args.n} at {args.rate:g} tok/s per sample, run {args.runs} in the page: {seconds:.2f} s"
        " from Generate to finished\n"
    )
    report(events, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Browser: the real page in headless chromium at full engine speed, n = 16 and 32.

`python -m bench.browser` starts `python -m backend` (synthetic engine, `--rate` tokens/s per
sample, no jitter, tracing on as the page uses it), a websocket relay in this process, and
`python app.py --backend-url` pointed at the relay; then drives Debian's chromium with Playwright:
for each n, set n and max_tokens, press Generate `--runs` times, one run after another. It prints,
per n:

- `upd/s`: updates rendered per second while streaming. A MutationObserver on the sample grid
  logs, with `performance.now()`, each change of a column's text length (the grid's DOM patch), and a
  `requestAnimationFrame` loop logs every frame. A write that changed a column's text renders in
  the first frame at or after it (rAF runs before that frame's style, layout and paint); the rate
  is (distinct such frames - 1) / (last - first of them), over the run's streaming window (first
  text to final text). `gap p50` is the median interval between those frames; `msg/s` the Gradio
  stream messages (`process_generating`) the page parsed per second, for comparison: what the
  server sent against what the page drew.
- `done->DOM`: from the backend's `done` frame to the final text in the DOM. The relay between the
  app and the backend notes `time.monotonic()` when it receives the run's `done` frame from the
  backend (before passing it on, so the relay's own hop counts against the page). In the page, the
  final text is in the DOM at the later of: the last write that gave a column its final text (over
  the n columns), and the status line showing the run `finished` (a MutationObserver on #status).
  Page times are mapped to the host's monotonic clock by an offset measured just before each run:
  the `page.evaluate("performance.now()")` round trip with the smallest RTT of a few tries, its
  midpoint taken as the page's reading; the mapping's error is at most half that RTT (`+-ms`).
  Split: `done->net`, until the bytes of the Gradio stream (`/queue/data`) that carried the final
  update reached the browser's network stack (CDP `Network.dataReceived`, whose timestamps are the
  host's CLOCK_MONOTONIC on Linux: no calibration); `net->JS`, until the page parsed the last
  `process_generating` message before the final DOM write; `JS->DOM`, until that write (Gradio
  hands each message to a `setTimeout`, then Svelte applies it); `DOM->frame`, until the start of
  the animation frame that paints it. `max d->DOM` is the worst run. `upd/cap` is `upd/s` over the
  page's cap, `ui.handlers.UPDATES_PER_S`.
- `wrong`: columns whose final text differs from the engine's deterministic text (must be 0).
- Page memory after each run, each n: a forced GC (CDP `HeapProfiler.collectGarbage`), then CDP
  `Performance.getMetrics`: JSHeapUsedSize, DOM Nodes, JSEventListeners; first run against last.
  The benchmark's own in-page logs are handed over and emptied before each reading.

The load average is printed at the start and the end: on a shared machine every figure here moves
with it.

The relay adds one loopback hop and this process's CPU to every frame on the way to the app; the
engine, the backend, the app, chromium and this process share the machine's cores.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent

from backend.engines.synthetic import synthetic_tokens  # noqa: E402
from bench.done_relay import DoneRelay  # noqa: E402
from devkit.local import (  # noqa: E402
    CHROMIUM_ARGS,
    LOCAL_LOAD_FLAGS,
    chromium_path,
    free_port,
    start_app,
    start_backend,
    stop_process,
)
from devkit.panels import SETTINGS, open_panel  # noqa: E402

DEFAULT_NS = (16, 32)
DEFAULT_RUNS = 10
DEFAULT_RATE = 500.0
"""Tokens/s per sample: the rate the transport benchmark calls full speed (the backend is CPU-bound
at 32 x 500 on two cores, so the page sees as many chunks as the machine can deliver)."""
DEFAULT_MAX_TOKENS = 2000
"""At temperature 0.8 the synthetic samples stop at 800-860 tokens: runs of about 2-3 s."""

RUN_LIMIT_S = 120.0
"""Longest wait for one run's `done` and its finished status before the benchmark gives up."""

SETTLE_S = 0.5
"""Logging continues this long after the status says finished, to catch a late final write."""

CALIBRATION_TRIES = 9
"""Round trips to the page per clock calibration; the one with the smallest RTT is used."""


EXTRA_CHROMIUM_ARGS = ["--enable-precise-memory-info"]
"""Unrounded heap sizes in the page (CDP's metrics are exact either way)."""

INIT_SCRIPT = """
(() => {
  let log = {writes: [], frames: [], messages: [], completed: [], status: []};
  const lengths = new Map();
  const parse = JSON.parse;
  JSON.parse = function (text, reviver) {
    if (typeof text === 'string' && text.length > 40) {
      const head = text.slice(0, 80);
      if (head.includes('"process_generating"')) log.messages.push(performance.now());
      else if (head.includes('"process_completed"')) log.completed.push(performance.now());
    }
    return parse.call(JSON, text, reviver);
  };
  const tick = (t) => { log.frames.push(t); requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  window.__bench = {
    watchStatus() {
      const status = document.querySelector('#status');
      new MutationObserver(() => {
        const text = status.textContent;
        if (text.includes('finished')) log.status.push([performance.now(), text.slice(0, 400)]);
      }).observe(status, {subtree: true, childList: true, characterData: true});
      const grid = document.querySelector('#samples');
      new MutationObserver(() => {
        const now = performance.now();
        for (const box of grid.querySelectorAll('.sample-text')) {
          const index = Number(box.id.slice(7));
          const length = box.textContent.length;
          if (lengths.get(index) !== length) {
            lengths.set(index, length);
            log.writes.push([index, now, length]);
          }
        }
      }).observe(grid, {subtree: true, childList: true, characterData: true});
    },
    take() {
      const out = log;
      log = {writes: [], frames: [], messages: [], completed: [], status: []};
      return out;
    },
  };
})();
"""
"""Logs, in the page, every sample-column write, every animation frame and every Gradio stream message."""


@dataclass
class RunFigures:
    """One run as the page drew it; times in ms."""

    updates_per_s: float
    gap_p50_ms: float
    messages_per_s: float
    done_to_dom_ms: float
    done_to_network_ms: float
    network_to_parse_ms: float
    parse_to_dom_ms: float
    dom_to_frame_ms: float
    clock_error_ms: float
    wrong: int
    streaming_s: float


class NetworkLog:
    """When the bytes of the page's Gradio stream (`/queue/data`) reach the browser, from CDP.

    CDP's Network timestamps are the browser's monotonic clock, which on Linux is the host's
    CLOCK_MONOTONIC, the clock `time.monotonic()` reads: they need no calibration.
    """

    def __init__(self, cdp: Any, enable: bool = True) -> None:
        self._streams: set[str] = set()
        self.received: list[float] = []
        cdp.on("Network.requestWillBeSent", self._request)
        cdp.on("Network.dataReceived", self._data)
        if enable:
            cdp.send("Network.enable")

    def _request(self, event: dict[str, Any]) -> None:
        if "/queue/data" in event["request"]["url"]:
            self._streams.add(event["requestId"])

    def _data(self, event: dict[str, Any]) -> None:
        if event["requestId"] in self._streams:
            self.received.append(event["timestamp"] * 1000)

    def take(self) -> list[float]:
        """Arrival times (host ms) since the last take."""
        received, self.received = self.received, []
        return received


@dataclass
class Memory:
    """The page's metrics after a forced GC."""

    heap_mb: float
    nodes: int
    listeners: int


@dataclass
class Row:
    """Every run of one n."""

    n: int
    runs: list[RunFigures] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)


def page_clock_offset(page: Page) -> tuple[float, float]:
    """(page seconds - host monotonic seconds, the offset's error bound in s) from the best round trip."""
    best: tuple[float, float] | None = None
    for _ in range(CALIBRATION_TRIES):
        before = time.monotonic()
        page_ms = page.evaluate("performance.now()")
        after = time.monotonic()
        rtt = after - before
        if best is None or rtt < best[1]:
            best = (page_ms / 1000 - (before + after) / 2, rtt)
    assert best is not None
    return best[0], best[1] / 2


def set_number(page: Page, elem_id: str, value: int) -> None:
    """Type `value` into a slider's number box, as a person would."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def rendered_frames(writes: list[list[float]], frames: list[float], n: int) -> tuple[list[float], float]:
    """The frames that drew a changed column text, and the time the last column got its final text."""
    last_length = [-1] * n
    final_length = [0] * n
    for index, _, length in writes:
        if int(index) < n:
            final_length[int(index)] = int(length)
    final_at = [0.0] * n
    drawn: set[float] = set()
    for raw_index, at, raw_length in writes:
        index, length = int(raw_index), int(raw_length)
        if index >= n or length == last_length[index]:
            continue
        last_length[index] = length
        if length == final_length[index] and not final_at[index]:
            final_at[index] = at
        if length == 0:
            continue  # the first render clears the columns: nothing streamed yet
        position = bisect.bisect_left(frames, at)
        if position < len(frames):
            drawn.add(frames[position])
    return sorted(drawn), max(final_at)


def analyse(
    log: dict[str, Any], network: list[float], n: int, done_at: float, offset: float, error: float, wrong: int
) -> RunFigures:
    """One run's figures from the page's logs, the network log and the relay's `done`."""
    shift = offset * 1000  # page ms - host ms
    frames = sorted(log["frames"])
    drawn, text_final = rendered_frames(log["writes"], frames, n)
    finished = [at for at, _ in log["status"]]
    dom_final = max(text_final, finished[0] if finished else text_final)
    first_text = min((at for _, at, length in log["writes"] if length), default=dom_final)
    window = [at for at in drawn if at <= dom_final + 50]
    span_s = (window[-1] - window[0]) / 1000 if len(window) > 1 else 0.0
    gaps = [b - a for a, b in itertools.pairwise(window)]
    messages = [at for at in log["messages"] if first_text - 100 <= at <= dom_final]
    # The final update came in the last stream bytes, and the last parsed message, before it was in the DOM.
    carried_by = max((at + shift for at in network if at + shift <= dom_final), default=float("nan"))
    parsed = max((at for at in log["messages"] if at <= dom_final), default=float("nan"))
    painted = (
        frames[bisect.bisect_left(frames, dom_final)] if frames and frames[-1] >= dom_final else dom_final
    )
    done = (done_at + offset) * 1000
    return RunFigures(
        updates_per_s=(len(window) - 1) / span_s if span_s else 0.0,
        gap_p50_ms=statistics.median(gaps) if gaps else 0.0,
        messages_per_s=len(messages) / span_s if span_s else 0.0,
        done_to_dom_ms=dom_final - done,
        done_to_network_ms=carried_by - done,
        network_to_parse_ms=parsed - carried_by,
        parse_to_dom_ms=dom_final - parsed,
        dom_to_frame_ms=painted - dom_final,
        clock_error_ms=error * 1000,
        wrong=wrong,
        streaming_s=(dom_final - first_text) / 1000,
    )


def wrong_columns(page: Page, n: int, max_tokens: int) -> int:
    """Columns whose text differs from the synthetic engine's, for the page's seed and temperature
    (read in the settings panel, opened first)."""
    open_panel(page, SETTINGS)
    seed = int(page.locator("#seed input").input_value())
    temperature = float(page.locator("#temperature input[type=number]").input_value())
    texts = page.evaluate(
        f"[...Array({n}).keys()].map(i => document.querySelector(`#sample-${{i}}`).textContent)"
    )
    expected = ["".join(synthetic_tokens(seed + i, max_tokens, temperature)[0]) for i in range(n)]
    return sum(text != want for text, want in zip(texts, expected, strict=True))


def memory(page: Page, cdp: Any) -> Memory:
    """The page's JS heap, DOM nodes and listeners after a forced garbage collection."""
    cdp.send("HeapProfiler.collectGarbage")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return Memory(metrics["JSHeapUsedSize"] / 1e6, int(metrics["Nodes"]), int(metrics["JSEventListeners"]))


def one_run(page: Page, relay: DoneRelay, network: NetworkLog, n: int, max_tokens: int) -> RunFigures:
    """Press Generate, wait for `done` and the finished status, and read the page's logs."""
    page.evaluate("window.__bench.take()")
    network.take()
    offset, error = page_clock_offset(page)
    known = set(relay.done_at)
    page.locator("#generate").click()
    deadline = time.monotonic() + RUN_LIMIT_S
    while not set(relay.done_at) - known:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no done frame within {RUN_LIMIT_S:g} s")
        page.wait_for_timeout(20)  # not time.sleep: Playwright delivers CDP events while it waits
    (request_id,) = set(relay.done_at) - known
    page.wait_for_function(
        "id => { const t = document.querySelector('#status').textContent;"
        " return t.includes(id) && t.includes('finished'); }",
        arg=request_id,
        timeout=RUN_LIMIT_S * 1000,
    )
    page.wait_for_timeout(SETTLE_S * 1000)
    log = page.evaluate("window.__bench.take()")
    log["status"] = [entry for entry in log["status"] if request_id in entry[1]]
    wrong = wrong_columns(page, n, max_tokens)
    return analyse(log, network.take(), n, relay.done_at[request_id], offset, error, wrong)


def measure(ns: list[int], runs: int, rate: float, max_tokens: int, with_network: bool = True) -> list[Row]:
    """Every n, `runs` runs each, against one backend, relay, app and browser."""
    backend, backend_port = start_backend(
        [
            "--engine",
            "synthetic",
            "--rate",
            str(rate),
            "--jitter",
            "0",
            "--n-max",
            str(max(ns)),
            *LOCAL_LOAD_FLAGS,
        ]
    )
    relay = DoneRelay(backend_port)
    relay.start()
    port = free_port()
    app = start_app(port, extra=["--backend-url", relay.url, "--n-max", str(max(ns))])
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium_path(), args=CHROMIUM_ARGS + EXTRA_CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(INIT_SCRIPT)
            page.goto(f"http://127.0.0.1:{port}/")
            page.locator("#generate").wait_for(timeout=60_000)
            page.evaluate("window.__bench.watchStatus()")
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            network = NetworkLog(cdp, enable=with_network)
            for n in ns:
                set_number(page, "n", n)
                set_number(page, "max-tokens", max_tokens)
                row = Row(n)
                for run in range(runs):
                    row.runs.append(one_run(page, relay, network, n, max_tokens))
                    row.memory.append(memory(page, cdp))
                    figures, mem = row.runs[-1], row.memory[-1]
                    print(
                        f"  n={n} run {run + 1}: {figures.updates_per_s:.1f} upd/s, done->DOM "
                        f"{figures.done_to_dom_ms:.0f} ms, heap {mem.heap_mb:.1f} MB, {mem.nodes} nodes",
                        flush=True,
                    )
                rows.append(row)
            browser.close()
    finally:
        stop_process(app)
        relay.stop()
        stop_process(backend)
    return rows


TIMING_COLUMNS = (
    ("stream s", "streaming_s", 9, ".2f"),
    ("upd/s", "updates_per_s", 7, ".1f"),
    ("gap p50", "gap_p50_ms", 8, ".0f"),
    ("msg/s", "messages_per_s", 7, ".1f"),
    ("done->DOM", "done_to_dom_ms", 10, ".0f"),
    ("done->net", "done_to_network_ms", 10, ".0f"),
    ("net->JS", "network_to_parse_ms", 8, ".0f"),
    ("JS->DOM", "parse_to_dom_ms", 8, ".0f"),
    ("DOM->frame", "dom_to_frame_ms", 11, ".0f"),
)
"""(header, RunFigures field, width, format) of the timing table's median columns."""


def report(rows: list[Row]) -> None:
    """The tables: medians over runs (and the worst done->DOM), then memory first against last run."""
    print(
        f"\n{'n':>3}{'runs':>5}"
        + "".join(f"{header:>{width}}" for header, _, width, _ in TIMING_COLUMNS)
        + f"{'max d->DOM':>11}{'+-ms':>6}{'wrong':>6}{'upd/cap':>8}"
    )
    from ui.handlers import UPDATES_PER_S  # imported late: it imports Gradio, seconds

    for row in rows:
        medians = "".join(
            f"{statistics.median(getattr(r, name) for r in row.runs):>{width}{spec}}"
            for _, name, width, spec in TIMING_COLUMNS
        )
        print(
            f"{row.n:>3}{len(row.runs):>5}{medians}{max(r.done_to_dom_ms for r in row.runs):>11.0f}"
            f"{max(r.clock_error_ms for r in row.runs):>6.1f}{sum(r.wrong for r in row.runs):>6}"
            f"{statistics.median(r.updates_per_s for r in row.runs) / UPDATES_PER_S:>8.2f}"
        )
    print(
        f"\n{'n':>3}{'runs':>5}{'heap MB 1st':>12}{'last':>7}{'growth':>8}"
        f"{'nodes 1st':>10}{'last':>7}{'listeners':>10}"
    )
    for row in rows:
        first, last = row.memory[0], row.memory[-1]
        print(
            f"{row.n:>3}{len(row.memory):>5}{first.heap_mb:>12.2f}{last.heap_mb:>7.2f}"
            f"{last.heap_mb - first.heap_mb:>+8.2f}{first.nodes:>10}{last.nodes:>7}"
            f"{first.listeners:>5}->{last.listeners}"
        )


def main() -> int:
    """Parse flags, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default=",".join(map(str, DEFAULT_NS)), help="n values (default %(default)s)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per n (default %(default)s)")
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="tok/s per sample (default %(default)s)"
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="default %(default)s")
    parser.add_argument(
        "--no-network",
        action="store_true",
        help="leave CDP's Network domain off (no done->net / net->JS split), to see what observing costs",
    )
    args = parser.parse_args()
    if chromium_path() is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    ns = [int(n) for n in args.ns.split(",")]
    print(
        f"browser: n {ns}, {args.runs} runs each, {args.rate:g} tok/s per sample, "
        f"max_tokens {args.max_tokens}, load average {os.getloadavg()[0]:.1f}"
    )
    rows = measure(ns, args.runs, args.rate, args.max_tokens, with_network=not args.no_network)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The token tree's cost per page update at n = 32 x 512 tokens: in Python, and drawn in chromium.

`python -m bench.sample_tree [--n 32] [--tokens 512] [--updates 64] [--rounds 5] [--no-browser]`
builds the frames of one run of n samples of `--tokens` tokens each: synthetic-engine words, each
sample continuing the text of an earlier one for a random number of tokens before going its own
way, so the tree branches at every depth, as sampled text does. The frames arrive in `--updates`
page updates (the page draws 15 a second, so 64 updates is a run of about 4 s); each chunk frame is
one token, with its logprob piece in the `tokens` run and without one in the `words` run.

For each update it times, in this process's CPU time (`time.thread_time()`, so other processes
taking the CPU do not count), what the page's handler does for the tree: folding
that update's chunk frames into the tree (`SampleTree.add`, as `RunView.apply` calls it), the
columns' parting points (`SampleTree.parting_points`) and the panel's value (`tree_value`); and
in Debian's chromium, the panel's own script (`ui.sample_tree_view.JS_ON_LOAD`, with the panel's
CSS) drawing that update's value, a forced layout included, the same values drawn `--rounds` times
and each update's least time kept (wall-clock time: the least is the draw other processes on the
machine disturbed least). It prints the median, 90th percentile and largest
update of each, over `--rounds` rounds, and the tree's size at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from backend.engines.synthetic import synthetic_tokens
from ui.sample_tree import SampleTree
from ui.sample_tree_view import CSS, JS_ON_LOAD, tree_value

DRAW_PAGE = """
<style>%s</style>
<div id="samples"><div class="sample-grid">%s</div></div>
<div id="sample-tree"><div class="sample-tree"></div></div>
"""
"""A page with the panel's element and CSS, and n empty columns for its script to mark."""

DRAW_SETUP = """([js, value]) => {
  const element = document.querySelector('#sample-tree');
  const props = {value};
  let redraw = null;
  new Function('element', 'props', 'watch', 'trigger', js)(
    element, props, (_name, callback) => { redraw = callback; }, () => {});
  window.drawValue = (next) => {
    const started = performance.now();
    props.value = next;
    redraw();
    void element.getBoundingClientRect().height;  // style and layout now, not at the next frame
    return performance.now() - started;
  };
}"""
"""Runs the panel's script on the page as Gradio would (its `element`, `props` and `watch`) and
defines `drawValue`, which hands it a new value and returns the ms it took to draw it."""


def run_texts(n: int, tokens: int, seed: int) -> list[list[str]]:
    """n samples' tokens: each after the first takes a random earlier sample's first tokens (up to
    all of them), then its own synthetic words."""
    rng = random.Random(seed)
    samples: list[list[str]] = []
    for index in range(n):
        own, _reason = synthetic_tokens(seed * 1000 + index, tokens * 2)
        own = [*own, *[" more"] * tokens]  # a synthetic sample may stop early; keep it running
        if samples:
            shared = samples[rng.randrange(len(samples))][: rng.randint(0, tokens - 1)]
        else:
            shared = []
        samples.append((shared + own)[:tokens])
    return samples


def updates(samples: list[list[str]], count: int) -> list[list[tuple[int, str]]]:
    """The run's (index, token) chunks grouped into `count` page updates, samples interleaved."""
    tokens = len(samples[0])
    per_update = -(-tokens // count)
    groups = []
    for start in range(0, tokens, per_update):
        groups.append(
            [
                (i, sample[t])
                for t in range(start, min(start + per_update, tokens))
                for i, sample in enumerate(samples)
            ]
        )
    return groups


def python_round(
    samples: list[list[str]], count: int, with_logprobs: bool
) -> tuple[dict[str, list[float]], list[Any]]:
    """Per update: ms folding chunks, ms for parting points, ms for the value; and the values."""
    tree = SampleTree(len(samples))
    times: dict[str, list[float]] = {"fold": [], "parting": [], "value": [], "total": []}
    values = []
    for group in updates(samples, count):
        started = time.thread_time()
        for index, token in group:
            tree.add(index, token, [[token, [-0.7]]] if with_logprobs else None)
        folded = time.thread_time()
        tree.parting_points()
        parted = time.thread_time()
        values.append(tree_value(tree, "r-bench"))
        done = time.thread_time()
        for key, value in (
            ("fold", folded - started),
            ("parting", parted - folded),
            ("value", done - parted),
        ):
            times[key].append(value * 1000)
        times["total"].append((done - started) * 1000)
    return times, values


def browser_draws(values_by_mode: dict[str, list[Any]], n: int, rounds: int) -> dict[str, list[float]]:
    """ms the panel's script takes to draw each value, in chromium, per mode: the least of `rounds`
    draws of the same value (a wall-clock figure: the least is the one other processes disturbed least)."""
    from playwright.sync_api import sync_playwright

    from devkit.local import CHROMIUM_ARGS, chromium_path

    columns = "".join(f'<div class="sample-column" id="column-{i}"></div>' for i in range(n))
    draws: dict[str, list[list[float]]] = {mode: [] for mode in values_by_mode}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for _ in range(rounds):
            for mode, values in values_by_mode.items():
                page.set_content(DRAW_PAGE % (CSS, columns))
                page.evaluate(DRAW_SETUP, [JS_ON_LOAD, {"run": None, "n": 0, "unit": None, "nodes": []}])
                draws[mode].append([page.evaluate("v => window.drawValue(v)", value) for value in values])
        browser.close()
    return {
        mode: [min(update) for update in zip(*rounds_drawn, strict=True)]
        for mode, rounds_drawn in draws.items()
    }


def figures_line(figures: list[float]) -> str:
    """Median, 90th percentile and largest of `figures`."""
    p90 = statistics.quantiles(figures, n=10)[-1]
    return f"{statistics.median(figures):6.2f} {p90:6.2f} {max(figures):6.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--updates", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true", help="time the Python side only")
    args = parser.parse_args()

    results: dict[str, dict[str, list[float]]] = {}
    last_values: dict[str, list[Any]] = {}
    sizes = {}
    for mode in ("tokens", "words"):
        results[mode] = {"fold": [], "parting": [], "value": [], "total": []}
        for round_index in range(args.rounds):
            samples = run_texts(args.n, args.tokens, seed=round_index + 1)
            times, values = python_round(samples, args.updates, with_logprobs=mode == "tokens")
            for key, figures in times.items():
                results[mode][key] += figures
            last_values[mode] = values
        final = last_values[mode][-1]
        sizes[mode] = (len(final["nodes"]), len(json.dumps(final)))

    print(
        f"token tree, n = {args.n} x {args.tokens} tokens, {args.updates} page updates, {args.rounds} rounds"
    )
    print("ms per page update                  median    p90    max")
    for mode, times in results.items():
        for key, label in (
            ("fold", "fold the update's chunks"),
            ("parting", "parting points"),
            ("value", "panel value"),
            ("total", "python, all"),
        ):
            print(f"  {mode:<6} {label:<24} {figures_line(times[key])}")
    if not args.no_browser:
        draws = browser_draws(last_values, args.n, args.rounds)
        for mode, figures in draws.items():
            print(f"  {mode:<6} {'chromium draw + layout':<24} {figures_line(figures)}")
    for mode, (nodes, size) in sizes.items():
        print(f"  {mode}: {nodes} nodes at the end, value {size / 1024:.1f} KiB as JSON")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

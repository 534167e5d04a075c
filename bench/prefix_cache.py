"""What the embedded engine's prefix cache saves a continuation: `python -m bench.prefix_cache`.

Loads the embedded engine in this process (its model in a process of its own, as the backend runs
it), then for each of `--rounds` rounds: one sample of a chat prompt (`--depth` + 20 tokens, its end
of turn ignored), then n = `--n` samples continuing from the text of its first `--depth` tokens, two
ways, in alternating order:

- **continued**: as the page's Continue from here sends it (`Prompt.prefix`): the engine copies the
  keys and values it kept of that sample instead of computing them;
- **cold**: the same prompt tokens sent as a fresh prompt, nothing copied but the chat template's
  head (which every prompt copies).

Per way: the time to first token (from the request's submission to its first chunk, in this
process) and the prompt tokens the engine computed and reused (its `prompt_tokens` and
`cached_tokens`), medians over the rounds, and cold / continued. Other work on the machine moves the
times; the ratio is measured within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from backend.engines.base import Prompt, SamplingParams
from backend.engines.embedded.engine import EmbeddedEngine

PROMPT = "Write a long story about a lighthouse keeper who keeps a diary through a winter storm."


async def first_token_and_figures(
    engine: EmbeddedEngine, ids: list[int], n: int, decode: Any
) -> tuple[float, dict]:
    """Submit `ids` for `n` samples; seconds to the first chunk, and a finish's prompt figures."""
    started = time.perf_counter()
    first = None
    figures: dict[str, Any] = {}
    async for chunk in engine.submit(ids, n, decode):
        if first is None:
            first = time.perf_counter() - started
        if chunk.finish_reason is not None and chunk.meta:
            figures = dict(chunk.meta)
    assert first is not None
    return first, figures


async def source_prefix(engine: EmbeddedEngine, seed: int, depth: int) -> str:
    """The text of the first `depth` tokens of one sample of PROMPT (its end of turn ignored)."""
    params = SamplingParams(max_tokens=depth + 20, temperature=0.8, top_p=0.95, seed=seed)
    decode = replace(engine.decode_params(params), ignore_eos=True)
    texts: list[str] = []
    async for chunk in engine.submit(engine.prompt_ids(Prompt(PROMPT)), 1, decode):
        texts.append(chunk.text)
    return "".join(texts[:depth])


async def main(rounds: int, depth: int, n: int) -> int:
    engine = EmbeddedEngine(max_rows=max(8, n), context=1024)
    engine.load()
    try:
        health = engine.health()
        print(
            f"embedded engine, compute path {health.get('compute_path')}, {rounds} rounds, a node "
            f"{depth} tokens into a sample, n = {n}, 8 new tokens"
        )
        results: dict[str, list[tuple[float, dict]]] = {"continued": [], "cold": []}
        for index in range(rounds):
            prefix = await source_prefix(engine, seed=100 + index, depth=depth)
            prompt = Prompt(PROMPT, prefix=prefix)
            ids = engine.prompt_ids(prompt)
            params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.95, seed=7 + index)
            cold = engine.decode_params(params)
            warm = replace(cold, reuse_branches=True)
            ways = [("continued", warm), ("cold", cold)]
            for name, decode in ways if index % 2 == 0 else ways[::-1]:
                results[name].append(await first_token_and_figures(engine, ids, n, decode))
        print(f"{'':>10} {'TTFT ms':>9} {'prompt':>7} {'computed':>9} {'reused':>7}")
        medians = {}
        for name, runs in results.items():
            ttft = statistics.median(t for t, _ in runs) * 1000
            prompt_tokens = runs[0][1].get("prompt_tokens", 0)
            reused = statistics.median(f.get("cached_tokens", 0) for _, f in runs)
            medians[name] = ttft
            print(f"{name:>10} {ttft:9.1f} {prompt_tokens:7d} {prompt_tokens - reused:9.0f} {reused:7.0f}")
        ratios = [c[0] / w[0] for w, c in zip(results["continued"], results["cold"], strict=True)]
        print(
            f"cold / continued TTFT: {statistics.median(ratios):.2f}x (median of the rounds' ratios; "
            f"{min(ratios):.2f}-{max(ratios):.2f})"
        )
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--depth", type=int, default=200, help="tokens into the sample the node is")
    parser.add_argument("--n", type=int, default=4)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.rounds, args.depth, args.n)))

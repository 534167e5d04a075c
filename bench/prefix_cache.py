"""What an engine's prefix cache saves a continuation: `python -m bench.prefix_cache [--sglang-url URL]`.

Loads the embedded engine in this process (its model in a process of its own, as the backend runs
it), then for each of `--rounds` rounds: one sample of a chat prompt (`--depth` + 20 tokens, its end
of turn ignored), then n = `--n` samples continuing from the text of its first `--depth` tokens, two
ways, in alternating order:

- **continued**: as the page's Continue from here sends it (`Prompt.prefix`): the engine copies the
  keys and values it kept of that sample instead of computing them;
- **cold**: the same prompt tokens sent as a fresh prompt, nothing copied but the chat template's
  head (which every prompt copies).

With `--sglang-url`, the same through the dashboard's `sglang` engine against that SGLang server
(the real CPU server of `make test-engines`, or one on a GPU): in each round the source sample, then
the **continued** request (SGLang's radix cache still holds the sample), then SGLang's cache
flushed (`POST /flush_cache`) and the **cold** one; the figures are SGLang's own `prompt_tokens` and
`cached_tokens`. There n is 1 unless `--n` says otherwise: for n > 1 SGLang prefills the prompt once
in a request of its own before the samples, and each sample then counts the whole prompt as cached,
cold or not.

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
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.http.sglang import SGLangEngine
from backend.vocabulary import Chunk, Prompt, SamplingParams

PROMPT = "Write a long story about a lighthouse keeper who keeps a diary through a winter storm."


async def first_token_and_figures(start: Callable[[], AsyncIterator[Chunk]]) -> tuple[float, dict]:
    """Start a request (`start`, the engine's call); seconds to its first chunk, and a finish's
    prompt figures (`prompt_tokens`, `cached_tokens`)."""
    started = time.perf_counter()
    first = None
    figures: dict[str, Any] = {}
    async for chunk in start():
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


def report(results: dict[str, list[tuple[float, dict]]]) -> None:
    """Print each way's median TTFT and prompt figures, and cold / continued within each round."""
    print(f"{'':>10} {'TTFT ms':>9} {'prompt':>7} {'computed':>9} {'reused':>7}")
    for name, runs in results.items():
        ttft = statistics.median(t for t, _ in runs) * 1000
        prompt_tokens = runs[0][1].get("prompt_tokens", 0)
        reused = statistics.median(f.get("cached_tokens", 0) for _, f in runs)
        print(f"{name:>10} {ttft:9.1f} {prompt_tokens:7d} {prompt_tokens - reused:9.0f} {reused:7.0f}")
    ratios = [c[0] / w[0] for w, c in zip(results["continued"], results["cold"], strict=True)]
    print(
        f"cold / continued TTFT: {statistics.median(ratios):.2f}x (median of the rounds' ratios; "
        f"{min(ratios):.2f}-{max(ratios):.2f})"
    )


async def sglang_prefix(engine: SGLangEngine, seed: int, depth: int) -> str:
    """The text of one sample of PROMPT up to its `depth`-th token (or its end, if sooner)."""
    params = SamplingParams(max_tokens=depth, temperature=0.8, top_p=0.95, seed=seed)
    return "".join([chunk.text async for chunk in engine.generate(Prompt(PROMPT), 1, params)])


async def flush_cache(url: str) -> None:
    """Empty SGLang's radix cache (`POST /flush_cache`, refused while a request runs)."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(url + "/flush_cache")
        response.raise_for_status()


async def sglang_main(url: str, rounds: int, depth: int, n: int) -> int:
    engine = SGLangEngine(url)
    await engine.start()
    try:
        print(
            f"SGLang at {url}, model {engine.model}, {rounds} rounds, a node up to {depth} tokens "
            f"into a sample, n = {n}, 8 new tokens"
        )
        results: dict[str, list[tuple[float, dict]]] = {"continued": [], "cold": []}
        for index in range(rounds):
            prompt = Prompt(PROMPT, prefix=await sglang_prefix(engine, seed=100 + index, depth=depth))
            params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.95, seed=7 + index)
            ask = partial(engine.generate, prompt, n, params)
            results["continued"].append(await first_token_and_figures(ask))
            await flush_cache(engine.url)
            results["cold"].append(await first_token_and_figures(ask))
        report(results)
    finally:
        await engine.stop()
    return 0


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
                ask = partial(engine.submit, ids, n, decode)
                results[name].append(await first_token_and_figures(ask))
        report(results)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--depth", type=int, default=200, help="tokens into the sample the node is")
    parser.add_argument("--n", type=int, default=None, help="samples a request (4; with --sglang-url 1)")
    parser.add_argument("--sglang-url", default="", help="an SGLang server to measure instead")
    args = parser.parse_args()
    if args.sglang_url:
        url = args.sglang_url.rstrip("/")
        sys.exit(asyncio.run(sglang_main(url, args.rounds, args.depth, args.n or 1)))
    sys.exit(asyncio.run(main(args.rounds, args.depth, args.n or 4)))

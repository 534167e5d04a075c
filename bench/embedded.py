"""The embedded engine against transformers `generate(num_return_sequences=n)`, same weights and dtype.

For n = 1, 8, 32 and 64 new tokens per sample (end-of-turn ignored on both sides so every sample is
that long): output tokens/s, time to first token, and peak memory above the idle process (RSS,
sampled every 5 ms; for the engine, of its model process). While the engine runs, an asyncio
heartbeat measures how late the event loop wakes (the engine steps in its own process; this is the
lag the backend's loop would see). Both sides run one after the other, so a loaded machine slows
both alike: read the ratios.

Usage: python -m bench.embedded [--ns 1,8,32] [--tokens 64] [--threads 1] [--compute PATH]
(`--compute` as the engine's, `auto` by default)

`--alternatives ROUNDS` times the engine's decode step instead (its own figure: the model's step,
the sampler, the logprobs and alternatives, the chunks, as the scheduler measures it) with token
confidence off, on without alternatives (`off`), and on with k = 5 and 20 alternatives a token,
alternating in each of ROUNDS rounds; medians, and each against `off`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import torch

from backend.engines.embedded import COMPUTE, THREADS
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.embedded.scheduler import DecodeParams
from backend.engines.embedded.weights import resolve_model
from backend.vocabulary import Prompt
from devkit.memory import PeakRss

PROMPT = "Write a short poem about the sea."
HEARTBEAT_S = 0.005
"""Interval of the loop-lag heartbeat."""


async def run_engine(engine: EmbeddedEngine, ids: list[int], n: int, tokens: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            due = loop.time() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)
            lags.append(max(0.0, loop.time() - due))

    beat = asyncio.create_task(heartbeat())
    with PeakRss(engine.worker_pid, interval_s=0.005) as memory:
        start = time.perf_counter()
        generation = engine.submit(ids, n, DecodeParams(tokens, 0.8, 0.95, seed=1, ignore_eos=True))
        first = None
        count = 0
        async for chunk in generation:
            count += chunk.tokens
            if first is None and chunk.tokens:
                first = time.perf_counter() - start
        elapsed = time.perf_counter() - start
    done.set()
    await beat
    return {
        "tok_s": count / elapsed,
        "ttft_ms": 1000 * (first or 0.0),
        "mem_mb": memory.peak / 2**20,
        "lag_p50_ms": 1000 * statistics.median(lags),
        "lag_max_ms": 1000 * max(lags),
    }


def run_generate(model: object, ids: list[int], n: int, tokens: int) -> dict[str, float]:
    input_ids = torch.tensor([ids])

    def generate(new: int) -> Callable[[], object]:
        return lambda: model.generate(  # type: ignore[attr-defined]
            input_ids,
            do_sample=True,
            temperature=0.8,
            top_p=0.95,
            top_k=0,
            num_return_sequences=n,
            max_new_tokens=new,
            min_new_tokens=new,
        )

    with torch.inference_mode():
        start = time.perf_counter()
        generate(1)()
        ttft = time.perf_counter() - start
        with PeakRss(interval_s=0.005) as memory:
            start = time.perf_counter()
            out = generate(tokens)()
            elapsed = time.perf_counter() - start
    count = (out.shape[1] - len(ids)) * n
    return {"tok_s": count / elapsed, "ttft_ms": 1000 * ttft, "mem_mb": memory.peak / 2**20}


STEP_MODES = {
    "no logprobs": {},
    "off": {"logprobs": True},
    "k=5": {"logprobs": True, "alternatives": 5},
    "k=20": {"logprobs": True, "alternatives": 20},
}
"""The decode-step comparison's settings: logprobs off, on without alternatives, on with k of them."""


async def step_ms(
    engine: EmbeddedEngine, ids: list[int], n: int, tokens: int, mode: dict[str, object]
) -> float:
    """The engine's mean decode step (ms) over one request of n samples x `tokens` in `mode`."""
    before = engine.health()
    params = DecodeParams(tokens, 0.8, 0.95, seed=1, ignore_eos=True, **mode)  # type: ignore[arg-type]
    async for _ in engine.submit(ids, n, params):
        pass
    await asyncio.sleep(0.05)  # the last step's figures
    after = engine.health()
    return 1000 * (after["step_seconds"] - before["step_seconds"]) / (after["steps"] - before["steps"])


async def alternatives_table(
    engine: EmbeddedEngine, ids: list[int], ns: list[int], tokens: int, rounds: int
) -> None:
    """The decode step with alternatives on against off, modes alternating in each round; medians."""
    print(f"decode step (ms, the scheduler's own figure), {tokens} tokens a sample, {rounds} rounds, medians")
    print(f"{'n':>3}" + "".join(f"{name:>13}" for name in STEP_MODES) + f"{'k=5/off':>9}{'k=20/off':>9}")
    for n in ns:
        seen: dict[str, list[float]] = {name: [] for name in STEP_MODES}
        for _ in range(rounds):
            for name, mode in STEP_MODES.items():
                seen[name].append(await step_ms(engine, ids, n, tokens, mode))
        ms = {name: statistics.median(values) for name, values in seen.items()}
        print(
            f"{n:>3}"
            + "".join(f"{ms[name]:>13.2f}" for name in STEP_MODES)
            + f"{ms['k=5'] / ms['off']:>9.3f}{ms['k=20'] / ms['off']:>9.3f}",
            flush=True,
        )


async def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--alternatives", type=int, default=0, help="rounds of the decode-step comparison")
    THREADS.add_to(parser)
    COMPUTE.add_to(parser)
    args = parser.parse_args()
    engine = EmbeddedEngine(threads=args.threads, compute=args.compute)
    engine.load()
    if args.alternatives:
        ids = engine.prompt_ids(Prompt(PROMPT))
        print(f"{engine.model}, compute path {engine.health().get('compute_path', '?')}")
        await run_engine(engine, ids, 2, 4)  # warm-up
        ns = [int(x) for x in args.ns.split(",")]
        await alternatives_table(engine, ids, ns, args.tokens, args.alternatives)
        await engine.stop()
        return
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(resolve_model().path, dtype=engine.dtype)
    reference.generation_config.pad_token_id = engine.tokenizer.eos_token_id
    ids = engine.prompt_ids(Prompt(PROMPT))
    print(f"{engine.model}; prompt {len(ids)} tokens (chat template), {args.tokens} new tokens per sample")
    await run_engine(engine, ids, 2, 4)  # warm-up: first-call allocations
    print(
        f"{'n':>3} {'engine tok/s':>12} {'generate tok/s':>14} {'ratio':>6} {'engine TTFT':>11} "
        f"{'generate TTFT':>13} {'engine MB':>9} {'generate MB':>11} {'loop lag p50/max ms':>20}"
    )
    for n in (int(x) for x in args.ns.split(",")):
        ours = await run_engine(engine, ids, n, args.tokens)
        theirs = run_generate(reference, ids, n, args.tokens)
        ratio = ours["tok_s"] / theirs["tok_s"]
        print(
            f"{n:>3} {ours['tok_s']:>12.1f} {theirs['tok_s']:>14.1f} {ratio:>5.2f}x "
            f"{ours['ttft_ms']:>9.0f}ms {theirs['ttft_ms']:>11.0f}ms {ours['mem_mb']:>9.0f} "
            f"{theirs['mem_mb']:>11.0f} {ours['lag_p50_ms']:>9.2f}/{ours['lag_max_ms']:.1f}",
            flush=True,
        )
    await engine.stop()


if __name__ == "__main__":
    asyncio.run(main())

"""The backend's event loop while the embedded engine runs: lag, longest stall, tokens/s, TTFT.

`python -m bench.embedded_loop` starts `python -m backend --engine embedded` (tracing on, as the
page uses it) from each checkout named by `--trees` (default: this one), all at once, and sends each
the same `generate` request in turn, n samples of `--tokens` tokens, alternating checkouts request by
request so that every checkout sees the same machine noise. From the `trace` frames the server sends
while the request runs (see docs/trace.md) it reads the loop's lag (the tracer's 20 ms heartbeat)
and the longest single loop step; from the chunk frames, the engine's tokens/s (sampled tokens over
the time from `generate` to `done`) and the time to the first token. To compare with an older
version, export it first, e.g. `git archive <commit> | tar -x -C /tmp/before`, then
`--trees /tmp/before,.`.

Usage: python -m bench.embedded_loop [--trees DIR,DIR] [--ns 8,32] [--tokens 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent

from backend.serving.stats import percentile  # noqa: E402
from devkit.frames import recv_frame  # noqa: E402
from devkit.local import free_port, wait_for_http  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea."
START_LIMIT_S = 240.0
"""How long a backend may take to serve (its first start ever converts the model)."""

REQUEST_LIMIT_S = 600.0
"""Longest one measured request may run before the benchmark gives up on it."""


def start_backend(tree: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m backend --engine embedded` from checkout `tree`, once `/health` answers."""
    port = free_port()
    args = [sys.executable, "-m", "backend", "--engine", "embedded", "--port", str(port), "--threads", "1"]
    process = subprocess.Popen(args, cwd=tree, stderr=subprocess.DEVNULL)
    wait_for_http(f"http://127.0.0.1:{port}/health", process, START_LIMIT_S)
    return process, port


async def measure(port: int, n: int, tokens: int, seed: int) -> dict[str, float]:
    """One request of n samples; the loop's lag and stalls from its trace frames, and the engine's pace."""
    frame = {
        "type": "generate",
        "id": "bench",
        "prompt": PROMPT,
        "n": n,
        "params": {"max_tokens": tokens, "temperature": 0.8, "top_p": 0.95, "seed": seed},
    }
    lags: list[float] = []
    longest = 0.0
    count = 0
    first = None
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        sent = time.perf_counter()
        await ws.send(json.dumps(frame))
        while True:
            message = await recv_frame(ws, REQUEST_LIMIT_S)
            kind = message["type"]
            if kind == "chunk":
                count += message.get("tokens", 0)
                if first is None and message.get("tokens"):
                    first = time.perf_counter() - sent
            elif kind == "trace":
                lags.extend(lag for _, lag in message["lag"])
                longest = max([longest, *(piece[5] for piece in message["slices"])])
            elif kind == "error":
                raise RuntimeError(f"the backend refused the request: {message}")
            elif kind == "done":
                elapsed = time.perf_counter() - sent
                break
    return {
        "tok_s": count / elapsed,
        "ttft_ms": 1000 * (first or 0.0),
        "lag_p50": percentile(lags, 50) or 0.0,
        "lag_p99": percentile(lags, 99) or 0.0,
        "lag_max": max(lags, default=0.0),
        "stall": longest,
    }


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated checkouts to compare")
    parser.add_argument("--ns", default="8,32")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.trees = [Path(tree).resolve() for tree in args.trees.split(",")]
    return args


async def main() -> None:
    args = parse_args()
    trees = args.trees
    ns = [int(x) for x in args.ns.split(",")]
    backends = []
    try:
        for tree in trees:
            backends.append(start_backend(tree))
        for _, port in backends:
            await measure(port, 2, 4, seed=1)  # warm-up: first-call allocations
        results: dict[tuple[int, int], list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            for n in ns:
                for which, (_, port) in enumerate(backends):
                    figures = await measure(port, n, args.tokens, seed=100 + round_)
                    results.setdefault((n, which), []).append(figures)
                    print(f"# round {round_ + 1} n={n} {trees[which]}: {figures}", flush=True)
    finally:
        for process, _ in backends:
            process.terminate()
            process.wait(30)
    print(f"\n{args.tokens} tokens per sample, {args.rounds} round(s), medians; lag and stall in ms")
    header = f"{'checkout':<28} {'n':>3} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'stall':>7}"
    print(f"{header} {'tok/s':>7} {'TTFT ms':>8}")
    for n in ns:
        for which, tree in enumerate(trees):
            rows: list[dict[str, Any]] = results[(n, which)]
            med = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            print(
                f"{str(tree)[-28:]:<28} {n:>3} {med['lag_p50']:>8.2f} {med['lag_p99']:>8.2f} "
                f"{med['lag_max']:>8.1f} {med['stall']:>7.1f} {med['tok_s']:>7.1f} {med['ttft_ms']:>8.0f}"
            )


if __name__ == "__main__":
    asyncio.run(main())

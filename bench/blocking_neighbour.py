"""What one client's blocking-consumer experiment costs another client's stream.

`python -m bench.blocking_neighbour` starts `python -m backend` on the synthetic engine twice, each
in its own process: once with `--experiment-port -1` (one loop for every client, the shared-loop
lesson) and once as it runs by default (blocking runs on the experiment loop,
`backend.serving.experiments`, the only door that takes them). Client A runs n = 2 x 75 tokens in
one consumer mode (at 200 ms a chunk that is the most the page lets one blocking run hold its loop,
`ui.visitor_limits.BLOCKING_BUDGET_S`), on the shared loop or on the experiment loop; meanwhile
client B streams n = 2 x 150 tokens, cooperative, on the main loop. It
prints, for each: B's longest and median gap between chunks, B's samples finished, A's loop lag
(the longest in A's own trace frames: the experiment stays visible to the one who runs it) and how
long A's run took.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
import urllib.request
from typing import Any

from websockets.asyncio.client import connect

from backend.config.settings import BLOCK_MS_MAX
from backend.frames import generate_frame
from backend.serving.server import WS_PATH
from devkit.frames import recv_frame
from devkit.local import LOCAL_LOAD_FLAGS, start_backend, stop_process


def generate(request_id: str, n: int, max_tokens: int, mode: str, block_ms: float) -> str:
    """A generate frame on the synthetic engine with consumer `mode`."""
    return json.dumps(
        generate_frame(
            request_id,
            "neighbours",
            n,
            {"max_tokens": max_tokens, "seed": 1},
            consumer={"mode": mode, "block_ms": block_ms},
        )
    )


async def neighbour(url: str, started: asyncio.Event, max_tokens: int) -> dict[str, Any]:
    """Client B: a cooperative n = 2 run once A has started; its gaps between chunks."""
    await started.wait()
    arrivals: list[float] = []
    finished = 0
    async with connect(url, max_size=None) as ws:
        await ws.send(generate("b", 2, max_tokens, "cooperative", 0))
        async with asyncio.timeout(300):
            while (frame := await recv_frame(ws))["type"] != "done":
                if frame["type"] == "chunk":
                    arrivals.append(time.perf_counter())
                elif frame["type"] == "finish":
                    finished += 1
    gaps = [b - a for a, b in itertools.pairwise(arrivals)] or [0.0]
    return {"longest_gap_s": max(gaps), "median_gap_s": statistics.median(gaps), "finished": finished}


async def experimenter(url: str, mode: str, block_ms: float, started: asyncio.Event) -> dict[str, float]:
    """Client A: n = 2 x 75 tokens in `mode` to the end; the longest lag in its trace, its duration."""
    lag_ms = 0.0
    began = time.perf_counter()
    async with connect(url, max_size=None, ping_interval=None) as ws:
        await ws.send(generate("a", 2, 75, mode, block_ms))
        try:
            async with asyncio.timeout(30):
                while (frame := await recv_frame(ws))["type"] != "chunk":
                    if frame["type"] == "error":
                        raise RuntimeError(frame["message"])
        finally:
            started.set()  # B goes on either way
        async with asyncio.timeout(300):
            while (frame := await recv_frame(ws))["type"] != "done":
                if frame["type"] == "trace":
                    lag_ms = max([lag_ms, *(lag for _, lag in frame["lag"])])
    return {"a_lag_ms": lag_ms, "a_s": time.perf_counter() - began}


async def one_mode(url: str, a_url: str, mode: str, block_ms: float, max_tokens: int) -> dict[str, Any]:
    """A in `mode` at `a_url` beside B at `url`: B's gaps, A's lag and duration."""
    started = asyncio.Event()
    a = asyncio.create_task(experimenter(a_url, mode, block_ms, started))
    b = await neighbour(url, started, max_tokens)
    return {**b, **await a}


def main() -> None:
    """Parse flags, run each mode once against one backend, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=50.0, help="synthetic tokens/s per sample")
    parser.add_argument("--block-ms", type=float, default=BLOCK_MS_MAX)
    parser.add_argument("--tokens", type=int, default=150, help="tokens of B's samples")
    args = parser.parse_args()
    flags = ["--engine", "synthetic", "--rate", str(args.rate), *LOCAL_LOAD_FLAGS]
    shared, shared_port = start_backend([*flags, "--experiment-port", "-1"])
    process, port = start_backend(flags)
    try:
        print(f"A: n=2 x 75 tokens; B: n=2 x {args.tokens} tokens, cooperative; {args.rate:g} tok/s")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            experiment_url = json.load(response)["experiment_url"]
        one_loop, main = f"ws://127.0.0.1:{shared_port}{WS_PATH}", f"ws://127.0.0.1:{port}{WS_PATH}"
        rounds = (
            ("cooperative", one_loop, one_loop, "main loop"),
            ("blocking", one_loop, one_loop, "main loop"),
            ("blocking", main, experiment_url, "experiment loop"),
        )
        for mode, b_url, a_url, where in rounds:
            r = asyncio.run(one_mode(b_url, a_url, mode, args.block_ms, args.tokens))
            print(
                f"A {mode:<11} on the {where:<15} (block {args.block_ms if mode == 'blocking' else 0:g} ms): "
                f"B longest gap {r['longest_gap_s'] * 1000:.0f} ms, "
                f"median {r['median_gap_s'] * 1000:.0f} ms, "
                f"B finished {r['finished']}/2; A's own lag up to {r['a_lag_ms']:.0f} ms, "
                f"A took {r['a_s']:.1f} s"
            )
    finally:
        stop_process(process)
        stop_process(shared)


if __name__ == "__main__":
    main()

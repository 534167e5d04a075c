"""The embedded engine end to end: what websocket clients get against what the engine itself reports.

`python -m bench.embedded_e2e` starts `python -m backend --engine embedded` (tracing on) in its own
process, waits for the model to load, then:

1. one client, one request of n samples (each in `--ns`), `--tokens` new tokens per sample:
   tokens/s the client received (send to `done`) against the engine's own figure over the same
   request, tokens generated / time spent in its decode steps (`tokens`, `steps`, `mean_step_ms`
   from `/health`, read before and after). `client/engine` is what the server, the websocket and
   the time outside steps (prefill, waiting for the next step) cost together; `after 1st` counts
   only from each request's first token to `done` (n first tokens left out), so prefill is not in
   it;
2. U users at once (each in `--users`), one connection and one request of one sample each:
   aggregate tokens/s and per-user time to first token p50/p99 (client side), and the aggregate as
   a multiple of one user's, measured in the same run: continuous batching should raise it well
   above 1.

Both tables alternate nothing (one engine, one machine); rerun for spread. Memory and CPU noise
from other jobs on this machine show up here directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from backend.frames import generate_frame

ROOT = Path(__file__).resolve().parent.parent

from backend.serving.stats import percentile  # noqa: E402
from devkit.frames import recv_frame  # noqa: E402
from devkit.local import LOCAL_LOAD_FLAGS, start_backend, stop_process  # noqa: E402

LOAD_LIMIT_S = 600.0
"""How long the first start may take (it converts the model to a cached safetensors copy)."""


def health(port: int) -> dict[str, Any]:
    """The backend's /health."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.loads(response.read())


def step_seconds(figures: dict[str, Any]) -> float:
    """Seconds the engine has spent in decode steps, from its figures."""
    return figures.get("steps", 0) * figures.get("mean_step_ms", 0.0) / 1000


async def one_user(url: str, index: int, n: int, tokens: int) -> dict[str, float]:
    """One connection, one request; tokens received, seconds to done, and TTFT."""
    request = generate_frame(
        f"e{index}",
        "Write a short poem about the sea.",
        n,
        {"max_tokens": tokens, "temperature": 0.8, "seed": 100 + index * 64},
    )
    received = 0
    first = None
    async with connect(url, max_size=None, open_timeout=60) as ws:
        started = time.monotonic()
        await ws.send(json.dumps(request))
        while True:
            frame = await recv_frame(ws)
            if frame["type"] == "chunk" and frame["tokens"]:
                received += frame["tokens"]
                first = first if first is not None else time.monotonic() - started
            elif frame["type"] == "error":
                raise RuntimeError(frame["message"])
            elif frame["type"] == "done":
                return {"tokens": received, "seconds": time.monotonic() - started, "ttft": first or 0.0}


async def wait_loaded(port: int, process: Any) -> None:
    """Wait until the engine has loaded its model (or failed)."""
    deadline = time.monotonic() + LOAD_LIMIT_S
    while time.monotonic() < deadline:
        figures = await asyncio.to_thread(health, port)
        if figures.get("failed"):
            raise RuntimeError(f"the engine failed to load: {figures['failed']}")
        if not figures.get("loading") and "steps" in figures:
            return
        await asyncio.sleep(1)
    raise TimeoutError("the engine did not load in time")


async def measure(port: int, process: Any, args: argparse.Namespace) -> None:
    """Print both tables."""
    url = f"ws://127.0.0.1:{port}/ws"
    await wait_loaded(port, process)
    await one_user(url, 999, 2, 4)  # warm-up: first-call allocations
    print(f"1. one client; {args.tokens} new tokens per sample")
    print(
        f"{'n':>3}{'client tok/s':>14}{'after 1st tok/s':>17}{'engine tok/s':>14}{'client/engine':>15}"
        f"{'after 1st/engine':>18}"
    )
    for n in (int(x) for x in args.ns.split(",")):
        before = await asyncio.to_thread(health, port)
        result = await one_user(url, 0, n, args.tokens)
        after = await asyncio.to_thread(health, port)
        engine_tokens = after["tokens"] - before["tokens"]
        engine_s = step_seconds(after) - step_seconds(before)
        client = result["tokens"] / result["seconds"]
        engine = engine_tokens / engine_s if engine_s > 0 else float("nan")
        streaming = (result["tokens"] - n) / (result["seconds"] - result["ttft"])
        print(
            f"{n:>3}{client:>14.1f}{streaming:>17.1f}{engine:>14.1f}{client / engine:>15.3f}"
            f"{streaming / engine:>18.3f}",
            flush=True,
        )
    print(f"\n2. U users at once, one sample each; {args.tokens} new tokens")
    print(f"{'users':>6}{'agg tok/s':>11}{'x one user':>12}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}")
    single = None
    for users in (int(x) for x in args.users.split(",")):
        started = time.monotonic()
        results = await asyncio.gather(*(one_user(url, i, 1, args.tokens) for i in range(users)))
        elapsed = time.monotonic() - started
        aggregate = sum(r["tokens"] for r in results) / elapsed
        single = single or aggregate
        ttfts = [1000 * r["ttft"] for r in results]
        print(
            f"{users:>6}{aggregate:>11.1f}{aggregate / single:>12.2f}"
            f"{percentile(ttfts, 50) or 0:>13.0f}{percentile(ttfts, 99) or 0:>13.0f}",
            flush=True,
        )


def main() -> int:
    """Start the embedded backend, measure, stop it."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ns", default="1,8", help="samples per request for table 1")
    parser.add_argument("--users", default="1,4,16", help="simultaneous users for table 2")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per sample")
    args = parser.parse_args()
    process, port = start_backend(["--engine", "embedded", *LOCAL_LOAD_FLAGS], limit_s=LOAD_LIMIT_S)
    try:
        asyncio.run(measure(port, process, args))
    finally:
        stop_process(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Coalescing figures: a stalled reader does not slow the engine, the page updates at a frame rate.

`python -m bench.coalescing` (or `make bench`) starts `python -m backend` on the synthetic engine
in its own process (so the clients here do not share its interpreter) and measures on 127.0.0.1:

1. the same request (n samples, fixed seed, temperature 0, no jitter) read by a client that reads
   as fast as it can (the baseline) and by one that stops reading for a while, as a stalled client
   would: frames received, tokens, and the request's duration measured by the server. Merging in
   the outbox keeps the stalled reader's duration at the baseline's, and its text identical.
2. the UI client's `updates()` at the page's frame rate: page updates per second against
   tokens per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from backend.frames import generate_frame

ROOT = Path(__file__).resolve().parent.parent

from devkit.frames import recv_frame  # noqa: E402
from devkit.local import start_backend, stop_process  # noqa: E402
from ui.client import BackendRun  # noqa: E402
from ui.handlers import UPDATES_PER_S  # noqa: E402


async def read_request(url: str, n: int, max_tokens: int, stall_s: float) -> dict[str, Any]:
    """Run one request, reading nothing for `stall_s` first; what arrived and the server's stats."""
    frames = chunks = tokens = 0
    texts: dict[int, str] = {}
    # No client pings: a stalled reader would not answer the server's either way.
    async with connect(url, max_size=None, ping_interval=None) as ws:
        request = generate_frame("bench", "bench", n, {"max_tokens": max_tokens, "temperature": 0, "seed": 1})
        await ws.send(json.dumps(request))
        await asyncio.sleep(stall_s)
        while True:
            frame = await recv_frame(ws)
            frames += 1
            if frame["type"] == "chunk":
                chunks += 1
                tokens += frame["tokens"]
                texts[frame["index"]] = texts.get(frame["index"], "") + frame["text"]
            elif frame["type"] == "done":
                return {
                    "frames": frames,
                    "chunks": chunks,
                    "tokens": tokens,
                    "texts": texts,
                    "duration_ms": frame["stats"]["duration_ms"],
                }


async def ui_updates(url: str, n: int, max_tokens: int) -> dict[str, float]:
    """Drive the UI's client as the Generate handler does; count page updates."""
    run = BackendRun(url)
    await run.start("bench", n, {"max_tokens": max_tokens, "temperature": 0, "seed": 1})
    started = time.monotonic()
    updates = 0
    async for _view in run.updates(1.0 / UPDATES_PER_S):
        updates += 1
    elapsed = time.monotonic() - started
    tokens = sum(sample.tokens for sample in run.view.samples)
    await run.close()
    return {"updates": updates, "seconds": elapsed, "tokens": tokens}


async def measure(url: str, n: int, max_tokens: int, stall_s: float) -> None:
    """Print the figures (see the module docstring)."""
    fast = await read_request(url, n, max_tokens, 0.0)
    stalled = await read_request(url, n, max_tokens, stall_s)
    ui = await ui_updates(url, n, max_tokens)
    print(f"n={n}, max_tokens={max_tokens}; the stalled reader reads nothing for {stall_s:g} s")
    print(f"{'reader':<16}{'frames':>8}{'chunk frames':>14}{'tokens':>8}{'server ms':>11}")
    for name, r in (("fast (baseline)", fast), ("stalled", stalled)):
        print(f"{name:<16}{r['frames']:>8}{r['chunks']:>14}{r['tokens']:>8}{r['duration_ms']:>11.0f}")
    print(f"stalled/fast server duration: {stalled['duration_ms'] / fast['duration_ms']:.3f}")
    print(
        f"tokens per chunk frame: fast {fast['tokens'] / fast['chunks']:.2f}, "
        f"stalled {stalled['tokens'] / stalled['chunks']:.2f}"
    )
    print(f"stalled reader's text identical to the fast reader's: {stalled['texts'] == fast['texts']}")
    print(
        f"UI: {ui['updates']} page updates in {ui['seconds']:.2f} s = {ui['updates'] / ui['seconds']:.1f}/s "
        f"for {ui['tokens'] / ui['seconds']:.0f} tokens/s (cap {UPDATES_PER_S}/s)"
    )


def main() -> int:
    """Start the backend process, measure, stop it."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=400.0, help="tokens/s per sample")
    parser.add_argument("--stall", type=float, default=3.0, help="seconds the stalled reader reads nothing")
    args = parser.parse_args()
    backend, port = start_backend(["--engine", "synthetic", "--rate", str(args.rate), "--jitter", "0"])
    try:
        asyncio.run(measure(f"ws://127.0.0.1:{port}/ws", args.n, args.max_tokens, args.stall))
    finally:
        stop_process(backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())

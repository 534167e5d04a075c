"""Scaling: how the backend's cost grows with n, and with the number of connections.

`python -m bench.scaling` starts `python -m backend` (synthetic engine, no jitter, tracing on as the
page uses it) in its own process and, at a rate the server keeps up with (`--rate` tokens/s per
sample, ~`--seconds` per run), measures:

1. one connection, one request of n samples, for each n in `--ns`;
2. C connections at once, each one request of `--conn-n` samples, for each C in `--conns`.

For each row, from /proc/PID of the backend: server CPU per chunk (us; each token is one engine
chunk), resident memory above the idle server per sample (KiB), and from the clients: delivered
tokens/s as a ratio of what the engine was asked for (samples x rate), added latency p99 (client
receipt minus the chunk frame's `at`, same host clock). `x cpu/chunk` is the row's CPU per chunk as
a ratio of the first row's, measured in the same run: 1.0 means the cost per chunk does not grow.
Rows run `--rounds` times, alternating; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from websockets.asyncio.client import connect

from backend.frames import generate_frame

ROOT = Path(__file__).resolve().parent.parent

from bench.transport import max_tokens_for, p, process_cpu_s, start_backend, stop  # noqa: E402
from devkit.frames import recv_frame  # noqa: E402
from devkit.memory import PeakRss  # noqa: E402


async def one_request(url: str, index: int, n: int, max_tokens: int, added: list[float]) -> int:
    """One connection, one request; the tokens it received."""
    request = generate_frame(
        f"s{index}", "scaling", n, {"max_tokens": max_tokens, "temperature": 0, "seed": 1}
    )
    tokens = 0
    async with connect(url, max_size=None, open_timeout=60) as ws:
        await ws.send(json.dumps(request))
        while True:
            frame = await recv_frame(ws)
            if frame["type"] == "chunk":
                tokens += frame["tokens"]
                added.append((time.monotonic() - frame["at"]) * 1000)
            elif frame["type"] == "error":
                raise RuntimeError(frame["message"])
            elif frame["type"] == "done":
                return tokens


def measure(url: str, pid: int, connections: int, n: int, rate: float, seconds: float) -> dict[str, float]:
    """One row: `connections` clients at once, each n samples; the backend's cost per chunk and sample."""
    max_tokens = max_tokens_for(rate, seconds)
    added: list[float] = []
    with PeakRss(pid, interval_s=0.05) as memory:
        cpu = process_cpu_s(pid)
        started = time.monotonic()

        async def run_all() -> list[int]:
            return await asyncio.gather(
                *(one_request(url, i, n, max_tokens, added) for i in range(connections))
            )

        tokens = sum(asyncio.run(run_all()))
        elapsed = time.monotonic() - started
        cpu = process_cpu_s(pid) - cpu
    samples = connections * n
    expected_s = max_tokens / rate
    return {
        "cpu_us": 1e6 * cpu / tokens,
        "kib_per_sample": memory.peak / 1024 / samples,
        "delivered": (tokens / elapsed) / (tokens / expected_s),
        "add_p99": p(added, 99),
        "samples": samples,
    }


def table(title: str, url: str, pid: int, rows: list[tuple[int, int]], args: argparse.Namespace) -> None:
    """Measure every (connections, n) row `args.rounds` times, alternating; print medians."""
    results: dict[tuple[int, int], list[dict[str, float]]] = {row: [] for row in rows}
    for _ in range(args.rounds):
        for connections, n in rows:
            results[(connections, n)].append(measure(url, pid, connections, n, args.rate, args.seconds))
    print(f"\n{title}")
    print(
        f"{'conns':>6}{'n':>5}{'samples':>9}{'cpu us/chunk':>14}{'x cpu/chunk':>13}{'KiB/sample':>12}"
        f"{'delivered':>11}{'add p99 ms':>12}"
    )
    first = statistics.median(r["cpu_us"] for r in results[rows[0]])
    for connections, n in rows:
        runs = results[(connections, n)]

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"{connections:>6}{n:>5}{connections * n:>9}{med('cpu_us'):>14.1f}{med('cpu_us') / first:>13.2f}"
            f"{med('kib_per_sample'):>12.1f}{med('delivered'):>11.3f}{med('add_p99'):>12.2f}",
            flush=True,
        )


def main() -> int:
    """Start the backend, print both tables, stop it."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ns", default="1,8,32,64", help="samples per request for table 1")
    parser.add_argument("--conns", default="1,16,64,256", help="connections for table 2")
    parser.add_argument("--conn-n", type=int, default=1, help="samples per request in table 2")
    parser.add_argument("--rate", type=float, default=20.0, help="tokens/s per sample")
    parser.add_argument("--seconds", type=float, default=2.0, help="about how long each run streams")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-trace", action="store_true", help="run the backend with --no-trace")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    conns = [int(x) for x in args.conns.split(",")]
    process, port = start_backend(args.rate, max(ns), trace=not args.no_trace)
    url = f"ws://127.0.0.1:{port}/ws"
    try:
        print(
            f"synthetic engine, {args.rate:g} tok/s per sample, ~{args.seconds:g} s runs, "
            f"tracing {'off' if args.no_trace else 'on'}, {args.rounds} rounds, medians"
        )
        table("1. one connection, n samples", url, process.pid, [(1, n) for n in ns], args)
        table(
            f"2. C connections, {args.conn_n} sample(s) each",
            url,
            process.pid,
            [(c, args.conn_n) for c in conns],
            args,
        )
    finally:
        stop(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())

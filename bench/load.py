"""Load: many websocket clients at once, some cancelling, and nothing lost.

`python -m bench.load` (or `make bench`) starts `python -m backend` on the synthetic engine in its
own process and runs CLIENTS websocket clients at once, each one request of n samples; every
CANCEL_EVERY-th client cancels mid-stream. It checks what the protocol promises and prints:
clients, samples, chunks, lost chunks (text that differs from the engine's deterministic text; must
be 0), p99 chunk latency (from the server getting the chunk from the engine to this client
receiving it, on the host's monotonic clock), server memory and peak, errors.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from backend.serving.stats import percentile  # noqa: E402
from devkit.load import rss_mb, run_load, start_backend  # noqa: E402
from devkit.local import stop_process  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--rate", type=float, default=100.0, help="tokens/s per sample")
    parser.add_argument("--cancel-every", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, to see whether memory stays flat")
    args = parser.parse_args()
    process, url = start_backend(args.rate)
    try:
        print(
            f"{'round':>5}{'clients':>9}{'samples':>9}{'chunks':>9}{'lost':>6}{'p99 lat ms':>12}"
            f"{'rss MB':>8}{'peak MB':>9}{'errors':>8}{'s':>7}"
        )
        for round_index in range(1, args.rounds + 1):
            started = time.perf_counter()
            report = asyncio.run(run_load(url, args.clients, args.n, args.max_tokens, args.cancel_every))
            elapsed = time.perf_counter() - started
            time.sleep(0.5)
            rss, peak = rss_mb(process.pid)
            p99 = percentile(report.latencies_ms, 99) or 0.0
            print(
                f"{round_index:>5}{report.clients:>9}{report.samples:>9}{report.chunks:>9}{report.lost:>6}"
                f"{p99:>12.1f}{rss:>8.1f}{peak:>9.1f}{len(report.errors) + len(report.broken_promises):>8}"
                f"{elapsed:>7.2f}"
            )
            for problem in (report.errors + report.broken_promises)[:5]:
                print("  ", problem)
        print(f"chunk latency p50 {statistics.median(report.latencies_ms):.2f} ms, last round")
    finally:
        stop_process(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent

from backend.engines.synthetic import synthetic_tokens  # noqa: E402
from backend.serving.stats import percentile  # noqa: E402
from devkit.frames import recv_frame  # noqa: E402
from devkit.local import LOCAL_LOAD_FLAGS, stop_process  # noqa: E402
from devkit.local import start_backend as harness_start_backend  # noqa: E402


@dataclass
class LoadReport:
    """What the clients saw, summed."""

    clients: int = 0
    samples: int = 0
    chunks: int = 0
    tokens: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)
    broken_promises: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    cancelled: int = 0


async def one_client(url: str, index: int, n: int, max_tokens: int, cancel: bool, report: LoadReport) -> None:
    """One request; checks one finish per index, then done, and the text against the engine's."""
    seed = 1000 + index * 64
    frame = {
        "type": "generate",
        "id": f"load-{index}",
        "prompt": "load",
        "n": n,
        "trace": False,
        "params": {"max_tokens": max_tokens, "seed": seed, "temperature": 0.8},
    }
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps(frame))
        received = 0
        while True:
            message = await recv_frame(ws)
            now = time.monotonic()
            kind = message["type"]
            if kind == "chunk":
                i = message["index"]
                if i in finishes:
                    report.broken_promises.append(f"client {index}: chunk after finish of {i}")
                texts[i] = texts.get(i, "") + message["text"]
                report.chunks += 1
                report.tokens += message["tokens"]
                # `at` is the server's monotonic clock when the engine produced the chunk
                report.latencies_ms.append((now - message["at"]) * 1000)
                received += 1
                if cancel and received == 10:
                    await ws.send(json.dumps({"type": "cancel", "id": frame["id"]}))
            elif kind == "finish":
                if message["index"] in finishes:
                    report.broken_promises.append(f"client {index}: two finishes for {message['index']}")
                finishes[message["index"]] = message["reason"]
            elif kind == "error":
                report.errors.append(f"client {index}: {message['code']}: {message['message']}")
            elif kind == "done":
                break
    if sorted(finishes) != list(range(n)):
        report.broken_promises.append(f"client {index}: finishes for {sorted(finishes)}")
    for i in range(n):
        expected = "".join(synthetic_tokens(seed + i, max_tokens, 0.8)[0])
        got = texts.get(i, "")
        # an aborted sample is a prefix of its text; any other must be exactly the text
        ok = expected.startswith(got) if finishes.get(i) == "abort" else got == expected
        if not ok:
            report.lost += 1
    report.clients += 1
    report.samples += n
    report.cancelled += int(cancel)


async def run_load(url: str, clients: int, n: int, max_tokens: int, cancel_every: int) -> LoadReport:
    """All clients at once; the summed report."""
    report = LoadReport()
    await asyncio.gather(
        *(
            one_client(url, i, n, max_tokens, cancel_every > 0 and i % cancel_every == 0, report)
            for i in range(clients)
        )
    )
    return report


def rss_mb(pid: int) -> tuple[float, float]:
    """Current and peak resident memory of a process, from /proc (Linux)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def start_backend(rate: float) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m backend` on the synthetic engine, untraced, for many local clients; its URL."""
    process, port = harness_start_backend(
        ["--engine", "synthetic", "--rate", str(rate), "--no-trace", *LOCAL_LOAD_FLAGS]
    )
    return process, f"ws://127.0.0.1:{port}/ws"


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

"""Many websocket clients of one backend at once, each checking what the protocol promises: what
`python -m bench.load` prints and tests/test_reliability.py asserts.

`run_load` runs the clients (every `cancel_every`-th cancelling mid-stream) and sums what they saw in a
`LoadReport`: chunks, tokens, text lost against the synthetic engine's deterministic text, chunk
latencies, errors and broken promises; `start_backend` starts `python -m backend` on the synthetic
engine for them; `rss_mb` reads a process's memory.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import connect

from backend.engines.synthetic import synthetic_tokens
from backend.frames import cancel_frame, encode, generate_frame
from devkit.frames import recv_frame
from devkit.local import LOCAL_LOAD_FLAGS
from devkit.local import start_backend as start_backend_process


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
    params = {"max_tokens": max_tokens, "seed": seed, "temperature": 0.8}
    frame = generate_frame(f"load-{index}", "load", n, params, trace=False)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    async with connect(url, max_size=None) as ws:
        await ws.send(encode(frame))
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
                    await ws.send(encode(cancel_frame(frame["id"])))
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
    process, port = start_backend_process(
        ["--engine", "synthetic", "--rate", str(rate), "--no-trace", *LOCAL_LOAD_FLAGS]
    )
    return process, f"ws://127.0.0.1:{port}/ws"

"""Tracer cost: loop throughput with tracing off and on, and the cost per recorded event.

`python -m bench.trace_overhead` (or `make bench`) runs, on one plain asyncio loop in this process,
the same workload with the tracer off (the baseline) and on (its C step recorder,
backend/trace/step_recorder.c), alternating rounds so both see the same machine noise, and prints the
median throughput traced as a ratio to the untraced one:

- `chunk steps`: 64 tasks, each step doing the backend's real per-chunk work (RequestState.on_chunk,
  Outbox.push, encoding a chunk frame) then `await asyncio.sleep(0)`: the loop serving streams;
- `empty steps`: the same tasks doing nothing but `await asyncio.sleep(0)`: the worst case, where
  the tracer's fixed cost per callback is compared with callbacks that cost almost nothing.

The tracer's own measurement of its cost per event (time spent recording, after each step) is
printed too. Rates are per CPU second of the loop's thread (`time.thread_time()`), not per wall
second, so other processes taking the CPU do not count against either side.

The third table is the per-event cost of the live trace's digest (trace.frames.digest_ring, in C),
on the ring a real in-process backend recorded serving n = 32.

The fourth is the loop the dashboard really runs: two backend processes on the synthetic engine, one
with `--no-trace` and one traced, each serving one websocket client a request of n samples (trace
frames on, as the page asks), in alternating rounds; the last column is the traced backend serving a
request that asks for no trace frames (`"trace": false`): the tracer recording, without the live
panel's frames. Its figure is the backend loop thread's CPU per
1,000 tokens (engine, server and tracer, from the scheduler's count in
/proc/PID/task/PID/schedstat), and `on/off` is the traced backend's tokens per CPU second over the
untraced one's: the loop throughput tracing leaves to the dashboard. The backends start
with the same memory layout and hash seed (devkit.local.same_layout_launch): two untraced
processes started normally differed by 1-3 % in this figure from their layouts alone.

At 500 tok/s per sample the loop is mostly idle, so that figure is the CPU a fixed load costs, not
throughput: it counts the tracer's fixed work per second (a heartbeat wake-up every 20 ms, five live
frames a second) against however few tokens flow. The fifth table is the loop's throughput: the
same backends with the synthetic engine asking far more tokens than the loop can serve
(`--saturated-rate`), so the loop never idles and tokens per loop CPU second is the most it serves;
tok/s is what the client received per wall second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from backend.config.settings import ServerOptions
from backend.engines.synthetic import SyntheticEngine
from backend.frames import encode, generate_frame
from backend.serving.outbox import Outbox
from backend.serving.request import RequestState
from backend.serving.server import BackendServer
from backend.trace.frames import digest_ring
from backend.trace.recorder import LoopTracer
from backend.vocabulary import Chunk, SamplingParams
from bench.transport import run_websocket, start_backend
from devkit.frames import recv_frame
from devkit.local import stop_process

TASKS = 64


async def chunk_worker(steps: int, index: int, outbox: Outbox, state: RequestState) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(steps):
        for frame in state.on_chunk(Chunk(index, " token", 1), loop.time()):
            outbox.push(frame)
            encode(frame)
        if len(outbox) > 256:
            outbox.drain()
        await asyncio.sleep(0)


async def empty_worker(steps: int, index: int, outbox: Outbox, state: RequestState) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


async def one_round(worker: object, steps: int, traced: bool) -> tuple[float, float]:
    """Steps per second of TASKS tasks, traced or not, and the tracer's measured cost per event (ns)."""
    tracer = LoopTracer() if traced else None
    if tracer is not None:
        tracer.install(asyncio.get_running_loop())
    params = SamplingParams(max_tokens=steps + 1, temperature=1.0, top_p=1.0, seed=1)
    state = RequestState("bench", TASKS, params, 0.0)
    outbox = Outbox()
    started = time.thread_time()
    await asyncio.gather(*(worker(steps, i, outbox, state) for i in range(TASKS)))  # type: ignore[operator]
    elapsed = time.thread_time() - started
    cost = 0.0
    if tracer is not None:
        tracer.uninstall()
        cost = tracer.overhead_per_event_ns()
    return TASKS * steps / elapsed, cost


def measure(worker: object, steps: int, rounds: int) -> dict[bool, tuple[float, float]]:
    """Untraced (False) and traced (True): median steps/s and median recording ns."""
    settings = [False, True]
    rates: dict[bool, list[float]] = {s: [] for s in settings}
    costs: dict[bool, list[float]] = {s: [] for s in settings}
    for round_index in range(rounds):
        order = settings if round_index % 2 == 0 else settings[::-1]
        for setting in order:
            rate, cost = asyncio.run(one_round(worker, steps, setting))
            rates[setting].append(rate)
            costs[setting].append(cost)
    return {s: (statistics.median(rates[s]), statistics.median(costs[s])) for s in settings}


def loop_thread_cpu_ns(pid: int) -> int:
    """CPU time of a process's main thread (the backend's loop), in ns, from the scheduler's own
    count (/proc/PID/task/PID/schedstat): the process's tick-based figures were too coarse here."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


TRACED = "traced"
"""The backend table's column for the traced backend with live trace frames asked for (as the page does)."""
RECORDING_ONLY = "traced, no frames"
"""The backend table's column for the traced backend with no live trace frames asked for."""
TRACED_SETTINGS = [TRACED, RECORDING_ONLY]
"""The backend table's traced columns, in order."""


def measure_backend(
    n: int, rate: float, max_tokens: int, rounds: int
) -> tuple[dict[str | None, float], dict[str, float], dict[str | None, float]]:
    """Backend CPU per 1,000 tokens untraced (None), traced with trace frames asked for (TRACED, as
    the page does) and traced with no frames asked for (RECORDING_ONLY), in
    alternating rounds (medians); for each traced setting the median over rounds of that round's
    untraced CPU over its traced CPU (runs of one round are next to each other in time, so this
    ratio is less affected by the machine's load changing over the whole measurement); and each
    setting's median tokens per wall second at the client."""
    traced = TRACED_SETTINGS
    settings: list[str | None] = [None, *traced]
    backends: dict[str | None, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for setting in (None, TRACED):
            backends[setting] = start_backend(rate, n, trace=setting is not None, same_layout=True)
        backends[RECORDING_ONLY] = backends[TRACED]
        results: dict[str | None, list[float]] = {s: [] for s in settings}
        rates: dict[str | None, list[float]] = {s: [] for s in settings}
        for round_index in range(rounds):
            for setting in settings if round_index % 2 == 0 else settings[::-1]:
                backend, port = backends[setting]
                url = f"ws://127.0.0.1:{port}/ws"
                before = loop_thread_cpu_ns(backend.pid)
                frames = setting is not None and setting != RECORDING_ONLY
                run = asyncio.run(run_websocket(url, backend.pid, n, max_tokens, trace=frames))
                results[setting].append((loop_thread_cpu_ns(backend.pid) - before) / 1e3 / run.tokens)
                rates[setting].append(run.tok_s)
    finally:
        for setting in (None, TRACED):
            if setting in backends:
                stop_process(backends[setting][0])
    medians = {s: statistics.median(results[s]) for s in settings}
    paired = {
        s: statistics.median(off / on for off, on in zip(results[None], results[s], strict=True))
        for s in traced
    }
    return medians, paired, {s: statistics.median(rates[s]) for s in settings}


async def _record_backend_ring(rate: float) -> tuple[Sequence[int], list[Any], int, int]:
    """The tracer's ring after an in-process backend served one traced n=32 request."""
    server = BackendServer(SyntheticEngine(rate=rate, jitter=0), ServerOptions(port=0))
    await server.start()
    try:
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            frame = generate_frame("r1", "hi", 32, trace=True)
            frame["params"] = {"max_tokens": 300, "seed": 1}
            await ws.send(json.dumps(frame))
            while (await recv_frame(ws))["type"] != "done":
                pass
        assert server.tracer is not None
        times, items, boundary, _ = server.tracer.raw_since(0)
        return times, items, boundary, server.tracer.origin_ns
    finally:
        await server.close()


def digest_cost(rate: float) -> tuple[int, float]:
    """Events digested and the median ns per event over 5 runs."""
    times, items, boundary, origin = asyncio.run(_record_backend_ring(rate))
    runs = []
    for _ in range(5):
        started = time.thread_time_ns()
        digest_ring(times, items, boundary, origin)
        runs.append((time.thread_time_ns() - started) / len(items))
    return len(items), statistics.median(runs)


def print_backend_table(ns: list[int], rate: float, max_tokens: int, rounds: int, saturated: bool) -> None:
    """The backend table's header and one row per n (`measure_backend`); a saturated loop's table
    also gives tokens per wall second, and CPU to 0.01 ms (it is ~6 ms per 1,000 tokens)."""
    implementations = TRACED_SETTINGS
    width, digits = (33, 2) if saturated else (25, 1)
    print(f"{'':17}" + "".join(f"{name:>{width}}" for name in implementations))
    wall_head = f"{'tok/s':>8}" if saturated else ""
    head = "".join(f"{'ms/1k':>9}{'on/off':>8}{'paired':>8}{wall_head}" for _ in implementations)
    print(f"{'n':<6}{'off ms/1k':>11}{wall_head}{head}")
    for n in ns:
        r, paired, wall = measure_backend(n, rate, max_tokens, rounds)
        cells = "".join(
            f"{r[s]:>9.{digits}f}{r[None] / r[s]:>8.3f}{paired[s]:>8.3f}"
            + (f"{wall[s]:>8.0f}" if saturated else "")
            for s in implementations
        )
        off_wall = f"{wall[None]:>8.0f}" if saturated else ""
        print(f"{n:<6}{r[None]:>11.{digits}f}{off_wall}{cells}")


def main() -> int:
    """Run both workloads and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per task per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32], help="samples per backend request")
    parser.add_argument("--rate", type=float, default=500.0, help="synthetic tokens/s per sample")
    parser.add_argument("--max-tokens", type=int, default=500)
    parser.add_argument(
        "--backend-rounds",
        type=int,
        default=31,
        help="rounds of the backend table: its per-round figures spread widely, and medians of 11 "
        "rounds moved by several per cent from run to run",
    )
    parser.add_argument(
        "--saturated-rate",
        type=float,
        default=50_000.0,
        help="synthetic tok/s per sample of the saturated-loop table, beyond what the loop serves (0: skip)",
    )
    parser.add_argument(
        "--saturated-n",
        type=int,
        nargs="+",
        default=[32, 64],
        help="samples per request of the saturated-loop table (at n = 8 a request lasts ~40 ms here)",
    )
    parser.add_argument(
        "--saturated-tokens", type=int, default=2048, help="max_tokens of the saturated-loop table"
    )
    args = parser.parse_args()
    print(f"{TASKS} tasks x {args.steps} steps, {args.rounds} alternating rounds, medians")
    print(f"{'workload':<14}{'step us':>9}{'off steps/s':>13}{'on/off':>9}{'ns':>7}")
    for name, worker in (("chunk steps", chunk_worker), ("empty steps", empty_worker)):
        r = measure(worker, args.steps, args.rounds)
        off = r[False][0]
        print(f"{name:<14}{1e6 / off:>9.1f}{off:>13.0f}{r[True][0] / off:>9.3f}{r[True][1]:>7.0f}")
    print(f"\nlive-trace digest of a real backend's ring (n=32 at {args.rate:g} tok/s), median of 5")
    events, per_event_ns = digest_cost(args.rate)
    print(f"{events:>8} events {per_event_ns:>8.0f} ns/event")
    print(
        f"\nbackend, synthetic engine at {args.rate:g} tok/s per sample, {args.max_tokens} tokens,"
        f" {args.backend_rounds} alternating rounds, medians; on/off = untraced CPU / traced CPU"
    )
    print("(on/off: of the medians; paired: median of each round's ratio)")
    print_backend_table(args.n, args.rate, args.max_tokens, args.backend_rounds, saturated=False)
    if args.saturated_rate > 0:
        print(
            f"\nbackend, loop saturated: the synthetic engine asks {args.saturated_rate:g} tok/s per"
            f" sample, more than the loop can serve, {args.saturated_tokens} tokens,"
            f" {args.backend_rounds} alternating rounds, medians; on/off = untraced CPU / traced CPU"
            " (the loop's throughput, traced over untraced); tok/s: delivered per wall second"
        )
        print_backend_table(
            args.saturated_n, args.saturated_rate, args.saturated_tokens, args.backend_rounds, saturated=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tracer cost: loop throughput with tracing off and on, and the cost per recorded event.

`python bench/trace_overhead.py` (or `make bench`) runs, on one plain asyncio loop in this process,
the same workload with the tracer off (the baseline) and on, alternating rounds so both see the
same machine noise, and prints the median throughput of each and their ratio:

- `chunk steps`: 64 tasks, each step doing the backend's real per-chunk work (RequestState.on_chunk,
  Outbox.push, encoding a chunk frame) then `await asyncio.sleep(0)`: the loop serving streams;
- `empty steps`: the same tasks doing nothing but `await asyncio.sleep(0)`: the worst case, where
  the tracer's fixed cost per callback is compared with callbacks that cost almost nothing.

The tracer's own measurement of its cost per event (time spent recording, after each step) is
printed too. Rates are per CPU second of the loop's thread (`time.thread_time()`), not per wall
second, so other processes taking the CPU do not count against either side.

The third table is the loop the dashboard really runs: two backend processes on the synthetic engine,
one with `--no-trace`, each serving one websocket client a request of n samples (trace frames on,
as the page asks), in alternating rounds. Its figure is the backend's CPU per 1,000 tokens (engine,
server and tracer, from /proc), and `on/off` is the traced backend's tokens per CPU second over the
untraced one's: the loop throughput tracing leaves to the dashboard.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.engine import Chunk, SamplingParams
from backend.outbox import Outbox
from backend.protocol import encode
from backend.session import RequestState
from backend.trace import LoopTracer
from bench.transport import run_websocket, start_backend
from tests.harness import stop_process

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
    """Steps per second of TASKS tasks, and the tracer's measured cost per event (ns)."""
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


def measure(worker: object, steps: int, rounds: int) -> dict[str, float]:
    off: list[float] = []
    on: list[float] = []
    costs: list[float] = []
    for _ in range(rounds):
        off.append(asyncio.run(one_round(worker, steps, False))[0])
        rate, cost = asyncio.run(one_round(worker, steps, True))
        on.append(rate)
        costs.append(cost)
    off_median, on_median = statistics.median(off), statistics.median(on)
    return {
        "off": off_median,
        "on": on_median,
        "ratio": on_median / off_median,
        "event_ns": statistics.median(costs),
        "step_us_off": 1e6 / off_median,
    }


def measure_backend(n: int, rate: float, max_tokens: int, rounds: int) -> dict[str, float]:
    """Backend CPU per 1,000 tokens without and with tracing, in alternating rounds (medians)."""
    off_backend, off_port = start_backend(rate, n, trace=False)
    try:
        on_backend, on_port = start_backend(rate, n, trace=True)
    except BaseException:
        stop_process(off_backend)
        raise
    off: list[float] = []
    on: list[float] = []
    try:
        for round_index in range(rounds):
            order = [(off_backend, off_port, off), (on_backend, on_port, on)]
            if round_index % 2:
                order.reverse()
            for backend, port, results in order:
                run = asyncio.run(run_websocket(f"ws://127.0.0.1:{port}/ws", backend.pid, n, max_tokens))
                results.append(1e6 * run.cpu_s / run.tokens)
    finally:
        stop_process(off_backend)
        stop_process(on_backend)
    off_ms, on_ms = statistics.median(off), statistics.median(on)
    return {"off": off_ms, "on": on_ms, "ratio": off_ms / on_ms}


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
    parser.add_argument("--backend-rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{TASKS} tasks x {args.steps} steps, {args.rounds} alternating rounds, medians")
    print(
        f"{'workload':<14}{'step us':>9}{'off steps/s':>13}{'on steps/s':>12}{'on/off':>8}{'record ns':>11}"
    )
    for name, worker in (("chunk steps", chunk_worker), ("empty steps", empty_worker)):
        r = measure(worker, args.steps, args.rounds)
        print(
            f"{name:<14}{r['step_us_off']:>9.1f}{r['off']:>13.0f}{r['on']:>12.0f}"
            f"{r['ratio']:>8.3f}{r['event_ns']:>11.0f}"
        )
    print(
        f"\nbackend, synthetic engine at {args.rate:g} tok/s per sample, {args.max_tokens} tokens,"
        f" {args.backend_rounds} alternating rounds, medians"
    )
    print(f"{'n':<6}{'off cpu ms/1k':>15}{'on cpu ms/1k':>14}{'on/off':>8}")
    for n in args.n:
        r = measure_backend(n, args.rate, args.max_tokens, args.backend_rounds)
        print(f"{n:<6}{r['off']:>15.1f}{r['on']:>14.1f}{r['ratio']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

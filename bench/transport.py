"""Transport: what the backend's websocket and the Gradio page add to what the engine costs.

`python -m bench.transport` runs the synthetic engine (no jitter, temperature 0 unless
`--temperature`, a fixed seed: every run of a configuration produces the same tokens) at n samples x
R tokens/s per sample, for about `--seconds` per run, consumed three ways:

- (a) `direct`, the limit: the engine in this process, its stream read with `async for`;
- (b) `websocket`: `python -m backend` in its own process (tracing on, as the page uses it), read by
  a plain websocket client here;
- (c) `gradio`: `python app.py --backend-url` on a backend of its own, read by `gradio_client` as
  the page's `/generate` API (n <= 32, the page's column count).

(a) and (b) alternate, round by round, so both see the same machine noise; the table prints the
medians. Columns:

- `tok/s`, `b/a`: tokens delivered per second of wall time (from sending `generate` to `done`) and
  (b)'s ratio to (a);
- `add p50/p99 ms`: for each chunk frame, `time.monotonic() - frame["at"]` on receipt, where `at` is
  when the server took the chunk from the engine (both clocks are the host's CLOCK_MONOTONIC): all
  the backend adds to a chunk, queueing, encoding, socket and the client's parse;
- `lag p99 ms`: the event loop's lateness, from the heartbeat (20 ms) in the trace frames for (b),
  from a heartbeat of the same interval next to the engine for (a);
- `cpu ms/1k`: CPU time per 1,000 tokens: of this process for (a) (the engine alone), of the
  backend process for (b) (engine, server and tracer, from /proc/PID/stat);
- `frames/s`: websocket frames the client received per second (chunk frames merge when the client
  lags, and trace frames come 10 a second);
- `a first`, `b first` (ms): from the start (sending `generate` for (b)) to the first chunk in the
  consumer's hands; `b tail` (ms): from when the server took the last chunk from the engine to `done`
  received (the 64 finish frames, the request's stats, the last trace frame, the write). Both are
  per request, not per token: at 0.5 s a request, 10 ms of them is 2 % of (b)/(a). (With
  temperature 0 a sample ends at a sentence end after 40 % of max_tokens: `--seconds 1` makes
  requests of about 0.54 s, `--seconds 4` of about 1.6 s.)

`--alternatives` adds a table of what token confidence and its alternatives cost on the wire:
`python -m backend`'s server in a process of its own on `devkit.listing.ListingEngine` (the synthetic
engine that makes up each token's k alternatives from its word list, so the engine costs nothing more), read
by a websocket client as in (b), at n = 8 and 32, with logprobs off, on without alternatives
(`off`), and on with k = 5 and 20, alternating in each round; the bytes of the messages received a
token, `b/a` against (a) as above, and each row's delivery against `off`'s.

For (c): page updates per second, whether every column's final text is exactly the engine's, and
`end ms`: from the backend's `done` frame to the final update reaching `gradio_client`, both on
this host's monotonic clock (the app talks to the backend through `bench.done_relay.DoneRelay`,
which notes when each `done` passes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from backend.frames import generate_frame

ROOT = Path(__file__).resolve().parent.parent

from backend.engines.synthetic import SyntheticEngine, synthetic_tokens  # noqa: E402
from backend.protocol import frames_in  # noqa: E402
from backend.serving.stats import percentile  # noqa: E402
from backend.vocabulary import Prompt, SamplingParams  # noqa: E402
from bench.done_relay import DoneRelay  # noqa: E402
from devkit.frames import recv_frame  # noqa: E402
from devkit.listing import ListingEngine  # noqa: E402
from devkit.local import LOCAL_LOAD_FLAGS, free_port, start_logged, stop_process_group  # noqa: E402
from devkit.local import start_backend as harness_start_backend  # noqa: E402
from devkit.local import stop_process as stop  # noqa: E402

HEARTBEAT_S = 0.02
"""The direct run's lag heartbeat: the backend tracer's interval, so both lag columns compare."""

MAX_TOKENS_CAP = 2048
"""The backend's max_tokens limit: a run is at most this many tokens per sample."""

SEED = 7
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """What one consumer saw of one request."""

    tokens: int
    seconds: float
    frames: int = 0
    added_ms: list[float] | None = None
    lag_ms: list[float] | None = None
    cpu_s: float = 0.0
    first_s: float = 0.0
    """From the start to the first chunk received."""
    tail_s: float = 0.0
    """(b): from the server taking the last chunk to `done` received."""

    @property
    def tok_s(self) -> float:
        """Tokens delivered per second of wall time."""
        return self.tokens / self.seconds


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def max_tokens_for(rate: float, seconds: float) -> int:
    """Tokens per sample for a run of about `seconds` at `rate` tokens/s."""
    return max(1, min(MAX_TOKENS_CAP, round(rate * seconds)))


async def run_direct(n: int, rate: float, max_tokens: int, temperature: float = 0.0) -> Run:
    """(a): the engine's stream read in this process, with a heartbeat measuring loop lag."""
    engine = SyntheticEngine(rate=rate, jitter=0.0)
    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def heartbeat() -> None:
        while True:
            due = loop.time() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)
            lags.append(max(0.0, loop.time() - due) * 1000)

    beat = asyncio.create_task(heartbeat())
    cpu = time.process_time()
    started = time.monotonic()
    generation = engine.generate(
        Prompt("bench", "raw"), n, SamplingParams(max_tokens, temperature, 0.95, SEED)
    )
    tokens = 0
    first = None
    async for chunk in generation:
        tokens += chunk.tokens
        if first is None:
            first = time.monotonic() - started
    seconds = time.monotonic() - started
    cpu = time.process_time() - cpu
    await generation.aclose()
    beat.cancel()
    return Run(tokens, seconds, lag_ms=lags, cpu_s=cpu, first_s=first or 0.0)


async def run_websocket(
    url: str, pid: int, n: int, max_tokens: int, trace: bool = True, temperature: float = 0.0
) -> Run:
    """(b): one request through the backend's websocket, read as fast as this process can; with
    `trace` it asks for live trace frames, as the page does."""
    request = generate_frame(
        "bench", "bench", n, {"max_tokens": max_tokens, "temperature": temperature, "seed": SEED}, trace=trace
    )
    added: list[float] = []
    lags: list[float] = []
    tokens = frames = 0
    first = last_at = 0.0
    async with connect(url, max_size=None) as ws:
        cpu = process_cpu_s(pid)
        started = time.monotonic()
        await ws.send(json.dumps(request))
        while True:
            frame = await recv_frame(ws)
            now = time.monotonic()
            frames += 1
            kind = frame["type"]
            if kind == "chunk":
                tokens += frame["tokens"]
                added.append((now - frame["at"]) * 1000)
                last_at = frame["at"]
                if not first:
                    first = now - started
            elif kind == "trace":
                lags.extend(lag for _, lag in frame["lag"])
            elif kind == "error":
                raise RuntimeError(frame["message"])
            elif kind == "done":
                break
        done_at = time.monotonic()
        seconds = done_at - started
        cpu = process_cpu_s(pid) - cpu
    return Run(tokens, seconds, frames, added, lags, cpu, first, done_at - last_at)


def start_backend(
    rate: float,
    n_max: int,
    trace: bool = True,
    root: Path = ROOT,
    extra: tuple[str, ...] = (),
    same_layout: bool = False,
) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m backend` (from checkout `root`) on the synthetic engine, once `/health` answers;
    `extra` are more of its flags, `same_layout` see devkit.local.same_layout_launch."""
    flags = ["--engine", "synthetic", "--rate", str(rate), "--jitter", "0", "--n-max", str(n_max)]
    flags += [*LOCAL_LOAD_FLAGS, "--max-total-samples", "100000", *extra]
    if not trace:
        flags.append("--no-trace")
    return harness_start_backend(flags, root=root, same_layout=same_layout)


def p(values: list[float] | None, q: float) -> float:
    """Percentile q of values, 0 when there are none."""
    return (percentile(values, q) or 0.0) if values else 0.0


def transport_table(
    ns: list[int],
    rates: list[float],
    seconds: float,
    rounds: int,
    before: Path | None = None,
    temperature: float = 0.0,
) -> None:
    """(a) against (b) for every n x rate, alternating rounds; medians.

    With `before` (another checkout), its backend is read the same way in the same rounds (b0),
    for a before/after comparison of a change to the backend.
    """
    print(
        f"(a) direct vs (b) websocket: {rounds} alternating rounds of ~{seconds:g} s each, medians"
        f", temperature {temperature:g}"
    )
    header = (
        f"{'n':>3}{'tok/s/sample':>13}{'a tok/s':>10}{'b tok/s':>10}{'b/a':>7}{'add p50':>9}{'add p99':>9}"
        f"{'a lag99':>9}{'b lag99':>9}{'a cpu/1k':>10}{'b cpu/1k':>10}{'b frames/s':>12}"
        f"{'a first':>8}{'b first':>8}{'b tail':>7}"
    )
    if before is not None:
        header += f"{'b0/a':>7}{'b0 add99':>10}{'b0 lag99':>10}{'b0 cpu/1k':>11}"
    print(header)
    for rate in rates:
        roots = [ROOT] if before is None else [ROOT, before]
        backends = [start_backend(rate, max(ns), root=root) for root in roots]
        try:
            for n in ns:
                max_tokens = max_tokens_for(rate, seconds)
                direct: list[Run] = []
                sockets: list[list[Run]] = [[] for _ in backends]
                for _ in range(rounds):
                    direct.append(asyncio.run(run_direct(n, rate, max_tokens, temperature)))
                    for runs, (process, port) in zip(sockets, backends, strict=True):
                        url = f"ws://127.0.0.1:{port}/ws"
                        runs.append(
                            asyncio.run(run_websocket(url, process.pid, n, max_tokens, True, temperature))
                        )
                counts = {r.tokens for runs in (direct, *sockets) for r in runs}
                if len(counts) != 1:
                    print(f"  n={n} rate={rate:g}: token counts differ: {sorted(counts)}")
                a = med(direct, lambda r: r.tok_s)
                socket = sockets[0]
                line = (
                    f"{n:>3}{rate:>13g}{a:>10.0f}{med(socket, lambda r: r.tok_s):>10.0f}"
                    f"{med(socket, lambda r: r.tok_s) / a:>7.3f}"
                    f"{med(socket, lambda r: p(r.added_ms, 50)):>9.2f}"
                    f"{med(socket, lambda r: p(r.added_ms, 99)):>9.2f}"
                    f"{med(direct, lambda r: p(r.lag_ms, 99)):>9.2f}"
                    f"{med(socket, lambda r: p(r.lag_ms, 99)):>9.2f}"
                    f"{med(direct, cpu_per_1k):>10.1f}"
                    f"{med(socket, cpu_per_1k):>10.1f}"
                    f"{med(socket, lambda r: r.frames / r.seconds):>12.0f}"
                    f"{med(direct, lambda r: r.first_s * 1000):>8.1f}"
                    f"{med(socket, lambda r: r.first_s * 1000):>8.1f}"
                    f"{med(socket, lambda r: r.tail_s * 1000):>7.1f}"
                )
                if before is not None:
                    old = sockets[1]
                    line += (
                        f"{med(old, lambda r: r.tok_s) / a:>7.3f}"
                        f"{med(old, lambda r: p(r.added_ms, 99)):>10.2f}"
                        f"{med(old, lambda r: p(r.lag_ms, 99)):>10.2f}{med(old, cpu_per_1k):>11.1f}"
                    )
                print(line, flush=True)
        finally:
            for process, _ in backends:
                stop(process)


def med(runs: list[Run], key: Any) -> float:
    """Median of `key` over runs."""
    return statistics.median(key(r) for r in runs)


def cpu_per_1k(run: Run) -> float:
    """CPU milliseconds per 1,000 tokens."""
    return 1e6 * run.cpu_s / run.tokens


# The /generate API's outputs: the sample grid, status, summary, trace (tests/test_gradio_app.py).
SAMPLES = 0


def gradio_table(ns: list[int], rate: float, seconds: float) -> None:
    """(c): `/generate` through the Gradio app, with `gradio_client`."""
    from gradio_client import Client

    backend, backend_port = start_backend(rate, 32)
    relay = DoneRelay(backend_port)
    relay.start()
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    command = [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port)]
    log = Path(tempfile.mkdtemp(prefix="bench-transport-")) / "app.log"
    app = start_logged([*command, "--backend-url", relay.url], log, f"http://127.0.0.1:{port}/", env)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        print(f"\n(c) gradio: /generate through app.py at {rate:g} tok/s per sample, ~{seconds:g} s runs")
        print(
            f"{'n':>3}{'tokens':>8}{'tok/s':>9}{'c/a':>7}{'updates':>9}{'updates/s':>11}{'all text':>10}"
            f"{'end ms':>8}{'app cpu/1k':>12}"
        )
        for n in ns:
            max_tokens = max_tokens_for(rate, seconds)
            direct = asyncio.run(run_direct(n, rate, max_tokens))
            expected = "".join(synthetic_tokens(SEED, max_tokens, 0.0)[0])
            cpu = process_cpu_s(app.pid)
            known = set(relay.done_at)
            started = time.monotonic()
            job = client.submit("bench", n, max_tokens, 0.0, 0.95, SEED, api_name="/generate")
            arrivals: list[float] = []
            outputs: list[Any] = []
            for output in job:
                arrivals.append(time.monotonic())
                outputs.append(output)
            final = job.result(timeout=60)
            seconds_taken = arrivals[-1] - started
            cpu = process_cpu_s(app.pid) - cpu
            texts = [sample["text"] for sample in final[SAMPLES]["samples"]]
            complete = all(text == expected for text in texts)
            tokens = len(synthetic_tokens(SEED, max_tokens, 0.0)[0]) * n
            (request_id,) = set(relay.done_at) - known
            end_ms = (arrivals[-1] - relay.done_at[request_id]) * 1000
            streaming = arrivals[-1] - arrivals[0]
            print(
                f"{n:>3}{tokens:>8}{tokens / seconds_taken:>9.0f}"
                f"{tokens / seconds_taken / direct.tok_s:>7.3f}"
                f"{len(arrivals):>9}{(len(arrivals) - 1) / streaming:>11.1f}{complete!s:>10}{end_ms:>8.0f}"
                f"{1e6 * cpu / tokens:>12.1f}",
                flush=True,
            )
        client.close()
    finally:
        stop_process_group(app)
        relay.stop()
        stop(backend)


def serve_listing(port: int, rate: float, n_max: int) -> None:
    """`python -m backend`'s server (tracing on) on `ListingEngine`, on `port`, until killed."""
    from backend.config.settings import Limits, ServerOptions
    from backend.serving.server import BackendServer

    async def serve() -> None:
        limits = Limits(n_max=n_max, max_total_samples=100000, requests_per_minute=100000)
        server = BackendServer(ListingEngine(rate=rate, jitter=0.0), ServerOptions(limits=limits, port=port))
        await server.start()
        await asyncio.Event().wait()

    asyncio.run(serve())


async def run_listed(url: str, n: int, max_tokens: int, options: dict[str, Any]) -> tuple[Run, int]:
    """One request with `options` (logprobs, alternatives) through the websocket, read as (b) reads:
    what it delivered, and the bytes of the messages it received."""
    params = {"max_tokens": max_tokens, "temperature": 0.0, "seed": SEED}
    request = generate_frame("bench", "bench", n, params, **options)
    tokens = size = frames = 0
    async with connect(url, max_size=None) as ws:
        started = time.monotonic()
        await ws.send(json.dumps(request))
        while True:
            message = await ws.recv()
            size += len(message)
            found = frames_in(message)
            frames += len(found)
            tokens += sum(frame["tokens"] for frame in found if frame["type"] == "chunk")
            if any(frame["type"] == "error" for frame in found):
                raise RuntimeError(str(found))
            if any(frame["type"] == "done" for frame in found):
                break
    return Run(tokens, time.monotonic() - started, frames), size


LISTINGS = {"no logprobs": {}, "off": {"logprobs": True}, "k=5": {"logprobs": True, "alternatives": 5}}
LISTINGS["k=20"] = {"logprobs": True, "alternatives": 20}
"""What the alternatives table compares: logprobs off, on without alternatives, on with k of them."""


def alternatives_table(ns: list[int], rate: float, seconds: float, rounds: int) -> None:
    """Bytes a token and delivery with alternatives on against off, alternating in each round."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "bench.transport",
        "--serve-listing",
        str(port),
        "--gradio-rate",
        str(rate),
    ]
    log = Path(tempfile.mkdtemp(prefix="bench-alternatives-")) / "backend.log"
    backend = start_logged(command, log, f"http://127.0.0.1:{port}/health", dict(os.environ))
    url = f"ws://127.0.0.1:{port}/ws"
    print(f"\nalternatives: {rate:g} tok/s per sample, ~{seconds:g} s runs, {rounds} rounds, medians")
    print(f"{'n':>3}{'listing':>13}{'bytes/tok':>11}{'tok/s':>9}{'b/a':>7}{'vs off':>8}{'frames/s':>10}")
    try:
        for n in ns:
            max_tokens = max_tokens_for(rate, seconds)
            seen: dict[str, list[tuple[Run, int]]] = {name: [] for name in LISTINGS}
            direct: list[Run] = []
            for _ in range(rounds):
                direct.append(asyncio.run(run_direct(n, rate, max_tokens)))
                for name, options in LISTINGS.items():
                    seen[name].append(asyncio.run(run_listed(url, n, max_tokens, options)))
            a = med(direct, lambda r: r.tok_s)
            off = statistics.median(run.tok_s for run, _ in seen["off"])
            for name, runs in seen.items():
                tok_s = statistics.median(run.tok_s for run, _ in runs)
                per_token = statistics.median(size / run.tokens for run, size in runs)
                frames_s = statistics.median(run.frames / run.seconds for run, _ in runs)
                print(
                    f"{n:>3}{name:>13}{per_token:>11.1f}{tok_s:>9.0f}{tok_s / a:>7.3f}{tok_s / off:>8.3f}"
                    f"{frames_s:>10.0f}",
                    flush=True,
                )
    finally:
        stop_process_group(backend)


def main() -> int:
    """Print the (a)/(b) table, then the (c) table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ns", default="1,8,32,64", help="samples per request, comma-separated; empty to skip"
    )
    parser.add_argument("--rates", default="50,500,2000", help="tokens/s per sample, comma-separated")
    parser.add_argument("--seconds", type=float, default=1.0, help="about how long each run streams")
    parser.add_argument("--rounds", type=int, default=3, help="alternating (a)/(b) rounds per row")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="for (a) and (b); above 0 each sample has its own text and length (seeded, so every run "
        "is the same), and samples finish at different times instead of all in one engine step",
    )
    parser.add_argument("--gradio-ns", default="1,8,32", help="n for (c); empty to skip it")
    parser.add_argument("--gradio-rate", type=float, default=500.0)
    parser.add_argument(
        "--before", type=Path, help="another checkout whose backend is measured too, for before/after"
    )
    parser.add_argument(
        "--alternatives",
        default="8,32",
        help="n for the alternatives table (at --gradio-rate); empty to skip it",
    )
    parser.add_argument("--serve-listing", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_listing:
        serve_listing(args.serve_listing, args.gradio_rate, 64)
        return 0
    if args.alternatives:
        ns = [int(x) for x in args.alternatives.split(",")]
        alternatives_table(ns, args.gradio_rate, args.seconds, args.rounds)
    if args.ns:
        ns = [int(x) for x in args.ns.split(",")]
        rates = [float(x) for x in args.rates.split(",")]
        transport_table(ns, rates, args.seconds, args.rounds, args.before, args.temperature)
    if args.gradio_ns:
        gradio_table([int(x) for x in args.gradio_ns.split(",")], args.gradio_rate, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

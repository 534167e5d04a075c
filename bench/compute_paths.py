"""Whole decode steps of the bundled model on each compute path, one thread, and where a step's time goes.

For each path (compute.py), set up as the engine's process sets it up (`child.build_scheduler` with
`--compute PATH`: its row counts timed and checked, its weights in their form), n rows of a row
cache in the scheduler's dtype prefilled with one 40-token prompt, then decode steps of
`Llama.decode`; per n the median step of --steps
(after two warm-up steps), the time inside the linear layers (the matrices' `product`) and outside
them, and tokens/s of decode alone (n / step). The engine line's label says which row counts the
path settled on; `auto` (in --paths) runs the start-up probe and prints what it timed, in how long,
and which path it took, then that path's steps.

With `--take-over ROWS`, `int8-exact`'s two ways of summing (its C part and `torch._int_mm`, the
same values) over a decode step's matrices at each row count instead (int8.TIMED_SHAPES, best of
three each), and where `int8.take_over` hands rows to `_int_mm` in this process: what the take-over
gains, where it takes over.

With `--alternatives`, each n also times what token confidence adds to the step on that step's
logits (`scheduler.token_logprobs`, the fastest of --steps): the drawn tokens' logprobs alone
(`off`), and with k = 5 and 20 alternatives a token; `step+k/off` is the step's fastest with those
alternatives against with logprobs alone.

Usage: python -m bench.compute_paths [--paths int8-exact,bf16-torch,fp32-blocks] [--ns 1,8,32]
                                     [--steps 10] [--take-over 32,48,64,128,256,512] [--alternatives]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from types import SimpleNamespace
from typing import Any

import torch

from backend.engines.embedded import int8
from backend.engines.embedded.child import build_scheduler
from backend.engines.embedded.compute import PATHS, unavailable
from backend.engines.embedded.formats import MATRICES
from backend.engines.embedded.linear import kernel_status
from backend.engines.embedded.row_cache import RowCache
from backend.engines.embedded.scheduler import CACHE_DTYPE, BatchScheduler, DecodeParams, token_logprobs
from backend.engines.embedded.weights import resolve_model
from backend.engines.embedded.worker import WorkerSetup
from bench.embedded_vs_vllm import cpu_words


class _Timed:
    """A weight matrix whose products add their seconds to `clock.seconds`."""

    def __init__(self, weight: Any, clock: ProductClock) -> None:
        self.weight, self.clock = weight, clock

    def product(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.weight.product(*args, **kwargs)
        finally:
            self.clock.seconds += time.perf_counter() - started


class ProductClock:
    """Time a model's linear layers take: while entered, every matrix of `llama` adds its products'
    wall time to `seconds` (the matrices are put back on exit)."""

    def __init__(self, llama: Any) -> None:
        self.llama, self.seconds = llama, 0.0

    def __enter__(self) -> ProductClock:
        for layer in self.llama.layers:
            for name in MATRICES:
                setattr(layer, name, _Timed(getattr(layer, name), self))
        self.llama.lm_head = _Timed(self.llama.lm_head, self)
        return self

    def __exit__(self, *exc: object) -> None:
        for layer in self.llama.layers:
            for name in MATRICES:
                setattr(layer, name, getattr(layer, name).weight)
        self.llama.lm_head = self.llama.lm_head.weight


def scoring_us(scheduler: BatchScheduler, logits: torch.Tensor, k: int, count: int) -> float:
    """The fastest of `count` calls of `token_logprobs` on a step's logits (microseconds), every row
    asking for logprobs and, with `k`, that many alternatives."""
    params = DecodeParams(8, 0.8, 0.95, seed=1, logprobs=True, alternatives=k)
    rows: Any = [SimpleNamespace(job=SimpleNamespace(params=params))] * logits.shape[0]
    tokens = logits.argmax(-1).tolist()
    token_logprobs(logits, tokens, rows, scheduler.token_text)  # the tokens' texts decoded once
    best = math.inf
    for _ in range(count):
        started = time.perf_counter()
        token_logprobs(logits, tokens, rows, scheduler.token_text)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def alternatives_line(scheduler: BatchScheduler, logits: torch.Tensor, whole: list[float], count: int) -> str:
    """What logprobs alone and k = 5 and 20 alternatives take on a step's logits, against its fastest."""
    off, k5, k20 = (scoring_us(scheduler, logits, k, count) for k in (0, 5, 20))
    fastest = min(whole) * 1e6
    return (
        f"    fastest step {fastest / 1e3:.1f} ms; logprobs off {off:6.0f} us, k=5 {k5:6.0f} us, "
        f"k=20 {k20:6.0f} us; step+k/off: k=5 {(fastest + k5) / (fastest + off):.3f}, "
        f"k=20 {(fastest + k20) / (fastest + off):.3f}"
    )


def steps(name: str, ns: list[int], count: int, alternatives: bool = False) -> None:
    """Print one path's steps at each of `ns` rows."""
    folder = resolve_model()
    setup = WorkerSetup(str(folder.path), name, 1, max(ns), 512, str(folder.gguf or ""))
    started = time.perf_counter()
    scheduler = build_scheduler(setup, lambda: None)
    loaded = time.perf_counter() - started
    llama = scheduler.model
    print(
        f"{scheduler.compute['label']}: {scheduler.compute['weight_bytes'] / 1e6:.0f} MB of weights"
        f", loaded in {loaded:.1f} s ({scheduler.compute['why']})",
        flush=True,
    )
    for n in ns:
        cache = RowCache(llama.config, n, 512, CACHE_DTYPE)
        llama.prefill(list(range(100, 140)), cache, cache.add_rows(n))
        tokens = torch.full((n,), 5, dtype=torch.long)
        whole, inside = [], []
        with torch.inference_mode(), ProductClock(llama) as clock:
            for step in range(count + 2):
                clock.seconds = 0.0
                started = time.perf_counter()
                logits = llama.decode(tokens, cache)
                if step >= 2:
                    whole.append(time.perf_counter() - started)
                    inside.append(clock.seconds)
        step_s, linear_s = statistics.median(whole), statistics.median(inside)
        print(
            f"  n = {n:2d}: step {step_s * 1e3:6.1f} ms, linear layers {linear_s * 1e3:6.1f} ms, "
            f"outside them {(step_s - linear_s) * 1e3:5.1f} ms, {n / step_s:6.1f} tok/s",
            flush=True,
        )
        if alternatives:
            print(alternatives_line(scheduler, logits, whole, count), flush=True)


def take_over(rows_list: list[int]) -> None:
    """Print `int8-exact`'s C part against `torch._int_mm` over a step's matrices at each row count."""
    found = int8.take_over()
    print(f"int8 products: {int8.describe()}", flush=True)
    if found.exact is False:
        print("torch._int_mm is not exact here: the C part takes every row count", flush=True)
        return
    generator = torch.Generator().manual_seed(0)
    matrices = [(int8.stand_in(shape, generator), count) for shape, count in int8.TIMED_SHAPES]
    for rows in rows_list:
        c_part = int_mm = 0.0
        for matrix, count in matrices:
            x = torch.randn(rows, matrix.shape[1], generator=generator)
            c_part += count * int8.shortest(3, matrix.c_product, x)
            int_mm += count * int8.shortest(3, matrix.int_mm_product, x)
        taker = "C part" if rows <= found.c_max_rows else "torch._int_mm"
        print(
            f"  {rows:4d} rows: C part {c_part * 1e3:7.1f} ms, torch._int_mm {int_mm * 1e3:7.1f} ms "
            f"({c_part / int_mm:.2f}x), taken by the {taker}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", default="int8-exact,bf16-torch,fp32-blocks")
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--take-over", default="", help="row counts to time int8's two sums at")
    parser.add_argument("--alternatives", action="store_true", help="also time the logprobs and alternatives")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"CPU: {cpu_words()}; torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}",
        flush=True,
    )
    if args.take_over:
        take_over([int(rows) for rows in args.take_over.split(",")])
        return
    ns = [int(n) for n in args.ns.split(",")]
    for name in args.paths.split(","):
        if name == "auto":
            steps(name, ns, args.steps, args.alternatives)
            continue
        why = unavailable(PATHS[name], kernel_status(), True, int8.available())
        if why is not None:
            print(f"{name}: does not run here ({why})", flush=True)
            continue
        steps(name, ns, args.steps, args.alternatives)


if __name__ == "__main__":
    main()

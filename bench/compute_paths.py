"""Whole decode steps of the bundled model on each compute path, one thread, and where a step's time goes.

For each path (compute.py), set up as the engine's process sets it up (`child.build_scheduler` with
`--compute PATH`: its row counts timed and checked, its weights in their form), n rows of a row
cache in the scheduler's dtype prefilled with one 40-token prompt, then decode steps of
`Llama.decode`; per n the median step of --steps
(after two warm-up steps), the time inside the linear layers (`linear`, `linear_add`) and outside
them, and tokens/s of decode alone (n / step). The engine line's label says which row counts the
path settled on; `auto` (in --paths) runs the start-up probe and prints what it timed, in how long,
and which path it took, then that path's steps.

With `--alternatives`, each n also times what token confidence adds to the step on that step's
logits (`scheduler.token_logprobs`, the fastest of --steps): the drawn tokens' logprobs alone
(`off`), and with k = 5 and 20 alternatives a token; `step+k/off` is the step's fastest with those
alternatives against with logprobs alone.

Usage: python -m bench.compute_paths [--paths int8-exact,int4-torch,bf16-torch,fp32-blocks] [--ns 1,8,32]
                                     [--steps 10] [--alternatives]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from backend.engines.embedded import decode_ops, int4, int8, model
from backend.engines.embedded import linear as engine_linear
from backend.engines.embedded.child import build_scheduler
from backend.engines.embedded.compute import PATHS, unavailable
from backend.engines.embedded.model import RowCache
from backend.engines.embedded.scheduler import CACHE_DTYPE, BatchScheduler, DecodeParams, token_logprobs
from backend.engines.embedded.weights import resolve_model
from backend.engines.embedded.worker import WorkerSetup
from bench.embedded_vs_vllm import cpu_words


def _timed(op: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return op(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    return timed


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
    spent = [0.0]
    plain = model.linear, model.linear_add
    model.linear, model.linear_add = _timed(plain[0], spent), _timed(plain[1], spent)
    try:
        for n in ns:
            cache = RowCache(llama.config, n, 512, CACHE_DTYPE)
            llama.prefill(list(range(100, 140)), cache, cache.add_rows(n))
            tokens = torch.full((n,), 5, dtype=torch.long)
            whole, inside = [], []
            with torch.inference_mode():
                for step in range(count + 2):
                    spent[0] = 0.0
                    started = time.perf_counter()
                    logits = llama.decode(tokens, cache)
                    if step >= 2:
                        whole.append(time.perf_counter() - started)
                        inside.append(spent[0])
            step_s, linear_s = statistics.median(whole), statistics.median(inside)
            print(
                f"  n = {n:2d}: step {step_s * 1e3:6.1f} ms, linear layers {linear_s * 1e3:6.1f} ms, "
                f"outside them {(step_s - linear_s) * 1e3:5.1f} ms, {n / step_s:6.1f} tok/s",
                flush=True,
            )
            if alternatives:
                off, k5, k20 = (scoring_us(scheduler, logits, k, count) for k in (0, 5, 20))
                fastest = min(whole) * 1e6
                print(
                    f"    fastest step {fastest / 1e3:.1f} ms; logprobs off {off:6.0f} us, k=5 {k5:6.0f} us, "
                    f"k=20 {k20:6.0f} us; step+k/off: k=5 {(fastest + k5) / (fastest + off):.3f}, "
                    f"k=20 {(fastest + k20) / (fastest + off):.3f}",
                    flush=True,
                )
    finally:
        model.linear, model.linear_add = plain
        engine_linear.configure()
        decode_ops.configure()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--paths", default="int8-exact,int4-torch,bf16-torch,fp32-blocks")
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--alternatives", action="store_true", help="also time the logprobs and alternatives")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"CPU: {cpu_words()}; torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}",
        flush=True,
    )
    ns = [int(n) for n in args.ns.split(",")]
    for name in args.paths.split(","):
        if name == "auto":
            steps(name, ns, args.steps, args.alternatives)
            continue
        why = unavailable(
            PATHS[name], engine_linear.kernel_status(), True, int4.available(), int8.available()
        )
        if why is not None:
            print(f"{name}: does not run here ({why})", flush=True)
            continue
        steps(name, ns, args.steps, args.alternatives)


if __name__ == "__main__":
    main()

"""Decode steps of the bundled model with the decode ops (decode_ops.c) against the PyTorch step.

For each row count n: n rows, a third each of three chat prompts (the rows at different lengths),
prefilled, then decode steps two ways in alternating rounds, each round from the same cache length:
the engine's step (`Llama.decode` on decode_ops: RMSNorm, rotary embedding with the cache write,
attention over each row's own positions and the SiLU-gated product as one C call each) and the
PyTorch step (`Llama.decode` with decode_ops turned off: the same ops as PyTorch ops, one row at
a time, as where the C part is not built). Both
multiply on the rows kernel from the GGUF's blocks, fp32, one thread. Prints the median step each
way, the speed-up, and the time each step spends outside its linear layers (the step's wall time
minus the matrices' products within it). Run it on a quiet machine.

Usage: python -m bench.decode_ops [--ns 1,8,32] [--rounds 6] [--steps 8] [--context 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from backend.engines.embedded import decode_ops
from backend.engines.embedded.formats import Form
from backend.engines.embedded.linear import kernel_status
from backend.engines.embedded.model import Llama
from backend.engines.embedded.quantized import load_blocks
from backend.engines.embedded.row_cache import RowCache
from backend.engines.embedded.weights import LlamaConfig, read_config, read_tensors, resolve_model
from bench.compute_paths import ProductClock

TEXTS = ["Name three colours.", "Why is the sky blue?", "Write a haiku about rain."]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--context", type=int, default=100, help="decode steps taken before timing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"linear layers: {kernel_status()[1]}")
    if not decode_ops.usable():
        raise SystemExit("the decode ops are not usable here (C part not built, or no AVX2/FMA)")
    from transformers import AutoTokenizer

    from backend.engines.base import template_token_ids

    folder = resolve_model()
    config = LlamaConfig.from_hf(read_config(folder.path))
    tensors = read_tensors(folder.path)
    model = Llama.from_tensors(
        config, tensors, Form("blocks"), load_blocks(folder.path, folder.gguf, tensors)
    )
    tokenizer = AutoTokenizer.from_pretrained(folder.path)
    ids = [template_token_ids(tokenizer, [{"role": "user", "content": t}]) for t in TEXTS]
    print(
        f"decode steps of {folder.name}, fp32, 1 thread, rows of {len(TEXTS)} prompts "
        f"({', '.join(str(len(i)) for i in ids)} tokens) after {args.context} decode steps; ms per step, "
        f"median of {args.rounds} rounds of {args.steps} steps each way"
    )
    ways = {"decode ops": True, "PyTorch step": False}
    for rows in (int(n) for n in args.ns.split(",")):
        cache = RowCache(config, rows, 1024, torch.float32)
        for index in range(rows):
            model.prefill(ids[index % len(ids)], cache, cache.add_rows(1))
        tokens = torch.full((rows,), int(ids[0][-1]))
        for _ in range(args.context):
            tokens = model.decode(tokens, cache).argmax(-1)
        start_lengths = cache.lengths.clone()
        times: dict[str, list[float]] = {way: [] for way in ways}
        inside: dict[str, list[float]] = {way: [] for way in ways}
        for round_ in range(args.rounds + 1):
            for way, on in ways.items():
                decode_ops.configure(allow=on)
                cache.lengths.copy_(start_lengths)
                with ProductClock(model) as clock:
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        model.decode(tokens, cache)
                    elapsed = time.perf_counter() - start
                if round_:  # the first round warms up
                    times[way].append(1000 * elapsed / args.steps)
                    inside[way].append(1000 * (elapsed - clock.seconds) / args.steps)
        decode_ops.configure()
        ours, theirs = (statistics.median(times[way]) for way in ways)
        rest_ours, rest_theirs = (statistics.median(inside[way]) for way in ways)
        print(
            f"n = {rows:>2}: decode ops {ours:6.1f} ms, PyTorch step {theirs:6.1f} ms "
            f"({theirs / ours:.2f}x); outside the linear layers {rest_ours:5.1f} "
            f"against {rest_theirs:5.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""The embedded engine's decode matmuls, one thread, in the weight layouts PyTorch's CPU build offers.

A decode step of n rows multiplies [n x hidden] by every weight matrix of the model; on a CPU without
native bf16 that is fp32 and most of the step (docs/benchmarks.md). For each of the bundled model's
matrix shapes, fused as the engine fuses them (`LlamaConfig.fused_matrices`; random values: the time
does not depend on them) and each row count, the best of 5 rounds of:

- `F.linear(x, w)`: what the engine does, the weight as stored ([out x in]);
- `torch.mm(x, w_t)`: the weight transposed once into a contiguous [in x out] copy;
- oneDNN: the weight converted once by `torch.utils.mkldnn.to_mkldnn` (an `MkldnnLinear`);
- MKL packed: the weight packed once for this row count (`torch.ops.mkl._mkl_reorder_linear_weight`,
  the op inductor's weight prepacking uses; shown only where this build has it);
- rows kernel: the engine's own AVX2 kernel for few rows (linear.BlockWeight on float32 weights),
  the weight as stored; shown where its C part is built and the CPU has AVX2 and FMA;
- bf16 `F.linear`: input and weight in bfloat16 (oneDNN's kernels; native on AVX-512-BF16 and AMX);
- int8 weight-only: `torch.ops.aten._weight_int8pack_mm`, the weight rounded to int8 with a scale
  per output row, float32 input;
- int4 weight-only: `torch.ops.aten._weight_int4pack_mm_for_cpu` (what torchao's int4 weight-only
  CPU layout calls), the weight in 4-bit groups of 32 with a scale and zero each, float32 input.

The last three are shown where this torch build has them; their differences from `F.linear` include
their rounding of the weight.

Each column also prints the largest difference from `F.linear`'s result. With `--blocks`, the rows
kernel on the bundled model's own GGUF blocks (packed as the engine packs them: layer 0's fused
matrices and the output layer) at each row count, in microseconds and GFLOP/s (2 x rows x weights
per call), beside what a one-thread `torch.mm` of 1024 x 1024 float32 matrices reaches just before
and after (this machine's speed moves within minutes). Then whole decode steps of
the bundled model (`--steps`): n rows prefilled with one prompt, then decode steps with the engine's
linear layers on the rows kernel from the GGUF's Q4_1/Q8_0 blocks (what the engine runs), on the
rows kernel from the float32 weights, and on `F.linear`, in alternating rounds, each round from the
same cache length; the median step of each and its speed-up over `F.linear`. The ops between the
linear layers run as PyTorch ops in all three (`python -m bench.decode_ops` times the engine's C
ops for them against those). Run it on a quiet machine: the same shape measured minutes apart can
move by more than the columns differ.

Usage: python -m bench.matmul_layouts [--rows 1,8,32] [--rounds 5] [--blocks 1,8,32] [--steps 1,8,32]
                                      [--step-rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils import mkldnn

from backend.engines.embedded import decode_ops
from backend.engines.embedded import linear as engine_linear
from backend.engines.embedded.formats import FLOAT32, Form
from backend.engines.embedded.model import Llama
from backend.engines.embedded.quantized import load_blocks
from backend.engines.embedded.row_cache import RowCache
from backend.engines.embedded.weights import (
    LlamaConfig,
    ModelFolder,
    read_config,
    read_tensors,
    resolve_model,
)

INT4_GROUP = 32
"""Weights per scale and zero in the int4 layout (the GGUF's Q4_1 blocks hold 32 too)."""


def best_us(call: Callable[[], torch.Tensor], rounds: int, calls: int) -> float:
    """Microseconds per call: the best of `rounds` rounds of `calls` calls, after one warm-up call."""
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best


def layouts(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Each way of computing x @ w.T, its weight prepared once."""
    w_t = w.t().contiguous()
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    onednn = mkldnn.to_mkldnn(torch.nn.Sequential(linear))[0]
    found = {
        "F.linear": lambda: F.linear(x, w),
        "mm(x, w_t)": lambda: torch.mm(x, w_t),
        "oneDNN": lambda: onednn(x),
    }
    mkl = getattr(torch.ops, "mkl", None)
    if mkl is not None and hasattr(mkl, "_mkl_reorder_linear_weight"):
        packed = mkl._mkl_reorder_linear_weight(w, x.shape[0])
        found["MKL packed"] = lambda: mkl._mkl_linear(x, packed, w, None, x.shape[0])
    if engine_linear.kernel_status()[0] and x.shape[0] <= engine_linear.KERNEL_MAX_ROWS:
        kernel = engine_linear.BlockWeight(w.contiguous(), None)
        found["rows kernel"] = lambda: kernel.product(x)
    found.update(library_kernels(x, w))
    return found


def library_kernels(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """x @ w.T in bf16 and through PyTorch's weight-only int8 and int4 CPU kernels, each weight
    converted once; a kernel this build lacks is left out."""
    found: dict[str, Callable[[], torch.Tensor]] = {}
    x_bf16, w_bf16 = x.to(torch.bfloat16), w.to(torch.bfloat16)
    found["bf16 F.linear"] = lambda: F.linear(x_bf16, w_bf16)
    aten = torch.ops.aten
    if hasattr(aten, "_weight_int8pack_mm"):
        scales = w.abs().amax(1).clamp(min=1e-12) / 127
        w_int8 = torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8)
        found["int8 weight-only"] = lambda: aten._weight_int8pack_mm(x, w_int8, scales)
    if hasattr(aten, "_weight_int4pack_mm_for_cpu") and w.shape[1] % INT4_GROUP == 0:
        out, inner = w.shape
        groups = w.reshape(out, inner // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = (high - low).clamp(min=1e-12) / 15
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        packed = aten._convert_weight_to_int4pack_for_cpu(q.reshape(out, inner), 8)
        # each weight is (q - 8) * scale + zero: zero is the group's middle
        scales_zeros = torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous()
        int4_mm = aten._weight_int4pack_mm_for_cpu
        found["int4 weight-only"] = lambda: int4_mm(x, packed, INT4_GROUP, scales_zeros)
    return found


def matmul_rate(dtype: str = "float32", rounds: int = 5) -> float:
    """Single-core multiply-add rate in FLOP/s: the best of `rounds` `torch.mm` of two 1024 x 1024
    matrices of `dtype`, one thread (MKL's or oneDNN's GEMM, close to the core's peak)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(1024, 1024).to(getattr(torch, dtype))
        return 2 * 1024**3 / (best_us(lambda: torch.mm(a, a), rounds, 1) / 1e6)
    finally:
        torch.set_num_threads(threads)


def block_rates(folder: ModelFolder, config: LlamaConfig, rows_list: list[int], rounds: int) -> None:
    """The rows kernel on the bundled model's packed GGUF blocks: microseconds and GFLOP/s per
    matrix and row count, beside torch.mm's rate."""
    tensors = read_tensors(folder.path)
    model = Llama.from_tensors(
        config, tensors, Form("blocks"), load_blocks(folder.path, folder.gguf, tensors)
    )
    layer = model.layers[0]
    matrices = {name: getattr(layer, name) for name in ("qkv", "out", "gate_up", "down")}
    matrices["output"] = model.lm_head
    before = matmul_rate(rounds=rounds) / 1e9
    print(f"GGUF blocks in the rows kernel; torch.mm 1024^3 before: {before:.0f} GFLOP/s")
    for rows in rows_list:
        cells = []
        for name, matrix in matrices.items():
            dense, kind = matrix.dense, matrix.blocks.kind if matrix.blocks is not None else "float32"
            x = torch.randn(rows, dense.shape[1])
            calls = max(2, int(3e6 // dense.numel()))
            us = best_us(lambda: matrix.product(x), rounds, calls)  # noqa: B023
            gflops = 2 * rows * dense.numel() / us / 1e3
            cells.append(f"{name} {dense.shape[0]}x{dense.shape[1]} {kind} {us:7.0f} us {gflops:4.1f}")
        print(f"rows {rows:>2}  " + "  ".join(cells) + "  (us per call, GFLOP/s)", flush=True)
    print(f"torch.mm 1024^3 after: {matmul_rate(rounds=rounds) / 1e9:.0f} GFLOP/s")


def decode_steps(
    folder: ModelFolder, config: LlamaConfig, rows_list: list[int], rounds: int, steps: int = 8
) -> None:
    """Median decode step of the bundled model at each row count: the rows kernel from the GGUF's
    blocks and from float32 weights, against F.linear."""
    from transformers import AutoTokenizer

    from backend.engines.base import template_token_ids

    tensors = read_tensors(folder.path)
    blocks = load_blocks(folder.path, folder.gguf, tensors) if folder.gguf else {}
    models = {
        "GGUF blocks": Llama.from_tensors(config, tensors, Form("blocks"), blocks),
        "rows kernel": Llama.from_tensors(config, tensors, Form("blocks")),
        "F.linear": Llama.from_tensors(config, tensors, FLOAT32),
    }
    if not blocks:
        del models["GGUF blocks"]
    # The ops between the linear layers as PyTorch ops in all three: they differ only in how they multiply.
    decode_ops.configure(allow=False)
    tokenizer = AutoTokenizer.from_pretrained(folder.path)
    text = "Name three colours and say something about each."
    ids = template_token_ids(tokenizer, [{"role": "user", "content": text}])
    print(
        f"decode steps of {folder.name}, fp32, 1 thread, a {len(ids)}-token prompt; ms per step "
        f"(median of {rounds} rounds of {steps} steps each way): the rows kernel from the GGUF's "
        "blocks, from float32 weights, and F.linear"
    )
    for rows in rows_list:
        caches = {}
        for name, model in models.items():
            caches[name] = RowCache(config, rows, 1024, torch.float32)
            model.prefill(ids, caches[name], caches[name].add_rows(rows))
        tokens = torch.full((rows,), int(ids[-1]))
        times: dict[str, list[float]] = {name: [] for name in models}
        for round_ in range(rounds + 1):
            for name, model in models.items():
                cache = caches[name]
                cache.lengths[:rows] = len(ids)
                start = time.perf_counter()
                for _ in range(steps):
                    model.decode(tokens, cache)
                if round_:  # the first round warms up
                    times[name].append(1000 * (time.perf_counter() - start) / steps)
        medians = {name: statistics.median(values) for name, values in times.items()}
        base = medians["F.linear"]
        print(
            f"n = {rows:>2}: "
            + ", ".join(f"{name} {ms:6.1f} ms ({base / ms:.2f}x)" for name, ms in medians.items()),
            flush=True,
        )
    decode_ops.configure()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", default="1,8,32", help="row counts of the per-matrix table ('' for none)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--blocks", default="1,8,32", help="row counts of the blocks' table ('' for none)")
    parser.add_argument("--steps", default="1,8,32", help="row counts of whole decode steps ('' for none)")
    parser.add_argument("--step-rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"linear layers: {engine_linear.kernel_status()[1]}")
    folder = resolve_model()
    config = LlamaConfig.from_hf(read_config(folder.path))
    print(f"torch {torch.__version__}, 1 thread, fp32; microseconds per call (best of {args.rounds} rounds)")
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",") if r):
            for name, (out, inner) in config.fused_matrices().items():
                w = torch.randn(out, inner) * 0.02
                x = torch.randn(rows, inner)
                reference = F.linear(x, w)
                calls = max(2, int(3e6 // (out * inner)))
                cells = []
                for label, call in layouts(x, w).items():
                    us = best_us(call, args.rounds, calls)
                    diff = (call().float() - reference).abs().max().item()
                    cells.append(f"{label} {us:9.0f} (diff {diff:.0e})")
                print(f"rows {rows:>2}  {name:<24} {out:>5} x {inner:<4}  " + "  ".join(cells), flush=True)
        if args.blocks and folder.gguf:
            block_rates(folder, config, [int(r) for r in args.blocks.split(",")], args.rounds)
        if args.steps:
            decode_steps(folder, config, [int(r) for r in args.steps.split(",")], args.step_rounds)


if __name__ == "__main__":
    main()

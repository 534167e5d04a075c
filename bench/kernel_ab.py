"""The rows kernel of this checkout against its build at another git revision, in one process.

For whoever changes `backend/engines/embedded/rows_linear.c`: the machines these figures come from
are noisy (the same call measured minutes apart moves by more than most changes gain), so both
builds run side by side, call for call. `python -m bench.kernel_ab --baseline REV` extracts revision
REV of the repository into a temporary folder, builds its C parts there (`setup.py build_ext`), and
loads that build's `_rows_linear` beside this checkout's. Each of the bundled model's matrices (one
layer's four, fused as the engine fuses them, and the output layer, from the GGUF's blocks) is packed
by each build's own `pack` (the two may lay the blocks out differently) and multiplied by each
build's `linear_packed`, the two alternating, best of --rounds, at each row count (a decode step of
n samples multiplies n rows). Where the two builds' products are not equal bit for bit, the figure
says DIFFER.

Prints microseconds per call, baseline / this checkout, and the ratio (above 1: this checkout is
faster), then the linear layers of a whole decode step (the model's layers times their four
matrices, and the output layer) the same way.

Usage: python -m bench.kernel_ab --baseline REV [--rows 1,2,4,8,16,32] [--rounds 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from backend.engines.embedded import linear as engine_linear
from backend.engines.embedded.formats import fused_blocks
from backend.engines.embedded.quantized import PANEL_ROWS, BlockMatrix, load_blocks
from backend.engines.embedded.weights import LlamaConfig, read_config, read_tensors, resolve_model

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "backend/engines/embedded/_rows_linear"


def build_baseline(revision: str, folder: Path) -> ModuleType:
    """Revision `revision`'s `_rows_linear`, built in `folder`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    build = [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"]
    subprocess.run(build, cwd=folder, check=True, capture_output=True)
    built = sorted(folder.glob(f"{KERNEL}*.so"))
    if not built:
        raise SystemExit(f"revision {revision} built no rows kernel")
    spec = importlib.util.spec_from_file_location("baseline._rows_linear", built[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def packed(module: ModuleType, matrix: BlockMatrix) -> torch.Tensor:
    """`matrix`'s blocks as `module`'s `pack` lays them out."""
    groups = -(-matrix.out_features // PANEL_ROWS)
    data = torch.empty(groups, PANEL_ROWS * matrix.data.shape[1], dtype=torch.uint8)
    module.pack(data.data_ptr(), matrix.data.data_ptr(), matrix.code, matrix.out_features, matrix.in_features)
    return data


def race(
    modules: list[ModuleType], matrix: BlockMatrix, weights: list[torch.Tensor], rows: int, rounds: int
) -> tuple[list[float], bool]:
    """Each module's best seconds for one product of `rows` rows by `matrix` (`weights`: its blocks
    as each module packed them), called in turn, and whether their products are equal bit for bit."""
    x = torch.randn(rows, matrix.in_features)
    outputs = [torch.empty(rows, matrix.out_features) for _ in modules]
    best = [float("inf")] * len(modules)
    for _ in range(rounds):
        for i, module in enumerate(modules):
            started = time.perf_counter()
            module.linear_packed(
                outputs[i].data_ptr(),
                x.data_ptr(),
                weights[i].data_ptr(),
                matrix.code,
                rows,
                matrix.out_features,
                matrix.in_features,
            )
            best[i] = min(best[i], time.perf_counter() - started)
    return best, all(torch.equal(outputs[0], other) for other in outputs[1:])


def main() -> None:
    """Parse the flags, build the baseline, print both tables."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--baseline", required=True, help="a git revision to compare with")
    parser.add_argument("--rows", default="1,2,4,8,16,32", help="row counts")
    parser.add_argument("--rounds", type=int, default=30, help="calls of each build per figure")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the engine runs the kernel
    usable, reason = engine_linear.kernel_status()
    if not usable:
        raise SystemExit(f"the rows kernel cannot run here: {reason}")
    from backend.engines.embedded import _rows_linear

    torch.manual_seed(0)
    folder = resolve_model()
    if folder.gguf is None:
        raise SystemExit("the model has no GGUF blocks to multiply from")
    config = LlamaConfig.from_hf(read_config(folder.path))
    blocks = load_blocks(folder.path, folder.gguf, read_tensors(folder.path))
    matrices = fused_blocks(blocks, 0)
    matrices["output"] = blocks["model.embed_tokens.weight"]  # tied: the output layer multiplies it
    rows_list = [int(r) for r in args.rows.split(",") if r]
    with tempfile.TemporaryDirectory() as temporary:
        baseline = build_baseline(args.baseline, Path(temporary))
        modules = [baseline, _rows_linear]
        print(f"rows kernel: {args.baseline} / this checkout, microseconds per call (best of {args.rounds})")
        step = {rows: [0.0, 0.0] for rows in rows_list}
        for name, matrix in matrices.items():
            weights = [packed(module, matrix) for module in modules]
            cells = []
            for rows in rows_list:
                (old, new), same = race(modules, matrix, weights, rows, args.rounds)
                times = config.layers if name != "output" else 1
                step[rows][0] += old * times
                step[rows][1] += new * times
                cell = f"{rows:>2}: {old * 1e6:6.0f}/{new * 1e6:<6.0f} {old / new:.2f}x"
                cells.append(cell + ("" if same else " DIFFER"))
            shape = f"{matrix.out_features}x{matrix.in_features} {matrix.kind}"
            print(f"{name:<9} {shape:<17} " + "  ".join(cells), flush=True)
        totals = [f"{rows}: {a * 1e3:.1f}/{b * 1e3:.1f} {a / b:.2f}x" for rows, (a, b) in step.items()]
        print("a decode step's linear layers, ms: " + "  ".join(totals))


if __name__ == "__main__":
    main()

"""The embedded engine's compute paths (compute.py) and the sampler's batch invariance, without a model."""

from __future__ import annotations

import time

import pytest
import torch

from backend.engines.embedded import compute
from backend.engines.embedded.compute import PATHS, decide, probe
from backend.engines.embedded.sampler import RowSampling, sample
from ui.engine_info import engine_line

KERNEL_ON = (True, "rows kernel (AVX2) up to 64 rows, PyTorch beyond")
KERNEL_OFF = (False, "PyTorch (the rows kernel's C part is not built)")


def test_only_the_rows_kernel_paths_are_batch_invariant() -> None:
    assert {name for name, path in PATHS.items() if path.batch_invariant} == {"fp32-blocks", "fp32-rows"}
    assert PATHS["bf16-torch"].dtype == "bfloat16"


def test_auto_times_the_batch_invariant_paths_it_can_run() -> None:
    both = decide("auto", KERNEL_ON, has_gguf=True)
    assert [path.name for path in both.candidates] == ["fp32-blocks", "fp32-rows"]
    no_gguf = decide("auto", KERNEL_ON, has_gguf=False)
    assert no_gguf.path.name == "fp32-rows" and not no_gguf.candidates


def test_auto_without_the_kernel_runs_pytorch_and_says_why() -> None:
    decision = decide("auto", KERNEL_OFF, has_gguf=True)
    assert decision.path.name == "fp32-torch" and not decision.path.batch_invariant
    assert "no batch-invariant path" in decision.reason and "C part is not built" in decision.reason


def test_a_forced_path_that_cannot_run_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="C part is not built"):
        decide("fp32-blocks", KERNEL_OFF, has_gguf=True)
    with pytest.raises(ValueError, match="did not come from a GGUF"):
        decide("fp32-blocks", KERNEL_ON, has_gguf=False)
    with pytest.raises(ValueError, match="must be one of auto, fp32-blocks"):
        decide("float16", KERNEL_ON, has_gguf=True)
    assert decide("bf16-torch", KERNEL_OFF, has_gguf=False).path.name == "bf16-torch"


def test_the_probe_keeps_the_path_that_measured_fastest() -> None:
    slow, fast = PATHS["fp32-rows"], PATHS["fp32-blocks"]

    def step(path: compute.ComputePath, rows: int) -> None:
        time.sleep((0.004 if path is slow else 0.0005) * rows / 8)

    chosen, times = probe((slow, fast), step, rows=(1, 8), repeats=2)
    assert chosen is fast and times["fp32-rows"] > times["fp32-blocks"]
    assert "fastest batch-invariant path" in compute.probe_reason(chosen, times)


def test_the_engine_line_names_the_path_and_warns_where_samples_vary_with_load() -> None:
    health = {"engine": "embedded", "model": "SmolLM2", "compute_path": "fp32-blocks", "compute_why": "auto"}
    invariant = engine_line({**health, "batch_invariant": True})
    assert "compute **fp32-blocks**" in invariant and "may change with load" not in invariant
    varying = engine_line({**health, "compute_path": "bf16-torch", "batch_invariant": False})
    assert "seeded samples may change with load" in varying
    assert "compute" not in engine_line({"engine": "synthetic", "model": "synthetic"})


def _rows(n: int, seed: int, top_k: int = 0, top_p: float = 0.9) -> list[RowSampling]:
    return [RowSampling(0.8, top_p, top_k, torch.Generator().manual_seed(seed + i)) for i in range(n)]


def test_a_rows_draw_does_not_depend_on_the_rows_beside_it() -> None:
    """A row whose nucleus fits its 256 candidates, sampled alone and beside a flat row (whose
    nucleus does not: it is drawn from a full sort), draws the same token every time."""
    torch.manual_seed(0)
    differ = 0
    for trial in range(300):
        peaked = torch.randn(1, 4096) * 4
        flat = torch.zeros(1, 4096)
        alone = sample(peaked, _rows(1, trial))
        beside = sample(torch.cat([peaked, flat, peaked]), _rows(1, trial) + _rows(2, 10_000 + trial))
        differ += alone[0] != beside[0]
    assert differ == 0


def test_top_k_one_is_greedy_at_any_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 1000) * 3
    logits[3] = 0.0  # a flat row beside them
    greedy = logits.argmax(-1).tolist()
    rows = [RowSampling(0.8, 1.0, 1, torch.Generator().manual_seed(i)) for i in range(6)]
    picked = sample(logits, rows)
    assert [p for i, p in enumerate(picked) if i != 3] == [g for i, g in enumerate(greedy) if i != 3]

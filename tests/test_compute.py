"""The embedded engine's compute paths (compute.py), without a model."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from backend.engines.embedded import compute
from backend.engines.embedded.compute import PATHS, Choice, decide, probe
from ui.engine_info import engine_line

KERNEL_ON = (True, "rows kernel (AVX2) up to 64 rows, PyTorch beyond")
KERNEL_OFF = (False, "PyTorch (the rows kernel's C part is not built)")
INT8_OFF = (False, "the int8 products' C part is not built")


def test_the_rows_kernel_is_batch_invariant_as_it_is_and_a_library_path_at_a_block() -> None:
    assert list(PATHS) == ["int8-exact", "fp32-blocks", "bf16-torch"]
    assert {name for name, path in PATHS.items() if Choice(path).batch_invariant} == {
        "fp32-blocks",
        "int8-exact",
    }
    assert Choice(PATHS["int8-exact"]).step_rows(17) == [17] and Choice(PATHS["int8-exact"]).sizes == ()
    assert Choice(PATHS["bf16-torch"], 16).batch_invariant and not Choice(PATHS["bf16-torch"]).batch_invariant
    assert Choice(PATHS["bf16-torch"], 16).label == "bf16-torch/16"
    assert Choice(PATHS["bf16-torch"], 8).step_rows(17) == [8, 8, 8]
    assert Choice(PATHS["fp32-blocks"]).step_rows(17) == [17]
    assert PATHS["bf16-torch"].dtype == "bfloat16" and PATHS["bf16-torch"].form == "library"
    laddered = Choice(PATHS["bf16-torch"], 32, laddered=True)
    assert laddered.label == "bf16-torch/1-32" and laddered.sizes == (1, 2, 4, 8, 16, 32)
    assert laddered.step_rows(1) == [1] and laddered.step_rows(3) == [4] and laddered.step_rows(17) == [32]
    assert laddered.step_rows(70) == [32, 32, 8] and laddered.batch_invariant
    assert compute.ladder(24) == (1, 2, 4, 8, 16, 24) and compute.ladder(1) == (1,)


def _labels(options: tuple[Choice, ...]) -> list[str]:
    return [option.label for option in options]


def test_auto_times_every_path_it_can_run_the_library_one_at_each_block() -> None:
    both = decide("auto", KERNEL_ON, has_gguf=True, blocks=(8, 32), ladders=False)
    assert _labels(both.options) == ["int8-exact", "fp32-blocks", "bf16-torch/32", "bf16-torch/8"]
    laddered = decide("auto", KERNEL_ON, has_gguf=True)  # the engine's own blocks: at most four options
    assert _labels(laddered.options) == ["int8-exact", "fp32-blocks", "bf16-torch/1-32", "bf16-torch/1-8"]
    no_gguf = decide("auto", KERNEL_ON, has_gguf=False, blocks=(8,), ladders=False, int8=INT8_OFF)
    assert _labels(no_gguf.options) == ["bf16-torch/8"]
    # int8-exact needs no block: forced, nothing to time or check
    assert decide("int8-exact", KERNEL_ON, has_gguf=True).options == ()
    forced = decide("bf16-torch", KERNEL_ON, has_gguf=True, blocks=(8, 16))
    assert (
        _labels(forced.options) == ["bf16-torch/1-16", "bf16-torch/1-8"]
        and forced.reason == "set by --compute"
    )
    assert _labels(decide("bf16-torch", KERNEL_ON, has_gguf=True, blocks=(1,)).options) == ["bf16-torch/1"]
    assert decide("fp32-blocks", KERNEL_ON, has_gguf=True).options == ()
    with pytest.raises(ValueError, match="at least 1 row"):
        decide("auto", KERNEL_ON, has_gguf=True, blocks=(0,))


def test_auto_without_the_kernel_times_the_library_path() -> None:
    decision = decide("auto", KERNEL_OFF, has_gguf=True, blocks=(16,))
    assert _labels(decision.options) == ["int8-exact", "bf16-torch/1-16"]


def test_a_forced_path_that_cannot_run_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="C part is not built"):
        decide("fp32-blocks", KERNEL_OFF, has_gguf=True)
    with pytest.raises(ValueError, match="did not come from a GGUF"):
        decide("fp32-blocks", KERNEL_ON, has_gguf=False)
    with pytest.raises(ValueError, match="--compute int8-exact cannot run here: the int8 products' C part"):
        decide("int8-exact", KERNEL_ON, has_gguf=True, int8=INT8_OFF)
    with pytest.raises(
        ValueError, match="must be one of auto, int8-exact, fp32-blocks, bf16-torch, got 'float16'"
    ):
        decide("float16", KERNEL_ON, has_gguf=True)
    assert decide("bf16-torch", KERNEL_OFF, has_gguf=False).choice.path.name == "bf16-torch"


@pytest.mark.parametrize("removed", ["fp32-rows", "fp32-torch", "int4-torch"])
def test_a_removed_path_is_refused_naming_the_paths_that_remain(removed: str) -> None:
    with pytest.raises(
        ValueError,
        match=f"--compute {removed} is no longer offered .*auto, int8-exact, fp32-blocks, bf16-torch",
    ):
        decide(removed, KERNEL_ON, has_gguf=True)


def _step(costs: dict[str, float]) -> Callable[[Choice, int], float]:
    """A step whose time is costs[label] per row (a block path: per block), as a sample reports it."""

    def step(option: Choice, rows: int) -> float:
        return costs[option.label] * rows

    return step


def test_the_probe_keeps_the_fastest_option_over_its_rows() -> None:
    kernel, small, large = (
        Choice(PATHS["fp32-blocks"]),
        Choice(PATHS["bf16-torch"], 8),
        Choice(PATHS["bf16-torch"], 32),
    )
    costs = {"fp32-blocks": 1.0, "bf16-torch/8": 0.1, "bf16-torch/32": 0.02}
    # A token's time at 1, 8 and 32 rows, summed: the kernel 1 + 1 + 1; blocks of 8 (0.8 each):
    # 0.8 + 0.8 / 8 + 3.2 / 32 = 1.0; blocks of 32 (0.64): 0.64 + 0.64 / 8 + 0.64 / 32 = 0.74.
    timed: list[tuple[str, int]] = []

    def step(option: Choice, rows: int) -> float:
        timed.append((option.label, rows))
        return _step(costs)(option, rows)

    found = probe((kernel, small, large), step, lambda option: [], rows=(1, 8, 32), repeats=1)
    assert found.choice == large and found.failed == []
    assert found.times["bf16-torch/32"] == pytest.approx(0.74)
    # Each timed at 1 row first (the kernel 1, blocks of 8 0.8, of 32 0.64), then the fastest there
    # whole: past its 0.74 by 10 % the kernel is left at 1 row, blocks of 8 at 8 rows (0.8 + 0.1).
    assert timed == [("fp32-blocks", 1), ("bf16-torch/8", 8), ("bf16-torch/32", 32)]
    assert found.unfinished == {"fp32-blocks", "bf16-torch/8"}
    assert found.times["fp32-blocks"] == pytest.approx(1.0)
    assert found.times["bf16-torch/8"] == pytest.approx(0.9)
    # Whichever row count is timed first, the same choice.
    assert probe((kernel, small, large), _step(costs), lambda option: [], rows=(8, 1, 32)).choice == large
    reason = compute.probe_reason("auto", found, 0.4)
    assert reason.startswith("auto: the fastest batch-invariant path here (bf16-torch/32 740 ms against")
    assert "blocks of 32 rows checked row by row" in reason and "in 0.40 s" in reason


def test_the_probe_leaves_an_option_once_it_is_slower_and_never_checks_it() -> None:
    fast, slow = Choice(PATHS["bf16-torch"], 32), Choice(PATHS["bf16-torch"], 8)
    steps: list[tuple[str, int]] = []
    checked: list[str] = []

    def step(option: Choice, rows: int) -> float:
        steps.append((option.label, rows))
        return {"bf16-torch/32": 1.0, "bf16-torch/8": 5.0}[option.label]

    def check(option: Choice) -> list[str]:
        checked.append(option.label)
        return []

    found = probe((fast, slow), step, check, rows=(1, 8, 32), repeats=1)
    assert found.choice == fast and found.unfinished == {"bf16-torch/8"}
    assert steps == [("bf16-torch/32", 32), ("bf16-torch/8", 8)] and checked == ["bf16-torch/32"]
    assert "bf16-torch/8 >5000" in compute.probe_reason("auto", found, 0.1)


def test_a_block_that_fails_its_check_gives_way_to_the_next_fastest() -> None:
    kernel, block = Choice(PATHS["fp32-blocks"]), Choice(PATHS["bf16-torch"], 8)
    costs = {"fp32-blocks": 1.0, "bf16-torch/8": 0.1}

    def check(option: Choice) -> list[str]:
        return ["576 x 576 float32: 5 rows differ"]

    found = probe((kernel, block), _step(costs), check, rows=(1, 8))
    assert found.choice == kernel
    assert found.failed == ["bf16-torch/8 failed its check (576 x 576 float32: 5 rows differ)"]
    assert "bf16-torch/8 failed its check" in compute.probe_reason("auto", found, 0.1)
    alone = probe((block,), _step(costs), check, rows=(1, 8))
    assert alone.choice is None and len(alone.failed) == 1


def test_a_block_left_unfinished_is_checked_where_every_faster_one_failed() -> None:
    """fp32 in blocks of 8 is fastest but fails its check (as with MKL held to AVX2 on an AMX Xeon);
    blocks of 16, left once slower than it, are then checked and taken."""
    small, large = Choice(PATHS["bf16-torch"], 8), Choice(PATHS["bf16-torch"], 16)
    costs = {"bf16-torch/8": 1.0, "bf16-torch/16": 3.0}

    def check(option: Choice) -> list[str]:
        return ["960 x 576 float32: 5 rows differ"] if option.block == 8 else []

    found = probe((small, large), _step(costs), check, rows=(1, 8))
    assert found.unfinished == {"bf16-torch/16"} and found.choice == large
    assert found.failed == ["bf16-torch/8 failed its check (960 x 576 float32: 5 rows differ)"]


def test_a_ladder_times_each_row_count_it_calls_once_and_says_what_was_checked() -> None:
    """A ladder's steps are its products at the sizes it calls (1 row alone; 8 and 32 as blocks),
    each size timed once per path and shared with the block alone, whose step of 1 row is a padded
    block."""
    ladder, block = Choice(PATHS["bf16-torch"], 8, laddered=True), Choice(PATHS["bf16-torch"], 8)
    timed: list[int] = []

    def step(option: Choice, rows: int) -> float:
        timed.append(rows)
        return 1.0 + rows

    found = probe((ladder, block), step, lambda option: [], rows=(1, 8, 32), repeats=1)
    assert sorted(timed) == [1, 8]
    # A token's time: the ladder 2 / 1 + 9 / 8 + 36 / 32; the block alone 9 at 1 row, past it: left.
    assert found.times == {"bf16-torch/1-8": 2.0 + 9 / 8 + 36 / 32, "bf16-torch/8": 9.0}
    assert found.unfinished == {"bf16-torch/8"}
    assert found.choice == ladder
    assert "products of 1/2/4/8 rows checked row by row" in compute.probe_reason("auto", found, 0.1)


def test_the_engine_line_names_the_path_and_warns_where_samples_vary_with_load() -> None:
    health = {"engine": "embedded", "model": "SmolLM2", "compute_path": "fp32-blocks", "compute_why": "auto"}
    invariant = engine_line({**health, "batch_invariant": True})
    assert "compute **fp32-blocks**" in invariant and "may change with load" not in invariant
    varying = engine_line({**health, "compute_path": "bf16-torch", "batch_invariant": False})
    assert "seeded samples may change with load" in varying
    assert "compute" not in engine_line({"engine": "synthetic", "model": "synthetic"})


def test_options_within_the_tie_margin_are_taken_in_order_and_the_engine_line_says_so() -> None:
    """Times within TIE of the fastest are a tie, settled by the options' order (the same path at
    every start on a busy machine); outside it the fastest wins."""
    kernel, library = Choice(PATHS["fp32-blocks"]), Choice(PATHS["bf16-torch"], 32, laddered=True)

    def steps(costs: dict[str, float]) -> Callable[[Choice, int], float]:
        return lambda option, rows: costs[option.label]

    near = steps({"fp32-blocks": 1.05, "bf16-torch/1-32": 1.0})
    found = probe((kernel, library), near, lambda option: [], rows=(32,))
    assert found.choice == kernel and found.unfinished == set()
    assert "first in order of those within 10% of the fastest" in compute.probe_reason("auto", found, 0.1)
    far = steps({"fp32-blocks": 1.2, "bf16-torch/1-32": 1.0})
    found = probe((kernel, library), far, lambda option: [], rows=(32,))
    assert found.choice == library and "first in order" not in compute.probe_reason("auto", found, 0.1)
    # A faster tie that fails its check gives way to the next, and the line does not call it a tie.
    found = probe((library, kernel), near, lambda option: ["differs"], rows=(32,))
    assert found.choice == kernel and "first in order" not in compute.probe_reason("auto", found, 0.1)


def test_a_ladder_that_fails_its_check_gives_way_to_its_block_alone_ranked_by_its_time() -> None:
    """fp32 at 1 row takes another kernel than at 4 or more (MKL's on the AMX Xeon): the ladder fails,
    its block alone is timed then and taken where it is still faster than the rest."""
    ladder, kernel = Choice(PATHS["bf16-torch"], 16, laddered=True), Choice(PATHS["fp32-blocks"])
    costs = {1: 0.5, 16: 2.0}

    def step(option: Choice, rows: int) -> float:
        return costs[rows] if option.block else 3.0 * rows

    def check(option: Choice) -> list[str]:
        return ["960 x 576 float32: rows differ (5 at 2 rows)"] if option.laddered else []

    found = probe((ladder, kernel), step, check, rows=(1, 16))
    # A token's time: the ladder 0.5 + 2 / 16; the block alone 2 + 2 / 16; the kernel 3 at 1 row, left.
    assert found.choice == Choice(PATHS["bf16-torch"], 16) and found.unfinished == {"fp32-blocks"}
    assert found.times == {"bf16-torch/1-16": 0.625, "fp32-blocks": 3.0, "bf16-torch/16": 2.125}
    assert found.failed == ["bf16-torch/1-16 failed its check (960 x 576 float32: rows differ (5 at 2 rows))"]
    # Where the ladder is slower than the kernel it is never checked, and its block never timed.
    slow = {1: 0.5, 16: 200.0}
    found = probe(
        (ladder, kernel), lambda option, rows: slow[rows] if option.block else 3.0 * rows, check, (1, 16)
    )
    assert found.choice == kernel and "bf16-torch/16" not in found.times and found.failed == []

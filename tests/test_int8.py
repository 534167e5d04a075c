"""The int8-exact path's parts (int8.py, int8_rows.c): rows turned and rounded one by one, int8
products summed exactly by each of the C part's kernels that this CPU runs and by `torch._int_mm`,
and a row's values the same at every row count and in every slot; the engine-level invariance runs
in test_fixed_rows.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from backend.engines.embedded import int8
from backend.engines.embedded.int8 import Int8Matrix, rotate_quantize

pytestmark = pytest.mark.skipif(not int8.available()[0], reason=int8.available()[1])

KERNELS = ("avx2", "avx512-vnni")
"""The C part's kernels on x86: each runs where the CPU has it, forced by `kernel`."""


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest, monkeypatch: Any) -> str:
    """Each of the C part's kernels in turn, as `int8.kernel()` (skipped where this CPU lacks it)."""
    if request.param not in int8.kernels():
        pytest.skip(f"this CPU does not run the {request.param} kernel (it runs {int8.kernels()})")
    monkeypatch.setattr(int8, "kernel", lambda: request.param)
    monkeypatch.setattr(int8, "kernel_number", lambda: int8.kernels().index(request.param))
    return request.param


def _exact(matrix: Int8Matrix, x: torch.Tensor) -> torch.Tensor:
    """What the product must give: the int8 rows times the steps summed in int64, times the row's
    scale, rounded, times the weight row's, rounded."""
    q, row_scales = rotate_quantize(x)
    n, k = matrix.shape
    steps = matrix.packed.permute(0, 2, 1, 3).reshape(-1, k)[:n]
    return (q.long() @ steps.long().t()).float() * row_scales[:, None] * matrix.scales


@pytest.mark.parametrize("k", [64, 576, 1536])
def test_the_products_are_the_exact_integer_sums_at_the_largest_steps(
    k: int, kernel: str, monkeypatch: Any
) -> None:
    """Rows and weights whose turned values are all of one magnitude (a unit vector in each group
    turns into +-1/8 everywhere: every step +-127, the largest sums there are), of both signs, beside
    random ones, a weight count that is not whole groups of four (10): the C part's kernel at every
    row count (in tiles of eight rows and a tile's remainder), and `_int_mm` where it is exact, give
    the int64 sums, scaled; added into a residual, each value as `residual + product` rounds it."""
    generator = torch.Generator().manual_seed(k)
    unit = torch.zeros(k)
    unit[::64] = 1.0
    weight = torch.randn(10, k, generator=generator)
    weight[0], weight[1] = unit, -unit
    matrix = Int8Matrix.quantize(weight, int_mm=int8.int_mm_exact())
    assert matrix.packed.shape == (3, k // 32, 4, 32)
    for rows in (1, 2, 5, 8, 9, 16, 17, 33):
        x = torch.randn(rows, k, generator=generator)
        x[0], x[-1] = unit * 3, -unit
        assert torch.equal(matrix.c_product(x), _exact(matrix, x)), rows
        residual = torch.randn(rows, 10, generator=generator)
        added = residual.clone()
        matrix.c_product_into(added, x, add=True)  # a residual connection: each value rounded once
        assert torch.equal(added, residual + _exact(matrix, x)), rows
        if matrix.steps is not None:
            assert torch.equal(matrix.int_mm_product(x), _exact(matrix, x)), rows
    for limit in (0, 8):  # the products on either side of where _int_mm takes over
        monkeypatch.setattr(int8, "c_max_rows", lambda limit=limit: limit)
        x = torch.randn(17, k, generator=generator)
        assert torch.equal(matrix.product(x), _exact(matrix, x))


def test_rows_are_turned_and_rounded_each_alone_and_multiply_as_their_weights() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 576, generator=generator) * 0.05
    weight[:, 7] *= 40  # an outlying column, as the model's activations have
    matrix = Int8Matrix.quantize(weight)
    assert matrix.shape == (384, 576)
    kept = 384 * 576 if matrix.steps is not None else 0
    assert matrix.nbytes == 384 * 576 + kept + 384 * 4 + 384 * 4  # steps, scales, sums of steps
    assert (matrix.dequantize() - weight).norm() / weight.norm() < 0.01
    x = torch.randn(9, 576, generator=generator)
    x[:, 3] *= 50
    q, scales = rotate_quantize(x)
    for row in range(9):
        alone_q, alone_scale = rotate_quantize(x[row : row + 1])
        assert torch.equal(alone_q[0], q[row]) and torch.equal(alone_scale[0], scales[row])
    reference = x @ weight.t()
    assert (matrix.product(x) - reference).norm() / reference.norm() < 0.02
    with pytest.raises(ValueError, match="not whole groups of 64"):
        rotate_quantize(torch.randn(2, 100))


def test_a_rows_values_are_the_same_at_every_row_count_and_slot(kernel: str, monkeypatch: Any) -> None:
    """Row counts 1 to 40, with the C part taking up to 16 of them and `_int_mm` more where it is
    exact, the row in every slot beside random rows of two scales and zeros: the same bits as the
    row alone."""
    monkeypatch.setattr(int8, "c_max_rows", lambda: 16)
    generator = torch.Generator().manual_seed(2)
    matrix = Int8Matrix.quantize(
        torch.randn(960, 576, generator=generator) * 0.05, int_mm=int8.int_mm_exact()
    )
    row = torch.randn(576, generator=generator)
    alone = matrix.product(row[None])[0]
    for rows in range(1, 41):
        for scale in (1.0, 100.0, 0.0):
            x = torch.randn(rows, 576, generator=generator) * scale
            slots = range(rows) if rows <= 8 else (0, rows // 2, rows - 1)
            for slot in slots:
                x[slot] = row
            out = matrix.product(x)
            assert all(torch.equal(out[slot], alone) for slot in slots), (rows, scale)


def test_a_saturating_int_mm_is_found_and_the_c_part_takes_every_row(monkeypatch: Any) -> None:
    """Where `_int_mm` adds products in 16 bits (oneDNN's AVX2 kernel: the rows shifted to unsigned
    bytes, pairs of products summed with saturation, the shift taken off after), the check at start
    finds it, and every row count goes to the C part: the same sums as the exact ones."""
    real = torch._int_mm

    def saturating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        shifted = a.long()[:, :, None] + 128
        pairs = (shifted * b.long()[None, :, :]).reshape(a.shape[0], -1, 2, b.shape[1])
        sums = pairs.sum(2).clamp(-32768, 32767).sum(1) - 128 * b.long().sum(0)
        return sums.to(torch.int32)

    int8.int_mm_exact.cache_clear()
    int8.take_over.cache_clear()
    monkeypatch.setattr(torch, "_int_mm", saturating)
    try:
        assert not int8.int_mm_exact()
        assert int8.c_max_rows() > 1000
        assert f"by the C part's {int8.kernel()} kernel" in int8.describe()
        generator = torch.Generator().manual_seed(3)
        matrix = Int8Matrix.quantize(torch.randn(64, 576, generator=generator))
        assert matrix.steps is None  # not kept where _int_mm is not used
        x = torch.randn(12, 576, generator=generator)
        assert torch.equal(matrix.product(x), _exact(matrix, x))
    finally:
        monkeypatch.setattr(torch, "_int_mm", real)
        int8.int_mm_exact.cache_clear()
        int8.take_over.cache_clear()


def test_int_mm_faster_but_not_exact_at_every_row_count_takes_no_rows(monkeypatch: Any) -> None:
    """An `_int_mm` exact at GLANCE_ROWS but not at some other row count, and faster: the timings
    find it faster, the check at every row count then finds it wrong, and the C part takes every
    row count (the engine line says why); no matrix keeps steps for it."""
    real = torch._int_mm

    def wrong_at_30(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        sums = real(a, b)
        return sums + 1 if a.shape[0] == 30 else sums

    monkeypatch.setattr(torch, "_int_mm", wrong_at_30)
    monkeypatch.setattr(
        int8, "shortest", lambda times, product, x: 0.5 if product.__name__ == "int_mm_product" else 1.0
    )
    int8.int_mm_exact.cache_clear()
    int8.take_over.cache_clear()
    try:
        found = int8.take_over()
        assert (found.c_max_rows, found.timed_rows, found.exact) == (sys.maxsize, 1, False)
        assert "(torch._int_mm is not exact here)" in int8.describe()
        assert Int8Matrix.quantize(torch.randn(8, 576)).steps is None
    finally:
        monkeypatch.setattr(torch, "_int_mm", real)
        int8.int_mm_exact.cache_clear()
        int8.take_over.cache_clear()


def test_the_steps_for_int_mm_are_kept_only_where_it_takes_rows(monkeypatch: Any) -> None:
    """A second copy of the steps (as many bytes as the packed ones) is held for `_int_mm` only where
    `take_over` gives it some row counts."""
    weight = torch.randn(64, 576)
    for limit, kept in ((sys.maxsize, False), (32, True)):
        monkeypatch.setattr(int8, "take_over", lambda limit=limit: int8.TakeOver(limit, 48, None))
        matrix = Int8Matrix.quantize(weight)
        assert (matrix.steps is not None) == kept
        assert matrix.nbytes == 64 * 576 * (2 if kept else 1) + 64 * 4 + 64 * 4


@pytest.mark.parametrize("n", [1, 10, 64])
def test_the_steps_are_packed_four_rows_a_group_with_their_sums(n: int) -> None:
    """`from_steps` (the C part's `pack`) lays the steps out as the docstring of `Int8Matrix.packed`
    says, rows past N zero, and sums each packed row's steps in int32, the largest of both signs
    included: the same as PyTorch's copy and sum."""
    generator = torch.Generator().manual_seed(n)
    steps = torch.randint(-127, 128, (n, 1536), generator=generator, dtype=torch.int8)
    steps[0, :] = 127
    steps[-1, :] = -127
    matrix = Int8Matrix.from_steps(steps, torch.ones(n), int_mm=False)
    groups = -(-n // int8.WEIGHT_ROWS)
    padded = torch.zeros(groups * int8.WEIGHT_ROWS, 1536, dtype=torch.int8)
    padded[:n] = steps
    layout = padded.view(groups, int8.WEIGHT_ROWS, 1536 // int8.CHUNK, int8.CHUNK).permute(0, 2, 1, 3)
    assert torch.equal(matrix.packed, layout)
    assert torch.equal(matrix.sums, padded.long().sum(1).int())
    assert matrix.sums[n - 1] == -127 * 1536  # the largest sum of that sign there is
    with pytest.raises(ValueError, match="int8"):
        Int8Matrix.from_steps(steps.int(), torch.ones(n))
    with pytest.raises(ValueError, match="whole chunks of 32"):
        Int8Matrix.from_steps(steps[:, :40], torch.ones(n))


def test_a_timing_stand_in_is_its_repeated_rows_packed_and_multiplies_exactly() -> None:
    """`take_over`'s stand-ins repeat a packed block of random steps down the rows: field for field
    the matrix of those rows repeated and packed whole, and the C part (and `_int_mm` where exact)
    give it the exact integer sums, scaled."""
    generator = torch.Generator().manual_seed(3)
    matrix = int8.stand_in((192, 576), generator)
    generator.manual_seed(3)
    block = torch.randint(-127, 128, (int8.STAND_IN_ROWS, 576), generator=generator, dtype=torch.int8)
    whole = Int8Matrix.from_steps(block.repeat(3, 1), torch.ones(192), int_mm=True)
    assert matrix.steps is not None and whole.steps is not None
    for got, want in zip(
        (matrix.packed, matrix.scales, matrix.sums, matrix.steps),
        (whole.packed, whole.scales, whole.sums, whole.steps),
        strict=True,
    ):
        assert got.dtype == want.dtype and torch.equal(got, want)
    x = torch.randn(5, 576, generator=generator)
    assert torch.equal(matrix.c_product(x), _exact(whole, x))
    if int8.int_mm_exact():
        assert torch.equal(matrix.int_mm_product(x), _exact(whole, x))


def test_where_int_mm_takes_over_is_timed_and_said(monkeypatch: Any) -> None:
    """Where `_int_mm` is exact, the C part takes the row counts up to the last of TIMED_ROWS before
    `_int_mm` took at most TAKE_OVER of its time over a step's stand-in matrices, and the engine
    line says where `_int_mm` takes over (or that it does not)."""
    if not int8.int_mm_exact():
        pytest.skip("torch._int_mm is not exact here: the C part takes every row count")
    calls: list[int] = []

    def timed(times: int, product: Any, x: torch.Tensor) -> float:
        calls.append(x.shape[0])
        if product.__name__ == "c_product":
            return 1.0
        return 0.95 if x.shape[0] <= 32 else 0.85  # level (within the margin), then clearly faster

    monkeypatch.setattr(int8, "shortest", timed)
    int8.take_over.cache_clear()
    try:
        assert int8.c_max_rows() == 32
        assert max(calls) == 48  # timed no further than where _int_mm took over
        said = int8.describe()
        assert f"the C part's {int8.kernel()} kernel up to 32 rows, torch._int_mm beyond" in said
        monkeypatch.setattr(int8, "shortest", lambda times, product, x: 1.0)
        int8.take_over.cache_clear()
        assert int8.c_max_rows() > 1000
        assert "torch._int_mm no faster at up to 256 rows" in int8.describe()
    finally:
        int8.take_over.cache_clear()


def test_the_take_over_timings_stop_at_their_budget(monkeypatch: Any) -> None:
    """The timings stop before a row count whose timings, predicted from the last one's in proportion
    to the rows, would end past TIMING_BUDGET_S, with `_int_mm` never faster: the C part takes every
    row count, and the engine line names the row count timed last. On a clock the timings move
    (each 2 ms a row: a row count's ten 20 ms a row), 1, 2, 4 and 8 rows end at 0.30 s, 16 rows
    would at 0.62."""
    if not int8.int_mm_exact():
        pytest.skip("torch._int_mm is not exact here: nothing is timed")
    calls: list[int] = []
    clock = [0.0]

    def slow(times: int, product: Any, x: torch.Tensor) -> float:
        calls.append(x.shape[0])
        clock[0] += 0.002 * x.shape[0]
        return 1.0

    monkeypatch.setattr(int8, "shortest", slow)
    monkeypatch.setattr(int8, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(int8, "TIMING_BUDGET_S", 0.5)
    int8.take_over.cache_clear()
    try:
        found = int8.take_over()
        assert (found.c_max_rows, found.timed_rows) == (sys.maxsize, 8)
        assert sorted(set(calls)) == [1, 2, 4, 8] and len(calls) == 40
        assert clock[0] == pytest.approx(0.30)
        assert "torch._int_mm no faster at up to 8 rows" in int8.describe()
    finally:
        int8.take_over.cache_clear()


def test_the_take_over_timings_stop_where_int_mm_is_far_behind_and_not_gaining(monkeypatch: Any) -> None:
    """At each row count the step's largest stand-in is timed first; where `_int_mm` takes more than
    FAR times the C part's time there, the other stand-ins are not timed, and where it is no nearer
    than at the row count before, the timings stop: the C part takes every row count, and the
    engine line says how far behind `_int_mm` was. Where it is far behind but nearing, the timings
    go on, and once it is within FAR the whole step is timed."""
    if not int8.int_mm_exact():
        pytest.skip("torch._int_mm is not exact here: nothing is timed")
    glance = int8.TIMED_SHAPES[int8.glance_shape()][0]
    assert glance == (3072, 576)  # a layer's gate and up rows: 30 x 3072 x 576 of a step's multiply-adds
    calls: list[tuple[int, int]] = []
    behind = {1: 12.0, 2: 10.0, 4: 10.5}

    def timed(times: int, product: Any, x: torch.Tensor) -> float:
        calls.append((x.shape[0], x.shape[1]))
        return 1.0 if product.__name__ == "c_product" else behind[x.shape[0]]

    monkeypatch.setattr(int8, "shortest", timed)
    int8.take_over.cache_clear()
    try:
        found = int8.take_over()
        assert (found.c_max_rows, found.timed_rows, found.behind) == (sys.maxsize, 4, 10.5)
        assert calls == [(rows, 576) for rows in (1, 1, 2, 2, 4, 4)]  # the glance alone at each
        assert "torch._int_mm 10x slower at 4 rows and no nearer than at 2" in int8.describe()
        behind.clear()
        behind.update({1: 8.0, 2: 4.0, 4: 2.5, 8: 1.5, 16: 0.8})
        calls.clear()
        int8.take_over.cache_clear()
        found = int8.take_over()
        assert (found.c_max_rows, found.timed_rows, found.behind) == (8, 16, None)
        # From 8 rows, within FAR: every stand-in timed (the down rows' at 1536 columns, the rest 576)
        assert sorted(call for call in calls if call[0] == 8) == [(8, 576)] * 8 + [(8, 1536)] * 2
        assert max(rows for rows, _ in calls) == 16
    finally:
        int8.take_over.cache_clear()


def test_a_process_held_below_vnni_multiplies_with_the_avx2_kernel(monkeypatch: Any) -> None:
    """PyTorch and oneDNN held to AVX2 (as tests do, to run what an AVX2-only CPU runs): the C part
    holds to its AVX2 kernel too; unheld, it takes the last kernel this CPU runs."""
    int8.kernel.cache_clear()
    try:
        for name in int8.HELD_BELOW_VNNI:
            monkeypatch.delenv(name, raising=False)
        assert int8.kernel() == int8.kernels()[-1]
        for name, values in int8.HELD_BELOW_VNNI.items():
            monkeypatch.setenv(name, values[-1].upper())
            int8.kernel.cache_clear()
            assert int8.kernel() == ("avx2" if "avx2" in int8.kernels() else int8.kernels()[-1])
            monkeypatch.delenv(name)
    finally:
        int8.kernel.cache_clear()


def test_the_vector_turn_gives_the_portable_codes_bytes() -> None:
    """On x86 rows are turned and rounded eight lanes at a time; the portable C (what other CPUs
    run) gives the same bytes and scales, for large, zero and huge rows too."""
    generator = torch.Generator().manual_seed(4)
    for k in (64, 576, 1536):
        x = torch.randn(20, k, generator=generator)
        x[3] *= 1000
        x[4] = 0
        x[5, 7] = 1e30
        fast, fast_scales = rotate_quantize(x)
        plain = torch.empty(20, k, dtype=torch.int8)
        plain_scales = torch.empty(20)
        int8._int8_rows.rotate_quantize(plain.data_ptr(), plain_scales.data_ptr(), x.data_ptr(), 20, k, True)
        assert torch.equal(fast, plain) and torch.equal(fast_scales, plain_scales), k

"""The embedded engine's linear layers for few rows (backend/engines/embedded/linear.py, rows_linear.c):
the same products as `F.linear` to float32 rounding, on every shape the kernel takes and the ones it
hands back to PyTorch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend.engines.embedded import linear as engine_linear


def cpu_has_avx2_fma() -> bool:
    flags = next(
        (line.split() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
        [],
    )
    return "avx2" in flags and "fma" in flags


@contextlib.contextmanager
def kernel_on() -> Iterator[None]:
    """The kernel on, on one thread, as the engine's process sets it (the test skipped where it is
    not usable); as it was afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    on, reason = engine_linear.kernel_status()
    if not on:
        torch.set_num_threads(threads)
        pytest.skip(f"the rows kernel is not usable here: {reason}")
    engine_linear.configure()
    try:
        yield
    finally:
        engine_linear.configure(allow=False)
        torch.set_num_threads(threads)


@pytest.fixture
def kernel() -> Iterator[None]:
    with kernel_on():
        yield


def test_the_kernel_is_built_and_used_where_the_cpu_has_avx2() -> None:
    if not cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2/FMA")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        on, reason = engine_linear.kernel_status()
    finally:
        torch.set_num_threads(threads)
    assert on, reason  # `make setup` builds the C part; a missing build must not pass unnoticed


@pytest.mark.parametrize(
    ("rows", "inner", "out"),
    [
        (1, 576, 960),
        (2, 576, 576),
        (3, 576, 1536),
        (8, 1536, 576),
        (7, 576, 49152),
        (64, 576, 3072),
        (5, 576, 577),
    ],
)
def test_the_kernel_gives_f_linears_products(kernel: None, rows: int, inner: int, out: int) -> None:
    torch.manual_seed(rows * out)
    x, w = torch.randn(rows, inner), torch.randn(out, inner) * 0.05
    got, want = engine_linear.linear(x, w), F.linear(x, w)
    assert got.shape == want.shape and got.dtype == torch.float32
    # float32 sums of `inner` products in another order: a few units in the last place of the sum.
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got - want).abs().max()


def test_batched_inputs_keep_their_shape(kernel: None) -> None:
    x, w = torch.randn(2, 3, 576), torch.randn(960, 576)
    got = engine_linear.linear(x, w)
    assert got.shape == (2, 3, 960)
    assert torch.allclose(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_what_the_kernel_does_not_take_goes_to_pytorch_unchanged(kernel: None) -> None:
    w = torch.randn(576, 576)
    many = torch.randn(engine_linear.KERNEL_MAX_ROWS + 1, 576)  # a prefill's rows
    assert torch.equal(engine_linear.linear(many, w), F.linear(many, w))
    odd = torch.randn(4, 570)  # K not a multiple of 8
    odd_w = torch.randn(64, 570)
    assert torch.equal(engine_linear.linear(odd, odd_w), F.linear(odd, odd_w))
    low = torch.randn(4, 576, dtype=torch.bfloat16)
    assert torch.equal(engine_linear.linear(low, w.bfloat16()), F.linear(low, w.bfloat16()))
    strided = torch.randn(576, 1152)[:, ::2]  # a weight that is a strided view
    assert torch.equal(engine_linear.linear(many[:4], strided), F.linear(many[:4], strided))


def test_a_decode_step_of_more_rows_than_a_prefill_takes_stays_on_the_kernel(kernel: None) -> None:
    """`any_rows` (a decode step): past KERNEL_MAX_ROWS the kernel still multiplies, so each row's
    products are what it gets alone, bit for bit."""
    w = torch.randn(960, 576)
    many = torch.randn(engine_linear.KERNEL_MAX_ROWS + 6, 576)
    together = engine_linear.linear(many, w, any_rows=True)
    alone = torch.cat([engine_linear.linear(many[i : i + 1], w) for i in range(many.shape[0])])
    assert torch.equal(together, alone)
    y = torch.randn(many.shape[0], 960)
    added = y.clone()
    engine_linear.linear_add(added, many, w, any_rows=True)
    assert torch.equal(added, y + alone)


def test_turned_off_it_is_pytorch_and_says_so() -> None:
    reason = engine_linear.configure(allow=False)
    assert "turned off" in reason
    x, w = torch.randn(4, 576), torch.randn(960, 576)
    assert torch.equal(engine_linear.linear(x, w), F.linear(x, w))

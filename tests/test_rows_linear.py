"""The rows kernel's weight format (linear.BlockWeight, rows_linear.c) on float32 weights: the same
products as `F.linear` to float32 rounding, on every shape the kernel takes, a long prefill handed
to PyTorch; the library format (linear.LibraryWeight) is PyTorch's product."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend.engines.embedded import linear as engine_linear
from backend.engines.embedded.linear import BlockWeight, LibraryWeight


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
    try:
        yield
    finally:
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
    got, want = BlockWeight(w, None).product(x), F.linear(x, w)
    assert got.shape == want.shape and got.dtype == torch.float32
    # float32 sums of `inner` products in another order: a few units in the last place of the sum.
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got - want).abs().max()


def test_batched_inputs_keep_their_shape(kernel: None) -> None:
    x, w = torch.randn(2, 3, 576), torch.randn(960, 576)
    got = BlockWeight(w, None).product(x)
    assert got.shape == (2, 3, 960)
    assert torch.allclose(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_a_long_prefill_goes_to_pytorch_and_what_the_kernel_cannot_take_is_refused(kernel: None) -> None:
    w = torch.randn(576, 576)
    many = torch.randn(engine_linear.KERNEL_MAX_ROWS + 1, 576)  # a prefill's rows
    assert torch.equal(BlockWeight(w, None).product(many), F.linear(many, w))
    with pytest.raises(ValueError, match="whole 8s"):
        BlockWeight(torch.randn(64, 570), None)  # K not a multiple of 8
    with pytest.raises(ValueError, match="strided"):
        BlockWeight(torch.randn(576, 1152)[:, ::2], None)
    with pytest.raises(ValueError, match="bfloat16"):
        BlockWeight(w.bfloat16(), None)


def test_a_decode_step_of_more_rows_than_a_prefill_takes_stays_on_the_kernel(kernel: None) -> None:
    """`step`: past KERNEL_MAX_ROWS the kernel still multiplies, so each row's products are what it
    gets alone, bit for bit; into a buffer and added to one (a residual connection) alike."""
    w = torch.randn(960, 576)
    weight = BlockWeight(w, None)
    many = torch.randn(engine_linear.KERNEL_MAX_ROWS + 6, 576)
    together = weight.product(many, step=True)
    alone = torch.cat([weight.product(many[i : i + 1]) for i in range(many.shape[0])])
    assert torch.equal(together, alone)
    out = torch.empty(many.shape[0], 960)
    assert weight.product(many, out, step=True) is out and torch.equal(out, alone)
    y = torch.randn(many.shape[0], 960)
    added = y.clone()
    weight.product(many, added, add=True, step=True)
    assert torch.equal(added, y + alone)


def test_turned_off_it_says_so_and_the_library_format_is_pytorchs_product() -> None:
    on, reason = engine_linear.kernel_status(allow=False)
    assert not on and "turned off" in reason
    x, w = torch.randn(4, 576), torch.randn(960, 576)
    assert torch.equal(LibraryWeight(w).product(x), F.linear(x, w))
    low = LibraryWeight(w.bfloat16())
    assert low.product(x).dtype == torch.float32
    assert torch.equal(low.product(x), F.linear(x.bfloat16(), w.bfloat16()).float())

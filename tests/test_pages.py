"""The engine's large tensors on 2 MB pages (backend/engines/embedded/pages.py): asked for where the
kernel offers them, the same tensors either way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from backend.engines.embedded import pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_kb_of(tensor: torch.Tensor) -> int:
    """AnonHugePages (kB) of the mapping holding `tensor`'s first 2 MB boundary, from
    /proc/self/smaps (the advice splits the mapping there)."""
    address, inside = -(-tensor.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_zeros_are_zeros_of_the_shape_and_type_asked() -> None:
    cases = (((3, 5), torch.float32), ((30, 64, 3, 256, 64), torch.float32), ((7,), torch.bfloat16))
    for shape, dtype in cases:
        tensor = pages.zeros(shape, dtype)
        assert tensor.shape == shape and tensor.dtype == dtype and not tensor.any()


def test_a_tensor_too_small_for_one_huge_page_is_not_advised() -> None:
    assert pages.advise_huge(torch.empty(1000)) is False


@pytest.mark.skipif(sys.platform != "linux", reason="transparent huge pages are Linux's")
def test_a_large_cache_asks_for_and_gets_huge_pages() -> None:
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("this kernel has transparent huge pages off")
    tensor = pages.empty((64, 1 << 20), torch.float32)  # 256 MiB
    assert pages.advise_huge(tensor)
    tensor.zero_()
    assert huge_kb_of(tensor) > 0  # at least some of it on 2 MB pages

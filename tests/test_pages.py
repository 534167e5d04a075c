"""The engine's large tensors on 2 MB pages (backend/engines/embedded/pages.py): asked for where the
kernel offers them, the same tensors either way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from backend.engines.embedded import pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def mapping_fields(tensor: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding `tensor`'s first 2 MB boundary (the advice
    splits the mapping there)."""
    address, inside, fields = -(-tensor.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE, False, {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def test_zeros_are_zeros_of_the_shape_and_type_asked() -> None:
    cases = (((3, 5), torch.float32), ((30, 64, 3, 256, 64), torch.float32), ((7,), torch.bfloat16))
    for shape, dtype in cases:
        tensor = pages.zeros(shape, dtype)
        assert tensor.shape == shape and tensor.dtype == dtype and not tensor.any()


def test_a_tensor_too_small_for_one_huge_page_is_not_advised() -> None:
    assert pages.advise_huge(torch.empty(1000)) is False


@pytest.mark.skipif(sys.platform != "linux", reason="transparent huge pages are Linux's")
def test_a_large_cache_asks_for_huge_pages() -> None:
    """The mapping is marked eligible for 2 MB pages (whether the kernel finds free ones when the
    pages are faulted in depends on the machine's memory at the time)."""
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("this kernel has transparent huge pages off")
    plain = torch.empty(64, 1 << 20)  # 256 MiB, not advised
    tensor = pages.zeros((64, 1 << 20), torch.float32)
    if "[always]" not in THP.read_text():
        assert mapping_fields(plain).get("THPeligible") == "0"
    assert mapping_fields(tensor).get("THPeligible") == "1"

"""Large tensors of the embedded engine on 2 MB pages, where the kernel gives them on request.

Decode attention reads each row's keys and values from its own part of the cache, a few kilobytes
here and there across hundreds of megabytes: with 4 KB pages nearly every part is a TLB miss, and
the hardware's prefetcher stops at every page's end. Linux's transparent huge pages are often set
to `madvise` (Debian's default): a mapping gets 2 MB pages only if it asks, before it is touched.
`empty` allocates and asks (madvise MADV_HUGEPAGE on the whole 2 MB pages inside the tensor);
`zeros` then zeroes, which faults the pages in. Where the kernel has no such pages, or this is not Linux, the
request is refused or ignored and the tensor is the same, on 4 KB pages.

`python -m bench.decode_ops` and docs/benchmarks.md give what it changes in a decode step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

import torch

log = logging.getLogger("backend.embedded")

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
"""Linux's madvise advice for transparent huge pages (asm-generic/mman-common.h)."""

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def advise_huge(tensor: torch.Tensor) -> bool:
    """Ask for 2 MB pages under the whole 2 MB pages inside `tensor`'s memory; whether it was asked
    and granted (False where no 2 MB page fits inside, off Linux, or refused)."""
    if _libc is None:
        return False
    address, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + size) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return False
    return _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """`torch.empty(shape, dtype=dtype)`, with 2 MB pages asked for before its memory is touched."""
    tensor = torch.empty(shape, dtype=dtype)
    advise_huge(tensor)
    return tensor


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """`torch.zeros(shape, dtype=dtype)`, with 2 MB pages asked for before it is zeroed."""
    return empty(shape, dtype).zero_()

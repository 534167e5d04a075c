"""The embedded engine's linear layers: what a weight format offers the model, and two of the formats.

Every weight matrix the model multiplies by is one object of a weight format, whose `product(x,
out, add, step)` the forward pass calls: rows x [rows, K] in (float32), x @ weight^T out as float32
[rows, N], written into `out` (a decode step's buffer) or, with `add`, added to what `out` holds (a
residual connection, each sum rounded as `out + product`), else returned new; `step` says the rows
are a decode step's, whose products must be batch-invariant. A format's `rows_independent` says
whether a row's values never depend on how many rows share a call (prompts arriving together may
then be prefilled in one pass). The formats, one per compute path (compute.py):

- `BlockWeight` (`fp32-blocks`): the GGUF's quantized blocks through the rows kernel
  (rows_linear.c, packed by quantized.py), which computes each row on its own and reads a sixth of
  float32's bytes; the float32 weights beside them for a long prompt's prefill (more than
  KERNEL_MAX_ROWS rows), where PyTorch's product is faster.
- `LibraryWeight` (`bf16-torch`, and float32 for comparisons): PyTorch's product in the weights'
  dtype, a decode step's rows only at the row counts checked at start (fixed_rows.py).
- `int8.Int8Matrix` (`int8-exact`): int8 rows and weights summed exactly in int32.

`kernel_status()` says whether the rows kernel can run here and why not. No module state: each
weight carries what its product needs.
`python -m bench.matmul_layouts` times the rows kernel against PyTorch on the model's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from backend.engines.embedded.fixed_rows import FixedRows
from backend.engines.embedded.quantized import PackedMatrix

try:
    from backend.engines.embedded import _rows_linear
except ImportError:  # not built (no C compiler): PyTorch alone
    _rows_linear = None

KERNEL_MAX_ROWS = 64
"""The most rows the kernel takes outside a decode step; more (a long prompt's prefill) go to
PyTorch, which is faster there."""


class Weight(Protocol):
    """A weight matrix [out_features, in_features] in one format, as the model multiplies by it."""

    rows_independent: ClassVar[bool]

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes the matrix holds."""
        ...

    @property
    def step_bytes(self) -> int:
        """Bytes a decode step's product reads."""
        ...

    def product(
        self, x: torch.Tensor, out: torch.Tensor | None = None, add: bool = False, step: bool = False
    ) -> torch.Tensor:
        """x[rows, K] @ weight^T as float32 [rows, N]: into `out` (added to it with `add`) or new."""
        ...


def kernel_status(allow: bool = True) -> tuple[bool, str]:
    """(whether float32 products of few rows can use the rows kernel here, a short reason)."""
    if not allow:
        return False, "PyTorch (the rows kernel turned off)"
    if _rows_linear is None:
        return False, "PyTorch (the rows kernel's C part is not built)"
    if not _rows_linear.available():
        return False, "PyTorch (this CPU lacks AVX2/FMA for the rows kernel)"
    if torch.get_num_threads() != 1:
        return False, f"PyTorch ({torch.get_num_threads()} threads; the rows kernel uses one)"
    return True, f"rows kernel (AVX2) up to {KERNEL_MAX_ROWS} rows, PyTorch beyond"


def holds(out: torch.Tensor | None, rows: int, n: int) -> bool:
    """Whether `out` can take a product of `rows` rows by `n` weight rows in place (a C part writes
    it): float32 [rows, n], contiguous."""
    return out is not None and out.dtype == torch.float32 and out.is_contiguous() and out.shape == (rows, n)


def deliver(made: torch.Tensor, out: torch.Tensor | None, add: bool) -> torch.Tensor:
    """A product `made` as `product` gives it: new (out None), written into `out`, or added to it."""
    if out is None:
        return made
    return out.add_(made) if add else out.copy_(made)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, K]."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _shaped(made: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A product of x's rows [rows, N] in x's leading shape."""
    return made if x.dim() == 2 else made.reshape(*x.shape[:-1], made.shape[-1])


@dataclass(frozen=True)
class BlockWeight:
    """The float32 weights [N, K] and the same as the GGUF's blocks, packed for the rows kernel (None
    where the GGUF had none that match: the kernel then reads the float32 weights)."""

    dense: torch.Tensor
    blocks: PackedMatrix | None
    rows_independent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        dense = self.dense
        if (
            dense.dtype != torch.float32
            or not dense.is_contiguous()
            or dense.dim() != 2
            or dense.shape[1] % 8
        ):
            what = f"{dense.dtype} {tuple(dense.shape)}{'' if dense.is_contiguous() else ', strided'}"
            raise ValueError(f"the rows kernel multiplies contiguous float32 rows of whole 8s, not {what}")
        if self.blocks is None:
            return
        if (self.blocks.out_features, self.blocks.in_features) != tuple(self.dense.shape):
            shape = f"{self.blocks.out_features} x {self.blocks.in_features}"
            raise ValueError(f"blocks of {shape} for a weight of {tuple(self.dense.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        return self.dense.shape[0], self.dense.shape[1]

    @property
    def nbytes(self) -> int:
        """The float32 weights and the blocks."""
        return self.dense.numel() * 4 + self.step_bytes * (self.blocks is not None)

    @property
    def step_bytes(self) -> int:
        """A decode step reads the blocks alone (the float32 weights where there are none)."""
        return self.dense.numel() * 4 if self.blocks is None else self.blocks.nbytes

    def product(
        self, x: torch.Tensor, out: torch.Tensor | None = None, add: bool = False, step: bool = False
    ) -> torch.Tensor:
        """Through the kernel from the blocks for a step's rows (any number) and up to
        KERNEL_MAX_ROWS others; more rows of a prefill through `F.linear` on the float32 weights."""
        flat = _rows(x)
        rows, n = flat.shape[0], self.shape[0]
        if rows > KERNEL_MAX_ROWS and not step:
            return _shaped(deliver(F.linear(flat, self.dense), out, add), x)
        flat = flat.contiguous()
        if not holds(out, rows, n):
            made = torch.empty(rows, n, dtype=torch.float32)
            self._kernel(made, flat, False)
            return _shaped(deliver(made, out, add), x)
        assert out is not None
        self._kernel(out, flat, add)
        return out

    def _kernel(self, out: torch.Tensor, flat: torch.Tensor, add: bool) -> None:
        """out [rows, N] = (or += with `add`) flat [rows, K] @ weight^T in the rows kernel."""
        rows, (n, k) = flat.shape[0], self.shape
        if self.blocks is None:
            _rows_linear.linear(out.data_ptr(), flat.data_ptr(), self.dense.data_ptr(), rows, n, k, add)
            return
        data, code = self.blocks.data.data_ptr(), self.blocks.code
        _rows_linear.linear_packed(out.data_ptr(), flat.data_ptr(), data, code, rows, n, k, add)


@dataclass(frozen=True)
class LibraryWeight:
    """Weights [N, K] in their dtype through PyTorch's product; a decode step's rows at `fixed`'s
    checked row counts alone where set (None: any row count, not batch-invariant)."""

    weight: torch.Tensor
    fixed: FixedRows | None = None
    rows_independent: ClassVar[bool] = False

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features)."""
        return self.weight.shape[0], self.weight.shape[1]

    @property
    def nbytes(self) -> int:
        """The weights."""
        return self.weight.numel() * self.weight.element_size()

    @property
    def step_bytes(self) -> int:
        """A product reads every weight."""
        return self.nbytes

    def product(
        self, x: torch.Tensor, out: torch.Tensor | None = None, add: bool = False, step: bool = False
    ) -> torch.Tensor:
        """In the weights' dtype (x cast to it), float32 out."""
        if step and self.fixed is not None:
            made = self.fixed.linear(_rows(x), self.weight)
        elif x.dtype != self.weight.dtype:
            made = F.linear(_rows(x).to(self.weight.dtype), self.weight).float()
        else:
            made = F.linear(_rows(x), self.weight)
        return _shaped(deliver(made, out, add), x)

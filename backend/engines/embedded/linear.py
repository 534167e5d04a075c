"""The embedded engine's linear layers: `linear(x, weight)`, x @ weight^T like `F.linear`.

A decode step multiplies a few rows (one per running sample) by every weight of the model, and
for few rows PyTorch's CPU matrix product is far from what the machine can do (on the AVX2
development machine it read the weights at 2-6 GB/s). Where the C part `_rows_linear`
(rows_linear.c, built with the tracer's C parts) is built and the CPU has AVX2 and FMA, float32
products of up to `KERNEL_MAX_ROWS` rows run there, on one thread, reading each weight once;
everything else (bfloat16, more rows, more threads, no C part) goes to `F.linear`. Given the same
weights as a GGUF's quantized blocks (`quantized.py`), the kernel multiplies from those, reading a
sixth of the bytes.
`python -m bench.matmul_layouts` times both on the model's shapes and in whole decode steps.

The compute path (compute.py) decides whether the kernel runs (`configure`); `kernel_status()` says
whether it can and why not. Where it does not, a decode step's products go to PyTorch at one
checked block of rows, or checked row counts up to it (`configure(sizes=...)`, fixed_rows.py), so
that they are batch-invariant too. Weights of another dtype than the float32 activations (bfloat16,
or 4-bit groups: int4.py, whose product takes and gives bfloat16) take their input cast to it and
give float32 back. Weights in int8 (int8.py) multiply any number of rows exactly, with no block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from backend.engines.embedded.fixed_rows import FixedRows, Weight
from backend.engines.embedded.int4 import Int4Matrix
from backend.engines.embedded.int8 import Int8Matrix
from backend.engines.embedded.quantized import PackedMatrix

try:
    from backend.engines.embedded import _rows_linear
except ImportError:  # not built (no C compiler): PyTorch alone
    _rows_linear = None

KERNEL_MAX_ROWS = 64
"""The most rows the kernel takes; more (a long prompt's prefill) go to PyTorch, which is faster there."""


def kernel_status(allow: bool = True) -> tuple[bool, str]:
    """(whether float32 products of few rows would use the kernel, a short reason)."""
    if not allow:
        return False, "PyTorch (the rows kernel turned off)"
    if _rows_linear is None:
        return False, "PyTorch (the rows kernel's C part is not built)"
    if not _rows_linear.available():
        return False, "PyTorch (this CPU lacks AVX2/FMA for the rows kernel)"
    if torch.get_num_threads() != 1:
        return False, f"PyTorch ({torch.get_num_threads()} threads; the rows kernel uses one)"
    return True, f"rows kernel (AVX2) up to {KERNEL_MAX_ROWS} rows, PyTorch beyond"


_enabled = False
_fixed: FixedRows | None = None
_exact = False


def configure(allow: bool = True, sizes: tuple[int, ...] = (), exact: bool = False) -> str:
    """Decide, once the thread count is set, whether `linear` uses the kernel (never where `allow`
    is False); where it does not, `sizes` (row counts checked by fixed_rows.check, compute.Choice.sizes)
    are the only row counts a decode step's products run at in PyTorch (empty: any). `exact`: the
    weights are int8 (int8.py), whose rows are independent at any row count. Returns which path
    runs and why."""
    global _enabled, _fixed, _exact
    _exact = exact
    _enabled, reason = kernel_status(allow)
    _fixed = FixedRows(sizes) if sizes and not _enabled else None
    if _fixed is not None and len(_fixed.sizes) > 1:
        counts = "/".join(map(str, _fixed.sizes))
        reason += f", a decode step's products at {counts} rows (whole blocks of {_fixed.block})"
    elif _fixed is not None:
        reason += f", a decode step's products in blocks of {_fixed.block} rows"
    return reason


def rows_independent() -> bool:
    """Whether a row's products do not depend on how many rows a call holds: the rows kernel's, or
    int8's exact sums. Prompts arriving together may then be prefilled in one pass. (A library
    product is row-independent only at the block size it was checked at.)"""
    return _enabled or _exact


def linear(
    x: torch.Tensor,
    weight: Weight,
    blocks: PackedMatrix | None = None,
    any_rows: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x[..., K] @ weight[N, K]^T, as `F.linear(x, weight)`; through the kernel from `blocks` (the
    same weights as GGUF blocks, `quantized.read_blocks`, packed) where given. With `any_rows` (a
    decode step) the kernel takes more than KERNEL_MAX_ROWS rows too, so that a row's values never
    depend on how many rows share the step. `out` (float32 [rows, N], contiguous, for x [rows, K]):
    written there and returned, the same values (a decode step's buffer)."""
    if out is not None and _int8_in_c(x, weight):
        weight.c_product_into(out, x)
        return out
    flat = _kernel_rows(x, weight, any_rows)
    if flat is None:
        made = _library(x, weight, any_rows)
        return made if out is None else out.copy_(made)
    if not _holds(out, flat.shape[0], weight.shape[0]):
        out = torch.empty(flat.shape[0], weight.shape[0], dtype=torch.float32)
    _product(out, flat, weight, blocks, add=False)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def linear_add(
    y: torch.Tensor,
    x: torch.Tensor,
    weight: Weight,
    blocks: PackedMatrix | None = None,
    any_rows: bool = False,
) -> None:
    """y += x @ weight^T in place (a residual connection), y[rows, N] contiguous, x[rows, K]: each
    sum rounded as `y + linear(x, weight)` rounds it, without the intermediate tensor."""
    if _int8_in_c(x, weight) and _holds(y, x.shape[0], weight.shape[0]):
        weight.c_product_into(y, x, add=True)
        return
    flat = _kernel_rows(x, weight, any_rows)
    if flat is None or not _holds(y, flat.shape[0], weight.shape[0]):
        y += _library(x, weight, any_rows)
        return
    _product(y, flat, weight, blocks, add=True)


def _holds(y: torch.Tensor | None, rows: int, n: int) -> bool:
    """Whether the C parts can write a product of `rows` rows by `n` weight rows into `y` (or add
    it there): float32 [rows, n], contiguous."""
    return y is not None and y.dtype == torch.float32 and y.is_contiguous() and y.shape == (rows, n)


def _library(x: torch.Tensor, weight: Weight, step: bool) -> torch.Tensor:
    """x @ weight^T in PyTorch, float32 out: a decode step's (`step`) at the checked row counts
    where set."""
    if isinstance(weight, Int8Matrix):  # exact at any row count: no block
        if x.dim() == 2:  # a step's rows: no reshapes
            return weight.product(x)
        return weight.product(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], weight.shape[0])
    k = weight.shape[1]
    if step and _fixed is not None:
        out = _fixed.linear(x.reshape(-1, k), weight)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    if isinstance(weight, Int4Matrix):
        return weight.product(x.reshape(-1, k)).float().reshape(*x.shape[:-1], weight.shape[0])
    if x.dtype != weight.dtype:
        return F.linear(x.to(weight.dtype), weight).float()
    return F.linear(x, weight)


def _int8_in_c(x: torch.Tensor, weight: Weight) -> bool:
    """Whether `weight` is int8 whose C part multiplies x's rows (2-D, float32, contiguous) here."""
    return (
        isinstance(weight, Int8Matrix)
        and x.dim() == 2
        and x.dtype == torch.float32
        and x.is_contiguous()
        and weight.in_c(x.shape[0])
    )


def _kernel_rows(x: torch.Tensor, weight: Weight, any_rows: bool) -> torch.Tensor | None:
    """x as contiguous [rows, K] where the kernel takes the product, else None."""
    if not _enabled or isinstance(weight, Int4Matrix | Int8Matrix):
        return None
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return None
    k = weight.shape[1]
    rows = x.numel() // k if k else 0
    if (rows > KERNEL_MAX_ROWS and not any_rows) or k % 8 or not weight.is_contiguous() or x.shape[-1] != k:
        return None
    return x.reshape(rows, k).contiguous()


def _product(
    out: torch.Tensor, flat: torch.Tensor, weight: torch.Tensor, blocks: PackedMatrix | None, add: bool
) -> None:
    rows, (n, k) = flat.shape[0], weight.shape
    if blocks is not None:
        if (blocks.out_features, blocks.in_features) != (n, k):
            shape = f"{blocks.out_features} x {blocks.in_features}"
            raise ValueError(f"blocks of {shape} for a weight of {n} x {k}")
        _rows_linear.linear_packed(
            out.data_ptr(), flat.data_ptr(), blocks.data.data_ptr(), blocks.code, rows, n, k, add
        )
    else:
        _rows_linear.linear(out.data_ptr(), flat.data_ptr(), weight.data_ptr(), rows, n, k, add)

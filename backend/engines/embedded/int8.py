"""Weight matrices and rows in int8, multiplied exactly in int32 (the `int8-exact` path).

A row x [K] and a weight row w [K] are each turned by the same orthonormal matrix H (the
Walsh-Hadamard matrix of 64, scaled by 1/8, on each group of 64 values), so x @ w^T = (xH) @ (wH)^T,
and each is rounded to int8 steps of its own scale (its greatest magnitude / 127): the weights once,
a row of each step on the fly (`_int8_rows.rotate_quantize`, int8_rows.c). The turn spreads a row's
few large values over their group, so one scale a row loses less of the others: on the README's
text, the layers' and output layer's rows and weights in int8 this way cost 0.0057 nats a token
against float32 (`python -m bench.rounding`; about six times that without the turn).

The product of the int8 rows and weights is summed in int32, where every order of addition gives
the same integer: by the C part (int8_rows.c, from the weights packed for it) for up to
`C_MAX_ROWS` rows, by PyTorch's `torch._int_mm` (oneDNN, with AVX-512 VNNI or AMX where the CPU has
them; from a second copy of the steps in its layout) beyond, where this process found `_int_mm`
exact (`int_mm_exact`), else by the C part for every row count. Each sum is then scaled to float32
by two rounded products, the row's scale and the weight row's, the same in C and in PyTorch: a
row's values are the same alone, beside any rows and at any row count, on every CPU, with no block
size to check.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

try:
    from backend.engines.embedded import _int8_rows
except ImportError:  # not built (no C compiler)
    _int8_rows = None

GROUP = 64
"""Values turned together (each group of a row by the Walsh-Hadamard matrix of this size)."""

C_MAX_ROWS = 8
"""The most rows the C part's products take where `torch._int_mm` is exact; more go to `_int_mm`.
(A decode step's products on a 2-core AMD EPYC with AVX-512 VNNI: the C part 6.2 ms at 1 row
against 14.5 for `_int_mm`, 20.0 against 24.2 at 8 rows; `_int_mm` 30 ms at 16 rows, where the C
part's time goes up by a row's.)"""

WEIGHT_ROWS = 4
"""Weight rows the C part multiplies together (int8_rows.c)."""

CHUNK = 32
"""Columns of a packed group's row side by side (int8_rows.c)."""


def available() -> tuple[bool, str]:
    """(whether the int8 products can run here, why not where they cannot)."""
    if _int8_rows is None:
        return False, "the int8 products' C part is not built"
    if not _int8_rows.available():
        return False, "this CPU lacks AVX2 for the int8 products' C part"
    return True, ""


@functools.cache
def int_mm_exact() -> bool:
    """Whether `torch._int_mm` gives the exact int32 sums here, at every row count up to 64, with the
    largest steps of both signs (where the CPU lacks VNNI, oneDNN's AVX2 kernel adds products in
    16 bits and saturates): checked once per process against int64 sums."""
    if not hasattr(torch, "_int_mm"):
        return False
    generator = torch.Generator().manual_seed(0)
    weights = torch.randint(-127, 128, (64, 1536), dtype=torch.int8, generator=generator)
    weights[:8] = 127
    weights[8:16] = -127
    for rows in range(1, 65):
        x = torch.randint(-127, 128, (rows, 1536), dtype=torch.int8, generator=generator)
        x[0] = 127
        x[-1] = -127
        try:
            got = torch._int_mm(x, weights.t())
        except RuntimeError:
            return False
        if not torch.equal(got.long(), x.long() @ weights.long().t()):
            return False
    return True


def describe() -> str:
    """The engine line's words for how the int8 products run here."""
    made = "turned by a Hadamard matrix, summed exactly in int32"
    if int_mm_exact():
        return f"int8 rows and weights, {made}: the C part up to {C_MAX_ROWS} rows, torch._int_mm beyond"
    return f"int8 rows and weights, {made} by the C part (torch._int_mm is not exact here)"


def _hadamard() -> torch.Tensor:
    """H: the Walsh-Hadamard matrix of GROUP, scaled to be orthonormal (for `dequantize`)."""
    h = torch.ones(1, 1)
    while h.shape[0] < GROUP:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h / GROUP**0.5


def rotate_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [rows, K] (float32, K whole groups) turned and rounded: (int8 [rows, K], float32 scales
    [rows]), each row computed alone."""
    assert _int8_rows is not None, available()[1]
    x = x.to(torch.float32).contiguous()
    rows, k = x.shape
    if k % GROUP:
        raise ValueError(f"rows of {k} values are not whole groups of {GROUP}")
    q = torch.empty(rows, k, dtype=torch.int8)
    scales = torch.empty(rows, dtype=torch.float32)
    _int8_rows.rotate_quantize(q.data_ptr(), scales.data_ptr(), x.data_ptr(), rows, k)
    return q, scales


@dataclass(frozen=True)
class Int8Matrix:
    """A weight matrix [out_features, in_features], each row turned and in int8 with its scale."""

    packed: torch.Tensor
    """int8 [ceil(out_features / 4), in_features / 32, 4, 32]: four rows' steps at each 32 columns
    side by side (zero rows after the last), as the C part reads them."""
    scales: torch.Tensor
    """float32 [out_features]."""
    steps: torch.Tensor | None
    """int8 [out_features, in_features], for `torch._int_mm`; None where it is not exact here."""

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Matrix:
        """`weight` [N, K] (K whole groups) turned and in int8, row by row."""
        steps, scales = rotate_quantize(weight.detach())
        n, k = steps.shape
        padded = torch.zeros(-(-n // WEIGHT_ROWS) * WEIGHT_ROWS, k, dtype=torch.int8)
        padded[:n] = steps
        packed = padded.view(-1, WEIGHT_ROWS, k // CHUNK, CHUNK).permute(0, 2, 1, 3).contiguous()
        return cls(packed, scales, steps if int_mm_exact() else None)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), as a weight tensor's."""
        return self.scales.shape[0], self.packed.shape[1] * CHUNK

    @property
    def dtype(self) -> torch.dtype:
        """The dtype rows come out in (float32; they go in as float32 and are rounded to int8 here)."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed steps, the steps for `_int_mm` where kept, and the scales."""
        steps = 0 if self.steps is None else self.steps.numel()
        return self.packed.numel() + steps + self.scales.numel() * 4

    @property
    def step_bytes(self) -> int:
        """Bytes a product reads: one copy of the steps (packed or for `_int_mm`) and the scales."""
        return self.packed.numel() + self.scales.numel() * 4

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x[rows, K] @ weight^T as float32 [rows, N]: x turned and rounded row by row, the int32 sums
        times the row's scale, rounded, times the weight row's, rounded."""
        x = x.to(torch.float32).contiguous()
        rows, (n, k) = x.shape[0], self.shape
        if rows > C_MAX_ROWS and self.steps is not None:
            q, row_scales = rotate_quantize(x)
            sums = torch._int_mm(q, self.steps.t())
            out = torch.empty(rows, n, dtype=torch.float32)
            _int8_rows.scale(
                out.data_ptr(), sums.data_ptr(), row_scales.data_ptr(), self.scales.data_ptr(), rows, n
            )
            return out
        if x.shape[1] != k:
            raise ValueError(f"rows of {x.shape[1]} values for weights of {n} x {k}")
        out = torch.empty(rows, n, dtype=torch.float32)
        _int8_rows.linear(
            out.data_ptr(), x.data_ptr(), self.packed.data_ptr(), self.scales.data_ptr(), rows, n, k
        )
        return out

    def dequantize(self) -> torch.Tensor:
        """The weights as float32 [N, K], as the steps hold them (turned back; for tests and
        comparisons)."""
        n, k = self.shape
        steps = self.packed.permute(0, 2, 1, 3).reshape(-1, k)[:n]
        turned = (steps.float() * self.scales[:, None]).reshape(n, k // GROUP, GROUP)
        return (turned @ _hadamard()).reshape(n, k)

"""A library matrix product made batch-invariant by calling it at one row count, checked at start.

A matrix product has no sum across rows: row r of x @ W^T is row r of x times W. A general matrix
product (MKL, oneDNN) still may give a row other bits beside other rows, because it picks its
kernel and blocking by the shape and may treat edge rows another way; at one fixed shape it runs the
same code every time, so a row's bits can depend only on where it sits and what its neighbours
hold. `check` measures exactly that: a row computed in every slot of a block, beside other fills
(itself, random rows of two scales, zeros), must come out bit for bit the same. Where it does,
`FixedRows` calls the product only at that row count: a step's rows are padded to a whole number
of blocks and multiplied block by block, so a row's values are the same alone or among any others,
on whatever the library runs (AVX2, AVX-512, AMX, ARM) without a line of ISA code here.

The check is necessary: on an Intel Xeon with AMX, with MKL and oneDNN held to AVX2, float32 rows
differed by slot at 8 rows (and 32), not at 4, 16 or 64; bfloat16 held at every size.
"""

from __future__ import annotations

import torch

FILLS = 4
"""Products per matrix the check runs (see `check`)."""


class FixedRows:
    """`x @ weight^T` through PyTorch at exactly `block` rows a call, whatever rows a step has."""

    def __init__(self, block: int) -> None:
        if block < 1:
            raise ValueError(f"a block of {block} rows")
        self.block = block

    def product(self, out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
        """out[block, N] = x[block, K] @ weight^T, in weight's dtype: the one call the check measured.
        Any other row count is refused: the row-by-row check says nothing about it."""
        if x.shape[0] != self.block or out.shape[0] != self.block:
            raise ValueError(f"a product of {x.shape[0]} rows on a path checked at {self.block} rows")
        torch.mm(x, weight.t(), out=out)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x[rows, K] @ weight^T for any number of rows, as float32: the rows padded with zeros to
        whole blocks, cast to weight's dtype, multiplied block by block."""
        rows, k = x.shape
        padded = -(-rows // self.block) * self.block
        inputs = torch.zeros(padded, k, dtype=weight.dtype)
        inputs[:rows] = x
        out = torch.empty(padded, weight.shape[0], dtype=weight.dtype)
        for start in range(0, padded, self.block):
            stop = start + self.block
            self.product(out[start:stop], inputs[start:stop], weight)
        return out[:rows].float()


def check(block: int, weights: list[torch.Tensor], seed: int = 0) -> list[str]:
    """What differs when one row is multiplied by each of `weights` in every slot of a block (empty
    where nothing does): per matrix FILLS products, the row in every slot, then in the even slots
    beside random rows, in the odd slots beside random rows a hundred times larger, and in every
    third slot beside zeros (the padding), each result compared bit for bit with the first."""
    fixed = FixedRows(block)
    generator = torch.Generator().manual_seed(seed)
    failures = []
    slots = torch.arange(block)
    for weight in weights:
        n, k = weight.shape
        row = torch.randn(k, generator=generator).to(weight.dtype)
        fills = (
            (row.expand(block, k), slots >= 0),
            (torch.randn(block, k, generator=generator), slots % 2 == 0),
            (torch.randn(block, k, generator=generator) * 100, slots % 2 == 1),
            (torch.zeros(block, k), slots % 3 == 0),
        )
        reference = None
        differing = 0
        for fill, mine in fills:
            x = fill.to(weight.dtype).clone(memory_format=torch.contiguous_format)
            x[mine] = row
            out = torch.empty(block, n, dtype=weight.dtype)
            fixed.product(out, x, weight)
            if reference is None:
                reference = out[0].clone()
            differing += sum(not torch.equal(out[s], reference) for s in slots[mine].tolist())
        if differing:
            failures.append(f"{n} x {k} {str(weight.dtype).removeprefix('torch.')}: {differing} rows differ")
    return failures

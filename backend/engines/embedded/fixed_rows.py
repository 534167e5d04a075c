"""A library matrix product made batch-invariant by calling it only at row counts checked at start.

A matrix product has no sum across rows: row r of x @ W^T is row r of x times W. A general matrix
product (MKL, oneDNN) still may give a row other bits beside other rows, because it picks its
kernel and blocking by the shape and may treat edge rows another way; at one fixed shape it runs the
same code every time, so a row's bits can depend only on where it sits and what its neighbours
hold. `check` measures exactly that: a row computed in every slot of a block, beside other fills
(itself, random rows of two scales, zeros), must come out bit for bit the same. Where it does,
`FixedRows` calls the product only at that row count: a step's rows are padded to a whole number
of blocks and multiplied block by block, so a row's values are the same alone or among any others,
on whatever the library runs (AVX2, AVX-512, AMX, ARM) without a line of ISA code here.

A path may also be checked at a ladder of sizes (1, 2, 4, ... up to its block): the same row must
then give the same bits at every size of the ladder, in every slot. A step then multiplies whole
blocks and its remaining rows at the smallest size of the ladder that holds them, rather than a
padded block: one row costs a one-row product. Where a library's kernel changes with the row count
(float32 at 1 row against 4 on the Xeon below), the ladder fails its check and the block alone is
used.

The check is necessary: on an Intel Xeon with AMX, with MKL and oneDNN held to AVX2, float32 rows
differed by slot at 8 rows (and 32), not at 4, 16 or 64; bfloat16 held at every size.
"""

from __future__ import annotations

import torch

from backend.engines.embedded.compute import chunks
from backend.engines.embedded.int4 import Int4Matrix
from backend.engines.embedded.int8 import Int8Matrix

FILLS = 4
"""Products per matrix and row count the check runs (see `check`)."""


Weight = torch.Tensor | Int4Matrix | Int8Matrix
"""What a product multiplies by: a weight tensor [N, K], or the same in 4-bit groups (int4.py) or in
int8 (int8.py, which needs no fixed row counts)."""


def product(out: torch.Tensor, x: torch.Tensor, weight: Weight) -> None:
    """out[rows, N] = x[rows, K] @ weight^T in the weight's product dtype: one library call."""
    if isinstance(weight, Int4Matrix):
        out.copy_(weight.product(x))
    else:
        torch.mm(x, weight.t(), out=out)


class FixedRows:
    """`x @ weight^T` through PyTorch at only the row counts `sizes` a call (the largest, the block),
    whatever rows a step has."""

    def __init__(self, sizes: int | tuple[int, ...]) -> None:
        sizes = (sizes,) if isinstance(sizes, int) else tuple(sorted(set(sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"row counts {sizes}")
        self.sizes = sizes
        self.block = sizes[-1]

    def product(self, out: torch.Tensor, x: torch.Tensor, weight: Weight) -> None:
        """out[size, N] = x[size, K] @ weight^T, in the product's dtype, at one of `sizes`: a call the
        check measured. Any other row count is refused: the row-by-row check says nothing about it."""
        if x.shape[0] not in self.sizes or out.shape[0] != x.shape[0]:
            counts = "/".join(map(str, self.sizes))
            raise ValueError(f"a product of {x.shape[0]} rows on a path checked at {counts} rows")
        product(out, x, weight)

    def chunks(self, rows: int) -> list[int]:
        """The row counts a product of `rows` rows is made of (compute.chunks)."""
        return chunks(self.sizes, rows)

    def linear(self, x: torch.Tensor, weight: Weight) -> torch.Tensor:
        """x[rows, K] @ weight^T for any number of rows, as float32: the rows padded with zeros to
        `chunks`, cast to the product's dtype, multiplied chunk by chunk."""
        rows, k = x.shape
        chunks = self.chunks(rows)
        if chunks == [rows]:  # a checked size as it stands: no padding, one call
            out = torch.empty(rows, weight.shape[0], dtype=weight.dtype)
            self.product(out, x.to(weight.dtype).contiguous(), weight)
            return out.float()
        padded = sum(chunks)
        inputs = torch.zeros(padded, k, dtype=weight.dtype)
        inputs[:rows] = x
        out = torch.empty(padded, weight.shape[0], dtype=weight.dtype)
        start = 0
        for size in chunks:
            self.product(out[start : start + size], inputs[start : start + size], weight)
            start += size
        return out[:rows].float()


def check(sizes: int | tuple[int, ...], weights: list[Weight], seed: int = 0) -> list[str]:
    """What differs when one row is multiplied by each of `weights` in every slot, at every one of
    `sizes` (empty where nothing does): per matrix and size FILLS products, the row in every slot,
    then in the even slots beside random rows, in the odd slots beside random rows a hundred times
    larger, and in every third slot beside zeros (the padding), each result compared bit for bit
    with the first (at the first size)."""
    fixed = FixedRows(sizes)
    generator = torch.Generator().manual_seed(seed)
    failures = []
    for weight in weights:
        n, k = weight.shape
        row = torch.randn(k, generator=generator).to(weight.dtype)
        reference = None
        differing = {}
        for size in fixed.sizes:
            slots = torch.arange(size)
            fills = (
                (row.expand(size, k), slots >= 0),
                (torch.randn(size, k, generator=generator), slots % 2 == 0),
                (torch.randn(size, k, generator=generator) * 100, slots % 2 == 1),
                (torch.zeros(size, k), slots % 3 == 0),
            )
            for fill, mine in fills:
                if not bool(mine.any()):
                    continue
                x = fill.to(weight.dtype).clone(memory_format=torch.contiguous_format)
                x[mine] = row
                out = torch.empty(size, n, dtype=weight.dtype)
                fixed.product(out, x, weight)
                if reference is None:
                    reference = out[0].clone()
                wrong = sum(not torch.equal(out[s], reference) for s in slots[mine].tolist())
                if wrong:
                    differing[size] = differing.get(size, 0) + wrong
        if differing:
            kind = "int4" if isinstance(weight, Int4Matrix) else str(weight.dtype).removeprefix("torch.")
            where = ", ".join(f"{count} at {size} rows" for size, count in differing.items())
            failures.append(f"{n} x {k} {kind}: rows differ ({where})")
    return failures

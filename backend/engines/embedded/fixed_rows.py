"""A library matrix product made batch-invariant by calling it only at row counts checked at start.

A matrix product has no sum across rows: row r of x @ W^T is row r of x times W. A general matrix
product (MKL, oneDNN) still may give a row other bits beside other rows, because it picks its
kernel and blocking by the shape and may treat edge rows another way; at one fixed shape it runs the
same code every time, so a row's bits can depend only on where it sits and what its neighbours
hold. `check` measures exactly that: rows computed in other slots of a block, beside other rows,
must come out bit for bit as each did alone. Where they do, `FixedRows` calls the product only at
that row count: a step's rows are padded to a whole number of blocks and multiplied block by block,
so a row's values are the same alone or among any others, on whatever the library runs (AVX2,
AVX-512, AMX, ARM) without a line of ISA code here.

A path may also be checked at a ladder of sizes (1, 2, 4, ... up to its block): the same row must
then give the same bits at every size of the ladder, in every slot. A step then multiplies whole
blocks and its remaining rows at the smallest size of the ladder that holds them, rather than a
padded block: one row costs a one-row product. Where a library's kernel changes with the row count
(float32 at 1 row against 4 on the Xeon below), the ladder fails its check and the block alone is
used.

The check is necessary: on an Intel Xeon with AMX, with MKL and oneDNN held to AVX2, float32 rows
differed by slot at 8 rows (and 32), not at 4, 16 or 64; bfloat16 held at every size there, but on
an AMD EPYC with AVX-512-BF16 a bfloat16 row of the 576 x 1536 matrix alone differed from the same
row beside others now and then (`check`).
"""

from __future__ import annotations

import torch

from backend.engines.embedded.compute import chunks

CHECK_ROWS = 16
"""Distinct random rows `check` multiplies by each matrix, alone and at each size."""


def product(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """out[rows, N] = x[rows, K] @ weight^T in the weight's dtype: one library call."""
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

    def product(self, out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
        """out[size, N] = x[size, K] @ weight^T, in the product's dtype, at one of `sizes`: a call the
        check measured. Any other row count is refused: the row-by-row check says nothing about it."""
        if x.shape[0] not in self.sizes or out.shape[0] != x.shape[0]:
            counts = "/".join(map(str, self.sizes))
            raise ValueError(f"a product of {x.shape[0]} rows on a path checked at {counts} rows")
        product(out, x, weight)

    def chunks(self, rows: int) -> list[int]:
        """The row counts a product of `rows` rows is made of (compute.chunks)."""
        return chunks(self.sizes, rows)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
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


def check(sizes: int | tuple[int, ...], weights: list[torch.Tensor], seed: int = 0) -> list[str]:
    """What differs when rows are multiplied by each of `weights` at every one of `sizes`, beside
    other rows and in other slots, against each row multiplied alone (empty where nothing does).

    Per matrix, CHECK_ROWS random rows (every third a hundred times larger) are each multiplied
    alone (slot 0 of the first size, zeros beside it, as a step's padding), then at each larger size
    in blocks of that size, in order and in reverse order (so that each row takes two slots and two
    sets of neighbours), and each row's result is compared bit for bit with its own alone. Many
    rows, not one: a kernel that adds a row's products in another order at another row count gives
    other bits only where the output's rounding falls differently, which bfloat16 hides for most
    rows (oneDNN's bfloat16 product of the 576 x 1536 matrix on an AMD EPYC with AVX-512-BF16: 3 of
    20 rows differed between 1 row and 2 to 32)."""
    fixed = FixedRows(sizes)
    generator = torch.Generator().manual_seed(seed)
    failures = []
    for weight in weights:
        n, k = weight.shape
        rows = torch.randn(CHECK_ROWS, k, generator=generator)
        rows[1::3] *= 100
        rows = rows.to(weight.dtype)
        first = fixed.sizes[0]
        alone = []
        for row in rows:
            x = torch.zeros(first, k, dtype=weight.dtype)
            x[0] = row
            out = torch.empty(first, n, dtype=weight.dtype)
            fixed.product(out, x, weight)
            alone.append(out[0].clone())
        differing: dict[int, int] = {}
        for size in fixed.sizes:
            if size == 1:
                continue  # a row alone, as above
            for order in (torch.arange(CHECK_ROWS), torch.arange(CHECK_ROWS).flip(0)):
                for start in range(0, max(CHECK_ROWS, size), size):
                    picked = order[(start + torch.arange(size)) % CHECK_ROWS].tolist()
                    out = torch.empty(size, n, dtype=weight.dtype)
                    fixed.product(out, rows[picked].contiguous(), weight)
                    wrong = sum(not torch.equal(out[slot], alone[i]) for slot, i in enumerate(picked))
                    if wrong:
                        differing[size] = differing.get(size, 0) + wrong
        if differing:
            kind = str(weight.dtype).removeprefix("torch.")
            where = ", ".join(f"{count} at {size} rows" for size, count in differing.items())
            failures.append(f"{n} x {k} {kind}: rows differ ({where})")
    return failures

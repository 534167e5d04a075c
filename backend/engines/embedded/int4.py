"""Weight matrices as 4-bit groups for PyTorch's int4 weight-only product (the `int4-torch` path).

Each group of GROUP weights along a row is held as 4-bit steps 0..15 with a bfloat16 scale and
zero: weight = (step - 8) * scale + zero. `Int4Matrix.quantize` finds them from a float weight by
each group's least and greatest value (scale = (greatest - least) / 15, zero = least + 8 * scale), as
llama.cpp's Q4_1 does; the bundled GGUF's layers are Q4_1 blocks of 32, so their steps come back
exactly and only the scale and zero are rounded (to bfloat16). The product is
`torch.ops.aten._weight_int4pack_mm_for_cpu`, the operator torchao's int4 weight-only CPU layout
calls: bfloat16 rows in, bfloat16 out, the weights read at about 4.5 bits each (a decode step of
the bundled model reads 84 MB, against 270 MB in bfloat16). It has vectorised kernels for AVX-512
and AVX2 and is slow without them (and with float32 rows: a reference loop), so `available` says
whether this torch has it and the start-up probe times it like every path.

fixed_rows.py calls it at checked row counts only, as every library product here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
"""Weights per scale and zero (the GGUF's Q4_1 blocks hold 32 too)."""

_OP = "_weight_int4pack_mm_for_cpu"


def available() -> tuple[bool, str]:
    """(whether this torch build has the int4 product and its CPU kernels, why not where it does not)."""
    if not hasattr(torch.ops.aten, _OP) or not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        return False, f"this torch ({torch.__version__}) has no {_OP}"
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return False, "PyTorch runs its CPU kernels unvectorised here (ATEN_CPU_CAPABILITY=default)"
    return True, ""


@dataclass(frozen=True)
class Int4Matrix:
    """A weight matrix [out_features, in_features] in 4-bit groups, in the int4 product's layout."""

    packed: torch.Tensor
    """uint8 [out_features, in_features / 2]: two steps a byte, as _convert_weight_to_int4pack_for_cpu
    packs them."""
    scales_zeros: torch.Tensor
    """bfloat16 [in_features / GROUP, out_features, 2]: each group's scale and zero."""

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int4Matrix:
        """`weight` [N, K] (K a multiple of GROUP) in 4-bit groups, by each group's range."""
        n, k = weight.shape
        if k % GROUP:
            raise ValueError(f"a row of {k} weights is not whole groups of {GROUP}")
        groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
        least = groups.amin(dim=-1)
        scale = ((groups.amax(dim=-1) - least) / 15).to(torch.bfloat16)
        zero = (least + 8 * scale.float()).to(torch.bfloat16)
        # Steps against the rounded scale, from the group's least value (step 0).
        safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
        steps = groups - (zero.float() - 8 * scale.float())[..., None]  # in place from here on
        steps = steps.div_(safe[..., None]).round_().clamp_(0, 15).to(torch.int32).reshape(n, k)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(steps, 1)
        scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()
        return cls(packed, scales_zeros)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), as a weight tensor's."""
        return self.packed.shape[0], self.scales_zeros.shape[0] * GROUP

    @property
    def dtype(self) -> torch.dtype:
        """The product's dtype: rows go in and come out as bfloat16."""
        return torch.bfloat16

    @property
    def nbytes(self) -> int:
        """Bytes held (and read by a product): the steps and the scales and zeros."""
        return (
            self.packed.numel() * self.packed.element_size()
            + self.scales_zeros.numel() * self.scales_zeros.element_size()
        )

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x[rows, K] @ weight^T as bfloat16 [rows, N] (x cast to bfloat16)."""
        op = getattr(torch.ops.aten, _OP)
        return op(x.to(torch.bfloat16).contiguous(), self.packed, GROUP, self.scales_zeros)

    def dequantize(self) -> torch.Tensor:
        """The weights as float32 [N, K], each as the product forms it, rounded to bfloat16 (for tests
        and comparisons)."""
        n, k = self.shape
        eye = torch.eye(k, dtype=torch.bfloat16)
        return self.product(eye).float().t().contiguous().reshape(n, k)

"""The model's weights in a compute path's format (linear.py), made once from the float32 tensors of
the converted folder and, for `fp32-blocks`, the GGUF's blocks beside them.

A layer's matrices are fused as the forward pass multiplies them (q, k and v in one; gate and up in
one). `matrix` makes one matrix in a `Form`; `model_weights` every matrix, norm and the embedding a
forward pass reads; the start-up probe (startup_probe.py) makes a few layers' the same way, so that
what it times is what the model will run. The output layer takes the layers' format: int8 in int8
(the embedding beside it in float32), bfloat16 in bfloat16 (tied to the embedding, which is then
bfloat16 too), the GGUF's blocks from its Q8_0 blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.engines.embedded.compute import Choice
from backend.engines.embedded.fixed_rows import FixedRows
from backend.engines.embedded.int8 import Int8Matrix
from backend.engines.embedded.linear import BlockWeight, LibraryWeight, Weight
from backend.engines.embedded.quantized import BlockMatrix, PackedMatrix, concat

MATRICES = ("qkv", "out", "gate_up", "down")
"""A layer's weight matrices, fused."""

PARTS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "out": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""Each fused matrix's tensors, in order, by their transformers names within a layer."""


@dataclass(frozen=True)
class Form:
    """A weight format (compute.FORMS) and what its products need."""

    name: str = "library"
    dtype: torch.dtype = torch.float32
    """A library form's weights' dtype (the others hold float32 or int8 as their format says)."""
    sizes: tuple[int, ...] = ()
    """A library form's checked row counts for a decode step's products (empty: any row count)."""

    @classmethod
    def of(cls, choice: Choice) -> Form:
        """The form a compute choice multiplies in."""
        return cls(choice.path.form, getattr(torch, choice.path.dtype), choice.sizes)


FLOAT32 = Form()
"""Float32 weights through PyTorch's product at any row count: the reference forms are compared with."""


@dataclass
class LayerWeights:
    """One decoder layer, with fused projections."""

    attn_norm: torch.Tensor
    qkv: Weight
    out: Weight
    mlp_norm: torch.Tensor
    gate_up: Weight
    down: Weight


@dataclass
class ModelWeights:
    """Everything a forward pass reads, the matrices in one format."""

    embed: torch.Tensor
    lm_head: Weight
    final_norm: torch.Tensor
    layers: list[LayerWeights]
    form: Form

    def matrices(self) -> list[Weight]:
        """Every matrix a decode step multiplies by."""
        return [getattr(layer, name) for layer in self.layers for name in MATRICES] + [self.lm_head]

    @property
    def rows_independent(self) -> bool:
        """Whether a row's products never depend on the rows beside it, at any row count (prompts
        arriving together may then be prefilled in one pass)."""
        return all(matrix.rows_independent for matrix in self.matrices())

    def nbytes(self) -> int:
        """Bytes held: the matrices, the embedding (where not the output layer's own) and the norms."""
        norms = [self.final_norm, *(n for layer in self.layers for n in (layer.attn_norm, layer.mlp_norm))]
        tensors = norms if _holds_embed(self.lm_head, self.embed) else [self.embed, *norms]
        return sum(matrix.nbytes for matrix in self.matrices()) + sum(
            t.numel() * t.element_size() for t in tensors
        )

    def step_bytes(self) -> int:
        """Bytes a decode step reads of the matrices."""
        return sum(matrix.step_bytes for matrix in self.matrices())


def _holds_embed(head: Weight, embed: torch.Tensor) -> bool:
    """Whether the output layer holds the embedding itself (tied, in the same dtype)."""
    return getattr(head, "weight", None) is embed or getattr(head, "dense", None) is embed


def matrix(tensor: torch.Tensor, form: Form, blocks: PackedMatrix | None = None) -> Weight:
    """`tensor` [N, K] (float32) as a matrix of `form`; `blocks` are its GGUF blocks, packed (a
    blocks form multiplies the float32 tensor through the rows kernel where it has none)."""
    if form.name == "int8":
        return Int8Matrix.quantize(tensor)
    if form.name == "blocks":
        return BlockWeight(tensor.float().contiguous(), blocks)
    return LibraryWeight(tensor.to(form.dtype).contiguous(), FixedRows(form.sizes) if form.sizes else None)


def fused_blocks(blocks: dict[str, BlockMatrix], layer: int) -> dict[str, BlockMatrix]:
    """Layer `layer`'s GGUF blocks fused as its matrices are; those it lacks (or whose parts differ in
    kind) are left out."""
    prefix = f"model.layers.{layer}."
    fused = {
        name: concat([blocks.get(f"{prefix}{part}.weight") for part in parts])
        for name, parts in PARTS.items()
    }
    return {name: block for name, block in fused.items() if block is not None}


def layer_blocks(blocks: dict[str, BlockMatrix], layer: int) -> dict[str, PackedMatrix]:
    """`fused_blocks`, packed for the rows kernel."""
    return {name: block.packed() for name, block in fused_blocks(blocks, layer).items()}


def fused(tensors: dict[str, torch.Tensor], layer: int, name: str) -> torch.Tensor:
    """Layer `layer`'s fused matrix `name` (MATRICES) as float32."""
    parts = [_tensor(tensors, f"model.layers.{layer}.{part}.weight") for part in PARTS[name]]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).float().contiguous()


def _tensor(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise ValueError(f"the weights have no tensor {name!r}")
    return tensors[name]


def head_name(tied: bool) -> str:
    """The output layer's tensor name (the embedding's where they are tied)."""
    return "model.embed_tokens.weight" if tied else "lm_head.weight"


def model_weights(
    tensors: dict[str, torch.Tensor],
    layers: int,
    form: Form = FLOAT32,
    blocks: dict[str, BlockMatrix] | None = None,
    tied: bool = False,
) -> ModelWeights:
    """A model's weights of `layers` layers in `form`, from its float32 `tensors` and, for a blocks
    form, its GGUF `blocks` by tensor name (`tied`: the output layer is the embedding)."""
    blocks = blocks if form.name == "blocks" and blocks else {}
    embed = _tensor(tensors, "model.embed_tokens.weight").float().contiguous()
    head_blocks = blocks.get(head_name(tied))
    packed_head = head_blocks.packed() if head_blocks is not None else None
    head = embed if tied else _tensor(tensors, "lm_head.weight")
    if form.name == "library":
        embed = embed.to(form.dtype)
        head = embed if tied else head
    lm_head = matrix(head, form, packed_head)
    made = []
    for i in range(layers):
        packed = layer_blocks(blocks, i)
        norm = f"model.layers.{i}."
        weights = {name: matrix(fused(tensors, i, name), form, packed.get(name)) for name in MATRICES}
        made.append(
            LayerWeights(
                attn_norm=_tensor(tensors, norm + "input_layernorm.weight").float(),
                mlp_norm=_tensor(tensors, norm + "post_attention_layernorm.weight").float(),
                **weights,
            )
        )
    final_norm = _tensor(tensors, "model.norm.weight").float()
    return ModelWeights(embed, lm_head, final_norm, made, form=form)

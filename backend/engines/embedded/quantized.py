"""The bundled GGUF's weights as its own quantized blocks, for the rows kernel (rows_linear.c).

SmolLM2-135M ships as a GGUF whose layers are Q4_1 blocks and whose embedding (also the output
layer) is Q8_0: 96 MB, against 538 MB for the same weights as float32. The engine holds the float32
weights the conversion wrote (weights.py), and beside them, for the matrices a decode step
multiplies, the GGUF's blocks, regrouped once for the kernel (`PackedMatrix`): the rows kernel
dequantizes each group as it multiplies, and a step reads a sixth of the bytes from memory.

The blocks are used only where they are exactly the weights the engine holds. `read_blocks`
dequantizes every matrix of the GGUF (with the kernel's own code, which gives gguf-py's values bit
for bit) and compares it with the float32 tensor of the same name, row by row: the conversion
reorders the rows of q and k (llama.cpp's GGUFs store them permuted for their rotary layout), so
rows are matched by value and the blocks reordered to the tensor's order. A matrix whose rows do
not all match is multiplied from its float32 weights by the same kernel.

gguf-py's reader parses the file's metadata (the tokenizer's 49,152 entries) in Python, 6-8 s
here, so `load_blocks` does that once: it keeps the matched blocks beside the converted weights
(BLOCKS_FILE, safetensors) and later starts read that file and check each matrix against its
float32 tensor again (dequantize and compare: about half a second), reading the GGUF anew if any
differs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("backend.embedded")

BLOCKS_FILE = "gguf-blocks/blocks.safetensors"
"""The matched blocks, kept in the converted model's folder (in a folder of their own: the weights
are every *.safetensors file at the top, weights.read_tensors)."""

BLOCK_WEIGHTS = 32
"""Weights per block, in every kind used here."""

PANEL_ROWS = 24
"""Weight rows the kernel multiplies together, a packed group (rows_linear.c's PANEL)."""

KINDS = {"Q4_1": (1, 20), "Q8_0": (2, 34)}
"""GGUF block kind -> (the kernel's number for it, bytes per block of 32 weights)."""

LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""A Llama GGUF's layer matrices -> the transformers names the converted folder uses."""


def row_bytes(kind: str, in_features: int) -> int:
    """Bytes of a row of `in_features` weights as blocks of `kind`; a ValueError unless `kind` is
    one of KINDS and the row whole blocks."""
    if kind not in KINDS or in_features <= 0 or in_features % BLOCK_WEIGHTS:
        raise ValueError(f"not a {'/'.join(KINDS)} matrix of whole blocks: {kind}, {in_features}")
    return in_features // BLOCK_WEIGHTS * KINDS[kind][1]


@dataclass(frozen=True)
class BlockMatrix:
    """A weight matrix [out_features, in_features] as quantized blocks: row r is `data[r]`,
    in_features / 32 blocks of `kind`."""

    data: torch.Tensor
    """uint8 [out_features, in_features / 32 * block bytes], contiguous."""
    kind: str
    in_features: int

    def __post_init__(self) -> None:
        # The kernel reads out_features x in_features / 32 blocks from `data`'s address: a matrix
        # of another shape must never reach it.
        row = row_bytes(self.kind, self.in_features)
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[1] != row:
            raise ValueError(
                f"{self.kind} rows of {self.in_features} weights take {row} bytes, not {self.data.shape}"
            )
        if not self.data.is_contiguous():
            raise ValueError("the blocks must be contiguous")

    @property
    def code(self) -> int:
        """The kernel's number for `kind`."""
        return KINDS[self.kind][0]

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weights [out_features, in_features], as gguf-py computes them (by the code the
        kernel multiplies with)."""
        from backend.engines.embedded import _rows_linear

        out = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        _rows_linear.dequantize(out.data_ptr(), self.data.data_ptr(), self.code, *out.shape)
        return out

    def packed(self) -> PackedMatrix:
        """The blocks regrouped as the kernel multiplies them (`PackedMatrix`)."""
        from backend.engines.embedded import _rows_linear

        if _rows_linear.PANEL_ROWS != PANEL_ROWS:
            raise RuntimeError(f"the kernel packs {_rows_linear.PANEL_ROWS} rows a group, not {PANEL_ROWS}")
        rows, width = self.out_features, self.in_features
        data = torch.empty(-(-rows // PANEL_ROWS), PANEL_ROWS * self.data.shape[1], dtype=torch.uint8)
        _rows_linear.pack(data.data_ptr(), self.data.data_ptr(), self.code, rows, width)
        return PackedMatrix(data, self.kind, rows, width)


@dataclass(frozen=True)
class PackedMatrix:
    """A `BlockMatrix`'s blocks as the rows kernel reads them: the rows in groups of `PANEL_ROWS`
    (24), each group's blocks of the same 32 columns side by side, scales first, then the quantized
    weights: Q8_0 a column's bytes for the group's rows together, Q4_1 eight columns of a row in
    one 32-bit word, the group's words for those columns together (rows_linear.c, `pack_nt`). The
    kernel dequantizes a group's column of 24 weights with a few vector operations, into the layout
    its tiles multiply by (each input row's value of a column broadcast against 24 weights)."""

    data: torch.Tensor
    """uint8 [groups, in_features / 32 * PANEL_ROWS * block bytes], contiguous."""
    kind: str
    out_features: int
    in_features: int

    def __post_init__(self) -> None:
        # As for BlockMatrix: the kernel reads every group's bytes from `data`'s address.
        shape = (-(-self.out_features // PANEL_ROWS), row_bytes(self.kind, self.in_features) * PANEL_ROWS)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != shape or not self.data.is_contiguous():
            rows = self.out_features
            raise ValueError(f"packed {self.kind} groups of {rows} rows take {shape}, not {self.data.shape}")

    @property
    def code(self) -> int:
        """The kernel's number for `kind`."""
        return KINDS[self.kind][0]

    @property
    def nbytes(self) -> int:
        """Bytes a product reads (the last group's rows past out_features included)."""
        return self.data.numel()

    def first_rows(self, rows: int) -> PackedMatrix:
        """The matrix of the first `rows` rows (whole groups of PANEL_ROWS), sharing these bytes."""
        if rows % PANEL_ROWS or not 0 < rows <= self.out_features:
            raise ValueError(f"{rows} rows are not whole groups of {PANEL_ROWS} of {self.out_features}")
        return PackedMatrix(self.data[: rows // PANEL_ROWS], self.kind, rows, self.in_features)


def concat(parts: list[BlockMatrix | None]) -> BlockMatrix | None:
    """The matrices' rows one after another (a fused projection), or None unless all are blocks of
    one kind and width."""
    if not parts or any(p is None for p in parts):
        return None
    first = parts[0]
    assert first is not None
    if any(p.kind != first.kind or p.in_features != first.in_features for p in parts if p is not None):
        return None
    return BlockMatrix(
        torch.cat([p.data for p in parts if p is not None]).contiguous(), first.kind, first.in_features
    )


def hf_name(gguf_name: str) -> str | None:
    """The transformers tensor name of a Llama GGUF tensor, or None for one the engine does not map."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LLAMA_NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{LLAMA_NAMES[parts[2]]}.weight"
    return None


def fits(blocks: BlockMatrix, dense: torch.Tensor) -> bool:
    """Whether `dense` is a float32 tensor of `blocks`'s shape."""
    return dense.dtype == torch.float32 and tuple(dense.shape) == (blocks.out_features, blocks.in_features)


def log_loaded(blocks: dict[str, BlockMatrix], how: str, started: float) -> None:
    """Log how many matrices `blocks` holds, their size, and the seconds since `started`."""
    log.info(
        "GGUF blocks for %d matrices (%.0f MB) %s in %.2f s",
        len(blocks),
        sum(b.nbytes for b in blocks.values()) / 1e6,
        how,
        time.perf_counter() - started,
    )


def match_rows(blocks: BlockMatrix, dense: torch.Tensor) -> BlockMatrix | None:
    """`blocks` with its rows in the order of `dense`'s, each dequantizing to exactly that row; None
    if any row of `dense` is not among them."""
    if not fits(blocks, dense):
        return None
    values = blocks.dequantize()
    if torch.equal(values, dense):
        return blocks
    index = {row.tobytes(): i for i, row in enumerate(values.numpy())}
    order = [index.get(row.tobytes()) for row in dense.numpy()]
    if any(i is None for i in order):
        return None
    return BlockMatrix(blocks.data[order].contiguous(), blocks.kind, blocks.in_features)


def read_blocks(gguf: Path, tensors: dict[str, torch.Tensor]) -> dict[str, BlockMatrix]:
    """The GGUF's Q4_1/Q8_0 matrices that are exactly the float32 `tensors` of the same names, by
    transformers name, rows in the tensors' order. Logs what it kept and what it took."""
    from gguf import GGUFReader

    started = time.perf_counter()
    reader = GGUFReader(gguf)
    found: dict[str, BlockMatrix] = {}
    differing = []
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        kind = tensor.tensor_type.name
        if name is None or name not in tensors or kind not in KINDS:
            continue
        data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True))
        blocks = BlockMatrix(data.reshape(data.shape[0], -1).contiguous(), kind, int(tensor.shape[0]))
        matched = match_rows(blocks, tensors[name])
        if matched is None:
            differing.append(name)
        else:
            found[name] = matched
    if differing:
        log.warning(
            "%d GGUF matrices are not exactly the converted weights; they stay float32: %s",
            len(differing),
            ", ".join(differing[:4]),
        )
    log_loaded(found, "matched to the float32 weights", started)
    return found


def exact(blocks: dict[str, BlockMatrix], tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every matrix dequantizes to exactly the tensor of its name."""
    return all(
        name in tensors and fits(m, tensors[name]) and torch.equal(m.dequantize(), tensors[name])
        for name, m in blocks.items()
    )


def save_blocks(blocks: dict[str, BlockMatrix], path: Path) -> None:
    """Write `blocks` to `path` (safetensors; kinds and widths in its metadata), whole or not at all."""
    from safetensors.torch import save_file

    layout = {name: [m.kind, m.in_features] for name, m in blocks.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".blocks-", suffix=".tmp")
    os.close(handle)
    try:
        save_file(
            {name: m.data for name, m in blocks.items()}, temporary, metadata={"layout": json.dumps(layout)}
        )
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_saved_blocks(path: Path) -> dict[str, BlockMatrix]:
    """The blocks `save_blocks` wrote; empty if the file is missing or not one of those."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            layout = json.loads((handle.metadata() or {})["layout"])
            return {
                name: BlockMatrix(handle.get_tensor(name).contiguous(), kind, int(width))
                for name, (kind, width) in layout.items()
                if kind in KINDS
            }
    except (OSError, SafetensorError, KeyError, ValueError, TypeError) as exc:
        if path.exists():
            log.warning("the saved GGUF blocks at %s cannot be read (%s); reading the GGUF again", path, exc)
        return {}


def load_blocks(folder: Path, gguf: Path, tensors: dict[str, torch.Tensor]) -> dict[str, BlockMatrix]:
    """The GGUF's blocks for the float32 `tensors` of the model in `folder`: from the folder's
    BLOCKS_FILE where every matrix there still matches, else from the GGUF (then saved there)."""
    started = time.perf_counter()
    path = folder / BLOCKS_FILE
    saved = read_saved_blocks(path)
    if saved and exact(saved, tensors):
        log_loaded(saved, "read and checked against the float32 weights", started)
        return saved
    if saved:
        log.warning("the saved GGUF blocks at %s are not the model's weights; reading the GGUF again", path)
    found = read_blocks(gguf, tensors)
    try:
        save_blocks(found, path)
    except OSError as exc:  # a read-only folder: the next start reads the GGUF again
        log.warning("could not keep the GGUF blocks at %s (%s)", path, exc)
    return found

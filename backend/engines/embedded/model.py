"""A Llama forward pass in plain torch, with a key/value cache of rows that join and leave.

Written for batched decoding of many samples at different lengths: the cache holds one row per
running sample, rows 0..R-1 kept contiguous (a leaving row is replaced by the last one), each row
with its own length. `prefill` runs one prompt once and copies its keys and values into n rows
(positions it shares with a kept prefix, the chat template's system turn, are copied rather than
computed); `decode` advances every row by one token in a single batch. Weights are
fused (q, k and v in one matrix; gate and up in another) so a layer is a handful of large matmuls.
Given the same weights as GGUF blocks (`quantized.read_blocks`), each matrix keeps them beside its
float32 tensor, fused the same way and packed for the rows kernel (`BlockMatrix.packed`), and
`linear` multiplies few rows from those. The weight matrices may be bfloat16, 4-bit groups with
the output layer in bfloat16 (`cast`, int4.py), or int8 with the output layer in int8 too (int8.py);
activations, norms and the cache are float32 whatever the weights' form.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from backend.engines.embedded import decode_ops, pages
from backend.engines.embedded.fixed_rows import Weight
from backend.engines.embedded.int4 import Int4Matrix
from backend.engines.embedded.int8 import Int8Matrix, c_max_rows
from backend.engines.embedded.linear import linear, linear_add
from backend.engines.embedded.quantized import BlockMatrix, PackedMatrix, concat

log = logging.getLogger("backend.embedded")

CACHE_BLOCK = 256
"""The cache grows along the sequence in steps of this many positions (each growth copies it)."""


@dataclass(frozen=True)
class LlamaConfig:
    """The dimensions a Llama forward pass needs, read from an HF config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> LlamaConfig:
        """Read the fields of a transformers LlamaConfig dict; unsupported RoPE scaling is refused."""
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"RoPE scaling {rope!r} is not supported by the embedded engine")
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
            max_positions=config.get("max_position_embeddings", 2048),
            tie_embeddings=config.get("tie_word_embeddings", False),
        )

    def fused_matrices(self) -> dict[str, tuple[int, int]]:
        """(out, in) of each weight matrix a forward pass multiplies by, fused as `Llama` fuses them:
        each layer's q, k and v in one, its gate and up in one; then the output layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q, k, v": (q + 2 * kv, self.hidden_size),
            "out": (self.hidden_size, q),
            "gate, up": (2 * self.intermediate_size, self.hidden_size),
            "down": (self.hidden_size, self.intermediate_size),
            "output": (self.vocab_size, self.hidden_size),
        }


@dataclass
class LayerWeights:
    """One decoder layer, with fused projections."""

    attn_norm: torch.Tensor
    qkv: Weight
    out: Weight
    mlp_norm: torch.Tensor
    gate_up: Weight
    down: Weight
    blocks: dict[str, PackedMatrix] = field(default_factory=dict)
    """The same weights as GGUF blocks (packed for the kernel), where the model has them: "qkv",
    "out", "gate_up", "down"."""


class RowCache:
    """Keys and values of up to `max_rows` rows; `lengths[r]` positions of row r are filled.

    Every row is allocated and zeroed at once, for the first CACHE_BLOCK positions: on the AVX2
    development machine a fresh allocation's pages cost the kernel about 2.5 ms a megabyte to fault
    in, and growing the cache by doubling its rows put 0.6 s (to 64 rows) inside some request's
    time to first token; at start it is paid once (0.6 s for 64 rows in fp32). Positions grow by
    blocks (`reserve`): then only the rows in use are copied, and a row is zeroed when `add_rows`
    claims it. Every position a row may be asked for is zero or written: masked positions still
    enter attention as 0 x value, and garbage could be NaN.

    Each row also names a `source` row and how many leading positions it `shared` with it: the rows
    a prefill fills hold the same prompt, and decode attention (decode_ops) reads a row's first
    shared[r] positions from row source[r], so one copy of the prompt is read for all of them.
    A row that leaves hands its followers to the first of them (each still holds its own copy).
    """

    def __init__(self, config: LlamaConfig, max_rows: int, max_positions: int, dtype: torch.dtype) -> None:
        self.config = config
        self.max_rows = max_rows
        self.max_positions = max_positions
        self.dtype = dtype
        self.rows = 0
        self.lengths = torch.zeros(max_rows, dtype=torch.long)
        self.source = torch.arange(max_rows)
        self.shared = torch.zeros(max_rows, dtype=torch.long)
        self.capacity = min(CACHE_BLOCK, max_positions)
        shape = (config.layers, max_rows, config.kv_heads, self.capacity, config.head_dim)
        self.keys, self.values = pages.zeros(shape, dtype), pages.zeros(shape, dtype)

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions per row (grows by blocks, at least doubling)."""
        if positions <= self.capacity:
            return
        if positions > self.max_positions:
            raise ValueError(f"{positions} positions exceed the context of {self.max_positions}")
        blocks = min(-(-max(positions, 2 * self.capacity) // CACHE_BLOCK) * CACHE_BLOCK, self.max_positions)
        c = self.config
        shape = (c.layers, self.max_rows, c.kv_heads, blocks, c.head_dim)
        keys, values = pages.empty(shape, self.dtype), pages.empty(shape, self.dtype)
        live, old = self.rows, self.capacity
        for new, current in ((keys, self.keys), (values, self.values)):
            new[:, :live, :, :old] = current[:, :live]
            new[:, :live, :, old:] = 0
        self.keys, self.values, self.capacity = keys, values, blocks

    def add_rows(self, count: int) -> range:
        """Claim `count` rows at the end, zeroed; returns their indices."""
        if self.rows + count > self.max_rows:
            raise ValueError(f"{self.rows} + {count} rows exceed the cap of {self.max_rows}")
        first = self.rows
        self.rows += count
        self.lengths[first : self.rows] = 0
        self.source[first : self.rows] = torch.arange(first, self.rows)
        self.shared[first : self.rows] = 0
        self.keys[:, first : self.rows] = 0
        self.values[:, first : self.rows] = 0
        return range(first, self.rows)

    def share(self, rows: range, positions: int) -> None:
        """`rows` hold the same keys and values at their first `positions` positions (one prompt)."""
        self.source[rows.start : rows.stop] = rows.start
        self.shared[rows.start : rows.stop] = positions

    def remove_row(self, row: int) -> int | None:
        """Free `row` by moving the last row into it; returns the moved row's old index, if any."""
        last = self.rows - 1
        source = self.source[: self.rows]
        followers = [r for r in (source == row).nonzero()[:, 0].tolist() if r != row]
        for follower in followers:  # the first follower holds the same prompt: the others read it there
            source[follower] = followers[0]
        moved = None
        if row != last:
            length = int(self.lengths[last])
            self.keys[:, row, :, :length] = self.keys[:, last, :, :length]
            self.values[:, row, :, :length] = self.values[:, last, :, :length]
            self.lengths[row] = self.lengths[last]
            source[source == last] = row
            self.source[row], self.shared[row] = source[last], self.shared[last]
            moved = last
        self.source[last], self.shared[last] = last, 0
        self.rows = last
        return moved


PROMPT_KV_KEEP = 512
"""Prompt positions whose keys and values are kept for the next prompt (46 KB each in fp32: 23 MB)."""


@dataclass
class PromptKV:
    """Keys and values [layers, kv_heads, positions, head_dim] of a prompt's first positions."""

    tokens: list[int]
    keys: torch.Tensor
    values: torch.Tensor
    reused: int = 0
    """Positions this prompt's prefill copied from `reuse` instead of computing them."""

    def shared(self, tokens: list[int], limit: int) -> int:
        """How many leading positions `tokens` has in common with this prompt, at most `limit`."""
        count = 0
        for mine, theirs in zip(self.tokens[:limit], tokens[:limit], strict=False):
            if mine != theirs:
                break
            count += 1
        return count

    def reusable(self, tokens: list[int]) -> int:
        """How many of `tokens`' leading positions a prefill copies from this prompt: those it
        shares, all but the last at most (its logits are the first sample's, so it is computed)."""
        return self.shared(tokens, len(tokens) - 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, as Llama does, then scaled in the model's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2 I] = [gate, up], as `decode_ops.silu_mul` computes it in C."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary position embedding (the half-split layout HF Llama uses)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def fused_blocks(blocks: dict[str, BlockMatrix], prefix: str) -> dict[str, BlockMatrix]:
    """The GGUF blocks of the layer whose tensor names start with `prefix` ("model.layers.3."), fused
    as the model fuses its tensors ("qkv", "out", "gate_up", "down"); those it lacks are left out."""

    def get(name: str) -> BlockMatrix | None:
        return blocks.get(prefix + name + ".weight")

    fused = {
        "qkv": concat([get(f"self_attn.{x}_proj") for x in "qkv"]),
        "out": get("self_attn.o_proj"),
        "gate_up": concat([get("mlp.gate_proj"), get("mlp.up_proj")]),
        "down": get("mlp.down_proj"),
    }
    return {name: matrix for name, matrix in fused.items() if matrix is not None}


class _PrefillPlan(NamedTuple):
    """One prompt's part of a `Llama.prefill_many` pass."""

    rows: range
    """The cache rows its samples take."""
    length: int
    """Its tokens."""
    start: int
    """Positions whose keys and values come from `source` rather than being computed."""
    kept: PromptKV
    """Its first keys and values, kept for later prompts."""
    mask: torch.Tensor | None
    """Its attention mask when it reuses positions (else plain causal attention)."""
    source: PromptKV | None
    """The earlier prompt whose keys and values it reuses."""


class Llama:
    """Llama weights and the two passes the scheduler needs: prefill and batched decode.

    `dtype` is the weight matrices' (and the embedding's); `self.dtype` is the activations' and the
    cache's, float32."""

    def __init__(
        self,
        config: LlamaConfig,
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype,
        blocks: dict[str, BlockMatrix] | None = None,
    ) -> None:
        self.config = config
        self.dtype = torch.float32
        self.weight_dtype = dtype
        # GGUF blocks by tensor name: only for float32, the weights they are exactly equal to.
        blocks = blocks if dtype == torch.float32 and blocks else {}

        def weight(name: str, as_dtype: torch.dtype = dtype) -> torch.Tensor:
            if name not in tensors:
                raise ValueError(f"the weights have no tensor {name!r}")
            return tensors[name].to(as_dtype).contiguous()

        def norm(name: str) -> torch.Tensor:
            return weight(name, torch.float32)

        self.embed = weight("model.embed_tokens.weight")
        self.lm_head = self.embed if config.tie_embeddings else weight("lm_head.weight")
        head = "model.embed_tokens.weight" if config.tie_embeddings else "lm_head.weight"
        started = time.perf_counter()
        head_blocks = blocks.get(head)
        self.lm_head_blocks = head_blocks.packed() if head_blocks is not None else None
        self.final_norm = norm("model.norm.weight")
        self.layers = []
        for i in range(config.layers):
            p = f"model.layers.{i}."
            self.layers.append(
                LayerWeights(
                    attn_norm=norm(p + "input_layernorm.weight"),
                    qkv=torch.cat([weight(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
                    out=weight(p + "self_attn.o_proj.weight"),
                    mlp_norm=norm(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat(
                        [weight(p + "mlp.gate_proj.weight"), weight(p + "mlp.up_proj.weight")]
                    ).contiguous(),
                    down=weight(p + "mlp.down_proj.weight"),
                    blocks=self._layer_blocks(blocks, p),
                )
            )
        if blocks:
            took = time.perf_counter() - started
            log.info("layers fused and GGUF blocks packed for the rows kernel in %.2f s", took)
        inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        )
        freqs = torch.outer(torch.arange(config.max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos()
        self.sin = angles.sin()
        self.q_size = config.heads * config.head_dim
        self.kv_size = config.kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.int4 = False
        self.int8 = False
        self._probe_weights: dict[tuple[torch.dtype, bool, bool], list[dict[str, Weight]]] = {}

    @staticmethod
    def _layer_blocks(blocks: dict[str, BlockMatrix], prefix: str) -> dict[str, PackedMatrix]:
        """A layer's matrices as packed blocks, fused as its tensors are; those it lacks are left out."""
        return {name: matrix.packed() for name, matrix in fused_blocks(blocks, prefix).items()}

    def drop_blocks(self) -> None:
        """Multiply the float32 weights from now on (the GGUF's blocks are freed)."""
        for layer in self.layers:
            layer.blocks = {}
        self.lm_head_blocks = None

    MATRICES = ("qkv", "out", "gate_up", "down")
    """A layer's weight matrices, fused."""

    def cast(self, dtype: torch.dtype, int4: bool = False, int8: bool = False) -> None:
        """Hold the weight matrices and the embedding in `dtype` from now on (norms stay float32; the
        GGUF's blocks, which are float32 weights, are freed unless `dtype` is float32); with `int4`,
        the layers' matrices in 4-bit groups instead (int4.py: the GGUF's Q4_1 steps come back
        exactly) and the output layer and embedding in `dtype`. The output layer is not made 4-bit:
        from the GGUF's Q8_0 it cost 0.06 nats a token on the README's text (top token agreeing with
        float32 at 80 % of positions, against 99 % for the 4-bit layers). With `int8`, the layers'
        matrices and the output layer in int8 (int8.py), the embedding kept in `dtype` beside it.
        The probe's copies (`probe_weights`) are freed too."""
        self._probe_weights.clear()
        if dtype == self.weight_dtype and int4 == self.int4 and int8 == self.int8:
            return
        if dtype != torch.float32 or int4 or int8:
            self.drop_blocks()
        tied = self.lm_head is self.embed
        self.embed = self.embed.to(dtype)
        if int8:
            self.lm_head = self._in_form(self.embed if tied else self.lm_head, dtype, int8=True)
        else:
            self.lm_head = self.embed if tied else self.lm_head.to(dtype)
        for layer in self.layers:
            for name in self.MATRICES:
                setattr(layer, name, self._in_form(getattr(layer, name), dtype, int4, int8))
        self.weight_dtype = dtype
        self.int4 = int4
        self.int8 = int8

    @staticmethod
    def _in_form(matrix: Weight, dtype: torch.dtype, int4: bool = False, int8: bool = False) -> Weight:
        """A layer's matrix (float32, or already in another form) as `dtype`, in 4-bit groups or in
        int8."""
        if isinstance(matrix, Int4Matrix | Int8Matrix):
            raise ValueError("a model in 4-bit groups or int8 is not cast again")
        if int8:
            return Int8Matrix.quantize(matrix)
        return Int4Matrix.quantize(matrix) if int4 else matrix.to(dtype)

    def weight_bytes(self) -> int:
        """Bytes the model holds in weights: matrices, embedding, norms, and the GGUF's packed blocks
        where it keeps them."""
        tensors: list[Weight] = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors.extend(getattr(layer, name) for name in (*self.MATRICES, "attn_norm", "mlp_norm"))
        return sum(map(_nbytes, tensors)) + self.block_bytes()[0]

    PROBE_LAYERS = 4
    """Layers whose products `probe_step` runs (with a share of the output layer, about a sixth of a
    step's weights: enough to tell the paths apart)."""

    PROBE_OUTPUT_SHARE = 4
    """`probe_step` multiplies the output layer's first 1/PROBE_OUTPUT_SHARE of its rows (in whole
    groups of PROBE_OUTPUT_ROWS) and counts the rest at that time per row: the bundled model's output
    layer (49,152 x 576) outweighs the four layers, and making it whole in each path's form was most
    of the probe's weights (an int8, a 4-bit and a bfloat16 copy: 0.3 s on a 2-core AMD EPYC Zen 1)."""

    PROBE_OUTPUT_ROWS = 96
    """The output layer's rows are shared out in whole groups of this many: of the rows kernel's
    packed blocks (24 rows) and int8's (4)."""

    def probe_output_rows(self) -> int:
        """How many of the output layer's rows `probe_step` multiplies (all, where it has too few to
        share out)."""
        n, group = self.lm_head.shape[0], self.PROBE_OUTPUT_ROWS
        return max(n // self.PROBE_OUTPUT_SHARE // group * group, min(n, group))

    def probe_weights(
        self, dtype: torch.dtype, int4: bool = False, int8: bool = False
    ) -> list[dict[str, Weight]]:
        """The first PROBE_LAYERS layers' matrices and the output layer's first `probe_output_rows()`
        ("output") in `dtype` (the layers' in 4-bit groups with `int4`, theirs and the output
        layer's in int8 with `int8`, as `cast` holds them): the model's own where it holds them in
        that form, else copies made once."""
        if (dtype, int4, int8) not in self._probe_weights:
            layers: list[dict[str, Weight]] = [
                {name: self._in_form(getattr(layer, name), dtype, int4, int8) for name in self.MATRICES}
                for layer in self.layers[: self.PROBE_LAYERS]
            ]
            layers.append({"output": self._output_in_form(dtype, int8, self.probe_output_rows())})
            self._probe_weights[dtype, int4, int8] = layers
            if int8:  # where _int_mm takes over, timed now rather than inside the first timed product
                c_max_rows()
        return self._probe_weights[dtype, int4, int8]

    def _output_in_form(self, dtype: torch.dtype, int8: bool, rows: int | None = None) -> Weight:
        """The output layer's first `rows` rows (all by default) as `cast` would hold it."""
        head = self.lm_head[:rows]
        return self._in_form(head, dtype, int8=True) if int8 else head.to(dtype)

    def check_weights(self, dtype: torch.dtype, int4: bool = False, int8: bool = False) -> list[Weight]:
        """The matrices a block size is checked on (fixed_rows.check): the first layer's, and the whole
        output layer, in `dtype` and form as `probe_weights`."""
        first = self.probe_weights(dtype, int4, int8)[0]
        return [*first.values(), self._output_in_form(dtype, int8)]

    @torch.inference_mode()
    def probe_step(self, path: Any, rows: int) -> float:
        """Seconds a decode step's linear layers take for `rows` rows, estimated from a sample on the
        weights `path` multiplies (compute.ComputePath: the GGUF's blocks, or the weights in its
        dtype), for `compute.probe`: the products of the first PROBE_LAYERS layers (scaled to every
        layer) and of a share of the output layer's rows (scaled to all of them), as `linear` runs
        them now (the caller configures it)."""
        c = self.config
        hidden = torch.ones(rows, c.hidden_size)
        inner = torch.ones(rows, c.intermediate_size)
        attended = torch.ones(rows, self.q_size)
        *layers, output = self.probe_weights(getattr(torch, path.dtype), path.int4, path.int8)
        share = output["output"].shape[0]
        head_blocks = self.lm_head_blocks
        if path.gguf_blocks and head_blocks is not None and share < head_blocks.out_features:
            head_blocks = head_blocks.first_rows(share)
        started = time.perf_counter()
        for layer, weights in zip(self.layers, layers, strict=False):
            blocks = layer.blocks if path.gguf_blocks else {}
            linear(hidden, weights["qkv"], blocks.get("qkv"), True)
            linear(attended, weights["out"], blocks.get("out"), True)
            linear(hidden, weights["gate_up"], blocks.get("gate_up"), True)
            linear(inner, weights["down"], blocks.get("down"), True)
        sampled = time.perf_counter()
        linear(hidden, output["output"], head_blocks if path.gguf_blocks else None, True)
        done = time.perf_counter()
        whole = self.lm_head.shape[0] / share
        return (sampled - started) * c.layers / len(layers) + (done - sampled) * whole

    def block_bytes(self) -> tuple[int, int]:
        """(bytes a decode step reads from GGUF blocks, bytes it reads as weights in their own form:
        float32, bfloat16, 4-bit groups, or one of int8's two layouts)."""
        dense = quantized = 0
        for layer in self.layers:
            for name in ("qkv", "out", "gate_up", "down"):
                if name in layer.blocks:
                    quantized += layer.blocks[name].nbytes
                else:
                    dense += _read_bytes(getattr(layer, name))
        if self.lm_head_blocks is not None:
            quantized += self.lm_head_blocks.nbytes
        else:
            dense += _read_bytes(self.lm_head)
        return quantized, dense

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        normed = rms_norm(x, layer.mlp_norm, self.config.rms_eps)
        gate_up = linear(normed, layer.gate_up, layer.blocks.get("gate_up"))
        return x + linear(_silu_mul(gate_up), layer.down, layer.blocks.get("down"))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        normed = rms_norm(x, self.final_norm, self.config.rms_eps)
        # Any number of rows on the kernel (where it runs): a step's logits, a prefill's last positions.
        return linear(normed, self.lm_head, self.lm_head_blocks, any_rows=True).float()

    def prefill(
        self, tokens: list[int], cache: RowCache, rows: range, reuse: PromptKV | None = None
    ) -> tuple[torch.Tensor, PromptKV]:
        """Run the prompt once, write its keys/values into every row of `rows`; last-token logits [V].

        Positions the prompt shares with `reuse` (an earlier prompt's keys and values) are copied,
        not computed: every chat-templated prompt starts with the same system turn. Also returns
        this prompt's keys and values (its first `PROMPT_KV_KEEP` positions) for the next one.
        """
        return self.prefill_many([(tokens, rows)], cache, reuse)[0]

    @torch.inference_mode()
    def prefill_many(
        self,
        prompts: list[tuple[list[int], range]],
        cache: RowCache,
        reuse: PromptKV | Sequence[PromptKV | None] | None = None,
    ) -> list[tuple[torch.Tensor, PromptKV]]:
        """`prefill` for several prompts in one pass: their new tokens go through every linear layer
        together (the weights read once for all), each attends to its own positions only. Every
        op but the linear layers works row by row, so a prompt's results are the same whatever
        else is in the pass wherever the linear layers are too (the rows kernel is; a matrix
        product of another row count may round differently). `reuse` is one earlier prompt's keys
        and values for all of them, or one (or None) per prompt."""
        reuses = list(reuse) if isinstance(reuse, Sequence) else [reuse] * len(prompts)
        plans = [
            self._plan_prefill(tokens, rows, source)
            for (tokens, rows), source in zip(prompts, reuses, strict=True)
        ]
        cache.reserve(max(plan.length for plan in plans))
        x = self.embed[
            torch.tensor(
                [t for (tokens, _), plan in zip(prompts, plans, strict=True) for t in tokens[plan.start :]]
            )
        ].float()
        positions = torch.cat([torch.arange(plan.start, plan.length) for plan in plans])
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        for index, layer in enumerate(self.layers):
            x = self._prefill_layer(x, index, layer, (cos, sin), plans, cache)
        return self._finish_prefill(x, plans, cache)

    def _plan_prefill(self, tokens: list[int], rows: range, source: PromptKV | None) -> _PrefillPlan:
        """One prompt's part of a prefill: which positions it computes (those past what `source`
        already holds), the keys and values it keeps for later prompts, and its attention mask."""
        c = self.config
        length = len(tokens)
        start = source.reusable(tokens) if source is not None else 0
        keep = min(length, PROMPT_KV_KEEP)
        shape = (c.layers, c.kv_heads, keep, c.head_dim)
        kept = PromptKV(
            tokens[:keep], torch.empty(shape, dtype=self.dtype), torch.empty(shape, dtype=self.dtype)
        )
        # Query i (position start + i) sees positions 0..start + i.
        mask = None
        if start:
            mask = torch.arange(length)[None, :] <= torch.arange(start, length)[:, None]
        return _PrefillPlan(rows, length, start, kept, mask, source)

    def _prefill_layer(
        self,
        x: torch.Tensor,
        index: int,
        layer: LayerWeights,
        rope: tuple[torch.Tensor, torch.Tensor],
        plans: list[_PrefillPlan],
        cache: RowCache,
    ) -> torch.Tensor:
        """One layer over every prompt's new tokens: the linear layers for all at once, attention
        prompt by prompt (`_prefill_attend`)."""
        c = self.config
        cos, sin = rope
        total = x.shape[0]
        qkv = linear(rms_norm(x, layer.attn_norm, c.rms_eps), layer.qkv, layer.blocks.get("qkv"))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = rotate(q.view(total, c.heads, c.head_dim), cos, sin)
        k = rotate(k.view(total, c.kv_heads, c.head_dim), cos, sin)
        v = v.view(total, c.kv_heads, c.head_dim)
        attended = []
        offset = 0
        for plan in plans:
            new = plan.length - plan.start
            span = slice(offset, offset + new)
            offset += new
            attended.append(self._prefill_attend(index, (q[span], k[span], v[span]), plan, cache))
        joined = attended[0] if len(attended) == 1 else torch.cat(attended)
        x = x + linear(joined, layer.out, layer.blocks.get("out"))
        return self._mlp(x, layer)

    def _prefill_attend(
        self,
        index: int,
        qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        plan: _PrefillPlan,
        cache: RowCache,
    ) -> torch.Tensor:
        """One prompt's attention in layer `index`: its keys and values joined to those it reuses,
        kept for later prompts and copied into its cache rows; returns its attended new tokens."""
        qi, ki, vi = (part.transpose(0, 1) for part in qkv)
        if plan.start:
            assert plan.source is not None
            # (a finished sample's, from the row cache, are float16: widened exactly)
            ki = torch.cat((plan.source.keys[index, :, : plan.start].to(ki.dtype), ki), dim=1)
            vi = torch.cat((plan.source.values[index, :, : plan.start].to(vi.dtype), vi), dim=1)
        keep = len(plan.kept.tokens)
        plan.kept.keys[index] = ki[:, :keep]
        plan.kept.values[index] = vi[:, :keep]
        # One prompt, n rows: the same keys and values are copied, never recomputed.
        rows = plan.rows
        cache.keys[index, rows.start : rows.stop, :, : plan.length] = ki
        cache.values[index, rows.start : rows.stop, :, : plan.length] = vi
        out = F.scaled_dot_product_attention(
            qi, ki, vi, attn_mask=plan.mask, is_causal=plan.mask is None, enable_gqa=True
        )
        return out.transpose(0, 1).reshape(plan.length - plan.start, self.q_size)

    def _finish_prefill(
        self, x: torch.Tensor, plans: list[_PrefillPlan], cache: RowCache
    ) -> list[tuple[torch.Tensor, PromptKV]]:
        """Set each prompt's rows to its length and share its cache pages, and give each prompt
        the logits of its last token with the keys and values it keeps."""
        results = []
        last = -1
        for plan in plans:
            cache.lengths[plan.rows.start : plan.rows.stop] = plan.length
            cache.share(plan.rows, plan.length)
            plan.kept.reused = plan.start
            last += plan.length - plan.start
            results.append((last, plan.kept))
        if len(plans) == 1:
            return [(self._logits(x[-1]), plans[0].kept)]
        logits = self._logits(x[torch.tensor([i for i, _ in results])])
        return [(logits[i], kept) for i, (_, kept) in enumerate(results)]

    def decode(self, tokens: torch.Tensor, cache: RowCache) -> torch.Tensor:
        """Advance rows 0..R-1 by one token each (`tokens` [R]) at their own positions; logits [R, V].

        One step for every path; only its ops differ. The linear layers multiply all rows at once
        (`linear`: the rows kernel, or PyTorch in fixed blocks of rows); every other op computes each
        row on its own, each row attending to its own positions only: one C call each for all rows
        where `decode_ops.usable()`, else PyTorch's ops on one row at a time. A row's values then
        depend on no other row wherever the linear layers' do not (compute.py)."""
        c = self.config
        rows = cache.rows
        positions = cache.lengths[:rows].clone()
        cache.reserve(int(positions.max()) + 1)
        x = self.embed[tokens].float().contiguous()
        if decode_ops.usable():
            ops: decode_ops.StepOps | _RowByRowOps = decode_ops.StepOps(
                x, cache.keys, cache.values, positions, sources=cache.source[:rows],
                shared=cache.shared[:rows], rotary=(self.cos, self.sin), heads=c.heads, scale=self.scale,
                intermediate=c.intermediate_size,
            )  # fmt: skip
        else:
            ops = _RowByRowOps(x, self._attention_row_by_row(cache, positions))
        for index, layer in enumerate(self.layers):
            normed = ops.rms_norm(layer.attn_norm, c.rms_eps)
            qkv = linear(normed, layer.qkv, layer.blocks.get("qkv"), True, out=ops.qkv)
            linear_add(x, ops.attend(index, qkv), layer.out, layer.blocks.get("out"), True)
            normed = ops.rms_norm(layer.mlp_norm, c.rms_eps)
            gate_up = linear(normed, layer.gate_up, layer.blocks.get("gate_up"), True, out=ops.gate_up)
            linear_add(x, ops.silu_mul(gate_up), layer.down, layer.blocks.get("down"), True)
        cache.lengths[:rows] += 1
        return self._logits(x)

    def _attention_row_by_row(
        self, cache: RowCache, positions: torch.Tensor
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Attention in PyTorch for layer `index` of a step, one row at a time: its rotary embedding,
        its cache write, and its attention over its own positions 0..positions[r] only."""
        c = self.config
        group = c.heads // c.kv_heads
        at = positions.tolist()

        def attend(index: int, qkv: torch.Tensor) -> torch.Tensor:
            keys, values = cache.keys[index], cache.values[index]
            out = torch.empty(qkv.shape[0], self.q_size)
            for row, position in enumerate(at):
                q, k, v = qkv[row].split([self.q_size, self.kv_size, self.kv_size])
                cos, sin = self.cos[position], self.sin[position]
                q = rotate(q.view(c.heads, c.head_dim), cos, sin)
                keys[row, :, position] = rotate(k.view(c.kv_heads, c.head_dim), cos, sin)
                values[row, :, position] = v.view(c.kv_heads, c.head_dim)
                attended = F.scaled_dot_product_attention(
                    q.view(c.kv_heads, group, c.head_dim),
                    keys[row, :, : position + 1].to(q.dtype),  # a float16 cache widened exactly
                    values[row, :, : position + 1].to(q.dtype),
                )
                out[row] = attended.reshape(self.q_size)
            return out

        return attend


def _nbytes(weight: Weight) -> int:
    """Bytes a weight holds, a tensor, 4-bit groups or int8."""
    if isinstance(weight, Int4Matrix | Int8Matrix):
        return weight.nbytes
    return weight.numel() * weight.element_size()


def _read_bytes(weight: Weight) -> int:
    """Bytes a product reads of a weight: all it holds, but one of int8's two copies of its steps."""
    if isinstance(weight, Int8Matrix):
        return weight.step_bytes
    return _nbytes(weight)


class _RowByRowOps:
    """A decode step's ops in PyTorch, one row at a time (where decode_ops is not built), as
    decode_ops.StepOps offers them: the products make their own outputs (no buffers)."""

    qkv: torch.Tensor | None = None
    gate_up: torch.Tensor | None = None

    def __init__(self, x: torch.Tensor, attend: Callable[[int, torch.Tensor], torch.Tensor]) -> None:
        self._x, self.attend = x, attend

    def rms_norm(self, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """`model.rms_norm` of the step's x, row by row."""
        return _each_row(rms_norm)(self._x, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, row by row."""
        return _each_row(_silu_mul)(gate_up)


def _each_row(op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`op(x, *args)` computed on one row of x at a time (each row alone, as at a batch of one)."""

    def each(x: torch.Tensor, *args: Any) -> torch.Tensor:
        return torch.cat([op(x[row : row + 1], *args) for row in range(x.shape[0])])

    return each

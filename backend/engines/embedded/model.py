"""A Llama forward pass in plain torch over a key/value cache of rows that join and leave.

Written for batched decoding of many samples at different lengths (row_cache.py): `prefill` runs
one prompt once and copies its keys and values into n rows (positions it shares with a kept prefix,
the chat template's system turn, are copied rather than computed); `decode` advances every row by
one token in a single batch. The weights come in one format (formats.py), fused (q, k and v in one
matrix; gate and up in another) so that a layer is a handful of products, each `Weight.product`
(linear.py); activations, norms and the cache are float32 whatever the weights' format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from backend.engines.embedded import decode_ops
from backend.engines.embedded.formats import FLOAT32, Form, LayerWeights, ModelWeights, model_weights
from backend.engines.embedded.quantized import BlockMatrix
from backend.engines.embedded.row_cache import PROMPT_KV_KEEP, PromptKV, RowCache
from backend.engines.embedded.weights import LlamaConfig


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
    """A Llama forward pass over weights in one format (formats.py): the two passes the scheduler
    needs, prefill and batched decode. Activations, norms and the cache are float32 (`dtype`)."""

    def __init__(self, config: LlamaConfig, weights: ModelWeights) -> None:
        self.config = config
        self.weights = weights
        self.dtype = torch.float32
        self.embed, self.lm_head, self.final_norm = weights.embed, weights.lm_head, weights.final_norm
        self.layers = weights.layers
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

    @classmethod
    def from_tensors(
        cls,
        config: LlamaConfig,
        tensors: dict[str, torch.Tensor],
        form: Form = FLOAT32,
        blocks: dict[str, BlockMatrix] | None = None,
    ) -> Llama:
        """The model of float32 `tensors` (and, for a blocks form, the GGUF's `blocks`) in `form`."""
        return cls(config, model_weights(tensors, config.layers, form, blocks, config.tie_embeddings))

    def _mlp(self, x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        normed = rms_norm(x, layer.mlp_norm, self.config.rms_eps)
        gate_up = layer.gate_up.product(normed)
        return x + layer.down.product(_silu_mul(gate_up))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        normed = rms_norm(x, self.final_norm, self.config.rms_eps)
        # Any number of rows on the kernel (where it runs): a step's logits, a prefill's last positions.
        return self.lm_head.product(normed, step=True)

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
        qkv = layer.qkv.product(rms_norm(x, layer.attn_norm, c.rms_eps))
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
        x = x + layer.out.product(joined)
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
            qkv = layer.qkv.product(normed, ops.qkv, step=True)
            layer.out.product(ops.attend(index, qkv), x, add=True, step=True)
            normed = ops.rms_norm(layer.mlp_norm, c.rms_eps)
            gate_up = layer.gate_up.product(normed, ops.gate_up, step=True)
            layer.down.product(ops.silu_mul(gate_up), x, add=True, step=True)
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

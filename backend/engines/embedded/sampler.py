"""Token sampling for a batch of rows, each with its own settings and random generator.

Exact inverse-CDF sampling: one uniform number per row from that row's generator, located in the
cumulative distribution with `searchsorted`. That replaces a full-vocabulary `multinomial` per row
(~0.85 ms each here) with a few batched operations. Top-k and top-p look at the `CANDIDATES` most
likely tokens (one `topk`); a row whose nucleus is wider than that falls back to a full sort, so
the result is always exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CANDIDATES = 256
"""Tokens `topk` keeps for top-k/top-p rows; wider nuclei fall back to sorting the vocabulary."""


@dataclass(frozen=True)
class RowSampling:
    """How one row picks its next token; temperature 0 is greedy (no random draw)."""

    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None


def _draw(rows: list[RowSampling]) -> torch.Tensor:
    return torch.stack([torch.rand((), generator=row.generator) for row in rows])


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index per row drawn in proportion to non-negative `weights` [R, K]."""
    cumulative = weights.cumsum(-1)
    targets = uniforms[:, None] * cumulative[:, -1:]
    return torch.searchsorted(cumulative, targets, right=True).clamp_(max=weights.shape[-1] - 1)[:, 0]


def _truncated(probs: torch.Tensor, rows: list[RowSampling], uniforms: torch.Tensor) -> torch.Tensor:
    """Sample from sorted candidate lists with top-k and top-p applied (HF order: k, then p)."""
    count = probs.shape[-1]
    sorted_probs, token_ids = probs.topk(min(CANDIDATES, count), dim=-1)
    top_k = torch.tensor([row.top_k if 0 < row.top_k <= count else count for row in rows])
    top_p = torch.tensor([row.top_p for row in rows], dtype=probs.dtype)
    covered = (top_k <= sorted_probs.shape[-1]) | (sorted_probs.sum(-1) >= top_p)
    if not bool(covered.all()):
        sorted_probs, token_ids = probs.sort(dim=-1, descending=True)
    positions = torch.arange(sorted_probs.shape[-1])[None, :]
    kept = sorted_probs * (positions < top_k[:, None])
    kept = kept / kept.sum(-1, keepdim=True)
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is short.
    before = kept.cumsum(-1) - kept
    kept = kept * (before < top_p[:, None])
    return token_ids.gather(-1, _inverse_cdf(kept, uniforms)[:, None])[:, 0]


def sample(logits: torch.Tensor, rows: list[RowSampling]) -> list[int]:
    """The next token of every row of `logits` [R, V] (float32)."""
    random_rows = [i for i, row in enumerate(rows) if row.temperature > 0]
    if not random_rows:
        return logits.argmax(-1).tolist()
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy_rows = [i for i, row in enumerate(rows) if row.temperature <= 0]
    if greedy_rows:  # the argmax of the greedy rows only
        greedy = torch.tensor(greedy_rows)
        tokens[greedy] = logits[greedy].argmax(-1)
    chosen = [rows[i] for i in random_rows]
    index = torch.tensor(random_rows)
    temperatures = torch.tensor([row.temperature for row in chosen], dtype=logits.dtype)
    probs = torch.softmax(logits[index] / temperatures[:, None], dim=-1)
    uniforms = _draw(chosen)
    plain = torch.tensor([row.top_k <= 0 and row.top_p >= 1.0 for row in chosen])
    picked = torch.empty(len(chosen), dtype=torch.long)
    if bool(plain.any()):
        picked[plain] = _inverse_cdf(probs[plain], uniforms[plain])
    if not bool(plain.all()):
        rest = ~plain
        subset = [row for row, is_plain in zip(chosen, plain.tolist(), strict=True) if not is_plain]
        picked[rest] = _truncated(probs[rest], subset, uniforms[rest])
    tokens[index] = picked
    return tokens.tolist()

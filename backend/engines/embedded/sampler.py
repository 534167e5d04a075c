"""Token sampling for a batch of rows, each with its own settings and random generator.

Exact inverse-CDF sampling: one uniform number per row from that row's generator, located in the
cumulative distribution of the row's weights. Top-k and top-p are applied in HF's order: the k most
likely tokens, renormalised among themselves, then the smallest prefix of those, most likely first,
whose mass reaches top_p. Every row is drawn on its own: a row's token depends on its logits,
settings and generator only, never on the rows sampled beside it (batch invariance).

Where `decode_ops.usable()`, one C call draws every row (`decode_ops.draw`): a pass for the largest
logit and one for the weights, a plain row's draw found a block of 256 tokens at a time, a truncated
row sorting only its heaviest tokens. Elsewhere PyTorch does it with a few batched operations: the
softmax, then `searchsorted` in its cumulative sum; top-k and top-p look at the `CANDIDATES` most
likely tokens (one `topk`), and a row whose kept tokens are not all among them falls back to a full
sort of its own. The two sum in different orders, so a draw on a boundary between two tokens can go
either way: one process samples on one of them throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.engines.embedded import decode_ops

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
    """Sample with top-k and top-p applied (HF order: k, then p). A row whose kept tokens are all
    among its CANDIDATES most likely (its k is at most that many, or it has no k and those hold its
    top_p) draws from those; any other row, from its whole sorted vocabulary. Each row's choice is
    made on its own: what it draws does not depend on the rows beside it (a wide row never sends the
    others to the full sort, which sums another list)."""
    count = probs.shape[-1]
    sorted_probs, token_ids = probs.topk(min(CANDIDATES, count), dim=-1)
    top_k = torch.tensor([row.top_k if 0 < row.top_k <= count else count for row in rows])
    top_p = torch.tensor([row.top_p for row in rows], dtype=probs.dtype)
    limited = top_k < count
    held = sorted_probs.sum(-1) >= top_p
    covered = torch.where(limited, top_k <= sorted_probs.shape[-1], held).tolist()
    if all(covered):
        return _nucleus(sorted_probs, token_ids, top_k, top_p, uniforms, probs.sum(-1))
    picked = torch.empty(len(rows), dtype=torch.long)
    for within in (True, False):
        index = [i for i, ok in enumerate(covered) if ok == within]
        if not index:
            continue
        at = torch.tensor(index)
        if within:
            candidates, ids = sorted_probs[at], token_ids[at]
        else:
            candidates, ids = probs[at].sort(dim=-1, descending=True)
        whole = probs[at].sum(-1)
        picked[at] = _nucleus(candidates, ids, top_k[at], top_p[at], uniforms[at], whole)
    return picked


def _nucleus(
    sorted_probs: torch.Tensor,
    token_ids: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    whole: torch.Tensor,
) -> torch.Tensor:
    """The draw of each row from its candidates `sorted_probs` [R, K] (descending; their tokens
    `token_ids`), keeping its top_k, then the smallest prefix whose mass reaches top_p of the mass
    of its k most likely tokens (where its k is below the vocabulary), else of its whole
    vocabulary's mass `whole`."""
    positions = torch.arange(sorted_probs.shape[-1])[None, :]
    kept = sorted_probs * (positions < top_k[:, None])
    mass = torch.where(top_k <= sorted_probs.shape[-1], kept.sum(-1), whole)
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is short.
    before = kept.cumsum(-1) - kept
    kept = kept * ((before < (top_p * mass)[:, None]) | (top_p >= 1.0)[:, None])
    return token_ids.gather(-1, _inverse_cdf(kept, uniforms)[:, None])[:, 0]


def _rows(values: torch.Tensor, index: list[int]) -> torch.Tensor:
    """The rows `index` of values [R, ...]: values itself where that is every row in order (no copy:
    at 32 rows x 49,152 logits a copy costs milliseconds a step), else one `index_select`."""
    if len(index) == values.shape[0] and index == list(range(len(index))):
        return values
    return values.index_select(0, torch.tensor(index, dtype=torch.long))


def sample(logits: torch.Tensor, rows: list[RowSampling]) -> list[int]:
    """The next token of every row of `logits` [R, V] (float32)."""
    random_rows = [i for i, row in enumerate(rows) if row.temperature > 0]
    if not random_rows:
        return logits.argmax(-1).tolist()
    if decode_ops.usable():
        return _drawn_in_c(logits, rows, random_rows)
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy_rows = [i for i, row in enumerate(rows) if row.temperature <= 0]
    if greedy_rows:  # the argmax of the greedy rows only
        tokens[torch.tensor(greedy_rows)] = _rows(logits, greedy_rows).argmax(-1)
    chosen = [rows[i] for i in random_rows]
    scaled = _rows(logits, random_rows)
    if any(row.temperature != 1.0 for row in chosen):  # x / 1 is x: no pass over the logits for it
        scaled = scaled / torch.tensor([row.temperature for row in chosen], dtype=logits.dtype)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    uniforms = _draw(chosen)
    untruncated = [row.top_k <= 0 and row.top_p >= 1.0 for row in chosen]
    plain = [i for i, whole in enumerate(untruncated) if whole]
    rest = [i for i, whole in enumerate(untruncated) if not whole]
    picked = torch.empty(len(chosen), dtype=torch.long)
    if plain:
        at = torch.tensor(plain)
        picked[at] = _inverse_cdf(_rows(probs, plain), uniforms[at])
    if rest:
        at = torch.tensor(rest)
        picked[at] = _truncated(_rows(probs, rest), [chosen[i] for i in rest], uniforms[at])
    tokens[torch.tensor(random_rows)] = picked
    return tokens.tolist()


def _drawn_in_c(logits: torch.Tensor, rows: list[RowSampling], random_rows: list[int]) -> list[int]:
    """`sample` in one C call (`decode_ops.draw`); only rows with a temperature draw a uniform."""
    uniforms = torch.zeros(len(rows))
    uniforms[torch.tensor(random_rows)] = _draw([rows[i] for i in random_rows])
    return decode_ops.draw(
        logits.float().contiguous(),
        torch.tensor([row.temperature for row in rows], dtype=torch.float32),
        torch.tensor([row.top_p for row in rows], dtype=torch.float32),
        torch.tensor([max(row.top_k, 0) for row in rows], dtype=torch.long),
        uniforms,
    ).tolist()


TOP_BLOCK = 64
"""`top_tokens` reads a row in blocks of this many values."""


def top_tokens(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of `values` [R, V] and their indices, largest first, as
    `torch.topk` gives them, in a fifth of its time at 49,152 values a row: the k largest lie in the
    k blocks of TOP_BLOCK values with the largest maxima, so one pass takes each block's maximum and
    `topk` looks only at those k blocks (where ties reach across blocks, another of the tied
    indices may come back). A row that does not split into whole blocks goes to `torch.topk`."""
    rows, count = values.shape
    blocks = count // TOP_BLOCK
    if count % TOP_BLOCK or blocks < k:
        return torch.topk(values, k, dim=-1)
    split = values.view(rows, blocks, TOP_BLOCK)
    _, best = split.amax(-1).topk(k, dim=-1)
    candidates = split.gather(1, best[:, :, None].expand(rows, k, TOP_BLOCK)).reshape(rows, k * TOP_BLOCK)
    top, where = candidates.topk(k, dim=-1)
    offsets = (best[:, :, None] * TOP_BLOCK + torch.arange(TOP_BLOCK)[None, None, :]).reshape(rows, -1)
    return top, offsets.gather(-1, where)

"""The model's key/value cache: rows of samples that join and leave, and a prompt's keys and values
kept for the next prompt.

The cache holds one row per running sample, rows 0..R-1 kept contiguous (a leaving row is replaced
by the last one), each row with its own length; the forward pass (model.py) writes and reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from backend.engines.embedded import pages

if TYPE_CHECKING:
    from backend.engines.embedded.weights import LlamaConfig

CACHE_BLOCK = 256
"""The cache grows along the sequence in steps of this many positions (each growth copies it)."""


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

"""The sampler (sampler.py) on both of its ways: one C call for every row (`decode_ops.draw`) and
PyTorch's batched ops. Each is forced by `decode_ops.configure`; each draws from the distribution HF
defines (temperature, then top-k renormalised, then the top-p nucleus), row by row."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from backend.engines.embedded import decode_ops
from backend.engines.embedded.sampler import RowSampling, sample

WAYS = ("c", "torch")


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> Iterator[str]:
    """The sampler held to one way for the test; the C way needs the C part on an AVX2 CPU."""
    if request.param == "c" and not decode_ops.built():
        pytest.skip("decode_ops' C part is not built for this CPU")
    decode_ops.configure(allow=request.param == "c")
    try:
        yield request.param
    finally:
        decode_ops.configure()


def _rows(
    n: int, seed: int, temperature: float = 0.8, top_p: float = 0.9, top_k: int = 0
) -> list[RowSampling]:
    return [RowSampling(temperature, top_p, top_k, torch.Generator().manual_seed(seed + i)) for i in range(n)]


def _kept(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """HF's distribution in float64: softmax of logits / temperature, the top_k most likely renormalised,
    then the tokens whose mass before them (most likely first) is below top_p, renormalised."""
    probs = torch.softmax(logits.double() / temperature, -1)
    order = probs.argsort(descending=True)
    ranked = probs[order]
    if 0 < top_k < len(ranked):
        ranked[top_k:] = 0
        ranked /= ranked.sum()
    before = ranked.cumsum(0) - ranked
    ranked = ranked * (before < top_p)
    out = torch.zeros_like(probs)
    out[order] = ranked / ranked.sum()
    return out


SETTINGS = [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 1.0, 5), (0.9, 0.8, 0), (1.2, 0.9, 12)]


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_draws_follow_hfs_distribution(way: str, temperature: float, top_p: float, top_k: int) -> None:
    """20,000 draws of one row (each its own seed) land on the kept tokens only, as often as their
    probabilities say: their total variation from them within 1.25 times its mean for exact draws of
    that count (0.5 sum of sqrt(2 p (1 - p) / (pi N)): about 0.05 at temperature 1, no truncation)."""
    torch.manual_seed(3)
    logits = torch.randn(1001) * 2  # not a multiple of 8 or 256
    draws = 20_000
    picked = sample(logits.expand(draws, -1), _rows(draws, 0, temperature, top_p, top_k))
    seen = torch.bincount(torch.tensor(picked), minlength=len(logits)).double() / draws
    expected = _kept(logits, temperature, top_p, top_k)
    assert seen[expected == 0].sum() == 0, "a token outside the kept ones was drawn"
    chance = 0.5 * (2 * expected * (1 - expected) / (math.pi * draws)).sqrt().sum()
    assert 0.5 * (seen - expected).abs().sum() < 1.25 * chance


def test_top_p_is_a_share_of_the_whole_vocabulary_not_of_the_most_likely_few(way: str) -> None:
    """Ten tokens hold 0.94, an eleventh 0.03, the other 989 the last 0.03: at top_p 0.95 the nucleus
    takes the eleventh (the mass before it, 0.94, is short of 0.95), which a nucleus taken as a share
    of the 256 most likely tokens' mass (0.977) would leave out."""
    probs = torch.full((1000,), 0.03 / 989)
    probs[:10], probs[10] = 0.094, 0.03
    logits = probs.log()
    draws = 4000
    picked = torch.tensor(sample(logits.expand(draws, -1), _rows(draws, 0, 1.0, 0.95)))
    assert set(picked.tolist()) <= set(range(11))
    assert 70 < (picked == 10).sum() < 190  # 0.03 / 0.97 of 4000 is 124


def test_a_rows_draw_does_not_depend_on_the_rows_beside_it(way: str) -> None:
    """A peaked row sampled alone and beside a flat row (whose nucleus is the whole vocabulary: on the
    PyTorch way, a full sort) draws the same token every time."""
    torch.manual_seed(0)
    differ = 0
    for trial in range(300):
        peaked = torch.randn(1, 4096) * 4
        flat = torch.zeros(1, 4096)
        alone = sample(peaked, _rows(1, trial))
        beside = sample(torch.cat([peaked, flat, peaked]), _rows(1, trial) + _rows(2, 10_000 + trial))
        differ += alone[0] != beside[0]
    assert differ == 0


def test_greedy_rows_and_top_k_one_take_the_largest_logit_beside_sampled_rows(way: str) -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 1000) * 3
    greedy = logits.argmax(-1).tolist()
    rows = [
        RowSampling(0.0, 1.0, 0, None),
        RowSampling(0.8, 1.0, 1, torch.Generator().manual_seed(1)),
        RowSampling(1.0, 0.9, 0, torch.Generator().manual_seed(2)),
        RowSampling(0.0, 0.5, 3, None),
        RowSampling(1e-30, 1.0, 0, torch.Generator().manual_seed(4)),  # near 0: no overflow
        RowSampling(0.7, 1.0, 1, torch.Generator().manual_seed(5)),
    ]
    picked = sample(logits, rows)
    assert [picked[i] for i in (0, 1, 3, 4, 5)] == [greedy[i] for i in (0, 1, 3, 4, 5)]


def test_the_two_ways_draw_the_same_token_from_the_same_uniform() -> None:
    """On a vocabulary of 49,152, plain, top-p and top-k rows, the C way and PyTorch's pick the same
    token for the same seed: they differ only where a uniform falls within rounding of a boundary
    between two tokens."""
    if not decode_ops.built():
        pytest.skip("decode_ops' C part is not built for this CPU")
    torch.manual_seed(5)
    logits = torch.randn(64, 49_152) * 2.5
    logits[::2] *= 3  # peaked rows beside flatter ones
    same = 0
    for top_p, top_k in ((1.0, 0), (0.95, 0), (1.0, 50), (0.9, 40)):
        picks = {}
        for way in WAYS:
            decode_ops.configure(allow=way == "c")
            try:
                picks[way] = sample(logits, _rows(64, 100, 0.8, top_p, top_k))
            finally:
                decode_ops.configure()
        same += sum(a == b for a, b in zip(picks["c"], picks["torch"], strict=True))
    assert same >= 4 * 64 - 1


def test_draw_refuses_what_it_cannot_read() -> None:
    if not decode_ops.built():
        pytest.skip("decode_ops' C part is not built for this CPU")
    logits, floats, ks = torch.zeros(2, 10), torch.ones(2), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"top_k must be a contiguous torch\.int64"):
        decode_ops.draw(logits, floats, floats, floats, floats)
    with pytest.raises(ValueError, match="logits must be a contiguous"):
        decode_ops.draw(logits.t(), floats, floats, ks, floats)
    assert decode_ops.draw(logits, floats, floats, ks, torch.zeros(2)).tolist() == [0, 0]

"""The synthetic engine with made-up alternatives: what alternatives cost on the wire and how the
page branches on one, with an engine that costs nothing (the benchmarks' and tests' `ListingEngine`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from backend.engines.base import Generation
from backend.engines.synthetic import WORDS, SyntheticEngine
from backend.vocabulary import ALTERNATIVE_DIGITS, Alternatives, Prompt, SamplingParams


class ListingGeneration(Generation):
    """A synthetic generation whose chunks list k made-up alternatives a token: the drawn word
    first, then the words after it in the synthetic engine's list, at falling logprobs."""

    def __init__(self, inner: Generation, k: int) -> None:
        self._inner = inner
        self._k = k
        self._listed: dict[str, tuple[Alternatives, ...]] = {}
        """Each text's made-up alternatives, made once (what the engine adds costs next to nothing)."""

    async def __anext__(self) -> Any:
        chunk = await self._inner.__anext__()
        if not chunk.logprobs or not self._k:
            return chunk
        listed = self._listed.get(chunk.text)
        if listed is None:
            word = chunk.text.strip()
            start = WORDS.index(word) if word in WORDS else 0
            top = tuple(
                (WORDS[(start + i) % len(WORDS)] + " ", round(-0.3 - 0.7 * i, ALTERNATIVE_DIGITS))
                for i in range(self._k)
            )
            listed = self._listed[chunk.text] = tuple((0, top) for _ in chunk.logprobs)
        return replace(chunk, alternatives=listed)

    async def abort(self, index: int | None = None) -> None:
        """Abort in the generation it wraps."""
        await self._inner.abort(index)

    async def aclose(self) -> None:
        """Close the generation it wraps."""
        await self._inner.aclose()


class ListingEngine(SyntheticEngine):
    """The synthetic engine, with each token's alternatives made up where a request asks for them."""

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        return ListingGeneration(super().generate(prompt, n, params), params.alternatives)

"""Helpers of the embedded engine's tests: a request's texts, finish reasons and last chunks."""

from __future__ import annotations

from backend.engines.base import SamplingParams
from backend.engines.embedded.engine import EmbeddedGeneration

PROMPT = "Name three colors."


async def collect(generation: EmbeddedGeneration | object, n: int) -> tuple[list[str], list, list]:
    """Each sample's whole text, its finish reason and its last chunk, once the request is done."""
    texts, reasons, finals = [""] * n, [None] * n, [None] * n
    async for chunk in generation:  # type: ignore[attr-defined]
        texts[chunk.index] += chunk.text
        if chunk.finish_reason is not None:
            reasons[chunk.index] = chunk.finish_reason
            finals[chunk.index] = chunk
    return texts, reasons, finals


def params(max_tokens: int = 12, temperature: float = 0.8, seed: int = 5, **extra: object) -> SamplingParams:
    """Sampling settings with top_p 0.95 and a seed."""
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed, **extra)

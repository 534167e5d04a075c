"""Fan-out (`"fanout": "requests"`): n single-sample requests seen as one, one failing alone."""

from __future__ import annotations

from typing import Any

from backend.engines.base import Generation
from backend.engines.synthetic import SyntheticEngine
from backend.serving.fanout import FanoutGeneration
from backend.vocabulary import Chunk, Prompt, SamplingParams


class DeadServerGeneration(Generation):
    """A sub-request whose server went away after a first chunk (as a killed worker behind a router)."""

    def __init__(self) -> None:
        self.sent = False

    async def __anext__(self) -> Chunk:
        if not self.sent:
            self.sent = True
            return Chunk(0, "The", 1)
        raise RuntimeError("SGLang at http://router: peer closed connection without sending complete body")

    async def abort(self, index: int | None = None) -> None:
        pass

    async def aclose(self) -> None:
        pass


class OneDeadWorker(SyntheticEngine):
    """Synthetic samples, except that the second sub-request lands on a dead worker."""

    def __init__(self) -> None:
        super().__init__(rate=200.0)
        self.calls = 0

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        self.calls += 1
        return DeadServerGeneration() if self.calls == 2 else super().generate(prompt, n, params)


async def test_a_failed_sub_request_ends_its_own_sample_and_the_others_finish() -> None:
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, seed=5)
    fanout = FanoutGeneration(OneDeadWorker(), Prompt("Hi"), 3, params, "r1")
    texts: dict[int, str] = {}
    finishes: dict[int, Chunk] = {}
    try:
        async for chunk in fanout:
            texts[chunk.index] = texts.get(chunk.index, "") + chunk.text
            if chunk.finish_reason is not None:
                finishes[chunk.index] = chunk
    finally:
        await fanout.aclose()
    reasons: dict[int, Any] = {i: c.finish_reason for i, c in finishes.items()}
    assert reasons == {0: "length", 1: "error", 2: "length"}
    assert "peer closed connection" in finishes[1].meta["error"]
    assert texts[1] == "The" and len(texts[0].split()) > 3 and len(texts[2].split()) > 3

"""Fan-out: n engine requests with n=1 each (seeds seed + i), seen as one request with n samples.

The teaching counterpart of `n`: the same samples, but without the engine's shared prefill, so
TTFT and the trace show what sharing the prompt's work saves. Each sub-request is pumped by its own
task into one queue; abort(i) aborts sub-request i. A sub-request that fails finishes its own sample
with `error` (the reason in the finish's `engine.error`); the others run on.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from backend.engines.base import Engine, Generation
from backend.vocabulary import Chunk, Prompt, SamplingParams


class FanoutGeneration(Generation):
    """n single-sample generations merged into one stream, sample i from sub-request i."""

    def __init__(self, engine: Engine, prompt: Prompt, n: int, params: SamplingParams, label: str) -> None:
        self._subs = [
            engine.generate(prompt, 1, replace(params, seed=params.sample_seed(i))) for i in range(n)
        ]
        self._queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        self._unfinished = n
        self._pumps = [
            asyncio.create_task(self._pump(i, sub), name=f"fanout {i} {label}")
            for i, sub in enumerate(self._subs)
        ]

    async def _pump(self, index: int, sub: Generation) -> None:
        try:
            async for chunk in sub:
                self._queue.put_nowait(replace(chunk, index=index))
        except Exception as exc:  # noqa: BLE001 - this sample ends with the reason; the others go on
            # Sub-requests may run on different servers (behind a router): one server failing
            # ends the samples it ran, not the whole request.
            error = str(exc) or type(exc).__name__
            self._queue.put_nowait(Chunk(index, "", 0, finish_reason="error", meta={"error": error}))

    async def __anext__(self) -> Chunk:
        if self._unfinished == 0:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.finish_reason is not None:
            self._unfinished -= 1
        return item

    async def abort(self, index: int | None = None) -> None:
        targets = self._subs if index is None else [self._subs[index]]
        await asyncio.gather(*(sub.abort() for sub in targets))

    async def aclose(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await asyncio.gather(*(sub.aclose() for sub in self._subs), return_exceptions=True)

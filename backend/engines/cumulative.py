"""Cumulative outputs: every output carries the whole text of its sample so far, as vLLM's
`RequestOutputKind.CUMULATIVE` does (and SGLang's native stream without incremental streaming).

A teaching control (`"output_kind": "cumulative"` in `generate`): engines stream deltas, and
`CumulativeGeneration` builds each sample's text so far from them, so a consumer reads outputs
whose size grows with the text. Its count is the output's (`count = chunk.tokens`, not `+=`), and
the bytes it reads over a sample grow with the square of its length.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from backend.engines.base import Generation
from backend.vocabulary import Alternatives, Chunk

log = logging.getLogger("backend")


class CumulativeGeneration(Generation):
    """Another generation's chunks as cumulative outputs: `text` is the sample's whole text so far,
    `tokens` its token count so far, `logprobs` and `alternatives` (where asked) every token's so far."""

    def __init__(self, deltas: Generation) -> None:
        self._deltas = deltas
        self._texts: dict[int, str] = {}
        self._tokens: dict[int, int] = {}
        self._logprobs: dict[int, tuple[float, ...]] = {}
        self._alternatives: dict[int, tuple[Alternatives, ...]] = {}

    async def __anext__(self) -> Chunk:
        chunk = await self._deltas.__anext__()
        index = chunk.index
        # A new string each time, as an engine building cumulative outputs makes: its cost, like
        # the output's size, grows with the text.
        text = self._texts[index] = self._texts.get(index, "") + chunk.text
        tokens = self._tokens[index] = self._tokens.get(index, 0) + chunk.tokens
        logprobs = None
        if chunk.logprobs is not None:
            logprobs = self._logprobs[index] = self._logprobs.get(index, ()) + chunk.logprobs
        alternatives = None
        if chunk.alternatives is not None:
            alternatives = self._alternatives[index] = self._alternatives.get(index, ()) + chunk.alternatives
        return replace(chunk, text=text, tokens=tokens, logprobs=logprobs, alternatives=alternatives)

    async def abort(self, index: int | None = None) -> None:
        """Abort in the generation it reads."""
        await self._deltas.abort(index)

    async def aclose(self) -> None:
        """Close the generation it reads."""
        await self._deltas.aclose()

    def watch_queue(self, listener: Callable[[int], None]) -> None:
        """Queue positions are the generation's own."""
        self._deltas.watch_queue(listener)


class DeltaReader:
    """A consumer of cumulative outputs: what is new in each (the text after what it has seen, the
    tokens past its count, the logprobs past those it has), as a consumer of vLLM's cumulative
    outputs works it out. The one cumulative-to-delta of the project: the teaching consumer reads
    the engine's cumulative outputs with it, and the SGLang stream parser a cumulative server's.

    With `check_prefix` (a server's stream, which should never rewrite what it sent) it keeps each
    sample's text and says in the log when an output does not start with it, then goes on past the
    text already shown, so the deltas still add up to what the client shows. Without it (the
    teaching consumer, whose time per output the trace measures) it only slices."""

    def __init__(self, check_prefix: bool = False) -> None:
        self._seen: dict[int, tuple[int, int, int, int]] = {}
        """Per sample: characters, tokens, logprobs and alternatives seen."""
        self._texts: dict[int, str] | None = {} if check_prefix else None

    def delta(self, output: Chunk) -> Chunk:
        """The delta chunk of a cumulative output (its finish reason and meta kept)."""
        chars, tokens, logprobs, listed = self._seen.get(output.index, (0, 0, 0, 0))
        new_logprobs = None if output.logprobs is None else output.logprobs[logprobs:]
        alternatives = output.alternatives
        new_alternatives = None if alternatives is None else alternatives[listed:]
        text = output.text[chars:]
        if self._texts is not None:
            shown = self._texts.get(output.index, "")
            if not output.text.startswith(shown):
                log.warning("sample %d: cumulative text changed its prefix; continuing past it", output.index)
            self._texts[output.index] = shown + text
        self._seen[output.index] = (
            chars + len(text),
            max(output.tokens, tokens),  # count = num_tokens: the output already counts them all
            logprobs if output.logprobs is None else max(len(output.logprobs), logprobs),
            listed if alternatives is None else max(len(alternatives), listed),
        )
        return replace(
            output,
            text=text,
            tokens=max(0, output.tokens - tokens),
            logprobs=new_logprobs,
            alternatives=new_alternatives,
        )

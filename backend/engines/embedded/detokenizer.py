"""Token ids to text deltas, one token at a time, with stop strings held back until they resolve.

Decoding a sample's whole text at every step would cost O(length) per token. `TextStream` decodes a
short window instead (the offsets vLLM and TGI use): text is released once it no longer ends in a
partial UTF-8 character. Text that might be the start of a stop string waits until the next
tokens show whether it is one, so the released deltas always concatenate to the exact output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    """Incremental text of one sample; `push` returns what became final, `stopped` says a stop hit."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        """Add one token; returns the text that is now certain (possibly "")."""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return self._release(after[len(before) :])

    def _release(self, delta: str) -> str:
        if not self._stop:
            return delta
        text = self._pending + delta
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)]
        hold = max((k for s in self._stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """Text held back for a possible stop string, released when the sample ends otherwise."""
        text, self._pending = self._pending, ""
        return text

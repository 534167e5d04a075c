"""Each traced request's prefill as the backend's loop sees it, for the trace's prefill span.

The span runs from when the backend handed the request to the engine (`handed`) until the
request's first chunk arrived at its consumer (`first_chunk`), both on the tracer's clock
(`time.perf_counter_ns`), and is labelled with the prompt tokens the engine computed and those it
reused from its prefix cache once a finishing sample reports them (`reported`: the first sample to
report; `prefill_counts` reads the engines' figures). `take` hands a trace frame the spans that
changed since the last frame, as `[start_ms, end_ms, request_id, prompt_tokens, cached_tokens,
ended]`; `ended` says the request is over, so counts still None then mean the engine reported none.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEPT_ENDED = 32
"""Spans of ended requests kept for `export_trace` (as many as the connection keeps windows)."""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def prefill_counts(meta: Mapping[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, of them reused from the prefix cache) from a finish's engine figures: SGLang's
    and the embedded engine's `prompt_tokens` / `cached_tokens`, or an OpenAI-compatible server's
    `usage.prompt_tokens_details.cached_tokens`; None where the engine reports no cached count."""
    prompt, cached = _count(meta.get("prompt_tokens")), _count(meta.get("cached_tokens"))
    usage = meta.get("usage")
    if cached is None and isinstance(usage, Mapping):
        prompt = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    if prompt is None or cached is None or cached > prompt:
        return None
    return prompt, cached


@dataclass
class PrefillSpan:
    """One request's prefill: times in ns on the tracer's clock."""

    start_ns: int
    end_ns: int | None = None
    counts: tuple[int, int] | None = None
    ended: bool = False

    def entry(self, request_id: str, origin_ns: int) -> list[Any]:
        """The span as a trace frame carries it (see the module's docstring)."""
        prompt, cached = self.counts if self.counts is not None else (None, None)
        end = None if self.end_ns is None else (self.end_ns - origin_ns) // 1000 / 1000
        return [(self.start_ns - origin_ns) // 1000 / 1000, end, request_id, prompt, cached, self.ended]


class PrefillLog:
    """One connection's traced requests' prefill spans, and which changed since the last frame."""

    def __init__(self) -> None:
        self.spans: OrderedDict[str, PrefillSpan] = OrderedDict()
        self._changed: set[str] = set()

    def handed(self, request_id: str, at_ns: int) -> None:
        """The backend handed `request_id` to the engine at `at_ns`."""
        self.spans.pop(request_id, None)
        self.spans[request_id] = PrefillSpan(at_ns)
        ended = [key for key, span in self.spans.items() if span.ended]
        for key in ended[: max(0, len(ended) - KEPT_ENDED)]:
            del self.spans[key]

    def first_chunk(self, request_id: str, at_ns: int) -> None:
        """The request's first chunk reached its consumer at `at_ns`: the span ends there."""
        span = self.spans.get(request_id)
        if span is not None and span.end_ns is None:
            span.end_ns = at_ns
            self._changed.add(request_id)

    def reported(self, request_id: str, meta: Mapping[str, Any]) -> None:
        """A sample of the request finished with the engine's figures `meta`; the first counts label it."""
        span = self.spans.get(request_id)
        if span is not None and span.counts is None:
            span.counts = prefill_counts(meta)
            if span.counts is not None:
                self._changed.add(request_id)

    def ended(self, request_id: str) -> None:
        """The request is over: its counts are final (None: the engine reported none)."""
        span = self.spans.get(request_id)
        if span is not None and not span.ended:
            span.ended = True
            self._changed.add(request_id)

    def take(self, origin_ns: int) -> list[list[Any]]:
        """The spans that changed since the last take and have ended (a first chunk came), for a frame."""
        changed, self._changed = self._changed, set()
        return [
            span.entry(request_id, origin_ns)
            for request_id in changed
            if (span := self.spans.get(request_id)) is not None and span.end_ns is not None
        ]

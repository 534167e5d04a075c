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
    """One connection's traced requests' prefill spans, and which changed since the last frame.

    A request has one span, or one per sub-request where fan-out sends it as n requests of one
    sample (`handed` with `requests` n): sub-request i's span ends at sample i's first chunk, is
    labelled by sample i's figures, and goes in frames as `REQUEST_ID/i`."""

    def __init__(self) -> None:
        self.spans: OrderedDict[str, list[PrefillSpan]] = OrderedDict()
        """Each request's spans: one, or one per sub-request."""
        self._changed: set[tuple[str, int]] = set()

    def handed(self, request_id: str, at_ns: int, requests: int = 1) -> None:
        """The backend handed `request_id` to the engine at `at_ns`, as `requests` requests."""
        self.spans.pop(request_id, None)
        self.spans[request_id] = [PrefillSpan(at_ns) for _ in range(max(1, requests))]
        ended = [key for key, spans in self.spans.items() if all(span.ended for span in spans)]
        for key in ended[: max(0, len(ended) - KEPT_ENDED)]:
            del self.spans[key]

    def awaiting(self, request_id: str) -> int:
        """How many of the request's spans still wait for their first chunk."""
        return sum(span.end_ns is None for span in self.spans.get(request_id, ()))

    def _span(self, request_id: str, index: int) -> tuple[int, PrefillSpan] | None:
        """Sample `index`'s span of the request (its sub-request's, or the request's one)."""
        spans = self.spans.get(request_id)
        if not spans:
            return None
        at = index if len(spans) > 1 else 0
        return (at, spans[at]) if 0 <= at < len(spans) else None

    def first_chunk(self, request_id: str, index: int, at_ns: int) -> bool:
        """Sample `index`'s first chunk reached its consumer at `at_ns`: its span (the request's, or
        its sub-request's) ends there, unless it has ended already; whether it ended here."""
        found = self._span(request_id, index)
        if found is None or found[1].end_ns is not None:
            return False
        found[1].end_ns = at_ns
        self._changed.add((request_id, found[0]))
        return True

    def reported(self, request_id: str, meta: Mapping[str, Any], index: int = 0) -> None:
        """Sample `index` finished with the engine's figures `meta`; the first counts label its span."""
        found = self._span(request_id, index)
        if found is not None and found[1].counts is None:
            found[1].counts = prefill_counts(meta)
            if found[1].counts is not None:
                self._changed.add((request_id, found[0]))

    def ended(self, request_id: str) -> None:
        """The request is over: its counts are final (None: the engine reported none)."""
        for at, span in enumerate(self.spans.get(request_id, ())):
            if not span.ended:
                span.ended = True
                self._changed.add((request_id, at))

    def take(self, origin_ns: int) -> list[list[Any]]:
        """The spans that changed since the last take and have ended (a first chunk came), for a frame."""
        changed, self._changed = self._changed, set()
        entries = []
        for request_id, at in sorted(changed):
            spans = self.spans.get(request_id)
            if spans is None or at >= len(spans) or spans[at].end_ns is None:
                continue
            entries.append(
                spans[at].entry(request_id if len(spans) == 1 else f"{request_id}/{at}", origin_ns)
            )
        return entries

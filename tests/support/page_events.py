"""What the page's handlers get from Gradio in the handler tests: a visitor's request, and the run
settings the page sends beside a Generate or a continuation."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

PAGE_SETTINGS: dict[str, Any] = {
    "n": 2,
    "max_tokens": 8,
    "temperature": 0.8,
    "top_p": 0.95,
    "seed": 5,
    "consumer": "cooperative",
    "block_ms": 0,
    "fanout": "n",
    "output_kind": "delta",
    "cancel_after": None,
    "logprobs": False,
    "answer_pattern": "",
}
"""What the page sends beside a continuation (its run settings but the prompt, format and system
prompt, which are the continued run's)."""


def page(session: str = "one-page") -> Any:
    """A visitor's `gr.Request` as the handlers read it: its session, no client address or headers."""
    return SimpleNamespace(session_hash=session, client=None, headers={})

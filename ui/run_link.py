"""A link to a run: its prompt, format, system prompt, n, max tokens, sampling settings and seed as
query parameters, and those parameters read back, each checked, when a page opens from the link.

`link_query` writes a run's settings (the seed it ran with, so that a random seed is kept); the page
adds its own address in the browser. `read_link` reads the parameters of a page's address: each
value is checked against the page's own limits (the same a Generate is held to), a value that is
malformed or out of range is left out (the page keeps its default for it) and named in the message,
and the link runs on opening only when what it sets is whole and its prompt is at most
AUTO_RUN_PROMPT_CHARS long; a longer prompt is shown, and runs when the visitor presses Generate.
`link_note` is what a linked run's status line says of its samples, by the engine's /health. Plain
logic: the page's handler (`ui.handlers.Handlers.open_link`) does the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from backend.config.settings import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    SEED_MAX,
    TEMPERATURE_MAX,
    Limits,
)
from backend.vocabulary import PROMPT_FORMATS

DEFAULT_PROMPT = "Write one sentence about a lighthouse keeper who learns to juggle."
"""The prompt the page opens with."""

DEFAULT_N = 4
"""The n the page opens with."""

TOP_P_MIN = 0.05
"""The smallest top-p the page's slider offers."""

LINK_FIELDS = ("prompt", "system", "format", "n", "max_tokens", "temperature", "top_p", "seed")
"""The run settings a link carries, by their names as run settings (`ui.run_request.RUN_SETTINGS`)
and as query parameters."""

AUTO_RUN_PROMPT_CHARS = 2_000
"""The longest prompt a link runs on opening: a link is a click in a chat or a mail, and a page that
starts a long prefill for whoever follows it (up to the backend's 16,000 characters) spends the
engine's time on a prompt nobody has read. A longer one is shown in the prompt box, not run, until
the visitor presses Generate."""

GRADIO_PARAMETERS = frozenset({"__theme", "view", "lang", "deep_link"})
"""Query parameters Gradio reads itself: not the link's, and not named as ignored."""


def page_defaults(limits: Limits) -> dict[str, Any]:
    """The values the page opens with for the settings a link carries."""
    return {
        "prompt": DEFAULT_PROMPT,
        "system": "",
        "format": "chat",
        "n": min(DEFAULT_N, limits.n_max),
        "max_tokens": min(DEFAULT_MAX_TOKENS, limits.max_tokens_max),
        "temperature": DEFAULT_TEMPERATURE,
        "top_p": DEFAULT_TOP_P,
        "seed": None,
    }


def link_query(settings: Mapping[str, Any]) -> str:
    """The query string of a link to a run of `settings` (`LINK_FIELDS`; an empty system prompt and
    a None seed are left out)."""
    pairs = []
    for name in LINK_FIELDS:
        value = settings.get(name)
        if value is None or (name == "system" and not value):
            continue
        if isinstance(value, float) and value.is_integer() and name in ("n", "max_tokens", "seed"):
            value = int(value)
        pairs.append((name, _text_of(value)))
    return urlencode(pairs)


def _text_of(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass
class OpenedLink:
    """What a page's query parameters set: the values read (by run setting), what was ignored and
    why, and whether the link runs on opening (and why not, where it does not)."""

    values: dict[str, Any] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    held: str = ""
    """Why the link is shown, not run ("" where it runs)."""

    @property
    def runs(self) -> bool:
        """Whether the page runs the link as it opens."""
        return not self.held and not self.ignored

    def message(self) -> str:
        """The status line's words for the opened link: what it set, what was ignored, whether it
        runs now or waits for Generate."""
        parts = []
        if self.ignored:
            parts.append(
                "**This link's values were ignored** (the page's defaults are used instead): "
                + "; ".join(self.ignored)
                + "."
            )
        if self.held:
            parts.append(f"{self.held} Press **Generate** to run it.")
        elif self.ignored:
            parts.append("Check the settings, then press **Generate** to run it.")
        return "\n\n".join(parts)


def read_link(query: Mapping[str, str], limits: Limits) -> OpenedLink | None:
    """The run settings in a page's query parameters (`query`), each checked against the page's
    `limits`; None where the address carries none (the page opens as it is)."""
    ours = {key: value for key, value in query.items() if key not in GRADIO_PARAMETERS}
    if not ours:
        return None
    opened = OpenedLink()
    for key, raw in ours.items():
        if key not in LINK_FIELDS:
            opened.ignored.append(f"{_quote(key)} is not a setting a link carries")
            continue
        try:
            opened.values[key] = _read(key, raw, limits)
        except ValueError as exc:
            opened.ignored.append(f"{key} {_quote(raw)}: {exc}")
    if "prompt" not in opened.values and not opened.ignored:
        opened.held = "This link sets no prompt."
    prompt = opened.values.get("prompt", "")
    if len(prompt) > AUTO_RUN_PROMPT_CHARS:
        opened.held = (
            f"This link's prompt has {len(prompt):,} characters, more than the "
            f"{AUTO_RUN_PROMPT_CHARS:,} a link runs as it opens: it is shown, not run."
        )
    return opened


def _quote(value: str) -> str:
    shown = value if len(value) <= 40 else value[:40] + "…"
    return repr(shown)


def _read(key: str, raw: str, limits: Limits) -> Any:
    """One parameter's value, or ValueError saying what it must be."""
    if key in ("prompt", "system"):
        if len(raw) > limits.max_prompt_chars:
            raise ValueError(f"longer than the page's {limits.max_prompt_chars:,} characters")
        if key == "prompt" and not raw.strip():
            raise ValueError("empty")
        return raw
    if key == "format":
        if raw not in PROMPT_FORMATS:
            raise ValueError(f"not one of {', '.join(PROMPT_FORMATS)}")
        return raw
    if key == "n":
        return _whole(raw, 1, limits.n_max)
    if key == "max_tokens":
        return _whole(raw, 1, limits.max_tokens_max)
    if key == "seed":
        return _whole(raw, 0, SEED_MAX - limits.n_max)
    low, high = (0.0, TEMPERATURE_MAX) if key == "temperature" else (TOP_P_MIN, 1.0)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"not a number from {low:g} to {high:g}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"not a number from {low:g} to {high:g}")
    return value


def _whole(raw: str, low: int, high: int) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 12) or not low <= int(text) <= high:
        raise ValueError(f"not a whole number from {low:,} to {high:,}")
    return int(text)


def link_note(health: dict[str, Any]) -> str:
    """The status line's words for a run opened from a link on the engine of `health`."""
    engine = health.get("engine", "this")
    if health.get("batch_invariant"):
        return (
            f"**Opened from a link:** its prompt, settings and seed. The **{engine}** engine is "
            "batch-invariant, so these are the same samples as the run the link was copied from "
            "(on the same engine and model)."
        )
    return (
        f"**Opened from a link:** its prompt, settings and seed. The **{engine}** engine is not "
        "batch-invariant: with the same seed, the samples may differ from the run the link was "
        "copied from."
    )

"""What a sample that answers the tests' chat prompt says: read as a person would read a column."""

from __future__ import annotations

import re

COLOUR_PROMPT = "Name three colours and say something about each."

LONG_PROMPT = "Write a long story about a dragon who learns to sing."
"""A chat prompt an instruct model answers at length: samples that must still run when stopped."""

COLOURS = re.compile(
    r"\b(red|blue|green|yellow|orange|purple|pink|black|white|brown|gr[ae]y|violet|indigo|gold|silver|"
    r"cyan|magenta|turquoise|crimson|beige|teal|navy|colou?rs?)\b",
    re.IGNORECASE,
)
"""A sample answering COLOUR_PROMPT names at least one of these."""


def answers_colours(text: str, min_words: int = 10) -> bool:
    """Whether `text` reads as an answer to COLOUR_PROMPT: at least `min_words` words, a colour named."""
    return len(text.split()) >= min_words and COLOURS.search(text) is not None

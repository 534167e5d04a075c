"""The page's examples: one-click prompts with the settings that show one lesson each.

Each `Example` is a prompt, the settings its lesson needs (n, temperature, max tokens, the
consumer mode and its block time, token confidence, an answer pattern, the prompt's format), a
label that names the lesson and its prompt in a few words, and the lesson in one line.
`examples_block` lays them out as Gradio examples, one button per label; a click sets the controls
and shows the lesson in the box above them; Generate then runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields
from typing import Any

import gradio as gr

from ui.run_request import RUN_SETTINGS

WEEK = "How many days are in a week? Answer with a number."
"""A question SmolLM2-135M answers alike in most samples (7), some at once, some at length: a vote
decided before the last sample ends."""

SHEEP = "A farmer has 17 sheep. All but 9 run away. How many sheep are left? Answer with a number."
"""A question with one right answer (9) that a small model often gets wrong (8, 17, 26)."""

LONG_STORY = "Write a long story about a lighthouse keeper who keeps a diary through a winter storm."
"""A prompt the model answers at length: a long stream for the event-loop lessons."""

RAINBOW_COLOURS = r"(?i)\b(red|orange|yellow|green|blue|indigo|violet)\b"
"""The answer pattern of the token-confidence example: the last colour of the rainbow a sample names."""

FAVOURITE_COLOUR = (
    "The seven colours of the rainbow are red, orange, yellow, green, blue, indigo and violet. "
    "My favourite of them is"
)
"""The token-confidence example's prompt, raw text whose next word is a colour the model chooses:
at temperature 0.8, 98 % of SmolLM2-135M's samples name one (indigo 22, blue 13, violet 4 of 40;
`python -m bench.confidence_example`), where the chat question "Name one colour of the rainbow.
Answer with one word." at temperature 1 got one sample in ten to name one (and 22 % at 0.7)."""


LABEL_CHARS = 44
"""The longest label: Gradio cuts an example's button label short past about 50 characters."""


@dataclass(frozen=True, slots=True)
class Example:
    """One example: its button's label, then the values `examples_block` sets: the lesson in one line
    first (shown in the lesson box), then run settings (`ui.run_request.RUN_SETTINGS`), each field
    named as the setting it sets."""

    label: str
    lesson: str
    prompt: str
    n: int
    max_tokens: int
    temperature: float
    consumer: str = "cooperative"
    block_ms: float = 0.0
    logprobs: bool = False
    answer_pattern: str = ""
    format: str = "chat"
    stop_when_decided: str = "off"

    @property
    def settings(self) -> dict[str, Any]:
        """The run settings the example sets, by name (`ui.run_request.RUN_SETTINGS`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)[2:]}


EXAMPLES = (
    Example(
        "Self-consistency: the sheep question, n 8",
        "Self-consistency: one right answer (9); the answers panel votes over the n samples' numbers; "
        "the majority is the self-consistency answer, right or not with so small a model.",
        SHEEP,
        n=8,
        max_tokens=96,
        temperature=0.8,
    ),
    Example(
        "Stop when decided: a week's days, n 16",
        "Stop when decided: once the leading answer can no longer lose, the samples still running are "
        "stopped in the engine; the answers panel marks the moment, the summary what it saved.",
        WEEK,
        n=16,
        max_tokens=96,
        temperature=0.8,
        stop_when_decided="sure",
    ),
    Example(
        "Temperature 0: every sample the same",
        "Temperature 0: greedy decoding, so every sample is the same text and the vote is unanimous; "
        "sampling n times needs a temperature.",
        SHEEP,
        n=4,
        max_tokens=96,
        temperature=0.0,
    ),
    Example(
        "Diversity: a poem at temperature 1",
        "Diversity: a creative prompt at temperature 1 gives n different texts from one prompt; the "
        "violet marks show where each one parts from the rest.",
        "Write a two-line poem about the sea at night.",
        n=6,
        max_tokens=64,
        temperature=1.0,
    ),
    Example(
        "Token confidence: where samples part",
        "Token confidence: look at each column's first word, a colour: the model was unsure there "
        "(hover: indigo p 0.38, blue 0.16), so the samples part at it; the vote counts the colours.",
        FAVOURITE_COLOUR,
        n=8,
        max_tokens=4,
        temperature=0.8,
        logprobs=True,
        answer_pattern=RAINBOW_COLOURS,
        format="raw",
    ),
    Example(
        "Blocking the loop: 30 ms a chunk",
        "Blocking the loop: 30 ms of work per chunk. In seconds the red band of one step grows, lag "
        "climbs, the columns freeze. Press Cancel: the page says how long the loop took to read it.",
        LONG_STORY,
        n=4,
        max_tokens=120,
        temperature=0.8,
        consumer="blocking",
        block_ms=30.0,
    ),
    Example(
        "Cooperative: await asyncio.sleep(0)",
        "Cooperative: the same long stream with `await asyncio.sleep(0)` after each chunk; the loop "
        "stays free, lag stays low and each sample's chunks arrive evenly: a step per chunk.",
        LONG_STORY,
        n=4,
        max_tokens=120,
        temperature=0.8,
    ),
    Example(
        "Greedy: no await between chunks",
        "Greedy: no await between the chunks already waiting, so fewer, longer loop steps; run "
        "Cooperative first, and the trace sets this run's figures beside it.",
        LONG_STORY,
        n=4,
        max_tokens=120,
        temperature=0.8,
        consumer="greedy",
    ),
)
"""The page's examples, in the order they are listed."""

EXAMPLE_WITH_ANSWERS = EXAMPLES[0]
"""The example the answers panel offers beside free text: a question whose samples give answers."""

CONFIDENCE_EXAMPLE = EXAMPLES[3]
"""The token-confidence example (`python -m bench.confidence_example` measures it)."""
"""The example the answers panel offers beside free text: a question whose samples give answers."""


def example_rows(examples: tuple[Example, ...], n_max: int, max_tokens_max: int) -> list[list[Any]]:
    """Each example's values for `examples_block`'s inputs, n and max tokens capped at the page's
    largest (a dashboard started with a smaller --n-max still lists every example)."""
    rows = []
    for example in examples:
        row = list(astuple(example))[1:]
        row[2], row[3] = min(example.n, n_max), min(example.max_tokens, max_tokens_max)
        rows.append(row)
    return rows


def examples_block(controls: Mapping[str, Any], n_max: int, max_tokens_max: int) -> gr.Textbox:
    """The examples' buttons, each setting the page's run settings named by `Example`'s fields (from
    `controls`, the page's controls by run setting) and, above them, the box that shows the clicked
    example's lesson; returns that box."""
    names = [f.name for f in fields(Example)][2:]
    unknown = sorted(set(names) - set(RUN_SETTINGS))
    if unknown:
        raise TypeError(f"an example sets {unknown[0]!r}, which is not a run setting of the page")
    lesson = gr.Textbox(
        label="what the example shows",
        placeholder="Click an example below: it sets the prompt and settings, and says here what it shows.",
        interactive=False,
        lines=1,
        elem_id="example-lesson",
    )
    gr.Examples(
        example_rows(EXAMPLES, n_max, max_tokens_max),
        inputs=[lesson, *(controls[name] for name in names)],
        label="Examples: click one, then Generate",
        cache_examples=False,
        examples_per_page=len(EXAMPLES),
        example_labels=[example.label for example in EXAMPLES],
        elem_id="examples",
    )
    return lesson

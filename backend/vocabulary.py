"""The request vocabulary: what a request asks for and what comes back, on the ground floor.

The engines, the protocol, saved runs and the page all speak it: a `Prompt` and its format, the
`SamplingParams`, the per-sample `Chunk`s, and why a sample ended (`FINISH_REASONS`). It imports
nothing of the project, so any module may use it without a circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "abort", "error")
"""Why a sample ended: natural stop, max_tokens reached, cancelled, engine failure."""

ALTERNATIVES_DEFAULT = 5
"""How many alternatives a token gets where a run asks for them without saying how many (the page's k)."""

ALTERNATIVES_MAX = 20
"""The most alternatives a token may get: the largest k SGLang and vLLM give by default."""

ALTERNATIVE_DIGITS = 4
"""Decimals an alternative's logprob keeps: each engine rounds them as it lists them (a probability
to 0.01 % and better), so that frames carry them as they are, with no work a token."""

Alternatives = tuple[int, tuple[tuple[str, float], ...]]
"""One token's alternatives: the drawn token's place among them (-1: not among them), then the k
most likely tokens at that position as (text, natural-log probability rounded to
ALTERNATIVE_DIGITS), most likely first."""

PROMPT_FORMATS = ("chat", "raw")
"""How a prompt reaches the model: as the user's turn of the model's chat template, or as plain text
to continue."""


@dataclass(frozen=True)
class Prompt:
    """What a request samples from: the user's text, and the format it reaches the model in.

    `chat`: the text is the user's message (after an optional system prompt), rendered with the
    model's chat template, and the samples are the assistant's answer. `raw`: the text is given to
    the model as it is, and the samples continue it.
    """

    text: str
    format: str = "chat"
    system: str = ""
    """The system prompt of a chat prompt; empty: the template's own default (if it has one)."""
    prefix: str = ""
    """Text the samples continue from (a continuation of an earlier run's branch): in the chat
    format the start of the assistant's answer, after the template has opened its turn; raw, more
    text after `text`. Empty: the samples start from the prompt."""

    def __post_init__(self) -> None:
        if self.format not in PROMPT_FORMATS:
            raise ValueError(f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, got {self.format!r}")

    @property
    def chat(self) -> bool:
        """Whether the prompt goes through the chat template."""
        return self.format == "chat"

    @property
    def raw_text(self) -> str:
        """What a raw prompt sends: the text, then the prefix it continues from."""
        return self.text + self.prefix

    def messages(self) -> list[dict[str, str]]:
        """The chat turns: the system prompt where one is given, then the user's message (the
        assistant's turn, opened by the template, is not among them: see `prefix`)."""
        turns = [{"role": "system", "content": self.system}] if self.system else []
        return [*turns, {"role": "user", "content": self.text}]

    def continued_messages(self) -> list[dict[str, str]]:
        """`messages`, then the assistant's turn begun with the prefix: what an OpenAI-compatible
        server continues with `continue_final_message` (the prefix must not be empty)."""
        return [*self.messages(), {"role": "assistant", "content": self.prefix}]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request; `seed` is resolved (never None) by the time an engine sees it."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None
    top_k: int = 0
    """Sample from the k most likely tokens only; 0 means no limit."""
    stop: tuple[str, ...] = ()
    """A sample ends (reason "stop") before the first of these strings; the string is not output."""
    logprobs: bool = False
    """Whether each chunk carries its tokens' log probabilities (`Chunk.logprobs`)."""
    alternatives: int = 0
    """With `logprobs`: how many of the most likely tokens each token's position lists
    (`Chunk.alternatives`); 0: none."""

    def sample_seed(self, index: int) -> int:
        """The seed of sample `index`: the request seed plus the index, so samples differ."""
        if self.seed is None:
            raise ValueError("seed is not resolved")
        return self.seed + index


@dataclass(frozen=True)
class Chunk:
    """A delta of one sample: new text, how many tokens it holds, and the finish reason on the last."""

    index: int
    text: str
    tokens: int
    finish_reason: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    logprobs: tuple[float, ...] | None = None
    """The natural-log probability of each of the chunk's tokens under the model, in order, where
    the request asked for them (`SamplingParams.logprobs`) and the engine gives them."""
    alternatives: tuple[Alternatives, ...] | None = None
    """Each of the chunk's tokens' alternatives (`Alternatives`), in order, where the request asked
    for them (`SamplingParams.alternatives`) and the engine gives them."""

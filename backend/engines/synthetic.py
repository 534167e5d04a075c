"""The synthetic engine: deterministic text at a set token rate, for tests, benchmarks and demos.

Each sample's text depends only on its seed (the request's seed + its index), and at temperature
0 on nothing at all: real engines decode greedily there, so every sample is the same. Each sample
runs as its own asyncio task that sleeps until its next token is due, so n samples interleave on
one event loop the way chunks of a real engine's stream do; samples due at the same moment share
one timer (a timer per token and sample was most of the engine's cost at n = 64). A sample
finishes with "length" at max_tokens, or with "stop" at a sentence end once it is long enough, so
both reasons occur.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import TYPE_CHECKING, Any

from backend.config.declared import Setting
from backend.engines.base import Engine, Generation, SampleTasksGeneration
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines import EngineOptions

WORDS = (
    "the a river light stone quiet morning window garden road city signal engine thread loop "
    "token sample stream column lantern harbor meadow forest bridge tower letter number pattern "
    "answer question story idea measure moment minute second hour evening season winter summer "
    "ocean mountain valley field cloud rain wind fire water silver copper paper glass machine "
    "model weight layer memory cache batch queue task future promise worker socket frame packet "
    "walks runs waits listens sings turns opens closes carries builds writes reads counts learns "
    "finds keeps gives holds moves rests grows shines falls rises drifts hums "
    "slowly quickly gently again always never together softly early late "
    "bright calm small large old new warm cold steady patient curious careful simple clear "
    "over under through across beside behind within between toward after before "
    "and but so while because when where then"
).split()

STOP_PROBABILITY = 0.3
"""Chance that a sample stops at a sentence end once it has reached its minimum length."""

MIN_STOP_FRACTION = 0.4
"""A sample may stop (finish "stop") only after this fraction of max_tokens."""

SENTENCE_WORDS = (4, 12)
"""A sentence has from 4 to 12 words, each length equally likely."""


def synthetic_tokens(sample_seed: int, max_tokens: int, temperature: float = 1.0) -> tuple[list[str], str]:
    """The tokens of the sample with `sample_seed` and its finish reason ("stop" or "length").

    A pure function. Tokens are words with their leading space; concatenated they are the text.
    """
    rng = random.Random("synthetic:greedy" if temperature == 0 else f"synthetic:{sample_seed}")
    min_tokens = max(1, int(max_tokens * MIN_STOP_FRACTION))
    tokens: list[str] = []
    while True:
        sentence_length = rng.randint(*SENTENCE_WORDS)
        for position in range(sentence_length):
            word = rng.choice(WORDS)
            if position == 0:
                word = word.capitalize()
            if position == sentence_length - 1:
                word += "."
            tokens.append(word if not tokens else " " + word)
            if len(tokens) == max_tokens:
                return tokens, "length"
        if len(tokens) >= min_tokens and rng.random() < STOP_PROBABILITY:
            return tokens, "stop"


def synthetic_logprobs(tokens: list[str]) -> tuple[float, ...]:
    """Each token's natural-log probability under the generator that drew it (`synthetic_tokens`):
    its word is one of WORDS, all equally likely, and its sentence ends at it or goes on with the
    probability that a length drawn uniformly from SENTENCE_WORDS, and not shorter than the words so
    far, is this one. So a sentence's last word is less certain than the words before it."""
    word = -math.log(len(WORDS))
    shortest, longest = SENTENCE_WORDS
    logprobs = []
    position = 0
    for token in tokens:
        ends = token.endswith(".")
        if position + 1 < shortest:
            length = 0.0  # the sentence cannot end here: no choice was made
        else:
            end = 1 / (longest - position)
            length = math.log(end) if ends else math.log1p(-end)
        logprobs.append(word + length)
        position = 0 if ends else position + 1
    return tuple(logprobs)


def cut_at_stop(tokens: list[str], reason: str, stop: tuple[str, ...]) -> tuple[list[str], str]:
    """The tokens up to (not including) the first stop string, and "stop" if one was found."""
    text = "".join(tokens)
    cuts = [position for position in (text.find(s) for s in stop) if position >= 0]
    if not cuts:
        return tokens, reason
    end = min(cuts)
    kept: list[str] = []
    length = 0
    for token in tokens:
        if length + len(token) > end:
            if end > length:
                kept.append(token[: end - length])
            break
        kept.append(token)
        length += len(token)
    return kept, "stop"


def token_intervals(sample_seed: int, count: int, rate: float, jitter: float) -> list[float]:
    """Seconds before each of `count` tokens: 1/rate, each scaled by 1 ± jitter (uniform)."""
    base = 1.0 / rate
    if jitter == 0:
        return [base] * count  # what the scaling below gives, without a random draw per token
    rng = random.Random(f"timing:{sample_seed}")
    return [base * (1.0 + jitter * rng.uniform(-1.0, 1.0)) for _ in range(count)]


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    """A token deadline came: wake every sample task waiting for it (those not cancelled)."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


RATE = Setting(
    "rate", "--rate", ("SYNTHETIC_RATE",), "synthetic engine: tokens/s per sample", default=20.0, kind=float
)
"""Tokens per second per sample: about what a small model gives one sample on a modest GPU."""

JITTER = Setting(
    "jitter",
    "--jitter",
    ("SYNTHETIC_JITTER",),
    "synthetic engine: each token interval varies by ± this fraction",
    default=0.3,
    kind=float,
)
"""Each token interval is 1/rate scaled by a uniform factor in [1 - jitter, 1 + jitter]."""

SETTINGS = (RATE, JITTER)


class SyntheticEngine(Engine):
    """Deterministic text at `rate` tokens/s per sample, each interval varied by ±`jitter`."""

    name = "synthetic"

    def __init__(self, rate: float = RATE.default, jitter: float = JITTER.default) -> None:
        if not rate > 0:
            raise ValueError(f"--rate must be > 0 tokens/s, got {rate}")
        if not 0 <= jitter < 1:
            raise ValueError(f"--jitter must be in [0, 1), got {jitter}")
        self.rate = rate
        self.jitter = jitter
        self._generations: set[SyntheticGeneration] = set()

    @classmethod
    def from_options(cls, options: EngineOptions) -> SyntheticEngine:
        """Build from the command line's `--rate` and `--jitter`."""
        return cls(rate=options.rate, jitter=options.jitter)

    @property
    def model(self) -> str:
        return f"deterministic text, {self.rate:g} tok/s per sample ± {self.jitter:.0%}"

    @property
    def template_note(self) -> str:
        return "synthetic text does not depend on the prompt"

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        generation = SyntheticGeneration(self, n, params)
        return generation

    def health(self) -> dict[str, Any]:
        running = sum(g.running_samples for g in self._generations)
        # Each sample's text depends on its seed alone, whatever else runs with it: batch-invariant.
        return {
            **super().health(),
            "running_requests": len(self._generations),
            "running_samples": running,
            "batch_invariant": True,
        }


class SyntheticGeneration(SampleTasksGeneration):
    """n sample tasks feeding one queue; the iterator ends after every sample's finish chunk."""

    def __init__(self, engine: SyntheticEngine, n: int, params: SamplingParams) -> None:
        super().__init__(n, engine._generations)
        self._engine = engine
        self._params = params
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        """Every sample's deadlines count from here, so equal intervals give equal deadlines."""
        self._deadlines: dict[float, list[asyncio.Future[None]]] = {}
        """Sample tasks waiting for each pending deadline: one timer per deadline, not per sample."""
        self._texts: dict[int | None, tuple[list[str], str]] = {}
        """Each text computed once: at temperature 0 every sample has the same one (key None)."""
        self._tasks = [
            asyncio.create_task(self._run_sample(index), name=f"synthetic-sample-{index}")
            for index in range(n)
        ]

    def _text(self, seed: int) -> tuple[list[str], str]:
        params = self._params
        key = None if params.temperature == 0 else seed
        text = self._texts.get(key)
        if text is None:
            tokens, reason = synthetic_tokens(seed, params.max_tokens, params.temperature)
            text = self._texts[key] = cut_at_stop(tokens, reason, params.stop)
        return text

    def _logprobs(self, tokens: list[str]) -> tuple[float, ...] | list[None]:
        """Each token's log probability where the request asked for them, else None for each."""
        return synthetic_logprobs(tokens) if self._params.logprobs else [None] * len(tokens)

    def _until(self, due: float) -> asyncio.Future[None]:
        """A future done at loop time `due`; samples due at the same time share its timer."""
        waiter = self._loop.create_future()
        waiters = self._deadlines.get(due)
        if waiters is None:
            waiters = self._deadlines[due] = []
            self._loop.call_at(due, self._deadline_passed, due)
        waiters.append(waiter)
        return waiter

    def _deadline_passed(self, due: float) -> None:
        _wake(self._deadlines.pop(due))

    async def _run_sample(self, index: int) -> None:
        seed = self._params.sample_seed(index)
        tokens, reason = self._text(seed)
        if not tokens:  # the stop string starts the text: nothing to stream, only the finish
            self._queue.put_nowait(Chunk(index, "", 0, reason))
            return
        intervals = token_intervals(seed, len(tokens), self._engine.rate, self._engine.jitter)
        loop, put, last = self._loop, self._queue.put_nowait, len(tokens) - 1
        logprobs = self._logprobs(tokens)
        due = self._started
        try:
            for position, (token, interval, logprob) in enumerate(
                zip(tokens, intervals, logprobs, strict=True)
            ):
                # Deadlines, not sleeps of fixed length: a late wake-up does not slow the rate. A
                # token already due still waits for one loop iteration, so a loop that cannot keep
                # up (a blocking consumer) slows the engine down instead of flooding it.
                due += interval
                if due > loop.time():
                    await self._until(due)
                else:
                    await asyncio.sleep(0)
                finish = reason if position == last else None
                put(Chunk(index, token, 1, finish, logprobs=None if logprob is None else (logprob,)))
        except asyncio.CancelledError:
            put(Chunk(index, "", 0, "abort"))
            raise

"""How often the token-confidence example's samples name a colour: `python -m bench.confidence_example`.

Loads the embedded engine (SmolLM2-135M-Instruct, its model in a process of its own, as the backend
runs it) and, for each candidate prompt, format and temperature, samples `--rounds` requests of n = 8 (seeds
1, 101, 201, ...) of its max tokens, then reads each sample's answer with the example's
pattern (the last rainbow colour it names, `ui.examples.RAINBOW_COLOURS`) as the page's answers
panel does. Prints, per candidate, the share of samples with an answer, the answers' counts, and the
share of runs where at least half the samples answer (the panel votes there; below, it calls the
samples free text). The page's example is the first candidate; the others are what it was chosen
against.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter

from backend.engines.embedded.engine import EmbeddedEngine
from backend.vocabulary import Prompt, SamplingParams
from ui.answers import compile_answer_pattern, final_answer
from ui.examples import CONFIDENCE_EXAMPLE, RAINBOW_COLOURS

CANDIDATES = (
    (CONFIDENCE_EXAMPLE.prompt, CONFIDENCE_EXAMPLE.format, CONFIDENCE_EXAMPLE.temperature, 4),
    (CONFIDENCE_EXAMPLE.prompt, CONFIDENCE_EXAMPLE.format, 1.0, 4),
    ("Name one colour of the rainbow. Answer with one word.", "chat", 1.0, 24),
    ("Name one colour of the rainbow. Answer with one word.", "chat", 0.7, 24),
    ("Q: Name one colour of the rainbow.\nA:", "raw", 1.0, 4),
)
"""(prompt, format, temperature, max tokens): the page's example first, then what it was chosen
against."""

N = 8


async def answers(engine: EmbeddedEngine, prompt: Prompt, params: SamplingParams) -> list[str | None]:
    """The rainbow-pattern answer of each of n = 8 samples of `prompt` with `params`."""
    pattern = compile_answer_pattern(RAINBOW_COLOURS)
    texts = [""] * N
    async for chunk in engine.generate(prompt, N, params):
        texts[chunk.index] += chunk.text
    return [final_answer(text, pattern) for text in texts]


async def main(rounds: int) -> int:
    """Print each candidate's figures over `rounds` runs of n = 8."""
    engine = EmbeddedEngine(max_rows=N, context=1024)
    engine.load()
    try:
        path = engine.health().get("compute_path")
        print(f"embedded engine, compute path {path}, {rounds} runs of n = {N}")
        for text, prompt_format, temperature, max_tokens in CANDIDATES:
            counts: Counter[str] = Counter()
            answered = voting_runs = 0
            for index in range(rounds):
                seed = 1 + 100 * index
                params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed)
                got = await answers(engine, Prompt(text, prompt_format), params)
                named = [answer.lower() for answer in got if answer]
                counts.update(named)
                answered += len(named)
                voting_runs += 2 * len(named) >= N
            share = answered / (rounds * N)
            top = ", ".join(f"{answer} {count}" for answer, count in counts.most_common(5))
            print(
                f"{text!r} ({prompt_format}, temperature {temperature:g}, {max_tokens} tokens): "
                f"{share:.0%} of samples name a colour, {voting_runs} of {rounds} runs vote; "
                f"answers: {top or 'none'}"
            )
    finally:
        await engine.stop()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of n = 8 per candidate")
    sys.exit(asyncio.run(main(parser.parse_args().rounds)))

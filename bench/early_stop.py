"""What stopping when the vote is decided saves, on real prompts: `python -m bench.early_stop`.

On the embedded engine (SmolLM2-135M on this CPU), each of PROMPTS (short arithmetic and
multiple-choice questions written for this bench) is sampled n = 16 times three ways, one after
another in the same run: all n to their end, then with each rule of `ui.early_stop` stopping the
samples still running (the engine's abort) once it decides. It prints, per rule: tokens generated
against all n (the saving), wall time against all n, and how often the early answer is the all-n
majority. The engine is batch-invariant and each sample's seed is fixed, so a stopped run's finished
samples are the all-n run's own: the answers compared are the same samples' answers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

from backend.engines.embedded.engine import EmbeddedEngine
from backend.vocabulary import Prompt, SamplingParams
from ui.answers import compile_answer_pattern, final_answer, tally
from ui.early_stop import BETA, SURE, decide

LETTER = r"\b([ABCD])\b"
"""A multiple-choice answer: the last lone letter A-D (group 1)."""

PROMPTS: tuple[tuple[str, str], ...] = (
    ("What is 7 + 5? Answer with a number.", ""),
    ("What is 9 + 8? Answer with a number.", ""),
    ("What is 12 + 7? Answer with a number.", ""),
    ("What is 15 - 6? Answer with a number.", ""),
    ("What is 3 x 4? Answer with a number.", ""),
    ("What is 6 x 7? Answer with a number.", ""),
    ("What is 20 - 13? Answer with a number.", ""),
    ("What is 100 + 25? Answer with a number.", ""),
    ("How many legs does a dog have? Answer with a number.", ""),
    ("How many days are in a week? Answer with a number.", ""),
    ("How many minutes are in an hour? Answer with a number.", ""),
    ("A farmer has 5 cows and buys 3 more. How many cows does he have? Answer with a number.", ""),
    ("Which is a fruit? A) carrot B) apple C) potato D) onion. Answer with the letter.", LETTER),
    ("Which animal can fly? A) dog B) cat C) bird D) fish. Answer with the letter.", LETTER),
    ("Which is the largest planet? A) Mars B) Earth C) Jupiter D) Venus. Answer with the letter.", LETTER),
    (
        "What colour is the sky on a clear day? A) green B) blue C) red D) black. Answer with the letter.",
        LETTER,
    ),
    ("Which is a colour? A) table B) run C) yellow D) seven. Answer with the letter.", LETTER),
    ("Which is the opposite of hot? A) cold B) warm C) big D) fast. Answer with the letter.", LETTER),
    ("Which number is even? A) 3 B) 7 C) 8 D) 11. Answer with the letter.", LETTER),
    ("Which season is the coldest? A) summer B) spring C) autumn D) winter. Answer with the letter.", LETTER),
    ("Which is a vegetable? A) banana B) carrot C) grape D) cherry. Answer with the letter.", LETTER),
    ("Which shape has three sides? A) square B) circle C) triangle D) line. Answer with the letter.", LETTER),
)
"""The bench's questions, each with its answer pattern ("" for the default rule: the last number)."""


@dataclass
class Outcome:
    """One way of running one prompt: tokens generated, wall time, the vote's answer."""

    tokens: int
    seconds: float
    answer: str | None
    stopped: int


async def run_one(
    engine: EmbeddedEngine, prompt: str, pattern_text: str, args: argparse.Namespace, rule: str
) -> Outcome:
    """Sample `prompt` n times; with `rule` (not "all"), stop the running samples once it decides."""
    pattern = compile_answer_pattern(pattern_text)
    params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, top_p=0.95, seed=args.seed)
    texts = [""] * args.n
    answers: list[str | None] = []
    running = set(range(args.n))
    tokens = 0
    stopped = 0
    decided: str | None = None
    started = time.perf_counter()
    generation = engine.generate(Prompt(prompt), args.n, params)
    async for chunk in generation:
        texts[chunk.index] += chunk.text
        tokens += chunk.tokens
        if chunk.finish_reason is None:
            continue
        running.discard(chunk.index)
        if chunk.finish_reason in ("stop", "length"):
            answers.append(final_answer(texts[chunk.index], pattern))
        if rule != "all" and decided is None:
            decision = decide(tally(answers), len(running), rule)
            if decision is not None:
                decided = decision.answer
                stopped = len(running)
                await generation.abort(None)
    seconds = time.perf_counter() - started
    return Outcome(tokens, seconds, decided or tally(answers).majority, stopped)


async def main(args: argparse.Namespace) -> None:
    engine = EmbeddedEngine(max_rows=max(16, args.n), context=1024)
    await asyncio.to_thread(engine.load)
    try:
        rows: dict[str, list[tuple[Outcome, Outcome]]] = {SURE: [], BETA: []}
        for prompt, pattern in PROMPTS[: args.prompts]:
            whole = await run_one(engine, prompt, pattern, args, "all")
            for rule in rows:
                rows[rule].append((await run_one(engine, prompt, pattern, args, rule), whole))
        print(
            f"{min(args.prompts, len(PROMPTS))} prompts, n = {args.n}, max_tokens {args.tokens}, "
            f"temperature {args.temperature}, seed {args.seed}; embedded engine ({engine.model})"
        )
        print("| rule | stopped early | tokens, of all n | wall time, of all n | same answer as all n |")
        print("|---|---:|---:|---:|---:|")
        for rule, pairs in rows.items():
            early = sum(o.stopped > 0 for o, _ in pairs)
            tokens = sum(o.tokens for o, _ in pairs) / sum(w.tokens for _, w in pairs)
            seconds = sum(o.seconds for o, _ in pairs) / sum(w.seconds for _, w in pairs)
            same = sum(o.answer == w.answer for o, w in pairs)
            share = f"{tokens:.0%} | {seconds:.0%}"
            print(f"| {rule} | {early} of {len(pairs)} | {share} | {same} of {len(pairs)} |")
        median = statistics.median(w.seconds for _, w in rows[SURE])
        print(f"all n: median {median:.2f} s a prompt")
    finally:
        await asyncio.to_thread(engine.shutdown)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.early_stop", description=__doc__)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48, help="max_tokens per sample")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first this many prompts")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))

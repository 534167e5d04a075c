"""Stopping a run once its vote is decided, without I/O: the rules and what stopping saved.

Self-consistency spends n whole samples even when the first few agree. As samples finish and their
final answers are read (`ui.answers.tally`), a rule says whether the samples still running can
change the majority; where it says no, the page cancels them through the engine's real abort, as
Cancel does. Two rules:

- `sure`: the leading answer can no longer lose, whatever the running samples answer: its votes
  exceed the runner-up's plus the samples still running. Stopping then never changes the majority
  that all n samples would have given.
- `beta`: Adaptive-Consistency's Beta stopping criterion (Aggarwal et al., "Let's Sample Step by
  Step: Adaptive-Consistency for Efficient Reasoning and Coding with LLMs", EMNLP 2023): the
  probability that the leading answer is the more likely of the top two, under a uniform prior on
  their share (a Beta(v1 + 1, v2 + 1) posterior), reaches BETA_THRESHOLD (95 %). It stops earlier
  than `sure` (4 unanimous answers suffice), and the all-n majority may differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ui.answers import Vote

SURE = "sure"
BETA = "beta"

RULES = {
    SURE: "the leading answer can no longer lose",
    BETA: "Adaptive-Consistency's Beta criterion at 95 %",
}
"""Each rule by its setting's value, in words for the answers panel."""

BETA_THRESHOLD = 0.95
"""The probability at which the `beta` rule stops."""


def beta_majority(leader: int, runner_up: int) -> float:
    """P(p > 1/2) for p ~ Beta(leader + 1, runner_up + 1): how likely the leading answer is the more
    likely of the top two, after `leader` and `runner_up` votes. For whole parameters the Beta's
    tail is a binomial sum: P(p > 1/2) = P(Binomial(a + b - 1, 1/2) <= a - 1), exact here."""
    a, b = leader + 1, runner_up + 1
    trials = a + b - 1
    return sum(math.comb(trials, k) for k in range(a)) / 2**trials


@dataclass(frozen=True)
class Decision:
    """A rule's verdict: the answer it settles on, by which rule, on what counts."""

    answer: str
    rule: str
    votes: int
    runner_up: int
    running: int
    """Samples still running when it decided: the ones the page stops."""
    confidence: float
    """The `beta` rule's probability (1.0 for `sure`, which is certain)."""

    def words(self) -> str:
        """The decision for the answers panel."""
        how = (
            f"{self.votes} votes against at most {self.runner_up + self.running}"
            if self.rule == SURE
            else f"{self.votes} votes to {self.runner_up}: {self.confidence:.1%} sure"
        )
        return f"decided on {self.answer!r} by {RULES[self.rule]} ({how})"


def decide(vote: Vote, running: int, rule: str) -> Decision | None:
    """The decision `rule` takes on `vote` with `running` samples still running, or None where the
    vote is not decided (no answer yet, a tie, or too close), or nothing is left to stop."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
    if running <= 0 or vote.majority is None or vote.tied:
        return None
    leader = vote.counts[0][1]
    runner_up = vote.counts[1][1] if len(vote.counts) > 1 else 0
    if rule == SURE:
        if leader > runner_up + running:
            return Decision(vote.majority, SURE, leader, runner_up, running=running, confidence=1.0)
        return None
    confidence = beta_majority(leader, runner_up)
    if confidence >= BETA_THRESHOLD:
        return Decision(vote.majority, BETA, leader, runner_up, running=running, confidence=confidence)
    return None


def saved_words(stopped_tokens: list[tuple[int, int]], max_tokens: int, tokens_per_s: float | None) -> str:
    """What stopping saved against letting every sample finish, for the run summary: the stopped
    samples' budget left (max_tokens less the tokens each had: at most what they would have cost)
    and, at the run's rate per sample (`tokens_per_s`), the seconds the longest of them would have
    gone on decoding (the samples decode side by side). `stopped_tokens`: (index, tokens) of each
    stopped sample."""
    left = [max(0, max_tokens - tokens) for _, tokens in stopped_tokens]
    count = len(stopped_tokens)
    seconds = f" and up to {max(left) / tokens_per_s:.1f} s" if tokens_per_s and left else ""
    return (
        f"Stopped when decided: {count} sample{'s' if count != 1 else ''} stopped early, saving up to "
        f"{sum(left)} tokens{seconds} against letting every sample finish (their max_tokens budget left)."
    )

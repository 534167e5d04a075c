"""Self-consistency voting over finished samples: each sample's final answer, the vote, and its display.

The answers panel shows each finished sample's final answer and a majority vote over them (sampling n
times and taking the most common final answer, "self-consistency"). This module is the plain logic
behind it: `final_answer` reads one sample's answer (by default a number, or by a user's regular
expression from `compile_answer_pattern`), `tally` counts the answers into a `Vote`, and `chart_rows`
and `summary_line` turn a vote into the bar chart's rows and the one line of words above it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import regex

MAX_PATTERN_CHARS = 200
"""The longest answer pattern `compile_answer_pattern` accepts."""

PATTERN_BUDGET_S = 0.2
"""Time a user's answer pattern may take over all the samples of one run (`PatternClock`). A
pattern runs in the page's process, which serves every visitor: one that backtracks without end
(`(\\w+\\s?)*!` on ordinary text) is stopped here, not left to take a core. User patterns run on the
`regex` package, whose matching takes a timeout; the page's own patterns below are linear."""

SUMMARY_ANSWER_CHARS = 40
"""Answers longer than this are cut short (with an ellipsis) in `summary_line`."""

_NUMBER = re.compile(
    r"""
    (?<![\w./])                             # not inside a word, a longer number or a fraction
    (?P<sign>[-+\u2212]?)                   # ASCII sign or the Unicode minus
    \$?
    (?:
        (?P<num>[0-9]+)/(?P<den>[0-9]+)     # a fraction, 3/4
      | (?P<int>[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+|[0-9]+)   # 1,234 or 1234
        (?:\.(?P<dec>[0-9]+))?              # a decimal part needs a digit after the point
      | \.(?P<lone>[0-9]+)                  # .5
    )
    %?
    """,
    re.VERBOSE,
)
"""A number as written in an answer; see `final_answer` for what it accepts."""

_TEX_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*([0-9]+)\s*\}\s*\{\s*([0-9]+)\s*\}")
_TEX_THOUSANDS = "{,}"
_BOXED = re.compile(r"\\boxed\s*\{")
_MARKER = re.compile(r"\banswer[*_]*\s*(?:is\b|[:=])|####", re.IGNORECASE)


class AnswerPatternError(ValueError):
    """An answer pattern that cannot be used; the message says why, quoting the pattern."""


class AnswerPatternTimeout(AnswerPatternError):
    """A pattern ran out of its time (`PatternClock`) on a sample."""


class PatternClock:
    """What is left of one run's PATTERN_BUDGET_S: each search gets the rest as its timeout."""

    def __init__(self, budget_s: float = PATTERN_BUDGET_S) -> None:
        self.budget_s = budget_s
        self.left = budget_s

    def search(self, pattern: regex.Pattern[str], text: str) -> list[regex.Match[str]]:
        """Every match of `pattern` in `text`; AnswerPatternTimeout where the budget runs out."""
        spent = AnswerPatternTimeout(f"the answer pattern took longer than {self.budget_s} s")
        if self.left <= 0:
            raise spent
        started = time.perf_counter()
        try:
            return list(pattern.finditer(text, timeout=self.left))
        except TimeoutError:
            self.left = 0.0
            raise spent from None
        finally:
            self.left = max(0.0, self.left - (time.perf_counter() - started))


def compile_answer_pattern(text: str) -> regex.Pattern[str] | None:
    """Compile the answer pattern typed by the user; None (the default rule) for empty text.

    Empty or whitespace-only text means "use the default rule" of `final_answer` and gives None.
    Otherwise the text is compiled as typed, without flags (inline flags such as `(?i)` work).
    When the pattern has a capture group, a sample's answer is what group 1 captured; without one,
    it is the whole match. A pattern over `MAX_PATTERN_CHARS` characters, or one that does not
    compile, raises `AnswerPatternError` with a message that quotes the pattern and the reason.
    """
    if not text.strip():
        return None
    if len(text) > MAX_PATTERN_CHARS:
        raise AnswerPatternError(
            f'the answer pattern "{text[:40]}..." is {len(text)} characters long; '
            f"the limit is {MAX_PATTERN_CHARS}"
        )
    try:
        return regex.compile(text, flags=regex.VERSION0)
    except (regex.error, OverflowError, RecursionError, MemoryError) as exc:
        raise AnswerPatternError(f'the answer pattern "{text}" does not compile: {exc}') from exc


def final_answer(
    text: str, pattern: regex.Pattern[str] | None = None, clock: PatternClock | None = None
) -> str | None:
    """A sample's final answer, or None when the text has none.

    A pattern runs on `clock`'s time (a fresh PATTERN_BUDGET_S where none is given), and raises
    AnswerPatternTimeout when that runs out.

    With a pattern: the last non-empty answer among the pattern's matches in the text, where a
    match's answer is its group 1 when the pattern has a capture group (a match whose group 1 did
    not take part counts as empty), else the whole match, stripped of surrounding whitespace. It is
    not normalised further.

    Without a pattern (the default rule), the answer is a number, read in this order:

    1. `\\boxed{...}`: if the text has one with non-empty content, the last such box is read: the
       last number in it, or its content as written when it holds no number (`\\boxed{B}` gives `B`).
    2. An answer marker: "answer is", "answer:" or "answer =" (any case, `**` or `_` allowed
       after "answer", as in `**Answer:**`) or `####`. The first number after the last marker is
       the answer; if no number follows that marker, rule 3 applies.
    3. Otherwise the last number in the text.

    A number is an optional sign (`-`, `+`, or the Unicode minus), an optional `$`, then digits
    with optional thousands commas (`1,234`, each group exactly three digits) and an optional
    decimal part (`3.5`, `.5`), then an optional `%`. A point not followed by a digit (`... is 42.`)
    is not a decimal point. A fraction of two whole numbers (`3/4`, `-1/2`) is one number. Digits
    right after a letter, digit, `_`, `.` or `/` do not start a number, so the 2 in `H2O` or `gpt2`
    is not one; letters may follow (`5km` gives `5`). Scientific notation (`1e6`) and numbers in
    words are not read as such.

    Numbers are normalised so that equal values vote together: `$`, `%`, `+` and thousands commas
    are dropped, as are leading zeros and trailing decimal zeros (`1,234.00` and `$1234` give
    `1234`, `42.0` gives `42`, `007` gives `7`, `.5` gives `0.5`), a zero has no sign (`-0` gives
    `0`), and the Unicode minus becomes `-`. Fractions are kept as written apart from the sign, so
    `3/4`, `6/8` and `0.75` are three different answers. Before reading, LaTeX `\\frac{3}{4}`
    (also `\\dfrac`, `\\tfrac`) becomes `3/4` and the LaTeX thousands separator `{,}` becomes `,`.
    """
    if pattern is not None:
        return _pattern_answer(text, pattern, clock or PatternClock())
    text = _TEX_FRACTION.sub(r"\1/\2", text.replace(_TEX_THOUSANDS, ","))
    boxed = _last_boxed(text)
    if boxed is not None:
        numbers = list(_NUMBER.finditer(boxed))
        return _normalise(numbers[-1]) if numbers else boxed
    markers = list(_MARKER.finditer(text))
    if markers:
        first = _NUMBER.search(text, markers[-1].end())
        if first is not None:
            return _normalise(first)
    numbers = list(_NUMBER.finditer(text))
    return _normalise(numbers[-1]) if numbers else None


def _pattern_answer(text: str, pattern: regex.Pattern[str], clock: PatternClock) -> str | None:
    """The last non-empty answer the pattern matches in the text (group 1 when it has groups)."""
    answer = None
    for match in clock.search(pattern, text):
        found = match.group(1) if pattern.groups else match.group(0)
        if found is not None and found.strip():
            answer = found.strip()
    return answer


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` with balanced braces and non-empty content."""
    for opening in reversed(list(_BOXED.finditer(text))):
        depth, i = 1, opening.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            content = text[opening.end() : i - 1].strip()
            if content:
                return content
    return None


def _normalise(match: re.Match[str]) -> str:
    """The number `_NUMBER` matched, in one written form per value (see `final_answer`)."""
    negative = match["sign"] in ("-", "\u2212")
    if match["num"] is not None:
        return f"{'-' if negative else ''}{match['num']}/{match['den']}"
    whole = (match["int"] or "").replace(",", "").lstrip("0") or "0"
    decimals = (match["dec"] or match["lone"] or "").rstrip("0")
    value = f"{whole}.{decimals}" if decimals else whole
    return f"-{value}" if negative and value != "0" else value


@dataclass(frozen=True, slots=True)
class Vote:
    """A majority vote over samples' final answers.

    `counts` holds each answer with its votes, most votes first, answers with equal votes in the
    order they were first seen. `voters` is the number of samples with an answer and `no_answer`
    the number without one. `majority` is the first answer in `counts` (None when no sample has an
    answer) and `share` its votes over `voters` (0.0 when there are none). `tied` is True when
    another answer has as many votes as `majority`: the vote has no single winner, and `majority`
    is only the tied answer that was seen first.
    """

    counts: tuple[tuple[str, int], ...]
    voters: int
    no_answer: int
    majority: str | None
    share: float
    tied: bool

    @property
    def leaders(self) -> tuple[str, ...]:
        """The answers with the top number of votes, in `counts` order (empty when none)."""
        if not self.counts:
            return ()
        top = self.counts[0][1]
        return tuple(answer for answer, votes in self.counts if votes == top)


def tally(answers: Sequence[str | None]) -> Vote:
    """Count the samples' final answers (None or "" for a sample without one) into a `Vote`."""
    votes: dict[str, int] = {}
    no_answer = 0
    for answer in answers:
        if answer is None or answer == "":
            no_answer += 1
        else:
            votes[answer] = votes.get(answer, 0) + 1
    # dicts keep first-seen order and sorted() is stable, so equal counts stay in that order
    counts = tuple(sorted(votes.items(), key=lambda item: -item[1]))
    voters = len(answers) - no_answer
    if not counts:
        return Vote(counts=(), voters=0, no_answer=no_answer, majority=None, share=0.0, tied=False)
    majority, top = counts[0]
    tied = len(counts) > 1 and counts[1][1] == top
    return Vote(
        counts=counts, voters=voters, no_answer=no_answer, majority=majority, share=top / voters, tied=tied
    )


MAJORITY = "majority"
"""`chart_rows`' mark for the one answer with the most votes."""

TIED = "tied for most"
"""`chart_rows`' mark for each answer sharing the most votes when no answer has more than the rest."""

FEWER = "fewer votes"
"""`chart_rows`' mark for every other bar (the "other" row included)."""


def chart_rows(vote: Vote, max_bars: int = 12) -> list[dict[str, object]]:
    """The vote as bar-chart rows, `{"answer": "42", "votes": 3, "vote": MAJORITY}`, in the vote's
    order: most votes first, equal votes in the order the answers were first reached.

    `vote` marks the bar: MAJORITY for the single answer with the most votes, TIED for each answer
    with the most votes when several share them, FEWER for the rest. At most `max_bars` rows: when
    the vote has more answers than that, the first `max_bars - 1` keep their own bar and the rest
    are summed into one last row named "other (k answers)" (marked FEWER, last whatever its sum).
    Samples without an answer have no row. `max_bars` must be at least 2.
    """
    if max_bars < 2:
        raise ValueError(f"max_bars must be at least 2, not {max_bars}")
    leaders = set(vote.leaders)
    lead = TIED if vote.tied else MAJORITY
    fits = len(vote.counts) <= max_bars
    shown = vote.counts if fits else vote.counts[: max_bars - 1]
    rows: list[dict[str, object]] = [
        {"answer": answer, "votes": votes, "vote": lead if answer in leaders else FEWER}
        for answer, votes in shown
    ]
    if not fits:
        rest = vote.counts[max_bars - 1 :]
        rows.append(
            {"answer": f"other ({len(rest)} answers)", "votes": sum(v for _, v in rest), "vote": FEWER}
        )
    return rows


def summary_line(vote: Vote, finished: int, n: int) -> str:
    """One line of plain words for the page: the vote, how many samples finished, how many lack an answer.

    For example `majority: 42 (3 of 5 answers, 60%) · 6 of 8 samples finished · 1 without an answer`,
    `tie between 42 and 41 (2 each) · 4 of 8 samples finished`, or `no answer yet · 0 of 8 samples
    finished` (`no answer · ...` once all n have finished). The percentage is rounded half up; an
    answer over `SUMMARY_ANSWER_CHARS` characters is cut short with an ellipsis.
    """
    progress = f"{finished} of {n} sample{'' if n == 1 else 's'} finished"
    if vote.majority is None:
        return f"{'no answer' if finished >= n else 'no answer yet'} · {progress}"
    if vote.tied:
        leaders = vote.leaders
        each = f"({vote.counts[0][1]} each)"
        if len(leaders) > 3:
            head = f"tie between {len(leaders)} answers {each}"
        else:
            names = [_short(answer) for answer in leaders]
            head = f"tie between {', '.join(names[:-1])} and {names[-1]} {each}"
    else:
        top = vote.counts[0][1]
        percent = int(vote.share * 100 + 0.5)
        plural = "" if vote.voters == 1 else "s"
        head = f"majority: {_short(vote.majority)} ({top} of {vote.voters} answer{plural}, {percent}%)"
    parts = [head, progress]
    if vote.no_answer:
        parts.append(f"{vote.no_answer} without an answer")
    return " · ".join(parts)


def cut_answer(answer: str, chars: int) -> str:
    """The answer, cut to `chars` characters with an ellipsis when longer."""
    return answer if len(answer) <= chars else answer[: chars - 1] + "…"


def _short(answer: str) -> str:
    return cut_answer(answer, SUMMARY_ANSWER_CHARS)

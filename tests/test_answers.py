"""Self-consistency voting: final answers read from sample texts, the tally, and what the panel shows."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import gradio as gr
import pytest
import regex

from tests.support.vote_chart import drawn_bars
from ui.answers import (
    FEWER,
    MAJORITY,
    MAX_PATTERN_CHARS,
    PATTERN_BUDGET_S,
    TIED,
    AnswerPatternError,
    AnswerPatternTimeout,
    PatternClock,
    Vote,
    chart_rows,
    compile_answer_pattern,
    final_answer,
    summary_line,
    tally,
)
from ui.answers_view import AnswersPanel, answers_chart, empty_outputs, free_text
from ui.view import RunView
from ui.vote_chart import EMPTY, VOTE_COLOURS, vote_chart_html

# "A shop takes $1,000 on Monday and $234 on Tuesday. How much does it take in total?"
SHOP_SAMPLES = [
    "Monday's $1,000 plus Tuesday's $234 makes $1,234.00 in total.",
    "1000 + 234 = 1234, so the answer is 1234.",
    "The shop takes \\$1{,}234 in total: $\\boxed{1234}$",
    "Adding 1,000 and 234 gives 1,244.",
    "I am not sure how to add these amounts.",
    "The answer is 1234 dollars (1000 from Monday and 234 from Tuesday).",
    "Monday: $1,000. Tuesday: $234. Total: $1,244.",
]

# "A farmer has 3 crates of 12 apples and 6 loose apples. How many apples are there?"
APPLE_SAMPLES = [
    "Three crates of 12 apples hold 36 apples, and with the 6 loose ones that makes 42.",
    "There are 3 crates with 12 apples each, which is 36 apples; with 5 loose apples, 41 apples.",
    "12 * 3 = 36 and 36 + 6 = 42, so the answer is 42.",
    "12 + 12 + 12 + 5 = 41 apples in total.",
    "36 + 6 = 42.0",
    "The farmer has a lot of apples.",
]


def test_each_shop_sample_has_the_answer_a_reader_would_pick() -> None:
    assert [final_answer(text) for text in SHOP_SAMPLES] == [
        "1234",
        "1234",
        "1234",
        "1244",
        None,
        "1234",  # the number after "The answer is", not the last number (234)
        "1244",
    ]


def test_the_shop_vote_names_the_majority_and_its_share() -> None:
    vote = tally([final_answer(text) for text in SHOP_SAMPLES])
    assert vote == Vote(
        counts=(("1234", 4), ("1244", 2)),
        voters=6,
        no_answer=1,
        majority="1234",
        share=4 / 6,
        tied=False,
    )
    assert summary_line(vote, finished=7, n=8) == (
        "majority: 1234 (4 of 6 answers, 67%) · 7 of 8 samples finished · 1 without an answer"
    )


def test_the_apple_vote_as_samples_finish() -> None:
    answers = [final_answer(text) for text in APPLE_SAMPLES]
    assert answers == ["42", "41", "42", "41", "42", None]

    first = tally(answers[:1])
    assert (first.majority, first.share, first.tied) == ("42", 1.0, False)
    assert (
        summary_line(first, finished=1, n=8) == "majority: 42 (1 of 1 answer, 100%) · 1 of 8 samples finished"
    )

    four = tally(answers[:4])
    assert four.counts == (("42", 2), ("41", 2))
    assert four.tied is True
    assert four.majority == "42"  # reached first; the page says "tie" instead of naming it
    assert four.leaders == ("42", "41")
    assert four.share == 0.5
    assert summary_line(four, finished=4, n=8) == "tie between 42 and 41 (2 each) · 4 of 8 samples finished"

    everything = tally(answers)
    assert everything.counts == (("42", 3), ("41", 2))
    assert (everything.voters, everything.no_answer) == (5, 1)
    assert everything.majority == "42"
    assert everything.share == 0.6
    assert everything.tied is False
    assert summary_line(everything, finished=6, n=8) == (
        "majority: 42 (3 of 5 answers, 60%) · 6 of 8 samples finished · 1 without an answer"
    )
    assert chart_rows(everything) == [
        {"answer": "42", "votes": 3, "vote": MAJORITY},
        {"answer": "41", "votes": 2, "vote": FEWER},
    ]


def test_ties_go_to_the_answer_reached_first() -> None:
    vote = tally(["41", "42", None, "42", "41"])
    assert vote.counts == (("41", 2), ("42", 2))
    assert vote.majority == "41"
    assert vote.tied is True
    assert vote.share == 0.5


def test_counts_are_ordered_by_votes_then_first_appearance() -> None:
    vote = tally(["7", "8", "9", "9", "8", "10", "9", "", None])
    assert vote.counts == (("9", 3), ("8", 2), ("7", 1), ("10", 1))
    assert (vote.voters, vote.no_answer) == (7, 2)
    assert vote.tied is False
    assert vote.leaders == ("9",)


def test_no_answers_make_an_empty_vote() -> None:
    empty = Vote(counts=(), voters=0, no_answer=0, majority=None, share=0.0, tied=False)
    assert tally([]) == empty
    assert tally([None, None]) == Vote(counts=(), voters=0, no_answer=2, majority=None, share=0.0, tied=False)
    assert empty.leaders == ()
    assert chart_rows(empty) == []


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("1,234", "1234"),
        ("1234", "1234"),
        ("$1,234.00", "1234"),
        ("1,234,567.50", "1234567.5"),
        ("42.0", "42"),
        ("42.50", "42.5"),
        ("so the answer is 42.", "42"),
        ("-0", "0"),
        ("-0.00", "0"),
        ("it is -3", "-3"),
        ("\u22127 degrees", "-7"),
        ("+5", "5"),
        ("-$5", "-5"),
        ("$-5", "-5"),
        ("50%", "50"),
        ("007", "7"),
        (".5", "0.5"),
        ("3/4 of the cake", "3/4"),
        ("6/8", "6/8"),
        ("-1/2", "-1/2"),
        ("\\frac{3}{4}", "3/4"),
        ("-\\dfrac{1}{2}", "-1/2"),
        ("1{,}234", "1234"),
        ("5km", "5"),
        ("10-20 people", "20"),
        ("(2,3)", "3"),
        ("gpt2 scored 7", "7"),
        ("H2O is water", None),
        ("version 3.10.2", "3.1"),
        ("123456789012345678901234567890.000", "123456789012345678901234567890"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_default_numbers_are_normalised(text: str, answer: str | None) -> None:
    assert final_answer(text) == answer


def test_equal_values_vote_together() -> None:
    answers = [final_answer(text) for text in ("It is 1,234.", "It is 1234.0", "It is $1234", "It is 1243.")]
    assert tally(answers).counts == (("1234", 3), ("1243", 1))


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The answer is \\boxed{42}. Check: 6 * 7 = 42, in 7 steps.", "42"),
        ("First \\boxed{41}, then on reflection \\boxed{42}.", "42"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\frac{3}{4}}", "3/4"),
        ("\\boxed{\\$1{,}234}", "1234"),
        ("The choice is \\boxed{B}, not 3.", "B"),
        ("\\boxed{ }  so 7", "7"),
        ("\\boxed{4 and then the text stops", "4"),
        ("The answer is 42 (6 groups of 7).", "42"),
        ("Answer: 17 (from 10 + 7)", "17"),
        ("**Answer:** 17 apples, 3 crates", "17"),
        ("The final answer = 9, since 3 * 3", "9"),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("The answer is 40. Later: 41. The ANSWER IS 42, from 6 * 7.", "42"),
        ("We add 3 and 4. I do not know what the answer is.", "4"),
        ("Three answers: 1, 2, 3", "3"),
    ],
)
def test_boxed_then_marker_then_last_number(text: str, answer: str) -> None:
    assert final_answer(text) == answer


def test_a_pattern_with_a_group_reads_group_one_of_the_last_match() -> None:
    pattern = compile_answer_pattern(r"Total: \$([\d,.]+)")
    assert pattern is not None
    assert final_answer("Monday: $1,000. Total: $1,000. Tuesday: $234. Total: $1,244 ", pattern) == "1,244"
    assert final_answer("Total: unknown", pattern) is None


def test_a_pattern_without_a_group_reads_the_whole_last_match() -> None:
    pattern = compile_answer_pattern(r"\d+ apples")
    assert pattern is not None
    assert final_answer(APPLE_SAMPLES[0], pattern) == "36 apples"
    assert final_answer(APPLE_SAMPLES[5], pattern) is None


def test_a_pattern_answer_is_stripped_and_empty_matches_do_not_count() -> None:
    choice = compile_answer_pattern(r"(?i)choice:(.*)")
    assert choice is not None
    assert final_answer("Choice:  B  \nChoice:   ", choice) == "B"
    digits = compile_answer_pattern(r"\d*")
    assert digits is not None
    assert final_answer("it is 42 and not 41!", digits) == "41"
    optional = compile_answer_pattern(r"=(\d+)|done")
    assert optional is not None
    assert final_answer("x=5, done", optional) == "5"


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_an_empty_pattern_means_the_default_rule(text: str) -> None:
    pattern = compile_answer_pattern(text)
    assert pattern is None
    assert final_answer(SHOP_SAMPLES[5], pattern) == "1234"


def test_a_pattern_that_does_not_compile_says_why() -> None:
    with pytest.raises(AnswerPatternError) as caught:
        compile_answer_pattern(r"(\d+")
    assert str(caught.value) == 'the answer pattern "(\\d+" does not compile: missing ) at position 4'
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value.__cause__, regex.error)


STORY = (
    "Once upon a time there was a little fox who lived at the edge of a quiet forest and every "
    "morning she walked down to the river to drink and to watch the light move over the water "
    "while the birds sang in the tall trees and the wind carried the smell of pine and rain over "
    "the hills and far away into the valley where the old miller kept his sleepy grey cat"
)
"""Ordinary English text of 300-odd characters, no "!" in it."""

POLYNOMIAL = [
    r"(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)\d",
    r"(.+)+(.+)+\1\2\d",
    r"(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(?:\d|\?)",
]
"""Patterns whose search of STORY takes the `regex` package from about a second to without end."""


@pytest.mark.parametrize("pattern", POLYNOMIAL)
def test_a_pattern_that_backtracks_without_end_is_stopped_within_its_budget(pattern: str) -> None:
    """Stopped once its budget is spent: the CPU time this thread gave it (wall time also counts the
    test's process waiting for a core behind other test processes)."""
    compiled = compile_answer_pattern(pattern)
    assert compiled is not None
    started = time.thread_time()
    with pytest.raises(AnswerPatternTimeout):
        final_answer("! " + STORY, compiled)
    assert time.thread_time() - started < PATTERN_BUDGET_S + 0.2


@pytest.mark.parametrize("pattern", [r"(\w+\s?)*!", r"(a|a)*b", r"((\w+)*)+$!", r"(x+x+)+y", r"(\w|\w\w)*!"])
def test_patterns_that_backtrack_exponentially_in_re_read_at_once(pattern: str) -> None:
    """The patterns that stall Python's `re` on ordinary text are answered at once by `regex`."""
    started = time.thread_time()
    assert final_answer("! " + STORY, compile_answer_pattern(pattern)) in (None, "!")
    assert time.thread_time() - started < PATTERN_BUDGET_S / 4


def test_one_runs_budget_is_shared_by_its_samples() -> None:
    """A pattern that takes a little on each sample runs out on a later one: the budget is the
    run's, so n samples cannot take n budgets."""
    slow = compile_answer_pattern(r"(\w+\s?)+\d")  # about 15 ms on STORY
    assert slow is not None
    clock = PatternClock()
    took = 0
    with pytest.raises(AnswerPatternTimeout):
        for _ in range(1000):
            final_answer("! " + STORY, slow, clock)
            took += 1
    # at least one sample read in full before a later one ran out (on a loaded machine the searches
    # take longer in wall time, so fewer fit in the budget, but never a budget each)
    assert clock.left == 0.0 and took >= 1
    with pytest.raises(AnswerPatternTimeout):  # and stays spent
        final_answer("42", compile_answer_pattern(r"\d+"), clock)


def test_patterns_with_look_behinds_and_backreferences_still_read_answers() -> None:
    assert final_answer("x=3, y=3, z=4", compile_answer_pattern(r"(?<=z=)\d")) == "4"
    assert final_answer("the cat cat sat", compile_answer_pattern(r"\b(\w+) \1\b")) == "cat"


def test_a_pattern_with_a_huge_repeat_is_refused_too() -> None:
    with pytest.raises(AnswerPatternError, match="does not compile: repeat count too big"):
        compile_answer_pattern("a{99999999999}")


def test_a_pattern_over_the_length_limit_is_refused() -> None:
    assert compile_answer_pattern("a" * MAX_PATTERN_CHARS) is not None
    with pytest.raises(AnswerPatternError) as caught:
        compile_answer_pattern("a" * (MAX_PATTERN_CHARS + 1))
    assert str(caught.value) == f'the answer pattern "{"a" * 40}..." is 201 characters long; the limit is 200'


def test_chart_rows_fold_the_tail_into_other() -> None:
    answers = ["1"] * 5 + ["2"] * 3 + [str(k) for k in range(3, 16)]  # 15 distinct answers
    rows = chart_rows(tally(answers))
    assert len(rows) == 12
    assert rows[:3] == [
        {"answer": "1", "votes": 5, "vote": MAJORITY},
        {"answer": "2", "votes": 3, "vote": FEWER},
        {"answer": "3", "votes": 1, "vote": FEWER},
    ]
    assert rows[10] == {"answer": "11", "votes": 1, "vote": FEWER}
    assert rows[11] == {"answer": "other (4 answers)", "votes": 4, "vote": FEWER}
    assert [row["votes"] for row in rows] == [5, 3] + [1] * 9 + [4]


def test_chart_rows_keep_every_answer_that_fits() -> None:
    vote = tally([str(k) for k in range(12)])
    assert [row["answer"] for row in chart_rows(vote)] == [str(k) for k in range(12)]
    assert chart_rows(vote, max_bars=3) == [
        {"answer": "0", "votes": 1, "vote": TIED},
        {"answer": "1", "votes": 1, "vote": TIED},
        {"answer": "other (10 answers)", "votes": 10, "vote": FEWER},
    ]
    with pytest.raises(ValueError, match="max_bars must be at least 2, not 1"):
        chart_rows(vote, max_bars=1)


def test_summary_before_any_answer() -> None:
    assert summary_line(tally([]), finished=0, n=8) == "no answer yet · 0 of 8 samples finished"
    assert summary_line(tally([None, None]), finished=2, n=8) == "no answer yet · 2 of 8 samples finished"
    assert summary_line(tally([None]), finished=1, n=1) == "no answer · 1 of 1 sample finished"


def test_summary_of_ties_between_many_answers() -> None:
    three = tally(["42", "41", "40"])
    assert (
        summary_line(three, finished=3, n=4) == "tie between 42, 41 and 40 (1 each) · 3 of 4 samples finished"
    )
    four = tally(["42", "41", "40", "39", None])
    assert summary_line(four, finished=5, n=5) == (
        "tie between 4 answers (1 each) · 5 of 5 samples finished · 1 without an answer"
    )


def test_summary_rounds_half_up_and_shortens_long_answers() -> None:
    vote = tally(["42"] * 5 + ["41"] * 3)
    assert (
        summary_line(vote, finished=8, n=8) == "majority: 42 (5 of 8 answers, 63%) · 8 of 8 samples finished"
    )
    long = "the farmer has forty-two apples in three crates and six loose"
    assert summary_line(tally([long]), finished=1, n=2) == (
        "majority: the farmer has forty-two apples in thre… (1 of 1 answer, 100%) · 1 of 2 samples finished"
    )


SHEEP_ANSWERS = ["2", "2", "2", "9", "9", "26", "12", "1"]
"""Eight samples' answers to the sheep question, as a person got them on the embedded engine."""


def sheep_run(finished: int = len(SHEEP_ANSWERS)) -> RunView:
    """A run of eight samples whose first `finished` said their SHEEP_ANSWERS and stopped."""
    view = RunView("r1", started_at=0.0)
    view.apply({"type": "accepted", "id": "r1", "n": len(SHEEP_ANSWERS)}, 0.0)
    for index, answer in enumerate(SHEEP_ANSWERS[:finished]):
        view.apply({"type": "chunk", "id": "r1", "index": index, "text": f"There are {answer} sheep."}, 1.0)
        view.apply({"type": "finish", "id": "r1", "index": index, "reason": "stop"}, 1.0)
    return view


def records(chart: str) -> list[dict[str, object]]:
    """Each bar's answer, votes and mark, left to right."""
    return [{key: bar[key] for key in ("answer", "votes", "vote")} for bar in drawn_bars(chart)]


def test_the_chart_gets_every_answer_most_votes_first_with_the_majority_marked() -> None:
    """2, 2, 2, 9, 9, 26, 12, 1: five bars, the three one-vote answers included, each with its count."""
    chart, line = AnswersPanel("").outputs(sheep_run())
    assert records(chart) == [
        {"answer": "2", "votes": 3, "vote": MAJORITY},
        {"answer": "9", "votes": 2, "vote": FEWER},
        {"answer": "26", "votes": 1, "vote": FEWER},
        {"answer": "12", "votes": 1, "vote": FEWER},
        {"answer": "1", "votes": 1, "vote": FEWER},
    ]
    assert line.startswith("majority: 2 (3 of 8 answers, 38%) · 8 of 8 samples finished")


def test_a_tie_marks_every_leader_and_the_chart_grows_as_samples_finish() -> None:
    panel = AnswersPanel("")
    view = sheep_run(finished=5)  # 2, 2, 2, 9, 9
    chart, _ = panel.outputs(view)
    assert records(chart) == [
        {"answer": "2", "votes": 3, "vote": MAJORITY},
        {"answer": "9", "votes": 2, "vote": FEWER},
    ]
    assert panel.outputs(view) == [gr.skip(), gr.skip()]  # nothing finished since: no redraw
    rows = chart_rows(tally(["9", "2", "2", "9", "1"]))
    assert [(r["answer"], r["votes"], r["vote"]) for r in rows] == [
        ("9", 2, TIED),
        ("2", 2, TIED),
        ("1", 1, FEWER),
    ]
    chart, _ = AnswersPanel(r"(\w+) sheep").outputs(sheep_run(finished=4))  # a pattern's answers too
    assert [(r["answer"], r["vote"]) for r in records(chart)] == [("2", MAJORITY), ("9", FEWER)]


def test_the_chart_counts_from_zero_and_colours_the_majority() -> None:
    """Every bar stands on one baseline and is as tall as its votes (an answer with the fewest
    votes still has a bar); the majority's colour differs from the rest, a tie's from both; the
    legend names only the marks drawn."""
    chart, _ = AnswersPanel("").outputs(sheep_run())
    bars = drawn_bars(chart)
    assert len({round(float(bar["bottom"]), 1) for bar in bars}) == 1
    one_vote = float(bars[-1]["bottom"]) - float(bars[-1]["top"])
    assert one_vote > 10
    for bar in bars:
        assert abs(float(bar["bottom"]) - float(bar["top"]) - int(bar["votes"]) * one_vote) < 0.2
    assert [bar["fill"] for bar in bars] == [VOTE_COLOURS[MAJORITY]] + [VOTE_COLOURS[FEWER]] * 4
    assert len(set(VOTE_COLOURS.values())) == 3  # majority, tie and the rest look different
    legend = ET.fromstring(chart).find("div")
    assert legend is not None and ["".join(span.itertext()) for span in legend] == [MAJORITY, FEWER]
    tie = vote_chart_html(chart_rows(tally(["9", "2"])))
    assert [bar["fill"] for bar in drawn_bars(tie)] == [VOTE_COLOURS[TIED]] * 2


def test_the_chart_is_empty_until_an_answer_and_keeps_odd_answers_whole() -> None:
    """No rows: the panel's words, no axes. Answers with markup characters, many votes and long
    text: the markup stays well-formed, each label reads the answer, the ticks are whole votes."""
    assert answers_chart().value == EMPTY == empty_outputs()[0] == vote_chart_html([])
    assert "<svg" not in EMPTY
    odd = ['<b>&"x"</b>'] * 40 + ["y" * 60] * 3
    chart = vote_chart_html(chart_rows(tally(odd)))
    read = [(bar["answer"], bar["votes"]) for bar in drawn_bars(chart)]
    assert read == [('<b>&"x"</b>', 40), ("y" * 60, 3)]
    svg = ET.fromstring(chart).find("svg")
    assert svg is not None
    ticks = [text.text for text in svg.iter("text") if text.get("class") == "vote-tick"]
    assert ticks == ["0", "10", "20", "30", "40"]
    titles = [title.text for title in svg.iter("title")]
    assert titles[1] == "y" * 60 + ": 3 votes (fewer votes)"  # cut under the bar, whole on hover
    assert "yyyyyyyyyyyyyyy…" in [text.text for text in svg.iter("text")]


def test_the_beta_criterion_is_the_binomial_tail_and_the_sure_rule_never_changes_the_majority() -> None:
    from ui.early_stop import BETA, SURE, beta_majority, decide

    assert beta_majority(0, 0) == 0.5 and beta_majority(3, 0) == 15 / 16 and beta_majority(4, 0) == 31 / 32
    assert beta_majority(6, 1) == 247 / 256  # (256 - 8 - 1) / 256
    # Beta at 95 %: 4 unanimous answers suffice, 3 do not; 5 to 1 does not, 6 to 1 does.
    assert decide(tally(["9"] * 3), 5, BETA) is None and decide(tally(["9"] * 4), 4, BETA) is not None
    assert decide(tally(["9"] * 5 + ["2"]), 2, BETA) is None and decide(tally(["9"] * 6 + ["2"]), 1, BETA)
    # Sure: the leader's votes exceed the runner-up's plus every sample still running.
    assert decide(tally(["9"] * 5 + ["2"]), 4, SURE) is None  # 2 + 4 = 6 could still beat 5
    decision = decide(tally(["9"] * 5 + ["2"]), 3, SURE)
    assert decision is not None and decision.answer == "9" and decision.running == 3
    assert (
        decision.words()
        == "decided on '9' by the leading answer can no longer lose (5 votes against at most 4)"
    )
    assert decide(tally(["9", "2"]), 0, SURE) is None  # nothing left to stop
    assert decide(tally(["9", "2"]), 1, BETA) is None  # a tie decides nothing
    assert decide(tally([None, None]), 3, BETA) is None  # no answer: nothing to decide on
    try:
        decide(tally(["9"]), 1, "nope")
    except ValueError as exc:
        assert "unknown rule" in str(exc)
    else:
        raise AssertionError("an unknown rule was taken")


def test_a_decided_vote_stops_the_running_samples_once_and_says_why() -> None:
    from ui.early_stop import SURE, saved_words

    view = RunView("r1", started_at=0.0)
    view.apply({"type": "accepted", "id": "r1", "n": 8, "params": {"max_tokens": 96}}, 0.0)
    for index in range(5):
        view.apply({"type": "chunk", "id": "r1", "index": index, "text": "There are 9 sheep."}, 1.0)
        view.apply({"type": "finish", "id": "r1", "index": index, "reason": "stop"}, 1.0)
    panel = AnswersPanel("", SURE)
    panel.outputs(view)
    assert panel.to_stop(view) == [5, 6, 7] and view.stopped_by_vote == {5, 6, 7}
    assert panel.to_stop(view) == []  # once a run
    for index in (5, 6, 7):
        view.apply({"type": "chunk", "id": "r1", "index": index, "text": "There"}, 2.0)
        view.apply({"type": "finish", "id": "r1", "index": index, "reason": "abort"}, 2.0)
    _, line = panel.outputs(view)
    assert "⏹ **Stopped when decided:** decided on '9' by the leading answer can no longer lose" in line
    assert "the 3 samples still running stopped in the engine" in line and "#5: (stopped by the vote" in line
    assert saved_words([(5, 1), (6, 1), (7, 6)], 96, 20.0) == (
        "Stopped when decided: 3 samples stopped early, saving up to 280 tokens and up to 4.8 s "
        "against letting every sample finish (their max_tokens budget left)."
    )
    # Free text gives no answer: the panel says the vote could not decide, and stops nothing.
    story = RunView("r2", started_at=0.0)
    story.apply({"type": "accepted", "id": "r2", "n": 2}, 0.0)
    for index in range(2):
        story.apply({"type": "chunk", "id": "r2", "index": index, "text": "Once upon a time."}, 1.0)
        story.apply({"type": "finish", "id": "r2", "index": index, "reason": "stop"}, 1.0)
    quiet = AnswersPanel("", SURE)
    _, said = quiet.outputs(story)
    assert quiet.to_stop(story) == [] and "these samples gave no final answers" in said


def story_run(texts: list[str]) -> RunView:
    """A run whose samples said `texts` and stopped."""
    view = RunView("r2", started_at=0.0)
    view.apply({"type": "accepted", "id": "r2", "n": len(texts)}, 0.0)
    for index, text in enumerate(texts):
        view.apply({"type": "chunk", "id": "r2", "index": index, "text": text}, 1.0)
        view.apply({"type": "finish", "id": "r2", "index": index, "reason": "stop"}, 1.0)
    return view


LIGHTHOUSE = [
    "The lighthouse keeper tossed three shells in the air and caught them all.",
    "In 2021 the old keeper finally kept five balls aloft beside the lamp.",
    "Every night the keeper practised juggling between the beams.",
    "He dropped the oranges twice, then laughed and tried again.",
]
"""Four stories, one of which mentions a year: free text, whatever number one of them holds."""


def test_free_text_gets_no_vote_and_no_chart_but_says_what_the_vote_counts() -> None:
    chart, line = AnswersPanel("").outputs(story_run(LIGHTHOUSE))
    assert chart == "" and "No answers" not in line
    assert "majority" not in line and "2021" not in line
    assert "Free text: 1 of 4 finished samples give a final answer, so there is no vote" in line
    assert "the last number" in line and "sheep question" in line
    assert 'class="free-text"' in line
    _, patterned = AnswersPanel(r"keeper (\w+)").outputs(story_run(LIGHTHOUSE[2:] + ["no"] * 3))
    assert "Free text: 1 of 5" in patterned and "what the answer pattern matches" in patterned


def test_half_the_samples_with_an_answer_still_vote() -> None:
    chart, line = AnswersPanel("").outputs(story_run(["9 sheep", "8 sheep", "none", "no idea"]))
    assert "<svg" in chart and line.startswith("tie between")
    assert free_text(tally(["9", None, None])) and not free_text(tally(["9", None]))
    assert not free_text(tally([]))

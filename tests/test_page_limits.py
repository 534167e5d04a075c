"""The page's own checks, without a page: inputs that cannot be sent, and what one visitor may hold."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ui.run_request import InputProblem, RunRequest, run_request
from ui.visitor_limits import VisitorLedger, VisitorLimitReached, VisitorLimits, visitor_address

GOOD: dict[str, Any] = {
    "prompt": "Tell a story.",
    "n": 4,
    "max_tokens": 64,
    "temperature": 0.8,
    "top_p": 0.95,
    "seed": 5,
    "consumer": "cooperative",
    "block_ms": 20,
    "fanout": "n",
    "format": "chat",
    "system": "",
    "output_kind": "delta",
    "cancel_after": 0,
    "logprobs": False,
    "answer_pattern": "",
}


def request(**changes: Any) -> RunRequest:
    return run_request({**GOOD, **changes})


def test_good_inputs_make_the_request_the_backend_expects() -> None:
    wanted = request(system="Be brief.", logprobs=True, cancel_after=7)
    assert (wanted.prompt, wanted.n) == ("Tell a story.", 4)
    assert wanted.params == {"max_tokens": 64, "temperature": 0.8, "top_p": 0.95, "seed": 5}
    assert wanted.options == {
        "consumer": {"mode": "cooperative", "block_ms": 20.0},
        "fanout": "n",
        "format": "chat",
        "system": "Be brief.",
        "cancel_after": 7,
        "logprobs": True,
        "alternatives": 5,
    }
    assert not wanted.blocking and wanted.tokens == 256
    assert request(seed=None).params["seed"] is None
    assert request(consumer="blocking").blocking
    assert not request(consumer="blocking", block_ms=0).blocking
    raw = request(format="raw", system="ignored", output_kind="cumulative")
    assert "system" not in raw.options and raw.options["output_kind"] == "cumulative"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("n", None, "n must be a number"),
        ("n", "4", "n must be a number"),
        ("n", True, "n must be a number"),
        ("n", math.nan, "n must be a finite number"),
        ("n", 2.5, "n must be a whole number"),
        ("max_tokens", math.inf, "max tokens must be a finite number"),
        ("temperature", [1], "temperature must be a number"),
        ("top_p", -math.inf, "top-p must be a finite number"),
        ("seed", 1.5, "seed must be a whole number"),
        ("block_ms", "fast", "block per chunk must be a number"),
        ("cancel_after", math.nan, "cancel after k tokens must be a finite number"),
        ("prompt", "a\ud800b", "lone UTF-16 surrogates"),
        ("system", "\udfff", "system prompt holds characters that are not text"),
        ("answer_pattern", "(\ud83d)", "answer pattern holds characters"),
        ("prompt", 12, "prompt must be text"),
        ("consumer", "sleepy", "consumer must be one of cooperative, greedy, blocking"),
        ("fanout", "all", "fan-out must be one of"),
        ("format", "markdown", "format must be one of"),
        ("output_kind", "x" * 500, "engine outputs must be one of"),
        ("logprobs", "yes", "token confidence must be true or false"),
    ],
)
def test_each_input_that_cannot_be_sent_is_named(field: str, value: Any, words: str) -> None:
    with pytest.raises(InputProblem) as caught:
        request(**{field: value})
    assert words in str(caught.value)
    assert len(str(caught.value)) < 200  # a huge value is not echoed back whole


def test_text_a_person_may_type_goes_as_typed() -> None:
    for text in ("", "مرحبا بالعالم", "🦜" * 4000, "tab\tbell\x07nul\x00", "x" * 16_001):
        assert request(prompt=text).prompt == text


def test_a_visitor_is_held_to_runs_tokens_and_one_blocking_experiment() -> None:
    ledger = VisitorLedger(
        VisitorLimits(runs=2, tokens=1000, blocking_runs=1, blocking_at_once=1, blocking_budget_s=60)
    )
    first = ledger.admit("a", request(n=2, max_tokens=100))
    second = ledger.admit("a", request(n=4, max_tokens=100))
    with pytest.raises(VisitorLimitReached, match="you already have 2 runs streaming in this browser"):
        ledger.admit("a", request(n=1, max_tokens=1))
    ledger.admit("b", request(n=8, max_tokens=100))  # another visitor is counted apart
    ledger.release(second)
    ledger.release(second)  # twice is once
    with pytest.raises(VisitorLimitReached, match=r"up to 1,000 tokens .* hold 200; the page allows 1,000"):
        ledger.admit("a", request(n=10, max_tokens=100))
    blocking = ledger.admit("a", request(consumer="blocking", block_ms=200, n=1, max_tokens=10))
    ledger.release(first)
    with pytest.raises(VisitorLimitReached, match="already have a blocking-consumer experiment"):
        ledger.admit("a", request(consumer="blocking", n=1, max_tokens=10))
    with pytest.raises(VisitorLimitReached, match="another visitor's blocking-consumer experiment"):
        ledger.admit("b", request(consumer="blocking", n=1, max_tokens=10))
    ledger.admit("b", request(consumer="greedy", n=1, max_tokens=10))
    ledger.release(blocking)
    with pytest.raises(
        VisitorLimitReached, match=r"could hold the experiment loop for 64 s; the page allows 60 s"
    ):
        ledger.admit("a", request(consumer="blocking", block_ms=200, n=4, max_tokens=80))
    assert "a" not in ledger.runs  # every run of a ended: nothing kept for it


def test_an_address_is_held_to_a_class_share_and_the_message_names_only_the_sessions_own_runs() -> None:
    """Sessions of one address each get their runs up to the address's share; past it, the message
    counts the address's runs and says which are the session's own; another address is apart."""
    ledger = VisitorLedger(VisitorLimits(runs=3, address_runs=4, address_tokens=9_000))
    tickets = [ledger.admit(f"student-{i}", request(n=4, max_tokens=100), "203.0.113.9") for i in range(3)]
    mine = ledger.admit("student-0", request(n=4, max_tokens=100), "203.0.113.9")
    with pytest.raises(VisitorLimitReached) as caught:
        ledger.admit("student-5", request(n=1, max_tokens=10), "203.0.113.9")
    said = str(caught.value)
    assert "4 runs are streaming from your network's address (none is this session's)" in said
    assert "you already have" not in said
    with pytest.raises(VisitorLimitReached, match=r"\(2 of them are this session's\)"):
        ledger.admit("student-0", request(n=1, max_tokens=10), "203.0.113.9")
    ledger.admit("student-5", request(n=1, max_tokens=10), "198.51.100.7")  # another address
    ledger.release(mine)
    with pytest.raises(VisitorLimitReached, match=r"up to 8,000 tokens .* hold 1,200 of the 9,000"):
        ledger.admit("student-5", request(n=8, max_tokens=1000), "203.0.113.9")
    ledger.admit("student-5", request(n=4, max_tokens=100), "203.0.113.9")
    for ticket in tickets:
        ledger.release(ticket)
    assert ledger.address_runs == {"203.0.113.9": 1, "198.51.100.7": 1}


def test_a_visitor_is_the_address_the_spaces_proxy_saw() -> None:
    assert visitor_address("127.0.0.1", None, behind_proxy=False) == "127.0.0.1"
    assert visitor_address("127.0.0.1", "203.0.113.9", behind_proxy=False) == "127.0.0.1"  # not believed
    assert visitor_address("10.16.3.80", "203.0.113.9", behind_proxy=True) == "203.0.113.9"
    # what the client put in front of the proxy's own entry is not believed
    assert visitor_address("10.16.3.80", "1.2.3.4, 203.0.113.9", behind_proxy=True) == "203.0.113.9"
    assert visitor_address("10.16.3.80", " , ", behind_proxy=True) == "10.16.3.80"
    assert visitor_address(None, None, behind_proxy=True) == "unknown"

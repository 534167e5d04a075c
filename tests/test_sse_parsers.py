"""The stream parsers against every stream recorded from the real SGLang and vLLM servers."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from backend.engines.http.streams import (
    DONE,
    OpenAIStream,
    SGLangStream,
    SSEDecoder,
    StreamProtocolError,
    sglang_finish_reason,
)
from backend.vocabulary import Chunk

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Real streams recorded from SGLang and vLLM servers (tests/fixtures/README.md says how)."""
STREAMS = sorted(FIXTURES.glob("*.sse"))


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def payloads(data: bytes, piece: int | None = None) -> list[str]:
    """Decode `data` fed whole, or in pieces of `piece` bytes (splitting lines and UTF-8 anywhere)."""
    decoder = SSEDecoder()
    if piece is None:
        return decoder.feed(data) + decoder.close()
    out: list[str] = []
    for start in range(0, len(data), piece):
        out += decoder.feed(data[start : start + piece])
    return out + decoder.close()


def raw_events(data: bytes) -> list[str]:
    """The payloads read the plain way, to check the decoder against."""
    return [line[len("data: ") :] for line in data.decode().split("\n") if line.startswith("data: ")]


def run_sglang(data: bytes, n: int) -> tuple[SGLangStream, list[Chunk]]:
    stream = SGLangStream(n)
    chunks = [chunk for payload in payloads(data) for chunk in stream.feed(payload)]
    return stream, chunks


def run_openai(
    data: bytes, n: int, hold: bool = False, chat: bool = False
) -> tuple[OpenAIStream, list[Chunk]]:
    stream = OpenAIStream(n, hold_last_finish=hold, chat=chat)
    chunks = [chunk for payload in payloads(data) for chunk in stream.feed(payload)]
    return stream, chunks + stream.close()


def texts(chunks: list[Chunk], n: int) -> list[str]:
    return ["".join(c.text for c in chunks if c.index == i) for i in range(n)]


def finishes(chunks: list[Chunk]) -> dict[int, Chunk]:
    found: dict[int, Chunk] = {}
    for chunk in chunks:
        if chunk.finish_reason is not None:
            assert chunk.index not in found, f"sample {chunk.index} finished twice"
            found[chunk.index] = chunk
    return found


def last_cumulative(data: bytes) -> dict[int, dict]:
    """Each index's last native event, read without the parser."""
    last: dict[int, dict] = {}
    for payload in raw_events(data):
        if payload != DONE:
            event = json.loads(payload)
            if "index" in event:
                last[event["index"]] = event
    return last


def test_the_fixtures_are_there() -> None:
    assert len(STREAMS) == 11, f"expected the eleven recorded streams in {FIXTURES}"


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name)
@pytest.mark.parametrize("piece", [None, 1, 7, 4096])
def test_sse_decoder_reads_every_event_however_the_bytes_are_split(path: Path, piece: int | None) -> None:
    data = path.read_bytes()
    assert payloads(data, piece) == raw_events(data)
    assert payloads(data, piece)[-1] == DONE


def test_sse_decoder_handles_crlf_multiline_data_and_comments() -> None:
    data = b': keep-alive\r\n\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: x\ndata: two\n\n'
    for piece in (None, 1, 2, 3):
        assert payloads(data, piece) == ['{"a":\n1}', "two"]


def test_sse_decoder_keeps_multibyte_characters_split_across_reads() -> None:
    data = 'data: {"text": "héllo ✓"}\n\n'.encode()
    assert payloads(data, 1) == ['{"text": "héllo ✓"}']


def test_sglang_cumulative_text_becomes_deltas_routed_by_index() -> None:
    data = fixture("sglang-generate-n4-cumulative.sse")
    stream, chunks = run_sglang(data, 4)
    last = last_cumulative(data)
    assert texts(chunks, 4) == [last[i]["text"] for i in range(4)]
    assert stream.done and stream.unfinished == []
    # Cumulative text is never re-sent: every delta is new text (or a token with no visible text).
    assert sum(len(c.text) for c in chunks) == sum(len(last[i]["text"]) for i in range(4))
    for i in range(4):
        assert sum(c.tokens for c in chunks if c.index == i) == 32
        assert stream.request_id(i) == last[i]["meta_info"]["id"]
    assert len({stream.request_id(i) for i in range(4)}) == 4


def test_sglang_finish_objects_and_meta_pass_through() -> None:
    data = fixture("sglang-generate-n4-cumulative.sse")
    _, chunks = run_sglang(data, 4)
    done = finishes(chunks)
    assert sorted(done) == [0, 1, 2, 3]
    last = last_cumulative(data)
    for index, chunk in done.items():
        assert chunk.finish_reason == "length"
        info = last[index]["meta_info"]
        assert chunk.meta["rid"] == info["id"]
        assert chunk.meta["prompt_tokens"] == 4
        assert chunk.meta["completion_tokens"] == 32
        assert chunk.meta["cached_tokens"] == info["cached_tokens"]
        assert chunk.meta["e2e_latency"] == pytest.approx(info["e2e_latency"])
    # Nothing follows a sample's finish.
    for index, chunk in done.items():
        assert chunks.index(chunk) == max(j for j, c in enumerate(chunks) if c.index == index)


def test_sglang_abort_of_one_sample_then_of_all() -> None:
    data = fixture("sglang-generate-n3-abort-request.sse")
    stream, chunks = run_sglang(data, 3)
    done = finishes(chunks)
    assert {i: c.finish_reason for i, c in done.items()} == {0: "abort", 1: "abort", 2: "abort"}
    assert done[1].meta["message"] == "Aborted"
    # Sample 1 was aborted by its own id after 8 tokens; the others went on until abort_all.
    order = [c.index for c in chunks if c.finish_reason is not None]
    assert order[0] == 1
    tokens = {i: sum(c.tokens for c in chunks if c.index == i) for i in range(3)}
    assert tokens[1] < tokens[0] and tokens[1] < tokens[2]
    last = last_cumulative(data)
    assert texts(chunks, 3) == [last[i]["text"] for i in range(3)]
    assert stream.done


def test_sglang_error_event_finishes_every_sample_with_the_servers_message() -> None:
    stream, chunks = run_sglang(fixture("sglang-generate-error-context-length.sse"), 2)
    assert [(c.index, c.finish_reason) for c in chunks] == [(0, "error"), (1, "error")]
    for chunk in chunks:
        assert "maximum context length of 2048 tokens" in chunk.meta["error"]
        assert "(code 400)" in chunk.meta["error"]
    assert stream.done and stream.unfinished == []


def test_sglang_incremental_stream_gives_the_same_text() -> None:
    """An `--incremental-streaming-output` server sends only new text; rebuild such a stream."""
    data = fixture("sglang-generate-n4-cumulative.sse")
    seen = {i: ("", 0) for i in range(4)}
    incremental = SGLangStream(4, incremental=True)
    chunks: list[Chunk] = []
    for payload in payloads(data):
        if payload != DONE:
            event = json.loads(payload)
            text, ids = seen[event["index"]]
            seen[event["index"]] = (event["text"], len(event["output_ids"]))
            event["text"] = event["text"][len(text) :]
            event["output_ids"] = event["output_ids"][ids:]
            payload = json.dumps(event)
        chunks += incremental.feed(payload)
    last = last_cumulative(data)
    assert texts(chunks, 4) == [last[i]["text"] for i in range(4)]
    assert all(sum(c.tokens for c in chunks if c.index == i) == 32 for i in range(4))


def test_sglang_index_outside_the_request_is_a_protocol_error() -> None:
    stream = SGLangStream(2)
    with pytest.raises(StreamProtocolError):
        stream.feed('{"text": "x", "index": 2, "meta_info": {"id": "a"}}')
    with pytest.raises(StreamProtocolError):
        stream.feed("not json")


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        (None, None),
        ({"type": "stop", "matched": 2}, "stop"),
        ({"type": "length", "length": 32}, "length"),
        ({"type": "abort", "message": "Aborted", "status_code": None}, "abort"),
        ({"type": "abort", "message": "out of memory", "status_code": 500}, "error"),
        ({"type": "something new"}, "error"),
    ],
)
def test_sglang_finish_reason_mapping(finish: object, reason: str | None) -> None:
    assert sglang_finish_reason(finish) == reason


@pytest.mark.parametrize("name", ["sglang-v1-completions-n4.sse", "vllm-v1-completions-n4.sse"])
def test_openai_deltas_routed_by_choice_index_not_id(name: str) -> None:
    data = fixture(name)
    stream, chunks = run_openai(data, 4)
    expected = ["", "", "", ""]
    ids = set()
    for payload in raw_events(data):
        if payload != DONE:
            event = json.loads(payload)
            ids.add(event["id"])
            for choice in event["choices"]:
                expected[choice["index"]] += choice["text"]
    assert texts(chunks, 4) == expected
    assert len(ids) == (1 if name.startswith("vllm") else 4)
    done = finishes(chunks)
    assert {i: c.finish_reason for i, c in done.items()} == dict.fromkeys(range(4), "length")
    assert all(sum(c.tokens for c in chunks if c.index == i) == 32 for i in range(4))
    assert stream.model == "smollm2" and stream.done


@pytest.mark.parametrize("name", ["sglang-v1-chat-completions-n4.sse", "vllm-v1-chat-completions-n4.sse"])
def test_openai_chat_deltas_skip_the_role_announcement(name: str) -> None:
    """`/v1/chat/completions`: text in `delta.content`; each choice's first event only says
    `role: assistant` (no token), and the usage rides on the last finish."""
    data = fixture(name)
    _, chunks = run_openai(data, 4, hold=True, chat=True)
    expected, reasons, announcements, usage = ["", "", "", ""], {}, 0, {}
    for payload in raw_events(data):
        if payload != DONE:
            event = json.loads(payload)
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                expected[choice["index"]] += choice["delta"].get("content") or ""
                announcements += "role" in choice["delta"]
                if choice["finish_reason"]:
                    reasons[choice["index"]] = choice["finish_reason"]
    assert announcements == 4
    assert texts(chunks, 4) == expected and all(len(t.split()) > 3 for t in expected)
    done = finishes(chunks)
    assert {i: c.finish_reason for i, c in done.items()} == reasons
    assert sum(c.tokens for c in chunks) == usage["completion_tokens"]
    assert chunks[-1].meta["usage"] == usage


def test_openai_usage_chunk_rides_on_the_last_finish() -> None:
    _, chunks = run_openai(fixture("sglang-v1-completions-n1-usage.sse"), 1, hold=True)
    done = finishes(chunks)
    assert done[0].finish_reason == "length"
    assert chunks[-1] is done[0]
    assert done[0].meta["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 260,
        "completion_tokens": 256,
        "reasoning_tokens": 0,
    }
    assert sum(c.tokens for c in chunks) == 256


def test_openai_error_event_finishes_open_samples() -> None:
    stream = OpenAIStream(2)
    first = stream.feed('{"id": "x", "choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}')
    assert [c.finish_reason for c in first] == ["stop"]
    failed = stream.feed('{"error": {"object": "error", "message": "engine dead", "code": 500}}')
    assert [(c.index, c.finish_reason, c.meta["error"]) for c in failed] == [
        (1, "error", "engine dead (code 500)")
    ]


def logprobs_of(chunks: list[Chunk], n: int) -> list[list[float]]:
    return [[lp for c in chunks if c.index == i for lp in (c.logprobs or ())] for i in range(n)]


def test_sglang_logprobs_come_with_each_token_incremental_and_cumulative() -> None:
    data = fixture("sglang-generate-n2-logprobs-incremental.sse")
    stream = SGLangStream(2, incremental=True, logprobs=True)
    chunks = [chunk for payload in payloads(data) for chunk in stream.feed(payload)]
    expected: list[list[float]] = [[], []]
    for payload in raw_events(data):
        if payload != DONE:
            event = json.loads(payload)
            expected[event["index"]] += [entry[0] for entry in event["meta_info"]["output_token_logprobs"]]
    assert logprobs_of(chunks, 2) == expected
    assert all(len(c.logprobs or ()) == c.tokens for c in chunks)  # one per token, with its own chunk
    assert expected[0][0] == pytest.approx(-0.0914, abs=1e-4)  # " Paris", as the server said
    # The same events as a cumulative server sends them (each with every logprob so far) give the same.
    cumulative = SGLangStream(2, incremental=False, logprobs=True)
    seen: dict[int, list[Any]] = {0: [], 1: []}
    again: list[Chunk] = []
    for payload in raw_events(data):
        if payload == DONE:
            continue
        event = json.loads(payload)
        index = event["index"]
        seen[index] = seen[index] + event["meta_info"]["output_token_logprobs"]
        event["meta_info"]["output_token_logprobs"] = seen[index]
        again += cumulative.feed(json.dumps(event))
    assert logprobs_of(again, 2) == expected


def test_sglang_without_logprobs_asked_gives_none() -> None:
    _, chunks = run_sglang(fixture("sglang-generate-n2-logprobs-incremental.sse"), 2)
    assert all(c.logprobs is None for c in chunks)


@pytest.mark.parametrize(
    ("name", "chat"),
    [("vllm-v1-chat-completions-n2-logprobs.sse", True), ("vllm-v1-completions-n2-logprobs.sse", False)],
)
def test_openai_logprobs_come_with_each_token(name: str, chat: bool) -> None:
    data = fixture(name)
    stream = OpenAIStream(2, hold_last_finish=True, chat=chat, logprobs=True)
    chunks = [chunk for payload in payloads(data) for chunk in stream.feed(payload)] + stream.close()
    expected: list[list[float]] = [[], []]
    for payload in raw_events(data):
        if payload == DONE:
            continue
        for choice in json.loads(payload).get("choices") or []:
            found = choice.get("logprobs") or {}
            values = (
                [e["logprob"] for e in found.get("content") or []]
                if chat
                else found.get("token_logprobs") or []
            )
            expected[choice["index"]] += values
    assert logprobs_of(chunks, 2) == expected and all(len(values) == 8 for values in expected)
    assert all(len(c.logprobs or ()) == c.tokens for c in chunks if c.tokens)


def test_a_chat_token_with_empty_text_counts_when_its_logprob_comes() -> None:
    # vLLM at max_tokens can end a chat choice with a token whose text is empty: its logprob says
    # that it is one token (without logprobs the event reads as the closing event of no token).
    stream = OpenAIStream(1, chat=True, logprobs=True)
    event = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}
    event["choices"][0]["logprobs"] = {"content": [{"token": "", "logprob": -0.5, "bytes": []}]}
    (chunk,) = stream.feed(json.dumps(event))
    assert (chunk.tokens, chunk.logprobs, chunk.finish_reason) == (1, (-0.5,), "length")
    plain = OpenAIStream(1, chat=True)
    (closing,) = plain.feed(
        json.dumps({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]})
    )
    assert closing.tokens == 0


def test_a_cumulative_server_that_rewrites_its_text_is_said_and_the_deltas_still_add_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = SGLangStream(1)
    shown = ""
    with caplog.at_level(logging.WARNING, "backend"):
        for text, tokens in (("Hello", 1), ("Hello wor", 2), ("Jello world", 3)):
            event = {"index": 0, "text": text, "meta_info": {"completion_tokens": tokens}}
            for chunk in stream.feed_event(event):
                shown += chunk.text
    assert shown == "Hello world"  # what was shown stays; only what is new past it is added
    assert "changed its prefix" in caplog.text


def test_a_continuation_asks_each_server_to_continue_the_assistants_turn() -> None:
    """Chat: the OpenAI-compatible request ends with the assistant's turn begun with the prefix,
    continued (`continue_final_message`), not closed; raw: the prefix is more prompt text."""
    from backend.engines.http.openai import completions_request
    from backend.vocabulary import Prompt, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.95, seed=1)
    path, body = completions_request("m", Prompt("Tell a story.", prefix="Once upon"), 2, params)
    assert path == "/v1/chat/completions"
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    path, body = completions_request("m", Prompt("Tell a story."), 2, params)
    assert "continue_final_message" not in body and body["messages"][-1]["role"] == "user"
    path, body = completions_request("m", Prompt("Once upon", "raw", prefix=" a time"), 2, params)
    assert path == "/v1/completions" and body["prompt"] == "Once upon a time"


def _view_of(engine: str, n: int, chunks: list[Chunk]) -> Any:
    """The page's view of a request whose finish frames carry these chunks' figures (as
    backend.serving.request builds them: `engine` is the finishing chunk's meta)."""
    from ui.view import RunView

    view = RunView("r1", 0.0)
    view.apply({"type": "accepted", "id": "r1", "n": n, "engine": engine, "model": "m"}, 0.0)
    for index, chunk in finishes(chunks).items():
        frame = {"type": "finish", "id": "r1", "index": index, "reason": chunk.finish_reason, "stats": {}}
        view.apply({**frame, **({"engine": dict(chunk.meta)} if chunk.meta else {})}, 0.0)
    return view


def test_the_prefix_cache_line_says_what_each_recorded_engine_reported() -> None:
    """SGLang's cached_tokens per sample, vLLM's usage without a cached count (said, not 0), a usage
    with one, and an engine that reports nothing."""
    from ui.view import prefix_cache_line

    _, chunks = run_sglang(fixture("sglang-generate-n4-cumulative.sse"), 4)
    line = prefix_cache_line(_view_of("sglang", 4, chunks))
    assert line == "**Prefix cache:** prompt 4 tokens: 3 reused from the engine's cache, 1 computed."
    _, chunks = run_sglang(fixture("sglang-generate-n3-abort-request.sse"), 3)
    assert "prompt 8 tokens: 7 reused from the engine's cache, 1 computed" in prefix_cache_line(
        _view_of("sglang", 3, chunks)
    )
    _, chunks = run_openai(fixture("vllm-v1-chat-completions-n4.sse"), 4, hold=True, chat=True)
    line = prefix_cache_line(_view_of("openai", 4, chunks))
    assert "prompt 39 tokens; the engine did not report cached tokens" in line and " 0 " not in line
    with_details = [
        Chunk(
            0, "", 0, "stop", {"usage": {"prompt_tokens": 39, "prompt_tokens_details": {"cached_tokens": 32}}}
        )
    ]
    assert "prompt 39 tokens: 32 reused from the engine's cache, 7 computed" in prefix_cache_line(
        _view_of("openai", 1, with_details)
    )
    nothing = [Chunk(i, "", 0, "stop") for i in range(2)]
    assert prefix_cache_line(_view_of("synthetic", 2, nothing)) == (
        "**Prefix cache:** not reported by the synthetic engine."
    )
    differ = [
        Chunk(i, "", 0, "stop", {"prompt_tokens": 40, "cached_tokens": c}) for i, c in enumerate([0, 39])
    ]
    assert prefix_cache_line(_view_of("sglang", 2, differ)) == (
        "**Prefix cache:** prompt 40 tokens: reused from the engine's cache per sample: #0 0, #1 39."
    )

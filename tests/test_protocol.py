"""Protocol v2 without a socket: client frames built, parsed and validated; server frames built."""

from __future__ import annotations

import json
import math

import pytest

from backend.config.settings import DEFAULT_MAX_TOKENS, Limits
from backend.engines.base import choose_format
from backend.frames import (
    batch_messages,
    cancel_frame,
    chunk_frame,
    encode,
    encode_bytes,
    export_trace_frame,
    frames_in,
    generate_frame,
)
from backend.protocol import (
    CancelCommand,
    Consumer,
    ExportTraceCommand,
    GenerateCommand,
    ProtocolError,
    parse_client_frame,
)
from backend.vocabulary import Prompt

LIMITS = Limits()


def generate(**overrides: object) -> str:
    """A generate frame of 4 samples of "hello", its fields overridden, bad values included."""
    frame = generate_frame("r1", "hello", 4)
    frame.update(overrides)
    return json.dumps(frame)


def test_client_frames_as_built_parse_back_to_what_they_ask() -> None:
    frame = generate_frame(
        "r1",
        "hi",
        3,
        {"max_tokens": 8, "seed": 5, "top_k": 4, "stop": ["."]},
        format="chat",
        system="be brief",
        logprobs=True,
        consumer={"mode": "blocking", "block_ms": 5},
        fanout="requests",
        trace=False,
        output_kind="cumulative",
        cancel_after=4,
    )
    command = parse_client_frame(encode(frame), LIMITS)
    assert isinstance(command, GenerateCommand)
    assert (command.id, command.prompt, command.n, command.format, command.system) == (
        "r1",
        "hi",
        3,
        "chat",
        "be brief",
    )
    params = command.params
    assert (params.max_tokens, params.seed, params.top_k, params.stop, params.logprobs) == (
        8,
        5,
        4,
        (".",),
        True,
    )
    assert command.consumer == Consumer("blocking", 5.0) and command.consumer.blocks
    assert (command.fanout, command.trace, command.output_kind, command.cancel_after) == (
        "requests",
        False,
        "cumulative",
        4,
    )
    assert parse_client_frame(encode(cancel_frame("r1")), LIMITS) == CancelCommand("r1")
    assert parse_client_frame(encode(cancel_frame("r1", 2)), LIMITS) == CancelCommand("r1", 2)
    assert parse_client_frame(encode(export_trace_frame("r1")), LIMITS) == ExportTraceCommand("r1")


def test_a_frame_field_left_none_is_left_out_and_an_unknown_one_fails_where_it_is_built() -> None:
    assert generate_frame("r1", "hi", system=None, consumer=None) == generate_frame("r1", "hi", 1)
    with pytest.raises(TypeError, match="no field 'cancel_afterr'"):
        generate_frame("r1", "hi", cancel_afterr=3)


def test_generate_with_defaults() -> None:
    command = parse_client_frame(generate(), LIMITS)
    assert isinstance(command, GenerateCommand)
    assert (command.id, command.prompt, command.n) == ("r1", "hello", 4)
    assert command.params.max_tokens == DEFAULT_MAX_TOKENS
    assert command.params.seed is None


def test_generate_with_params() -> None:
    params = {"max_tokens": 64, "temperature": 0, "top_p": 0.5, "seed": 33}
    command = parse_client_frame(generate(params=params), LIMITS)
    assert isinstance(command, GenerateCommand)
    assert command.params.max_tokens == 64
    assert command.params.temperature == 0.0
    assert command.params.top_p == 0.5
    assert command.params.seed == 33
    assert command.params.sample_seed(2) == 35


def test_top_k_and_stop_strings() -> None:
    command = parse_client_frame(generate(params={"top_k": 40, "stop": "\n\n"}), LIMITS)
    assert isinstance(command, GenerateCommand)
    assert command.params.top_k == 40 and command.params.stop == ("\n\n",)
    command = parse_client_frame(generate(params={"stop": ["END", "###"]}), LIMITS)
    assert isinstance(command, GenerateCommand) and command.params.stop == ("END", "###")


def test_extra_top_level_fields_are_allowed() -> None:
    assert isinstance(parse_client_frame(generate(client="x"), LIMITS), GenerateCommand)


def test_cancel_all_and_one() -> None:
    assert parse_client_frame('{"type":"cancel","id":"r1"}', LIMITS) == CancelCommand("r1", None)
    assert parse_client_frame('{"type":"cancel","id":"r1","index":2}', LIMITS) == CancelCommand("r1", 2)


@pytest.mark.parametrize(
    ("raw", "code", "request_id"),
    [
        ("not json", "bad_json", None),
        ('{"type": "generate"', "bad_json", None),
        ("[1, 2]", "bad_frame", None),
        ('"generate"', "bad_frame", None),
        ('{"id": "r1"}', "missing_field", "r1"),
        ('{"type": "explode", "id": "r1"}', "unknown_type", "r1"),
        ('{"type": "generate", "prompt": "x"}', "missing_field", None),
        ('{"type": "generate", "id": 5, "prompt": "x"}', "bad_field", None),
        ('{"type": "generate", "id": "", "prompt": "x"}', "bad_field", None),
        (json.dumps(generate_frame("x" * 200, "x")), "bad_field", None),
        ('{"type": "generate", "id": "r1"}', "missing_field", "r1"),
        (generate(prompt=7), "bad_field", "r1"),
        (generate(prompt=""), "empty_prompt", "r1"),
        (generate(prompt="   \n"), "empty_prompt", "r1"),
        (generate(prompt="x" * (LIMITS.max_prompt_chars + 1)), "prompt_too_long", "r1"),
        (generate(prompt="x" * (LIMITS.max_frame_bytes + 1)), "frame_too_large", None),
        (generate(n=0), "n_out_of_range", "r1"),
        (generate(n=LIMITS.n_max + 1), "n_out_of_range", "r1"),
        (generate(n=-3), "n_out_of_range", "r1"),
        (generate(n="4"), "bad_field", "r1"),
        (generate(n=2.5), "bad_field", "r1"),
        (generate(n=True), "bad_field", "r1"),
        (generate(params=[]), "bad_field", "r1"),
        (generate(params={"max_token": 5}), "unknown_param", "r1"),
        (generate(params={"max_tokens": 0}), "max_tokens_out_of_range", "r1"),
        (generate(params={"max_tokens": LIMITS.max_tokens_max + 1}), "max_tokens_out_of_range", "r1"),
        (generate(params={"max_tokens": "10"}), "bad_field", "r1"),
        (generate(params={"temperature": -0.1}), "temperature_out_of_range", "r1"),
        (generate(params={"temperature": 9}), "temperature_out_of_range", "r1"),
        (generate(params={"temperature": "hot"}), "bad_field", "r1"),
        (generate().replace('"n": 4', '"n": 4, "params": {"temperature": NaN}'), "bad_json", None),
        (generate(params={"top_p": 0}), "top_p_out_of_range", "r1"),
        (generate(params={"top_p": 1.5}), "top_p_out_of_range", "r1"),
        (generate(params={"seed": -1}), "seed_out_of_range", "r1"),
        (generate(params={"seed": 2**40}), "seed_out_of_range", "r1"),
        (generate(params={"seed": 1.5}), "bad_field", "r1"),
        (generate(params={"top_k": -1}), "top_k_out_of_range", "r1"),
        (generate(params={"top_k": 1.5}), "top_k_out_of_range", "r1"),
        (generate(params={"stop": [""]}), "bad_field", "r1"),
        (generate(params={"stop": ["a", "b", "c", "d", "e"]}), "bad_field", "r1"),
        (generate(params={"stop": 5}), "bad_field", "r1"),
        ('{"type": "cancel"}', "missing_field", None),
        ('{"type": "cancel", "id": "r1", "index": "2"}', "bad_field", "r1"),
    ],
)
def test_bad_frames_are_rejected_with_a_code(raw: str, code: str, request_id: str | None) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(raw, LIMITS)
    assert caught.value.code == code
    assert caught.value.request_id == request_id
    assert len(caught.value.message) > 10


def test_binary_frames_are_rejected() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(b'{"type":"cancel","id":"r1"}', LIMITS)
    assert caught.value.code == "bad_frame"


def test_n_limit_is_a_setting() -> None:
    with pytest.raises(ProtocolError):
        parse_client_frame(generate(n=8), Limits(n_max=4))
    assert isinstance(parse_client_frame(generate(n=8), Limits(n_max=8)), GenerateCommand)


@pytest.mark.parametrize(
    "frame",
    [
        chunk_frame("r1", 0, " token", 1, 12.5),
        chunk_frame('r"2\\', 31, 'quote " backslash \\ newline \n tab \t nul \x00 ü 漢 \u2028 🙂', 7, 1e-6),
        chunk_frame("r3", 2, "", 0, 123456.1234567891),
        chunk_frame("r4", 1, "no at", 1),
        {"type": "finish", "id": "r1", "index": 0, "reason": "stop", "stats": {"tokens": 3, "e2e_ms": 0.1}},
        {"type": "trace", "slices": [[0.001, 2.5, 1e-7, 0, 3, 1e22]], "names": ["consume r1"]},
    ],
)
def test_encode_writes_compact_json_that_reads_back_as_the_frame(frame: dict) -> None:
    text = encode(frame)
    assert json.loads(text) == frame
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False).replace(
        "e-06", "e-6"
    ).replace("e-07", "e-7")  # json.dumps's text, but for how small floats are spelled
    assert encode_bytes(frame) == text.encode()


def test_encode_takes_what_orjson_does_not() -> None:
    assert json.loads(encode({"type": "x", "big": 2**70, "keys": {1: "a"}})) == {
        "type": "x",
        "big": 2**70,
        "keys": {"1": "a"},
    }
    assert encode({"type": "x", "text": "lone \ud83d half"}) == '{"type":"x","text":"lone ? half"}'
    assert json.loads(encode({"type": "x", "at": math.nan})) == {"type": "x", "at": None}


def test_prompt_format_and_system_prompt() -> None:
    command = parse_client_frame(generate(), LIMITS)
    assert isinstance(command, GenerateCommand) and (command.format, command.system) == (None, "")
    command = parse_client_frame(generate(format="chat", system="Answer in French."), LIMITS)
    assert isinstance(command, GenerateCommand)
    assert (command.format, command.system) == ("chat", "Answer in French.")
    command = parse_client_frame(generate(format="raw"), LIMITS)
    assert isinstance(command, GenerateCommand) and command.format == "raw"


def test_a_continuation_carries_the_text_it_continues_from() -> None:
    command = parse_client_frame(generate(prefix="Once upon a time, "), LIMITS)
    assert isinstance(command, GenerateCommand) and command.prefix == "Once upon a time, "
    assert parse_client_frame(generate(prefix=None), LIMITS).prefix == ""  # type: ignore[union-attr]
    chat = Prompt("Tell a story.", "chat", "Be brief.", prefix="Once")
    assert chat.continued_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell a story."},
        {"role": "assistant", "content": "Once"},
    ]
    assert chat.messages()[-1] == {"role": "user", "content": "Tell a story."}
    assert Prompt("Once upon", "raw", prefix=" a time").raw_text == "Once upon a time"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"prefix": 3}, '"prefix" must be a string'),
        ({"prefix": ["a"]}, '"prefix" must be a string'),
        ({"prompt": "x" * 8_000, "prefix": "y" * 8_001}, "the text to continue from have 16001 characters"),
        ({"format": "markdown"}, '"format" must be "chat"'),
        ({"format": 1}, '"format" must be "chat"'),
        ({"system": 3}, '"system" must be a string'),
        ({"format": "raw", "system": "Be brief."}, "needs the chat format"),
        ({"system": "x" * 16_000}, "prompt and system prompt have"),
    ],
)
def test_a_bad_format_or_system_prompt_is_refused_plainly(overrides: dict[str, object], words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(generate(**overrides), LIMITS)
    assert words in caught.value.message and caught.value.request_id == "r1"


def test_the_format_follows_the_models_template() -> None:
    with_template = choose_format("Hi", None, "", True)
    assert with_template.prompt == Prompt("Hi", "chat") and "default" in with_template.reason
    asked_raw = choose_format("Hi", "raw", "", True)
    assert asked_raw.prompt == Prompt("Hi", "raw") and asked_raw.reason == "plain completion, as asked"
    system = choose_format("Hi", "chat", "Be brief.", True)
    assert system.prompt == Prompt("Hi", "chat", "Be brief.") and "system prompt" in system.reason
    assert system.prompt.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    for requested in (None, "chat"):
        base = choose_format("Hi", requested, "Be brief.", False, "none in tokenizer_config.json")
        assert base.prompt == Prompt("Hi", "raw")
        assert "no chat template (none in tokenizer_config.json)" in base.reason
        assert "system prompt is not used" in base.reason
    unknown = choose_format("Hi", None, "", None, "synthetic text does not depend on the prompt")
    assert unknown.prompt.format == "chat"
    assert unknown.reason == "the default (synthetic text does not depend on the prompt)"


def test_frames_ready_together_go_as_one_batch_message_and_read_back_in_order() -> None:
    frames = [
        encode_bytes({"type": "chunk", "id": "r1", "index": i, "text": f"t{i}\n", "tokens": 1})
        for i in range(5)
    ]
    [message] = batch_messages(frames)
    assert message.startswith(b"[") and [f["index"] for f in frames_in(message)] == [0, 1, 2, 3, 4]
    assert frames_in(message.decode())[4]["text"] == "t4\n"  # a text message reads the same
    assert batch_messages(frames[:1]) == frames[:1]  # a lone frame is sent as itself
    assert frames_in(frames[0]) == [json.loads(frames[0])]
    assert batch_messages([]) == []


def test_a_batch_is_cut_before_its_size_limit_and_a_big_frame_goes_alone() -> None:
    small = [encode_bytes({"type": "chunk", "id": "r1", "index": i, "text": "x" * 40}) for i in range(10)]
    big = encode_bytes({"type": "trace_export", "id": "r1", "traceEvents": ["e" * 500]})
    messages = batch_messages([*small[:4], big, *small[4:]], limit=300)
    assert all(len(m) <= 300 for m in messages if big not in m)
    assert big in messages  # alone: a frame is never split
    read = [frame for message in messages for frame in frames_in(message)]
    assert [f.get("index") for f in read] == [0, 1, 2, 3, None, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("message", ["{", "3", "[1, 2]", '[{"type": "chunk"}, "x"]', "null"])
def test_a_message_that_is_not_frames_is_a_value_error(message: str) -> None:
    with pytest.raises(ValueError):
        frames_in(message)

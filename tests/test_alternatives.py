"""Alternatives at any token (issue 49): the `alternatives` field checked, each engine's top k read
from its own figures (the embedded engine's logits, SGLang's `output_top_logprobs`, vLLM's
`top_logprobs` on completions and chat, in the recorded shapes), nothing added to a run that does not
ask, and saved runs and replays that keep them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from websockets.asyncio.client import connect

from backend.config.settings import Limits
from backend.engines.cumulative import CumulativeGeneration, DeltaReader
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.embedded.sampler import top_tokens
from backend.engines.http.openai import completions_request
from backend.engines.http.sglang import sglang_request
from backend.engines.http.streams import OpenAIStream, SGLangStream
from backend.engines.synthetic import SyntheticEngine
from backend.frames import chunk_frame, encode_bytes, generate_frame, replay_frame
from backend.protocol import ProtocolError, parse_client_frame
from backend.saved_run import saved_run_dict, saved_runs_json
from backend.saved_run_reader import parse_saved_runs
from backend.vocabulary import Chunk, Prompt, SamplingParams
from devkit.frames import recv_frame
from devkit.listing import ListingEngine
from tests.support.backends import serving
from tests.support.embedded import collect, params
from tests.support.page_events import PAGE_SETTINGS, page
from ui.alternatives_view import why_none
from ui.handlers import Handlers
from ui.run_recorder import RunRecorder
from ui.sample_tree_view import value_rows
from ui.view import RunView, samples_value


def parse(**options: Any) -> Any:
    return parse_client_frame(json.dumps(generate_frame("r1", "Hi", 2, **options)), Limits())


def test_alternatives_are_asked_with_logprobs_and_checked() -> None:
    assert parse(logprobs=True, alternatives=5).params.alternatives == 5
    assert parse(logprobs=True, alternatives=20).params.alternatives == 20
    assert parse(logprobs=True).params.alternatives == 0
    for k in (0, 21, -1):
        with pytest.raises(ProtocolError) as caught:
            parse(logprobs=True, alternatives=k)
        assert caught.value.code == "alternatives_out_of_range"
        assert "between 1 and 20" in caught.value.message
    for bad in ("5", 2.5, True, [5]):
        with pytest.raises(ProtocolError) as caught:
            parse(logprobs=True, alternatives=bad)
        assert caught.value.code == "bad_field" and '"alternatives"' in caught.value.message
    with pytest.raises(ProtocolError) as caught:
        parse(alternatives=5)
    assert caught.value.code == "bad_field" and '"logprobs": true' in caught.value.message


def test_a_run_without_alternatives_sends_the_same_bytes_as_before() -> None:
    plain = encode_bytes(chunk_frame("r1", 0, " the", 1, 1.5, (-0.25,)))
    before = b'{"type":"chunk","id":"r1","index":0,"text":" the","tokens":1,"at":1.5,'
    assert plain == before + b'"logprobs":[[" the",[-0.25]]]}'

    listed = chunk_frame("r1", 0, " the", 1, 1.5, (-0.25,), ((0, ((" the", -0.2512), (" a", -1.5))),))
    wire = json.loads(encode_bytes(listed))
    assert wire["logprobs"] == [[" the", [-0.25], [[0, [[" the", -0.2512], [" a", -1.5]]]]]]


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(max_rows=8, context=512)
    engine.load()
    yield engine
    engine.shutdown()


async def chunks_of(engine: EmbeddedEngine, n: int, **extra: Any) -> list[Chunk]:
    generation = engine.generate(Prompt("Name three colors."), n, params(max_tokens=10, **extra))
    return [chunk async for chunk in generation]


async def test_the_embedded_engine_lists_k_alternatives_from_its_own_logits(engine: EmbeddedEngine) -> None:
    """Each token: the k most likely of the step's log-softmax, most likely first, the top one at
    least as likely as the drawn one, the drawn one marked where it is among them (its text and
    logprob the token's own); a run that does not ask gets none."""
    got = await chunks_of(engine, 3, logprobs=True, alternatives=5)
    counted = 0
    for chunk in got:
        if not chunk.tokens:
            continue
        assert chunk.logprobs is not None and chunk.alternatives is not None
        assert len(chunk.alternatives) == len(chunk.logprobs) == 1
        drawn, top = chunk.alternatives[0]
        assert len(top) == 5
        values = [value for _, value in top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-3
        assert values[0] >= chunk.logprobs[0] - 1e-4  # alternatives keep 4 decimals
        if drawn >= 0:
            assert top[drawn][1] == pytest.approx(chunk.logprobs[0], abs=1e-4)
            counted += 1
        else:
            assert chunk.logprobs[0] <= values[-1] + 1e-4
    assert counted >= len(got) // 2  # at temperature 0.8 most drawn tokens are among the top 5
    plain = await chunks_of(engine, 2, logprobs=True)
    assert all(chunk.alternatives is None for chunk in plain)
    assert all(chunk.alternatives is None and chunk.logprobs is None for chunk in await chunks_of(engine, 2))


async def test_the_embedded_engine_gives_the_same_samples_with_alternatives_on(
    engine: EmbeddedEngine,
) -> None:
    """Listing the alternatives changes nothing that is drawn: the texts are the same as without."""
    texts, _, _ = await collect(engine.generate(Prompt("Say hi."), 2, params(max_tokens=8, logprobs=True)), 2)
    listed, _, _ = await collect(
        engine.generate(Prompt("Say hi."), 2, params(max_tokens=8, logprobs=True, alternatives=20)), 2
    )
    assert texts == listed


def sglang_event(
    index: int, text: str, completion: int, new: list[tuple[float, int, str]], tops: list
) -> str:
    """A `/generate` event of an incremental SGLang stream with `return_logprob`, `top_logprobs_num`
    and `return_text_in_logprobs` (tests/fixtures/sglang-generate-n2-logprobs-incremental.sse's
    shape, `output_top_logprobs` per token a list of `[logprob, token id, text]`)."""
    meta = {
        "id": f"rid{index}",
        "finish_reason": None,
        "prompt_tokens": 5,
        "completion_tokens": completion,
        "output_token_logprobs": [list(entry) for entry in new],
        "output_top_logprobs": tops,
    }
    return json.dumps(
        {"text": text, "output_ids": [entry[1] for entry in new], "meta_info": meta, "index": index}
    )


PARIS = [[-0.0914, 7042, " Paris"], [-2.9, 253, " a"], [-3.4, 260, " the"]]
DOT = [[-0.9, 198, "\n"], [-1.2, 30, "."]]


def test_sglang_alternatives_come_from_output_top_logprobs() -> None:
    body = sglang_request(
        "The capital of France is", 2, SamplingParams(8, 0.8, 0.95, 1, logprobs=True, alternatives=3)
    )
    assert body["top_logprobs_num"] == 3 and body["return_logprob"] and body["return_text_in_logprobs"]
    assert "top_logprobs_num" not in sglang_request("x", 1, SamplingParams(8, 0.8, 0.95, 1, logprobs=True))
    stream = SGLangStream(2, incremental=True, logprobs=True, alternatives=3)
    [first] = stream.feed(sglang_event(0, " Paris", 1, [(-0.0914, 7042, " Paris")], [PARIS]))
    assert first.alternatives == ((0, ((" Paris", -0.0914), (" a", -2.9), (" the", -3.4))),)
    # The drawn token outside the list: marked -1, the list still most likely first.
    [second] = stream.feed(sglang_event(0, ".", 2, [(-1.2, 30, ".")], [DOT]))
    assert second.alternatives == ((1, (("\n", -0.9), (".", -1.2))),)
    [other] = stream.feed(sglang_event(1, " Rome", 1, [(-5.0, 999, " Rome")], [PARIS]))
    assert other.alternatives is not None and other.alternatives[0][0] == -1
    # Without alternatives asked, none are read even where the server sends them.
    plain = SGLangStream(1, incremental=True, logprobs=True)
    assert (
        plain.feed(sglang_event(0, " Paris", 1, [(-0.0914, 7042, " Paris")], [PARIS]))[0].alternatives is None
    )


def test_a_cumulative_sglang_stream_gives_each_tokens_alternatives_once() -> None:
    stream = SGLangStream(1, incremental=False, logprobs=True, alternatives=2)
    one = [(-0.0914, 7042, " Paris")]
    two = [*one, (-1.2, 30, ".")]
    [a] = stream.feed(sglang_event(0, " Paris", 1, one, [PARIS]))
    [b] = stream.feed(sglang_event(0, " Paris.", 2, two, [PARIS, DOT]))
    assert a.alternatives == ((0, ((" Paris", -0.0914), (" a", -2.9))),)
    assert b.text == "." and b.alternatives == ((1, (("\n", -0.9), (".", -1.2))),)


def test_in_process_sglang_names_an_alternative_from_its_token_id() -> None:
    stream = SGLangStream(1, incremental=True, logprobs=True, alternatives=2, token_text=lambda t: f"<{t}>")
    tops = [[[-0.1, 7042, None], [-2.9, 253, None]]]
    [chunk] = stream.feed(sglang_event(0, " Paris", 1, [(-0.1, 7042, " Paris")], tops))
    assert chunk.alternatives == ((0, (("<7042>", -0.1), ("<253>", -2.9))),)


def test_vllm_completions_alternatives_come_from_top_logprobs() -> None:
    """`logprobs: k` on /v1/completions: `top_logprobs` per token a dict of text to logprob (vLLM
    adds the drawn token where it is not among the k: tests/fixtures/vllm-v1-completions-n2-logprobs.sse)."""
    prompt = Prompt("The capital of France is", format="raw")
    _, body = completions_request(
        "m", prompt, 2, SamplingParams(8, 0.8, 0.95, 1, logprobs=True, alternatives=2)
    )
    assert body["logprobs"] == 2
    assert (
        completions_request("m", prompt, 2, SamplingParams(8, 0.8, 0.95, 1, logprobs=True))[1]["logprobs"]
        == 0
    )
    choice = {
        "index": 0,
        "text": " Paris",
        "logprobs": {
            "text_offset": [0],
            "token_logprobs": [-0.2399],
            "tokens": [" Paris"],
            "top_logprobs": [{" the": -2.5, " Paris": -0.2399, " a": -3.1}],
        },
        "finish_reason": None,
    }
    stream = OpenAIStream(2, logprobs=True, alternatives=2)
    [chunk] = stream.feed(json.dumps({"choices": [choice]}))
    assert chunk.alternatives == ((0, ((" Paris", -0.2399), (" the", -2.5))),)
    choice["logprobs"]["tokens"] = [" Rome"]  # type: ignore[index]
    choice["index"] = 1
    assert stream.feed(json.dumps({"choices": [choice]}))[0].alternatives[0][0] == -1  # type: ignore[index]


def test_vllm_chat_alternatives_come_from_each_contents_top_logprobs() -> None:
    """`logprobs: true, top_logprobs: k` on chat: `content[].top_logprobs` as `{token, logprob,
    bytes}` (tests/fixtures/vllm-v1-chat-completions-n2-logprobs.sse, there with k = 0)."""
    _, body = completions_request(
        "m", Prompt("Hi"), 2, SamplingParams(8, 0.8, 0.95, 1, logprobs=True, alternatives=3)
    )
    assert body["logprobs"] is True and body["top_logprobs"] == 3
    entry = {
        "token": "1",
        "logprob": -1.75,
        "bytes": [49],
        "top_logprobs": [
            {"token": "Here", "logprob": -0.9, "bytes": [72]},
            {"token": "1", "logprob": -1.75, "bytes": [49]},
            {"token": "Sure", "logprob": -2.0, "bytes": [83]},
        ],
    }
    event = {
        "choices": [
            {"index": 0, "delta": {"content": "1"}, "logprobs": {"content": [entry]}, "finish_reason": None}
        ]
    }
    stream = OpenAIStream(1, chat=True, logprobs=True, alternatives=3)
    [chunk] = stream.feed(json.dumps(event))
    assert chunk.alternatives == ((1, (("Here", -0.9), ("1", -1.75), ("Sure", -2.0))),)


async def test_cumulative_outputs_carry_alternatives_and_the_reader_takes_the_new_ones() -> None:
    class Two:
        def __init__(self) -> None:
            self.chunks = [
                Chunk(0, "a", 1, logprobs=(-0.1,), alternatives=((0, (("a", -0.1),)),)),
                Chunk(0, "b", 1, logprobs=(-0.2,), alternatives=((-1, (("c", -0.05),)),)),
            ]

        async def __anext__(self) -> Chunk:
            return self.chunks.pop(0)

    cumulative = CumulativeGeneration(Two())  # type: ignore[arg-type]
    reader = DeltaReader()
    first = reader.delta(await cumulative.__anext__())
    second_whole = await cumulative.__anext__()
    assert second_whole.alternatives is not None and len(second_whole.alternatives) == 2
    second = reader.delta(second_whole)
    assert first.alternatives == ((0, (("a", -0.1),)),) and second.alternatives == ((-1, (("c", -0.05),)),)


def recorded(alternatives: int) -> RunRecorder:
    """A run of one sample of two chunks as its client got them, with logprobs, and alternatives
    where `alternatives`."""
    request = generate_frame(
        "r1", "Hi", 1, {"max_tokens": 4, "seed": 3}, logprobs=True, alternatives=alternatives or None
    )
    recorder = RunRecorder(request)
    recorder.apply(
        {
            "type": "accepted",
            "id": "r1",
            "n": 1,
            "engine": "embedded",
            "model": "m",
            "at": 1.0,
            "format": "chat",
            "params": {"max_tokens": 4, "temperature": 0.8, "top_p": 0.95, "seed": 3},
        }
    )
    listed = ((0, ((" Hi", -0.1), (" Hello", -2.5))),) if alternatives else None
    for at, text in ((1.1, " Hi"), (1.2, "!")):
        recorder.apply(json.loads(encode_bytes(chunk_frame("r1", 0, text, 1, at, (-0.1,), listed))))
    recorder.apply({"type": "finish", "id": "r1", "index": 0, "reason": "length", "stats": {"seed": 3}})
    recorder.apply({"type": "done", "id": "r1", "stats": {}})
    return recorder


def test_a_saved_run_keeps_its_alternatives_and_one_without_has_none() -> None:
    with_them = recorded(2).saved_run()
    assert with_them.params.alternatives == 2
    assert with_them.samples[0].chunks[0].alternatives == ((0, ((" Hi", -0.1), (" Hello", -2.5))),)
    text = saved_runs_json([with_them], {})
    [back] = parse_saved_runs(text)
    assert back.samples[0].chunks[1].alternatives == with_them.samples[0].chunks[1].alternatives
    without = recorded(0).saved_run()
    plain = saved_runs_json([without], {})
    assert "alternatives" not in plain and without.samples[0].chunks[0].alternatives is None
    assert parse_saved_runs(plain)[0].params.alternatives == 0


SETTINGS = {**PAGE_SETTINGS, "logprobs": True, "alternatives": 3}


async def generate(handlers: Handlers, request: Any, **change: Any) -> list[Any]:
    last: list[Any] = []
    settings = {**SETTINGS, "prompt": "Tell a story.", "format": "chat", "system": "", **change}
    async for outputs in handlers.generate(request, **settings):
        last = outputs
    return last


async def branch(handlers: Handlers, request: Any, column: int, value: dict[str, Any]) -> list[list[Any]]:
    event = SimpleNamespace(index=column, value=value)
    return [outputs async for outputs in handlers.continue_from_point(event, request, **SETTINGS)]


async def test_an_alternative_picked_in_a_column_starts_a_run_from_it_marked_chosen_by_hand() -> None:
    async with serving(ListingEngine(rate=400, jitter=0.0), Limits()) as backend:
        handlers = Handlers(backend.url)
        request = page()
        first = await generate(handlers, request)
        run_id = first[0]["run"]
        marks = first[0]["samples"][0]["marks"]
        start, (drawn, listed) = marks[0][0], marks[1][2]
        text = first[0]["samples"][0]["text"]
        chosen = next(token for place, (token, _) in enumerate(listed) if place != drawn)
        assert all(0 < p <= 1 for _, p in listed)
        outputs = await branch(handlers, request, 0, {"continue_at": start, "chosen": chosen, "run": run_id})
        assert any("Continuing from a branch" in out[1] for out in outputs if isinstance(out[1], str))
        last = outputs[-1]
        assert last[0]["prefix"] == text[:start] + chosen
        rows = value_rows(last[6])
        assert any("chosen by hand" in row["text"] and chosen.strip() in row["text"] for row in rows)
        lineage = handlers._lineages[request.session_hash]
        saved = lineage.saved_runs({})
        assert saved[1].continues is not None and saved[1].continues.chosen == chosen
        [_, again] = parse_saved_runs(saved_runs_json(saved, {}))
        assert again.continues is not None and again.continues.text.endswith(chosen)
        assert again.prefix == text[:start] + chosen

        # What cannot be branched on is said, and the page keeps its run.
        now = last[0]["run"]
        cases = [
            (
                {"continue_at": start, "chosen": "not a listed token", "run": now},
                "is not one of the alternatives",
            ),
            ({"continue_at": start + 1, "chosen": chosen, "run": now}, "has no token starting at character"),
            ({"continue_at": start, "chosen": chosen, "run": run_id}, f"this tree is of run {run_id!r}"),
            ({"continue_at": start, "chosen": 5, "run": now}, "is not a token"),
        ]
        for value, words in cases:
            refused = await branch(handlers, request, 0, value)
            assert len(refused) == 1 and words in refused[0][1], refused[0][1]
        assert handlers._runs[request.session_hash].request_id == now
        streaming = handlers.generate(
            request, **{**SETTINGS, "prompt": "x", "format": "chat", "system": "", "max_tokens": 2000}
        )
        shown = await anext(streaming)
        refused = await branch(
            handlers, request, 0, {"continue_at": 0, "chosen": chosen, "run": shown[0]["run"]}
        )
        assert "still streaming" in refused[0][1]
        await streaming.aclose()


async def test_a_run_without_alternatives_says_why_and_cannot_branch_on_one() -> None:
    async with serving(SyntheticEngine(rate=400, jitter=0.0), Limits()) as backend:
        handlers = Handlers(backend.url)
        request = page("no-alternatives")
        first = await generate(handlers, request)
        assert first[0]["alt_note"] == "this engine gives no alternatives"
        assert first[6]["alt_note"] == "this engine gives no alternatives"
        marks = first[0]["samples"][0]["marks"]
        assert all(len(mark) == 2 for mark in marks)
        refused = await branch(
            handlers, request, 0, {"continue_at": marks[0][0], "chosen": " the", "run": first[0]["run"]}
        )
        assert "listed no alternatives" in refused[0][1]
    assert why_none("replay") == "this replay was saved without alternatives"


async def test_a_replay_streams_the_alternatives_it_was_saved_with_and_one_without_says_so() -> None:
    saved = recorded(2).saved_run()
    async with serving(SyntheticEngine(rate=400, jitter=0.0), Limits()) as backend:
        async with connect(backend.url) as ws:
            await ws.send(json.dumps(replay_frame("again", saved_run_dict(saved), speed=50)))
            pieces = []
            while (frame := await recv_frame(ws, 20))["type"] != "done":
                if frame["type"] == "chunk":
                    pieces.extend(frame["logprobs"])
    assert [piece[2] for piece in pieces] == [[[0, [[" Hi", -0.1], [" Hello", -2.5]]]]] * 2
    view = RunView("r1", 0.0)
    view.apply({"type": "accepted", "id": "r1", "n": 1, "engine": "replay", "params": {}}, 0.0)
    view.apply(chunk_frame("r1", 0, " Hi", 1, 0.1, (-0.1,)), 0.1)
    assert samples_value(view, 0.2)["alt_note"] == "this replay was saved without alternatives"
    view.apply(chunk_frame("r1", 0, "!", 1, 0.2, (-0.1,), ((0, (("!", -0.1),)),)), 0.2)
    value = samples_value(view, 0.3)
    assert "alt_note" not in value and value["samples"][0]["marks"][1][2] == [0, [["!", 0.9048]]]


@pytest.mark.parametrize("shape", [(32, 49152), (3, 1000), (2, 128)])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_tokens_are_torch_topks(shape: tuple[int, int], k: int) -> None:
    """The blockwise top k gives what `torch.topk` gives: the same values and indices, largest first."""
    values = torch.randn(*shape, generator=torch.Generator().manual_seed(k))
    values[0, 7] = 50.0  # one far ahead, the rest of its block ordinary
    expected, expected_ids = torch.topk(values, k, dim=-1)
    got, ids = top_tokens(values, k)
    assert torch.equal(got, expected) and torch.equal(ids, expected_ids)

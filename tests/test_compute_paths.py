"""The embedded engine's numbers and sampling on every compute path this machine runs (compute.py),
each forced by `--compute`: int8 rows and weights summed exactly, fp32 on the rows kernel from the
GGUF's blocks, and bf16 weights through PyTorch's products at the row counts the engine checked.

What must hold on every path is asserted on every path; what depends on the path (the tolerance
against transformers' logprobs, batch invariance) is read from what the engine says it runs. A path
this machine cannot run is skipped with the engine's own reason; the seeded-sample checks are
skipped only where the engine says its path is not batch-invariant (a PyTorch path none of whose
block sizes passed its check).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator

import pytest
import torch
from websockets.asyncio.client import ClientConnection, connect

from backend.config.settings import Limits
from backend.engines.embedded import compute, int8
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.embedded.weights import resolve_model
from backend.frames import cancel_frame, generate_frame
from backend.vocabulary import Prompt
from devkit.weight_forms import with_products
from tests.support.backends import serving
from tests.support.embedded import PROMPT, collect, kernel_status_on_one_thread, params
from tests.support.wire import texts_of, until_done

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink")

LOGPROB_TOLERANCE = {"float32": 0.02, "bfloat16": 0.3, "int8": 0.3}
"""Greedy logprobs against transformers' in float32, by the dtype of the engine's path: bf16 keeps
8 bits of mantissa, and logits of about 20 are rounded by up to 0.06 each. int8-exact is compared
with transformers multiplying by the same int8 products, but the two round apart all the same: a
value that float32 rounding in the ops between the products puts on the other side of an int8
step's edge changes the next product's inputs, and from there the rest of the rows' roundings (the
prompt's last logits 0.54 apart, of 27)."""


@functools.cache
def _reference(int8: bool) -> torch.nn.Module:
    """transformers' model in float32, multiplying as the engine's path does where it rounds rows to
    int8 (the other paths' differences are within the tolerances); loaded once for the paths that
    share it."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(resolve_model().path, dtype=torch.float32)
    return with_products(reference, "int8") if int8 else reference


@functools.cache
def _reference_greedy(int8: bool, ids: tuple[int, ...], tokens: int) -> tuple[list[int], list[float]]:
    """The reference's `tokens` greedy tokens after prompt `ids` and each step's largest logprob,
    generated once for the paths that share the reference."""
    with torch.inference_mode():
        out = _reference(int8).generate(
            torch.tensor([ids]),
            max_new_tokens=tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    maxima = [torch.log_softmax(score[0].float(), -1).max().item() for score in out.scores]
    return out.sequences[0, len(ids) :].tolist(), maxima


@pytest.fixture(scope="module", params=list(compute.PATHS))
def engine(request: pytest.FixtureRequest) -> Iterator[EmbeddedEngine]:
    path = compute.PATHS[request.param]
    why = compute.unavailable(path, kernel_status_on_one_thread(), True, int8.available())
    if why is not None:
        pytest.skip(f"{path.name} does not run here: {why}")
    engine = EmbeddedEngine(compute=path.name, max_rows=16, context=512)
    engine.load()
    health = engine.health()
    assert health["compute_path"] == path.name and health["compute_why"].startswith("set by --compute")
    assert health["batch_invariant"] is (path.any_rows or health["compute_block"] is not None)
    yield engine
    engine.shutdown()


def _path(engine: EmbeddedEngine) -> compute.ComputePath:
    assert engine.path is not None
    return engine.path


def _invariant(engine: EmbeddedEngine) -> None:
    health = engine.health()
    if not health["batch_invariant"]:
        pytest.skip(f"{health['compute_path']} is not batch-invariant here: {health['compute_why']}")


async def test_a_seed_reproduces_every_sample_and_indices_differ(engine: EmbeddedEngine) -> None:
    first, reasons, _ = await collect(engine.generate(Prompt(PROMPT), 4, params()), 4)
    second, _, _ = await collect(engine.generate(Prompt(PROMPT), 4, params()), 4)
    assert first == second
    assert all(reason in ("stop", "length") for reason in reasons)
    assert len(set(first)) > 1
    # Words, not a token or two (an answer may be short: "A: None"), and about colours somewhere.
    assert all(len(text.split()) >= 2 for text in first) and sum(map(len, first)) >= 40, first
    assert any("colo" in text.lower() or any(c in text.lower() for c in COLOURS) for text in first), first


async def test_greedy_follows_transformers_greedy(engine: EmbeddedEngine) -> None:
    """fp32: the same 16 tokens as transformers' greedy decoding in fp32. bf16 rounds each logit
    to 8 bits, so near-ties may go the other way: there the first tokens agree (int8-exact: against
    transformers with its int8 products)."""
    tokens, _ = _reference_greedy(_path(engine).form == "int8", tuple(engine.prompt_ids(Prompt(PROMPT))), 16)
    expected = engine.tokenizer.decode(tokens, skip_special_tokens=True)
    texts, _, _ = await collect(engine.generate(Prompt(PROMPT), 2, params(max_tokens=16, temperature=0.0)), 2)
    assert texts[0] == texts[1]
    if _path(engine).form == "blocks":
        assert texts[0] == expected
    else:
        assert texts[0][:8] == expected[:8], (texts[0], expected)


async def test_logprobs_are_the_models_own_for_each_token(engine: EmbeddedEngine) -> None:
    ids = tuple(engine.prompt_ids(Prompt(PROMPT)))
    generation = engine.generate(Prompt(PROMPT), 3, params(max_tokens=10, temperature=0.9, logprobs=True))
    logprobs: list[list[float]] = [[], [], []]
    reasons: list[str | None] = [None, None, None]
    async for chunk in generation:
        assert chunk.logprobs is not None and len(chunk.logprobs) == chunk.tokens
        logprobs[chunk.index].extend(chunk.logprobs)
        reasons[chunk.index] = chunk.finish_reason or reasons[chunk.index]
    # A sample may end at the model's end-of-text before 10 tokens ("Color: blue"): it still has a
    # logprob for each token it drew, that end included.
    for sample, reason in zip(logprobs, reasons, strict=True):
        assert (len(sample), reason) == (10, "length") or (reason == "stop" and 1 <= len(sample) < 10)
        assert all(lp <= 0 for lp in sample)
    assert sum(len(sample) for sample in logprobs) >= 20, logprobs
    assert len({tuple(sample) for sample in logprobs}) == 3  # each sample its own draws
    # A greedy sample's tokens are each the most likely: their logprobs are the reference model's
    # log-softmax maxima along its greedy continuation (the first 4, where bf16 and fp32 agree).
    greedy = engine.generate(Prompt(PROMPT), 1, params(max_tokens=4, temperature=0.0, logprobs=True))
    got = [lp async for chunk in greedy for lp in (chunk.logprobs or ())]
    _, expected = _reference_greedy(_path(engine).form == "int8", ids, 4)
    tolerance = LOGPROB_TOLERANCE["int8" if _path(engine).form == "int8" else _path(engine).dtype]
    assert got == pytest.approx(expected, abs=tolerance)
    plain = engine.generate(Prompt(PROMPT), 1, params(max_tokens=4))
    assert [chunk.logprobs async for chunk in plain] == [None] * 4


async def test_stop_strings_end_a_sample_where_the_text_has_them(engine: EmbeddedEngine) -> None:
    greedy, _, _ = await collect(
        engine.generate(Prompt(PROMPT), 1, params(max_tokens=16, temperature=0.0)), 1
    )
    stop = greedy[0][5:8]
    texts, reasons, _ = await collect(
        engine.generate(Prompt(PROMPT), 1, params(max_tokens=16, temperature=0.0, stop=(stop,))), 1
    )
    assert reasons == ["stop"]
    assert texts[0] == greedy[0][: greedy[0].index(stop)]


async def test_greedy_at_n_1_is_top_k_1_at_any_n(engine: EmbeddedEngine) -> None:
    _invariant(engine)
    greedy, _, _ = await collect(
        engine.generate(Prompt(PROMPT), 1, params(max_tokens=16, temperature=0.0)), 1
    )
    for n in (2, 8):
        top1, _, _ = await collect(
            engine.generate(Prompt(PROMPT), n, params(max_tokens=16, seed=9, top_k=1)), n
        )
        assert top1 == greedy * n, (n, top1, greedy)


async def test_a_seeded_sample_is_the_same_alone_and_among_n(engine: EmbeddedEngine) -> None:
    """Sample i of a request of seed s draws from seed s + i: at n = 8 it is what a request of
    n = 1 and seed s + i gives alone."""
    _invariant(engine)
    many, _, _ = await collect(engine.generate(Prompt(PROMPT), 8, params(max_tokens=24, seed=40)), 8)
    for index in (0, 3, 7):
        alone, _, _ = await collect(
            engine.generate(Prompt(PROMPT), 1, params(max_tokens=24, seed=40 + index)), 1
        )
        assert alone[0] == many[index], index


async def test_a_seeded_request_is_the_same_while_others_come_and_go(engine: EmbeddedEngine) -> None:
    """Continuous batching: a seeded request gives the same samples alone and while a long request
    runs beside it, another arrives during it and a third finishes in its middle. The long request
    is cancelled once the seeded one is done (its rest would only take time)."""
    _invariant(engine)
    seeded = (Prompt("Write a short poem about the sea."), 3, params(max_tokens=32, seed=11))
    alone, _, _ = await collect(engine.generate(*seeded), 3)
    long = engine.generate(Prompt("Tell me a story."), 4, params(max_tokens=60, seed=3))
    background = asyncio.ensure_future(collect(long, 4))
    await asyncio.sleep(0.3)  # the long request decodes
    target = asyncio.ensure_future(collect(engine.generate(*seeded), 3))
    await asyncio.sleep(0.2)
    short = await collect(engine.generate(Prompt("Say hi."), 2, params(max_tokens=5, seed=8)), 2)
    busy, _, _ = await target
    await long.abort()
    await background
    assert short[1] == ["length", "length"] or "stop" in short[1]
    assert engine.health()["max_batch_rows"] >= 7
    assert busy == alone


async def test_a_users_seeded_run_shows_the_same_columns_while_another_client_generates(
    engine: EmbeddedEngine,
) -> None:
    """Through the websocket, as the page sends it: a seeded n = 4 run, then the same run again
    while a second client streams its own request (cancelled once the run is done, as the page's
    Cancel sends it: its rest would only take time)."""
    _invariant(engine)
    params = {"max_tokens": 40, "temperature": 0.9, "top_p": 0.95, "seed": 21}
    frame = generate_frame("", "Name a famous scientist and say why.", 4, params)

    async def run(ws: ClientConnection, request_id: str, request: dict) -> list[str]:
        await ws.send(json.dumps({**request, "id": request_id}))
        frames = await until_done(ws, request_id, limit_s=None, frame_s=None, stop_on_error=True)
        assert frames[-1]["type"] == "done", frames[-1]
        texts = texts_of(frames, request_id)
        return [texts.get(i, "") for i in range(request["n"])]

    async with (
        serving(engine, Limits(), keep_engine=True) as server,
        connect(server.url) as user,
        connect(server.url) as other,
    ):
        first = await run(user, "a", frame)
        noise = {
            **frame,
            "prompt": "Describe a forest at night.",
            "n": 6,
            "params": {"max_tokens": 80, "seed": 2},
        }
        busy = asyncio.ensure_future(run(other, "b", noise))
        await asyncio.sleep(0.3)
        again = await run(user, "a2", frame)
        assert not busy.done()  # the other request ran beside the whole run
        await other.send(json.dumps(cancel_frame("b")))
        others = await busy
    assert all(len(text.split()) >= 5 for text in first), first
    assert all(len(text.split()) >= 5 for text in others), others
    assert again == first

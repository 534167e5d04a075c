"""The embedded engine on the real SmolLM2-135M weights: sampling, batching, abort, bad input, offline load.

The model is loaded once for the whole module (the first run ever also converts the GGUF, ~15-40 s);
generated lengths stay short so the module takes well under a minute on two cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from websockets.asyncio.client import connect

from backend.config.settings import Limits
from backend.engines.base import RequestRejected
from backend.engines.embedded.detokenizer import TextStream
from backend.engines.embedded.engine import EmbeddedEngine
from backend.engines.embedded.scheduler import DecodeParams
from backend.engines.embedded.weights import (
    ModelFileError,
    bundled_gguf,
    is_complete,
    read_tensors,
    resolve_model,
)
from backend.frames import generate_frame
from backend.vocabulary import Prompt, SamplingParams
from devkit.frames import recv_frame
from devkit.local import ROOT
from tests.support.backends import serving
from tests.support.embedded import PROMPT, bundled_model, collect, params
from tests.support.wire import finishes_of, of_request, texts_of, tokens_of, until_done


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine(max_rows=8, context=512)
    engine.load()
    yield engine
    engine.shutdown()


async def test_a_continuation_writes_on_from_the_branch_it_continues(engine: EmbeddedEngine) -> None:
    """Greedy, a continuation from the first words of an answer writes the rest of that answer: the
    prefix is the start of the assistant's turn (chat; no end of turn between them), more text (raw)."""
    tokenizer = engine.tokenizer
    story = "Write one sentence about a lighthouse keeper."
    whole, _, _ = await collect(engine.generate(Prompt(story), 1, params(24, temperature=0)), 1)
    cut = whole[0].index(" ", len(whole[0]) // 3)  # a word boundary a third of the way in
    prefix = whole[0][:cut]
    continued = Prompt(story, prefix=prefix)
    ids = engine.prompt_ids(continued)
    assert ids == engine.prompt_ids(Prompt(story)) + tokenizer.encode(prefix, add_special_tokens=False)
    rest, _, finals = await collect(engine.generate(continued, 1, params(6, temperature=0)), 1)
    # The same next word as the answer (a closed turn would start another answer). Later words may
    # part at a near tie: the prompt's last token is prefilled, not copied, and rounds slightly
    # otherwise (on a 2-core AMD EPYC Zen 1 "soul, stood" against the answer's "soul, had").
    said, answer = rest[0].split(), whole[0][len(prefix) :].split()
    assert len(said) > 1 and said[0] == answer[0], (prefix, rest[0], whole[0])
    # The continuation copied the kept sample's keys and values: all its prompt but the last token
    # (whose logits it needs) where the prefix's tokens are those the sample drew.
    figures = finals[0].meta
    assert figures["prompt_tokens"] == len(ids)
    assert len(engine.prompt_ids(Prompt(story))) < figures["cached_tokens"] <= len(ids) - 1, figures
    # A fresh prompt copies only the chat template's head, whatever was kept before it.
    _, _, fresh = await collect(engine.generate(Prompt(story), 1, params(2, temperature=0)), 1)
    assert 0 < fresh[0].meta["cached_tokens"] < len(engine.prompt_ids(Prompt(story))) - 5, fresh[0].meta
    # A branch past the context: refused before any work, saying so.
    with pytest.raises(RequestRejected) as refused:
        engine.validate(Prompt(story, prefix="lighthouse " * 600), 1, params(6))
    assert refused.value.code == "prompt_too_long" and "the context is 512" in str(refused.value)
    # raw: the prefix is more text after the prompt's
    raw = Prompt("The capital of France is", "raw", prefix=" Paris, and the capital of")
    assert engine.prompt_ids(raw) == list(tokenizer(raw.text + raw.prefix)["input_ids"])


async def test_abort_one_sample_then_all(engine: EmbeddedEngine) -> None:
    generation = engine.generate(Prompt(PROMPT), 3, params(200))
    seen = 0
    texts, reasons = [""] * 3, [None] * 3
    async for chunk in generation:
        texts[chunk.index] += chunk.text
        seen += 1
        if seen == 6:
            await generation.abort(1)
        if seen == 12:
            await generation.abort()
        if chunk.finish_reason:
            reasons[chunk.index] = chunk.finish_reason
            if chunk.finish_reason == "abort":
                assert chunk.meta["tokens_after_abort"] <= 1
    assert reasons[1] == "abort"
    assert reasons.count("abort") >= 2
    assert engine.health()["running_rows"] == 0


def test_the_engines_process_says_which_path_runs_and_why(engine: EmbeddedEngine) -> None:
    """`auto` runs the fastest batch-invariant path it timed at start (the rows kernel's, the exact
    int8 products, or a PyTorch path at a block of rows it checked); the figures say which kernel
    multiplies, as the path has it. Read from what the engine says, not from CPU flags."""
    from backend.engines.embedded.compute import PATHS
    from tests.support.embedded import kernel_status_on_one_thread

    health = engine.health()
    path = PATHS[health["compute_path"]]
    assert engine.path is path and health["batch_invariant"], health
    assert "timed at start" in health["compute_why"], health
    assert health["compute_why"].startswith("auto: the fastest batch-invariant path here"), health
    said = health["linear_layers"]
    if path.form == "blocks":
        assert kernel_status_on_one_thread()[0] and said.startswith("rows kernel"), said
        assert health["compute_block"] is None
    elif path.form == "int8":  # exact at any row count: no block, nothing to check
        assert said.startswith("int8 rows and weights") and "summed exactly in int32" in said, said
        assert health["compute_block"] is None and "checked row by row" not in health["compute_why"]
    else:
        block = health["compute_block"]
        assert said.startswith("PyTorch") and f"blocks of {block}" in said, said
        checked = "/".join(map(str, health["compute_sizes"]))
        how = f"products of {checked} rows" if len(health["compute_sizes"]) > 1 else f"blocks of {block} rows"
        assert f"{how} checked row by row" in health["compute_why"], health
    if path.form == "blocks":  # the bundled model: every matrix from the GGUF's blocks
        assert "from the GGUF's blocks (96 MB a step)" in said, said
    else:
        assert "GGUF" not in said, said
    assert health["weight_bytes"] > 0


def test_the_engines_process_keeps_freed_memory_for_its_next_step(engine: EmbeddedEngine) -> None:
    """The child starts with glibc's allocator told to keep blocks of up to 32 MiB on its heap
    (worker.CHILD_MALLOC): a step's [rows, vocabulary] tensors are not faulted in afresh each step."""
    from backend.engines.embedded.worker import CHILD_MALLOC

    environ = Path(f"/proc/{engine.worker_pid}/environ").read_bytes().split(b"\0")
    for name, value in CHILD_MALLOC.items():
        # a caller's own setting wins; without one, the child gets the engine's
        assert f"{name}={os.environ.get(name, value)}".encode() in environ, (name, environ)


async def test_two_requests_share_decode_steps(engine: EmbeddedEngine) -> None:
    before = engine.health()["shared_steps"]
    results = await asyncio.gather(
        collect(engine.generate(Prompt(PROMPT), 2, params(max_tokens=10, seed=1)), 2),
        collect(engine.generate(Prompt("Say hello."), 3, params(max_tokens=10, seed=2)), 3),
    )
    assert all(all(r is not None for r in reasons) for _, reasons, _ in results)
    assert engine.health()["shared_steps"] > before
    assert engine.health()["max_batch_rows"] >= 5


async def test_requests_beyond_the_row_cap_queue_first_come_first_served(engine: EmbeddedEngine) -> None:
    first = engine.generate(Prompt(PROMPT), 6, params(max_tokens=6, seed=1))
    second = engine.generate(Prompt(PROMPT), 6, params(max_tokens=6, seed=2))
    positions: list[int] = []
    second.watch_queue(positions.append)
    await asyncio.gather(collect(first, 6), collect(second, 6))
    assert positions == [1, 0]


def test_text_stream_holds_back_a_possible_stop_string(engine: EmbeddedEngine) -> None:
    ids = engine.tokenizer.encode("one two three four", add_special_tokens=False)
    stream = TextStream(engine.tokenizer, stop=("thr",))
    out = ""
    for token in ids:
        out += stream.push(token)
        if stream.stopped:
            break
    assert stream.stopped
    assert out == "one two "


@pytest.mark.parametrize(
    ("n", "bad", "code"),
    [
        (9, {}, "n_out_of_range"),
        (1, {"max_tokens": 600}, "max_tokens_out_of_range"),
        (1, {"temperature": float("nan")}, "temperature_out_of_range"),
        (1, {"temperature": -0.5}, "temperature_out_of_range"),
        (1, {"top_p": 0.0}, "top_p_out_of_range"),
        (1, {"top_p": 1.5}, "top_p_out_of_range"),
    ],
)
def test_bad_input_is_rejected_before_work(engine: EmbeddedEngine, n: int, bad: dict, code: str) -> None:
    settings = {"max_tokens": 8, "temperature": 0.8, "top_p": 0.95, "seed": 1, **bad}
    steps = engine.health()["steps"]
    with pytest.raises(RequestRejected) as caught:
        engine.generate(Prompt(PROMPT), n, SamplingParams(**settings))
    assert caught.value.code == code
    assert engine.health()["steps"] == steps


def test_prompt_longer_than_the_context_is_rejected(engine: EmbeddedEngine) -> None:
    with pytest.raises(RequestRejected, match="context") as caught:
        engine.validate(Prompt("word " * 600), 1, params())
    assert caught.value.code == "prompt_too_long"


async def test_the_server_sends_the_engines_rejection_as_an_error_frame(engine: EmbeddedEngine) -> None:
    # the engine is loaded already: its start() returns at once
    async with serving(engine, Limits(), keep_engine=True) as server:
        async with connect(server.url) as ws:
            frame = generate_frame("r1", PROMPT, 1, {"max_tokens": 600})
            await ws.send(json.dumps(frame))
            reply = await recv_frame(ws)
            assert reply["type"] == "error"
            assert reply["code"] == "max_tokens_out_of_range"
            frame["params"] = {"max_tokens": 4, "seed": 2}
            await ws.send(json.dumps(frame))
            kinds = []
            while "done" not in kinds:
                kinds.append((await recv_frame(ws))["type"])
            assert kinds[0] == "accepted" and "chunk" in kinds


async def test_the_trace_labels_the_prefill_with_the_engines_own_prompt_token_counts(
    engine: EmbeddedEngine,
) -> None:
    async with serving(engine, Limits(), keep_engine=True) as server:
        async with connect(server.url) as ws:
            await ws.send(json.dumps(generate_frame("r1", PROMPT, 2, {"max_tokens": 4, "seed": 2})))
            frames = await until_done(ws, limit_s=None, frame_s=60)
    traces = of_request(frames, "trace")
    spans = [span for frame in traces for span in frame["prefills"]]
    first_chunk = min((t for frame in traces for t, *_ in frame["chunks"]), default=None)
    figures = [finish["engine"] for finish in finishes_of(frames)]
    start, end, request_id, prompt, cached, ended = spans[-1]
    assert request_id == "r1" and ended and start < first_chunk <= end
    # the request's one prefill, as each finish reports it: computed and reused from the engine's cache
    assert {(f["prompt_tokens"], f["cached_tokens"]) for f in figures} == {(prompt, cached)}
    assert 0 < cached < prompt  # the chat template's head is always reused


async def test_cancel_after_k_tokens_stops_each_sample_at_most_one_token_late(engine: EmbeddedEngine) -> None:
    async with serving(engine, Limits(), keep_engine=True) as server:
        async with connect(server.url) as ws:
            frame = generate_frame("r1", PROMPT, 3, trace=False, cancel_after=5)
            frame["params"] = {"max_tokens": 200, "seed": 3, "temperature": 0.8}
            await ws.send(json.dumps(frame))
            frames = await until_done(ws, limit_s=None, frame_s=60)
    counted, written = tokens_of(frames), texts_of(frames)
    tokens = [counted.get(i, 0) for i in range(3)]
    texts = [written.get(i, "") for i in range(3)]
    finishes = {finish["index"]: finish for finish in finishes_of(frames)}
    assert {f["reason"] for f in finishes.values()} == {"abort"}
    # Each sample reached k; what came after is the abort's trip to the engine's process (a step or
    # two on a loaded machine: not the engine's to bound) and the step in flight there (below).
    assert all(count >= 5 for count in tokens), tokens
    assert [finishes[i]["stats"]["tokens"] for i in range(3)] == tokens, finishes
    assert all(len(text.split()) >= 2 for text in texts), texts  # the start of an answer, cut short
    assert all(f["engine"]["tokens_after_abort"] <= 1 for f in finishes.values()), finishes
    assert engine.health()["running_rows"] == 0


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie nobody reaps counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def test_stop_ends_the_requests_and_the_process_and_a_dead_process_ends_them_too() -> None:
    engine = EmbeddedEngine(max_rows=2, context=256)
    await engine.start()
    pid = engine.worker_pid
    assert pid is not None and pid != os.getpid() and not gone(pid)
    generation = engine.generate(Prompt(PROMPT), 2, params(100))
    first = await anext(generation)
    assert first.finish_reason is None
    await engine.stop()
    _, reasons, _ = await collect(generation, 2)
    assert reasons == ["abort", "abort"]
    assert gone(pid)
    assert engine.health()["loading"] is True
    with pytest.raises(RequestRejected) as caught:
        engine.validate(Prompt(PROMPT), 1, params())
    assert caught.value.code == "engine_not_ready"
    # Started again, then its process dies mid-request: the request ends with "error", not a hang.
    await engine.start()
    pid = engine.worker_pid
    assert pid is not None
    generation = engine.generate(Prompt(PROMPT), 2, params(100))
    await anext(generation)
    os.kill(pid, signal.SIGKILL)
    _, reasons, _ = await collect(generation, 2)
    assert "error" in reasons and None not in reasons
    assert "exited" in engine.health()["failed"]
    with pytest.raises(RequestRejected) as caught:
        engine.validate(Prompt(PROMPT), 1, params())
    assert caught.value.code == "engine_not_ready"
    await engine.stop()


def test_the_model_loads_with_no_network_and_its_process_dies_with_the_backend() -> None:
    code = (
        "import socket, sys\n"
        "def refuse(*a, **k): raise OSError('network used')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from backend.engines.embedded.engine import EmbeddedEngine\n"
        "e = EmbeddedEngine(); e.load(); print('loaded', e.worker_pid, e.model, flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    backend = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert backend.stdout is not None
        line = backend.stdout.readline()  # blocks until loaded; the subprocess's own limits apply
        assert line.startswith("loaded ") and "SmolLM2" in line, line
        child = int(line.split()[1])
        assert not gone(child)
        backend.kill()  # no clean-up runs: only the pipe's end tells the child
        backend.wait(30)
        deadline = time.monotonic() + 60
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(child)
    finally:
        backend.kill()
        backend.wait(30)


def test_a_missing_or_corrupt_model_is_explained(tmp_path: Path) -> None:
    def start(model: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "backend", "--engine", "embedded", "--model", str(model)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    missing = start(tmp_path / "nothing")
    assert missing.returncode == 2
    assert "Traceback" not in missing.stderr
    assert "neither an HF-format folder nor a hub id" in missing.stderr
    # Config and tokenizer are fine, so the backend starts the model's process; the weights are
    # truncated, so that process fails to load them and the backend must say so plainly.
    source = resolve_model().path
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    corrupt = start(broken)
    assert corrupt.returncode == 2, corrupt.stderr
    assert "Traceback" not in corrupt.stderr
    assert "is corrupt" in corrupt.stderr


def test_a_partly_written_or_truncated_copy_reads_as_incomplete(tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    assert not is_complete(folder)  # no manifest: the writer died before the rename
    (folder / "manifest.json").write_text(json.dumps({"sizes": {"model.safetensors": 100}}))
    assert is_complete(folder)
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert not is_complete(folder)
    with pytest.raises(ModelFileError, match="corrupt"):
        read_tensors(folder)


def test_decode_params_need_a_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        EmbeddedEngine.decode_params(SamplingParams(max_tokens=4, temperature=1.0, top_p=1.0))
    assert EmbeddedEngine.decode_params(params(), ignore_eos=True) == DecodeParams(
        max_tokens=12, temperature=0.8, top_p=0.95, seed=5, ignore_eos=True
    )


def _prefill_cold_and_warm(model, config, first: list[int], second: list[int]) -> tuple:
    """`second` prefilled into a fresh cache, and after `first` (reusing the head they share)."""
    from backend.engines.embedded.row_cache import RowCache

    cold = RowCache(config, 4, 512, model.dtype)
    cold_logits, cold_kv = model.prefill(second, cold, cold.add_rows(2))
    warm = RowCache(config, 4, 512, model.dtype)
    _, first_kv = model.prefill(first, warm, warm.add_rows(1))
    warm_logits, warm_kv = model.prefill(second, warm, warm.add_rows(2), first_kv)
    return cold, cold_logits, cold_kv, warm, warm_logits, warm_kv


async def test_a_prompt_reuses_the_previous_prompts_shared_head(engine: EmbeddedEngine) -> None:
    """Positions shared with the last prompt are copied: the same logits and cache as computing them.

    Checked to 1e-4 in fp32, and in bf16 (`--compute bf16-torch`) too, on every machine: there the
    matmuls round differently for a prompt computed whole and one computed after a copied head, so
    there the copy is checked to be exact and the logits to be as close to fp32's as the cold ones.
    """
    from backend.engines.embedded.formats import Form
    from backend.engines.embedded.model import Llama

    read = bundled_model()
    config = read.config
    model = Llama.from_tensors(config, read.tensors)
    first, second = engine.prompt_ids(Prompt(PROMPT)), engine.prompt_ids(Prompt("Say hello."))
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared > 10  # the chat template's system turn
    cold, cold_logits, cold_kv, warm, warm_logits, warm_kv = _prefill_cold_and_warm(
        model, config, first, second
    )
    assert cold_kv.reused == 0
    assert warm_kv.reused == shared
    assert torch.allclose(warm_logits, cold_logits, atol=1e-4)
    assert warm_logits.argmax() == cold_logits.argmax()
    length = len(second)
    for a, b in ((warm.keys, cold.keys), (warm.values, cold.values)):
        assert torch.allclose(a[:, 1:3, :, :length], b[:, 0:2, :, :length], atol=1e-4)
    # The same prompt again: all but its last position are copied; that one gives the logits.
    again_logits, again_kv = model.prefill(second, warm, warm.add_rows(1), warm_kv)
    assert again_kv.reused == length - 1
    assert torch.allclose(again_logits, cold_logits, atol=1e-4)
    # bf16, which PyTorch computes on any x86 CPU
    low = Llama.from_tensors(config, read.tensors, Form("library", torch.bfloat16))
    _, low_cold_logits, _, low_warm, low_warm_logits, low_kv = _prefill_cold_and_warm(
        low, config, first, second
    )
    assert low_kv.reused == shared
    for cache in (low_warm.keys, low_warm.values):  # rows 1-2 copied row 0's head, bit for bit
        assert torch.equal(
            cache[:, 1:3, :, :shared], cache[:, 0:1, :, :shared].expand_as(cache[:, 1:3, :, :shared])
        )
    cold_error = (low_cold_logits.float() - cold_logits).abs().max()
    warm_error = (low_warm_logits.float() - cold_logits).abs().max()
    assert warm_error <= 2 * cold_error
    assert low_warm_logits.argmax() == low_cold_logits.argmax() == cold_logits.argmax()
    # Through the engine: every request copies the template head, prefilled when the engine started,
    # and never more: the same prompt is computed the same way whatever ran before it.
    before = engine.health()["reused_prompt_tokens"]
    await collect(engine.generate(Prompt("Say hello."), 1, params(max_tokens=2)), 1)
    await collect(engine.generate(Prompt("Say hello."), 1, params(max_tokens=2)), 1)
    assert engine.health()["reused_prompt_tokens"] - before == 2 * shared


class RecordingSink:
    """A request's sink that keeps its texts and appends `mark()` to `seen` at each delivery (a list
    it may share with other sinks); `on_first` runs before its first delivery is noted."""

    def __init__(
        self, seen: list[Any], mark: Callable[[], Any], on_first: Callable[[], None] | None = None
    ) -> None:
        self.seen, self.mark, self.on_first = seen, mark, on_first
        self.delivered = False
        self.texts: dict[int, str] = {}
        self.firsts: dict[int, str] = {}
        """Each sample's first chunk's text."""
        self.done = threading.Event()

    def deliver(self, chunks: list) -> None:
        if not self.delivered and self.on_first is not None:
            self.on_first()
        self.delivered = True
        self.seen.append(self.mark())
        for chunk in chunks:
            self.firsts.setdefault(chunk.index, chunk.text)
            self.texts[chunk.index] = self.texts.get(chunk.index, "") + chunk.text
        if any(chunk.finish_reason is not None for chunk in chunks):
            self.done.set()

    def set_queue_position(self, position: int) -> None:
        """Queue positions are not under test here."""


def run_jobs(scheduler: Any, prompts: list[list[int]], together: bool) -> list[RecordingSink]:
    """Each prompt as a request of n = 2 (seed 1, 8 tokens): all submitted at once before the
    scheduler starts, or one after another, each once the one before has finished."""
    from backend.engines.embedded.scheduler import Job

    sinks = [RecordingSink([], lambda: scheduler.stats.prefills) for _ in prompts]
    jobs = [
        Job(ids, 2, DecodeParams(8, 0.8, 0.95, seed=1), sink)
        for ids, sink in zip(prompts, sinks, strict=True)
    ]
    if together:
        for job in jobs:
            scheduler.submit(job)
    scheduler.start(1)
    try:
        for job, sink in zip(jobs, sinks, strict=True):
            if not together:
                scheduler.submit(job)
            assert sink.done.wait(60)
    finally:
        scheduler.stop()
    return sinks


def test_requests_arriving_together_are_prefilled_in_one_pass_with_the_same_samples() -> None:
    """Three requests arriving at once: where a row's products do not depend on the rows beside it
    (the rows kernel, int8's exact sums), their prompts go through one prefill pass (the weights
    read once for all three), and every seeded sample starts as it does when each request runs
    alone; elsewhere they are prefilled one after another, each request's first tokens flushed
    after its own prefill, not after the last."""
    from backend.engines.embedded.child import build_scheduler
    from backend.engines.embedded.worker import WorkerSetup

    setup = WorkerSetup(str(resolve_model().path), "auto", 1, 8, 512, str(bundled_gguf()))
    flushes: list[int] = []
    together = build_scheduler(setup, lambda: flushes.append(1))
    starts = ("The three primary colours are", "Once upon a time", "The capital of France is")
    prompts = [together.tokenizer(text)["input_ids"] for text in starts]
    grouped = run_jobs(together, prompts, together=True)
    # The same path as the first (auto's timing may choose another in a second start).
    chosen = together.compute
    same = WorkerSetup(setup.folder, chosen["path"], 1, 8, 512, setup.gguf, chosen["block"] or 0)
    alone = run_jobs(build_scheduler(same, lambda: None), prompts, together=False)
    for sink in grouped:
        assert sorted(sink.texts) == [0, 1], sink.texts
        # Each sample goes on from its own prompt: words, not a token or two.
        assert all(len(text.split()) >= 3 for text in sink.texts.values()), sink.texts
    # The first tokens come from the prefill: the same grouped as alone. (Later tokens come from
    # decode steps of six rows against two, which may round differently.)
    assert [sink.firsts for sink in grouped] == [sink.firsts for sink in alone]
    firsts = [sink.seen[0] for sink in grouped]  # prefills done when each got its first tokens
    if together.model.weights.rows_independent:
        assert together.stats.grouped_prefills == 1 and firsts == [3, 3, 3], firsts
    else:
        assert together.stats.grouped_prefills == 0 and firsts == [1, 2, 3], firsts


def test_a_grouped_prefill_gives_each_prompt_what_it_gives_alone() -> None:
    """`prefill_many`: the same last-token logits and cache rows, bit for bit, as each prompt's own
    prefill, where the rows kernel multiplies; the template head is copied for each."""
    from transformers import AutoTokenizer

    from backend.engines.base import template_token_ids
    from backend.engines.embedded.formats import Form
    from backend.engines.embedded.model import Llama
    from backend.engines.embedded.row_cache import RowCache
    from tests.test_rows_linear import kernel_on

    read = bundled_model()
    with kernel_on():  # skipped without it: there prompts are prefilled one at a time
        config = read.config
        model = Llama.from_tensors(config, read.tensors, Form("blocks"), read.blocks())
        tokenizer = AutoTokenizer.from_pretrained(read.folder.path)
        ids = [
            template_token_ids(tokenizer, [{"role": "user", "content": t}]) for t in ("Hi.", "Name a bird.")
        ]
        head = RowCache(config, 1, 256, torch.float32)
        _, template = model.prefill(ids[0][:20], head, range(0))
        prompts = [ids[0], ids[1], tokenizer("Once upon a time")["input_ids"]]
        grouped = RowCache(config, 8, 256, torch.float32)
        slots = [grouped.add_rows(n) for n in (2, 1, 3)]
        together = model.prefill_many(list(zip(prompts, slots, strict=True)), grouped, template)
        for prompt, rows, (logits, kept) in zip(prompts, slots, together, strict=True):
            alone = RowCache(config, 3, 256, torch.float32)
            own_logits, own_kept = model.prefill(prompt, alone, alone.add_rows(len(rows)), template)
            assert torch.equal(logits, own_logits)
            assert kept.reused == own_kept.reused == (20 if prompt is not prompts[2] else 0)
            length = len(prompt)
            for mine, theirs in ((grouped.keys, alone.keys), (grouped.values, alone.values)):
                assert torch.equal(
                    mine[:, rows.start : rows.stop, :, :length], theirs[:, : len(rows), :, :length]
                )
            assert grouped.lengths[rows.start : rows.stop].tolist() == [length] * len(rows)


def test_a_request_arriving_during_a_prefill_is_prefilled_before_the_next_decode_step() -> None:
    """B is submitted while A is admitted (from A's first chunks): B's first chunks come before A's
    second token, because the scheduler admits what arrived before it steps the batch."""
    from backend.engines.embedded.child import build_scheduler
    from backend.engines.embedded.scheduler import Job
    from backend.engines.embedded.worker import WorkerSetup

    setup = WorkerSetup(str(resolve_model().path), "auto", 1, 8, 512)
    scheduler = build_scheduler(setup, lambda: None)
    order: list[str] = []
    ids = {text: scheduler.tokenizer(text)["input_ids"] for text in ("Once upon a time", "The sky is")}
    late = RecordingSink(order, lambda: "B")
    params_b = DecodeParams(8, 0.8, 0.95, seed=2)
    first = RecordingSink(
        order, lambda: "A", lambda: scheduler.submit(Job(ids["The sky is"], 1, params_b, late))
    )
    scheduler.submit(Job(ids["Once upon a time"], 1, DecodeParams(8, 0.8, 0.95, seed=1), first))
    scheduler.start(1)
    try:
        assert first.done.wait(60) and late.done.wait(60)
    finally:
        scheduler.stop()
    assert order[:2] == ["A", "B"], order
    for sink in (first, late):
        assert len(sink.texts[0].split()) >= 3, sink.texts


async def test_a_word_branch_is_continued_at_the_models_own_token_boundary(engine: EmbeddedEngine) -> None:
    """The token tree's word node ends in the space the next word's token starts with ("The "); the
    page hands the model the node's text without it (`SampleTree.branch_text`), so the continuations
    start as the samples that took the branch went on: with a word led by a space, not with the
    digits that the space handed over as it is draws (the bakery example of the issue)."""
    from ui.sample_tree import SampleTree

    n = 8
    ask = Prompt("Give me a name for a small bakery.")
    whole, _, _ = await collect(engine.generate(ask, n, params(12, temperature=0.8, seed=11)), n)
    tree = SampleTree(n)
    for index, text in enumerate(whole):
        tree.add(index, text)
    node = max(tree.root.children.values(), key=lambda child: child.count)
    spaced = tree.text_to(node)
    branch = tree.branch_text(spaced)
    took = [text[len(branch) :] for text in whole if text.startswith(branch)]
    assert spaced.endswith(" ") and branch == spaced.rstrip() and len(took) >= 2, (spaced, whole)

    async def first_words(prefix: str) -> list[str]:
        texts, _, _ = await collect(engine.generate(Prompt(ask.text, prefix=prefix), n, params(8, seed=3)), n)
        return texts

    def led(texts: list[str]) -> tuple[int, int]:
        """(led by a space then a letter, led by a digit) among `texts`."""
        spaced_word = sum(bool(re.match(r" [^\W\d_]", text)) for text in texts)
        return spaced_word, sum(bool(re.match(r"\s*\d", text)) for text in texts)

    from_branch = led(await first_words(branch))
    from_spaced = led(await first_words(spaced))
    originals = led(took)
    print(
        f"after {branch!r}: samples {originals}, continuations {from_branch}; after {spaced!r}: {from_spaced}"
    )
    assert originals[0] == len(took)  # the samples through the node went on with a space-led word
    assert from_branch[0] >= n - 1 and from_branch[1] <= max(1, originals[1]), from_branch

"""Saved runs without I/O: built from a request's frames, written, read back, and every bad file refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from backend.frames import accepted_frame, chunk_frame, done_frame, finish_frame, generate_frame, replay_frame
from backend.saved_run import (
    SAVED_RUN_BYTES_MAX,
    SAVED_RUN_KIND,
    SAVED_RUN_VERSION,
    Continues,
    SavedRun,
    SavedRunError,
    saved_run_dict,
    saved_run_json,
    saved_runs_dict,
    saved_runs_json,
)
from backend.saved_run_reader import parse_saved_run, parse_saved_runs
from backend.vocabulary import FINISH_REASONS, SamplingParams
from devkit.local import ROOT
from ui.run_recorder import RunRecorder

RUNS = ROOT / "docs" / "runs"
SHIPPED = sorted(RUNS.glob("*.json"))

REQUEST = generate_frame(
    "r1",
    "A farmer has 17 sheep. All but 9 run away. How many sheep are left?",
    3,
    {"max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 40, "top_k": 20, "stop": ["\n\n"]},
    system="You answer with a number.",
    logprobs=True,
)
TEXTS = [["The", " answer", " is", " 9"], ["9"], []]
"""Each sample's chunks; sample 2 streamed nothing (an early cancel)."""
REASONS = ["stop", "length", "abort"]


def request_frames(started: float = 1000.0) -> list[dict[str, Any]]:
    """The frames a client gets for REQUEST, as the server builds them, interleaved by sample."""
    params = SamplingParams(16, 0.7, 0.9, seed=40, top_k=20, stop=("\n\n",), logprobs=True)
    frames = [
        accepted_frame(
            "r1",
            3,
            "sglang",
            "smollm2",
            params,
            prompt_format="chat",
            format_reason="the model's chat template",
            at=started,
        )
    ]
    for step in range(4):
        for index, texts in enumerate(TEXTS):
            if step < len(texts):
                at = started + 0.05 * (step + 1) + 0.001 * index
                logprobs = (-0.25 * (step + 1),)
                frames.append(chunk_frame("r1", index, texts[step], 1, at, logprobs))
    frames.append({"type": "trace", "samples": []})  # not the request's: ignored
    for index, reason in enumerate(REASONS):
        stats = {"tokens": len(TEXTS[index]), "ttft_ms": 50.0, "seed": 40 + index}
        finish = finish_frame("r1", index, reason, stats)
        if index == 0:
            finish["engine"] = {"completion_tokens": 4, "e2e_latency": 0.2}
        frames.append(finish)
    frames.append(done_frame("r1", {"n": 3, "tokens": 5, "duration_ms": 210.0}))
    return frames


def recorded(source: dict[str, str] | None = None) -> SavedRun:
    recorder = RunRecorder(REQUEST)
    for frame in request_frames():
        recorder.apply(frame)
    return recorder.saved_run(source or {"machine": "test"})


def test_a_recorded_run_holds_the_request_its_samples_and_their_timing() -> None:
    run = recorded()
    assert (run.prompt, run.system, run.prompt_format) == (
        REQUEST["prompt"],
        "You answer with a number.",
        "chat",
    )
    assert (run.engine, run.model, run.n) == ("sglang", "smollm2", 3)
    assert run.params == SamplingParams(16, 0.7, 0.9, seed=40, top_k=20, stop=("\n\n",), logprobs=True)
    assert [sample.text for sample in run.samples] == ["The answer is 9", "9", ""]
    assert [sample.finish_reason for sample in run.samples] == REASONS
    assert [sample.seed for sample in run.samples] == [40, 41, 42]
    first = run.samples[0]
    assert [chunk.at for chunk in first.chunks] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert [chunk.logprobs for chunk in first.chunks] == [(-0.25,), (-0.5,), (-0.75,), (-1.0,)]
    assert first.engine == {"completion_tokens": 4, "e2e_latency": 0.2}
    assert first.stats["ttft_ms"] == 50.0 and run.stats["duration_ms"] == 210.0
    assert run.source == {"machine": "test"}


@pytest.mark.parametrize("indent", [None, 1])
def test_written_and_read_back_a_run_is_the_same(indent: int | None) -> None:
    run = recorded()
    text = saved_run_json(run, indent)
    assert parse_saved_run(text) == run
    assert parse_saved_run(text.encode()) == run
    assert json.loads(text) == saved_run_dict(run)


def test_an_unfinished_run_cannot_be_saved_yet() -> None:
    recorder = RunRecorder(REQUEST)
    for frame in request_frames()[:-1]:  # no `done`
        recorder.apply(frame)
    assert not recorder.finished
    with pytest.raises(SavedRunError, match="has not finished"):
        recorder.saved_run()


def test_a_replay_request_records_the_replayed_runs_prompt_and_settings() -> None:
    original = recorded()
    recorder = RunRecorder(replay_frame("r1", saved_run_dict(original), speed=2))
    for frame in request_frames(started=50.0):
        recorder.apply(frame)
    again = recorder.saved_run({"machine": "test"})
    assert again == original


def good() -> dict[str, Any]:
    return saved_run_dict(recorded())


def broken(change: Any) -> str:
    """A file of the run with `change` made to the file's JSON object."""
    data = good()
    change(data)
    return json.dumps(data)


def broken_run(change: Any) -> str:
    """A file of the run with `change` made to the run's JSON object (the file's one run)."""
    return broken(lambda d: change(d["runs"][0]))


BAD_FILES: list[tuple[str, str | bytes, str]] = [
    ("not JSON", "this is not json {", "not JSON"),
    ("not UTF-8", b"\xff\xfe\x00{", "not UTF-8"),
    ("a JSON list", "[1, 2]", "must be a JSON object"),
    ("NaN", broken_run(lambda d: d["samples"][0]["chunks"][0].__setitem__(0, float("nan"))), "NaN"),
    ("wrong version", broken(lambda d: d.__setitem__("version", 3)), "reads saved runs of version 1 or 2"),
    ("version as text", broken(lambda d: d.__setitem__("version", "1")), "version"),
    ("another kind", broken(lambda d: d.__setitem__("kind", "trace")), '"kind"'),
    ("no samples", broken_run(lambda d: d.pop("samples")), 'has no "samples"'),
    ("no prompt text", broken_run(lambda d: d["prompt"].pop("text")), 'runs\\[0\\].prompt" has no "text"'),
    ("no seed", broken_run(lambda d: d["settings"].pop("seed")), '"settings" has no "seed"'),
    ("unknown field", broken(lambda d: d.__setitem__("extra", 1)), 'unknown field "extra"'),
    ("unknown run field", broken_run(lambda d: d.__setitem__("extra", 1)), 'unknown field "extra"'),
    ("no runs", broken(lambda d: d.__setitem__("runs", [])), '"runs" must be a list of 1 to 16'),
    (
        "continues no earlier run",
        broken_run(lambda d: d.__setitem__("continues", {"run": 0, "text": "x"})),
        "the file has none before it",
    ),
    (
        "n != samples",
        broken_run(lambda d: d["settings"].__setitem__("n", 4)),
        '"settings.n" is 4 but "samples" has 3',
    ),
    ("fewer samples", broken_run(lambda d: d["samples"].pop()), '"settings.n" is 3 but "samples" has 2'),
    (
        "text != chunks",
        broken_run(lambda d: d["samples"][1].__setitem__("text", "8")),
        "not its chunks' texts",
    ),
    (
        "tokens != chunks",
        broken_run(lambda d: d["samples"][0].__setitem__("tokens", 9)),
        "chunks hold 4 tokens",
    ),
    ("wrong seed", broken_run(lambda d: d["samples"][1].__setitem__("seed", 7)), "has seed 41"),
    ("out of order", broken_run(lambda d: d["samples"].reverse()), '"index"'),
    (
        "bad reason",
        broken_run(lambda d: d["samples"][0].__setitem__("finish_reason", "done")),
        "finish_reason",
    ),
    (
        "chunks back in time",
        broken_run(lambda d: d["samples"][0]["chunks"].reverse()),
        "earlier than the chunk",
    ),
    (
        "a bad chunk",
        broken_run(lambda d: d["samples"][0]["chunks"].__setitem__(0, {"at": 0})),
        r"\[at, text, tokens\]",
    ),
    (
        "logprobs not asked",
        broken_run(lambda d: d["settings"].__setitem__("logprobs", False)),
        '"settings.logprobs" is false',
    ),
    (
        "positive logprob",
        broken_run(lambda d: d["samples"][0]["chunks"][0].__setitem__(3, [0.5])),
        "at most 0",
    ),
    ("temperature", broken_run(lambda d: d["settings"].__setitem__("temperature", 9)), "temperature"),
    ("top_p", broken_run(lambda d: d["settings"].__setitem__("top_p", 0)), "top_p"),
    ("system with raw", broken_run(lambda d: d["prompt"].__setitem__("format", "raw")), "must be empty"),
    (
        "over max_tokens",
        broken_run(lambda d: d["settings"].__setitem__("max_tokens", 2)),
        "more than the run's max_tokens",
    ),
    ("source not text", broken(lambda d: d["source"].__setitem__("machine", 3)), '"source.machine"'),
    ("too big", " " * (SAVED_RUN_BYTES_MAX + 1), f"at most {SAVED_RUN_BYTES_MAX:,}"),
]


@pytest.mark.parametrize(
    ("data", "message"), [(d, m) for _, d, m in BAD_FILES], ids=[n for n, _, _ in BAD_FILES]
)
def test_a_bad_file_is_refused_saying_what_is_wrong(data: str | bytes, message: str) -> None:
    with pytest.raises(SavedRunError, match=message):
        parse_saved_run(data)


def test_the_format_constants_are_what_files_carry() -> None:
    data = good()
    assert data["kind"] == SAVED_RUN_KIND and data["version"] == SAVED_RUN_VERSION
    assert set(FINISH_REASONS) >= {sample["finish_reason"] for sample in data["runs"][0]["samples"]}


@pytest.mark.parametrize("path", SHIPPED, ids=[path.name for path in SHIPPED])
def test_each_shipped_run_is_a_small_valid_sglang_recording(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) < 200_000
    run = parse_saved_run(data)
    assert run.engine == "sglang"
    assert {"engine", "model", "machine", "recorded_with"} <= set(run.source)
    assert "SGLang" in run.source["engine"]
    assert all(sample.chunks for sample in run.samples)
    # Recorded in version 1 of the format, still read; written again in the current one, the same run.
    assert json.loads(data)["version"] == 1
    assert parse_saved_run(saved_run_json(run, indent=1)) == run


def test_the_shipped_runs_are_the_two_the_docs_describe() -> None:
    names = {path.name for path in SHIPPED}
    assert names == {"sheep-sglang-cpu.json", "lighthouse-sglang-cpu.json"}
    sheep = parse_saved_run((RUNS / "sheep-sglang-cpu.json").read_bytes())
    assert sheep.n == 8 and sheep.prompt.startswith("A farmer has 17 sheep.")
    lighthouse = parse_saved_run((RUNS / "lighthouse-sglang-cpu.json").read_bytes())
    assert lighthouse.params.logprobs
    assert any(chunk.logprobs for sample in lighthouse.samples for chunk in sample.chunks)


def continued(run: SavedRun, parent: int, text: str) -> SavedRun:
    """`run` as a continuation of run `parent`'s branch `text` (its prefix that text)."""
    return replace(run, prefix=text, continues=Continues(parent, text))


def test_a_run_and_its_continuations_are_kept_in_one_file_in_order() -> None:
    first = recorded()
    second = continued(recorded(), 0, "The answer")
    third = replace(recorded(), prefix="The answer is", continues=Continues(1, " is"))
    text = saved_runs_json([first, second, third], {"machine": "test"}, indent=1)
    runs = parse_saved_runs(text)
    assert runs == (first, second, third)
    assert [run.prefix for run in runs] == ["", "The answer", "The answer is"]
    # One run is what a replay frame and --engine replay take: a file of three says so.
    with pytest.raises(SavedRunError, match="holds 3 runs"):
        parse_saved_run(text)
    # A version 1 file still loads, as one run of its own.
    v1 = {"kind": SAVED_RUN_KIND, "version": 1, "source": {"machine": "test"}, **good()["runs"][0]}
    del v1["continues"]
    del v1["prompt"]["prefix"]
    assert parse_saved_runs(json.dumps(v1)) == (first,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.__setitem__("continues", {"run": 1, "text": "x"}), "from 0 to 0"),
        (lambda r: r["prompt"].__setitem__("prefix", "other"), "prefix followed by"),
        (
            lambda r: r["prompt"].__setitem__("text", "Another prompt"),
            "not the prompt of the run it continues",
        ),
        (lambda r: r.__setitem__("continues", {"run": 0}), 'has no "text"'),
    ],
)
def test_a_continuation_that_does_not_follow_from_its_run_is_refused(change: Any, message: str) -> None:
    data = saved_runs_dict([recorded(), continued(recorded(), 0, "The")], {})
    change(data["runs"][1])
    with pytest.raises(SavedRunError, match=message):
        parse_saved_runs(json.dumps(data))

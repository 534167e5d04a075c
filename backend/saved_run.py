"""Saved runs, without I/O: one request's samples as a JSON file to keep, share and replay.

A saved run holds what a request asked (prompt, format, system prompt, n and every sampling
setting), what ran it (engine and model), and per sample its text, its chunks with the time each
reached the server and their tokens' log probabilities (where the request asked for them), its
seed, finish reason, the server's figures and the engine's own. ui.run_recorder builds one from the
frames a client received (the page's Download run, scripts/record_run.py); `saved_run_json` writes
it; backend.saved_run_reader reads and checks one, strictly. The format is in docs/protocol.md,
"Saved runs".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend.vocabulary import Alternatives, SamplingParams

SAVED_RUN_KIND = "parallel-sampling-dashboard/run"
"""The `kind` of every saved run: what tells it apart from any other JSON file."""

SAVED_RUN_VERSION = 2
"""The version of the format this code writes: a list of runs, each maybe a continuation of an
earlier one's branch."""

READ_VERSIONS = (1, 2)
"""The versions this code reads: version 1 (one run, no continuations) still loads."""

RUNS_MAX = 16
"""Most runs in one file (a run and its continuations)."""

SAVED_RUN_BYTES_MAX = 768 * 1024
"""Largest saved run read, in bytes of JSON: n = 32 samples of 512 tokens with logprobs fit, and a
page's upload, sent on to the backend in one websocket message, stays under the backend's 1 MiB cap
on a message (`WS_MAX_MESSAGE_BYTES`)."""

N_MAX = 256
"""Most samples in a saved run (the backend replays at most its own n limit of them)."""

TOKENS_MAX = 32_768
"""Most tokens in one saved sample."""

PROMPT_CHARS_MAX = 100_000
"""Longest prompt (or system prompt) in a saved run; the backend replays up to its own prompt limit."""

DURATION_MAX_S = 3600.0
"""Latest time a chunk may have, in seconds after the request started: a replay ends within an hour."""

SOURCE_FIELDS_MAX = 16
SOURCE_CHARS_MAX = 1000
"""`source` holds at most 16 strings of at most 1000 characters each."""

AT_DIGITS = 6
"""Chunk times are written to the microsecond, as the backend measures them."""

LOGPROB_DIGITS = 5
"""Log probabilities are written with 5 decimals: probabilities to about 1e-5, files a third smaller."""

TOP_FIELDS = ("kind", "version", "source", "engine", "model", "prompt", "settings", "samples", "stats")
"""A version 1 file: the run's fields at the top."""
FILE_FIELDS = ("kind", "version", "source", "runs")
RUN_FIELDS = ("engine", "model", "prompt", "continues", "settings", "samples", "stats")
PROMPT_FIELDS = ("text", "format", "system", "format_reason")
PROMPT_FIELDS_V2 = (*PROMPT_FIELDS, "prefix")
CONTINUES_FIELDS = ("run", "text")
CONTINUES_FIELDS_ALL = (*CONTINUES_FIELDS, "chosen")
"""`chosen`, where present: the token chosen by hand that `text` ends with (an alternative branched on)."""
SETTINGS_FIELDS = ("n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs")
SETTINGS_FIELDS_ALL = (*SETTINGS_FIELDS, "alternatives")
"""`alternatives`, where present: how many alternatives each token lists (a run without has none)."""
SAMPLE_FIELDS = ("index", "seed", "finish_reason", "text", "tokens", "chunks", "stats", "engine")


class SavedRunError(ValueError):
    """A file that is not a saved run this code can replay; the message says what is wrong, in
    words a person acts on (which field, what it must be)."""


@dataclass(frozen=True)
class SavedChunk:
    """One chunk frame of a sample as the client got it."""

    at: float
    """Seconds after the request started on the server that the chunk reached the server from the
    engine (the frame's `at` less the `accepted` frame's)."""
    text: str
    tokens: int
    logprobs: tuple[float, ...] | None = None
    """Its tokens' natural-log probabilities, where the request asked for them and the engine gave
    them (an engine may leave out a token's, so there may be fewer than `tokens`)."""
    alternatives: tuple[Alternatives, ...] | None = None
    """Its tokens' alternatives, where the request asked for them and the engine gave them."""


@dataclass(frozen=True)
class SavedSample:
    """One sample: its chunks in order, how it ended, and the figures measured for it."""

    index: int
    seed: int
    finish_reason: str
    chunks: tuple[SavedChunk, ...]
    stats: Mapping[str, Any] = field(default_factory=dict)
    """The server's figures of the sample (its `finish` frame's `stats`: TTFT, TPOT, ITL, ...)."""
    engine: Mapping[str, Any] = field(default_factory=dict)
    """The engine's own figures of the sample (the `finish` frame's `engine`), where it sent any."""

    @property
    def text(self) -> str:
        """The sample's whole text."""
        return "".join(chunk.text for chunk in self.chunks)

    @property
    def tokens(self) -> int:
        """The sample's tokens, over all its chunks."""
        return sum(chunk.tokens for chunk in self.chunks)


@dataclass(frozen=True)
class Continues:
    """Where a run continues an earlier run of the same file: that run's position, and the text
    from its tree's root to the end of the branch continued."""

    run: int
    text: str
    chosen: str = ""
    """The token chosen by hand that `text` ends with, where the run branched on an alternative."""


@dataclass(frozen=True)
class SavedRun:
    """One request and its samples, as kept in a saved run file."""

    prompt: str
    prompt_format: str
    system: str
    format_reason: str
    n: int
    params: SamplingParams
    """Every sampling setting the request ran with; `seed` is the one the server resolved."""
    engine: str
    model: str
    samples: tuple[SavedSample, ...]
    stats: Mapping[str, Any] = field(default_factory=dict)
    """The request's figures (its `done` frame's `stats`)."""
    source: Mapping[str, str] = field(default_factory=dict)
    """Where the run was recorded, in words: the machine, the program that recorded it, a note."""
    prefix: str = ""
    """The text the samples continued from (a continuation of a branch); empty: none."""
    continues: Continues | None = None
    """The earlier run of the file whose branch this run continues (None: a run of its own)."""


# Writing.


def saved_run_dict(run: SavedRun) -> dict[str, Any]:
    """The run as the JSON object of a file of that one run (docs/protocol.md, "Saved runs")."""
    return saved_runs_dict([run], run.source)


def saved_runs_dict(runs: list[SavedRun] | tuple[SavedRun, ...], source: Mapping[str, str]) -> dict[str, Any]:
    """`runs` (a run and the continuations of its branches, in the order they ran) as the JSON
    object of one file, `source` saying where they were recorded."""
    return {
        "kind": SAVED_RUN_KIND,
        "version": SAVED_RUN_VERSION,
        "source": dict(source),
        "runs": [_run_dict(run) for run in runs],
    }


def _run_dict(run: SavedRun) -> dict[str, Any]:
    params = run.params
    continues = run.continues
    return {
        "engine": run.engine,
        "model": run.model,
        "prompt": {
            "text": run.prompt,
            "format": run.prompt_format,
            "system": run.system,
            "format_reason": run.format_reason,
            "prefix": run.prefix,
        },
        "continues": None if continues is None else _continues_dict(continues),
        "settings": {
            "n": run.n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "seed": params.seed,
            "stop": list(params.stop),
            "logprobs": params.logprobs,
            **({"alternatives": params.alternatives} if params.alternatives else {}),
        },
        "samples": [_sample_dict(sample) for sample in run.samples],
        "stats": dict(run.stats),
    }


def _continues_dict(continues: Continues) -> dict[str, Any]:
    where: dict[str, Any] = {"run": continues.run, "text": continues.text}
    if continues.chosen:
        where["chosen"] = continues.chosen
    return where


def _sample_dict(sample: SavedSample) -> dict[str, Any]:
    chunks: list[list[Any]] = []
    for chunk in sample.chunks:
        entry: list[Any] = [round(chunk.at, AT_DIGITS), chunk.text, chunk.tokens]
        if chunk.logprobs is not None:
            entry.append([round(value, LOGPROB_DIGITS) for value in chunk.logprobs])
            if chunk.alternatives is not None:
                entry.append(
                    [
                        [drawn, [[token, round(value, LOGPROB_DIGITS)] for token, value in top]]
                        for drawn, top in chunk.alternatives
                    ]
                )
        chunks.append(entry)
    return {
        "index": sample.index,
        "seed": sample.seed,
        "finish_reason": sample.finish_reason,
        "text": sample.text,
        "tokens": sample.tokens,
        "chunks": chunks,
        "stats": dict(sample.stats),
        "engine": dict(sample.engine),
    }


def saved_run_json(run: SavedRun, indent: int | None = None) -> str:
    """The run as the text of a saved run file of that one run (compact, or indented by `indent`)."""
    return saved_runs_json([run], run.source, indent)


def saved_runs_json(
    runs: list[SavedRun] | tuple[SavedRun, ...], source: Mapping[str, str], indent: int | None = None
) -> str:
    """`runs` as the text of one saved run file (compact, or indented by `indent`); chunks stay one
    to a line when indented, so a file is both short and readable."""
    data = saved_runs_dict(runs, source)
    if indent is None:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    pad = " " * indent
    lines = ["{"]
    for key in ("kind", "version", "source"):
        lines.append(f"{pad}{json.dumps(key)}: {json.dumps(data[key], ensure_ascii=False)},")
    lines.append(f'{pad}"runs": [')
    for position, run in enumerate(data["runs"]):
        lines.append(f"{pad * 2}{{")
        items = list(run.items())
        for number, (key, value) in enumerate(items):
            comma = "," if number < len(items) - 1 else ""
            if key != "samples":
                lines.append(f"{pad * 3}{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
                continue
            lines.append(f'{pad * 3}"samples": [')
            for index, sample in enumerate(value):
                chunks = sample.pop("chunks")
                head = json.dumps(sample, ensure_ascii=False)[:-1]
                body = f",\n{pad * 5}".join(json.dumps(chunk, ensure_ascii=False) for chunk in chunks)
                tail = "," if index < len(value) - 1 else ""
                lines.append(f'{pad * 4}{head}, "chunks": [\n{pad * 5}{body}\n{pad * 4}]}}{tail}')
            lines.append(f"{pad * 3}]{comma}")
        lines.append(f"{pad * 2}}}" + ("," if position < len(data["runs"]) - 1 else ""))
    lines.append(f"{pad}]")
    lines.append("}")
    return "\n".join(lines) + "\n"

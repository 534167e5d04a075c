"""Saved runs, without I/O: one request's samples as a JSON file to keep, share and replay.

A saved run holds what a request asked (prompt, format, system prompt, n and every sampling
setting), what ran it (engine and model), and per sample its text, its chunks with the time each
reached the server and their tokens' log probabilities (where the request asked for them), its
seed, finish reason, the server's figures and the engine's own. `RunRecorder` builds one from the
frames a client received (the page's Download run, scripts/record_run.py); `parse_saved_run` reads
and checks one, strictly, so that anything the replay engine (`backend.engines.replay`) streams is
a run the backend could have sent; `saved_run_json` writes it. The format is in docs/protocol.md,
"Saved runs".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config.settings import (
    SEED_MAX,
    STOP_CHARS_MAX,
    STOP_STRINGS_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
)
from backend.json_values import is_int, is_number, reject_constant
from backend.vocabulary import ALTERNATIVES_MAX, FINISH_REASONS, PROMPT_FORMATS, Alternatives, SamplingParams

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


# Reading.


def parse_saved_run(data: str | bytes) -> SavedRun:
    """The one run of a saved run file; SavedRunError says why it is not one, or that the file holds
    several (a run and its continuations: `parse_saved_runs`)."""
    return _only(parse_saved_runs(data))


def _only(runs: tuple[SavedRun, ...]) -> SavedRun:
    if len(runs) != 1:
        raise SavedRunError(
            f"the file holds {len(runs)} runs (a run and its continuations); one run is replayed here: "
            "the page's Replay a saved run replays them all, in order"
        )
    return runs[0]


def parse_saved_runs(data: str | bytes) -> tuple[SavedRun, ...]:
    """The runs of a saved run file, in order; SavedRunError says why it is not one."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > SAVED_RUN_BYTES_MAX:
        raise SavedRunError(
            f"the file has {size:,} bytes; a saved run has at most {SAVED_RUN_BYTES_MAX:,} "
            "(SAVED_RUN_BYTES_MAX)"
        )
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise SavedRunError("the file is not UTF-8 text, so not a saved run (a JSON file)") from None
    try:
        value = json.loads(text, parse_constant=reject_constant)
    except ValueError as exc:
        raise SavedRunError(f"the file is not JSON: {exc}") from None
    except RecursionError:
        raise SavedRunError("the file is nested too deeply to be a saved run") from None
    return saved_runs_from_dict(value)


def saved_run_from_dict(value: Any) -> SavedRun:
    """The one run of a saved run file from its parsed JSON, as `parse_saved_run`."""
    return _only(saved_runs_from_dict(value))


def saved_runs_from_dict(value: Any) -> tuple[SavedRun, ...]:
    """The runs of a saved run file from its parsed JSON (`saved_runs_dict`'s shape, or version 1's
    one run), checked field by field and for agreement between fields; SavedRunError names the first
    thing wrong."""
    if not isinstance(value, dict):
        raise SavedRunError("the file must be a JSON object (a saved run)")
    # What the file is, and its version, first: a file of another version has other fields.
    if value.get("kind") != SAVED_RUN_KIND:
        raise SavedRunError(
            f'"kind" is {value.get("kind")!r}, so the file is not a saved run ("kind": "{SAVED_RUN_KIND}")'
        )
    version = value.get("version")
    if version not in READ_VERSIONS or not is_int(version):
        raise SavedRunError(
            f'"version" is {version!r}; this dashboard reads saved runs of version '
            f"{' or '.join(map(str, READ_VERSIONS))}"
        )
    if version == 1:
        top = _object(value, "the file", TOP_FIELDS, required=TOP_FIELDS)
        return (_run(top, "", _source(top["source"]), PROMPT_FIELDS, ()),)
    top = _object(value, "the file", FILE_FIELDS, required=FILE_FIELDS)
    source = _source(top["source"])
    runs = top["runs"]
    if not isinstance(runs, list) or not 1 <= len(runs) <= RUNS_MAX:
        raise SavedRunError(f'"runs" must be a list of 1 to {RUNS_MAX} runs')
    parsed: list[SavedRun] = []
    for position, run in enumerate(runs):
        name = f"runs[{position}]."
        parsed.append(
            _run(
                _object(run, f'"runs[{position}]"', RUN_FIELDS, RUN_FIELDS),
                name,
                source,
                PROMPT_FIELDS_V2,
                parsed,
            )
        )
    return tuple(parsed)


def _run(
    top: dict[str, Any],
    name: str,
    source: dict[str, str],
    prompt_fields: tuple[str, ...],
    earlier: list[SavedRun] | tuple[SavedRun, ...],
) -> SavedRun:
    """One run's fields (a version 1 file's top, or an entry of "runs", its names prefixed with
    `name`), after the `earlier` runs of its file."""
    engine = _string(top["engine"], f'"{name}engine"', 200, blank=False)
    model = _string(top["model"], f'"{name}model"', 1000)
    prompt = _object(top["prompt"], f'"{name}prompt"', prompt_fields, required=prompt_fields)
    text = _string(prompt["text"], f'"{name}prompt.text"', PROMPT_CHARS_MAX, blank=False)
    prompt_format = prompt["format"]
    if prompt_format not in PROMPT_FORMATS:
        raise SavedRunError(
            f'"{name}prompt.format" must be one of {", ".join(PROMPT_FORMATS)}, got {prompt_format!r}'
        )
    system = _string(prompt["system"], f'"{name}prompt.system"', PROMPT_CHARS_MAX)
    if system and prompt_format == "raw":
        raise SavedRunError(f'"{name}prompt.system" must be empty with "prompt.format": "raw"')
    format_reason = _string(prompt["format_reason"], f'"{name}prompt.format_reason"', 1000)
    prefix = _string(prompt.get("prefix", ""), f'"{name}prompt.prefix"', PROMPT_CHARS_MAX)
    continues = _continues(top.get("continues"), name, earlier, text, prefix)
    try:
        n, params = _settings(top["settings"])
        samples = top["samples"]
        if not isinstance(samples, list):
            raise SavedRunError('"samples" must be a list')
        if len(samples) != n:
            raise SavedRunError(
                f'"settings.n" is {n} but "samples" has {len(samples)}; a saved run has n samples'
            )
        parsed = tuple(_sample(sample, position, params) for position, sample in enumerate(samples))
        stats = _figures(top["stats"], '"stats"')
    except SavedRunError as exc:
        if not name:
            raise
        raise SavedRunError(f"{name[:-1]}: {exc}") from None
    return SavedRun(
        prompt=text,
        prompt_format=prompt_format,
        system=system,
        format_reason=format_reason,
        n=n,
        params=params,
        engine=engine,
        model=model,
        samples=parsed,
        stats=stats,
        source=source,
        prefix=prefix,
        continues=continues,
    )


def _continues(
    value: Any, name: str, earlier: list[SavedRun] | tuple[SavedRun, ...], text: str, prefix: str
) -> Continues | None:
    """A run's "continues": null, or an earlier run of the file (same prompt) and the text of the
    branch continued, which with that run's prefix is this run's."""
    if value is None:
        if prefix and not name:
            raise SavedRunError('a version 1 run has no "prompt.prefix"')
        return None
    where = _object(value, f'"{name}continues"', CONTINUES_FIELDS_ALL, CONTINUES_FIELDS)
    if not earlier:
        raise SavedRunError(f'"{name}continues" names an earlier run, but the file has none before it')
    position = _integer(where["run"], f'"{name}continues.run"', 0, len(earlier) - 1)
    branch = _string(where["text"], f'"{name}continues.text"', PROMPT_CHARS_MAX)
    parent = earlier[position]
    if parent.prompt != text:
        raise SavedRunError(
            f'"{name}prompt.text" is not the prompt of the run it continues (runs[{position}])'
        )
    if parent.prefix + branch != prefix:
        raise SavedRunError(
            f'"{name}prompt.prefix" must be runs[{position}]\'s prefix followed by "continues.text"'
        )
    chosen = _string(where.get("chosen", ""), f'"{name}continues.chosen"', PROMPT_CHARS_MAX)
    if not branch.endswith(chosen):
        raise SavedRunError(
            f'"{name}continues.text" must end with "continues.chosen", the token chosen by hand'
        )
    return Continues(position, branch, chosen)


def _object(value: Any, name: str, known: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    """`value` as an object holding every `required` field and no field not `known`."""
    if not isinstance(value, dict):
        raise SavedRunError(f"{name} must be a JSON object")
    missing = [key for key in required if key not in value]
    if missing:
        raise SavedRunError(f'{name} has no "{missing[0]}"; a saved run has: {", ".join(required)}')
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise SavedRunError(f'{name} has an unknown field "{unknown[0]}"; known: {", ".join(known)}')
    return value


def _string(value: Any, name: str, limit: int, blank: bool = True) -> str:
    if not isinstance(value, str):
        raise SavedRunError(f"{name} must be a string")
    if not blank and not value.strip():
        raise SavedRunError(f"{name} is empty")
    if len(value) > limit:
        raise SavedRunError(f"{name} has {len(value):,} characters; the limit is {limit:,}")
    return value


def _integer(value: Any, name: str, low: int, high: int) -> int:
    if not is_int(value) or not low <= value <= high:
        raise SavedRunError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


def _number(value: Any, name: str, low: float, high: float, low_open: bool = False) -> float:
    if not is_number(value) or value > high or value < low or (low_open and value == low):
        interval = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise SavedRunError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


def _source(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SavedRunError('"source" must be a JSON object of strings (where the run was recorded)')
    if len(value) > SOURCE_FIELDS_MAX:
        raise SavedRunError(f'"source" has {len(value)} fields; the limit is {SOURCE_FIELDS_MAX}')
    for key, item in value.items():
        _string(key, '"source" field name', 100)
        _string(item, f'"source.{key}"', SOURCE_CHARS_MAX)
    return dict(value)


def _figures(value: Any, name: str) -> dict[str, Any]:
    """Measured figures (the server's or the engine's): an object, kept as it is."""
    if not isinstance(value, dict):
        raise SavedRunError(f"{name} must be a JSON object (figures, possibly empty)")
    return value


def _settings(value: Any) -> tuple[int, SamplingParams]:
    settings = _object(value, '"settings"', SETTINGS_FIELDS_ALL, required=SETTINGS_FIELDS)
    n = _integer(settings["n"], '"settings.n"', 1, N_MAX)
    stop = settings["stop"]
    if (
        not isinstance(stop, list)
        or len(stop) > STOP_STRINGS_MAX
        or not all(isinstance(s, str) and 0 < len(s) <= STOP_CHARS_MAX for s in stop)
    ):
        raise SavedRunError(
            f'"settings.stop" must be a list of at most {STOP_STRINGS_MAX} strings of 1 to '
            f"{STOP_CHARS_MAX} characters"
        )
    logprobs = settings["logprobs"]
    if not isinstance(logprobs, bool):
        raise SavedRunError('"settings.logprobs" must be true or false')
    params = SamplingParams(
        max_tokens=_integer(settings["max_tokens"], '"settings.max_tokens"', 1, TOKENS_MAX),
        temperature=_number(settings["temperature"], '"settings.temperature"', 0, TEMPERATURE_MAX),
        top_p=_number(settings["top_p"], '"settings.top_p"', 0, 1, low_open=True),
        seed=_integer(settings["seed"], '"settings.seed"', 0, SEED_MAX - N_MAX),
        top_k=_integer(settings["top_k"], '"settings.top_k"', 0, TOP_K_MAX),
        stop=tuple(stop),
        logprobs=logprobs,
        alternatives=_integer(
            settings.get("alternatives", 0), '"settings.alternatives"', 0, ALTERNATIVES_MAX
        ),
    )
    if params.alternatives and not logprobs:
        raise SavedRunError('"settings.alternatives" needs "settings.logprobs" true')
    return n, params


def _sample(value: Any, position: int, params: SamplingParams) -> SavedSample:
    name = f'"samples[{position}]"'
    sample = _object(value, name, SAMPLE_FIELDS, required=SAMPLE_FIELDS)
    if sample["index"] != position or not is_int(sample["index"]):
        raise SavedRunError(f'{name} has "index" {sample["index"]!r}; samples are in order, from 0')
    seed = sample["seed"]
    if seed != params.sample_seed(position) or not is_int(seed):
        raise SavedRunError(
            f'{name} has "seed" {seed!r}; sample {position} of a run with seed {params.seed} has seed '
            f"{params.sample_seed(position)}"
        )
    reason = sample["finish_reason"]
    if reason not in FINISH_REASONS:
        raise SavedRunError(
            f"{name}.finish_reason must be one of {', '.join(FINISH_REASONS)}, got {reason!r}"
        )
    chunks = sample["chunks"]
    if not isinstance(chunks, list):
        raise SavedRunError(f"{name}.chunks must be a list")
    parsed = tuple(_chunk(chunk, f"{name}.chunks[{number}]", params) for number, chunk in enumerate(chunks))
    for number in range(1, len(parsed)):
        if parsed[number].at < parsed[number - 1].at:
            raise SavedRunError(
                f"{name}.chunks[{number}] is earlier than the chunk before it; chunks are in order"
            )
    saved = SavedSample(
        index=position,
        seed=seed,
        finish_reason=reason,
        chunks=parsed,
        stats=_figures(sample["stats"], f"{name}.stats"),
        engine=_figures(sample["engine"], f"{name}.engine"),
    )
    tokens = _integer(sample["tokens"], f"{name}.tokens", 0, TOKENS_MAX)
    if tokens != saved.tokens:
        raise SavedRunError(f"{name}.tokens is {tokens} but its chunks hold {saved.tokens} tokens")
    if tokens > params.max_tokens:
        raise SavedRunError(
            f"{name} has {tokens} tokens, more than the run's max_tokens ({params.max_tokens})"
        )
    text = _string(sample["text"], f"{name}.text", TOKENS_MAX * 64)
    if text != saved.text:
        raise SavedRunError(f"{name}.text is not its chunks' texts put together")
    return saved


def _chunk(value: Any, name: str, params: SamplingParams) -> SavedChunk:
    if not isinstance(value, list) or len(value) not in (3, 4, 5):
        raise SavedRunError(
            f"{name} must be [at, text, tokens], [at, text, tokens, [logprob, ...]] or "
            "[at, text, tokens, [logprob, ...], [alternatives, ...]]"
        )
    at = _number(value[0], f"{name}'s time", 0, DURATION_MAX_S)
    text = _string(value[1], f"{name}'s text", TOKENS_MAX * 64)
    tokens = _integer(value[2], f"{name}'s tokens", 0, TOKENS_MAX)
    if not text and not tokens:
        raise SavedRunError(f"{name} has neither text nor tokens")
    logprobs = None
    if len(value) >= 4:
        if not params.logprobs:
            raise SavedRunError(f'{name} has logprobs, but the run\'s "settings.logprobs" is false')
        raw = value[3]
        if not isinstance(raw, list) or not all(is_number(x) and x <= 0 for x in raw):
            raise SavedRunError(f"{name}'s logprobs must be a list of numbers, each at most 0")
        if len(raw) > tokens:
            raise SavedRunError(f"{name} has {len(raw)} logprobs for {tokens} tokens")
        logprobs = tuple(float(x) for x in raw)
    alternatives = _chunk_alternatives(value[4], name, params, tokens) if len(value) == 5 else None
    return SavedChunk(at, text, tokens, logprobs, alternatives=alternatives)


def _chunk_alternatives(raw: Any, name: str, params: SamplingParams, tokens: int) -> tuple[Alternatives, ...]:
    """A chunk's alternatives, `[[drawn, [[token, logprob], ...]], ...]`, one per token at most,
    each listing at most the run's k (`settings.alternatives`)."""
    if not params.alternatives:
        raise SavedRunError(f'{name} has alternatives, but the run\'s "settings.alternatives" is 0 or absent')
    shape = f"{name}'s alternatives must be [[drawn, [[token, logprob], ...]], ...], at most {tokens}"
    if not isinstance(raw, list) or len(raw) > tokens:
        raise SavedRunError(shape)
    found: list[Alternatives] = []
    for entry in raw:
        if not (
            isinstance(entry, list) and len(entry) == 2 and is_int(entry[0]) and isinstance(entry[1], list)
        ):
            raise SavedRunError(shape)
        top = entry[1]
        if len(top) > params.alternatives or not -1 <= entry[0] < len(top):
            raise SavedRunError(f"{shape}, each listing at most {params.alternatives}, drawn -1 or a place")
        if not all(
            isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and is_number(pair[1])
            for pair in top
        ):
            raise SavedRunError(shape)
        found.append((int(entry[0]), tuple((str(token), float(value)) for token, value in top)))
    return tuple(found)


def load_saved_run(path: str | Path) -> SavedRun:
    """The one saved run in the file at `path`, as `load_saved_runs`."""
    return _only(load_saved_runs(path))


def load_saved_runs(path: str | Path) -> tuple[SavedRun, ...]:
    """The saved runs in the file at `path`; SavedRunError says why it is not one (or cannot be
    read), without naming the file (the caller does: a page's upload has a temporary name)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > SAVED_RUN_BYTES_MAX:
            raise SavedRunError(
                f"the file has {size:,} bytes; a saved run has at most {SAVED_RUN_BYTES_MAX:,} "
                "(SAVED_RUN_BYTES_MAX)"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise SavedRunError(f"the file cannot be read: {exc.strerror or exc}") from None
    return parse_saved_runs(data)

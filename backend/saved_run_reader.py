"""Saved runs read back, without I/O beyond a file's bytes: strictly checked, so that anything the
replay engine (`backend.engines.replay`) streams is a run the backend could have sent. What a saved
run holds and how it is written: backend.saved_run; the format: docs/protocol.md, "Saved runs".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.config.settings import SEED_MAX, STOP_CHARS_MAX, STOP_STRINGS_MAX, TEMPERATURE_MAX, TOP_K_MAX
from backend.json_values import is_int, is_number, reject_constant
from backend.saved_run import (
    CONTINUES_FIELDS,
    CONTINUES_FIELDS_ALL,
    DURATION_MAX_S,
    FILE_FIELDS,
    N_MAX,
    PROMPT_CHARS_MAX,
    PROMPT_FIELDS,
    PROMPT_FIELDS_V2,
    READ_VERSIONS,
    RUN_FIELDS,
    RUNS_MAX,
    SAMPLE_FIELDS,
    SAVED_RUN_BYTES_MAX,
    SAVED_RUN_KIND,
    SETTINGS_FIELDS,
    SETTINGS_FIELDS_ALL,
    SOURCE_CHARS_MAX,
    SOURCE_FIELDS_MAX,
    TOKENS_MAX,
    TOP_FIELDS,
    Continues,
    SavedChunk,
    SavedRun,
    SavedRunError,
    SavedSample,
)
from backend.vocabulary import ALTERNATIVES_MAX, FINISH_REASONS, PROMPT_FORMATS, Alternatives, SamplingParams


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

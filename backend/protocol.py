"""Websocket protocol v2, without I/O: client frames built, parsed and validated; server frames built.

Client to server: `generate`, `replay` (a saved run, `backend.saved_run`, streamed again as a
request), `cancel` and `export_trace`, built by every client with `generate_frame`, `replay_frame`,
`cancel_frame` and `export_trace_frame`. Server to client: `accepted`,
`queued`, `chunk`, `finish`, `done`, `trace`, `trace_export`, `error`. Every rejection is a
`ProtocolError` with a stable `code` and a message a person can act on; the server turns it into an
`error` frame and keeps the connection open.

A server message is one frame (a JSON object) or a batch of frames (a JSON array of them, in
order): the server writes the frames that are ready together as one message (`batch_messages`),
and clients read every message with `frames_in`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backend.config.settings import (
    BLOCK_MS_MAX,
    DEFAULT_BLOCK_MS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    SEED_MAX,
    STOP_CHARS_MAX,
    STOP_STRINGS_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    Limits,
)
from backend.json_values import is_int, is_number, reject_constant
from backend.saved_run import SavedRun, SavedRunError, saved_run_from_dict
from backend.vocabulary import ALTERNATIVES_MAX, PROMPT_FORMATS, Alternatives, SamplingParams

PROTOCOL_VERSION = 2
"""2: a server message may be a batch of frames (a JSON array); 1 sent one frame per message."""

BATCH_BYTES_MAX = 256 * 1024
"""A batch message holds frames up to about this many bytes (a frame bigger than this goes alone):
well under the 1 MiB websocket clients accept by default, and large enough that a send writes every
frame that is ready at n = 64 in one message."""

PARAM_NAMES = ("max_tokens", "temperature", "top_p", "seed", "top_k", "stop")

CONSUMER_MODES = ("cooperative", "greedy", "blocking")
"""How the server's task consumes the engine stream (teaching control, see docs/trace.md)."""

FANOUTS = ("n", "requests")
"""One engine request with n samples, or n engine requests with n=1 each."""

REPLAY_SPEED_MAX = 100.0
"""Fastest replay, as a multiple of the recorded pace."""

OUTPUT_KINDS = ("delta", "cumulative")
"""What the server's consumer reads from the engine per output: only the new text (`delta`), or the
whole text so far (`cumulative`, as vLLM's RequestOutputKind.CUMULATIVE): a teaching control."""


class ProtocolError(Exception):
    """A frame the server will not act on; becomes an `error` frame on the same connection."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Consumer:
    """How the server consumes a request's stream: after each chunk, yield, don't, or block."""

    mode: str = "cooperative"
    block_ms: float = DEFAULT_BLOCK_MS

    @property
    def blocks(self) -> bool:
        """Whether this consumer blocks the loop (the "blocking" mode with a block above 0 ms)."""
        return self.mode == "blocking" and self.block_ms > 0


@dataclass(frozen=True)
class Replay:
    """What a `replay` frame asks: a saved run, streamed `speed` times as fast as it was recorded."""

    run: SavedRun
    speed: float = 1.0


@dataclass(frozen=True)
class GenerateCommand:
    """A valid `generate` frame."""

    id: str
    prompt: str
    n: int
    params: SamplingParams
    consumer: Consumer = Consumer()
    fanout: str = "n"
    trace: bool = True
    format: str | None = None
    """"chat" or "raw" as asked; None: chat where the model has a chat template, else raw."""
    system: str = ""
    """The system prompt of a chat prompt; empty: the chat template's own default."""
    prefix: str = ""
    """Text the samples continue from (`Prompt.prefix`): the start of the assistant's answer in the
    chat format, more text after the prompt raw; empty: none."""
    output_kind: str = "delta"
    """What the consumer reads per engine output (OUTPUT_KINDS); client frames carry deltas either way."""
    cancel_after: int | None = None
    """Each sample is cancelled from the consumer's side once it has this many tokens (None: never)."""
    replay: Replay | None = None
    """A `replay` frame's saved run: prompt, n and params are the run's, and it streams from a
    replay engine (`backend.engines.replay`) instead of the server's."""


@dataclass(frozen=True)
class ExportTraceCommand:
    """A valid `export_trace` frame: the trace of request `id`, in Chrome trace-event format."""

    id: str


@dataclass(frozen=True)
class CancelCommand:
    """A valid `cancel` frame: every sample of `id`, or only sample `index`."""

    id: str
    index: int | None = None


ClientCommand = GenerateCommand | CancelCommand | ExportTraceCommand


def parse_client_frame(data: str | bytes, limits: Limits) -> ClientCommand:
    """Parse one websocket message from a client, or raise ProtocolError saying what is wrong."""
    if isinstance(data, bytes):
        raise ProtocolError("bad_frame", "binary frames are not supported; send JSON as text frames")
    size = len(data.encode("utf-8", "surrogatepass"))
    # Only a replay frame may be larger than max_frame_bytes: any other is refused before parsing.
    if size > max(limits.max_frame_bytes, limits.max_replay_frame_bytes) or (
        size > limits.max_frame_bytes and '"replay"' not in data
    ):
        raise ProtocolError("frame_too_large", _too_large(limits, size))
    try:
        frame = json.loads(data, parse_constant=reject_constant)
    except ValueError as exc:
        raise ProtocolError("bad_json", f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("bad_json", "frame is nested too deeply to parse") from None
    if not isinstance(frame, dict):
        raise ProtocolError("bad_frame", 'frame must be a JSON object with a "type" field')
    request_id = frame.get("id") if isinstance(frame.get("id"), str) else None
    kind = frame.get("type")
    if kind != "replay" and size > limits.max_frame_bytes:
        raise ProtocolError("frame_too_large", _too_large(limits, size), request_id)
    if kind == "generate":
        return _parse_generate(frame, limits)
    if kind == "replay":
        return _parse_replay(frame, limits)
    if kind == "cancel":
        return _parse_cancel(frame, limits)
    if kind == "export_trace":
        return ExportTraceCommand(_parse_id(frame, limits))
    known = '"generate", "replay", "cancel" or "export_trace"'
    if "type" not in frame:
        raise ProtocolError("missing_field", f'frame has no "type"; use {known}', request_id)
    raise ProtocolError("unknown_type", f"unknown frame type {kind!r}; use {known}", request_id)


def _too_large(limits: Limits, size: int) -> str:
    return (
        f"frame is larger than {limits.max_frame_bytes} bytes ({limits.max_replay_frame_bytes} for "
        f"a replay), it has {size}; shorten the prompt, or replay a smaller run"
    )


def _parse_id(frame: dict[str, Any], limits: Limits) -> str:
    if "id" not in frame:
        raise ProtocolError("missing_field", f'"{frame["type"]}" frame needs an "id" (a string)')
    request_id = frame["id"]
    if not isinstance(request_id, str) or not request_id:
        raise ProtocolError("bad_field", '"id" must be a non-empty string')
    if len(request_id) > limits.max_id_chars:
        raise ProtocolError("bad_field", f'"id" must be at most {limits.max_id_chars} characters')
    return request_id


Fail = Callable[[str, str], ProtocolError]
"""Builds the ProtocolError of one frame (its request id filled in) from a code and a message."""


def _parse_generate(frame: dict[str, Any], limits: Limits) -> GenerateCommand:
    request_id = _parse_id(frame, limits)

    def fail(code: str, message: str) -> ProtocolError:
        return ProtocolError(code, message, request_id)

    prompt, prompt_format, system = _parse_prompt(frame, limits, fail)
    prefix = _parse_prefix(frame, limits, len(prompt) + len(system), fail)
    n = _parse_n(frame, limits, fail)
    params = _parse_params(frame, limits, fail)
    logprobs = frame.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise fail("bad_field", '"logprobs" must be true or false')
    params = replace(params, logprobs=logprobs, alternatives=_parse_alternatives(frame, logprobs, fail))
    return _with_options(
        GenerateCommand(
            id=request_id,
            prompt=prompt,
            n=n,
            params=params,
            format=prompt_format,
            system=system,
            prefix=prefix,
        ),
        frame,
        fail,
    )


def _parse_replay(frame: dict[str, Any], limits: Limits) -> GenerateCommand:
    """A `replay` frame: its saved run checked (`saved_run_from_dict`) and against this server's
    limits, as the request it becomes."""
    request_id = _parse_id(frame, limits)

    def fail(code: str, message: str) -> ProtocolError:
        return ProtocolError(code, message, request_id)

    if "run" not in frame:
        raise fail("missing_field", '"replay" needs a "run" (a saved run, docs/protocol.md "Saved runs")')
    try:
        run = saved_run_from_dict(frame["run"])
    except SavedRunError as exc:
        raise fail("bad_run", f"the saved run cannot be replayed: {exc}") from None
    check_replayable(run, limits, request_id)
    speed = frame.get("speed", 1.0)
    if not is_number(speed) or not 0 < speed <= REPLAY_SPEED_MAX:
        raise fail(
            "bad_field", f'"speed" must be a number above 0, at most {REPLAY_SPEED_MAX:g}, got {speed!r}'
        )
    command = GenerateCommand(
        id=request_id,
        prompt=run.prompt,
        n=run.n,
        params=run.params,
        format=run.prompt_format,
        system=run.system,
        replay=Replay(run, float(speed)),
    )
    return _with_options(command, frame, fail)


def check_replayable(run: SavedRun, limits: Limits, request_id: str | None = None) -> None:
    """Raise ProtocolError if this server's limits do not let it replay `run` (n, max_tokens, prompt)."""
    if run.n > limits.n_max:
        raise ProtocolError(
            "n_out_of_range",
            f"the saved run has n = {run.n}; this server replays at most {limits.n_max}",
            request_id,
        )
    if run.params.max_tokens > limits.max_tokens_max:
        raise ProtocolError(
            "max_tokens_out_of_range",
            f"the saved run has max_tokens {run.params.max_tokens}; this server allows "
            f"{limits.max_tokens_max}",
            request_id,
        )
    if len(run.prompt) + len(run.system) > limits.max_prompt_chars:
        raise ProtocolError(
            "prompt_too_long",
            f"the saved run's prompt has {len(run.prompt) + len(run.system)} characters; "
            f"this server allows {limits.max_prompt_chars}",
            request_id,
        )


def replayed_command(command: GenerateCommand, run: SavedRun, limits: Limits) -> GenerateCommand:
    """`command` (a `generate` to an engine that plays `run` whatever it is asked, `Engine.plays`)
    with the run's prompt, n and settings in place of its own; its consumer, fan-out and trace stay,
    and `cancel_after` where the run's max_tokens allows it. ProtocolError where this server's limits
    do not let it replay the run."""
    check_replayable(run, limits, command.id)
    cancel_after = command.cancel_after
    if cancel_after is not None and cancel_after >= run.params.max_tokens:
        cancel_after = None
    return replace(
        command,
        prompt=run.prompt,
        n=run.n,
        params=run.params,
        format=run.prompt_format,
        system=run.system,
        cancel_after=cancel_after,
    )


def _with_options(command: GenerateCommand, frame: dict[str, Any], fail: Fail) -> GenerateCommand:
    """`command` with the frame's options: consumer, fanout, trace, output kind, cancel_after."""
    params = command.params
    consumer = _parse_consumer(frame.get("consumer"), fail)
    fanout = frame.get("fanout", "n")
    if fanout not in FANOUTS:
        raise fail("bad_field", f'"fanout" must be one of {", ".join(FANOUTS)}, got {fanout!r}')
    trace = frame.get("trace", True)
    if not isinstance(trace, bool):
        raise fail("bad_field", '"trace" must be true or false')
    output_kind = frame.get("output_kind", "delta")
    if output_kind not in OUTPUT_KINDS:
        raise fail(
            "bad_field", f'"output_kind" must be one of {", ".join(OUTPUT_KINDS)}, got {output_kind!r}'
        )
    cancel_after = frame.get("cancel_after")
    if cancel_after is not None and (not is_int(cancel_after) or not 1 <= cancel_after < params.max_tokens):
        raise fail(
            "bad_field",
            f'"cancel_after" must be a whole number of tokens from 1 to {params.max_tokens - 1} (under '
            f"max_tokens, {params.max_tokens}), or left out; got {cancel_after!r}",
        )
    return replace(
        command,
        consumer=consumer,
        fanout=fanout,
        trace=trace,
        output_kind=output_kind,
        cancel_after=cancel_after,
    )


def _parse_prompt(frame: dict[str, Any], limits: Limits, fail: Fail) -> tuple[str, str | None, str]:
    """The prompt, its format (None: the engine's default) and the system prompt."""
    if "prompt" not in frame:
        raise fail("missing_field", '"generate" needs a "prompt" (a string)')
    prompt = frame["prompt"]
    if not isinstance(prompt, str):
        raise fail("bad_field", '"prompt" must be a string')
    if not prompt.strip():
        raise fail("empty_prompt", "the prompt is empty; type something to sample from")
    if len(prompt) > limits.max_prompt_chars:
        raise fail(
            "prompt_too_long",
            f"the prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars}",
        )

    prompt_format = frame.get("format")
    if prompt_format is not None and prompt_format not in PROMPT_FORMATS:
        raise fail(
            "bad_field",
            f'"format" must be "chat" (the model\'s chat template) or "raw" (plain completion), '
            f"got {prompt_format!r}",
        )
    system = frame.get("system", "")
    if system is None:
        system = ""
    if not isinstance(system, str):
        raise fail("bad_field", '"system" must be a string')
    if system and prompt_format == "raw":
        raise fail("bad_field", 'a "system" prompt needs the chat format; leave it out with "format": "raw"')
    if len(prompt) + len(system) > limits.max_prompt_chars:
        raise fail(
            "prompt_too_long",
            f"the prompt and system prompt have {len(prompt) + len(system)} characters; "
            f"the limit is {limits.max_prompt_chars}",
        )

    return prompt, prompt_format, system


def _parse_prefix(frame: dict[str, Any], limits: Limits, used: int, fail: Fail) -> str:
    """The text the samples continue from (empty: none); with the prompt and system prompt
    (`used` characters) it must fit the prompt limit."""
    prefix = frame.get("prefix", "")
    if prefix is None:
        return ""
    if not isinstance(prefix, str):
        raise fail("bad_field", '"prefix" must be a string (the text the samples continue from)')
    if used + len(prefix) > limits.max_prompt_chars:
        raise fail(
            "prompt_too_long",
            f"the prompt and the text to continue from have {used + len(prefix)} characters; "
            f"the limit is {limits.max_prompt_chars}",
        )
    return prefix


def _parse_alternatives(frame: dict[str, Any], logprobs: bool, fail: Fail) -> int:
    """How many alternatives each token lists (0: none, the field left out or null); only with
    `logprobs`."""
    k = frame.get("alternatives")
    if k is None:
        return 0
    if not is_int(k):
        raise fail(
            "bad_field", f'"alternatives" must be an integer from 1 to {ALTERNATIVES_MAX}, or left out'
        )
    if not 1 <= k <= ALTERNATIVES_MAX:
        raise fail(
            "alternatives_out_of_range",
            f"alternatives must be between 1 and {ALTERNATIVES_MAX} tokens a position, got {k}",
        )
    if not logprobs:
        raise fail("bad_field", '"alternatives" needs "logprobs": true (token confidence)')
    return int(k)


def _parse_n(frame: dict[str, Any], limits: Limits, fail: Fail) -> int:
    n = frame.get("n", 1)
    if not is_int(n):
        raise fail("bad_field", '"n" must be an integer')
    if not 1 <= n <= limits.n_max:
        raise fail("n_out_of_range", f"n must be between 1 and {limits.n_max}, got {n}")

    return n


def _parse_params(frame: dict[str, Any], limits: Limits, fail: Fail) -> SamplingParams:
    """The sampling parameters, each checked against its range; defaults for those left out."""
    raw_params = frame.get("params", {})
    if raw_params is None:
        raw_params = {}
    if not isinstance(raw_params, dict):
        raise fail("bad_field", '"params" must be an object')
    unknown = sorted(set(raw_params) - set(PARAM_NAMES))
    if unknown:
        raise fail(
            "unknown_param",
            f"unknown parameter {unknown[0]!r}; known: {', '.join(PARAM_NAMES)}",
        )

    max_tokens = raw_params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not is_int(max_tokens):
        raise fail("bad_field", '"max_tokens" must be an integer')
    if not 1 <= max_tokens <= limits.max_tokens_max:
        raise fail(
            "max_tokens_out_of_range",
            f"max_tokens must be between 1 and {limits.max_tokens_max}, got {max_tokens}",
        )

    temperature = raw_params.get("temperature", DEFAULT_TEMPERATURE)
    if not is_number(temperature):
        raise fail("bad_field", '"temperature" must be a number')
    if not 0 <= temperature <= TEMPERATURE_MAX:
        raise fail(
            "temperature_out_of_range",
            f"temperature must be between 0 and {TEMPERATURE_MAX:g}, got {temperature}",
        )

    top_p = raw_params.get("top_p", DEFAULT_TOP_P)
    if not is_number(top_p):
        raise fail("bad_field", '"top_p" must be a number')
    if not 0 < top_p <= 1:
        raise fail("top_p_out_of_range", f"top_p must be in (0, 1], got {top_p}")

    seed, top_k, stop = _parse_seed_top_k_stop(raw_params, limits, fail)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        seed=seed,
        top_k=top_k,
        stop=tuple(stop),
    )


def _parse_seed_top_k_stop(
    raw_params: dict[str, Any], limits: Limits, fail: Fail
) -> tuple[int | None, int, list[str]]:
    """The seed (None: the server picks one), top-k (0: no limit) and stop strings, each checked."""
    seed = raw_params.get("seed")
    if seed is not None:
        if not is_int(seed):
            raise fail("bad_field", '"seed" must be an integer or null')
        if not 0 <= seed <= SEED_MAX - limits.n_max:
            raise fail(
                "seed_out_of_range", f"seed must be between 0 and {SEED_MAX - limits.n_max}, got {seed}"
            )

    top_k = raw_params.get("top_k", 0)
    if not is_int(top_k) or not 0 <= top_k <= TOP_K_MAX:
        raise fail("top_k_out_of_range", f"top_k must be an integer from 0 (no limit) to {TOP_K_MAX}")
    stop = raw_params.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > STOP_STRINGS_MAX
        or not all(isinstance(x, str) and 0 < len(x) <= STOP_CHARS_MAX for x in stop)
    ):
        raise fail(
            "bad_field",
            f'"stop" must be a string or a list of at most {STOP_STRINGS_MAX} non-empty strings '
            f"of at most {STOP_CHARS_MAX} characters",
        )
    return seed, top_k, stop


def _parse_consumer(raw: Any, fail: Fail) -> Consumer:
    if raw is None:
        return Consumer()
    if not isinstance(raw, dict):
        raise fail("bad_field", '"consumer" must be an object like {"mode": "cooperative"}')
    mode = raw.get("mode", "cooperative")
    if mode not in CONSUMER_MODES:
        raise fail("bad_field", f'"consumer.mode" must be one of {", ".join(CONSUMER_MODES)}, got {mode!r}')
    block_ms = raw.get("block_ms", Consumer.block_ms)
    if not is_number(block_ms) or not 0 <= block_ms <= BLOCK_MS_MAX:
        raise fail("bad_field", f'"consumer.block_ms" must be a number from 0 to {BLOCK_MS_MAX:g}')
    return Consumer(mode=mode, block_ms=float(block_ms))


def _parse_cancel(frame: dict[str, Any], limits: Limits) -> CancelCommand:
    request_id = _parse_id(frame, limits)
    index = frame.get("index")
    if index is not None and not is_int(index):
        raise ProtocolError("bad_field", '"index" must be an integer or left out', request_id)
    return CancelCommand(id=request_id, index=index)


def encode_bytes(frame: dict[str, Any]) -> bytes:
    """A server frame as the UTF-8 JSON sent on the wire.

    orjson writes the same compact JSON as `json.dumps(separators=(",", ":"), ensure_ascii=False)`
    up to how a float is spelled (`1e-6` for `1e-06`), and non-finite floats as null, which JSON
    has no other word for. It costs a tenth of json.dumps on a live trace frame (36 us against 650
    at n = 64) and on a finish frame.
    A value orjson does not take (a key that is not a str, an int past 64 bits, a float subclass, a
    lone surrogate) goes through json.dumps, with what UTF-8 cannot carry replaced.
    """
    try:
        return orjson.dumps(frame)
    except TypeError:  # orjson.JSONEncodeError
        text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False, default=str)
        return text.encode("utf-8", "replace")


def batch_messages(frames: list[bytes], limit: int = BATCH_BYTES_MAX) -> list[bytes]:
    """Encoded frames (`encode_bytes`) as the server's messages, in order: a lone frame as itself,
    several as one JSON array, a new array whenever the next frame would take one past `limit`."""
    if len(frames) == 1:
        return frames
    messages: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for frame in frames:
        if batch and size + len(frame) > limit:
            messages.append(frame_batch(batch))
            batch, size = [], 0
        batch.append(frame)
        size += len(frame) + 1
    if batch:
        messages.append(frame_batch(batch))
    return messages


def frame_batch(frames: list[bytes]) -> bytes:
    """Encoded frames as one message: a lone frame as itself, several as a JSON array."""
    return frames[0] if len(frames) == 1 else b"[" + b",".join(frames) + b"]"


def frames_in(message: str | bytes) -> list[dict[str, Any]]:
    """The frames of one server message, in order (a client's reading of `batch_messages`).

    Raises ValueError when the message is not JSON, or not a frame or an array of frames."""
    value = orjson.loads(message)
    frames = value if isinstance(value, list) else [value]
    if not all(isinstance(frame, dict) for frame in frames):
        raise ValueError("a server message is a JSON object (one frame) or an array of objects")
    return frames


def encode(frame: dict[str, Any]) -> str:
    """A server frame as the JSON text sent on the wire (`encode_bytes`, decoded)."""
    return encode_bytes(frame).decode()


GENERATE_OPTIONS = (
    "format",
    "system",
    "prefix",
    "logprobs",
    "alternatives",
    "consumer",
    "fanout",
    "trace",
    "output_kind",
    "cancel_after",
)
"""A `generate` frame's fields besides `id`, `prompt`, `n` and `params`, as the frame spells them."""

REPLAY_OPTIONS = ("speed", "consumer", "fanout", "trace", "output_kind", "cancel_after")
"""A `replay` frame's fields besides `id` and `run`."""


def _client_frame(
    kind: str, request_id: str, known: tuple[str, ...], options: dict[str, Any]
) -> dict[str, Any]:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"a {kind} frame has no field {unknown[0]!r}; its fields: {', '.join(known)}")
    return {"type": kind, "id": request_id, **{k: v for k, v in options.items() if v is not None}}


def generate_frame(
    request_id: str, prompt: str, n: int = 1, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    """A client's `generate` frame: `n` samples of `prompt`, with `params` (PARAM_NAMES) and the frame's
    other fields (GENERATE_OPTIONS, as the frame spells them: `consumer={"mode": "blocking",
    "block_ms": 20}`); a field left None is left out, so the server's default applies. A name the
    protocol does not know is a TypeError where the frame is built, not an error frame later."""
    frame = _client_frame("generate", request_id, GENERATE_OPTIONS, options)
    frame["prompt"] = prompt
    frame["n"] = n
    if params:
        frame["params"] = params
    return frame


def replay_frame(request_id: str, run: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A client's `replay` frame: the saved run `run` (`backend.saved_run`'s JSON object) streamed
    again as request `request_id`, with REPLAY_OPTIONS (`speed`, the consumer, ...) as `generate_frame`."""
    frame = _client_frame("replay", request_id, REPLAY_OPTIONS, options)
    frame["run"] = run
    return frame


def cancel_frame(request_id: str, index: int | None = None) -> dict[str, Any]:
    """A client's `cancel` frame: every sample of the request, or only sample `index` (a column's Stop)."""
    frame: dict[str, Any] = {"type": "cancel", "id": request_id}
    if index is not None:
        frame["index"] = index
    return frame


def export_trace_frame(request_id: str) -> dict[str, Any]:
    """A client's `export_trace` frame: the request's trace, answered with a `trace_export` frame."""
    return {"type": "export_trace", "id": request_id}


def accepted_frame(
    request_id: str,
    n: int,
    engine: str,
    model: str,
    params: SamplingParams,
    *,
    prompt_format: str = "chat",
    format_reason: str = "",
    trace_off: str | None = None,
    at: float | None = None,
    engine_tasks: str = "",
) -> dict[str, Any]:
    """The server took the request; `params` echo what it will run with (the resolved seed too),
    `format` the prompt format it runs in and `format_reason` why; `trace_off`, when the request
    asked for the trace and the server has none, says why; `at` is when the request started, on the
    clock of the chunk frames' `at` (so a client has each chunk's time into the request);
    `engine_tasks` how the engine's task names begin (`Engine.task_prefix`), for the client's trace."""
    frame = {
        "type": "accepted",
        "id": request_id,
        "n": n,
        "engine": engine,
        "model": model,
        "engine_tasks": engine_tasks,
        "format": prompt_format,
        "format_reason": format_reason,
        "params": {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
        },
    }
    if trace_off is not None:
        frame["trace_off"] = trace_off
    if at is not None:
        frame["at"] = to_microseconds(at)
    return frame


def chunk_frame(
    request_id: str,
    index: int,
    text: str,
    tokens: int,
    at: float | None = None,
    logprobs: tuple[float, ...] | None = None,
    alternatives: tuple[Alternatives, ...] | None = None,
) -> dict[str, Any]:
    """New text of sample `index`; `tokens` counts the tokens in `text` (frames may coalesce).

    `at` is when the server got the (first) chunk from the engine, in seconds of the host's
    monotonic clock, so a client on the same host can measure the delivery latency. With
    `logprobs` (the chunk's tokens' log probabilities) the frame carries `"logprobs": [[text,
    [logprob, ...]]]`: pieces of the text, each with its tokens' log probabilities (a frame that
    coalesces chunks has a piece per chunk); with `alternatives` too, each piece carries its
    tokens' alternatives (`logprob_pieces`).
    """
    frame: dict[str, Any] = {
        "type": "chunk",
        "id": request_id,
        "index": index,
        "text": text,
        "tokens": tokens,
    }
    if at is not None:
        frame["at"] = to_microseconds(at)
    if logprobs is not None:
        frame["logprobs"] = logprob_pieces(text, logprobs, alternatives)
    return frame


def logprob_pieces(
    text: str, logprobs: tuple[float, ...], alternatives: tuple[Alternatives, ...] | None = None
) -> list[Any]:
    """A chunk's `logprobs` pieces: `[[text, [logprob, ...]]]`, and with alternatives
    `[[text, [logprob, ...], [[drawn, [[token, logprob], ...]], ...]]]`, one entry per token (the
    engine's tuples as they are: JSON writes them as arrays, and the engine rounded them)."""
    if alternatives is None:
        return [[text, list(logprobs)]]
    return [[text, list(logprobs), alternatives]]


def to_microseconds(seconds: float) -> float:
    """`seconds` to the nearest microsecond, written with at most 6 decimals (round(seconds, 6) in
    half its time; they differ by 1 us in a few of 100,000 values that are within rounding of a tie)."""
    return round(seconds * 1_000_000) / 1_000_000


def finish_frame(request_id: str, index: int, reason: str, stats: dict[str, Any]) -> dict[str, Any]:
    """Sample `index` ended; sent exactly once per index."""
    return {"type": "finish", "id": request_id, "index": index, "reason": reason, "stats": stats}


def done_frame(request_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    """Every sample of the request has finished; the last frame of a request."""
    return {"type": "done", "id": request_id, "stats": stats}


def trace_export_frame(request_id: str, trace_events: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace of one request in Chrome trace-event format (Perfetto opens it)."""
    return {"type": "trace_export", "id": request_id, "traceEvents": trace_events}


def cancel_ack_frame(
    request_id: str, index: int | None, aborting: list[int], t_ms: float | None = None
) -> dict[str, Any]:
    """The server's loop read a `cancel` (of every sample, or of sample `index`): `aborting` lists the
    samples it stops, empty where the request or the sample had already finished; `t_ms` is when
    it was read, on the trace's clock, where the server traces its loop."""
    frame: dict[str, Any] = {"type": "cancel_ack", "id": request_id, "index": index, "aborting": aborting}
    if t_ms is not None:
        frame["t_ms"] = t_ms
    return frame


def queued_frame(request_id: str, position: int) -> dict[str, Any]:
    """The request waits for room in the engine: `position` 1 is next in line; 0 means it started."""
    return {"type": "queued", "id": request_id, "position": position}


def error_frame(code: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """Something the server could not do; the connection stays usable."""
    return {"type": "error", "id": request_id, "code": code, "message": message}

"""Websocket protocol v2, without I/O: client frames parsed and validated into commands.

Client to server: `generate`, `replay` (a saved run, `backend.saved_run`, streamed again as a
request), `cancel` and `export_trace` (built by every client with backend.frames, which also builds
the server's frames and reads its messages). Every rejection is a `ProtocolError` with a stable
`code` and a message a person can act on; the server turns it into an `error` frame and keeps the
connection open.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

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
from backend.saved_run import SavedRun, SavedRunError
from backend.saved_run_reader import saved_run_from_dict
from backend.vocabulary import ALTERNATIVES_MAX, PROMPT_FORMATS, SamplingParams

PROTOCOL_VERSION = 2
"""2: a server message may be a batch of frames (a JSON array); 1 sent one frame per message."""

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

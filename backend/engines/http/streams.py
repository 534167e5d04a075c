"""Sans-I/O parsers for what engine servers stream: SSE framing, SGLang's native stream, OpenAI's.

Nothing here touches a socket: bytes go in, `Chunk`s come out, so the unit tests drive these
classes with bytes recorded from real servers (tests/fixtures). The HTTP engines are thin
shells around them.

- `SSEDecoder` turns response bytes, split anywhere, into the `data:` payload of each event.
- `SGLangStream` reads `POST /generate` events: per-sample state keyed by the top-level `index`,
  cumulative text (or deltas, for servers run with `--incremental-streaming-output`) turned into
  deltas, each sample's own request id kept for `/abort_request`, SGLang's `finish_reason` objects
  mapped to the dashboard's reasons, `{"error": ...}` turned into error finishes.
- `OpenAIStream` reads `/v1/completions` and `/v1/chat/completions` events: delta text keyed by
  `choices[].index` (vLLM sends one id for all choices, SGLang one per choice, so ids are never
  used), and the final usage chunk, whose figures are attached to the last finish.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from backend.engines.cumulative import DeltaReader
from backend.vocabulary import ALTERNATIVE_DIGITS, Alternatives, Chunk

log = logging.getLogger("backend.engines.http.streams")

DONE = "[DONE]"
"""The payload both servers send as their stream's last event."""

SSE_MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Largest SSE event accepted: a cumulative SGLang chunk of a long sample is a few hundred KiB at
most; a server that never ends its event must not make the backend buffer without bound."""

SGLANG_META_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency")
"""SGLang `meta_info` figures passed through to the UI on a sample's finish."""

SPEC_PREFIX = "spec_"
"""SGLang's speculative-decoding figures (`spec_verify_ct`, `spec_accept_length`, ...) share this prefix."""


class StreamProtocolError(ValueError):
    """The server sent something that is not the stream format it should speak."""


class SSEDecoder:
    """Incremental Server-Sent Events decoder: feed bytes, get the data payload of each whole event."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        """The payloads of the events that `data` completes (an event ends at a blank line)."""
        self._buffer += data
        if len(self._buffer) > SSE_MAX_EVENT_BYTES:
            raise StreamProtocolError(f"an SSE event exceeds {SSE_MAX_EVENT_BYTES} bytes")
        payloads: list[str] = []
        while True:
            line, found = self._next_line()
            if not found:
                return payloads
            if line == "":
                if self._data:
                    payloads.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(":"):
                continue  # a comment: servers send these as keep-alives
            name, _, value = line.partition(":")
            if name == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)

    def close(self) -> list[str]:
        """The payload of an event the server ended without its closing blank line, if any."""
        payloads = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return payloads

    def _next_line(self) -> tuple[str, bool]:
        newline = self._buffer.find(b"\n")
        carriage = self._buffer.find(b"\r")
        if carriage >= 0 and (newline < 0 or carriage < newline):
            if carriage + 1 == len(self._buffer):
                return "", False  # its LF may come with the next read: CRLF is one line end
            end, separator = carriage, 2 if self._buffer[carriage + 1] == 0x0A else 1
        elif newline >= 0:
            end, separator = newline, 1
        else:
            return "", False
        line = self._buffer[:end].decode("utf-8")
        self._buffer = self._buffer[end + separator :]
        return line, True


def parse_json_payload(payload: str) -> dict[str, Any]:
    """One event's JSON object; StreamProtocolError when it is not one."""
    try:
        event = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise StreamProtocolError(f"the server sent an event that is not JSON: {payload[:200]!r}") from exc
    if not isinstance(event, dict):
        raise StreamProtocolError(f"the server sent an event that is not a JSON object: {payload[:200]!r}")
    return event


def error_message(error: Any) -> str:
    """The readable message of a server's `{"error": ...}` payload (an object or a bare string)."""
    if isinstance(error, dict):
        message = error.get("message") or json.dumps(error)
        code = error.get("code")
        return f"{message} (code {code})" if code not in (None, "") else str(message)
    return str(error)


@dataclass
class SampleState:
    """What one sample has streamed so far."""

    text: str = ""
    tokens: int = 0
    request_id: str | None = None
    finished: bool = False


@dataclass
class StreamState:
    """Samples of one request and whether the server ended the stream."""

    n: int
    samples: list[SampleState] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.samples = [SampleState() for _ in range(self.n)]

    @property
    def unfinished(self) -> list[int]:
        """Indices whose finish has not been seen."""
        return [i for i, s in enumerate(self.samples) if not s.finished]

    def sample(self, index: Any) -> SampleState:
        """The state of sample `index`; StreamProtocolError for an index outside the request."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < self.n:
            raise StreamProtocolError(f"the server sent sample index {index!r} for a request of n={self.n}")
        return self.samples[index]

    def fail_unfinished(self, message: str) -> list[Chunk]:
        """An error finish, carrying `message`, for every sample that has not finished."""
        chunks = []
        for index in self.unfinished:
            self.samples[index].finished = True
            chunks.append(Chunk(index, "", 0, "error", meta={"error": message}))
        return chunks


def sglang_finish_reason(finish: Any) -> str | None:
    """SGLang's finish_reason object (`{"type": "length", ...}`) as stop / length / abort / error."""
    if finish is None:
        return None
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort":
        # The server also aborts on its own for failures (bad input, out of memory): those carry an
        # HTTP-like status, a cancel does not.
        status = finish.get("status_code") if isinstance(finish, dict) else None
        return "error" if isinstance(status, int) and status >= 400 and status != 499 else "abort"
    if kind in ("stop", "length"):
        return kind
    return "error"


def sglang_meta(meta_info: dict[str, Any]) -> dict[str, Any]:
    """The figures of a sample's `meta_info` the UI shows: token counts, latency, speculative decoding."""
    meta = {key: meta_info[key] for key in SGLANG_META_KEYS if meta_info.get(key) is not None}
    meta.update({k: v for k, v in meta_info.items() if k.startswith(SPEC_PREFIX) and v is not None})
    if meta_info.get("id") is not None:
        meta["rid"] = meta_info["id"]
    finish = meta_info.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort" and finish.get("message"):
        meta["message"] = finish["message"]
    return meta


class SGLangStream(StreamState):
    """The native `POST /generate` stream of one request with `sampling_params.n = n`.

    `incremental` is the server's `--incremental-streaming-output`: each event then holds only the
    new text; otherwise each holds the sample's whole text so far. With `logprobs` (the request had
    `return_logprob`), each chunk carries its tokens' logprobs from `meta_info.output_token_logprobs`
    (`[logprob, token id, text]` per token: the new ones, or all so far, as the text); with
    `alternatives` too (the request had `top_logprobs_num` and `return_text_in_logprobs`), its tokens'
    alternatives from `meta_info.output_top_logprobs` (per token, a list of such entries).
    """

    def __init__(
        self,
        n: int,
        incremental: bool = False,
        logprobs: bool = False,
        alternatives: int = 0,
        token_text: Callable[[int], str] | None = None,
    ) -> None:
        super().__init__(n)
        self.incremental = incremental
        self.logprobs = logprobs
        self.alternatives = alternatives if logprobs else 0
        self.token_text = token_text
        """An alternative's text from its token id, where the server gave none (in-process SGLang,
        whose `async_generate` has no `return_text_in_logprobs`)."""
        self._deltas = DeltaReader(check_prefix=True)
        """What is new in each cumulative event (not used with `incremental`)."""

    def request_id(self, index: int) -> str | None:
        """The server's id of sample `index` (for /abort_request), once its first event arrived."""
        return self.samples[index].request_id

    def feed(self, payload: str) -> list[Chunk]:
        """The delta chunks of one event's payload."""
        if payload == DONE:
            self.done = True
            return []
        return self.feed_event(parse_json_payload(payload))

    def feed_event(self, event: dict[str, Any]) -> list[Chunk]:
        """The delta chunks of one event, already decoded (in-process SGLang yields these dicts)."""
        if "error" in event:
            return self.fail_unfinished(error_message(event["error"]))
        index = event.get("index", 0)  # n=1 streams may leave the index out
        sample = self.sample(index)
        meta_info = event.get("meta_info") or {}
        if sample.request_id is None and meta_info.get("id") is not None:
            sample.request_id = str(meta_info["id"])
        if sample.finished:
            return []
        text = event.get("text") or ""
        tokens = self._token_count(event, meta_info, sample)
        entries = (meta_info.get("output_token_logprobs") or []) if self.logprobs else None
        tops = None
        if entries is not None and self.alternatives:
            found = meta_info.get("output_top_logprobs") or []
            tops = sglang_alternatives(found, entries, self.alternatives, self.token_text)
        reason = sglang_finish_reason(meta_info.get("finish_reason"))
        if self.incremental:
            delta, new_tokens = text, max(0, tokens - sample.tokens)
            sample.tokens = max(tokens, sample.tokens)
            logprobs = None if entries is None else _entry_logprobs(entries)
        else:
            # The whole text so far, as the server sends it: what is new past what was shown.
            values = None if entries is None else _entry_values(entries)
            cumulative = self._deltas.delta(Chunk(index, text, tokens, logprobs=values, alternatives=tops))
            delta, new_tokens, tops = cumulative.text, cumulative.tokens, cumulative.alternatives
            logprobs = None if cumulative.logprobs is None else _numbers(cumulative.logprobs)
        if reason is None:
            if not (delta or new_tokens):
                return []
            return [Chunk(index, delta, new_tokens, logprobs=logprobs, alternatives=tops)]
        sample.finished = True
        meta = sglang_meta(meta_info)
        return [Chunk(index, delta, new_tokens, reason, meta=meta, logprobs=logprobs, alternatives=tops)]

    def _token_count(self, event: dict[str, Any], meta_info: dict[str, Any], sample: SampleState) -> int:
        completion = meta_info.get("completion_tokens")
        if isinstance(completion, int):
            return completion
        output_ids = event.get("output_ids") or []
        return sample.tokens + len(output_ids) if self.incremental else len(output_ids)


def sglang_alternatives(
    tops: Any, entries: list[Any], k: int, token_text: Callable[[int], str] | None = None
) -> tuple[Alternatives, ...]:
    """Each token's alternatives from SGLang's `output_top_logprobs` (per token a list of
    `[logprob, token id, text]`, or null), the drawn one found by its id in `output_token_logprobs`'
    entry at the same place; the k most likely, most likely first. A text the server left null
    comes from `token_text` where given."""
    found: list[Alternatives] = []
    for place, top in enumerate(tops if isinstance(tops, list) else []):
        entry = entries[place] if place < len(entries) else None
        drawn_id = entry[1] if isinstance(entry, list | tuple) and len(entry) > 1 else None
        listed = [
            (option[1], _option_text(option, token_text), float(option[0]))
            for option in (top if isinstance(top, list | tuple) else [])
            if isinstance(option, list | tuple) and len(option) > 1 and is_logprob(option[0])
        ]
        listed.sort(key=lambda option: -option[2])
        ids = [option[0] for option in listed[:k]]
        drawn = ids.index(drawn_id) if drawn_id is not None and drawn_id in ids else -1
        found.append(
            (drawn, tuple((text, round(value, ALTERNATIVE_DIGITS)) for _, text, value in listed[:k]))
        )
    return tuple(found)


def _option_text(option: list[Any] | tuple[Any, ...], token_text: Callable[[int], str] | None) -> str:
    """An SGLang `[logprob, token id, text]` entry's text, from its id where the server sent none."""
    if len(option) > 2 and isinstance(option[2], str):
        return option[2]
    if token_text is not None and isinstance(option[1], int):
        return token_text(option[1])
    return ""


def openai_alternatives(tops: Any, drawn: Any, k: int) -> tuple[Alternatives, ...]:
    """Each token's alternatives from an OpenAI-compatible server: `tops` per token as a dict of
    token text to logprob (`/v1/completions`' `top_logprobs`) or a list of `{token, logprob}`
    (chat's `content[].top_logprobs`), `drawn` the tokens' own texts; the k most likely, most
    likely first (vLLM adds the drawn token where it is not among them: it is then left out)."""
    found: list[Alternatives] = []
    for place, top in enumerate(tops if isinstance(tops, list) else []):
        if isinstance(top, dict):
            pairs = list(top.items())
        else:
            pairs = [
                (entry.get("token"), entry.get("logprob")) for entry in top or [] if isinstance(entry, dict)
            ]
        listed = sorted(
            ((str(token), float(value)) for token, value in pairs if token is not None and is_logprob(value)),
            key=lambda pair: -pair[1],
        )[:k]
        own = drawn[place] if isinstance(drawn, list) and place < len(drawn) else None
        texts = [token for token, _ in listed]
        rounded = tuple((token, round(value, ALTERNATIVE_DIGITS)) for token, value in listed)
        found.append((texts.index(own) if own in texts else -1, rounded))
    return tuple(found)


def is_logprob(value: Any) -> bool:
    """Whether a server's value is a number (not a bool, not null)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _entry_values(entries: list[Any]) -> tuple[float, ...]:
    """Each `[logprob, token id, text]` entry's logprob, NaN where the server gave none (so that
    entries keep their places while a cumulative stream's are sliced)."""
    return tuple(
        float(entry[0])
        if isinstance(entry, list | tuple)
        and entry
        and isinstance(entry[0], int | float)
        and not isinstance(entry[0], bool)
        else math.nan
        for entry in entries
    )


def _numbers(values: tuple[float, ...]) -> tuple[float, ...]:
    """The values that are numbers (NaN stands for an entry without one)."""
    return tuple(v for v in values if not math.isnan(v))


def _entry_logprobs(entries: list[Any]) -> tuple[float, ...]:
    """The logprobs of `[logprob, token id, text]` entries that have one."""
    return _numbers(_entry_values(entries))


def token_logprobs(values: Any) -> tuple[float, ...]:
    """The numbers among a server's per-token logprobs (a server may send null for a token it has
    no value for, or -inf, which JSON writes as a huge negative)."""
    return tuple(float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool))


OPENAI_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
"""OpenAI-style finish reasons the dashboard knows; any other (say, content_filter) ends as "stop"."""


class OpenAIStream(StreamState):
    """The `/v1/completions` stream of one request with `n` choices (one token per choice event).

    With `hold_last_finish` (the request asked for `stream_options.include_usage`), the finish of
    the last sample is held back until the usage chunk (or the end) so it can carry the usage.
    """

    def __init__(
        self,
        n: int,
        hold_last_finish: bool = False,
        chat: bool = False,
        logprobs: bool = False,
        alternatives: int = 0,
    ) -> None:
        super().__init__(n)
        self.hold_last_finish = hold_last_finish
        self.chat = chat
        """A `/v1/chat/completions` stream: text in `choices[].delta.content`, and a first event per
        choice that only announces the assistant's role (no token)."""
        self.logprobs = logprobs
        """The request asked for logprobs: each choice event's `logprobs` (`content[].logprob` in a
        chat stream, `token_logprobs` in a completions stream) goes with its chunk."""
        self.alternatives = alternatives if logprobs else 0
        """The request asked for this many alternatives a token (`top_logprobs`)."""
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        self._held: Chunk | None = None

    def feed(self, payload: str) -> list[Chunk]:
        """The delta chunks of one event's payload."""
        if payload == DONE:
            self.done = True
            return self._release()
        event = parse_json_payload(payload)
        if "error" in event:
            return [*self._release(), *self.fail_unfinished(error_message(event["error"]))]
        if isinstance(event.get("model"), str):
            self.model = event["model"]
        chunks: list[Chunk] = []
        for choice in event.get("choices") or []:
            chunks.extend(self._choice(choice))
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
            chunks.extend(self._release())
        return chunks

    def _choice(self, choice: dict[str, Any]) -> list[Chunk]:
        index = choice.get("index", 0)
        sample = self.sample(index)
        if sample.finished:
            return []
        raw_reason = choice.get("finish_reason")
        if self.chat:
            text = (choice.get("delta") or {}).get("content") or ""
            if not text and raw_reason is None:
                return []  # the role announcement, or a delta without text (reasoning, tool calls)
        else:
            text = choice.get("text") or ""
        # A chat stream may end a choice with an event of its own (SGLang): no new token in it
        # unless it is the stop token, which the server's usage counts too.
        new_tokens = 0 if self.chat and not text and raw_reason != "stop" else 1
        logprobs = self._choice_logprobs(choice) if self.logprobs else None
        tops = self._choice_alternatives(choice) if self.alternatives else None
        if logprobs:
            # The event's own count: a token whose text is empty (vLLM's last at max_tokens) is one.
            new_tokens = len(logprobs)
        sample.text += text
        sample.tokens += new_tokens
        if raw_reason is None:
            return [Chunk(index, text, new_tokens, logprobs=logprobs, alternatives=tops)]
        sample.finished = True
        meta: dict[str, Any] = {"completion_tokens": sample.tokens}
        if raw_reason not in OPENAI_FINISH_REASONS:
            meta["finish_reason"] = raw_reason
        stop_reason = choice.get("stop_reason") or choice.get("matched_stop")
        if stop_reason is not None:
            meta["matched_stop"] = stop_reason
        chunk = Chunk(
            index,
            text,
            new_tokens,
            OPENAI_FINISH_REASONS.get(raw_reason, "stop"),
            meta=meta,
            logprobs=logprobs,
            alternatives=tops,
        )
        if self.hold_last_finish and not self.unfinished:
            self._held = chunk
            return []
        return [chunk]

    def _choice_logprobs(self, choice: dict[str, Any]) -> tuple[float, ...]:
        found = choice.get("logprobs") or {}
        if self.chat:
            return token_logprobs(
                entry.get("logprob") for entry in found.get("content") or [] if isinstance(entry, dict)
            )
        return token_logprobs(found.get("token_logprobs") or [])

    def _choice_alternatives(self, choice: dict[str, Any]) -> tuple[Alternatives, ...]:
        found = choice.get("logprobs") or {}
        if self.chat:
            content = [entry for entry in found.get("content") or [] if isinstance(entry, dict)]
            tops = [entry.get("top_logprobs") or [] for entry in content]
            return openai_alternatives(tops, [entry.get("token") for entry in content], self.alternatives)
        return openai_alternatives(found.get("top_logprobs") or [], found.get("tokens"), self.alternatives)

    def _release(self) -> list[Chunk]:
        held, self._held = self._held, None
        if held is None:
            return []
        if self.usage is not None:
            held = replace(held, meta={**held.meta, "usage": self.usage})
        return [held]

    def close(self) -> list[Chunk]:
        """Whatever is still held when the stream ends without [DONE]."""
        return self._release()

"""What the page shows of one run, without I/O: server frames in, column text and headers out.

`RunView` folds protocol v2 frames into per-sample state; `samples_value` turns that state into
the value of the page's sample grid (one entry per column: header, status, text), and the
`*_markdown` functions into the status line and the summary panel. Live figures
(tokens/s, TTFT while streaming) are measured here, on the client; once a sample finishes, its
header shows the server's own measurement from the `finish` frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ui.alternatives_view import first_listed, why_none
from ui.early_stop import saved_words
from ui.loop_watch import CancelTiming, LoopWatch, blocked_words, cancel_words
from ui.sample_tree import SampleTree
from ui.trace_view import TraceView

STREAMING = "streaming"
WAITING = "waiting"

STOPPED_BY_VOTE = "stopped by the vote"
"""A column's status where the page stopped it once the vote was decided (`ui.early_stop`)."""

REASON_LABELS = {
    STREAMING: "streaming",
    WAITING: "waiting",
    "stop": "stop",
    "length": "length",
    "abort": "stopped",
    "error": "error",
}


@dataclass
class SampleView:
    """One column: its text so far, its status and its figures."""

    index: int
    parts: list[str] = field(default_factory=list)
    status: str = WAITING
    tokens: int = 0
    first_at: float | None = None
    last_at: float | None = None
    stats: dict[str, Any] | None = None
    marks: list[list[Any]] = field(default_factory=list)
    """Where the request asked for logprobs: `[end, p]` per piece of the text (its end as a character
    offset, and the mean probability of its tokens) for the column to colour, and `[end, p,
    alternatives]` where the piece's first token has alternatives (`ui.alternatives_view.listed`)."""
    logprob_sum: float = 0.0
    logprob_count: int = 0
    length: int = 0
    """Characters of text so far."""
    engine: dict[str, Any] = field(default_factory=dict)
    """The engine's own figures from the `finish` frame (SGLang's `meta_info`, vLLM's usage, the
    embedded engine's prompt counts), `{}` where it sent none."""
    stopped_by_vote: bool = False
    """The page stopped it once the run's vote was decided (`ui.early_stop`)."""

    @property
    def text(self) -> str:
        """Everything the sample has produced so far."""
        return "".join(self.parts)

    @property
    def finished(self) -> bool:
        """The sample has its finish reason."""
        return self.status not in (WAITING, STREAMING)

    def add_pieces(self, pieces: list[Any]) -> bool:
        """A chunk's `logprobs`: `[text, [logprob, ...]]` pieces (with a third item, the tokens'
        alternatives, where the run asked for them), in order, ending where its text ends; whether
        any piece listed alternatives (kept, as `ui.alternatives_view.listed`, with its mark)."""
        start = self.length - sum(len(piece[0]) for piece in pieces)
        found = False
        for piece in pieces:
            text, logprobs = piece[0], piece[1]
            start += len(text)
            if logprobs:
                mean = sum(logprobs) / len(logprobs)
                self.logprob_sum += sum(logprobs)
                self.logprob_count += len(logprobs)
                mark: list[Any] = [start, round(math.exp(mean), 4)]
                alternatives = first_listed(piece)
                if alternatives is not None:
                    mark.append(alternatives)
                    found = True
                self.marks.append(mark)
        return found

    def alternatives_at(self, offset: int) -> tuple[int, list[Any] | None] | None:
        """The piece of the text that starts at character `offset`: its end, and its first token's
        alternatives (None where it has none); None where no piece starts there."""
        start = 0
        for mark in self.marks:
            if start == offset:
                return mark[0], mark[2] if len(mark) > 2 else None
            start = mark[0]
        return None

    @property
    def mean_logprob(self) -> float | None:
        """Mean log probability of the sample's tokens so far (None without logprobs)."""
        return self.logprob_sum / self.logprob_count if self.logprob_count else None


@dataclass
class RunView:
    """One request as the page sees it, built from the frames the backend sends."""

    request_id: str
    started_at: float
    n: int = 0
    engine: str = ""
    model: str = ""
    prompt_format: str = ""
    format_reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    samples: list[SampleView] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done_stats: dict[str, Any] | None = None
    accepted: bool = False
    closed: bool = False
    """The connection ended (normally after `done`, or early if the backend went away)."""
    trace: TraceView = field(init=False)
    tree: SampleTree = field(default_factory=lambda: SampleTree(0))
    """The samples as a prefix tree of their tokens or words, grown from the same chunks."""
    prefix: str = ""
    """The text the samples continue from, where the run continues a branch of an earlier run."""
    cancel: CancelTiming | None = None
    """The run's Cancel, once pressed: when, when the backend read it, what it did."""
    last_chunk_at: float | None = None
    """When the run's last chunk arrived (this process's monotonic clock)."""
    listed: bool = False
    """A chunk of the run came with its tokens' alternatives."""
    note: str = ""
    """What the status line says of the run besides its state (a run opened from a link, a replay's
    prompt and settings); Markdown."""

    def __post_init__(self) -> None:
        self.trace = TraceView(self.request_id)

    @property
    def stopped_by_vote(self) -> set[int]:
        """The samples the page stopped once the vote was decided (`ui.early_stop`)."""
        return {sample.index for sample in self.samples if sample.stopped_by_vote}

    @property
    def finished(self) -> bool:
        """Nothing more will arrive: `done` came, or the connection ended."""
        return self.done_stats is not None or self.closed

    def apply(self, frame: dict[str, Any], now: float) -> None:
        """Fold one server frame into the view; frames of other requests are ignored."""
        kind = frame.get("type")
        if kind == "trace":
            self.trace.apply(frame)
            return
        if kind == "error":
            self.errors.append(f"{frame.get('message')} ({frame.get('code')})")
            return
        if frame.get("id") != self.request_id:
            return
        if kind == "accepted":
            self.accepted = True
            self.n = int(frame["n"])
            self.engine = frame.get("engine", "")
            self.model = frame.get("model", "")
            self.prompt_format = frame.get("format", "")
            self.format_reason = frame.get("format_reason", "")
            self.params = frame.get("params", {})
            self.trace.off = frame.get("trace_off")
            self.trace.engine_tasks = frame.get("engine_tasks", "")
            self.samples = [SampleView(i) for i in range(self.n)]
            self.tree = SampleTree(self.n)
        elif kind == "chunk" and self._has(frame):
            sample = self.samples[frame["index"]]
            sample.parts.append(frame["text"])
            sample.length += len(frame["text"])
            if frame.get("logprobs") and sample.add_pieces(frame["logprobs"]):
                self.listed = True
            self.tree.add(sample.index, frame["text"], frame.get("logprobs"))
            sample.tokens += int(frame.get("tokens", 0))
            sample.status = STREAMING
            sample.first_at = now if sample.first_at is None else sample.first_at
            sample.last_at = self.last_chunk_at = now
        elif kind == "finish" and self._has(frame):
            sample = self.samples[frame["index"]]
            sample.status = frame["reason"]
            self.tree.finish(sample.index)
            engine_error = (frame.get("engine") or {}).get("error")
            if frame["reason"] == "error" and engine_error and engine_error not in self.errors:
                self.errors.append(engine_error)
            sample.stats = frame.get("stats")
            if isinstance(frame.get("engine"), dict):
                sample.engine = frame["engine"]
            if sample.stats:
                sample.tokens = sample.stats.get("tokens", sample.tokens)
        elif kind == "cancel_ack" and frame.get("index") is None:
            if self.cancel is None:
                self.cancel = CancelTiming(now)  # sent by another client of the page's session
            self.cancel.read(frame, now)
            self.trace.cancel_read(self.cancel)
        elif kind == "done":
            self.trace.watch(None)
            self.done_stats = frame.get("stats", {})
            for sample in self.samples:
                if not sample.finished:
                    sample.status = "error"
                self.tree.finish(sample.index)

    def watched(self, watch: LoopWatch | None) -> None:
        """A reading of the blocked loop's watch (`ui.loop_watch`), for the status line and the trace."""
        self.trace.watch(watch if not self.finished else None)

    def cancel_pressed(self, now: float) -> None:
        """The page's Cancel was pressed at `now` (the first press counts)."""
        if self.cancel is None and not self.finished:
            self.cancel = CancelTiming(now)

    def close(self, reason: str | None = None) -> None:
        """The connection ended; an unexpected end is recorded as an error on open samples."""
        if self.done_stats is None and reason:
            self.errors.append(reason)
            for sample in self.samples:
                if not sample.finished:
                    sample.status = "error"
        for sample in self.samples:
            if sample.finished:
                self.tree.finish(sample.index)
        self.closed = True

    def _has(self, frame: dict[str, Any]) -> bool:
        index = frame.get("index")
        return isinstance(index, int) and 0 <= index < len(self.samples)


def _fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f} {unit}" if unit else f"{value:.{digits}f}"


def sample_header(sample: SampleView, started_at: float, now: float) -> str:
    """A column's header: index, status, tokens, tokens/s, TTFT."""
    if sample.stats is not None:
        tokens_per_s = sample.stats.get("tokens_per_s")
        ttft_ms = sample.stats.get("ttft_ms")
    else:
        elapsed = (sample.last_at if sample.last_at is not None else now) - started_at
        tokens_per_s = sample.tokens / elapsed if sample.tokens and elapsed > 0 else None
        ttft_ms = None if sample.first_at is None else (sample.first_at - started_at) * 1000
    label = STOPPED_BY_VOTE if sample.stopped_by_vote else REASON_LABELS.get(sample.status, sample.status)
    header = (
        f"#{sample.index} · {label} · {sample.tokens} tok · "
        f"{_fmt(tokens_per_s, 'tok/s', 1)} · TTFT {_fmt(ttft_ms, 'ms')}"
    )
    mean = sample.mean_logprob
    if mean is not None:
        header += f" · mean logprob {mean:.2f} · perplexity {math.exp(-mean):.2f}"
    return header


def samples_value(view: RunView, now: float) -> dict[str, Any]:
    """The sample grid's value: a column per sample with its header, status and text, where it parts
    from every other sample (`parts_at`, a character offset, or None) and, with logprobs, its
    `marks` (see SampleView); the run's id (`run`), and for a continuation the end of the text it
    continues from (`prefix`).

    The page sends this as JSON; between two updates Gradio sends only what changed (a column's new
    text is an append), and the page's template redraws only the columns that changed.
    """
    if not view.accepted:
        return {"samples": []}
    columns: list[dict[str, Any]] = []
    for sample, parts_at in zip(view.samples, view.tree.parting_points(), strict=True):
        text = sample.text
        column: dict[str, Any] = {
            "index": sample.index,
            "status": REASON_LABELS.get(sample.status, sample.status),
            "header": sample_header(sample, view.started_at, now),
            "text": text,
            "parts_at": parts_at,
        }
        if sample.marks:
            # A copy: the value is sent after this returns, while the run's view takes more frames,
            # and marks past the text taken here would colour the wrong characters.
            column["marks"] = sample.marks[:]
        columns.append(column)
    value: dict[str, Any] = {"samples": columns, "run": view.request_id}
    if not view.listed and any(sample.marks for sample in view.samples):
        value["alt_note"] = why_none(view.engine)
    if view.prefix:
        value["prefix"] = prefix_tail(view.prefix)
    return value


PREFIX_TAIL_CHARS = 160
"""A continued run's columns show the end of the text they continue from, up to this many characters."""


def prefix_tail(prefix: str) -> str:
    """The end of a continuation's prefix, as each column shows it above the sample's own text."""
    return prefix if len(prefix) <= PREFIX_TAIL_CHARS else "…" + prefix[-PREFIX_TAIL_CHARS:]


NOTE_PROMPT_CHARS = 120
"""A replay's prompt is quoted in its status line up to this many characters."""


def plain(text: str) -> str:
    """`text` for a Markdown line, read as it is: line breaks as spaces, markup characters escaped."""
    flat = " ".join(text.split())
    return "".join("\\" + char if char in "\\`*_[]<>#|~" else char for char in flat)


def replay_note(prompt: str, prompt_format: str, n: int, params: dict[str, Any]) -> str:
    """The status line's words for a replayed saved run: that it is a replay, and the prompt, format
    and settings it ran with (the controls keep the page's own)."""
    shown = prompt if len(prompt) <= NOTE_PROMPT_CHARS else prompt[:NOTE_PROMPT_CHARS] + "…"
    settings = [
        f"format {prompt_format}",
        f"n {n}",
        f"max tokens {params.get('max_tokens')}",
        f"temperature {params.get('temperature'):g}" if params.get("temperature") is not None else "",
        f"top-p {params.get('top_p'):g}" if params.get("top_p") is not None else "",
        f"seed {params.get('seed')}",
    ]
    return (
        f"**Replay of a saved run**, with its own prompt and settings (not the controls'): "
        f"“{plain(shown)}” · " + " · ".join(part for part in settings if part)
    )


WAITING_HINT_S = 1.5
"""After this long without a first token, the status line says the run waits its turn: a prompt's
prefill takes a fraction of that on every engine here, a full engine (the embedded engine's
`--max-rows`, a server's batch) as long as the runs before it take."""

WAITING_TURN = (
    "waiting for its turn: when the engine is full it runs the samples that came before, other "
    "visitors' too, then this run's"
)
"""The state of a run waiting for its first token past WAITING_HINT_S."""


def status_markdown(view: RunView, now: float | None = None) -> str:
    """The line above the columns: the request, its seed and state (at `now`, where given: a run
    waiting for its first token past WAITING_HINT_S says it waits its turn), and any error."""
    lines = [f"**Error:** {message}" for message in view.errors]
    if view.accepted:
        seed = view.params.get("seed")
        streaming = sum(not s.finished for s in view.samples)
        aborted = sum(s.status == "abort" for s in view.samples)
        if view.done_stats is not None and aborted == view.n:
            state = "cancelled"
        elif view.done_stats is not None and aborted:
            state = f"finished, {aborted} of {view.n} samples stopped"
        elif view.done_stats is not None:
            state = "finished"
        elif view.closed:
            state = "stopped"
        elif (
            now is not None
            and now - view.started_at >= WAITING_HINT_S
            and all(s.status == WAITING for s in view.samples)
        ):
            state = WAITING_TURN
        else:
            state = f"streaming {streaming} of {view.n} samples"
        replayed = f" · a replay of a saved run ({view.model})" if view.engine == "replay" else ""
        lines.append(f"Request `{view.request_id}` · seed **{seed}** · {state}{replayed}.")
        if view.note:
            lines.append(view.note)
        if view.format_reason:
            lines.append(f"Prompt format **{view.prompt_format}**: {view.format_reason}.")
        if view.prefix:
            words = len(view.prefix.split())
            lines.append(
                f"Continuing from a branch: the prompt, then {len(view.prefix)} characters "
                f"({words} words) of text the samples go on from, shown above each column."
            )
        if not view.finished:
            lines.append(blocked_words(view.trace.live, view.last_chunk_at))
        lines.append(cancel_words(view.cancel, view.started_at, view.finished))
    return "\n\n".join(line for line in lines if line)


SUMMARY_COLUMNS = (
    ("#", "#"),
    ("reason", ""),
    ("tokens", "tok "),
    ("TTFT ms", "TTFT "),
    ("TPOT ms", "TPOT "),
    ("ITL p50", "ITL p50 "),
    ("ITL p99", "p99 "),
    ("tok/s", "tok/s "),
    ("seed", "seed "),
)
"""The run summary's columns: each one's header, and the label its cells carry on a phone-wide
screen, where each sample's figures are one line of labelled values instead of a table's row
(`summary_css`)."""


def summary_css() -> str:
    """The run summary on a phone-wide screen: each sample's row a wrapped line of labelled figures
    (the headers hidden, each cell labelled from `SUMMARY_COLUMNS`), so no column is cut or
    scrolled out of sight."""
    labels = "".join(
        f'#summary td:nth-child({i})::before {{ content: "{label}"; color: var(--body-text-color-subdued); }}'
        "\n"
        for i, (_, label) in enumerate(SUMMARY_COLUMNS, start=1)
        if label
    )
    return (
        "@media (max-width: 640px) {\n"
        "#summary thead { display: none; }\n"
        "#summary table, #summary tbody { display: block; border: none; }\n"
        "#summary tr { display: flex; flex-wrap: wrap; gap: 2px 12px; padding: 4px 0;\n"
        "  border-bottom: 1px solid var(--border-color-primary); }\n"
        "#summary td { border: none; padding: 0; white-space: nowrap; }\n" + labels + "}\n"
    )


def summary_markdown(view: RunView) -> str:
    """Per-sample server stats (TTFT, TPOT, ITL p50/p99, tokens/s, seed) and the request's totals."""
    if not view.accepted:
        return ""
    rows = [
        "| " + " | ".join(header for header, _ in SUMMARY_COLUMNS) + " |",
        "|---:|:---|" + "---:|" * (len(SUMMARY_COLUMNS) - 2),
    ]
    for sample in view.samples:
        stats = sample.stats or {}
        cells = [
            str(sample.index),
            REASON_LABELS.get(sample.status, sample.status),
            str(sample.tokens),
            *(
                _cell(stats.get(key))
                for key in ("ttft_ms", "tpot_ms", "itl_p50_ms", "itl_p99_ms", "tokens_per_s")
            ),
            str(stats.get("seed", "")),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    totals = ""
    if view.done_stats:
        d = view.done_stats
        totals = (
            f"\n\n**Request:** {d.get('tokens')} tokens in {_fmt(d.get('duration_ms'), 'ms')}, "
            f"{_fmt(d.get('tokens_per_s'), 'tok/s', 1)} · mean TTFT {_fmt(d.get('ttft_mean_ms'), 'ms')} · "
            f"mean TPOT {_fmt(d.get('tpot_mean_ms'), 'ms', 1)} · "
            f"ITL p50/p99 {_fmt(d.get('itl_p50_ms'), digits=1)}/{_fmt(d.get('itl_p99_ms'), 'ms', 1)}"
        )
    cache = prefix_cache_line(view)
    saved = _saved_line(view)
    return (
        "### Run summary\n\n"
        + "\n".join(rows)
        + totals
        + (f"\n\n{cache}" if cache else "")
        + (f"\n\n{saved}" if saved else "")
    )


def _saved_line(view: RunView) -> str:
    """What stopping when decided saved, once the run is done ("" where it stopped nothing)."""
    if not view.stopped_by_vote or view.done_stats is None:
        return ""
    stopped = [(s.index, s.tokens) for s in view.samples if s.index in view.stopped_by_vote]
    rates = [
        s.stats["tokens_per_s"]
        for s in view.samples
        if s.stats and isinstance(s.stats.get("tokens_per_s"), int | float) and s.stats["tokens_per_s"] > 0
    ]
    rate = sum(rates) / len(rates) if rates else None
    return saved_words(stopped, int(view.params.get("max_tokens", 0)), rate)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def prefix_cache_line(view: RunView) -> str:
    """The prompt tokens the engine computed and those it reused from its prefix cache, as the
    engine reported them once the samples finished: SGLang's and the embedded engine's
    `cached_tokens` per sample, vLLM's `usage.prompt_tokens_details.cached_tokens` per request;
    where the engine reports no such count the line says so rather than showing 0. Empty until a
    sample has finished."""
    finished = [s for s in view.samples if s.stats is not None or s.engine]
    if not finished:
        return ""
    recorded = " (as recorded)" if view.engine == "replay" else ""
    counts = [
        (_count(s.engine.get("prompt_tokens")), _count(s.engine.get("cached_tokens")))
        for s in finished
        if _count(s.engine.get("cached_tokens")) is not None
    ]
    if counts:
        prompt = counts[0][0]
        if len(set(counts)) == 1 and prompt is not None:
            cached = counts[0][1] or 0
            return (
                f"**Prefix cache{recorded}:** prompt {prompt} tokens: {cached} reused from the "
                f"engine's cache, {prompt - cached} computed."
            )
        each = ", ".join(
            f"#{s.index} {_count(s.engine.get('cached_tokens'))}"
            for s in finished
            if _count(s.engine.get("cached_tokens")) is not None
        )
        size = f"prompt {prompt} tokens: " if prompt is not None else ""
        return f"**Prefix cache{recorded}:** {size}reused from the engine's cache per sample: {each}."
    usage = next((s.engine["usage"] for s in finished if isinstance(s.engine.get("usage"), dict)), None)
    if usage is not None:
        prompt = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        if prompt is not None and cached is not None:
            return (
                f"**Prefix cache{recorded}:** prompt {prompt} tokens: {cached} reused from the "
                f"engine's cache, {prompt - cached} computed (for the request's n samples together)."
            )
        size = f"prompt {prompt} tokens; " if prompt is not None else ""
        return (
            f"**Prefix cache{recorded}:** {size}the engine did not report cached tokens (vLLM reports "
            "them with `--enable-prompt-tokens-details`)."
        )
    return f"**Prefix cache{recorded}:** not reported by the {view.engine or 'engine'} engine."


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)

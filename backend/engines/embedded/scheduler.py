"""Continuous batching on one thread: requests join the running batch at the next step, rows leave when done.

The scheduler owns the model and its row cache and steps them on one thread (in the engine's own
process, `worker`), so no model step ever runs on the server's event loop. Other threads talk to it
only through `submit` and `abort`, which put a command in its inbox; the inbox is read between
steps, so an abort stops a row at the next step boundary (at most the step already under way
finishes). Each pass:

1. apply the inbox (new requests queue up, aborted rows leave and free their cache rows);
2. admit queued requests first come, first served, while their n rows fit under the row cap:
   prefill the prompt once, copy its cache into n rows, sample each row's first token; requests
   that arrive meanwhile are admitted in the same pass (prefills go before the next step). Where
   the rows kernel multiplies, waiting prompts whose new tokens fit in its 64 rows together are
   prefilled in one pass (the weights read once for all of them);
3. decode one token for every running row, of every request, in one batch.

Chunks go to each request's `Sink` from this thread; `on_pass_end`, if given, runs after each
prefill pass and after the decode step of every pass, so whoever forwards the chunks
can send each step's output of all requests at once, and a request's first tokens leave as soon as
its prompt is done (not after every other request admitted in the same pass).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from backend.engines.base import template_token_ids
from backend.engines.embedded.detokenizer import TextStream
from backend.engines.embedded.linear import KERNEL_MAX_ROWS
from backend.engines.embedded.model import Llama, PromptKV, RowCache
from backend.engines.embedded.sampler import RowSampling, sample, top_tokens
from backend.vocabulary import ALTERNATIVE_DIGITS, Alternatives, Chunk

log = logging.getLogger("backend.embedded")

IDLE_WAIT_S = 1.0
"""How long an idle scheduler sleeps on its inbox before checking whether it should stop."""

CACHE_DTYPE = torch.float16
"""The row cache's keys and values: float16 halves what attention reads a step (at 32 rows and 168
positions, 189 MB of its 248 MB in float32) and the cache's memory; they are rounded once as they
are written and widened exactly as they are read, and every sum stays float32, so a row's values
still depend on its own positions only."""


@dataclass(frozen=True)
class DecodeParams:
    """What one request asks of the scheduler; sample i seeds its generator with `seed + i`."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    top_k: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    """Keep going past the end-of-turn token (benchmarks that need exactly max_tokens)."""
    logprobs: bool = False
    """Give each token's log probability under the model (`token_logprobs`)."""
    alternatives: int = 0
    """With `logprobs`: give each token's position's this many most likely tokens (`token_logprobs`)."""
    reuse_branches: bool = False
    """A continuation: the prompt may copy the keys and values of an earlier sample's text
    (`BatchScheduler.branches`) instead of computing them, rounding as that sample's steps did."""


class Sink(Protocol):
    """Where a request's output goes; called from the scheduler thread."""

    def deliver(self, chunks: list[Chunk]) -> None:
        """Chunks of this step, at most one per sample."""

    def set_queue_position(self, position: int) -> None:
        """Requests ahead of this one in the queue, plus one; 0 once it runs."""


@dataclass(eq=False)
class Job:
    """One request inside the scheduler."""

    prompt_ids: list[int]
    n: int
    params: DecodeParams
    sink: Sink
    aborted: dict[int, int] = field(default_factory=dict)
    """Aborted sample index -> the scheduler's step count when the abort arrived."""
    submitted_at: float = field(default_factory=time.perf_counter)
    position: int = 0
    """Last queue position reported to the sink (0: not waiting)."""
    cached_tokens: int = 0
    """Prompt positions its prefill copied instead of computing (the engine's own prefix cache)."""


@dataclass(eq=False)
class Row:
    """One running sample: its request, index, generator, text and last token."""

    job: Job
    index: int
    sampling: RowSampling
    text: TextStream
    last_token: int = 0
    tokens: int = 0
    ids: list[int] = field(default_factory=list)
    """The tokens drawn so far, in order."""


@dataclass
class SchedulerStats:
    """Counters for /health and the tests; written by the scheduler thread only."""

    steps: int = 0
    prefills: int = 0
    grouped_prefills: int = 0
    """Prefill passes that ran more than one request's prompt."""
    reused_prompt_tokens: int = 0
    """Prompt positions copied from the template head's keys and values instead of computed."""
    tokens: int = 0
    rows_stepped: int = 0
    max_batch_rows: int = 0
    shared_steps: int = 0
    """Decode steps whose batch held rows of more than one request."""
    step_seconds: float = 0.0
    last_step_ms: float = 0.0


BRANCH_POSITIONS = 2048
"""Positions of finished samples' keys and values kept for continuations (`BatchScheduler.branches`):
94 MB in fp32, about four samples of 512 tokens."""


END_OF_TURN = "<|im_end|>"
"""The chat template's end of a turn: a sample stops there."""


def stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokens a sample ends at: the end of a chat turn and the tokenizer's end of text."""
    eos = {tokenizer.convert_tokens_to_ids(END_OF_TURN), tokenizer.eos_token_id}
    return tuple(i for i in eos if isinstance(i, int) and i != tokenizer.unk_token_id)


Scores = tuple[list[float | None], list[Alternatives | None] | None]
"""Per row of a step: its drawn token's logprob, and its position's alternatives (None for a row
whose request did not ask; the list None where no row asked for alternatives)."""


def token_logprobs(
    logits: torch.Tensor, tokens: list[int], rows: list[Row], token_text: Callable[[int], str]
) -> Scores | None:
    """Each row's chosen token's log probability under the model (log-softmax of its logits, before
    temperature and truncation, as engines report it), for the rows whose request asked, and where
    it asked for k alternatives the k most likely tokens of the same log-softmax (`top_tokens`, one
    call for the step, on the rows that asked only), the drawn one's place among them marked; None
    when no row asked (no extra work then)."""
    wanted = [i for i, row in enumerate(rows) if row.job.params.logprobs]
    if not wanted:
        return None
    chosen = torch.tensor([tokens[i] for i in wanted])
    asked = logits if len(wanted) == len(rows) else logits[torch.tensor(wanted)]
    scores = torch.log_softmax(asked.float(), dim=-1)
    picked = scores.gather(-1, chosen[:, None])[:, 0].tolist()
    out: list[float | None] = [None] * len(rows)
    for i, value in zip(wanted, picked, strict=True):
        out[i] = value
    listing = [(place, i) for place, i in enumerate(wanted) if rows[i].job.params.alternatives]
    if not listing:
        return out, None
    k = max(rows[i].job.params.alternatives for _, i in listing)
    listed = scores if len(listing) == len(wanted) else scores[torch.tensor([place for place, _ in listing])]
    values, ids = top_tokens(listed, k)
    alternatives: list[Alternatives | None] = [None] * len(rows)
    for (_, i), row_values, row_ids in zip(listing, values.tolist(), ids.tolist(), strict=True):
        keep = rows[i].job.params.alternatives
        top = row_ids[:keep]
        drawn = top.index(tokens[i]) if tokens[i] in top else -1
        listed = tuple(
            (token_text(t), round(v, ALTERNATIVE_DIGITS)) for t, v in zip(top, row_values, strict=False)
        )
        alternatives[i] = (drawn, listed)
    return out, alternatives


class BatchScheduler:
    """The model, its row cache, the request queue and the thread that steps them."""

    def __init__(
        self,
        model: Llama,
        tokenizer: Any,
        eos_ids: Sequence[int],
        max_rows: int,
        context: int,
        on_pass_end: Callable[[], None] | None = None,
        linear_path: str = "PyTorch",
        compute: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.on_pass_end = on_pass_end
        self.tokenizer = tokenizer
        self._token_texts: dict[int, str] = {}
        """Each token's own text, decoded once (an alternative's text)."""
        self.eos_ids = frozenset(eos_ids)
        self.max_rows = max_rows
        self.context = context
        self.cache = RowCache(model.config, max_rows, context, CACHE_DTYPE)
        self.prompt_kv: PromptKV | None = self._template_head_kv()
        """Keys and values of the chat template's fixed head (the system turn): every prompt that
        starts with it copies them instead of computing them. Always this head and never the last
        prompt: a prompt is then computed the same way every time, so a seed gives the same text
        whatever ran before (a prefill split at another position rounds differently)."""
        self.branches: deque[PromptKV] = deque()
        """Keys and values of the latest finished samples (prompt and text), newest last, at most
        BRANCH_POSITIONS positions together: a continuation of one of them (`reuse_branches`) copies
        what it shares with the prompt instead of computing it, as SGLang's radix cache does."""
        self.rows: list[Row] = []
        self.waiting: deque[Job] = deque()
        self.stats = SchedulerStats()
        self._inbox: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.linear_path = linear_path
        """How the linear layers multiply (embedded.linear's kernel or PyTorch), for the figures."""
        self.compute = compute or {}
        """The compute path (compute.py): its name, whether it is batch-invariant and why it runs."""
        self.step_weight_bytes = model.weights.step_bytes()
        """Bytes of weight matrices a decode step reads (GGUF blocks where it has them), for the figures."""

    # --- called from other threads -------------------------------------------------------------

    def start(self, threads: int) -> None:
        """Start the stepping thread; torch uses `threads` threads inside each step."""
        torch.set_num_threads(threads)
        self._thread = threading.Thread(target=self.run, name="embedded-scheduler", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Make `run` finish every request with "abort" and return, after the step under way."""
        self._stopping.set()
        self._inbox.put(("stop", None, None))

    def stop(self) -> None:
        """Finish every request with "abort" and end the thread."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join()

    def submit(self, job: Job) -> None:
        """Queue a request; it joins the batch at the next step where its rows fit."""
        self._inbox.put(("submit", job, None))

    def abort(self, job: Job, index: int | None) -> None:
        """Stop one sample of `job` (or all) at the next step boundary."""
        self._inbox.put(("abort", job, (index, self.stats.steps)))

    def snapshot(self) -> dict[str, Any]:
        """Load and batch figures (read without a lock: each is one int or float)."""
        s = self.stats
        return {
            "running_rows": len(self.rows),
            "running_requests": len({id(row.job) for row in list(self.rows)}),
            "queued_requests": len(self.waiting),
            "max_rows": self.max_rows,
            "steps": s.steps,
            "prefills": s.prefills,
            "grouped_prefills": s.grouped_prefills,
            "reused_prompt_tokens": s.reused_prompt_tokens,
            "tokens": s.tokens,
            "mean_batch_rows": round(s.rows_stepped / s.steps, 2) if s.steps else 0.0,
            "max_batch_rows": s.max_batch_rows,
            "shared_steps": s.shared_steps,
            "mean_step_ms": round(1000 * s.step_seconds / s.steps, 2) if s.steps else 0.0,
            "step_seconds": s.step_seconds,
            "last_step_ms": round(s.last_step_ms, 2),
            "linear_layers": self.linear_path,
            "compute_path": self.compute.get("path", ""),
            "batch_invariant": self.compute.get("batch_invariant", False),
            "compute_why": self.compute.get("why", ""),
            "compute_block": self.compute.get("block"),
            "compute_sizes": self.compute.get("sizes", []),
            "compute_label": self.compute.get("label", self.compute.get("path", "")),
            "weight_bytes": self.compute.get("weight_bytes", 0),
            "step_weight_bytes": self.step_weight_bytes,
        }

    # --- the scheduler thread ------------------------------------------------------------------

    def run(self) -> None:
        """Step on the calling thread until `request_stop` (the stepping thread's body)."""
        # The cache is written between passes too (rows leave): everything here is inference.
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                self._read_inbox(block=not self.rows and not self.waiting)
                self._admit()
                self._pass_end()
                if self.rows:
                    self._step()
            except Exception:
                log.exception("embedded engine step failed; ending the running requests")
                self._fail_all("error")
            self._pass_end()
        self._fail_all("abort")
        self._pass_end()

    def _pass_end(self) -> None:
        if self.on_pass_end is not None:
            self.on_pass_end()

    def _read_inbox(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, job, argument = command
            if kind == "submit":
                self.waiting.append(job)
            elif kind == "abort":
                self._apply_abort(job, *argument)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply_abort(self, job: Job, index: int | None, step_at_request: int) -> None:
        targets = range(job.n) if index is None else [index]
        for i in targets:
            job.aborted.setdefault(i, step_at_request)
        if job in self.waiting:
            if len(job.aborted) == job.n:
                self.waiting.remove(job)
                job.sink.deliver([self._abort_chunk(job, i, 0) for i in range(job.n)])
                self._report_positions()
            return
        self._drop_aborted(job)

    def _drop_aborted(self, job: Job) -> None:
        chunks = []
        for slot in range(len(self.rows) - 1, -1, -1):
            row = self.rows[slot]
            if row.job is job and row.index in job.aborted:
                after = min(row.tokens, self.stats.steps - job.aborted[row.index])
                chunk = self._abort_chunk(job, row.index, after, row.text.flush())
                chunks.append(replace(chunk, meta={**chunk.meta, **self._prompt_figures(job)}))
                self._keep_branch(row, slot)
                self._remove(slot)
        if chunks:
            job.sink.deliver(chunks)

    @staticmethod
    def _prompt_figures(job: Job) -> dict[str, int]:
        """A finishing sample's prompt figures, as SGLang names its own: the prompt's tokens, and
        those its prefill copied (the template head, or a kept sample's) instead of computing."""
        return {"prompt_tokens": len(job.prompt_ids), "cached_tokens": job.cached_tokens}

    @staticmethod
    def _abort_chunk(job: Job, index: int, tokens_after_abort: int, text: str = "") -> Chunk:
        return Chunk(index, text, 0, "abort", meta={"tokens_after_abort": tokens_after_abort})

    def _remove(self, slot: int) -> None:
        moved = self.cache.remove_row(slot)
        if moved is not None:
            self.rows[slot] = self.rows[moved]
        self.rows.pop()

    def _report_positions(self) -> None:
        """Tell each waiting request its place when it changed (requests that never wait hear nothing)."""
        for position, job in enumerate(self.waiting, start=1):
            if job.position != position:
                job.position = position
                job.sink.set_queue_position(position)

    def _admit(self) -> None:
        while self.waiting and self.waiting[0].n <= self.max_rows - len(self.rows):
            group = self._next_group()
            for job in group:
                if job.position:
                    job.position = 0
                    job.sink.set_queue_position(0)
            self._prefill(group)
            # Each group's first tokens go out when its prompts are done, not after every request
            # admitted in this pass: 16 arriving at once otherwise all waited for the last prefill.
            self._pass_end()
            # Requests that arrived during the prefill are admitted before the next decode step
            # rather than after it: a step of many rows takes as long as a prefill or longer.
            self._read_inbox(block=False)
        self._report_positions()

    def _next_group(self) -> list[Job]:
        """The first waiting request, and after it those that fit beside it in one prefill: their
        new tokens (after the template head each copies) at most KERNEL_MAX_ROWS together, their
        rows within the cap. Only where a row's products do not depend on the rows beside it (the
        rows kernel, int8's exact sums: `ModelWeights.rows_independent`): there a prompt gives the same values
        alone or beside others, so a seed's text does not depend on who else arrived. (PyTorch's
        product is checked at one block of rows, a decode step's; a prompt is prefilled alone
        there, the same way every time.)"""
        first = self.waiting.popleft()
        group = [first]
        if not self.model.weights.rows_independent:
            return group
        budget = KERNEL_MAX_ROWS - self._new_tokens(first)
        free = self.max_rows - len(self.rows) - first.n
        while self.waiting and budget > 0:
            job = self.waiting[0]
            new = self._new_tokens(job)
            if new > budget or job.n > free:
                break
            group.append(self.waiting.popleft())
            budget -= new
            free -= job.n
        return group

    def _new_tokens(self, job: Job) -> int:
        """The prompt positions a prefill computes (those after the head it copies)."""
        reuse = self._reuse_for(job)
        return len(job.prompt_ids) - (reuse.reusable(job.prompt_ids) if reuse is not None else 0)

    def _reuse_for(self, job: Job) -> PromptKV | None:
        """What the job's prefill copies from: the template head, or for a continuation the kept
        sample (`branches`) that shares the most leading tokens with its prompt where that is more."""
        best = self.prompt_kv
        if job.params.reuse_branches:
            ids = job.prompt_ids
            most = best.reusable(ids) if best is not None else 0
            for branch in reversed(self.branches):
                shared = branch.reusable(ids)
                if shared > most:
                    best, most = branch, shared
        return best

    def _keep_branch(self, row: Row, slot: int) -> None:
        """Keep a finishing sample's keys and values (its prompt and the tokens it has stepped) for
        a continuation to copy, the oldest kept ones dropped past BRANCH_POSITIONS."""
        filled = int(self.cache.lengths[slot])
        prompt = row.job.prompt_ids
        if filled <= len(prompt) or filled > BRANCH_POSITIONS:
            return
        tokens = prompt + row.ids[: filled - len(prompt)]
        keys = self.cache.keys[:, slot, :, :filled].clone()
        values = self.cache.values[:, slot, :, :filled].clone()
        self.branches.append(PromptKV(tokens, keys, values))
        total = sum(len(branch.tokens) for branch in self.branches)
        while total > BRANCH_POSITIONS:
            total -= len(self.branches.popleft().tokens)

    def _template_head_kv(self) -> PromptKV | None:
        """The chat template's head (what two different user turns share), prefilled once."""
        try:
            ids = [template_token_ids(self.tokenizer, [{"role": "user", "content": t}]) for t in ("a", "b")]
        except ValueError:  # a model without a chat template: nothing to share
            return None
        head = 0
        while head < min(map(len, ids)) and ids[0][head] == ids[1][head]:
            head += 1
        if head < 2:
            return None
        _, kept = self.model.prefill(ids[0][:head], self.cache, range(0))
        return kept

    def token_text(self, token: int) -> str:
        """Token `token`'s text decoded alone (as an alternative lists it), kept once decoded."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode(
                [token], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return text

    def _prefill(self, group: list[Job]) -> None:
        """Prefill the group's prompts in one pass and give each of their samples its first token."""
        slots = [self.cache.add_rows(job.n) for job in group]
        results = self.model.prefill_many(
            [(job.prompt_ids, rows) for job, rows in zip(group, slots, strict=True)],
            self.cache,
            [self._reuse_for(job) for job in group],
        )
        self.stats.prefills += len(group)
        if len(group) > 1:
            self.stats.grouped_prefills += 1
        new_rows: list[Row] = []
        first: list[int] = []
        logprobs: list[float | None] = []
        alternatives: list[Alternatives | None] = []
        for job, (logits, kept) in zip(group, results, strict=True):
            self.stats.reused_prompt_tokens += kept.reused
            job.cached_tokens = kept.reused
            params = job.params
            rows = []
            for index in range(job.n):
                generator = None
                if params.temperature > 0:
                    generator = torch.Generator().manual_seed(params.seed + index)
                sampling = RowSampling(params.temperature, params.top_p, params.top_k, generator)
                rows.append(Row(job, index, sampling, TextStream(self.tokenizer, params.stop)))
            chosen = sample(logits.expand(job.n, -1), [row.sampling for row in rows])
            scores = token_logprobs(logits.expand(job.n, -1), chosen, rows, self.token_text)
            logprobs.extend(scores[0] if scores else [None] * job.n)
            alternatives.extend((scores[1] if scores else None) or [None] * job.n)
            new_rows.extend(rows)
            first.extend(chosen)
        # Rows in the order of their cache rows; accepted together, since a row that finishes at
        # once is replaced by the last row, which may be another request's.
        self.rows.extend(new_rows)
        wanted = any(value is not None for value in logprobs)
        listed = any(value is not None for value in alternatives)
        scores = (logprobs, alternatives if listed else None) if wanted else None
        self._accept(new_rows, first, start=len(self.rows) - len(new_rows), scores=scores)
        # Samples aborted while the request waited leave before they decode.
        for job in group:
            if job.aborted:
                self._drop_aborted(job)

    def _step(self) -> None:
        started = time.perf_counter()
        batch = len(self.rows)
        tokens = torch.tensor([row.last_token for row in self.rows])
        logits = self.model.decode(tokens, self.cache)
        chosen = sample(logits, [row.sampling for row in self.rows])
        scores = token_logprobs(logits, chosen, self.rows, self.token_text)
        s = self.stats
        s.steps += 1
        s.rows_stepped += batch
        s.max_batch_rows = max(s.max_batch_rows, batch)
        if len({id(row.job) for row in self.rows}) > 1:
            s.shared_steps += 1
        self._accept(list(self.rows), chosen, start=0, scores=scores)
        s.last_step_ms = 1000 * (time.perf_counter() - started)
        s.step_seconds += time.perf_counter() - started

    def _accept(self, rows: list[Row], tokens: list[int], start: int, scores: Scores | None = None) -> None:
        """Turn each row's new token (and its log probability and alternatives, where its request
        asked) into a chunk; finished rows leave the batch."""
        logprobs, alternatives = scores if scores is not None else (None, None)
        by_job: dict[Job, list[Chunk]] = {}
        finished: list[int] = []
        for offset, (row, token) in enumerate(zip(rows, tokens, strict=True)):
            row.tokens += 1
            row.last_token = token
            row.ids.append(token)
            self.stats.tokens += 1
            params = row.job.params
            reason = None
            if token in self.eos_ids and not params.ignore_eos:
                text, reason = row.text.flush(), "stop"
            else:
                text = row.text.push(token)
                if row.text.stopped:
                    reason = "stop"
                elif row.tokens >= params.max_tokens:
                    text, reason = text + row.text.flush(), "length"
            logprob = None if logprobs is None else logprobs[offset]
            listed = None if alternatives is None else alternatives[offset]
            meta = self._prompt_figures(row.job) if reason is not None else {}
            chunk = Chunk(
                row.index,
                text,
                1,
                reason,
                meta=meta,
                logprobs=None if logprob is None else (logprob,),
                alternatives=None if listed is None else (listed,),
            )
            by_job.setdefault(row.job, []).append(chunk)
            if reason is not None:
                finished.append(start + offset)
                self._keep_branch(row, start + offset)
        for slot in sorted(finished, reverse=True):
            self._remove(slot)
        for job, chunks in by_job.items():
            job.sink.deliver(chunks)

    def _fail_all(self, reason: str) -> None:
        jobs: dict[Job, list[Chunk]] = {}
        for row in self.rows:
            jobs.setdefault(row.job, []).append(Chunk(row.index, row.text.flush(), 0, reason))
        for job in self.waiting:
            jobs.setdefault(job, []).extend(Chunk(i, "", 0, reason) for i in range(job.n))
        while self.rows:
            self._remove(len(self.rows) - 1)
        self.waiting.clear()
        for job, chunks in jobs.items():
            job.sink.deliver(chunks)

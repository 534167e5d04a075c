"""The embedded engine: SmolLM2-135M-Instruct (or another local Llama) on torch, on this machine's CPU.

True parallel sampling as SGLang does it: a request's prompt is prefilled once and its cache
copied into n rows, then every row of every running request decodes in one batch per step
(continuous batching, `scheduler`). The model runs on the scheduler's own thread; this module is
the asyncio side: it validates requests, applies the chat template, and turns the scheduler's
per-step chunks into each `Generation`'s async stream on the caller's loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from backend.engine import Chunk, Engine, Generation, RequestRejected, SamplingParams
from backend.engines.embedded.scheduler import BatchScheduler, DecodeParams, Job

log = logging.getLogger("backend.embedded")

DEFAULT_THREADS = 1
"""torch threads inside a step: with 2 cores shared, 2 threads stalled badly under other load."""

DEFAULT_MAX_ROWS = 64
"""Rows (samples) decoding at once across all requests; beyond it requests queue. Bounds step
time and cache memory (fp32 SmolLM2: 46 KB per row per position)."""

DEFAULT_CONTEXT = 4096
"""Prompt plus max_tokens per sample; bounds one row's cache (64 rows x 4096 x 46 KB = 12 GB
at the very worst, when every row is that long)."""

END_OF_TURN = "<|im_end|>"
"""The chat template's end of a turn: a sample stops there."""


class EmbeddedEngine(Engine):
    """A Llama on the CPU, one scheduler thread, many requests sharing each step."""

    name = "embedded"

    def __init__(
        self,
        model: str = "",
        threads: int = DEFAULT_THREADS,
        dtype: str = "auto",
        max_rows: int = DEFAULT_MAX_ROWS,
        context: int = DEFAULT_CONTEXT,
    ) -> None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        if max_rows < 1:
            raise ValueError(f"--max-rows must be at least 1, got {max_rows}")
        if context < 2:
            raise ValueError(f"--context must be at least 2 tokens, got {context}")
        from backend.engines.embedded.weights import choose_dtype

        self.model_source = model
        self.threads = threads
        self.dtype = choose_dtype(dtype)
        self.max_rows = max_rows
        self.context = context
        self.tokenizer: Any = None
        self.scheduler: BatchScheduler | None = None
        self._model_name = "SmolLM2-135M-Instruct (not loaded yet)"

    @classmethod
    def from_options(cls, options: Any) -> EmbeddedEngine:
        """Build from --model, --threads, --dtype, --max-rows and --context."""
        return cls(
            model=getattr(options, "model", ""),
            threads=getattr(options, "threads", DEFAULT_THREADS),
            dtype=getattr(options, "dtype", "auto"),
            max_rows=getattr(options, "max_rows", DEFAULT_MAX_ROWS),
            context=getattr(options, "context", DEFAULT_CONTEXT),
        )

    @property
    def model(self) -> str:
        return self._model_name

    def load(self) -> None:
        """Read (converting once if needed) the weights and tokenizer, start the scheduler thread."""
        if self.scheduler is not None:
            return
        import torch

        from backend.engines.embedded.model import Llama, LlamaConfig
        from backend.engines.embedded.weights import read_config, read_tensors, resolve_model

        # The bundled model and local folders need no network; never let a library try it.
        if not self.model_source or os.path.isdir(os.path.expanduser(self.model_source)):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        folder = resolve_model(self.model_source)
        raw_config = read_config(folder.path)
        config = LlamaConfig.from_hf(raw_config)
        model = Llama(config, read_tensors(folder.path), self.dtype)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder.path)
        eos = {self.tokenizer.convert_tokens_to_ids(END_OF_TURN), self.tokenizer.eos_token_id}
        eos_ids = [i for i in eos if isinstance(i, int) and i != self.tokenizer.unk_token_id]
        self.context = min(self.context, config.max_positions)
        self.scheduler = BatchScheduler(model, self.tokenizer, eos_ids, self.max_rows, self.context)
        self.scheduler.start(self.threads)
        dtype = str(self.dtype).removeprefix("torch.")
        self._model_name = f"{folder.name}, {dtype}, {self.threads} thread(s), CPU"
        log.info("embedded engine ready: %s (torch %s)", self._model_name, torch.__version__)

    async def start(self) -> None:
        """Load off the loop (conversion can take tens of seconds on the first start)."""
        await asyncio.to_thread(self.load)

    async def stop(self) -> None:
        if self.scheduler is not None:
            scheduler, self.scheduler = self.scheduler, None
            await asyncio.to_thread(scheduler.stop)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt as one user turn of the chat template, ready for the assistant's answer."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def validate(self, prompt: str, n: int, params: SamplingParams) -> None:
        self._check(prompt, n, params)

    def _check(self, prompt: str, n: int, params: SamplingParams) -> list[int]:
        if self.scheduler is None:
            raise RequestRejected("engine_not_ready", "the embedded model is still loading; try again")
        if not (math.isfinite(params.temperature) and params.temperature >= 0):
            raise RequestRejected(
                "temperature_out_of_range", f"temperature must be a number >= 0, got {params.temperature}"
            )
        if not (math.isfinite(params.top_p) and 0 < params.top_p <= 1):
            raise RequestRejected("top_p_out_of_range", f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_k < 0:
            raise RequestRejected(
                "top_k_out_of_range", f"top_k must be >= 0 (0: no limit), got {params.top_k}"
            )
        if not 1 <= n <= self.max_rows:
            raise RequestRejected(
                "n_out_of_range",
                f"n={n} is more samples than the embedded engine runs at once ({self.max_rows}, --max-rows)",
            )
        if params.max_tokens < 1:
            raise RequestRejected(
                "max_tokens_out_of_range", f"max_tokens must be >= 1, got {params.max_tokens}"
            )
        ids = self.prompt_ids(prompt)
        if len(ids) >= self.context:
            raise RequestRejected(
                "prompt_too_long",
                f"the prompt is {len(ids)} tokens with the chat template; the context is {self.context} "
                "tokens and the answer needs room too",
            )
        if len(ids) + params.max_tokens > self.context:
            raise RequestRejected(
                "max_tokens_out_of_range",
                f"max_tokens={params.max_tokens} does not fit: the prompt takes {len(ids)} of the "
                f"{self.context}-token context, leaving {self.context - len(ids)}",
            )
        return ids

    def generate(self, prompt: str, n: int, params: SamplingParams) -> Generation:
        ids = self._check(prompt, n, params)
        return self.submit(ids, n, self.decode_params(params))

    @staticmethod
    def decode_params(params: SamplingParams, ignore_eos: bool = False) -> DecodeParams:
        """The scheduler's view of a request's sampling settings (seed resolved)."""
        if params.seed is None:
            raise ValueError("seed is not resolved")
        return DecodeParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            top_k=params.top_k,
            stop=tuple(params.stop),
            ignore_eos=ignore_eos,
        )

    def submit(self, prompt_ids: list[int], n: int, params: DecodeParams) -> EmbeddedGeneration:
        """Queue already tokenized, already validated work (the benchmark's entry point too)."""
        if self.scheduler is None:
            raise RuntimeError("the embedded engine is not started")
        generation = EmbeddedGeneration(self.scheduler, n, asyncio.get_running_loop())
        generation.job = Job(prompt_ids, n, params, generation)
        self.scheduler.submit(generation.job)
        return generation

    def health(self) -> dict[str, Any]:
        figures = self.scheduler.snapshot() if self.scheduler is not None else {"loading": True}
        return {**super().health(), **figures, "running_samples": figures.get("running_rows", 0)}


class EmbeddedGeneration(Generation):
    """One request's chunks, handed over from the scheduler thread to the caller's loop."""

    def __init__(self, scheduler: BatchScheduler, n: int, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduler = scheduler
        self._loop = loop
        self._buffer: deque[Chunk] = deque()
        self._ready = asyncio.Event()
        self._unfinished = n
        self._listener: Callable[[int], None] | None = None
        self.queue_position: int | None = None
        """Place in the engine's queue (1 = next), 0 once running, None before the scheduler saw it."""
        self.job: Job

    # Sink, called from the scheduler thread.
    def deliver(self, chunks: list[Chunk]) -> None:
        """Hand this step's chunks to the loop (one wake-up per step, however many samples)."""
        self._call_on_loop(self._receive, chunks)

    def set_queue_position(self, position: int) -> None:
        """Note the request's place in the queue (see `queue_position`)."""
        self._call_on_loop(self._set_position, position)

    def _call_on_loop(self, callback: Callable[..., None], argument: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, argument)
        except RuntimeError:
            pass  # the consumer's loop is closed: nobody is left to read

    def _receive(self, chunks: list[Chunk]) -> None:
        self._buffer.extend(chunks)
        self._ready.set()

    def _set_position(self, position: int) -> None:
        self.queue_position = position
        if self._listener is not None:
            self._listener(position)

    # Generation, on the loop.
    def watch_queue(self, listener: Callable[[int], None]) -> None:
        self._listener = listener
        if self.queue_position:
            listener(self.queue_position)

    async def __anext__(self) -> Chunk:
        while not self._buffer:
            if self._unfinished == 0:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        chunk = self._buffer.popleft()
        if chunk.finish_reason is not None:
            self._unfinished -= 1
        return chunk

    async def abort(self, index: int | None = None) -> None:
        if self._unfinished:
            self._scheduler.abort(self.job, index)

    async def aclose(self) -> None:
        if self._unfinished:
            self._scheduler.abort(self.job, None)

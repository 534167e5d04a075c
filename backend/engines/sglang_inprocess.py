"""The `sglang-engine` engine: SGLang in this process, `sglang.Engine(...)`, for a GPU machine or Space.

No separate server to run: the engine loads `--model` itself (its scheduler still runs in child
processes, so the model step never blocks this loop). `async_generate(..., stream=True)` yields
the same per-sample events as the HTTP `/generate` stream, so the same parser turns them into
deltas; abort goes to the tokenizer manager by each sample's own request id. A chat prompt is
rendered with the chat template of the tokenizer SGLang loaded and sent as token ids.

The ids are SGLang's, read from each sample's first event: with n > 1, SGLang 0.5.23 gives every
sample (and the prompt's prefix warm-up) a fresh id whatever `rid` was passed
(`TokenizerManager._handle_batch_request`), and its `abort_request` drops an id it has not
dispatched yet. A Stop on a sample not named yet is sent with its first event; a Cancel before
then ends the stream (the reader task cancelled), on which SGLang's `generate_request` aborts every
sample it dispatched and forgets the others, queued, in prefill or decoding alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import multiprocessing
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.config.declared import Setting
from backend.config.settings import DEFAULT_MODEL_ID
from backend.engines import MODEL, gpu_probe, sglang_model
from backend.engines.base import Engine, Generation, QueuedGeneration, template_token_ids
from backend.engines.gpu_preflight import GpuFacts, check, needs_fp16
from backend.engines.http.sglang import sglang_request
from backend.engines.http.sglang_launch import exit_words
from backend.engines.http.streams import SGLangStream
from backend.engines.sglang_model import ModelNotFound, SGLangModel
from backend.engines.sglang_settings import engine_kwargs
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines import EngineOptions

log = logging.getLogger("backend.engines.sglang_inprocess")

ARGS = Setting(
    "sglang_args",
    "--sglang-args",
    ("SGLANG_ENGINE_ARGS",),
    "engine `sglang-engine`: `sglang.Engine` arguments as a JSON object, e.g. "
    '`{"tp_size": 2, "mem_fraction_static": 0.8}`',
    default="",
)
SETTINGS = (ARGS, MODEL)


def process_title(pid: int) -> str:
    """A process's title as SGLang sets it ("sglang::scheduler"), or "child" where it cannot be read."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
    except OSError:
        return "child"
    return title or "child"


def parse_engine_args(options: EngineOptions) -> dict[str, Any]:
    """`--sglang-args` as keyword arguments; ValueError saying what is wrong."""
    text = options.sglang_args or ""
    if not text.strip():
        return {}
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--sglang-args must be a JSON object of sglang.Engine arguments: {exc}") from None
    if not isinstance(args, dict) or "model_path" in args:
        raise ValueError('--sglang-args must be a JSON object such as {"tp_size": 2}; the model is --model')
    return args


class SGLangInProcessEngine(Engine):
    """`sglang.Engine(model_path=model, **engine_args)`, created on start and shut down on stop."""

    name = "sglang-engine"

    def __init__(
        self,
        model_path: str = "",
        probe: Callable[[], GpuFacts] = gpu_probe.probe,
        locate: Callable[[str], SGLangModel] = sglang_model.resolve,
        **engine_args: Any,
    ) -> None:
        self.requested_model = model_path
        """`--model` as given; empty for the default (`backend.engines.sglang_model`)."""
        self.model_path = model_path or DEFAULT_MODEL_ID
        """What SGLang loads: `requested_model` until `start` has found it (a folder, or a hub id)."""
        self.locate = locate
        """Finds what SGLang loads for `requested_model` (`sglang_model.resolve`; a stand-in in tests)."""
        self.engine_args = engine_args
        """The user's `sglang.Engine` arguments (`--sglang-args`)."""
        self.probe = probe
        """Reads this machine's GPU facts for the preflight (a stand-in in tests)."""
        self.started_args: dict[str, Any] = {}
        """The arguments `sglang.Engine` got: the dashboard's defaults for this GPU, then the user's."""
        self.sglang: Any = None
        self.generations: set[SGLangInProcessGeneration] = set()
        self.children: dict[int, tuple[multiprocessing.process.BaseProcess, str]] = {}
        """SGLang's processes (scheduler, detokenizer) by pid, with their titles, once started."""
        self.sglang_requests: int | None = None
        """Requests SGLang's scheduler runs or queues, its own count (`/v1/loads`' figures), as last
        read by `health()`; None before the first reading."""
        self._load_task: asyncio.Task[None] | None = None

    @classmethod
    def from_options(cls, options: EngineOptions) -> SGLangInProcessEngine:
        """Build from the command line's `--model` and `--sglang-args` (a JSON object of
        `sglang.Engine` keyword arguments, such as `{"tp_size": 2, "mem_fraction_static": 0.8}`)."""
        return cls(options.model, **parse_engine_args(options))

    @property
    def model(self) -> str:
        return f"{self.model_path} (SGLang in-process)"

    async def preflight(self) -> GpuFacts:
        """Check the machine's GPU before SGLang starts on it: RuntimeError naming every missing
        part where SGLang cannot use it; the rest is logged and said on the page (`notice`)."""
        if str(self.engine_args.get("device", "cuda")).split(":")[0] != "cuda":
            return GpuFacts()  # SGLang on the CPU (or another device) by the user's choice
        facts = await asyncio.to_thread(self.probe)
        report = check(facts)
        for finding in report.findings:
            log.warning("GPU preflight: %s", finding.sentence())
        if not report.ready:
            raise RuntimeError(
                "SGLang cannot use this machine's GPU as it stands: " + report.summary(report.blocking)
            )
        if report.findings:
            self.notice = report.summary()
        return facts

    async def start(self) -> None:
        # Importing SGLang takes seconds (3.2 s on an idle 2-core host, more under load): off the loop,
        # which keeps answering /health and the page meanwhile.
        sglang = await asyncio.to_thread(importlib.import_module, "sglang")
        facts = await self.preflight()
        try:
            chosen = await asyncio.to_thread(self.locate, self.requested_model)
        except ModelNotFound as exc:
            raise RuntimeError(str(exc)) from None
        self.model_path = chosen.path
        self.notice = "; ".join(said for said in (self.notice, chosen.note) if said)
        self.started_args = engine_kwargs(self.engine_args, fp16=needs_fp16(facts))
        # Loading weights and starting the scheduler processes blocks for seconds to minutes.
        try:
            self.sglang = await asyncio.to_thread(
                sglang.Engine, model_path=self.model_path, **self.started_args
            )
        except Exception as exc:
            raise RuntimeError(
                f"SGLang could not load {self.model_path}: {type(exc).__name__}: {exc}"
            ) from exc
        self.children = {
            child.pid: (child, process_title(child.pid))
            for child in multiprocessing.active_children()
            if child.pid
        }
        # SGLang starts its request loop, and puts its own SIGTERM and SIGQUIT handlers on this loop,
        # on the first request; start it now, so that the backend can put its own back once (see
        # backend.serving.process) instead of SGLang's draining `sys.exit` answering the next SIGTERM.
        self.sglang.tokenizer_manager.auto_create_handle_loop()

    async def stop(self) -> None:
        await asyncio.gather(*(g.aclose() for g in list(self.generations)), return_exceptions=True)
        if self.sglang is not None:
            engine, self.sglang = self.sglang, None
            self.children = {}
            await asyncio.to_thread(engine.shutdown)

    def lost_cause(self) -> str | None:
        """Which of SGLang's processes has exited, and how (its scheduler, killed or crashed)."""
        for pid, (child, title) in self.children.items():
            if not child.is_alive():
                return f"SGLang's {title} process (pid {pid}) ended, {exit_words(child.exitcode or 0)}"
        return None

    @property
    def incremental(self) -> bool:
        """Whether the engine streams deltas rather than cumulative text."""
        server_args = getattr(self.sglang, "server_args", None)
        return bool(getattr(server_args, "incremental_streaming_output", False))

    @property
    def tokenizer(self) -> Any:
        """The served model's Hugging Face tokenizer, as SGLang loaded it (None before start)."""
        return None if self.sglang is None else self.sglang.tokenizer_manager.tokenizer

    @property
    def chat_template(self) -> bool | None:
        tokenizer = self.tokenizer
        return None if tokenizer is None else getattr(tokenizer, "chat_template", None) is not None

    @property
    def template_note(self) -> str:
        return "none in the tokenizer SGLang loaded"

    def chat_token_ids(self, prompt: Prompt) -> list[int]:
        """A chat prompt's tokens in the model's chat template, the assistant's turn opened (and
        begun with the prefix of a continuation)."""
        return template_token_ids(self.tokenizer, prompt.messages(), prompt.prefix)

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        if self.sglang is None:
            raise RuntimeError("the SGLang engine is not started")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        return SGLangInProcessGeneration(self, prompt, n, params)

    def abort_request(self, rid: str) -> None:
        """Stop the sample with request id `rid`."""
        self.sglang.tokenizer_manager.abort_request(rid=rid)

    def health(self) -> dict[str, Any]:
        self._refresh_load()
        return {
            **super().health(),
            "loaded": self.sglang is not None,
            "running_requests": len(self.generations),
            "running_samples": sum(len(g.state.unfinished) for g in self.generations),
            "sglang_requests": self.sglang_requests,
        }

    def _refresh_load(self) -> None:
        """Ask SGLang's scheduler for its load (what `/v1/loads` reads) on a task, for the next
        `health()`: asked only when health is, so an idle dashboard's loop does nothing for it."""
        if self.sglang is None or (self._load_task is not None and not self._load_task.done()):
            return
        try:
            self._load_task = asyncio.get_running_loop().create_task(self._read_load(), name="sglang-load")
        except RuntimeError:
            return  # not on the loop (a test's plain call): the last reading stands

    async def _read_load(self) -> None:
        try:
            loads = await self.sglang.tokenizer_manager.get_loads()
        except Exception as exc:  # noqa: BLE001 - a reading that fails says nothing new
            log.debug("SGLang's load could not be read: %s", exc)
            return
        self.sglang_requests = sum(load.num_running_reqs + load.num_waiting_reqs for load in loads)


@functools.lru_cache(maxsize=1 << 17)
def token_text(tokenizer: Any, token: int) -> str:
    """Token `token`'s text alone, as SGLang's tokenizer decodes it (an alternative's name), kept
    once decoded: SGLang's engine API gives alternatives by id only."""
    text: str = tokenizer.decode([token])
    return text


class SGLangInProcessGeneration(QueuedGeneration):
    """One `async_generate` stream read by a task into a queue, like the HTTP engines."""

    def __init__(self, engine: SGLangInProcessEngine, prompt: Prompt, n: int, params: SamplingParams) -> None:
        self.engine = engine
        tokenizer = engine.tokenizer
        self.state = SGLangStream(
            n,
            incremental=engine.incremental,
            logprobs=params.logprobs,
            alternatives=params.alternatives,
            token_text=None if tokenizer is None else functools.partial(token_text, tokenizer),
        )
        self._sampling = sglang_request(prompt.text, n, params)["sampling_params"]
        self._logprob: dict[str, Any] = {"return_logprob": True} if params.logprobs else {}
        if params.logprobs and params.alternatives:
            self._logprob["top_logprobs_num"] = params.alternatives
        self._source: dict[str, Any] = (
            {"input_ids": engine.chat_token_ids(prompt)} if prompt.chat else {"prompt": prompt.raw_text}
        )
        super().__init__(n, engine.generations)
        self._pending_aborts: set[int] = set()
        self._reader = asyncio.create_task(self._read(), name="sglang-engine-stream")

    async def _read(self) -> None:
        try:
            stream: AsyncIterator[dict[str, Any]] = await self.engine.sglang.async_generate(
                sampling_params=self._sampling, stream=True, **self._source, **self._logprob
            )
            async for event in stream:
                for chunk in self.state.feed_event(event):
                    self._queue.put_nowait(chunk)
                self._abort_pending()
            for chunk in self.state.fail_unfinished("SGLang ended the stream before the sample finished"):
                self._queue.put_nowait(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - SGLang raises its own types; the server reports it
            self._queue.put_nowait(RuntimeError(f"SGLang failed: {exc}"))

    def _abort_pending(self) -> None:
        for index in list(self._pending_aborts):
            rid = self.state.request_id(index)
            if rid is not None:
                self._pending_aborts.discard(index)
                self.engine.abort_request(rid)

    async def abort(self, index: int | None = None) -> None:
        targets = self.state.unfinished if index is None else [index]
        self._pending_aborts.update(i for i in targets if not self.state.samples[i].finished)
        self._abort_pending()
        if index is None and self._pending_aborts:
            # Samples SGLang has not named yet (queued, in prefill, the prefix warm-up of n > 1):
            # ending the stream makes SGLang abort whatever of the request it has sent to its
            # scheduler, and drop the rest.
            await self._close_stream()

    async def _close_stream(self) -> None:
        """Cancel the reader: SGLang's `generate_request` then aborts every sample of the request
        it dispatched and forgets the others; open samples end as `abort`."""
        if not self._reader.done():
            self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(self._reader, return_exceptions=True)
        self._pending_aborts.clear()
        for index in self.state.unfinished:
            self.state.samples[index].finished = True
            self._queue.put_nowait(Chunk(index, "", 0, "abort"))

    async def aclose(self) -> None:
        if self.state.unfinished:
            await self.abort(None)
        await self._close_stream()
        self.engine.generations.discard(self)

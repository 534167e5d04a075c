"""The `sglang` engine: a running SGLang server (or a router in front of many) by URL.

One request is one native `POST /generate` with `sampling_params.n` and `stream: true`: with the text
of a raw prompt, or the token ids of a chat prompt, rendered with the served model's own chat
template by the server's `/tokenize` (one extra call of a few ms per request). Each sample
of it has its own request id on the server (`meta_info.id`), so Stop on one column aborts exactly
that sample with `POST /abort_request {"rid": <its id>}`, and Cancel aborts each sample of the
request the same way (never `abort_all`, which would stop other users' requests too). The ids are
SGLang's: with n > 1, SGLang 0.5.23 replaces any `rid` given with one fresh id per sample
(`TokenizerManager._handle_batch_request`), and an `/abort_request` for an id it has not registered
yet is dropped, so no id chosen here could stop a sample before the server knows it. A Stop on a
sample whose id has not arrived yet is sent as soon as its first chunk brings it; a Cancel before
then closes the stream, and SGLang aborts every sample of a request whose client went away (queued,
in prefill, or decoding).

Behind SGLang's router (`sglang-router`), which forwards `/generate` but neither `/abort_request`
nor `/tokenize` (both answer 404 there), the engine reads the router's workers from its
`GET /workers` and sends those two calls to the workers themselves: an abort to every worker (a
worker that does not run that id ignores it), a chat prompt's rendering to the first that answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from backend.config.declared import Setting
from backend.engines import sglang_model
from backend.engines.base import Generation
from backend.engines.http.base import (
    CONTROL_TIMEOUT_S,
    EngineUnavailable,
    HTTPEngine,
    StreamingGeneration,
    describe_http_error,
)
from backend.engines.http.sglang_launch import SERVER_ARGS, START_TIMEOUT, SGLangServerProcess, exit_words
from backend.engines.http.streams import SGLangStream
from backend.engines.sglang_model import ModelNotFound, SGLangModel
from backend.vocabulary import Chunk, Prompt, SamplingParams

# httpx is imported in the functions that use it: `import httpx` loads its command line too (rich,
# click, pygments: 7 MB and 130 modules), and every backend imports this module for its settings.
if TYPE_CHECKING:
    import httpx

    from backend.engines import EngineOptions

log = logging.getLogger("backend.engines.http.sglang")

EXIT_WAIT_S = 1.0
"""How long a broken stream waits to learn whether the launched server is exiting."""

LOST_LOG_LINES = 8
"""Lines of a launched server's log quoted when it exits while serving."""

DEFAULT_SGLANG_URL = "http://127.0.0.1:30000"
"""Where `python -m sglang.launch_server` listens by default."""

URL = Setting(
    "sglang_url",
    "--sglang-url",
    ("SGLANG_URL",),
    "engine `sglang` (and `auto`): an SGLang server or router",
    default="",
)
API_KEY = Setting(
    "sglang_api_key",
    "--sglang-api-key",
    ("SGLANG_API_KEY",),
    "engine `sglang`: the key of a server started with `--api-key` (sent as a bearer token; prefer "
    "the variable, a flag shows in `ps`)",
    default="",
)
SETTINGS = (URL, API_KEY, SERVER_ARGS, START_TIMEOUT)
"""Its own, and those of the SGLang server `--engine auto` starts for it (`sglang_launch`)."""


class SGLangEngine(HTTPEngine):
    """SGLang's native API at `url`."""

    name = "sglang"
    label = "SGLang"
    key_setting = "--sglang-api-key or SGLANG_API_KEY"

    def __init__(
        self,
        url: str = DEFAULT_SGLANG_URL,
        launcher: SGLangServerProcess | None = None,
        api_key: str = "",
        model_request: str | None = None,
        locate: Callable[[str], SGLangModel] = sglang_model.resolve,
    ) -> None:
        super().__init__(url, api_key)
        self.launcher = launcher
        """The child process serving `url`, started and stopped with the engine (--engine auto on a GPU)."""
        self.model_request = model_request
        """`--model` for the launched server (empty: the default), found by `locate` before it starts
        (`backend.engines.sglang_model`); None where the launcher's model is taken as it is."""
        self.locate = locate
        self.incremental = False
        """Whether the server runs with --incremental-streaming-output (read from /server_info)."""
        self.workers: list[str] = []
        """The URLs of the workers behind the router at `url`, healthy ones first, as its
        `GET /workers` lists them; empty where `url` is a server, not a router."""

    async def start(self) -> None:
        if self.launcher is not None:
            if self.model_request is not None:
                try:
                    chosen = await asyncio.to_thread(self.locate, self.model_request)
                except ModelNotFound as exc:
                    raise RuntimeError(str(exc)) from None
                self.launcher.model = chosen.path
                self.notice = "; ".join(said for said in (self.notice, chosen.note) if said)
            await asyncio.to_thread(self.launcher.start)
            self.notice = "; ".join(said for said in (self.notice, self.launcher.earlier) if said)
            if self.launcher.url != self.url:  # another program took the port first: it moved
                self.url = self.launcher.url
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None
        await super().start()

    async def stop(self) -> None:
        if self.launcher is None:
            await super().stop()
            return
        # At once, not after the streams are closed: abort calls to a server that no longer answers
        # would take their whole timeout, and a container gives the stop 10 s.
        await asyncio.gather(super().stop(), asyncio.to_thread(self.launcher.stop))

    async def failure_cause(self) -> str | None:
        """Where the stream broke because the launched server is exiting (its scheduler died), that
        cause: the server's exit is waited for up to EXIT_WAIT_S."""
        if self.launcher is None:
            return None
        deadline = asyncio.get_running_loop().time() + EXIT_WAIT_S
        while (cause := self.lost_cause()) is None and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110 - a process's exit has no event here
            await asyncio.sleep(0.1)
        return cause

    def lost_cause(self) -> str | None:
        """Why the SGLang server this dashboard started can no longer serve: it exited by itself
        (SGLang's server exits when its scheduler dies). None for a server given by URL, which the
        periodic check follows instead."""
        if self.launcher is None or self.served_model is None:
            return None
        code = self.launcher.exited()
        if code is None:
            return None
        tail = self.launcher.log_tail(LOST_LOG_LINES)
        return f"the SGLang server it started exited ({exit_words(code)}){tail}"

    @classmethod
    def from_options(cls, options: EngineOptions) -> SGLangEngine:
        """Build from the command line's `--sglang-url` and `--sglang-api-key`."""
        url = options.sglang_url or DEFAULT_SGLANG_URL
        return cls(url, api_key=options.sglang_api_key)

    async def probe(self) -> str:
        if self.served_model is None:
            # SGLang's /health runs a one-token generation: asked once, not on every periodic check.
            response = await self.client.get("/health")
            if response.status_code != 200:
                raise EngineUnavailable(f"/health answered HTTP {response.status_code}")
        try:
            info = await self.get_json("/model_info")
            name = info.get("served_model_name") or info.get("model_path")
        except EngineUnavailable:
            # A router may not proxy /model_info; every SGLang front speaks the OpenAI model list.
            models = (await self.get_json("/v1/models")).get("data") or [{}]
            name = models[0].get("id")
        if self.served_model is None or self.workers:
            self.workers = await self.router_workers()
        if self.served_model is None:
            try:
                # Behind a router, the workers stream: ask one of them how.
                server_info = await self.get_json(
                    f"{self.workers[0]}/server_info" if self.workers else "/server_info"
                )
                self.incremental = bool(server_info.get("incremental_streaming_output", False))
            except (EngineUnavailable, ValueError):
                pass  # routers answer only what they proxy; the default server streams cumulative text
        return str(name or "unknown model")

    async def router_workers(self) -> list[str]:
        """The worker URLs a router at `url` lists (healthy first); [] where `url` is a server."""
        response = await self.client.get("/workers")
        if response.status_code != 200:
            return []  # a plain SGLang server: 404
        try:
            listed = response.json().get("workers")
        except (ValueError, AttributeError):
            return []
        if not isinstance(listed, list):
            return []
        workers = [w for w in listed if isinstance(w, dict) and isinstance(w.get("url"), str)]
        workers.sort(key=lambda worker: worker.get("is_healthy") is False)
        return [str(worker["url"]).rstrip("/") for worker in workers]

    async def post_tokenize(self, body: dict[str, Any]) -> httpx.Response:
        import httpx

        if not self.workers:
            return await super().post_tokenize(body)
        # The router does not forward /tokenize: any worker renders the same template.
        failure: httpx.TransportError | None = None
        for worker in self.workers:
            try:
                return await self.client.post(f"{worker}/tokenize", json=body)
            except httpx.TransportError as exc:  # a worker that is down: ask the next
                failure = exc
        assert failure is not None
        raise failure

    def health(self) -> dict[str, Any]:
        health = super().health()
        if self.workers:
            health["router_workers"] = list(self.workers)
        if self.launcher is not None and self.served_model is None:
            log = f"; its output goes to {self.launcher.log_path}" if self.launcher.log_path else ""
            health["loading_status"] = (
                f"starting an SGLang server for {self.launcher.model}, {self.launcher.starting_words()}{log}"
            )
        return health

    @property
    def chat_template(self) -> bool | None:
        # Chat prompts are rendered by the server's /tokenize: without it there is no template to use.
        return False if self.has_template is None and self.served_model is not None else self.has_template

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        return SGLangGeneration(self, prompt, n, params)

    async def abort_request(self, rid: str) -> None:
        """Ask the server to stop the sample with request id `rid`; behind a router, every worker
        (only the one running `rid` has anything to stop). EngineUnavailable if none took it."""
        targets = self.workers or [self.url]
        problems = await asyncio.gather(*(self._abort_on(url, rid) for url in targets))
        if all(problems):
            raise EngineUnavailable(f"SGLang did not take the abort of {rid}: {'; '.join(problems)}")

    async def _abort_on(self, url: str, rid: str) -> str:
        """POST /abort_request for `rid` to the server at `url`: "" if it took it, else why not."""
        import httpx

        try:
            response = await self.client.post(
                f"{url}/abort_request", json={"rid": rid}, timeout=CONTROL_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            return f"{url}: {describe_http_error(exc)}"
        if response.status_code >= 300:
            refused = self.refused(response.status_code)
            return f"{url} answered /abort_request with HTTP {response.status_code}" + (
                f": {refused}" if refused else ""
            )
        return ""


def sglang_request(prompt: str | list[int], n: int, params: SamplingParams) -> dict[str, Any]:
    """The body of `POST /generate` for `n` samples of `prompt`: text, or token ids (a chat prompt
    rendered with the model's template).

    No seed is sent: SGLang would give every one of the n samples the same seed, so they would be
    identical; without one each sample draws differently.
    """
    source = {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
    body = {
        **source,
        "sampling_params": {
            "n": n,
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        },
        "stream": True,
    }
    if params.logprobs:
        body["return_logprob"] = True  # the output tokens' only: logprob_start_len stays -1
        if params.alternatives:
            body["top_logprobs_num"] = params.alternatives
            body["return_text_in_logprobs"] = True
    return body


class SGLangGeneration(StreamingGeneration):
    """One `/generate` stream; aborts go to /abort_request by each sample's own id."""

    engine: SGLangEngine
    state: SGLangStream

    def __init__(self, engine: SGLangEngine, prompt: Prompt, n: int, params: SamplingParams) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")  # SGLang itself would answer n=0 with 1
        self._prompt = prompt
        self._body = sglang_request(prompt.raw_text, n, params)
        self._pending_aborts: set[int] = set()
        stream = SGLangStream(
            n, incremental=engine.incremental, logprobs=params.logprobs, alternatives=params.alternatives
        )
        super().__init__(engine, stream)

    async def prepare(self) -> None:
        if self._prompt.chat:
            # The server renders its own template (/tokenize); /generate then takes the token ids and
            # streams as it does for text: per-sample ids for /abort_request, every meta_info figure.
            prompt = self._prompt
            if prompt.prefix:  # a continuation: the assistant's turn begun with the prefix
                ids = await self.engine.chat_token_ids(prompt.continued_messages(), continued=True)
            else:
                ids = await self.engine.chat_token_ids(prompt.messages())
            body = {key: value for key, value in self._body.items() if key != "text"}
            self._body = {"input_ids": ids, **body}

    def request(self) -> tuple[str, dict[str, Any]]:
        return "/generate", self._body

    def on_payload(self, payload: str) -> list[Chunk]:
        chunks = self.state.feed(payload)
        for index in list(self._pending_aborts):
            if self.state.request_id(index) is not None:
                self._pending_aborts.discard(index)
                self._send_abort(index)
        return chunks

    async def abort(self, index: int | None = None) -> None:
        targets = self.state.unfinished if index is None else [index]
        unknown = False
        for target in targets:
            if self.state.samples[target].finished:
                continue
            if self.state.request_id(target) is None:
                self._pending_aborts.add(target)
                unknown = True
            else:
                self._send_abort(target)
        if index is None and unknown:
            # A sample whose id has not arrived yet (before its first chunk: queued, in prefill, or
            # the prompt's prefix warm-up of n > 1) cannot be named to /abort_request, and SGLang
            # 0.5.23 gives each sample of n > 1 an id of its own making. Closing the stream can:
            # SGLang aborts every sample of a request whose client went away.
            await self.close_stream("abort")
        elif index is None:
            self.spawn(self.cut_off_after_grace())

    def _send_abort(self, index: int) -> None:
        rid = self.state.request_id(index)
        if rid is not None:
            self.spawn(self._abort_call(rid))

    async def _abort_call(self, rid: str) -> None:
        try:
            await self.engine.abort_request(rid)
        except EngineUnavailable as exc:
            # The stream still ends the sample (or the grace cut-off does); say why it may go on.
            log.warning("%s", exc)

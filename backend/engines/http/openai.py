"""The `openai` engine: any OpenAI-compatible server (vLLM, SGLang, routers).

One request is one `POST /v1/chat/completions` (a chat prompt: the server applies the model's chat
template) or `POST /v1/completions` (a raw prompt) with `n`, `stream: true` and
`stream_options.include_usage`. Whether the model has a template is asked of the server's
`/tokenize` (vLLM and SGLang have it); where a server has none, chat is tried. Choices are told
apart by `choices[].index` only: vLLM sends one id for all of them, SGLang one per choice. The API
has no way to stop one choice, so Stop on one column ends that sample at once in the dashboard and
drops its later chunks, while the server finishes it; once every sample is stopped or done, the
connection is closed, which makes the server abort whatever still runs. Cancel closes the connection
at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backend.config.declared import Setting
from backend.engines import MODEL
from backend.engines.base import Generation
from backend.engines.http.base import HTTPEngine, StreamingGeneration
from backend.engines.http.streams import OpenAIStream
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines import EngineOptions

DEFAULT_OPENAI_URL = "http://127.0.0.1:8000"
"""Where vLLM's OpenAI-compatible server listens by default."""

URL = Setting(
    "openai_url",
    "--openai-url",
    ("OPENAI_URL",),
    "engine `openai` (and `auto`): an OpenAI-compatible server such as vLLM",
    default="",
)
API_KEY = Setting(
    "openai_api_key",
    "--openai-api-key",
    ("OPENAI_API_KEY",),
    "engine `openai`: the server's API key (vLLM's `--api-key`)",
    default="",
)
SETTINGS = (URL, API_KEY, MODEL)


class OpenAIEngine(HTTPEngine):
    """An OpenAI-compatible completions server at `url` (the `/v1` prefix is added here)."""

    name = "openai"
    label = "OpenAI-compatible server"
    key_setting = "--openai-api-key or OPENAI_API_KEY"

    def __init__(self, url: str = DEFAULT_OPENAI_URL, model_name: str = "", api_key: str = "") -> None:
        super().__init__(url.removesuffix("/").removesuffix("/v1"), api_key)
        self.requested_model = model_name
        """The model to ask for (--model); empty: the first the server lists."""

    @classmethod
    def from_options(cls, options: EngineOptions) -> OpenAIEngine:
        """Build from the command line's `--openai-url`, `--model` and `--openai-api-key`."""
        return cls(
            options.openai_url or DEFAULT_OPENAI_URL,
            options.model,
            options.openai_api_key,
        )

    async def probe(self) -> str:
        listed = [m.get("id") for m in (await self.get_json("/v1/models")).get("data") or []]
        if self.requested_model:
            if self.requested_model not in listed:
                raise ValueError(
                    f"it does not serve {self.requested_model!r} (it serves {', '.join(listed)})"
                )
            return self.requested_model
        if not listed:
            raise ValueError("it lists no model at /v1/models")
        return str(listed[0])

    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        return OpenAIGeneration(self, prompt, n, params)


def completions_request(
    model: str, prompt: Prompt, n: int, params: SamplingParams
) -> tuple[str, dict[str, Any]]:
    """The path and body of the request for `n` streamed choices of `prompt`: `/v1/chat/completions`
    with the prompt's messages for a chat prompt (the server applies the model's chat template),
    `/v1/completions` with its text for a raw one.

    No seed is sent: one seed for all n choices can make them identical on some servers.
    """
    body = {
        "model": model,
        "n": n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prompt.chat:
        if params.logprobs:
            body["logprobs"] = True  # the chosen tokens' own, and their alternatives where asked
            if params.alternatives:
                body["top_logprobs"] = params.alternatives
        if prompt.prefix:
            # A continuation: the assistant's turn begun with the prefix, continued, not closed.
            continued = {"continue_final_message": True, "add_generation_prompt": False}
            return "/v1/chat/completions", {**body, "messages": prompt.continued_messages(), **continued}
        return "/v1/chat/completions", {**body, "messages": prompt.messages()}
    if params.logprobs:
        # The completions API's count of alternatives: 0 gives the chosen token's only.
        body["logprobs"] = params.alternatives
    return "/v1/completions", {**body, "prompt": prompt.raw_text}


class OpenAIGeneration(StreamingGeneration):
    """One `/v1/completions` stream with n choices."""

    engine: OpenAIEngine
    state: OpenAIStream

    def __init__(self, engine: OpenAIEngine, prompt: Prompt, n: int, params: SamplingParams) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        model = engine.requested_model or engine.served_model or ""
        self._request = completions_request(model, prompt, n, params)
        super().__init__(
            engine,
            OpenAIStream(
                n,
                hold_last_finish=True,
                chat=prompt.chat,
                logprobs=params.logprobs,
                alternatives=params.alternatives,
            ),
        )

    def request(self) -> tuple[str, dict[str, Any]]:
        return self._request

    def tail(self) -> list[Chunk]:
        return self.state.close()

    async def abort(self, index: int | None = None) -> None:
        if index is None:
            await self.close_stream("abort")
            return
        sample = self.state.samples[index]
        if sample.finished:
            return
        sample.finished = True
        self._put([Chunk(index, "", 0, "abort")])
        if not self.state.unfinished:
            await self.close_stream("abort")

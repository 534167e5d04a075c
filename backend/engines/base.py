"""The Engine interface: one request in, per-sample delta chunks out, abort one sample or all.

Every engine (embedded, SGLang, OpenAI-compatible, synthetic) sits behind these few types; what a
request says (`Prompt`, `SamplingParams`) and what comes back (`Chunk`) are `backend.vocabulary`'s. Engines
normalise what their source sends (cumulative text, deltas, per-sample ids) so that the server only
ever sees `Chunk`s carrying deltas keyed by sample index.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.saved_run import SavedRun
from backend.vocabulary import Chunk, Prompt, SamplingParams

if TYPE_CHECKING:
    from backend.engines.registry import EngineOptions


def template_token_ids(tokenizer: Any, messages: list[dict[str, str]], prefix: str = "") -> list[int]:
    """The token ids of `messages` in a Hugging Face tokenizer's chat template, the assistant's turn
    opened, then those of `prefix`, the start of the assistant's answer (as SGLang's server renders
    `continue_final_message`); ValueError from the tokenizer where it has no template."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if prefix:
        ids.extend(tokenizer.encode(prefix, add_special_tokens=False))
    return ids


@dataclass(frozen=True)
class FormatChoice:
    """The format a request runs in, and why, as the `accepted` frame tells the client."""

    prompt: Prompt
    reason: str
    """Why, in words for the page (the format itself is `prompt.format`)."""


def choose_format(
    text: str, requested: str | None, system: str, has_template: bool | None, template_note: str = ""
) -> FormatChoice:
    """The prompt a request runs with, given what it asked for and whether the model has a template.

    `requested` None means "chat where the model has a template". `has_template` None means the
    engine cannot tell, or the format makes no difference to it (`template_note` says which); the
    request then runs as asked, chat by default. A model without a template runs raw, whatever was
    asked, and the reason says so: the alternative, an error, would leave a base model unusable from
    a page that defaults to chat. `template_note` says why there is no template.
    """
    if requested == "raw":
        return FormatChoice(Prompt(text, "raw"), "plain completion, as asked")
    note = f" ({template_note})" if template_note else ""
    if has_template is False:
        dropped = "; the system prompt is not used" if system else ""
        reason = f"the model has no chat template{note}, so the prompt is sent as it is{dropped}"
        return FormatChoice(Prompt(text, "raw"), reason)
    with_system = ", with the system prompt" if system else ""
    if has_template is None:
        asked = "as asked" if requested == "chat" else "the default"
        return FormatChoice(Prompt(text, "chat", system), f"{asked}{with_system}{note}")
    asked = "as asked" if requested == "chat" else "the default where the model has one"
    return FormatChoice(Prompt(text, "chat", system), f"the model's chat template{with_system}, {asked}")


class RequestRejected(ValueError):
    """A request the engine cannot run, refused before any work starts.

    `code` is the `error` frame's code; the message says what to change, in words a person reads.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Generation(ABC):
    """One running request: an async iterator over the chunks of all its samples, interleaved.

    The iterator yields exactly one chunk with a finish reason per sample, then stops. `abort`
    makes the engine stop generating (one sample, or all); the aborted samples still end with a
    chunk whose finish reason is "abort". `aclose` stops everything and releases the engine's
    resources; it is safe to call more than once and after the iterator ended.
    """

    def __aiter__(self) -> Generation:
        return self

    @abstractmethod
    async def __anext__(self) -> Chunk:
        """The next chunk of any sample, in arrival order."""

    @abstractmethod
    async def abort(self, index: int | None = None) -> None:
        """Stop generating sample `index`, or every sample when `index` is None."""

    @abstractmethod
    async def aclose(self) -> None:
        """Abort whatever still runs and release the request's resources."""

    def watch_queue(self, listener: Callable[[int], None]) -> None:  # noqa: B027 - optional hook
        """Call `listener(position)` on the loop while the request waits for room in the engine.

        Position k >= 1: k - 1 requests are ahead; 0: it has started. Engines without a queue
        never call it.
        """


class SampleTasksGeneration(Generation):
    """A generation made of one task per sample, each putting its chunks on one queue (the synthetic
    and replay engines). Subclasses start `_tasks`; the iterator ends after every sample's finish
    chunk; it is in `running` (the engine's set of running generations) until then or `aclose`."""

    def __init__(self, n: int, running: set[Any]) -> None:
        self._queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self._unfinished = n
        self._tasks: list[asyncio.Task[None]] = []
        self._running = running
        running.add(self)

    @property
    def running_samples(self) -> int:
        """Sample tasks still running."""
        return sum(not task.done() for task in self._tasks)

    async def __anext__(self) -> Chunk:
        if self._unfinished == 0:
            self._running.discard(self)
            raise StopAsyncIteration
        chunk = await self._queue.get()
        if chunk.finish_reason is not None:
            self._unfinished -= 1
        return chunk

    async def abort(self, index: int | None = None) -> None:
        """Cancel sample `index`'s task, or every sample's."""
        targets = self._tasks if index is None else [self._tasks[index]]
        for task in targets:
            task.cancel()

    async def aclose(self) -> None:
        """Cancel the tasks still running and wait for them."""
        running = [task for task in self._tasks if not task.done()]
        for task in running:
            task.cancel()
        if running:  # after a full run every sample task has ended: nothing to wait for
            await asyncio.gather(*running, return_exceptions=True)
        self._running.discard(self)


class QueuedGeneration(Generation):
    """A generation whose chunks (or the exception that ends it) a reader task of its own puts on a
    queue, as the HTTP engines and in-process SGLang read their streams. It is in `running` (the
    engine's set of running generations) until its last sample finished."""

    def __init__(self, n: int, running: set[Any]) -> None:
        self._queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        self._unfinished = set(range(n))
        self._running = running
        running.add(self)

    async def __anext__(self) -> Chunk:
        if not self._unfinished:
            self._running.discard(self)
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._unfinished.clear()
            raise item
        if item.finish_reason is not None:
            self._unfinished.discard(item.index)
        return item


class Engine(ABC):
    """A source of parallel samples, chosen by `name` on the command line."""

    name: str = ""
    """Registry name (`--engine NAME`)."""

    notice: str = ""
    """What the page's engine line should warn of besides the engine and model (set by whoever
    chose the engine: `--engine auto` serving the CPU model on a machine whose GPU SGLang cannot
    use says why here); empty for nothing."""

    plays: SavedRun | None = None
    """The saved run this engine streams whatever a request asks (a replay's), or None: the server
    then runs the run's request in place of the client's (`backend.protocol.replayed_command`)."""

    runs_on_any_loop: bool = False
    """Whether any loop may drive the engine: it holds nothing on the loop it started on (a saved
    run's replay). Others run their requests on their own loop, and a server on another loop (the
    experiment server) hands them across (`backend.serving.experiments.BridgedEngine`)."""

    @property
    @abstractmethod
    def model(self) -> str:
        """What produces the text, as shown to the user."""

    @property
    def task_prefix(self) -> str:
        """How the names of the tasks the engine starts begin, `{name}-` (`synthetic-sample-3`): the
        page's trace draws the tasks of the engine its run's `accepted` frame names as the engine's."""
        return f"{self.name}-"

    async def start(self) -> None:  # noqa: B027 - optional hook, most engines need no start-up
        """Load weights or connect; called once on the server's loop before serving."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Release what `start` acquired."""

    @property
    def chat_template(self) -> bool | None:
        """Whether the model has a chat template; None where the engine cannot tell or the format
        makes no difference to it. Read for every request, so it may change (a server restarted
        with another model)."""
        return None

    @property
    def template_note(self) -> str:
        """Why there is no chat template, in a few words, where `chat_template` is False."""
        return ""

    def choose_format(self, text: str, requested: str | None, system: str = "") -> FormatChoice:
        """The prompt to run for a request's text, requested format and system prompt (`choose_format`)."""
        return choose_format(text, requested, system, self.chat_template, self.template_note)

    @classmethod
    def from_options(cls, options: EngineOptions) -> Engine:
        """Build from the command line's settings (`backend.engines.EngineOptions`): those its module
        declares in `SETTINGS`, and `--model`."""
        return cls()

    def validate(self, prompt: Prompt, n: int, params: SamplingParams) -> None:  # noqa: B027 - optional hook
        """Raise RequestRejected if the engine cannot run this request (called before `generate`)."""

    @abstractmethod
    def generate(self, prompt: Prompt, n: int, params: SamplingParams) -> Generation:
        """Start `n` samples of `prompt`; chunks arrive by iterating the returned Generation."""

    def lost_cause(self) -> str | None:
        """Why the engine can no longer serve (a process of its own has exited), or None while it
        can; the backend asks every second while the engine is ready, and on a SIGQUIT from one of
        its processes."""
        return None

    def health(self) -> dict[str, Any]:
        """Engine facts for the /health endpoint (at least the running sample count)."""
        facts: dict[str, Any] = {"engine": self.name, "model": self.model}
        if self.notice:
            facts["notice"] = self.notice
        return facts

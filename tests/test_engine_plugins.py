"""An engine added as a plug-in: a module of its own (its class and settings) and one registry line.

The toy engine below is written to a temporary folder, registered with one line in `ENGINES`, and
then is on `--engine`'s choices, has its setting in both programs' `--help` (read from its variable
too), serves a request through the real websocket server, and its tasks are drawn as the engine's
in the page's trace: nothing else in the code names it.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from backend.engines import ENGINES
from backend.frames import encode, generate_frame
from backend.serving.flags import servers_from_args
from tests.support.wire import until_done
from ui.trace_view import category
from ui.view import RunView

TOY_ENGINE = '''
"""A toy engine: each sample repeats one word, a token every few milliseconds."""

from __future__ import annotations

import asyncio

from backend.config.declared import Setting
from backend.engines.base import Engine, SampleTasksGeneration
from backend.vocabulary import Chunk

WORD = Setting(
    "toy_word", "--toy-word", ("TOY_WORD",), "toy engine: the word each sample repeats", default="ahoy"
)
SETTINGS = (WORD,)


class ToyEngine(Engine):
    name = "toy"

    def __init__(self, word: str) -> None:
        self.word = word
        self.running: set[ToyGeneration] = set()

    @classmethod
    def from_options(cls, options):
        return cls(options.toy_word)

    @property
    def model(self) -> str:
        return f"the word {self.word!r}"

    def generate(self, prompt, n, params):
        return ToyGeneration(self, n, params.max_tokens)


class ToyGeneration(SampleTasksGeneration):
    def __init__(self, engine: ToyEngine, n: int, tokens: int) -> None:
        super().__init__(n, engine.running)
        self._tasks = [
            asyncio.create_task(self._sample(i, engine.word, tokens), name=f"toy-sample-{i}")
            for i in range(n)
        ]

    async def _sample(self, index: int, word: str, tokens: int) -> None:
        try:
            for _ in range(tokens - 1):
                await asyncio.sleep(0.005)
                self._queue.put_nowait(Chunk(index, f"{word} ", 1))
            self._queue.put_nowait(Chunk(index, word, 1, "length"))
        except asyncio.CancelledError:
            self._queue.put_nowait(Chunk(index, "", 0, "abort"))
'''


@pytest.fixture
def toy_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy engine's module on the path, and its one line in the registry."""
    (tmp_path / "toy_engine.py").write_text(textwrap.dedent(TOY_ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ENGINES, "toy", "toy_engine:ToyEngine")
    yield
    sys.modules.pop("toy_engine", None)


def test_a_registered_engine_is_a_choice_with_its_settings_in_both_programs_help(
    toy_registered: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app
    from backend import __main__ as backend_main

    for parser in (backend_main.parser(), app.parser()):
        words = " ".join(parser.format_help().split())
        assert "--toy-word" in words and "toy engine: the word each sample repeats (env TOY_WORD" in words
        assert "toy" in next(a for a in parser._actions if a.dest == "engine").choices
    monkeypatch.setenv("TOY_WORD", "hej")
    assert backend_main.parser().parse_args(["--engine", "toy"]).toy_word == "hej"


async def served(args: Any) -> list[dict[str, Any]]:
    """Every frame of one request of 3 samples of 4 tokens through the servers `args` describe."""
    servers = servers_from_args(args, "127.0.0.1", 0)
    await servers.start()
    try:
        async with connect(servers.url) as ws:
            await ws.send(encode(generate_frame("t1", "say it", 3, {"max_tokens": 4})))
            return await until_done(ws, limit_s=None, frame_s=30)
    finally:
        await servers.close()


def test_a_registered_engine_serves_a_request_and_its_tasks_are_the_engines_in_the_trace(
    toy_registered: None,
) -> None:
    from backend import __main__ as backend_main

    args = backend_main.parser().parse_args(
        ["--engine", "toy", "--toy-word", "hej", "--experiment-port", "-1"]
    )
    frames = asyncio.run(served(args))
    accepted = next(f for f in frames if f["type"] == "accepted")
    assert (accepted["engine"], accepted["model"], accepted["engine_tasks"]) == (
        "toy",
        "the word 'hej'",
        "toy-",
    )
    view = RunView("t1", 0.0)
    for frame in frames:
        view.apply(frame, 0.0)
    assert [sample.text for sample in view.samples] == ["hej hej hej hej"] * 3
    toy_tasks = {name for *_, name, _count, _longest in view.trace.slices if name.startswith("toy-sample")}
    assert toy_tasks, "the toy engine's sample tasks ran on the traced loop"
    assert {category(name, view.trace.engine_tasks) for name in toy_tasks} == {"engine"}


def test_no_module_outside_the_engines_names_an_engine_class() -> None:
    # serving and the page reach engines through the registry and the Engine interface only
    classes = {entry.split(":")[1] for entry in ENGINES.values()}
    root = Path(__file__).resolve().parent.parent
    for folder in ("backend/serving", "ui"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            named = sorted(c for c in classes if c in text)
            assert not named, f"{path.relative_to(root)} names {named}"
    importlib.import_module("backend.serving.connection")

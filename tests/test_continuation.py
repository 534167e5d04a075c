"""Continuing a branch of the token tree through the page's handlers, against a real backend: a
continuation streams as a new run from the branch's text and grows the tree from that branch; every
branch that cannot be continued (no run, a stale page, a node not in the tree, a run still streaming,
a backend gone, a text past the prompt limit) is said in the status line while the columns, the tree
and the session's run stay as they were."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import gradio as gr

from tests.support.backends import synthetic_serving
from tests.support.page_events import PAGE_SETTINGS, page
from ui.handlers import Handlers
from ui.sample_tree_view import RUN_STRIDE, value_rows
from ui.view import PREFIX_TAIL_CHARS

SKIP = gr.skip()


async def generate(
    handlers: Handlers, request: Any, prompt: str = "Tell a story.", **change: Any
) -> list[Any]:
    """A Generate run to its end; its last outputs."""
    settings = {**PAGE_SETTINGS, "prompt": prompt, "format": "chat", "system": "", **change}
    last: list[Any] = []
    async for outputs in handlers.generate(request, **settings):
        last = outputs
    return last


async def continue_from(
    handlers: Handlers, request: Any, node: int, run: str, **change: Any
) -> list[list[Any]]:
    """The outputs of a continuation of `node` of run `run`'s tree, to its end."""
    event = SimpleNamespace(index=node, value=run)
    return [
        outputs async for outputs in handlers.continue_from(event, request, **{**PAGE_SETTINGS, **change})
    ]


def leaf(tree_value: dict[str, Any], sample: int) -> dict[str, Any]:
    """The row of the node where sample `sample`'s branch ends (the deepest row holding it)."""
    return [row for row in value_rows(tree_value) if sample in row["samples"]][-1]


async def test_a_continuation_streams_from_the_branch_and_grows_the_tree_from_it() -> None:
    async with synthetic_serving(200, 0.1) as backend:
        handlers = Handlers(backend.url)
        request = page()
        first = await generate(handlers, request)
        run_id = first[6]["run"]
        texts = [column["text"] for column in first[0]["samples"]]
        node = leaf(first[6], 0)
        outputs = await continue_from(handlers, request, node["id"], run_id)
        last = outputs[-1]
        assert "Continuing from a branch" in last[1] and "finished" in last[1]
        assert last[0]["prefix"] == texts[0][-PREFIX_TAIL_CHARS:]  # shown above each column
        assert all(column["text"] for column in last[0]["samples"])
        run = handlers._runs["one-page"]
        assert run.recorder is not None and run.recorder.prefix == texts[0]  # the frame's prefix
        rows = value_rows(last[6])
        assert last[6]["run"] == run.request_id != run_id
        earlier = [row for row in rows if row["earlier"]]
        assert len(earlier) == 3 and all(row["samples"] == [] for row in earlier)
        # The new run's two branches come right after the node they continue, one level under it.
        at = next(i for i, row in enumerate(rows) if row["id"] == node["id"])
        assert [row["level"] for row in rows[at + 1 : at + 3]] == [node["level"] + 1] * 2
        assert all(row["id"] >= RUN_STRIDE and not row["earlier"] for row in rows[at + 1 : at + 3])


async def test_a_branch_that_cannot_be_continued_is_said_and_the_page_keeps_its_run() -> None:
    async with synthetic_serving(200, 0.1) as backend:
        handlers = Handlers(backend.url)
        request = page()
        nothing = await continue_from(handlers, request, 1, "r-gone")
        assert len(nothing) == 1 and nothing[0][0] == SKIP and nothing[0][6] == SKIP
        assert "no run to continue" in nothing[0][1]

        first = await generate(handlers, request)
        run_id = first[6]["run"]
        node = leaf(first[6], 1)["id"]
        cases = [
            (node, "r-from-an-old-tab", "this tree is of run 'r-from-an-old-tab'"),
            (987_654, run_id, "has no branch"),
            (-3, run_id, "has no branch"),
            ("1", run_id, "has no branch"),
        ]
        for node_id, run, words in cases:
            outputs = await continue_from(handlers, request, node_id, run)  # type: ignore[arg-type]
            assert len(outputs) == 1 and words in outputs[0][1], outputs[0][1]
            assert outputs[0][0] == SKIP and outputs[0][6] == SKIP  # columns and tree stay
        assert handlers._runs["one-page"].request_id == run_id

        # A run still streaming: continue once it has finished (or been cancelled).
        long = {
            **PAGE_SETTINGS,
            "prompt": "Tell a long story.",
            "max_tokens": 2000,
            "format": "chat",
            "system": "",
        }
        streaming = handlers.generate(request, **long)
        shown = await anext(streaming)
        outputs = await continue_from(handlers, request, 1, shown[6]["run"])
        assert "still streaming" in outputs[0][1]
        await streaming.aclose()


async def test_a_continuation_the_backend_refuses_leaves_the_earlier_run_on_the_page() -> None:
    """A text past the prompt limit, then a backend gone: the status line says why, and the earlier
    run stays the session's, its branches still continuable once the cause is gone."""
    async with contextlib.AsyncExitStack() as stack:
        backend = await stack.enter_async_context(synthetic_serving(2000, 0.1))
        handlers = Handlers(backend.url)
        request = page()
        # 12,000 characters of prompt and a sample of more than 4,000: past the 16,000 a prompt may have.
        first = await generate(handlers, request, "x " * 6000, max_tokens=2000)
        run_id = first[6]["run"]
        texts = [column["text"] for column in first[0]["samples"]]
        longest = max(range(2), key=lambda i: len(texts[i]))
        assert len(texts[longest]) > 4100, [len(text) for text in texts]
        deep = leaf(first[6], longest)["id"]
        outputs = await continue_from(handlers, request, deep, run_id, max_tokens=8)
        assert "could not be continued" in outputs[-1][1] and "the limit is 16000" in outputs[-1][1]
        assert all(out[0] == SKIP for out in outputs)  # the columns stay the earlier run's
        assert handlers._runs["one-page"].request_id == run_id
        # The tree's root (the prompt alone) is within the limit: it continues.
        outputs = await continue_from(handlers, request, 0, run_id, max_tokens=8)
        assert "finished" in outputs[-1][1] and "Error" not in outputs[-1][1], outputs[-1][1]
        second = handlers._runs["one-page"].request_id

        await backend.close()  # the backend goes away
        await asyncio.sleep(0.1)
        tree = outputs[-1][6]
        own = next(row["id"] for row in value_rows(tree) if not row["earlier"])
        for _ in range(2):  # said each time; the run stays the session's
            gone = await continue_from(handlers, request, own, second, max_tokens=8)
            assert "could not be continued" in gone[-1][1] and "unreachable" in gone[-1][1], gone[-1][1]
            assert handlers._runs["one-page"].request_id == second


async def continue_at_point(
    handlers: Handlers, request: Any, column: int, offset: int, run: str, **change: Any
) -> list[list[Any]]:
    """The outputs of a continuation of column `column` from character `offset`, to its end."""
    event = SimpleNamespace(index=column, value={"continue_at": offset, "run": run})
    settings = {**PAGE_SETTINGS, **change}
    return [outputs async for outputs in handlers.continue_from_point(event, request, **settings)]


async def test_a_column_continuation_shows_the_words_it_goes_on_from_under_one_prompt() -> None:
    """Continued from a point inside the first branch's words (the deepest node there is the
    root), the tree has one prompt row, then a row of the words the new run goes on from, its
    size in characters, and the new run's branches under it."""
    async with synthetic_serving(500, 0.1) as backend:
        handlers = Handlers(backend.url)
        request = page()
        first = await generate(handlers, request, max_tokens=12)
        run_id = first[6]["run"]
        text = first[0]["samples"][0]["text"]
        offset = text.index(" ", 2)  # the end of the first word: inside the first branch
        outputs = await continue_at_point(handlers, request, 0, offset, run_id)
        rows = value_rows(outputs[-1][6])
        assert sum(row["level"] == 0 for row in rows) == 1  # one prompt row
        join = next(row for row in rows if row["text"].startswith("+ "))
        assert join["text"] == "+ " + text[:offset] and join["unit"] == "char"
        assert join["size"] == offset and not join["earlier"] and join["samples"] == [0, 1]
        under = rows[rows.index(join) + 1 :]
        assert under and all(row["level"] > join["level"] for row in under if not row["earlier"])


async def test_earlier_rows_keep_their_units_after_a_continuation_in_words() -> None:
    """A first run with token confidence (its sizes in tokens), continued without: the earlier
    run's rows still count tokens, the new run's characters."""
    async with synthetic_serving(500, 0.1) as backend:
        handlers = Handlers(backend.url)
        request = page()
        first = await generate(handlers, request, logprobs=True)
        run_id = first[6]["run"]
        assert {row["unit"] for row in value_rows(first[6])} == {"token"}
        outputs = await continue_from(handlers, request, leaf(first[6], 0)["id"], run_id, logprobs=False)
        rows = value_rows(outputs[-1][6])
        assert {row["unit"] for row in rows if row["earlier"]} == {"token"}
        assert {row["unit"] for row in rows if not row["earlier"]} == {"word"}
        assert outputs[-1][6]["unit"] == "word"


async def test_continue_is_offered_only_once_the_run_has_finished() -> None:
    """While the run streams, the tree and the columns say why Continue cannot run; once it has
    finished they offer it."""
    async with synthetic_serving(100, 0.1) as backend:
        handlers = Handlers(backend.url)
        request = page()
        settings = {
            **PAGE_SETTINGS,
            "prompt": "Tell a story.",
            "format": "chat",
            "system": "",
            "max_tokens": 30,
        }
        seen = [outputs async for outputs in handlers.generate(request, **settings)]
        streaming = [o for o in seen if o[0]["samples"] and "streaming" in o[1]]
        assert streaming and all("still streaming" in o[6]["why_not"] for o in streaming)
        assert all("still streaming" in o[0]["why_not"] for o in streaming)
        assert seen[-1][6]["why_not"] == "" and seen[-1][0]["why_not"] == ""

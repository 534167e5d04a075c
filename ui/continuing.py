"""The page's continuation events, for `ui.handlers.Handlers`: Continue from here on a tree node or
on a point of a column's text, and branching on one of a token's alternatives there. Each is a new
run of the session from the run's prompt plus the text up to that point (`ui.lineage` says what a
branch asks for, or why it cannot be), streamed into the columns as Generate's run is; its tree
grows from the node the branch leaves.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from ui.answers_view import AnswersPanel
from ui.client import BackendRun
from ui.lineage import CannotContinue, Lineage, Origin, continuable_from, node_origin, point_origin
from ui.page_outputs import status_only
from ui.run_request import InputProblem, run_request
from ui.visitor_limits import VisitorLimitReached, session_of


class Continuing:
    """The continuation handlers; the session's runs, their origins and trees, and how a run is made
    and streamed are `Handlers`' own."""

    _runs: dict[str, BackendRun]
    _origins: Any
    _lineages: dict[str, Lineage]
    _new_run: Callable[..., Any]
    _stream: Callable[..., AsyncIterator[list[Any]]]

    async def continue_from(
        self, event: gr.SelectData, request: gr.Request, **settings: Any
    ) -> AsyncIterator[list[Any]]:
        """Continue a branch of the token tree (the tree's select event: the node's id as `index`, the
        tree's run as `value`): n new samples, with the settings as set, from the run's prompt plus
        the text up to the end of that node, streamed into the columns as a new run; with the value
        `{"run": ..., "chosen": token}`, branched on that alternative of the node's first token
        (`ui.lineage.node_origin`). A branch that cannot be continued (the run is gone, not the one
        on the page, still streaming, or the backend refuses) is said in the status line, and the
        columns and tree stay as they are."""
        value = event.value
        run_id, chosen = (value.get("run"), value.get("chosen")) if isinstance(value, dict) else (value, None)
        continuable = functools.partial(self._continuable, node_id=event.index, run_id=run_id, chosen=chosen)
        async for outputs in self._continue(request, continuable, settings):
            yield outputs

    async def continue_from_point(
        self, event: gr.SelectData, request: gr.Request, **settings: Any
    ) -> AsyncIterator[list[Any]]:
        """Continue a column from a point of its text (the grid's select event: the column as
        `index`, `{"continue_at": characters, "run": its run}` as `value`: the end of the token or
        word clicked), as `continue_from` continues a node; the new run's branches grow from the
        deepest node of the tree at or before that point. With `"chosen": token` in the value,
        `continue_at` is where a token starts and the branch takes that alternative instead of it.
        Other select events of the grid (a column's Stop) are not continuations: nothing happens
        here for them."""
        value = event.value
        if not isinstance(value, dict) or "continue_at" not in value:
            return
        continuable = functools.partial(
            self._point,
            column=event.index,
            offset=value.get("continue_at"),
            run_id=value.get("run"),
            chosen=value.get("chosen"),
        )
        async for outputs in self._continue(request, continuable, settings):
            yield outputs

    async def _continue(
        self,
        request: gr.Request,
        continuable: Callable[[str], tuple[Origin, tuple[int, int]]],
        settings: dict[str, Any],
    ) -> AsyncIterator[list[Any]]:
        """A continuation of what `continuable` says (its origin and the node its branches grow
        from, or CannotContinue) as a new run of the session, streamed to the page."""
        session = session_of(request)
        try:
            origin, parent = continuable(session)
            of_the_run = {"prompt": origin.prompt, "format": origin.prompt_format, "system": origin.system}
            base = run_request({**settings, **of_the_run})
            wanted = dataclasses.replace(base, options={**base.options, "prefix": origin.prefix})
            previous = self._runs.get(session)
            session, run, ticket = self._new_run(request, wanted)
        except (InputProblem, VisitorLimitReached, CannotContinue) as exc:
            yield status_only(f"**Error:** {exc}")
            return
        run.view.prefix = origin.prefix
        self._origins[run] = origin
        self._lineages.setdefault(session, Lineage()).add(run, parent, origin.chosen)
        start = lambda: run.start(wanted.prompt, wanted.n, wanted.params, wanted.options)  # noqa: E731

        def refused(message: str) -> list[Any]:
            # The earlier run stays the session's: its columns and tree are still on the page.
            if previous is not None and self._runs.get(session) is None:
                self._runs[session] = previous
            return status_only(f"**Error:** the branch could not be continued: {message}")

        answers = AnswersPanel(wanted.answer_pattern, wanted.stop_rule)
        async for outputs in self._stream(session, run, ticket, answers, start, True, refused):
            yield outputs

    def _point(
        self, session: str, column: Any, offset: Any, run_id: Any, chosen: Any = None
    ) -> tuple[Origin, tuple[int, int]]:
        """What continuing column `column` of run `run_id` from character `offset` of its text asks
        for, or branching there on the alternative `chosen` (`ui.lineage.point_origin`);
        CannotContinue says why it cannot be."""
        run, lineage = self._current(session, run_id)
        return point_origin(run, lineage, self._origins.get(run), column, offset, chosen)

    def _current(self, session: str, run_id: Any) -> tuple[BackendRun, Lineage]:
        """The session's run and its tree of runs, where a branch of them can be continued from the
        page showing run `run_id` (`ui.lineage.continuable_from`)."""
        run, lineage = self._runs.get(session), self._lineages.get(session)
        return continuable_from(run, lineage, run_id)

    def _continuable(
        self, session: str, node_id: Any, run_id: Any, chosen: Any = None
    ) -> tuple[Origin, tuple[int, int]]:
        """What continuing node `node_id` of the tree of run `run_id` asks for, or branching on the
        alternative `chosen` of its first token (`ui.lineage.node_origin`); CannotContinue says why
        it cannot be."""
        _, lineage = self._current(session, run_id)
        return node_origin(lineage, self._origins, node_id, chosen)

"""The page's event handlers: Generate, Cancel, Stop one column, Export, a closed tab.

Each browser session has at most one run (a `BackendRun`: one websocket connection to the
backend); `Handlers` keeps them apart, so Cancel and Stop reach the right request. Generate streams
the run's view to the page at UPDATES_PER_S, the trace panel and summary every TRACE_EVERY-th
update; a run cut short by the page (Cancel, a new Generate, a closed tab) is cancelled in the
engine and closed in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from ui.answers_view import AnswersPanel
from ui.answers_view import empty_outputs as empty_answers
from ui.client import CLOSE_TIMEOUT_S, BackendError, BackendRun
from ui.sample_grid import empty_value
from ui.sample_tree_view import empty_value as empty_tree
from ui.sample_tree_view import tree_value
from ui.trace_view import panel_html
from ui.view import RunView, samples_value, status_markdown, summary_markdown

UPDATES_PER_S = 15
"""Page updates per second while streaming: browsers keep up with 10-20 (docs/benchmarks.md, "Browser")."""

TRACE_EVERY = 8
"""The trace panel and the run summary are redrawn every 8th page update (about 2 a second) and at
the end: the panel's SVG is the largest output, and re-parsing it is the page's main cost at n=32
when drawn every update; the summary is a Markdown table of n rows whose token counts change every
update (the columns' headers show them live), and parsing, sanitising and laying it out is a
tenth of the page's main thread at n=32 x 500 tok/s when drawn every update (docs/benchmarks.md,
"Browser")."""


def outputs_for(view: RunView, answers: AnswersPanel | None = None, with_trace: bool = True) -> list[Any]:
    """The page's outputs (columns, status line, summary, trace panel, answers chart and line,
    token tree) for `view`; the summary and the trace panel only `with_trace`, the answers when a
    sample finished."""
    shown = view.n if view.accepted else 0
    return [
        samples_value(view, time.monotonic()),
        status_markdown(view),
        summary_markdown(view) if with_trace else gr.skip(),
        panel_html(view.trace, shown) if with_trace else gr.skip(),
        *(answers.outputs(view) if answers is not None else [gr.skip(), gr.skip()]),
        tree_value(view.tree, view.request_id),
    ]


def error_outputs(message: str) -> list[Any]:
    """The page's outputs for a run that could not start."""
    return [empty_value(), f"**Error:** {message}", "", gr.skip(), *empty_answers(), empty_tree()]


OUTPUTS = 7
"""How many outputs `outputs_for` fills."""


def _session(request: gr.Request | None) -> str:
    return (request.session_hash if request is not None else None) or "anonymous"


class Handlers:
    """The page's handlers for the backend at `backend_url` (with `token`, if it needs one)."""

    def __init__(self, backend_url: str, token: str | None = None) -> None:
        self.backend_url = backend_url
        self.token = token
        self._runs: dict[str, BackendRun] = {}
        """Each browser session's current run."""
        self._answers: dict[str, AnswersPanel] = {}
        """Each browser session's answers panel, for its current run."""
        self._streaming: dict[BackendRun, asyncio.Event] = {}
        """Each run that a Generate event streams to its page, set once that event has ended."""
        self._background: set[asyncio.Task[Any]] = set()

    async def generate(
        self,
        prompt_text: str,
        n_value: float,
        max_tokens_value: float,
        temperature_value: float,
        top_p_value: float,
        seed_value: float | None,
        consumer_mode: str,
        block_ms_value: float,
        fanout_value: str,
        format_value: str,
        system_value: str,
        output_kind_value: str,
        cancel_after_value: float | None,
        logprobs_value: bool,
        answer_pattern_value: str,
        request: gr.Request,
    ) -> AsyncIterator[list[Any]]:
        """Start a run and stream its view to the page until it is done."""
        session = _session(request)
        address = request.client.host if request is not None and request.client else None
        run = BackendRun(self.backend_url, token=self.token, client_address=address)
        previous = self._runs.get(session)
        self._runs[session] = run
        if previous is not None:
            self._in_background(_cancel_and_close(previous))
        params = {
            "max_tokens": int(max_tokens_value),
            "temperature": float(temperature_value),
            "top_p": float(top_p_value),
            "seed": None if seed_value is None else int(seed_value),
        }
        options: dict[str, Any] = {
            "consumer": {"mode": consumer_mode or "cooperative", "block_ms": float(block_ms_value or 0)},
            "fanout": fanout_value or "n",
            "format": format_value or "chat",
        }
        if options["format"] == "chat" and (system_value or "").strip():
            options["system"] = system_value
        if output_kind_value and output_kind_value != "delta":
            options["output_kind"] = output_kind_value
        if cancel_after_value:  # 0 or empty: never; anything else goes as typed (the backend checks it)
            options["cancel_after"] = int(cancel_after_value)
        if logprobs_value:
            options["logprobs"] = True
        answers = self._answers[session] = AnswersPanel(answer_pattern_value)
        streaming = self._streaming[run] = asyncio.Event()
        try:
            try:
                view = await run.start(prompt_text, int(n_value), params, options)
            except BackendError as exc:
                self._forget(session, run)
                yield error_outputs(str(exc))
                return
            yield outputs_for(view, answers)
            count = 0
            async for view in run.updates(1.0 / UPDATES_PER_S):
                count += 1
                yield outputs_for(view, answers, with_trace=view.finished or count % TRACE_EVERY == 0)
        finally:
            streaming.set()
            self._streaming.pop(run, None)
            if not run.view.finished:
                # Cancelled by the page (Cancel, a new Generate, a closed tab): stop the engine,
                # and let the run collect its last frames without holding up this event.
                self._forget(session, run)
                self._in_background(_cancel_and_close(run))
            # A finished run keeps its connection until the next Generate, for Export.

    async def cancel(self, request: gr.Request) -> list[Any]:
        """Cancel this session's run; its final view once every sample has finished.

        The page's Generate event shows the end of the run itself: this returns only after that
        event has ended (or after CLOSE_TIMEOUT_S), so an update of the Generate event still on
        its way cannot land after the final view and leave a column "streaming". The page then
        cancels the Generate event (`.then(cancels=...)` in `ui.app`): a no-op for an event that
        ended, and it drops a Generate still waiting in the queue."""
        session = _session(request)
        run = self._runs.get(session)
        if run is None:
            return [gr.skip()] * OUTPUTS
        await run.cancel()
        if await run.wait_finished(CLOSE_TIMEOUT_S):
            streaming = self._streaming.get(run)
            if streaming is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await streaming.wait()
        return outputs_for(run.view, self._answers.get(session))

    async def export(self, request: gr.Request) -> Any:
        """This session's run's trace as a Perfetto JSON file to download."""
        run = self._runs.get(_session(request))
        if run is None:
            raise gr.Error("Nothing to export yet: press Generate first.")
        try:
            events = await run.export_trace()
        except BackendError as exc:
            raise gr.Error(str(exc)) from None
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", prefix=f"trace-{run.request_id}-", delete=False
        ) as handle:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
        return gr.File(value=handle.name, visible=True)

    async def close_session_run(self, request: gr.Request) -> None:
        """A closed tab: cancel and close its run."""
        session = _session(request)
        run = self._runs.get(session)
        if run is not None:
            self._forget(session, run)
            await _cancel_and_close(run)

    async def stop_sample(self, index: int, request: gr.Request) -> None:
        """Stop one sample of this session's run (the column's Stop button)."""
        run = self._runs.get(_session(request))
        if run is not None and 0 <= int(index) < run.view.n:
            await run.cancel(int(index))

    async def stop_clicked(self, event: gr.SelectData, request: gr.Request) -> None:
        """A column's Stop button, as the sample grid reports it."""
        await self.stop_sample(int(event.index), request)

    def _forget(self, session: str, run: BackendRun) -> None:
        if self._runs.get(session) is run:
            del self._runs[session]
            self._answers.pop(session, None)

    def _in_background(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _cancel_and_close(run: BackendRun) -> None:
    await run.cancel()
    await run.wait_finished(CLOSE_TIMEOUT_S)
    await run.close()

"""The page's event handlers: Generate, Cancel, Stop one column, Export, Download run, a replayed
upload, a page opened from a link, Copy link, Keep this seed, a closed tab (and, from
ui.continuing, the continuations: a tree node, a column's point, an alternative).

A Generate pressed while the engine starts first waits for it (`ui.engine_info.wait_until_started`),
showing the wait in the status line; Cancel, or a new Generate, ends that wait.

Each browser session has at most one run (a `BackendRun`: one websocket connection to the
backend); `Handlers` keeps them apart, so Cancel and Stop reach the right request. Generate streams
the run's view to the page at UPDATES_PER_S, the trace panel and summary every TRACE_EVERY-th
update; a run cut short by the page (Cancel, a new Generate, a closed tab) is cancelled in the
engine and closed in the background. Download run saves the session's finished run as a file
(`backend.saved_run`); an uploaded saved run is checked here, then replayed by the backend (a
`replay` request) and streamed to the page as Generate's run is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import tempfile
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import gradio as gr

from backend.config.settings import Limits
from backend.saved_run import SAVED_RUN_BYTES_MAX, SavedRunError, saved_runs_json
from backend.saved_run_reader import load_saved_runs
from ui.answers_view import AnswersPanel
from ui.client import CLOSE_TIMEOUT_S, BackendError, BackendRun
from ui.continuing import Continuing
from ui.engine_info import EngineStartTimeout, fetch_health, wait_until_started
from ui.lineage import (
    Lineage,
    Origin,
    branch_node,
)
from ui.loop_watch import watch_url
from ui.page_outputs import OUTPUTS, error_outputs, outputs_for, status_only, waiting_outputs
from ui.run_link import LINK_FIELDS, link_note, link_query, page_defaults, read_link
from ui.run_request import EXPERIMENT_FIELDS, InputProblem, RunRequest, run_request
from ui.view import RunView, replay_note, status_markdown
from ui.visitor_limits import (
    Ticket,
    VisitorLedger,
    VisitorLimitReached,
    VisitorLimits,
    request_address,
    session_of,
)

UPDATES_PER_S = 15
"""Page updates per second while streaming: browsers keep up with 10-20 (docs/benchmarks.md, "What the
browser page costs")."""

BLOCKED_CANCEL_WAIT_S = 120.0
"""How long Cancel waits for a blocking-consumer run to end: its loop reads the Cancel only between
the steps it blocks in, seconds later (the page says so while it waits)."""

TRACE_EVERY = 8
"""The trace panel and the run summary are redrawn every 8th page update (about 2 a second) and at
the end: the panel's SVG is the largest output, and re-parsing it is the page's main cost at n=32
when drawn every update; the summary is a Markdown table of n rows whose token counts change every
update (the columns' headers show them live), and parsing, sanitising and laying it out is a
tenth of the page's main thread at n=32 x 500 tok/s when drawn every update (docs/benchmarks.md,
"What the browser page costs")."""


NOTHING_TO_CANCEL = "Nothing is running: Cancel stops a run while it streams."
"""The status line's addition when Cancel is pressed with no run streaming."""

CANCELLED_WAIT = "Cancelled while waiting for the engine to start; press Generate to try again."
"""The status line of a Generate whose wait for the engine was cancelled."""


class Handlers(Continuing):
    """The page's handlers for the backend at `backend_url` (with `token`, if it needs one)."""

    def __init__(
        self,
        backend_url: str,
        token: str | None = None,
        experiment_url: str | None = None,
        visitor_limits: VisitorLimits | None = None,
        *,
        limits: Limits | None = None,
    ) -> None:
        self.backend_url = backend_url
        self.limits = limits or Limits()
        """The backend's limits, which a link's values are held to (`ui.run_link.read_link`)."""
        self.token = token
        self.experiment_url = experiment_url
        """The backend's experiment server, where blocking-consumer runs go (None: the main loop)."""
        self.visitors = VisitorLedger(visitor_limits or VisitorLimits())
        """Each visitor's running runs, against the page-side limits (`ui.visitor_limits`)."""
        self._runs: dict[str, BackendRun] = {}
        """Each browser session's current run."""
        self._answers: dict[str, AnswersPanel] = {}
        """Each browser session's answers panel, for its current run."""
        self._streaming: dict[BackendRun, asyncio.Event] = {}
        """Each run that a Generate event streams to its page, set once that event has ended."""
        self._waiting: dict[str, asyncio.Event] = {}
        """Each browser session's Generate that waits for the engine to start; set to stop it."""
        self._background: set[asyncio.Task[Any]] = set()
        self._origins: weakref.WeakKeyDictionary[BackendRun, Origin] = weakref.WeakKeyDictionary()
        """Each run's prompt, format, system prompt and prefix, for continuing its branches."""
        self._lineages: dict[str, Lineage] = {}
        """Each browser session's tree of runs: its current run and the earlier runs it continues."""

    async def generate(self, request: gr.Request, **settings: Any) -> AsyncIterator[list[Any]]:
        """Start a run and stream its view to the page until it is done. An input the page cannot
        send, or a limit the run would pass, is said in the status line; the last run stays."""
        async for outputs in self._generate(request, settings):
            yield outputs

    async def _generate(
        self, request: gr.Request, settings: dict[str, Any], note: str = ""
    ) -> AsyncIterator[list[Any]]:
        """`generate`, the run's status line saying `note` too (a run opened from a link). A run
        the backend refuses (an empty prompt, n past its limit) leaves the last run on the page."""
        previous = self._runs.get(session_of(request))
        try:
            wanted = run_request(settings)
            session, run, ticket = self._new_run(request, wanted)
        except (InputProblem, VisitorLimitReached) as exc:
            yield status_only(f"**Error:** {exc}")
            return
        run.view.note = note
        options = wanted.options
        system = options.get("system", "")
        self._origins[run] = Origin(wanted.prompt, options["format"], system, "")
        lineage = self._lineages.setdefault(session, Lineage())
        kept = (list(lineage.runs), list(lineage.parents))
        lineage.add(run, None)

        def refused(message: str) -> list[Any]:
            # The earlier run and its tree stay the session's: they are still on the page.
            if previous is not None and self._runs.get(session) is None:
                self._runs[session] = previous
                lineage.runs[:], lineage.parents[:] = kept
            return status_only(f"**Error:** {message}")

        start = lambda: run.start(wanted.prompt, wanted.n, wanted.params, wanted.options)  # noqa: E731
        answers = AnswersPanel(wanted.answer_pattern, wanted.stop_rule)
        async for outputs in self._stream(session, run, ticket, answers, start, True, refused):
            yield outputs

    async def open_link(self, request: gr.Request) -> AsyncIterator[list[Any]]:
        """The page opened from a link (`ui.run_link`): the settings it carries set in the controls
        (LINK_FIELDS, in order), then the run's outputs. A link whose values are all good and whose
        prompt is short enough runs at once, its status line saying whether the samples are the
        link's own (a batch-invariant engine) or may differ; otherwise the status line names what
        was ignored, or why it waits for Generate. A page opened without a link changes nothing."""
        query = dict(request.query_params) if request is not None else {}
        opened = read_link(query, self.limits)
        if opened is None:
            # Yielded, not returned: an event that yields nothing would empty its outputs.
            yield [gr.skip()] * (len(LINK_FIELDS) + OUTPUTS)
            return
        controls = [opened.values.get(name, gr.skip()) for name in LINK_FIELDS]
        if not opened.runs:
            yield [*controls, *status_only(opened.message())]
            return
        yield [*controls, *status_only("Opened from a link: starting its run …")]
        settings = {**page_defaults(self.limits), **opened.values}
        note = await self._link_note()
        async for outputs in self._generate(request, settings, note):
            yield [*[gr.skip()] * len(LINK_FIELDS), *outputs]

    async def _link_note(self) -> str:
        """What the status line of a run opened from a link says of its samples: the link's own on a
        batch-invariant engine, or that they may differ."""
        try:
            health = await asyncio.to_thread(fetch_health, self.backend_url)
        except (OSError, ValueError):
            health = {}
        return link_note(health)

    def link(self, request: gr.Request) -> Any:
        """The link box, shown, holding `link_query` of this session's run (the page puts its own
        address before it, `ui.app.COPY_LINK_JS`)."""
        return gr.Textbox(value=self.link_query(request), visible=True)

    def link_query(self, request: gr.Request) -> str:
        """The query string of a link to this session's run (the first run of its tree, where it
        continues a branch): its prompt, format, system prompt, n, max tokens, temperature, top-p
        and the seed it ran with. The page puts its own address before it (`ui.app`)."""
        session = session_of(request)
        run = self._runs.get(session)
        lineage = self._lineages.get(session)
        if lineage is not None and lineage.runs and lineage.runs[-1] is run:
            run = lineage.runs[0]
        origin = self._origins.get(run) if run is not None else None
        if run is None or origin is None or not run.view.accepted:
            raise gr.Error("No run to link to yet: press Generate first.")
        params = run.view.params
        settings = {
            "prompt": origin.prompt,
            "system": origin.system,
            "format": run.view.prompt_format or origin.prompt_format,
            "n": run.view.n,
            **{key: params.get(key) for key in ("max_tokens", "temperature", "top_p", "seed")},
        }
        return "?" + link_query(settings)

    def last_seed(self, request: gr.Request) -> Any:
        """The seed this session's run ran with, for the seed box (Keep this seed): Generate then
        repeats the run's samples; a page without a run keeps the box as it is."""
        run = self._runs.get(session_of(request))
        seed = run.view.params.get("seed") if run is not None else None
        if seed is None:
            gr.Warning("No run yet: press Generate first, then keep its seed.")
            return gr.skip()
        gr.Info(
            f"Seed {seed} kept: Generate repeats this run's samples; clear the seed box for a random one."
        )
        return seed

    async def replay(
        self, path: str | None, speed_value: float, request: gr.Request, **settings: Any
    ) -> AsyncIterator[list[Any]]:
        """Replay an uploaded saved run through the backend and stream its view to the page; a file
        of a run and its continuations replays them one after another, in order, each growing from
        the branch it continued in the tree. A file that is not a saved run this page can replay
        gets an error in the status line."""
        if not path:
            return
        try:
            runs = await asyncio.to_thread(load_saved_runs, path)
        except SavedRunError as exc:
            # Only the status line says so: the columns keep the run they show.
            yield status_only(f"**Error:** {os.path.basename(path)} cannot be replayed: {exc}")
            return
        for position, saved in enumerate(runs):
            try:
                # The saved run's own request, with this page's experiment settings: checked and
                # counted against the visitor's limits as a Generate of the same size would be.
                params = saved.params
                of_the_run = {
                    "prompt": saved.prompt,
                    "n": saved.n,
                    "max_tokens": params.max_tokens,
                    "temperature": params.temperature,
                    "top_p": params.top_p,
                    "seed": params.seed,
                    "format": saved.prompt_format,
                    "system": saved.system,
                    "logprobs": params.logprobs,
                }
                wanted = run_request({**settings, **of_the_run})
                session, run, ticket = self._new_run(request, wanted)
            except (InputProblem, VisitorLimitReached) as exc:
                yield status_only(f"**Error:** {exc}")
                return
            run.view.note = replay_note(saved.prompt, saved.prompt_format, saved.n, wanted.params)
            options = {key: wanted.options[key] for key in EXPERIMENT_FIELDS if key in wanted.options}
            # A branch of a replayed run continues on this server's engine, from the recorded prompt.
            self._origins[run] = Origin(saved.prompt, saved.prompt_format, saved.system, saved.prefix)
            run.view.prefix = saved.prefix
            lineage = self._lineages.setdefault(session, Lineage())
            parent, chosen = None, ""
            if position and saved.continues is not None:
                where = saved.continues
                # An alternative branched on grows from where its token starts, as it did live.
                reached = where.text[: len(where.text) - len(where.chosen)]
                parent, chosen = (
                    (where.run, branch_node(lineage.runs[where.run].view.tree, reached)),
                    where.chosen,
                )
            lineage.add(run, parent if position else None, chosen)
            start = functools.partial(run.replay, saved, float(speed_value or 1.0), options)
            answers = AnswersPanel(wanted.answer_pattern, wanted.stop_rule)
            async for outputs in self._stream(session, run, ticket, answers, start):
                yield outputs
            if not run.view.finished or self._runs.get(session) is not run:
                return  # cancelled, or refused: the runs after it are not replayed

    def _new_run(self, request: gr.Request, wanted: RunRequest) -> tuple[str, BackendRun, Ticket]:
        """A new run of `wanted` for this session, counted for its visitor (VisitorLimitReached says
        which limit it passes); the session's previous run is cancelled and closed."""
        session = session_of(request)
        address = request_address(request)
        ticket = self.visitors.admit(session, wanted, address)
        # Blocking experiments go to the backend's experiment loop: they block that loop, not the
        # one that serves everyone else's streams.
        elsewhere = bool(wanted.blocking and self.experiment_url)
        url = self.experiment_url if elsewhere and self.experiment_url else self.backend_url
        watch = watch_url(self.backend_url) if elsewhere else None
        run = BackendRun(
            url, token=self.token, client_address=address, blocks_loop=wanted.blocking, watch=watch
        )
        previous = self._runs.get(session)
        self._runs[session] = run
        run.view.trace.consumer = wanted.options["consumer"]["mode"]
        if previous is not None and previous.view.finished:
            # Its figures stand beside this run's where the consumer differs (greedy, cooperative).
            run.view.trace.compare = (previous.view.trace.consumer, previous.view.trace.figures())
        if previous is not None:
            self._in_background(_cancel_and_close(previous))
        if session in self._waiting:
            self._waiting[session].set()  # a Generate still waiting for the engine: this one replaces it
        return session, run, ticket

    async def _stream(
        self,
        session: str,
        run: BackendRun,
        ticket: Ticket,
        answers: AnswersPanel,
        start: Callable[[], Awaitable[RunView]],
        wait_for_engine: bool = False,
        refused: Callable[[str], list[Any]] | None = None,
    ) -> AsyncIterator[list[Any]]:
        """Start `run` (`start`) as this session's run, once the engine has started where
        `wait_for_engine`, and stream its view, with `answers` its answers panel, until it is done;
        its visitor's count ends with it. `refused` gives the outputs of a run the backend refused
        (default: the page cleared, the error in the status line)."""
        try:
            self._answers[session] = answers
            if wait_for_engine:
                started = True
                async for outputs in self._wait_for_engine(session, run):
                    started = outputs is not None
                    if outputs is not None:
                        yield outputs
                if not started:
                    return
            async for outputs in self._streamed(session, run, answers, start, refused):
                yield outputs
        finally:
            self.visitors.release(ticket)

    async def _wait_for_engine(self, session: str, run: BackendRun) -> AsyncIterator[list[Any] | None]:
        """The waiting lines while the backend's engine starts; a last None where the run is not to
        start (the wait was cancelled, replaced or timed out)."""
        stop_waiting = self._waiting[session] = asyncio.Event()
        try:
            waited = 0
            async for line in wait_until_started(self.backend_url, stop_waiting):
                yield waiting_outputs(line, first=waited == 0)
                waited += 1
        except EngineStartTimeout as exc:
            self._forget(session, run)
            yield error_outputs(str(exc))
            yield None
            return
        finally:
            if self._waiting.get(session) is stop_waiting:
                del self._waiting[session]
        if stop_waiting.is_set():
            if self._runs.get(session) is run:  # cancelled, not replaced by a newer Generate
                self._forget(session, run)
                yield status_only(CANCELLED_WAIT)
            yield None

    async def _streamed(
        self,
        session: str,
        run: BackendRun,
        answers: AnswersPanel,
        start: Callable[[], Awaitable[RunView]],
        refused: Callable[[str], list[Any]] | None = None,
    ) -> AsyncIterator[list[Any]]:
        """Start the run and stream its view until it is done."""
        streaming = self._streaming[run] = asyncio.Event()
        try:
            try:
                view = await start()
            except BackendError as exc:
                self._forget(session, run)
                yield (refused or error_outputs)(str(exc))
                return
            lineage = self._lineages.get(session)
            yield outputs_for(view, answers, lineage=lineage)
            count = 0
            async for view in run.updates(1.0 / UPDATES_PER_S):
                count += 1
                # A blocked loop sends nothing: each reading of its watch redraws the panel.
                blocked = view.trace.live is not None and view.trace.live.blocked
                with_trace = view.finished or blocked or count % TRACE_EVERY == 0
                yield outputs_for(view, answers, with_trace, lineage)
                for index in answers.to_stop(view):  # the vote is decided: the rest stop, as Stop does
                    await run.cancel(index)
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
        ended, and it drops a Generate still waiting in the queue. A Generate still waiting for the
        engine to start stops waiting, and the status line says so; with nothing running (a run
        that has finished, once its Generate event has drawn its end), the status line says that
        (NOTHING_TO_CANCEL) and the last run stays on the page."""
        session = session_of(request)
        waiting = self._waiting.get(session)
        if waiting is not None:
            waiting.set()
            return status_only(CANCELLED_WAIT)
        run = self._runs.get(session)
        if run is None:
            return status_only(NOTHING_TO_CANCEL)
        if run.view.finished:
            await self._generate_ended(run)
            return status_only(status_markdown(run.view) + "\n\n" + NOTHING_TO_CANCEL)
        await run.cancel()
        # A blocked loop reads the Cancel only when its step ends: the run streams on meanwhile,
        # saying that the Cancel waits, and this event waits with it (up to BLOCKED_CANCEL_WAIT_S).
        if await run.wait_finished(BLOCKED_CANCEL_WAIT_S if run.blocks_loop else CLOSE_TIMEOUT_S):
            await self._generate_ended(run)
        return outputs_for(run.view, self._answers.get(session), lineage=self._lineages.get(session))

    async def _generate_ended(self, run: BackendRun) -> None:
        """Return once the Generate event streaming `run` has ended (at once where none does), or
        after CLOSE_TIMEOUT_S: an answer given after it cannot be drawn over by its last update."""
        streaming = self._streaming.get(run)
        if streaming is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await streaming.wait()

    async def export(self, request: gr.Request) -> Any:
        """This session's run's trace as a Perfetto JSON file to download."""
        run = self._runs.get(session_of(request))
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

    async def download_run(self, request: gr.Request) -> Any:
        """This session's finished run, with the earlier runs of its tree that it continues, as a
        saved run file to download (docs/protocol.md, "Saved runs")."""
        session = session_of(request)
        run = self._runs.get(session)
        lineage = self._lineages.get(session)
        if run is None or run.recorder is None:
            raise gr.Error("Nothing to download yet: press Generate first.")
        if not run.view.finished:
            raise gr.Error("The run is still streaming: download it once it has finished, or Cancel it.")
        source = {"recorded_with": "the dashboard page's Download run"}
        try:
            if lineage is not None and lineage.runs and lineage.runs[-1] is run:
                runs = lineage.saved_runs(source)
            else:
                runs = [run.recorder.saved_run(source)]
            text = saved_runs_json(runs, source, indent=1)
        except SavedRunError as exc:
            raise gr.Error(f"This run cannot be saved: {exc}") from None
        size = len(text.encode())
        if size > SAVED_RUN_BYTES_MAX:
            # Kept all the same: the samples are the person's; only a replay cannot read it.
            gr.Warning(
                f"This run's file has {size:,} bytes, more than the {SAVED_RUN_BYTES_MAX:,} a replay reads: "
                "it keeps the samples, but cannot be replayed."
            )
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", prefix=f"run-{run.request_id}-", delete=False, encoding="utf-8"
        ) as handle:
            handle.write(text)
        return gr.File(value=handle.name, visible=True)

    async def close_session_run(self, request: gr.Request) -> None:
        """A closed tab: cancel and close its run."""
        session = session_of(request)
        run = self._runs.get(session)
        self._lineages.pop(session, None)
        if run is not None:
            self._forget(session, run)
            await _cancel_and_close(run)

    async def stop_sample(self, index: int, request: gr.Request) -> None:
        """Stop one sample of this session's run (the column's Stop button)."""
        run = self._runs.get(session_of(request))
        if run is not None and 0 <= int(index) < run.view.n:
            await run.cancel(int(index))

    async def stop_clicked(self, event: gr.SelectData, request: gr.Request) -> None:
        """A column's Stop button, as the sample grid reports it (its other select events, a point
        of a column to continue from, are `continue_from_point`'s)."""
        if event.value == "stop":
            await self.stop_sample(int(event.index), request)

    def _forget(self, session: str, run: BackendRun) -> None:
        if self._runs.get(session) is run:
            del self._runs[session]
            self._answers.pop(session, None)
        lineage = self._lineages.get(session)
        if lineage is not None and lineage.runs and lineage.runs[-1] is run:
            lineage.pop()

    def _in_background(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _cancel_and_close(run: BackendRun) -> None:
    await run.cancel()
    await run.wait_finished(CLOSE_TIMEOUT_S)
    await run.close()

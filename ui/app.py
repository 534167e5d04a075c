"""The Gradio page: controls, N_MAX sample columns (shown for the first n), the summary panel.

Layout plus wiring, in page order. Generate is an async websocket client of the backend that
updates the page at a frame rate; Cancel stops the Generate event (`cancels=`) and tells the
backend, then shows each column's finish reason; a column's Stop cancels that sample only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import gradio as gr

from ui.client import CLOSE_TIMEOUT_S, BackendError, BackendRun
from ui.view import RunView, header_markdown, status_markdown, summary_markdown

UPDATES_PER_S = 15
"""Page updates per second while streaming: browsers keep up with 10-20 (DESIGN.md)."""

CONCURRENCY_LIMIT = 32
"""Generate events that run at once (Gradio's default is 1: one user at a time)."""

DEFAULT_PROMPT = "Write one sentence about a lighthouse keeper who learns to juggle."
DEFAULT_N = 4

CSS = """
#samples { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 12px; }
.sample-header p { margin: 0; font-size: 0.9em; }
"""
"""Columns on a grid: as many per row as fit, all the same width, wrapping when n is large."""


class ActiveRuns:
    """The run each browser session is streaming, so Cancel and Stop reach the right request."""

    def __init__(self) -> None:
        self._runs: dict[str, BackendRun] = {}

    def get(self, session: str) -> BackendRun | None:
        """The session's current run, if any."""
        return self._runs.get(session)

    def replace(self, session: str, run: BackendRun) -> BackendRun | None:
        """Make `run` the session's current run; returns the one it replaces."""
        previous = self._runs.get(session)
        self._runs[session] = run
        return previous

    def discard(self, session: str, run: BackendRun) -> None:
        """Forget `run` if it is still the session's current one."""
        if self._runs.get(session) is run:
            del self._runs[session]


def _session(request: gr.Request | None) -> str:
    return (request.session_hash if request is not None else None) or "anonymous"


def build_demo(backend_url: str, n_max: int = 32, max_tokens_max: int = 2048) -> gr.Blocks:
    """The dashboard page, talking to the backend at `backend_url`."""
    runs = ActiveRuns()
    background: set[asyncio.Task[Any]] = set()

    with gr.Blocks(title="Parallel sampling, live") as demo:
        gr.Markdown(
            "## Parallel sampling, live\n"
            "Type a prompt, pick **n**, press **Generate**: the backend's single asyncio loop "
            "consumes all n streams at once, and each sample fills its own column."
        )
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=6, elem_id="prompt")
            with gr.Column(scale=2):
                n = gr.Slider(1, n_max, value=min(DEFAULT_N, n_max), step=1, label="n (samples)", elem_id="n")
                max_tokens = gr.Slider(
                    1,
                    max_tokens_max,
                    value=min(128, max_tokens_max),
                    step=1,
                    label="max tokens",
                    elem_id="max-tokens",
                )
                with gr.Row():
                    temperature = gr.Slider(
                        0, 2, value=0.8, step=0.05, label="temperature", elem_id="temperature"
                    )
                    top_p = gr.Slider(0.05, 1, value=0.95, step=0.05, label="top-p", elem_id="top-p")
                seed = gr.Number(
                    value=33, precision=0, label="seed (empty: random)", minimum=0, elem_id="seed"
                )
        with gr.Row():
            generate_btn = gr.Button("Generate", variant="primary", elem_id="generate")
            cancel_btn = gr.Button("Cancel", variant="stop", elem_id="cancel")
        status = gr.Markdown(elem_id="status")

        columns: list[gr.Column] = []
        headers: list[gr.Markdown] = []
        texts: list[gr.Textbox] = []
        stops: list[gr.Button] = []
        with gr.Row(elem_id="samples"):
            for i in range(n_max):
                with gr.Column(visible=i < DEFAULT_N, min_width=260, elem_id=f"column-{i}") as column:
                    headers.append(
                        gr.Markdown(f"**#{i}**", elem_id=f"header-{i}", elem_classes="sample-header")
                    )
                    texts.append(
                        gr.Textbox(
                            show_label=False,
                            lines=10,
                            max_lines=10,
                            interactive=False,
                            autoscroll=True,
                            elem_id=f"sample-{i}",
                        )
                    )
                    stops.append(gr.Button("Stop", size="sm", elem_id=f"stop-{i}"))
                columns.append(column)
        trace = gr.Markdown("The run's summary appears here when it ends.", elem_id="trace")

        outputs: list[Any] = [*columns, *headers, *texts, status, trace]

        def render(view: RunView, layout: bool) -> list[Any]:
            """Every output for `view`; `layout` also sets column visibility and clears unused ones."""
            now = time.monotonic()
            shown = view.n if view.accepted else 0
            column_updates = [gr.Column(visible=i < shown) if layout else gr.skip() for i in range(n_max)]
            header_updates: list[Any] = []
            text_updates: list[Any] = []
            for i in range(n_max):
                if i < shown:
                    sample = view.samples[i]
                    header_updates.append(header_markdown(sample, view.started_at, now))
                    text_updates.append(sample.text)
                else:
                    header_updates.append(f"**#{i}**" if layout else gr.skip())
                    text_updates.append("" if layout else gr.skip())
            return [
                *column_updates,
                *header_updates,
                *text_updates,
                status_markdown(view),
                summary_markdown(view),
            ]

        def render_error(message: str) -> list[Any]:
            skipped = [gr.skip()] * (3 * n_max)
            return [*skipped, f"**Error:** {message}", gr.skip()]

        async def generate(
            prompt_text: str,
            n_value: float,
            max_tokens_value: float,
            temperature_value: float,
            top_p_value: float,
            seed_value: float | None,
            request: gr.Request,
        ) -> AsyncIterator[list[Any]]:
            session = _session(request)
            run = BackendRun(backend_url)
            previous = runs.replace(session, run)
            if previous is not None:
                await previous.cancel()
            params = {
                "max_tokens": int(max_tokens_value),
                "temperature": float(temperature_value),
                "top_p": float(top_p_value),
                "seed": None if seed_value is None else int(seed_value),
            }
            try:
                try:
                    view = await run.start(prompt_text, int(n_value), params)
                except BackendError as exc:
                    yield render_error(str(exc))
                    return
                yield render(view, layout=True)
                async for view in run.updates(1.0 / UPDATES_PER_S):
                    yield render(view, layout=False)
            finally:
                if not run.view.finished:
                    # Cancelled by the page (Cancel, a new Generate, a closed tab): stop the engine,
                    # and let the run collect its last frames without holding up this event.
                    task = asyncio.create_task(_cancel_and_close(run))
                    background.add(task)
                    task.add_done_callback(background.discard)
                runs.discard(session, run)

        async def cancel(request: gr.Request) -> list[Any]:
            run = runs.get(_session(request))
            if run is None:
                return [gr.skip()] * len(outputs)
            await run.cancel()
            await run.wait_finished(CLOSE_TIMEOUT_S)
            return render(run.view, layout=False)

        def make_stop(index: int) -> Callable[[gr.Request], Awaitable[None]]:
            async def stop(request: gr.Request) -> None:
                run = runs.get(_session(request))
                if run is not None:
                    await run.cancel(index)

            return stop

        generate_event = generate_btn.click(
            generate,
            inputs=[prompt, n, max_tokens, temperature, top_p, seed],
            outputs=outputs,
            concurrency_limit=CONCURRENCY_LIMIT,
            show_progress="hidden",
            api_name="generate",
        )
        cancel_btn.click(
            cancel,
            outputs=outputs,
            cancels=[generate_event],
            concurrency_limit=None,
            show_progress="hidden",
            api_name="cancel",
        )
        for i, stop_btn in enumerate(stops):
            stop_btn.click(
                make_stop(i),
                concurrency_limit=None,
                show_progress="hidden",
                api_name=f"stop_{i}",
                api_visibility="undocumented",
            )

    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT)
    return demo


async def _cancel_and_close(run: BackendRun) -> None:
    await run.cancel()
    await run.wait_finished(CLOSE_TIMEOUT_S)
    await run.close()

"""The Gradio page: controls, a grid of n sample columns, the loop trace beside them.

The page is a stage: the controls on the left (the prompt, n and max tokens, Generate and Cancel in
view, then the settings, examples, lessons and experiments as closed panels, one click each), the
show on the right (the status line, the columns and, beside them, the loop trace), so that the
columns and the trace are in view the moment Generate is pressed on a laptop's screen. On a
phone-wide screen the same blocks stack, the columns right under Generate and the panels last.

Layout plus wiring, in page order; the handlers are in `ui.handlers`, what a run looks like in
`ui.view`. Generate is an async websocket client of the backend that updates the page at a frame
rate; Cancel tells the backend, shows each column's finish reason once the Generate event has drawn
the end of the run, then cancels that event (`cancels=`, which also drops a Generate still waiting
in the queue); a column's Stop cancels that sample only. The columns are one output
(`ui.sample_grid`), so an update costs the same few outputs whatever n is. The trace panel draws
the backend loop's measured trace; Export saves it for Perfetto. Download run saves the run as a
file (docs/protocol.md, "Saved runs"), and a saved run uploaded to the page is replayed by the
backend into the columns, at its recorded pace or faster. Copy link gives a URL of the run
(`ui.run_link`); a page opened from one sets its controls and runs it as it loads. Ctrl/Cmd+Enter in
the prompt generates and Escape cancels (`PAGE_JS`, run as the page loads).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from backend.config.settings import (
    BLOCK_MS_MAX,
    DEFAULT_BLOCK_MS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    TEMPERATURE_MAX,
    Limits,
)
from backend.protocol import CONSUMER_MODES, FANOUTS, OUTPUT_KINDS, REPLAY_SPEED_MAX
from backend.vocabulary import ALTERNATIVES_DEFAULT, PROMPT_FORMATS
from ui.answers_view import answers_chart as answers_chart_component
from ui.answers_view import empty_outputs as empty_answers
from ui.early_stop import RULES as STOP_RULES
from ui.engine_info import ASKING_LINE, engine_line_now
from ui.examples import EXAMPLE_WITH_ANSWERS, examples_block
from ui.handlers import Handlers
from ui.run_link import DEFAULT_N, DEFAULT_PROMPT, LINK_FIELDS
from ui.run_request import REPLAY_SETTINGS, RUN_SETTINGS, RUN_SETTINGS_OF_A_RUN
from ui.sample_grid import sample_grid
from ui.sample_tree_view import sample_tree
from ui.view import summary_css
from ui.visitor_limits import RUNS_PER_ADDRESS, VisitorLimits

ENGINE_POLL_S = 2.0
"""How often the engine line is read again while the engine starts (a download, a conversion)."""

CONCURRENCY_LIMIT = 2 * RUNS_PER_ADDRESS
"""Run events (Generate, a replay, a continuation, a link) that stream at once, all visitors
together (Gradio's default is 1: one user at a time): twice one address's share, so that a class
behind one address never fills the page for everyone else. Past it, Gradio's queue holds events in
the order they came."""


CSS = """
.trace-svg { display: block; background: #f8fafc; border: 1px solid #e2e8f0; border-radius: 6px; }
.trace-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 0.75em; margin: 4px 0; }
.trace-legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.trace-figures { display: grid; grid-template-columns: repeat(2, 1fr); gap: 2px 12px; font-size: 0.85em; }
.trace-figures div { display: flex; justify-content: space-between; border-bottom: 1px dotted #e2e8f0; }
.trace-empty { color: #64748b; font-size: 0.9em; padding: 12px; }
.trace-compare { font-size: 0.85em; margin-top: 6px; border-collapse: collapse; width: 100%; }
.trace-compare th, .trace-compare td { text-align: right; padding: 1px 6px; }
.trace-compare td { border-bottom: 1px dotted #e2e8f0; }
.trace-compare th:first-child, .trace-compare td:first-child { text-align: left; }
.trace-tasks summary { font-size: 0.8em; color: #334155; cursor: pointer; margin-top: 6px; }
.trace-tasks pre { font-size: 0.7em; line-height: 1.25; max-height: 22em; overflow: auto; margin: 4px 0;
  background: #f8fafc; border: 1px solid #e2e8f0; border-radius: 6px; padding: 6px; }
.vote-chart svg { display: block; max-width: 560px; }
.vote-chart text { fill: var(--body-text-color); font-size: 11px; }
.vote-chart .vote-grid { stroke: var(--border-color-primary); }
.vote-legend { display: flex; flex-wrap: wrap; gap: 12px; font-size: 0.8em; margin: 2px 0 4px 44px; }
.vote-legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.vote-chart-empty { color: var(--body-text-color-subdued); font-size: 0.9em; padding: 12px 0; }
#summary table { width: 100%; table-layout: auto; font-size: 0.85em; font-variant-numeric: tabular-nums; }
#summary th, #summary td { padding: 3px 5px; }
#summary th { white-space: normal; line-height: 1.2; }
#summary td { white-space: nowrap; }
#masthead h2 { margin: 0 0 2px 0; }
#engine-info p { display: inline; }
#engine-info details { display: inline; margin-left: 4px; }
#engine-info summary { display: inline; cursor: pointer; color: var(--body-text-color-subdued);
  text-decoration: underline dotted; }
#engine-info details[open] { display: block; font-size: 0.85em; color: var(--body-text-color-subdued); }
#answers-example { display: none; }
#answers:has(.free-text) #answers-example { display: inline-flex; width: auto; align-self: flex-start; }
#run-tools { align-items: center; gap: 8px; }
#run-tools > button { flex: 0 0 auto; width: auto; }
#n .head, #max-tokens .head { flex-wrap: wrap; }
#n input[type=number], #max-tokens input[type=number] { min-width: 4.5em; }
@media (max-width: 640px) {
  #stage { flex-direction: column; flex-wrap: nowrap; align-items: stretch; }
  #controls { display: contents; }
  #settings-stack { display: grid; grid-template-columns: 1fr 1fr; gap: 6px; }
  #settings-stack > .block:has(> button.label-wrap.open) { grid-column: 1 / -1; }
  #settings-stack > .block > button.label-wrap { font-size: 0.85em; text-align: left; }
  #masthead p { display: none; }
  #engine-info p, #status p { font-size: 0.85em; margin: 2px 0; }
  .trace-panel, .vote-chart { overflow-x: auto; }
  .trace-panel svg.trace-svg { min-width: 560px; }
  .vote-chart svg { min-width: 440px; }
  .trace-legend { font-size: 12px; }
  .trace-figures { grid-template-columns: 1fr; font-size: 13px; }
  .trace-tasks pre { font-size: 11px; }
}
.trace-figures div { gap: 8px; }
.trace-figures b { white-space: nowrap; }
""" + summary_css()
"""The page's own styles: the trace panel's parts; the vote chart's text and grid in the theme's
colours (light or dark); a run summary as wide as its panel, its headers wrapping at their words
so that every column shows at a laptop's width; the engine line's "how it runs" inline until
opened; the answers' example shown only beside the free-text line; and, on a phone-wide screen,
the blocks in one column (the controls' closed panels right under Generate, two a row, one tap
each; the title without its line of instructions, which Generate's place makes plain), the
trace and the vote chart drawn no smaller than their text needs (at least 10 px; they scroll
sideways instead) and the trace's figures one a line."""

EXPLANATION = """
**What the trace shows.** One thread, one asyncio loop, serving every sample. The loop lane is how
busy the loop was (blue: the task consuming this request's stream; green: sending frames; grey:
socket I/O; orange: the engine's own tasks); the lag lane is how late a 20 ms heartbeat woke; each
sample's lane ticks when its chunk arrives; the read lane is how many bytes the consumer read per
engine output. Under the figures, the loop's tasks and what each one awaits, once a second.

- **cooperative** (default): after each chunk the consumer does `await asyncio.sleep(0)`, so
  the consumer hands the loop back every time, so the socket and other clients get turns.
- **greedy**: no extra await: when chunks are already waiting, the consumer drains them in one
  longer step (fewer, longer blue slices).
- **blocking**: `block_ms` of CPU work on the loop per chunk, as a synchronous call would do: lag
  climbs, chunks bunch up, and a Cancel waits behind the backlog (see cancel latency). It runs on
  the backend's second loop, kept for this experiment, one visitor at a time: the loop you block is
  yours, and other visitors' streams go on.
- **fan-out `requests`**: n separate engine requests of one sample each instead of one request
  with n samples: the engine cannot share the prompt's prefill, which shows in TTFT.
- **outputs `cumulative`**: each engine output carries the sample's whole text so far (vLLM's
  `RequestOutputKind.CUMULATIVE`): the consumer counts `count = num_tokens`, not `+=`, and works out
  the new text itself. The read lane climbs with the text, and so does its time per output: over a
  sample the bytes read grow with the square of its length. The columns look the same.
- **cancel after k tokens**: the consumer itself cancels each sample once it has k tokens, as a
  client that has read enough would; red lines in the sample lanes show each cancel reaching the
  engine, and every sample ends `stopped` a token or so past k.
"""
"""The explanation beside the event-loop experiments."""

WHY_N = """
**Why sample n times.** With **token confidence** on, each column colours its tokens by how likely
the model found them (green sure, red unsure; the probability on hover) and its header gives the
mean log probability and the perplexity. A violet bar marks where a sample parts from every other sample:
the n samples share a prefix until one draws differently. The **answers** under the
columns take each finished sample's final answer (the last number, or what your pattern matches: its
first group if it has one) and vote: a bar per answer, counted from zero, most votes first; the most
common answer, the self-consistency answer, is green (answers tied for the most, amber). The
**examples** set a prompt and settings that show one lesson each.
"""
"""The explanation beside the controls for what sampling n times is for."""

MASTHEAD = (
    "## Parallel sampling, live\n"
    "Type a prompt, pick **n**, press **Generate**: the backend's single asyncio loop "
    "consumes all n streams at once, and each sample fills its own column."
)
"""The page's title and what to do, in two lines."""

TREE_HELP = (
    "The n samples as a prefix tree of their tokens (with token confidence on; otherwise words): "
    "each branch says how many samples took it and, with token confidence, the probability of its "
    "first token. Click a branch to mark its samples' columns; once the run has finished, "
    "**Continue from here** samples n more from the prompt plus that branch's text."
)
"""The line above the token tree."""


def build_demo(
    backend_url: str,
    limits: Limits | None = None,
    token: str | None = None,
    experiment_url: str | None = None,
) -> gr.Blocks:
    """The dashboard page, talking to the backend at `backend_url` (with `token`, if it needs one), held
    to that backend's `limits` (its n and max tokens, its per-visitor share), and sending
    blocking-consumer runs to its experiment server at `experiment_url` where it has one."""
    limits = limits or Limits()
    handlers = Handlers(backend_url, token, experiment_url, VisitorLimits.for_backend(limits), limits=limits)
    with gr.Blocks(title="Parallel sampling, live", fill_width=True) as demo:
        gr.Markdown(MASTHEAD, elem_id="masthead")
        engine_info = gr.Markdown(ASKING_LINE, elem_id="engine-info")
        _wire_engine_line(demo, engine_info, backend_url)
        with gr.Row(equal_height=False, elem_id="stage"):
            # The controls: what a run needs in view, then the rest one click away.
            with gr.Column(scale=3, min_width=300, elem_id="controls"):
                controls, generate_btn, cancel_btn = _controls(limits)
            # The show: the status line, the columns and the loop trace beside them.
            with gr.Column(scale=9, elem_id="show"):
                show = _show(handlers)
        _wire_runs(demo, handlers, controls, (generate_btn, cancel_btn), show)
        demo.unload(handlers.close_session_run)
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT)
    return demo


def _wire_engine_line(demo: gr.Blocks, engine_info: gr.Markdown, backend_url: str) -> None:
    """The engine line, read from /health as the page loads and every ENGINE_POLL_S while it starts."""
    engine_timer = gr.Timer(ENGINE_POLL_S, active=False)

    async def refresh_engine_line() -> tuple[str, Any]:
        line, starting = await engine_line_now(backend_url)
        return line, gr.Timer(active=starting)

    demo.load(refresh_engine_line, outputs=[engine_info, engine_timer], show_progress="hidden")
    engine_timer.tick(refresh_engine_line, outputs=[engine_info, engine_timer], show_progress="hidden")


def _controls(limits: Limits) -> tuple[dict[str, Any], gr.Button, gr.Button]:
    """The run settings' controls by name (`RUN_SETTINGS`), Generate and Cancel: the prompt, n and max
    tokens and the buttons in view, then the settings, examples, lessons and experiments."""
    controls: dict[str, Any] = {
        "prompt": gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=4, elem_id="prompt")
    }
    with gr.Row():
        controls.update(_size_controls(limits.n_max, limits.max_tokens_max))
    with gr.Row():
        generate_btn = gr.Button("Generate", variant="primary", min_width=100, elem_id="generate")
        cancel_btn = gr.Button("Cancel", variant="stop", min_width=100, elem_id="cancel")
    with gr.Column(elem_id="settings-stack"):
        controls.update(_settings_controls())
        with gr.Accordion("Examples: one lesson each", open=False, elem_id="examples-panel"):
            lesson_slot = gr.Column()
        controls.update(_why_n_controls())
        controls.update(_experiment_controls())
    with lesson_slot:
        examples_block(controls, limits.n_max, limits.max_tokens_max)
    missing = sorted(set(RUN_SETTINGS) - set(controls))
    if missing:
        raise TypeError(f"run settings without a control on the page: {missing}")
    return controls, generate_btn, cancel_btn


def _show(handlers: Handlers) -> dict[str, Any]:
    """The status line, the columns with the token tree, answers and summary under them, and beside
    them the loop trace with its export and the saved-run controls; by name. A column's Stop, Export
    trace and Download run are wired here, beside their components."""
    show: dict[str, Any] = {"status": gr.Markdown(elem_id="status")}
    with gr.Row(elem_id="run-tools"):
        show["copy_link"] = gr.Button("Copy link", size="sm", min_width=90, elem_id="copy-link")
        show["keep_seed"] = gr.Button("Keep this seed", size="sm", min_width=90, elem_id="keep-seed")
        show["link"] = gr.Textbox(
            label="link to this run: opened, it runs the same prompt, settings and seed",
            visible=False,
            interactive=False,
            buttons=["copy"],
            elem_id="run-link",
            scale=4,
        )
    with gr.Row(equal_height=False):
        with gr.Column(scale=6):
            show["samples"] = sample_grid()
            show["samples"].select(
                handlers.stop_clicked,
                concurrency_limit=None,
                show_progress="hidden",
                api_visibility="private",
            )
            gr.api(handlers.stop_sample, api_name="stop_sample", concurrency_limit=None)
            with gr.Accordion("Token tree (where the samples part)", open=True, elem_id="tree-panel"):
                gr.Markdown(TREE_HELP)
                show["tree"] = sample_tree()
            with gr.Accordion("Answers (self-consistency)", open=True, elem_id="answers"):
                show["answers_line"] = gr.Markdown(empty_answers()[1], elem_id="answers-line")
                show["answers_example"] = gr.Button(
                    f"Example with answers: {EXAMPLE_WITH_ANSWERS.label}",
                    size="sm",
                    elem_id="answers-example",
                )
                show["answers_chart"] = answers_chart_component()
            show["summary"] = gr.Markdown(elem_id="summary")
        with gr.Column(scale=4, min_width=340):
            show["trace"] = gr.HTML(panel_html_empty(), elem_id="trace")
            export_btn = gr.Button("Export trace (Perfetto JSON)", size="sm", elem_id="export-trace")
            trace_file = gr.File(label="trace export", visible=False, elem_id="trace-file")
            export_btn.click(
                handlers.export, outputs=trace_file, concurrency_limit=None, api_name="export_trace"
            ).success(None, js=save_file_js("trace-file"), api_visibility="private")
            show.update(_saved_run_controls(handlers))
    return show


RUN_OUTPUTS = ("samples", "status", "summary", "trace", "answers_chart", "answers_line", "tree")
"""What a run's handlers fill, in their order (`ui.page_outputs.outputs_for`)."""


def _wire_runs(
    demo: gr.Blocks,
    handlers: Handlers,
    controls: dict[str, Any],
    buttons: tuple[gr.Button, gr.Button],
    show: dict[str, Any],
) -> None:
    """Generate, a page opened from a link, a replayed saved run and a continued branch, each
    streaming into the show from the controls, and Cancel, which stops whichever runs; Copy link,
    Keep this seed and the answers' example: the wiring that joins the two sides of the page."""
    generate_btn, cancel_btn = buttons
    outputs = [show[name] for name in RUN_OUTPUTS]
    settings = {name: controls[name] for name in RUN_SETTINGS}
    run = {"outputs": outputs, "concurrency_limit": CONCURRENCY_LIMIT, "show_progress": "hidden"}
    generate_event = generate_btn.click(handlers.generate, inputs_kwargs=settings, **run, api_name="generate")
    replay_event = show["replay_upload"].upload(
        handlers.replay,
        inputs=[show["replay_upload"], show["replay_speed"]],
        inputs_kwargs={name: settings[name] for name in REPLAY_SETTINGS},
        **run,
        api_name="replay",
    )
    # A branch of the token tree continued: n new samples from the prompt plus its text.
    continued = {name: control for name, control in settings.items() if name not in RUN_SETTINGS_OF_A_RUN}
    continue_event = show["tree"].select(
        handlers.continue_from, inputs_kwargs=continued, **run, api_visibility="private"
    )
    # ...or a column from a point of its text (the grid's other select events are Stop clicks).
    point_event = show["samples"].select(
        handlers.continue_from_point, inputs_kwargs=continued, **run, api_visibility="private"
    )
    # A page opened from a link: its settings in the controls, then (where it may) its run.
    link_event = demo.load(
        handlers.open_link,
        outputs=[*(controls[name] for name in LINK_FIELDS), *outputs],
        concurrency_limit=CONCURRENCY_LIMIT,
        show_progress="hidden",
        api_visibility="private",
    )
    events = [generate_event, replay_event, continue_event, point_event, link_event]
    cancel_btn.click(
        handlers.cancel, outputs=outputs, concurrency_limit=None, show_progress="hidden", api_name="cancel"
    ).then(None, cancels=events, api_visibility="private")
    show["copy_link"].click(
        handlers.link, outputs=show["link"], concurrency_limit=None, api_visibility="private"
    ).success(None, inputs=show["link"], outputs=show["link"], js=COPY_LINK_JS, api_visibility="private")
    show["keep_seed"].click(
        handlers.last_seed, outputs=controls["seed"], concurrency_limit=None, api_visibility="private"
    )
    example = EXAMPLE_WITH_ANSWERS.settings
    show["answers_example"].click(
        lambda: [example[name] for name in example],
        outputs=[controls[name] for name in example],
        api_visibility="private",
    )


def _saved_run_controls(handlers: Handlers) -> dict[str, Any]:
    """Download run (wired here) and the file it gives, and the upload that replays a saved run at a
    chosen speed (wired with the runs: it streams into the columns with the page's experiments)."""
    with gr.Row():
        download_btn = gr.Button("Download run", size="sm", elem_id="download-run")
        replay_upload = gr.UploadButton(
            "Replay a saved run", file_types=[".json"], type="filepath", size="sm", elem_id="replay-run"
        )
    replay_speed = gr.Slider(
        1, REPLAY_SPEED_MAX, value=1, step=1, label="replay speed (x recorded)", elem_id="replay-speed"
    )
    run_file = gr.File(label="saved run", visible=False, elem_id="run-file")
    download_btn.click(
        handlers.download_run, outputs=run_file, concurrency_limit=None, api_name="download_run"
    ).success(None, js=save_file_js("run-file"), api_visibility="private")
    return {
        "replay_upload": replay_upload,
        "replay_speed": replay_speed,
    }


def _size_controls(n_max: int, max_tokens_max: int) -> dict[str, Any]:
    """n and max tokens: the run's size, in view beside Generate."""
    n = gr.Slider(
        1, n_max, value=min(DEFAULT_N, n_max), step=1, label="n (samples)", min_width=180, elem_id="n"
    )
    max_tokens = gr.Slider(
        1,
        max_tokens_max,
        value=min(DEFAULT_MAX_TOKENS, max_tokens_max),
        step=1,
        label="max tokens",
        min_width=180,
        elem_id="max-tokens",
    )
    return {"n": n, "max_tokens": max_tokens}


def _settings_controls() -> dict[str, Any]:
    """The prompt's format and system prompt, temperature, top-p and seed, in one closed panel."""
    with gr.Accordion("Settings: format, temperature, seed", open=False, elem_id="settings"):
        prompt_format = gr.Radio(
            list(PROMPT_FORMATS),
            value="chat",
            label="format",
            info="chat: the prompt is your message in the model's chat template; "
            "raw: the model continues the text as it is",
            elem_id="format",
        )
        system = gr.Textbox(
            "", label="system prompt (chat; empty: the template's own)", lines=2, elem_id="system"
        )
        with gr.Row():
            temperature = gr.Slider(
                0,
                TEMPERATURE_MAX,
                value=DEFAULT_TEMPERATURE,
                step=0.05,
                label="temperature",
                min_width=140,
                elem_id="temperature",
            )
            top_p = gr.Slider(
                0.05, 1, value=DEFAULT_TOP_P, step=0.05, label="top-p", min_width=140, elem_id="top-p"
            )
        seed = gr.Number(
            value=None,
            precision=0,
            label="seed (empty: a random seed each run)",
            info="The status line gives each run's seed; Keep this seed puts it here: Generate repeats it.",
            minimum=0,
            elem_id="seed",
        )
    prompt_format.change(
        lambda chosen: gr.Textbox(interactive=chosen == "chat"),
        inputs=prompt_format,
        outputs=system,
        show_progress="hidden",
        api_visibility="private",
    )
    return {
        "format": prompt_format,
        "system": system,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
    }


def _experiment_controls() -> dict[str, Any]:
    """The event-loop experiments: consumer mode, block per chunk, fan-out, output kind, cancel-after."""
    with gr.Accordion("Event-loop experiments", open=False, elem_id="experiments"):
        with gr.Row():
            consumer = gr.Radio(
                list(CONSUMER_MODES), value="cooperative", label="consumer", elem_id="consumer"
            )
            block_ms = gr.Slider(
                0,
                BLOCK_MS_MAX,
                value=DEFAULT_BLOCK_MS,
                step=1,
                label="block per chunk, ms (blocking)",
                elem_id="block-ms",
            )
            fanout = gr.Radio(list(FANOUTS), value="n", label="fan-out", elem_id="fanout")
        with gr.Row():
            output_kind = gr.Radio(
                list(OUTPUT_KINDS), value="delta", label="engine outputs", elem_id="output-kind"
            )
            cancel_after = gr.Number(
                0, precision=0, label="cancel each sample after k tokens (0: never)", elem_id="cancel-after"
            )
        gr.Markdown(EXPLANATION)
    return {
        "consumer": consumer,
        "block_ms": block_ms,
        "fanout": fanout,
        "output_kind": output_kind,
        "cancel_after": cancel_after,
    }


def _why_n_controls() -> dict[str, Any]:
    """Token confidence and the answer pattern."""
    with gr.Accordion("Why sample n times", open=False, elem_id="why-n"):
        with gr.Row():
            logprobs = gr.Checkbox(False, label="token confidence (logprobs)", elem_id="logprobs")
            alternatives = gr.Number(
                ALTERNATIVES_DEFAULT,
                label="alternatives a token (k, 1 to 20: click a token to see them)",
                precision=0,
                elem_id="alternatives",
            )
            answer_pattern = gr.Textbox(
                "",
                label="answer pattern (regular expression; empty: the last number)",
                elem_id="answer-pattern",
            )
        stop_when_decided = gr.Radio(
            [("off", "off"), *((words, rule) for rule, words in STOP_RULES.items())],
            value="off",
            label="stop when decided: stop the samples still running once the vote cannot change",
            elem_id="stop-when-decided",
        )
        gr.Markdown(WHY_N)
    return {
        "logprobs": logprobs,
        "alternatives": alternatives,
        "answer_pattern": answer_pattern,
        "stop_when_decided": stop_when_decided,
    }


COPY_LINK_JS = """
async (query) => {
  if (!query || !query.startsWith('?')) return query;
  const url = window.location.origin + window.location.pathname + query;
  try { await navigator.clipboard.writeText(url); } catch (error) { /* shown in the box to copy */ }
  return url;
}
"""
"""Copy link's second step in the browser: the page's own address before the run's query
(`Handlers.link`), copied to the clipboard where the browser allows it, and shown in the link box."""


def save_file_js(elem_id: str) -> str:
    """The browser's step after a file output `elem_id` got its file: save it (one click saves)."""
    return f"""
() => {{
  const started = Date.now();
  const save = () => {{
    const link = document.querySelector('#{elem_id} a[download]');
    if (link) {{ link.click(); return; }}
    if (Date.now() - started < 5000) setTimeout(save, 100);
  }};
  save();
}}
"""


PAGE_JS = """
() => {
  const running = () => Boolean(document.querySelector(
    '#samples .status-streaming, #samples .status-waiting') || /\u23f3/.test(
    (document.querySelector('#status') || {}).textContent || ''));
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey) && event.target.closest('#prompt')) {
      event.preventDefault();
      document.querySelector('#generate')?.click();
    } else if (event.key === 'Escape' && running()) {
      document.querySelector('#cancel')?.click();
    }
  }, true);
  const mac = /Mac|iPhone|iPad/.test(navigator.platform);
  const titles = {
    '#generate': `Sample n answers to the prompt (${mac ? '\u2318' : 'Ctrl'}+Enter in the prompt)`,
    '#cancel': 'Stop every sample of the running request (Escape)',
    '#copy-link': "A link that opens this page with this run's prompt, settings and seed, and runs it",
    '#keep-seed': "Put this run's seed in the seed box: Generate then repeats it",
  };
  const label = () => {
    let missing = 0;
    for (const [selector, title] of Object.entries(titles)) {
      const button = document.querySelector(selector);
      if (button) button.title = title; else missing += 1;
    }
    if (missing) setTimeout(label, 200);
  };
  label();
}
"""
"""The page's keys and its buttons' tooltips, run once as it loads: Ctrl+Enter (Cmd+Enter on a Mac)
in the prompt presses Generate, Escape presses Cancel while a request streams or waits."""


def panel_html_empty() -> str:
    """The trace panel before the first run."""
    return '<div class="trace-empty">The backend loop\'s trace appears here while samples stream.</div>'

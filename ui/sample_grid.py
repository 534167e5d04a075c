"""The sample grid: one column per sample (header, streaming text, Stop), drawn in the browser.

All n columns are one `gr.HTML` output whose value is JSON (`view.samples_value`): Gradio then
sends, per page update, only what changed (each column's new text as an append), and the template
below redraws the grid in the page, where Gradio's HTML component patches only the nodes that
differ. The page had been one Textbox, one Markdown header and one Column per sample (97 outputs
at N_MAX 32): the app spent 50-140 ms of CPU per update on them and the browser fell to 2-3
updates a second (docs/benchmarks.md, "Browser").

Texts are escaped in the template (a sample may contain anything). A column's Stop button triggers
the component's `select` event with the column's index, which the app turns into a `cancel` of that
sample. Element ids stay what tests and scripts look for: `column-i`, `header-i`, `sample-i`
(the text), `stop-i`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

TEMPLATE = r"""<div class="sample-grid">${(() => {
  const esc = (t) => String(t ?? '').replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  const done = new Set(['stop', 'length', 'aborted', 'error']);
  return (value?.samples ?? []).map((s) => `
  <div class="sample-column status-${esc(s.status)}" id="column-${s.index}">
    <div class="sample-header" id="header-${s.index}">${esc(s.header)}</div>
    <div class="sample-scroll"><div class="sample-text" id="sample-${s.index}">${esc(s.text)}</div></div>
    <button class="sample-stop" id="stop-${s.index}" data-index="${s.index}"
      ${done.has(s.status) ? 'disabled' : ''}>Stop</button>
  </div>`).join('');
})()}</div>"""
"""The grid, from the value {"samples": [{index, status, header, text}, ...]}."""

CSS = """
.sample-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 10px; }
.sample-column { display: flex; flex-direction: column; gap: 4px; min-width: 0;
  border: 1px solid var(--border-color-primary, #e2e8f0); border-radius: 8px; padding: 6px; }
.sample-header { font-size: 0.8em; font-variant-numeric: tabular-nums;
  color: var(--body-text-color-subdued); }
.sample-column.status-streaming .sample-header { color: #2563eb; }
.sample-column.status-aborted .sample-header, .sample-column.status-error .sample-header { color: #dc2626; }
.sample-scroll { height: 14em; overflow-y: auto; display: flex; flex-direction: column-reverse; }
.sample-text { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.9em; line-height: 1.35;
  margin-bottom: auto; }
.sample-stop { align-self: flex-start; font-size: 0.75em; padding: 1px 10px; border-radius: 6px;
  border: 1px solid var(--border-color-primary, #cbd5e1);
  background: var(--button-secondary-background-fill); }
.sample-stop:disabled { opacity: 0.4; }
"""
"""Columns as many per row as fit, all the same width; each text box keeps its newest line in view
(`column-reverse` anchors the scroll at the bottom while the text grows; a short text stays at the
top)."""

JS_ON_LOAD = """
element.addEventListener('click', (event) => {
  const button = event.target.closest('button[data-index]');
  if (button && !button.disabled) {
    button.disabled = true;
    trigger('select', {index: Number(button.dataset.index), value: 'stop'});
  }
});
"""
"""A Stop click becomes the grid's `select` event, carrying the column's index."""


def sample_grid() -> gr.HTML:
    """The grid component, empty until the first run."""
    return gr.HTML(
        value=empty_value(),
        html_template=TEMPLATE,
        css_template=CSS,
        js_on_load=JS_ON_LOAD,
        elem_id="samples",
        apply_default_css=False,
    )


def empty_value() -> dict[str, Any]:
    """No columns."""
    return {"samples": []}

"""The sample grid: one column per sample (header, streaming text, Stop), drawn in the browser.

All n columns are one `gr.HTML` output whose value is JSON (`view.samples_value`): Gradio then
sends, per page update, only what changed (each column's new text as an append), and a script in
the page applies it to the grid, appending new text to each column's text node. A component per
column (a Textbox, a header and a Column each: 97 outputs at N_MAX 32) costs the app tens of ms of
CPU per update and the browser its update rate (docs/benchmarks.md, "What the browser page costs").

Texts go into text nodes, never parsed as HTML (a sample may contain anything). A column's Stop
button triggers the component's `select` event with the column's index, which the app turns into a
`cancel` of that sample. Element ids stay what tests and scripts look for: `column-i`, `header-i`,
`sample-i` (the text), `stop-i`, and `prefix-i` (a continuation's text it goes on from).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ui import alternatives_view

TEMPLATE = '<div class="sample-grid"></div>'
"""A constant template: the page script below owns the grid's contents, so Gradio never re-parses
them (re-rendering a template of all n texts per update kept the page's main thread busy at n=32)."""

CSS = """
.sample-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 10px; }
.sample-grid:empty::before { grid-column: 1 / -1; padding: 40px 16px; text-align: center;
  color: var(--body-text-color-subdued); border: 1px dashed var(--border-color-primary, #cbd5e1);
  border-radius: 8px; content: "Press Generate: the n samples stream here, one column each."; }
.sample-column { display: flex; flex-direction: column; gap: 4px; min-width: 0;
  border: 1px solid var(--border-color-primary, #e2e8f0); border-radius: 8px; padding: 6px; }
.sample-header { font-size: 0.8em; font-variant-numeric: tabular-nums;
  color: var(--body-text-color-subdued); }
.sample-column.status-streaming .sample-header { color: #2563eb; }
.sample-column.status-error .sample-header { color: #dc2626; }
.sample-column.status-stopped .sample-header { color: #b45309; }
.sample-scroll { height: 14em; overflow-y: auto; display: flex; flex-direction: column-reverse;
  contain: strict; }
.sample-text { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.9em; line-height: 1.35;
  margin-bottom: auto; }
.sample-text > div { content-visibility: auto; contain-intrinsic-size: auto 6em; }
.sample-stop { align-self: flex-start; font-size: 0.75em; padding: 1px 10px; border-radius: 6px;
  border: 1px solid var(--border-color-primary, #cbd5e1);
  background: var(--button-secondary-background-fill); }
.sample-stop:disabled { opacity: 0.4; }
.sample-text .tok { border-radius: 2px; }
.sample-column { position: relative; }
.sample-text { cursor: text; }
.sample-continue { position: absolute; z-index: 2; font-size: 0.8em; padding: 2px 10px; border-radius: 6px;
  border: 1px solid #7c3aed; background: #7c3aed; color: white; cursor: pointer; white-space: nowrap; }
.sample-prefix { font-size: 0.8em; line-height: 1.3; color: var(--body-text-color-subdued);
  white-space: pre-wrap; overflow-wrap: anywhere; max-height: 4em; overflow: hidden;
  border-left: 3px solid #cbd5e1; padding-left: 6px; }
.sample-column[data-picked] { border-color: #7c3aed; box-shadow: 0 0 0 2px rgba(124, 58, 237, 0.35); }
.sample-grid[data-picking] .sample-column:not([data-picked]) { opacity: 0.45; }
.sample-text .tok[data-alts] { cursor: pointer; }
.sample-text .parting { display: inline-block; width: 0; height: 1.15em; vertical-align: text-bottom;
  border-left: 3px solid #7c3aed; margin: 0 1px; }
"""
"""Columns as many per row as fit, all the same width (before the first run, a line saying what
comes there); each text box keeps its newest line in view
(`column-reverse` anchors the scroll at the bottom while the text grows; a short text stays at the
top). A continued run's columns show, dimmed above the text, the end of the text they continue from
(`prefix-i`). Columns picked in the token tree (`ui.sample_tree_view`) are outlined, the others faded.
Text blocks scrolled out of view are not laid out or painted (`content-visibility: auto`,
keeping the size they had when last shown): without it each update laid out every column's whole
text, 15 ms a frame at the start of an n = 32 run and 78 ms at its end."""

JS_ON_LOAD = (
    r"""
const grid = element.querySelector('.sample-grid');
const done = new Set(['stop', 'length', 'stopped', 'error']);
const columns = [];
const BLOCK = 256;  // characters a text block holds before it may end, at a line's end (see append)
const MAX_BLOCK = 2048;  // characters after which a block ends at any whitespace

function column(index) {
  const col = document.createElement('div');
  col.id = `column-${index}`;
  const header = document.createElement('div');
  header.className = 'sample-header';
  header.id = `header-${index}`;
  const prefix = document.createElement('div');
  prefix.className = 'sample-prefix';
  prefix.id = `prefix-${index}`;
  prefix.hidden = true;
  const scroll = document.createElement('div');
  scroll.className = 'sample-scroll';
  const text = document.createElement('div');
  text.className = 'sample-text';
  text.id = `sample-${index}`;
  scroll.appendChild(text);
  const stop = document.createElement('button');
  stop.className = 'sample-stop';
  stop.id = `stop-${index}`;
  stop.dataset.index = String(index);
  stop.textContent = 'Stop';
  col.append(header, prefix, scroll, stop);
  grid.appendChild(col);
  return {col, header, prefix, text, stop, node: null, block: null, length: 0, endsLine: false, shown: '',
          status: '', marked: 0, partsAt: null, marker: null};
}

// A token's background: its probability p from red (unsure) through yellow to green (sure).
function colour(p) {
  return `hsla(${Math.round(120 * p)}, 85%, 55%, 0.35)`;
}

// Whether the text's next piece starts a new block: the block holds BLOCK characters and its text
// ends a line, or it holds MAX_BLOCK and the piece starts at whitespace (see append).
function blockEnds(c, next) {
  return c.length >= BLOCK && (c.endsLine || (c.length >= MAX_BLOCK && /^\s/.test(next)));
}

// With logprobs, each piece of text is a span coloured by its tokens' mean probability, the value
// on hover. Spans go into the same blocks as plain text.
function appendPiece(c, piece, p, alts) {
  if (!c.block || blockEnds(c, piece)) {
    c.block = document.createElement('div');
    c.text.appendChild(c.block);
    c.length = 0;
  }
  const span = document.createElement('span');
  span.className = 'tok';
  span.style.backgroundColor = colour(p);
  span.title = `p = ${p.toFixed(3)} (logprob ${Math.log(p).toFixed(2)})`;
  span.textContent = piece;
  span.dataset.start = String(c.shown.length);  // where its first token starts in the sample's text
  if (alts) { span.dataset.alts = ''; span._alts = alts; }
  c.block.appendChild(span);
  c.length += piece.length;
  c.endsLine = piece.endsWith('\n');
  c.node = null;  // plain text after a span starts a text node of its own
}

// Marks where this sample parts from every other sample: an empty span at that character offset
// (a bar drawn by CSS, so the text's content stays the sample's text), moved as the point moves.
function markParting(c, offset) {
  if (c.marker) { c.marker.remove(); c.marker = null; }
  c.partsAt = offset;
  if (offset === null || offset === undefined) return;
  const walker = document.createTreeWalker(c.text, NodeFilter.SHOW_TEXT);
  let seen = 0;
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const length = node.data.length;
    if (seen + length > offset) {
      const rest = offset - seen > 0 ? node.splitText(offset - seen) : node;
      if (node === c.node && rest !== node) c.node = rest;
      const marker = document.createElement('span');
      marker.className = 'parting';
      marker.title = 'here this sample parts from every other sample';
      rest.parentNode.insertBefore(marker, rest);
      c.marker = marker;
      return;
    }
    seen += length;
  }
}

// A column's text is a run of blocks (divs) of at least BLOCK characters, each ending where a line
// of the sample ends: an append lays out only the last block again, where one growing text node
// had the browser lay the whole text out on every update (12 KB a column at n=32 fell behind the
// stream). A block is a box of its own, so it ends only at a newline of the text, where the text
// breaks anyway; a paragraph longer than MAX_BLOCK ends its block at the next whitespace.
function append(c, delta) {
  while (delta) {
    if (c.block && c.length >= BLOCK && !c.endsLine) {
      // The block ends after the delta's first newline, or its first whitespace once the block
      // holds MAX_BLOCK characters, whichever comes first; else it takes the whole delta.
      const from = Math.max(MAX_BLOCK - c.length, 0);
      const space = delta.slice(from).search(/\s/);
      const cuts = [delta.indexOf('\n'), space < 0 ? -1 : from + space].filter((at) => at >= 0);
      const cut = cuts.length ? Math.min(...cuts) : -1;
      appendToBlock(c, cut < 0 ? delta : delta.slice(0, cut + 1));
      delta = cut < 0 ? '' : delta.slice(cut + 1);
      if (cut >= 0) c.endsLine = true;  // ended at a newline, or at whitespace: a new block
      continue;
    }
    if (!c.block || blockEnds(c, delta)) {
      c.block = document.createElement('div');
      c.text.appendChild(c.block);
      c.length = 0;
      c.endsLine = false;
      c.node = null;
    }
    const room = Math.max(BLOCK - c.length, 0);
    const part = room && delta.length > room ? delta.slice(0, room) : delta;
    appendToBlock(c, part);
    delta = delta.slice(part.length);
  }
}

// Text at the end of the current block, in its last text node (a new one after a span).
function appendToBlock(c, part) {
  if (!part) return;
  if (!c.node) {
    c.node = document.createTextNode('');
    c.block.appendChild(c.node);
  }
  c.node.appendData(part);
  c.length += part.length;
  c.endsLine = part.endsWith('\n');
}

function render(value) {
  const samples = (value && value.samples) || [];
  while (columns.length > samples.length) columns.pop().col.remove();
  const prefix = (value && value.prefix) || '';
  samples.forEach((sample, index) => {
    const c = columns[index] || (columns[index] = column(index));
    if (c.header.textContent !== sample.header) c.header.textContent = sample.header;
    if (c.prefix.textContent !== prefix) {
      c.prefix.textContent = prefix;
      c.prefix.hidden = !prefix;
    }
    if (c.status !== sample.status) {
      c.status = sample.status;
      c.col.className = `sample-column status-${sample.status}`;
      c.stop.disabled = done.has(sample.status);
    }
    const text = sample.text || '';
    const marks = sample.marks || [];
    // Text nodes, never HTML: a sample may contain anything. Growing text is appended.
    if (text !== c.shown || marks.length !== c.marked) {
      if (!text.startsWith(c.shown) || marks.length < c.marked) {
        c.text.replaceChildren();
        Object.assign(c, {node: null, block: null, length: 0, endsLine: false, shown: '', marked: 0,
                          marker: null, partsAt: null});
      }
      for (; c.marked < marks.length; c.marked++) {
        const [end, p, alts] = marks[c.marked];
        if (end > c.shown.length) {
          appendPiece(c, text.slice(c.shown.length, end), p, alts);
          c.shown = text.slice(0, end);
        }
      }
      if (text.length > c.shown.length) append(c, text.slice(c.shown.length));  // text no piece covers
      c.shown = text;
    }
    const partsAt = sample.parts_at === undefined ? null : sample.parts_at;
    if (partsAt !== c.partsAt || (partsAt !== null && !c.marker)) markParting(c, partsAt);
  });
}

// "Continue from here" at a point of a finished column: the end of the token clicked (with token
// confidence on) or of the word, a new run from the prompt plus the column's text up to there.
const cont = document.createElement('button');
cont.className = 'sample-continue';
cont.id = 'column-continue';
cont.textContent = 'Continue from here \u25b8';
let run = null;
let whyNot = '';  // why the run cannot be continued now ('' where it can): the button says so

// The button as the run allows it: offered at the point, or disabled with why not.
function offerState(c, at) {
  cont.disabled = Boolean(whyNot);
  cont.textContent = whyNot ? 'Continue: once the run has finished' : 'Continue from here \u25b8';
  cont.title = whyNot
    || `n new samples from the prompt plus \u2026${c.shown.slice(Math.max(0, at - 60), at)}`;
}

function charsBefore(c, target) {
  let count = 0;
  const walker = document.createTreeWalker(c.text, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n === target) return count;
    count += n.data.length;
  }
  return null;
}

function pointAt(c, event) {
  const tok = event.target.closest('.tok');
  if (tok && tok.firstChild && c.text.contains(tok)) {
    const before = charsBefore(c, tok.firstChild);
    return before === null ? null : before + tok.textContent.length;
  }
  const [x, y] = [event.clientX, event.clientY];
  const pos = document.caretPositionFromPoint ? document.caretPositionFromPoint(x, y) : null;
  const range = !pos && document.caretRangeFromPoint ? document.caretRangeFromPoint(x, y) : null;
  const node = pos ? pos.offsetNode : range ? range.startContainer : null;
  if (!node || node.nodeType !== Node.TEXT_NODE || !c.text.contains(node)) return null;
  const before = charsBefore(c, node);
  if (before === null) return null;
  const at = before + (pos ? pos.offset : range.startOffset);
  const rest = c.shown.slice(at).search(/\s/);  // to the end of the word
  const end = rest < 0 ? c.shown.length : at + rest;
  return end > 0 ? end : null;
}

function offerContinue(c, index, event) {
  const at = pointAt(c, event);
  if (at === null) { cont.remove(); return; }
  cont.dataset.column = String(index);
  cont.dataset.offset = String(at);
  offerState(c, at);
  const box = c.col.getBoundingClientRect();
  cont.style.top = `${Math.min(event.clientY - box.top + 6, box.height - 28)}px`;
  cont.style.left = `${Math.max(4, Math.min(event.clientX - box.left - 40, box.width - 160))}px`;
  c.col.appendChild(cont);
}

// A token's alternatives (with token confidence on): on hover, and held by a click; a row's click
// branches on that token (the grid's select event with {continue_at: the token's start, chosen}).
let altNote = '';
let altHeld = null;  // the span whose alternatives stay shown (clicked)
const alternatives = alternativesPopup('token-alternatives', (token) => {
  const span = altHeld || alternatives.span;
  const index = columns.findIndex((c) => c.text.contains(span));
  if (index < 0) return;
  cont.remove();
  trigger('select', {index, value: {continue_at: Number(span.dataset.start), chosen: token, run}});
});

function showAlternatives(span, below) {
  const index = columns.findIndex((c) => c.text.contains(span));
  if (index < 0) return;
  const c = columns[index];
  const box = c.col.getBoundingClientRect();
  const at = span.getBoundingClientRect();
  alternatives.span = span;
  alternatives.open(c.col, Math.min(at.bottom - box.top + below, box.height - 20),
                    Math.max(4, Math.min(at.left - box.left, box.width - 200)),
                    span._alts || null, altNote, whyNot);
}

element.addEventListener('mouseover', (event) => {
  const span = event.target.closest('.sample-text .tok');
  if (span && !altHeld && span !== alternatives.span) showAlternatives(span, 4);
});
element.addEventListener('mouseleave', () => {
  if (!altHeld) { alternatives.close(); alternatives.span = null; }
});

render(props.value);
run = props.value ? props.value.run : null;
whyNot = (props.value && props.value.why_not) || '';
altNote = (props.value && props.value.alt_note) || '';
watch('value', () => {
  const value = props.value;
  if ((value ? value.run : null) !== run) {  // a new run: no point of the old one
    cont.remove();
    alternatives.close();
    altHeld = alternatives.span = null;
  }
  run = value ? value.run : null;
  altNote = (value && value.alt_note) || '';
  const reason = (value && value.why_not) || '';
  if (reason !== whyNot) {
    whyNot = reason;
    const index = Number(cont.dataset.column);
    if (cont.isConnected && columns[index]) offerState(columns[index], Number(cont.dataset.offset));
    if (altHeld && altHeld.isConnected) showAlternatives(altHeld, 34);  // its rows as the run now allows
  }
  render(value);
});
element.addEventListener('click', (event) => {
  if (event.target === cont) {
    if (cont.disabled) return;
    cont.disabled = true;
    trigger('select', {index: Number(cont.dataset.column),
                       value: {continue_at: Number(cont.dataset.offset), run}});
    return;
  }
  const button = event.target.closest('button[data-index]');
  if (button) {
    if (!button.disabled) {
      button.disabled = true;
      trigger('select', {index: Number(button.dataset.index), value: 'stop'});
    }
    return;
  }
  if (alternatives.element.contains(event.target)) return;
  const index = columns.findIndex((c) => c.text.contains(event.target) || c.text === event.target);
  if (index < 0) { cont.remove(); alternatives.close(); altHeld = alternatives.span = null; return; }
  offerContinue(columns[index], index, event);
  const span = event.target.closest('.tok');
  altHeld = span && columns[index].text.contains(span) ? span : null;
  if (altHeld) showAlternatives(altHeld, 34); else alternatives.close();
});
"""
    + alternatives_view.POPUP_JS
)
"""Builds and updates the columns from the value: only what changed is touched (a column's new
text is appended to its last text block; with logprobs, as spans coloured by probability); the
point where a sample parts from every other sample gets a marker; a Stop click becomes the grid's
`select` event with the column's index and the value "stop"; a click in a finished column's text
offers Continue from here at that point (the end of the token or word clicked), whose click is the
`select` event with the column's index and `{continue_at, run}`; while the run cannot be continued
(the value's `why_not`: still streaming) the button says so, disabled, instead. With token
confidence, hovering a token shows its alternatives (`ui.alternatives_view`'s popup, `token-alternatives`),
a click holds them under the Continue button; picking one is the `select` event with
`{continue_at: the token's start, chosen: the token, run}`; a run without any says why (`alt_note`)."""


def sample_grid() -> gr.HTML:
    """The grid component, empty until the first run."""
    return gr.HTML(
        value=empty_value(),
        html_template=TEMPLATE,
        css_template=CSS + alternatives_view.CSS,
        js_on_load=JS_ON_LOAD,
        elem_id="samples",
        apply_default_css=False,
    )


def empty_value() -> dict[str, Any]:
    """No columns."""
    return {"samples": []}

"""The token tree panel: the run's `SampleTree` drawn as nested lists in the browser.

`tree_value` turns the tree into the component's value: one row per node in depth-first order, its
level, how many samples took it and which, the branch's probability (with logprobs), its edge's text
(a long straight run elided in the middle) and its size. Each row goes as a JSON string: the page
keeps a value as deep reactive state and copies it per update, and 64 strings cost it less than 64
objects of 8 keys (docs/benchmarks.md, "The token tree"); an unchanged row is an unchanged string, which
Gradio does not send again where it keeps its place and the script does not redraw. (Nested lists
in rows would also meet a fault of Gradio's update diff, which gives wrong paths for a list inside
a list that loses items.)
A script in the page (`JS_ON_LOAD`) draws the rows as nested lists, text in text nodes (a sample
may contain anything); clicking a node marks its samples' columns in the sample grid
(`data-picked` on `column-i`, styled by `ui.sample_grid`), clicking it again clears the mark. A
picked node gets a "Continue from here" button (`tree-continue`): its click is the component's
`select` event, with the node's id as the index and the tree's run as the value, which the app turns
into a continuation of that branch (`ui.handlers.Handlers.continue_from`).
Element ids: the component is `sample-tree`; each node's button carries `data-id` and
`data-samples`.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from ui import alternatives_view
from ui.sample_tree import TOKENS, Node, SampleTree, sample_indices

LABEL_CHARS = 64
"""An edge's text is shown whole up to this many characters; a longer one shows its first
LABEL_HEAD and last LABEL_TAIL characters around an ellipsis (the columns hold the whole text)."""
LABEL_HEAD = 40
LABEL_TAIL = 18


ROW_FIELDS = ("id", "level", "count", "samples", "p", "size", "ends", "text", "earlier", "unit", "alts")
"""A row's fields, in the order of its JSON array (`earlier`: 1 for a node of an earlier run of the
tree, drawn dimmed, its samples not in the columns; `unit`: what its size counts, its own run's
tree's unit, or CHARACTERS for the words a column's continuation goes on from; `alts`: its first
token's alternatives, `ui.alternatives_view.listed`, or null)."""

CHOSEN_MARK = "\u270b"
"""Marks, in a continuation's root row, the token chosen by hand (an alternative branched on)."""

CHARACTERS = "char"
"""The unit of a row whose size counts characters whatever its tree's unit (a continuation's words)."""

RUN_STRIDE = 1 << 20
"""A node's id in a tree of several runs: its run's position times RUN_STRIDE, plus its id in that
run's tree (`lineage_value`, `split_id`)."""


def tree_value(tree: SampleTree, run: str, why_not: str = "") -> dict[str, Any]:
    """The panel's value for `tree`, the tree of run `run` (a new run clears the page's pick): one
    JSON string per node (`ROW_FIELDS`), depth first; `why_not` says why its branches cannot be
    continued now ("" where they can)."""
    return lineage_value([tree], [None], run, why_not=why_not)


def lineage_value(
    trees: list[SampleTree],
    parents: list[tuple[int, int] | None],
    run: str,
    joins: list[str] | None = None,
    why_not: str = "",
    chosen: list[str] | None = None,
) -> dict[str, Any]:
    """The panel's value for a run and the runs it continues: `trees[i]` is run i's tree and
    `parents[i]` the (run position, node id) whose branch it continued (None for the first). The last
    run is the one on the page (`run`); the earlier runs' nodes are drawn dimmed, and each run's
    branches grow from the node it continued (its root is that node). Where a run continued from a
    point inside that node's children (a column's word), `joins[i]` is the text past the node it
    goes on from, drawn as a row of its own (its root) between that node and its branches. Node
    ids are `position * RUN_STRIDE + id`; `why_not` says why no branch can be continued now ("":
    they can); `chosen[i]` is the token chosen by hand that run i's join ends with (an alternative
    branched on), marked in its row."""
    joins = joins or [""] * len(trees)
    chosen = chosen or [""] * len(trees)
    attached: dict[tuple[int, int], list[int]] = {}
    for position, parent in enumerate(parents):
        if parent is not None:
            attached.setdefault(parent, []).append(position)
    current = len(trees) - 1
    rows: list[str] = []

    def emit(position: int, offset: int) -> None:
        tree = trees[position]
        earlier = position != current
        if position and joins[position]:
            rows.append(_join_row(tree, (joins[position], chosen[position]), offset + 1, position, earlier))
            offset += 1
        for node, level in tree.walk():
            if position and node is tree.root:
                continue  # a continuation's root is the node it continued (or its join), drawn already
            rows.append(_row(tree, node, level + offset, position, earlier))
            for child in attached.get((position, node.id), []):
                emit(child, level + offset)

    emit(0, 0)
    tree = trees[current]
    value = {"run": run, "n": tree.n, "unit": tree.unit, "nodes": rows if tree.n else []}
    value["why_not"] = why_not
    return value


def _join_row(tree: SampleTree, join: tuple[str, str], level: int, position: int, earlier: bool) -> str:
    """The row of a continuation's root where it goes on from words past the node it continued:
    those words (their end, where long), their size in characters, all its samples; a token
    chosen by hand at their end (`join[1]`) is marked as such."""
    text, chosen = join
    if chosen and text.endswith(chosen):
        text = f"{text[: len(text) - len(chosen)]}{CHOSEN_MARK}{chosen} (chosen by hand)"
    shown = text if len(text) <= LABEL_CHARS else "… " + text[-LABEL_CHARS:]
    row = [
        position * RUN_STRIDE + tree.root.id,
        level,
        tree.root.count,
        [] if earlier else sample_indices(tree.root.samples),
        None,
        len(text),
        0,
        "+ " + shown.replace("\r\n", "↵").replace("\n", "↵"),
        1 if earlier else 0,
        CHARACTERS,
        None,
    ]
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def split_id(node_id: int) -> tuple[int, int]:
    """A panel node id as (run position, node id in that run's tree)."""
    return divmod(node_id, RUN_STRIDE)


def _row(tree: SampleTree, node: Node, level: int, position: int, earlier: bool) -> str:
    probability = tree.probability(node)
    row = [
        position * RUN_STRIDE + node.id,
        level,
        node.count,
        [] if earlier else sample_indices(node.samples),
        None if probability is None else round(probability, 4),
        node.length if tree.unit == TOKENS else tree.edge_chars(node),
        (node.ends & tree.finished).bit_count(),
        _label(tree, node),
        1 if earlier else 0,
        tree.unit,
        tree.first_alternatives(node),
    ]
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"))


def value_rows(value: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a panel value, read back as dicts of `ROW_FIELDS`."""
    return [dict(zip(ROW_FIELDS, json.loads(row), strict=True)) for row in value["nodes"]]


def _label(tree: SampleTree, node: Node) -> str:
    """The edge's text, elided in the middle past LABEL_CHARS, line breaks shown as ↵."""
    if tree.edge_chars(node) <= LABEL_CHARS:
        text = tree.edge_text(node)
    else:
        units = tree.units[node.owner]
        head_end = node.start
        head = 0
        while head < LABEL_HEAD:
            head += len(units[head_end])
            head_end += 1
        tail_start = node.end
        tail = 0
        while tail < LABEL_TAIL:
            tail_start -= 1
            tail += len(units[tail_start])
        first = "".join(units[node.start : head_end])[:LABEL_HEAD]
        last = "".join(units[tail_start : node.end])[-LABEL_TAIL:]
        text = f"{first} … {last}"
    return text.replace("\r\n", "↵").replace("\n", "↵")


def empty_value() -> dict[str, Any]:
    """No run yet."""
    return {"run": None, "n": 0, "unit": None, "nodes": [], "why_not": ""}


TEMPLATE = '<div class="sample-tree"></div>'
"""A constant template: the page script owns the tree's contents."""

CSS = """
.sample-tree { font-size: 0.85em; max-height: 30em; overflow: auto; }
.sample-tree ul { list-style: none; margin: 0; padding-left: 16px;
  border-left: 1px solid var(--border-color-primary, #cbd5e1); }
.sample-tree > ul { padding-left: 0; border-left: none; }
.sample-tree li { margin: 2px 0; }
.tree-node { display: inline-flex; flex-wrap: wrap; gap: 6px; align-items: baseline; max-width: 100%;
  text-align: left; border: 1px solid transparent; border-radius: 6px; padding: 1px 6px;
  background: none; color: inherit; font: inherit; cursor: pointer; }
.tree-node:hover { border-color: var(--border-color-primary, #cbd5e1); }
.tree-node.picked { border-color: #7c3aed; background: rgba(124, 58, 237, 0.12); }
.tree-node.earlier { opacity: 0.5; }
.tree-node.earlier.picked { opacity: 0.85; }
.tree-count { font-weight: 600; min-width: 1.7em; text-align: center; border-radius: 9px; padding: 0 5px;
  background: var(--background-fill-secondary, #e2e8f0); font-variant-numeric: tabular-nums; }
.tree-p { border-radius: 3px; padding: 0 3px; font-variant-numeric: tabular-nums; }
.tree-text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: var(--font-mono, monospace); }
.tree-size, .tree-end { color: var(--body-text-color-subdued, #64748b); font-size: 0.85em; }
.tree-empty { color: var(--body-text-color-subdued, #64748b); padding: 8px; }
.tree-continue { margin-left: 8px; font: inherit; font-size: 0.9em; padding: 1px 10px; border-radius: 6px;
  border: 1px solid #7c3aed; background: #7c3aed; color: white; cursor: pointer; }
.tree-continue:disabled { opacity: 0.5; cursor: default; }
"""
"""Each level indented under a rule; a node is a button: its count in a pill, the branch's
probability coloured as the columns colour tokens, its text, its size and how many samples end there."""

JS_ON_LOAD = (
    r"""
const box = element.querySelector('.sample-tree');
let run;
let top = null;
const items = new Map();  // node id -> its list item, button and parts, kept while the node exists
let picked = null;  // {id, samples}: the clicked node and its samples
// "Continue from here", shown beside the picked node: n new samples from the prompt plus the text
// up to the end of that node (the app's select event, with the node's id and this tree's run).
const cont = document.createElement('button');
cont.className = 'tree-continue';
cont.id = 'tree-continue';
cont.textContent = 'Continue from here \u25b8';
const TITLE = 'n new samples from the prompt plus the text up to the end of this branch, as a new run';
cont.title = TITLE;

function colour(p) {
  return `hsla(${Math.round(120 * p)}, 85%, 55%, 0.35)`;
}

const FIELDS = ['id', 'level', 'count', 'samples', 'p', 'size', 'ends', 'text', 'earlier', 'unit', 'alts'];
const rows = new Map();  // node id -> its parsed row, for its first token's alternatives
let altNote = '';
let altNode = null;  // the node whose alternatives are shown
// A node's first token's alternatives, beside the picked (or hovered) node; a row's click branches
// on that token (the tree's select event with the node's id and {run, chosen}).
const alternatives = alternativesPopup('tree-alternatives', (token) => {
  if (altNode !== null && run) trigger('select', {index: altNode, value: {run, chosen: token}});
});

function showAlternatives(id) {
  const it = items.get(id);
  const node = rows.get(id);
  if (!it || !node || node.level === 0 || node.earlier || (node.p === null && !node.alts)) {
    alternatives.close();
    altNode = null;
    return;
  }
  altNode = id;
  alternatives.open(it.li, 0, 0, node.alts || null, altNote, whyNot);
}
let whyNot = '';  // why no branch can be continued now ('' where one can)
const CAN = 'Continue from here \u25b8';
const CANNOT = 'Continue: once the run has finished';

function parse(row) {
  const fields = JSON.parse(row);
  const node = {row};
  FIELDS.forEach((name, i) => { node[name] = fields[i]; });
  return node;
}

// Marks the picked node's samples' columns in the sample grid (and the node itself).
function highlight() {
  const grid = document.querySelector('#samples .sample-grid');
  if (grid) {
    // A node of an earlier run has no columns on the page: nothing to mark.
    if (picked && picked.samples.length) grid.dataset.picking = ''; else delete grid.dataset.picking;
    grid.querySelectorAll('[id^="column-"]').forEach((col) => {
      const index = Number(col.id.slice(7));
      if (picked && picked.samples.includes(index)) col.dataset.picked = '';
      else delete col.dataset.picked;
    });
  }
  for (const [id, it] of items) {
    const on = picked !== null && id === picked.id;
    it.button.classList.toggle('picked', on);
    it.button.setAttribute('aria-pressed', on ? 'true' : 'false');
    if (on && cont.previousSibling !== it.button) {
      offer();
      it.li.insertBefore(cont, it.button.nextSibling);
    }
  }
  if (picked === null || !items.has(picked.id)) cont.remove();
  if (picked !== null && items.has(picked.id)) {
    if (altNode !== picked.id) showAlternatives(picked.id);
  } else if (altNode !== null && !items.has(altNode)) {
    alternatives.close();
    altNode = null;
  }
}

// The button as the run allows it: offered, or disabled with why not (a run still streaming).
function offer() {
  cont.disabled = Boolean(whyNot);
  cont.textContent = whyNot ? CANNOT : CAN;
  cont.title = whyNot || TITLE;
}

function part(button, name) {
  const span = document.createElement('span');
  span.className = name;
  button.appendChild(span);
  return span;
}

function item(id) {
  let it = items.get(id);
  if (!it) {
    const li = document.createElement('li');
    const button = document.createElement('button');
    button.className = 'tree-node';
    button.dataset.id = String(id);
    li.appendChild(button);
    it = {li, button, list: null, shown: '', count: part(button, 'tree-count'), p: part(button, 'tree-p'),
          text: part(button, 'tree-text'), size: part(button, 'tree-size'), ends: part(button, 'tree-end')};
    items.set(id, it);
  }
  return it;
}

// Writes a node's parts, only where they changed. Text goes into text nodes, never HTML.
function show(it, node, unit, n) {
  if (node.row === it.shown) return;
  it.shown = node.row;
  const names = node.samples.map((i) => `#${i}`).join(' ');
  it.button.dataset.samples = node.samples.join(',');
  it.button.classList.toggle('earlier', Boolean(node.earlier));
  it.button.title = node.earlier
    ? `an earlier run of this tree: ${node.count} of its samples took this branch`
    : node.level === 0 ? `${n} samples` : `${node.count} of ${n} samples took this branch: ${names}`;
  it.count.textContent = String(node.count);
  const hasP = node.p !== null && node.p !== undefined;
  it.p.hidden = !hasP;
  if (hasP) {
    it.p.textContent = `p ${node.p.toFixed(2)}`;
    it.p.style.backgroundColor = colour(node.p);
  }
  it.text.textContent = node.level === 0 ? 'prompt' : node.text;
  it.size.hidden = node.level === 0 || node.size < 2;
  it.size.textContent = (node.unit || unit) === 'token' ? `${node.size} tok` : `${node.size} ch`;
  it.ends.hidden = !node.ends;
  it.ends.textContent = `\u25a0 ${node.ends} ended`;
}

// Puts each node's item in its parent's list, in the value's order, moving only what moved, so a
// button stays the same element while the tree grows (a click on it lands).
function render(value) {
  const nodes = ((value && value.nodes) || []).map(parse);
  const thisRun = value ? value.run : null;
  const reason = (value && value.why_not) || '';
  altNote = (value && value.alt_note) || '';
  rows.clear();
  nodes.forEach((node) => rows.set(node.id, node));
  if (reason !== whyNot) {
    whyNot = reason;
    if (cont.isConnected) offer();
    if (altNode !== null) { const shown = altNode; altNode = null; showAlternatives(shown); }
  }
  if (thisRun !== run || !nodes.length) {
    run = thisRun;
    picked = null;
    alternatives.close();
    altNode = null;
    items.clear();
    top = null;
  }
  if (!nodes.length) {
    const empty = document.createElement('div');
    empty.className = 'tree-empty';
    empty.textContent = 'The samples\u2019 token tree grows here while they stream.';
    box.replaceChildren(empty);
    highlight();
    return;
  }
  if (!top) {
    top = document.createElement('ul');
    box.replaceChildren(top);
  }
  const seen = new Set();
  const filled = new Map();  // list -> how many of its children are placed
  const path = [];  // the item at each level of the current node's path
  for (const node of nodes) {
    const it = item(node.id);
    seen.add(node.id);
    show(it, node, value.unit, value.n);
    let list = top;
    if (node.level > 0) {
      const parent = path[node.level - 1];
      if (!parent.list) parent.list = parent.li.appendChild(document.createElement('ul'));
      list = parent.list;
    }
    const at = filled.get(list) || 0;
    if (list.children[at] !== it.li) list.insertBefore(it.li, list.children[at] || null);
    filled.set(list, at + 1);
    path[node.level] = it;
    path.length = node.level + 1;
    if (picked && picked.id === node.id) picked.samples = node.samples;
  }
  for (const [id, it] of items) {
    if (!seen.has(id)) { it.li.remove(); items.delete(id); }
  }
  for (const it of items.values()) {
    if (it.list && !it.list.children.length) { it.list.remove(); it.list = null; }
  }
  highlight();
}

render(props.value);
watch('value', () => render(props.value));
box.addEventListener('mouseover', (event) => {
  const button = event.target.closest('button.tree-node');
  const id = button ? Number(button.dataset.id) : null;
  if (button && picked === null && id !== altNode) showAlternatives(id);
});
box.addEventListener('mouseleave', () => {
  if (picked === null) { alternatives.close(); altNode = null; }
});
element.addEventListener('click', (event) => {
  if (alternatives.element.contains(event.target)) return;
  if (event.target === cont) {
    if (picked !== null && run && !whyNot) {
      cont.disabled = true;  // one continuation per click; a new run's tree brings it back
      trigger('select', {index: picked.id, value: run});
    }
    return;
  }
  const button = event.target.closest('button.tree-node');
  if (!button) return;
  const id = Number(button.dataset.id);
  const samples = button.dataset.samples.split(',').filter(Boolean).map(Number);
  picked = picked && picked.id === id ? null : {id, samples};
  if (picked === null) { alternatives.close(); altNode = null; } else showAlternatives(id);
  highlight();
});
"""
    + alternatives_view.POPUP_JS
)
"""Keeps one list item per node while the node exists and updates only what changed (a node that
moves is moved, not rebuilt), so a button a person is clicking is not replaced under the pointer;
keeps the picked node across updates of the same run (its samples as the tree now has them) and
marks its samples' columns. With token confidence, the picked or hovered node shows its first
token's alternatives (`ui.alternatives_view`'s popup, `tree-alternatives`); picking one is the
`select` event with the node's id and `{run, chosen}`."""

TREE_POPUP_CSS = """
.sample-tree .alt-popup { position: static; display: block; margin: 3px 0 3px 16px; width: max-content; }
"""
"""In the tree the popup sits under its node, in the list's flow."""


def sample_tree() -> gr.HTML:
    """The tree component, empty until the first run."""
    return gr.HTML(
        value=empty_value(),
        html_template=TEMPLATE,
        css_template=CSS + alternatives_view.CSS + TREE_POPUP_CSS,
        js_on_load=JS_ON_LOAD,
        elem_id="sample-tree",
        apply_default_css=False,
    )

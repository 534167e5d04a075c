"""The page's outputs of a run, in the order its events fill them (`ui.app.RUN_OUTPUTS`): the
columns, the status line, the summary, the trace panel, the answers chart and line, the token tree;
without I/O."""

from __future__ import annotations

import time
from typing import Any

import gradio as gr

from ui.answers_view import AnswersPanel
from ui.answers_view import empty_outputs as empty_answers
from ui.lineage import Lineage, cannot_continue
from ui.sample_grid import empty_value
from ui.sample_tree_view import empty_value as empty_tree
from ui.sample_tree_view import lineage_value, tree_value
from ui.trace_view import panel_html
from ui.view import RunView, samples_value, status_markdown, summary_markdown


def outputs_for(
    view: RunView,
    answers: AnswersPanel | None = None,
    with_trace: bool = True,
    lineage: Lineage | None = None,
) -> list[Any]:
    """The page's outputs (columns, status line, summary, trace panel, answers chart and line,
    token tree) for `view`; the summary and the trace panel only `with_trace`, the answers when a
    sample finished; the tree with the earlier runs of its `lineage` where `view` is its last run's."""
    shown = view.n if view.accepted else 0
    whole = lineage is not None and bool(lineage.runs) and lineage.runs[-1].view is view
    why_not = cannot_continue(view, len(lineage.runs) if lineage is not None and whole else 1)
    if lineage is not None and whole:
        trees = [run.view.tree for run in lineage.runs]
        joins = lineage.joins()
        tree = lineage_value(trees, lineage.parents, view.request_id, joins, why_not, lineage.chosen)
    else:
        tree = tree_value(view.tree, view.request_id, why_not)
    columns = samples_value(view, time.monotonic())
    if "alt_note" in columns:
        tree["alt_note"] = columns["alt_note"]
    if view.accepted:
        columns["why_not"] = why_not
    return [
        columns,
        status_markdown(view, time.monotonic()),
        summary_markdown(view) if with_trace else gr.skip(),
        panel_html(view.trace, shown) if with_trace else gr.skip(),
        *(answers.outputs(view) if answers is not None else [gr.skip(), gr.skip()]),
        tree,
    ]


def error_outputs(message: str) -> list[Any]:
    """The page's outputs for a run that could not start."""
    return [empty_value(), f"**Error:** {message}", "", gr.skip(), *empty_answers(), empty_tree()]


OUTPUTS = 7
"""How many outputs `outputs_for` fills."""


def status_only(line: str) -> list[Any]:
    """The page's outputs that change the status line only: the columns, tree and the rest stay."""
    return [gr.skip(), line, *[gr.skip()] * (OUTPUTS - 2)]


def waiting_outputs(line: str, first: bool) -> list[Any]:
    """The page's outputs while Generate waits for the engine: the waiting `line` in the status; on
    the `first` of them, the previous run's columns, summary and answers cleared."""
    if not first:
        return status_only(line)
    return [empty_value(), line, "", gr.skip(), *empty_answers(), empty_tree()]

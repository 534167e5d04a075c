"""A session's tree of runs, and what continuing one of its branches asks for, without I/O.

Each Generate starts a tree (`Lineage`); each Continue from here adds a run that grows from a node of
an earlier run. A branch is continued from the prompt its run sampled from (`Origin`) plus the text
up to that node or to a point of a column, ending where the model's own tokens can end
(`SampleTree.branch_text`); `CannotContinue` says in the page's words why a branch cannot be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend.saved_run import RUNS_MAX, Continues, SavedRun, SavedRunError
from ui.alternatives_view import chosen_among, is_drawn
from ui.client import BackendRun
from ui.sample_tree import SampleTree
from ui.sample_tree_view import split_id
from ui.view import RunView

STILL_STREAMING = "the run is still streaming: continue from it once it has finished, or Cancel it"
"""Why no branch of a streaming run can be continued, as the page says it."""


def cannot_continue(view: RunView, runs: int) -> str:
    """Why the branches of `view`, the last of a tree of `runs` runs, cannot be continued now ("":
    they can), as Continue from here says it on the page."""
    if not view.finished:
        return STILL_STREAMING
    if runs >= RUNS_MAX:
        return f"this tree has {RUNS_MAX} runs, the most one keeps: press Generate to start a new one"
    return ""


class CannotContinue(Exception):
    """A branch of the token tree that cannot be continued; the message says why, for the page."""


@dataclass
class Lineage:
    """A session's tree of runs: its first run, then each run that continued a branch of an earlier
    one, in the order they ran, with the (run position, node id) each continued."""

    runs: list[BackendRun] = field(default_factory=list)
    parents: list[tuple[int, int] | None] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)
    """Each run's token chosen by hand (an alternative branched on: the end of its prefix), or ""."""

    def add(self, run: BackendRun, parent: tuple[int, int] | None, chosen: str = "") -> None:
        """`run`, continuing node `parent` (None: a run of its own, which starts a new tree), its
        prefix ending with the token `chosen` by hand where it branched on an alternative."""
        if parent is None:
            self.runs.clear()
            self.parents.clear()
            self.chosen.clear()
        self.runs.append(run)
        self.parents.append(parent)
        self.chosen.append(chosen if parent is not None else "")

    def pop(self) -> None:
        """Forget the last run (one that never started)."""
        self.runs.pop()
        self.parents.pop()
        self.chosen.pop()

    def joins(self) -> list[str]:
        """For each run, the text it goes on from past the node it continued ("" for a run that
        continued a node's whole text, and for the first): the words of a column's point."""
        joins = []
        for run, parent in zip(self.runs, self.parents, strict=True):
            join = ""
            if parent is not None:
                before = self.runs[parent[0]].view
                node = before.tree.find(parent[1])
                reached = before.prefix + (before.tree.text_to(node) if node is not None else "")
                if run.view.prefix.startswith(reached):
                    join = run.view.prefix[len(reached) :]
            joins.append(join)
        return joins

    def saved_runs(self, source: dict[str, str]) -> list[SavedRun]:
        """Every run of the tree as a saved run, each continuation saying which branch it continued
        (SavedRunError while a run has not finished)."""
        saved = []
        joins = self.joins()
        for place, (run, parent) in enumerate(zip(self.runs, self.parents, strict=True)):
            if run.recorder is None:
                raise SavedRunError("a run of this tree never started")
            one = run.recorder.saved_run(source)
            if parent is not None:
                position, node_id = parent
                tree = self.runs[position].view.tree
                node = tree.find(node_id)
                text = (tree.text_to(node) if node is not None else "") + joins[place]
                continues = Continues(position, text, self.chosen[place])
                one = dataclasses.replace(one, continues=continues)
            saved.append(one)
        return saved


def branch_node(tree: SampleTree, text: str) -> int:
    """The id of the node of `tree` whose text (from the root) is `text`, or else of the deepest node
    whose text begins it: where a replayed continuation's branches are drawn."""
    best, best_length = tree.root, 0
    for node, _ in tree.walk():
        reached = tree.text_to(node)
        if len(reached) > best_length and text.startswith(reached):
            best, best_length = node, len(reached)
    return best.id


@dataclass(frozen=True)
class Origin:
    """What a run's samples were sampled from, as a continuation of one of its branches needs it:
    the prompt, the format it ran in, the system prompt, and the text it continued from."""

    prompt: str
    prompt_format: str
    system: str
    prefix: str
    chosen: str = ""
    """The token chosen by hand that `prefix` ends with (an alternative branched on), or ""."""


def continuable_from(
    run: BackendRun | None, lineage: Lineage | None, run_id: Any
) -> tuple[BackendRun, Lineage]:
    """The session's run, finished, and its tree of runs, where `run_id` is that run (the page shows
    it); CannotContinue says why a continuation cannot be made from the page."""
    if run is None or lineage is None or not lineage.runs or lineage.runs[-1] is not run:
        raise CannotContinue(
            "this page has no run to continue (the server restarted, or the run was closed): press Generate"
        )
    if run_id != run.request_id:
        raise CannotContinue(
            f"this tree is of run {str(run_id)[:40]!r}, but the page's run is now {run.request_id}: "
            "continue from a branch of the tree shown now"
        )
    why = cannot_continue(run.view, len(lineage.runs))
    if why:
        raise CannotContinue(why)
    return run, lineage


def _origin(view: RunView, known: Origin | None, text: str) -> Origin:
    """The origin of a continuation of `text` (a branch's, or a column's up to a point) of the run
    `view` shows, sampled from `known`."""
    if known is None:
        raise CannotContinue("this run cannot be continued: the page does not know its prompt")
    prompt_format = view.prompt_format or known.prompt_format
    system = known.system if prompt_format == "chat" else ""
    return Origin(known.prompt, prompt_format, system, known.prefix + view.tree.branch_text(text))


def point_origin(
    run: BackendRun, lineage: Lineage, known: Origin | None, column: Any, offset: Any, chosen: Any = None
) -> tuple[Origin, tuple[int, int]]:
    """What continuing column `column` of `run` (the last of `lineage`, sampled from `known`) from
    character `offset` of its text asks for, and the node of the tree at or before that point;
    with `chosen`, the token at `offset` replaced by that alternative (`alternative_origin`).
    CannotContinue says why it cannot be."""
    samples = run.view.samples
    if not (isinstance(column, int) and 0 <= column < len(samples)):
        raise CannotContinue(f"the run has no column {str(column)[:20]!r}")
    text = samples[column].text
    if not (isinstance(offset, int) and not isinstance(offset, bool) and 0 < offset <= len(text)):
        raise CannotContinue(
            f"column #{column} has no point {str(offset)[:20]!r} to continue from (its text has "
            f"{len(text)} characters)"
        )
    if chosen is not None:
        return alternative_origin(run, lineage, known, column, offset, chosen)
    origin = _origin(run.view, known, text[:offset])
    return origin, (len(lineage.runs) - 1, branch_node(run.view.tree, text[:offset]))


def alternative_origin(
    run: BackendRun, lineage: Lineage, known: Origin | None, column: int, offset: int, chosen: Any
) -> tuple[Origin, tuple[int, int]]:
    """What branching column `column` of `run` on the alternative `chosen` of its token starting at
    character `offset` asks for: the text before that token, then `chosen` (marked as chosen by
    hand), the branch growing from the deepest node at or before the token; the drawn token is
    Continue from here at the token's end. CannotContinue says why it cannot be: no token starts
    there, or `chosen` is not one the engine listed there."""
    sample = run.view.samples[column]
    found = sample.alternatives_at(offset)
    if found is None:
        raise CannotContinue(f"column #{column} has no token starting at character {offset}")
    end, alternatives = found
    why = chosen_among(alternatives, chosen)
    if why:
        raise CannotContinue(why)
    parent = (len(lineage.runs) - 1, branch_node(run.view.tree, sample.text[:offset]))
    if is_drawn(alternatives, chosen):
        return _origin(run.view, known, sample.text[:end]), (
            parent[0],
            branch_node(run.view.tree, sample.text[:end]),
        )
    origin = _origin(run.view, known, sample.text[:offset])
    return dataclasses.replace(origin, prefix=origin.prefix + chosen, chosen=chosen), parent


def node_origin(
    lineage: Lineage, origins: Mapping[BackendRun, Origin], node_id: Any, chosen: Any = None
) -> tuple[Origin, tuple[int, int]]:
    """What continuing node `node_id` of the tree of `lineage`'s runs asks for, and the (run
    position, node id) it continues; with `chosen`, the node's first token replaced by that
    alternative (the branch grows from the node's parent, the token marked as chosen by hand; the
    drawn token continues the node's parent's text and that token). CannotContinue says why it
    cannot be."""
    position, local = split_id(node_id) if isinstance(node_id, int) and node_id >= 0 else (-1, -1)
    target = lineage.runs[position] if 0 <= position < len(lineage.runs) else None
    node = target.view.tree.find(local) if target is not None else None
    if target is None or node is None:
        raise CannotContinue(f"the tree on the page has no branch {str(node_id)[:20]!r} (any more)")
    tree = target.view.tree
    if chosen is None:
        return _origin(target.view, origins.get(target), tree.text_to(node)), (position, node.id)
    alternatives = tree.first_alternatives(node)
    why = chosen_among(alternatives, chosen)
    if why or node.parent is None:
        raise CannotContinue(why or "the prompt has no token to replace")
    before = tree.text_to(node.parent)
    if is_drawn(alternatives, chosen):
        return _origin(target.view, origins.get(target), before + chosen), (position, node.parent.id)
    origin = _origin(target.view, origins.get(target), before)
    return dataclasses.replace(origin, prefix=origin.prefix + chosen, chosen=chosen), (
        position,
        node.parent.id,
    )

"""The n samples of one run as a prefix tree, grown chunk by chunk, without I/O; where samples part.

Each sample is a sequence of units: its tokens where its chunks carry logprobs (each piece of a
chunk's `logprobs` is an engine chunk, a token as engines stream; a piece with no text, a token
that completed no character yet, joins the next piece), otherwise its words (`WORD_UNITS`: runs of
whitespace, runs of word characters, single other characters, so the units are a function of the
text alone and the same for every sample that wrote it). The samples' unit sequences form a prefix
tree; a straight run of units that the same samples took, with none of them ending inside it, is
one node (its edge holds the joined text), so the tree has at most about 2n nodes however long
the samples grow.

Appending a unit costs O(1) (a sample alone on its branch extends its edge; otherwise it steps
into a child, splitting that child's edge after its first unit when it is longer, and a node that
no sample ends at any more takes in its one child when that child holds the same samples). Edges do
not copy text: a node's units are `units[owner][start:end]` of any sample through it, since every
sample through a node has the same units at the same depths.

The same tree says where each sample parts from every other (`parting_points`): at the first unit
no other sample shares.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ui.alternatives_view import first_listed

TOKENS = "token"
WORDS = "word"

WORD_UNITS = re.compile(r"\s+|\w{1,16}|[^\w\s]")
"""A word unit: whitespace, up to 16 word characters, or one other character. Every character is
in exactly one unit; the length cap keeps text without spaces (CJK, a long URL) from being one
unit that would show only when the sample ends."""


@dataclass(eq=False, slots=True)
class Node:
    """A node of the tree and the edge into it: units `start:end` of its samples (the root: none)."""

    id: int
    """Stable while the node exists (a split gives the new head node a new id)."""
    parent: Node | None
    start: int
    end: int
    owner: int
    """A sample through this node, whose unit list holds the edge's units."""
    samples: int
    """The samples through this node, a bit per sample index."""
    ends: int
    """The samples whose units so far end at this node's last unit."""
    children: dict[str, Node] = field(default_factory=dict)
    """Keyed by the child's first unit."""

    @property
    def count(self) -> int:
        """How many samples took this branch."""
        return self.samples.bit_count()

    @property
    def length(self) -> int:
        """Units on the edge into this node."""
        return self.end - self.start


def sample_indices(mask: int) -> list[int]:
    """The sample indices of a bit mask, in order."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class SampleTree:
    """The prefix tree of `n` samples' units, grown by `add` with each chunk's text (and logprob
    pieces) and closed per sample by `finish`."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"n must be 0 or more, got {n}")
        self.n = n
        self.unit: str | None = None
        """TOKENS or WORDS, fixed by the run's first chunk with text; None before."""
        self.units: list[list[str]] = [[] for _ in range(n)]
        """Each sample's units so far (those in the tree)."""
        self.logprobs: list[list[float | None]] = [[] for _ in range(n)]
        """Each unit's summed token logprob, None where the chunk had none."""
        self.alternatives: list[list[list[Any] | None]] = [[] for _ in range(n)]
        """Each unit's first token's alternatives (`ui.alternatives_view.listed`), None where the
        chunk had none."""
        self.offsets: list[list[int]] = [[0] for _ in range(n)]
        """Characters before each unit, and after the last: `offsets[s][d]` starts unit d."""
        self.finished = 0
        """Samples that ended, a bit each."""
        everyone = (1 << n) - 1
        self.root = Node(0, None, 0, 0, owner=-1, samples=everyone, ends=everyone)
        self.node_count = 1
        self._at = [self.root] * n
        self._next_id = 1
        self._pending_text = [""] * n
        """Word mode: the last, maybe unfinished, unit of each sample's text."""
        self._pending_logprobs: list[list[float]] = [[] for _ in range(n)]
        """Token mode: logprobs of tokens whose text has not appeared yet."""
        self._pending_alternatives: list[list[Any] | None] = [None] * n
        """Token mode: the alternatives of the first token whose text has not appeared yet."""

    # Growing

    def add(self, index: int, text: str, pieces: Sequence[Sequence[Any]] | None = None) -> None:
        """Sample `index`'s next chunk: its `text` and, where the run asked for them, its logprob
        pieces (`[text, [logprob, ...]]`, protocol `chunk.logprobs`)."""
        self._check(index)
        if self.unit is None and (text or pieces):
            self.unit = TOKENS if pieces is not None else WORDS
        if self.unit == TOKENS:
            if pieces is None or "".join(str(piece[0]) for piece in pieces) != text:
                pieces = [[text, []]]  # no (or inconsistent) token boundaries: the text as one unit
            pending = self._pending_logprobs[index]
            for piece in pieces:
                piece_text = piece[0]
                if not pending and self._pending_alternatives[index] is None:
                    self._pending_alternatives[index] = first_listed(piece)
                pending.extend(piece[1])
                if piece_text:
                    self._grow(index, piece_text, math.fsum(pending) if pending else None)
                    pending.clear()
        elif self.unit == WORDS:
            found = WORD_UNITS.findall(self._pending_text[index] + text)
            for unit in found[:-1]:
                self._grow(index, unit, None)
            self._pending_text[index] = found[-1] if found else ""

    def finish(self, index: int) -> None:
        """Sample `index` ended: the rest of its text joins the tree. Calling it again does nothing."""
        self._check(index)
        if self.finished >> index & 1:
            return
        rest, self._pending_text[index] = self._pending_text[index], ""
        if rest:
            self._grow(index, rest, None)
        self._pending_logprobs[index].clear()
        self._pending_alternatives[index] = None
        self.finished |= 1 << index

    def _check(self, index: int) -> None:
        if not 0 <= index < self.n:
            raise IndexError(f"sample index {index} is not in 0..{self.n - 1}")

    def _grow(self, s: int, unit: str, logprob: float | None) -> None:
        bit = 1 << s
        node = self._at[s]
        depth = len(self.units[s])
        self.units[s].append(unit)
        self.logprobs[s].append(logprob)
        self.alternatives[s].append(self._pending_alternatives[s])
        self._pending_alternatives[s] = None
        self.offsets[s].append(self.offsets[s][-1] + len(unit))
        if node.samples == bit and node is not self.root:
            node.end += 1  # alone on its branch (so nothing below it): the edge grows
            return
        node.ends &= ~bit
        child = node.children.get(unit)
        if child is None:
            child = Node(self._new_id(), node, depth, depth + 1, owner=s, samples=bit, ends=bit)
            node.children[unit] = child
        else:
            if child.length > 1:  # step into a longer edge: its first unit becomes a node of its own
                head = Node(
                    self._new_id(),
                    node,
                    child.start,
                    child.start + 1,
                    owner=child.owner,
                    samples=child.samples,
                    ends=0,
                )
                child.start += 1
                child.parent = head
                head.children[self.units[child.owner][child.start]] = child
                node.children[unit] = head
                child = head
            child.samples |= bit
            child.ends |= bit
        self._at[s] = child
        self._merge_down(node)

    def _new_id(self) -> int:
        self.node_count += 1
        self._next_id += 1
        return self._next_id - 1

    def _merge_down(self, node: Node) -> None:
        """Take `node`'s only child into it when nothing tells them apart any more (the node keeps
        its id: a page that picked it still has it when samples that were ahead catch up)."""
        if node is self.root or node.ends or len(node.children) != 1:
            return
        (child,) = node.children.values()
        if child.samples != node.samples:
            return
        node.end = child.end
        node.ends = child.ends
        node.children = child.children
        for grandchild in node.children.values():
            grandchild.parent = node
        for s in sample_indices(child.ends):
            self._at[s] = node
        self.node_count -= 1

    # Reading

    def walk(self) -> Iterator[tuple[Node, int]]:
        """Every node with its level (the root 0), depth first; children by how many samples took
        them (most first), then by age."""
        stack = [(self.root, 0)]
        while stack:
            node, level = stack.pop()
            yield node, level
            children = sorted(node.children.values(), key=lambda c: (-c.count, c.id))
            stack.extend((child, level + 1) for child in reversed(children))

    def find(self, node_id: int) -> Node | None:
        """The node with id `node_id`, or None where the tree has none (a node merged into its
        parent, or an id from another run's tree)."""
        return next((node for node, _ in self.walk() if node.id == node_id), None)

    def text_to(self, node: Node) -> str:
        """The text from the root to the end of `node`: what every sample through it wrote up to
        there (the root: nothing)."""
        return "".join(self.units[node.owner][: node.end]) if node is not self.root else ""

    def branch_text(self, text: str) -> str:
        """`text` (a node's text, or a column's up to a point) as a continuation's prefix, ending
        where the model's own tokens can end. A tree of tokens ends at the model's boundaries
        already; in a tree of words a trailing space or tab belongs to the next word's token
        (SmolLM2's tokenizer, as BPE ones do, writes " Baker" as one token), so it is left for the
        model to write (docs/tree.md has what the space handed over does)."""
        return text if self.unit == TOKENS else text.rstrip(" \t")

    def at(self, index: int) -> Node:
        """The node where sample `index`'s units so far end."""
        return self._at[index]

    def edge_text(self, node: Node) -> str:
        """The joined text of the node's edge."""
        return "".join(self.units[node.owner][node.start : node.end]) if node is not self.root else ""

    def edge_chars(self, node: Node) -> int:
        """Characters on the node's edge."""
        if node is self.root:
            return 0
        offsets = self.offsets[node.owner]
        return offsets[node.end] - offsets[node.start]

    def first_alternatives(self, node: Node) -> list[Any] | None:
        """The alternatives of the node's edge's first token (its owner's, where its run listed them;
        the samples that took it had the same text before it); None at the root or without."""
        if node is self.root:
            return None
        return self.alternatives[node.owner][node.start]

    def probability(self, node: Node) -> float | None:
        """The probability of the edge's first unit (its tokens' together): the exponential of its
        logprob, averaged over the samples that took it; None without logprobs or at the root."""
        if node is self.root:
            return None
        values = [self.logprobs[s][node.start] for s in sample_indices(node.samples)]
        known = [v for v in values if v is not None]
        return math.exp(math.fsum(known) / len(known)) if known else None

    def parting_points(self) -> list[int | None]:
        """For each sample, the character offset where it parts from every other sample: the start
        of its first unit that no other sample shares; None while it shares all its units so far,
        and while another sample still running has ended so far on its path and may yet go the same
        way (what it has written of its next word so far begins this one's next unit). A sample
        that ended is parted from where it ended; one sample alone parts from nothing."""
        points: list[int | None] = [None] * self.n
        if self.n < 2:
            return points
        running = ~self.finished
        for s, node in enumerate(self._at):
            bit = 1 << s
            if node.samples != bit:
                continue
            while node.parent is not None and node.parent.samples == bit:
                node = node.parent
            above = node.parent
            while above is not None:
                waiting = above.ends & running & ~bit
                if waiting and self._may_follow(waiting, self.units[s][above.end]):
                    break
                above = above.parent
            if above is None:
                points[s] = self.offsets[s][node.start]
        return points

    def _may_follow(self, samples: int, unit: str) -> bool:
        """Whether any of `samples` may yet write `unit` next: the start of its next unit that it
        has written (nothing, in token mode) begins `unit`."""
        return any(unit.startswith(self._pending_text[t]) for t in sample_indices(samples))

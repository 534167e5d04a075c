"""The vote's bar chart, drawn here as SVG markup and sent to the page whole with each redraw.

`vote_chart_html(rows)` takes `ui.answers.chart_rows`' rows (most votes first) and returns one bar
per answer in that order, the y axis from zero in whole votes, each bar coloured by its `vote` mark
(the majority green, answers tied for the most amber, the rest grey) and a legend of the marks
drawn. Each bar is a `path` with `aria-roledescription="bar"` and an `aria-label` such as
`answer: 42; votes: 3; vote: majority`, and a `title` a pointer shows. With no rows it returns the
empty panel's words. The markup is well-formed XML, so tests read it as a person's tools would.

Why markup rather than Gradio's `gr.BarPlot`: the page replaces this markup atomically, while
BarPlot (Gradio 6.31) redraws through Vega in the browser and loses updates that arrive close
together. Its chart is rebuilt whenever its `sort` changes, and an update that arrives while a
rebuild is in flight is applied to the view being replaced; its colour scale also keeps the marks
of the first data it drew. Samples of a run often finish within a few milliseconds of each other,
and the chart then stayed at an earlier vote (two bars of five) until the next run. Rendering the
Vega-Lite spec on the server (vl-convert) holds the GIL for 40-60 ms a chart on a 2-core EPYC,
stalling the page's event loop; this chart takes well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from math import ceil
from typing import Any

from ui.answers import FEWER, MAJORITY, TIED, cut_answer

VOTE_COLOURS = {MAJORITY: "#16a34a", TIED: "#d97706", FEWER: "#94a3b8"}
"""Each bar's colour by its `vote` mark: green for the majority, amber for a tie, grey for the rest."""

WIDTH = 480
"""The drawing's width in its own units (the page scales it to the panel's width)."""

PLOT_HEIGHT = 170
"""The bars' area's height: a bar with the most votes is about this tall."""

LEFT = 44
"""Room left of the bars for the vote counts and the axis title (more where a turned label needs it)."""

TOP = 10
"""Room above the tallest tick's label."""

LABEL_CHARS = 16
"""An answer is cut to this many characters under its bar (the bar's title has it whole)."""

CHAR_W = 6.2
"""About how wide a character of the 11-unit labels is, to decide whether labels lie flat."""

EMPTY = '<div class="vote-chart-empty">No answers to chart yet.</div>'
"""The panel before a finished sample has an answer."""


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the chart's parts go, in the drawing's units."""

    left: float
    """The bars' area's left edge."""
    slot: float
    """Each answer's width."""
    flat: bool
    """Whether the answers lie flat under their bars (else turned 45 degrees)."""
    height: float
    """The whole drawing's height."""
    axis_top: int
    """The votes at the top of the y axis."""
    step: int
    """The votes between ticks."""

    @property
    def base(self) -> float:
        """The bars' baseline: zero votes."""
        return TOP + PLOT_HEIGHT

    def tall(self, votes: int) -> float:
        """How tall a bar of `votes` is."""
        return votes / self.axis_top * PLOT_HEIGHT


def vote_chart_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The chart of `rows` (`chart_rows`' keys: answer, votes, vote), or `EMPTY` when there are none."""
    if not rows:
        return EMPTY
    labels = [cut_answer(str(row["answer"]), LABEL_CHARS) for row in rows]
    layout = _layout(labels, max(int(row["votes"]) for row in rows))
    parts = _axes(layout)
    for index, (row, label) in enumerate(zip(rows, labels, strict=True)):
        parts.extend(_bar(layout, index, str(row["answer"]), int(row["votes"]), str(row["vote"]), label))
    marks = [mark for mark in VOTE_COLOURS if any(row["vote"] == mark for row in rows)]
    legend = "".join(
        f'<span><i style="background:{VOTE_COLOURS[mark]}"></i>{escape(mark)}</span>' for mark in marks
    )
    return (
        '<div class="vote-chart">'
        f'<svg viewBox="0 0 {WIDTH} {layout.height:.0f}" width="100%" role="graphics-document" '
        f'aria-roledescription="bar chart" aria-label="votes per answer">{"".join(parts)}</svg>'
        f'<div class="vote-legend">{legend}</div></div>'
    )


def _layout(labels: list[str], top_votes: int) -> _Layout:
    """The layout for answers labelled `labels`, the most votes `top_votes`: labels lie flat where
    the longest fits its answer's width, else turn 45 degrees, the left edge moved right as far as
    the first turned label reaches left of its bar."""
    longest = max(len(label) for label in labels)
    left = LEFT
    slot = (WIDTH - left - 8) / len(labels)
    flat = longest * CHAR_W <= slot - 4
    if not flat:
        left = max(LEFT, round(len(labels[0]) * CHAR_W * 0.72 + 4 - slot / 2))
        slot = (WIDTH - left - 8) / len(labels)
    below = 18 if flat else 10 + longest * CHAR_W * 0.72
    step = _tick_step(top_votes)
    axis_top = max(step, ceil(top_votes / step) * step)
    return _Layout(left, slot, flat, TOP + PLOT_HEIGHT + below + 18, axis_top, step)


def _axes(layout: _Layout) -> list[str]:
    """The axes' titles, and a grid line with its count at each tick from zero."""
    middle = TOP + PLOT_HEIGHT / 2
    parts = [
        f'<text class="vote-axis-title" x="12" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {middle:.1f})">votes</text>',
        f'<text class="vote-axis-title" x="{layout.left + (WIDTH - 8 - layout.left) / 2:.1f}" '
        f'y="{layout.height - 4:.1f}" text-anchor="middle">answer</text>',
    ]
    for tick in range(0, layout.axis_top + 1, layout.step):
        y = layout.base - layout.tall(tick)
        parts.append(
            f'<line class="vote-grid" x1="{layout.left}" x2="{WIDTH - 8}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="vote-tick" x="{layout.left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>'
        )
    return parts


def _bar(layout: _Layout, index: int, answer: str, votes: int, mark: str, label: str) -> list[str]:
    """The `index`th answer's bar, with its description and title, and its label under it."""
    centre = layout.left + layout.slot * (index + 0.5)
    width = min(layout.slot * 0.8, 64.0)
    tall = layout.tall(votes)
    base = layout.base
    described = escape(f"answer: {answer}; votes: {votes}; vote: {mark}")
    title = f"{escape(answer)}: {votes} vote{'' if votes == 1 else 's'} ({escape(mark)})"
    bar = (
        f'<path class="vote-bar" role="graphics-symbol" aria-roledescription="bar" aria-label="{described}" '
        f'd="M{centre - width / 2:.1f},{base - tall:.1f}h{width:.1f}v{tall:.1f}h{-width:.1f}Z" '
        f'fill="{VOTE_COLOURS[mark]}"><title>{title}</title></path>'
    )
    if layout.flat:
        place = f'x="{centre:.1f}" y="{base + 14:.1f}" text-anchor="middle"'
    else:
        place = (
            f'x="{centre:.1f}" y="{base + 10:.1f}" text-anchor="end" '
            f'transform="rotate(-45 {centre:.1f} {base + 10:.1f})"'
        )
    return [bar, f'<text class="vote-label" {place}>{escape(label)}</text>']


def _tick_step(top_votes: int) -> int:
    """Whole votes between ticks: 1, 2 or 5 times a power of ten, at most about five ticks."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if top_votes <= 5 * factor * magnitude:
                return factor * magnitude
        magnitude *= 10

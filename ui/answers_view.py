"""The answers panel of one run: each finished sample's final answer and the vote, for the page.

The page's pattern (empty: the last number, see `ui.answers.final_answer`) is compiled once per
run; a pattern that does not compile, or runs out of its time on a sample (answers.PatternClock),
is said in the panel and the vote uses the default. A sample
counts once it finished on its own (`stop` or `length`); a stopped or failed one is listed but does
not vote. Answers are read once per sample, when it finishes, in the order samples finish, so a tie
goes to the answer reached first. The panel is redrawn only when a sample finished since.

The chart (`answers_chart`, drawn by `ui.vote_chart`) has one bar per answer, most votes first, its
axis from zero so an answer with one vote has a bar as tall as one vote; the majority's bar is
green, answers tied for the most votes amber, the rest grey, and a legend names the marks drawn.
Until an answer has a vote the panel says that answers appear as samples finish. Where fewer than
half of the finished samples give a final answer (a story, a poem) the samples are free text: the
panel says so in one line, with what the vote counts, and draws no majority and no chart
(`free_text`); the page shows an example with answers beside that line.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
import regex

from ui.answers import (
    PATTERN_BUDGET_S,
    AnswerPatternError,
    AnswerPatternTimeout,
    PatternClock,
    Vote,
    chart_rows,
    compile_answer_pattern,
    cut_answer,
    final_answer,
    summary_line,
    tally,
)
from ui.early_stop import RULES, Decision, decide
from ui.view import REASON_LABELS, RunView
from ui.vote_chart import EMPTY, vote_chart_html

VOTING_REASONS = ("stop", "length")
"""Samples that finished on their own vote; aborted and failed ones do not."""

ANSWER_CHARS = 24
"""A sample's answer is cut to this many characters in the per-sample list."""


def answers_chart() -> gr.HTML:
    """The vote's bar chart, empty until a finished sample has an answer (`AnswersPanel.outputs`
    fills it with `ui.vote_chart`'s markup, replaced whole at each redraw)."""
    return gr.HTML(EMPTY, elem_id="answers-chart")


class AnswersPanel:
    """Reads the run's finished samples' answers and draws the vote (a bar chart and a line)."""

    def __init__(self, pattern_text: str, stop_rule: str = "") -> None:
        """`stop_rule`: the rule that stops the running samples once the vote is decided
        (`ui.early_stop`), "" for none."""
        self.stop_rule = stop_rule
        self.decision: Decision | None = None
        """The rule's decision, once taken (at most once a run)."""
        self.stopped: list[int] = []
        """The samples it stopped."""
        self.vote: Vote | None = None
        self.problem: str | None = None
        """Why the page's pattern is not used, if it is not."""
        self.pattern: regex.Pattern[str] | None = None
        self.clock = PatternClock()
        """The pattern's time over this run's samples (answers.PATTERN_BUDGET_S)."""
        try:
            self.pattern = compile_answer_pattern(pattern_text or "")
        except AnswerPatternError as exc:
            self.problem = f"{exc}; the vote uses the last number instead"
        self.answers: dict[int, str | None] = {}
        """Each finished sample's answer (None: no answer), in the order they finished."""
        self._shown = -1

    def outputs(self, view: RunView, force: bool = False) -> list[Any]:
        """The chart's and the line's new values, or `gr.skip()` for both when no sample finished
        since the last call (unless `force`)."""
        finished = [s for s in view.samples if s.finished]
        if len(finished) == self._shown and not force:
            return [gr.skip(), gr.skip()]
        self._shown = len(finished)
        for sample in finished:
            if sample.index not in self.answers:
                voting = sample.status in VOTING_REASONS
                self.answers[sample.index] = self._answer(view, sample.index) if voting else None
        voters = [i for i in self.answers if view.samples[i].status in VOTING_REASONS]
        vote = self.vote = tally([self.answers[i] for i in voters])
        prose = free_text(vote)
        if prose:
            chart, lines = "", [free_text_line(vote, self.pattern is not None)]
        else:
            chart, lines = vote_chart_html(chart_rows(vote)), [summary_line(vote, len(finished), view.n)]
        if self.problem:
            lines.append(f"**Answer pattern:** {self.problem}.")
        said = self._stop_words(vote, len(finished) == view.n)
        if said:
            lines.append(said)
        listed = []
        for index, answer in self.answers.items():
            status = view.samples[index].status
            if status in VOTING_REASONS:
                shown = "—" if answer is None else _short(answer)
            elif index in self.stopped:
                shown = "(stopped by the vote, not counted)"
            else:
                shown = f"({REASON_LABELS.get(status, status)}, not counted)"
            listed.append(f"#{index}: {shown}")
        if listed and not prose:
            lines.append(" · ".join(listed))
        return [chart, "\n\n".join(lines)]

    def to_stop(self, view: RunView) -> list[int]:
        """Where the run stops when decided and the vote (as last drawn) is decided now: the samples
        still running, to stop; taken once a run, [] otherwise."""
        if not self.stop_rule or self.decision is not None or self.vote is None or view.finished:
            return []
        running = [sample.index for sample in view.samples if not sample.finished]
        decision = decide(self.vote, len(running), self.stop_rule)
        if decision is None:
            return []
        self.decision, self.stopped = decision, running
        for index in running:
            view.samples[index].stopped_by_vote = True
        return running

    def _stop_words(self, vote: Vote, all_finished: bool) -> str:
        """The line on stopping when decided: the moment and the rule that decided, or why it never
        did ("" where the run does not stop when decided)."""
        if not self.stop_rule:
            return ""
        if self.decision is not None:
            count = len(self.stopped)
            return (
                f"⏹ **Stopped when decided:** {self.decision.words()}; the {count} sample"
                f"{'s' if count != 1 else ''} still running stopped in the engine."
            )
        if all_finished and vote.majority is None:
            return (
                "**Stop when decided:** these samples gave no final answers (the vote counts the last "
                "number, or what the answer pattern finds), so it never decided; every sample ran to "
                "its end. Try the sheep question."
            )
        if all_finished:
            rule = RULES[self.stop_rule]
            return f"**Stop when decided** ({rule}): the vote was not decided before the last sample."
        return f"Stop when decided ({RULES[self.stop_rule]}): not decided yet."

    def _answer(self, view: RunView, index: int) -> str | None:
        """Sample `index`'s answer by the page's pattern; where the pattern runs out of its time,
        the panel says so and every answer so far is read again by the default rule."""
        try:
            return final_answer(view.samples[index].text, self.pattern, self.clock)
        except AnswerPatternTimeout:
            self.problem = (
                f"the pattern took too long on sample #{index} (more than {PATTERN_BUDGET_S} s for "
                "this run's samples); the vote uses the last number instead"
            )
            self.pattern = None
            for i in self.answers:
                if view.samples[i].status in VOTING_REASONS:
                    self.answers[i] = final_answer(view.samples[i].text)
            return final_answer(view.samples[index].text)


FREE_TEXT_CLASS = "free-text"
"""The class of the free-text line's mark: the page shows the example with answers beside it
(`ui.app`'s CSS, `#answers:has(.free-text)`)."""


def free_text(vote: Vote) -> bool:
    """Whether the finished samples are free text: fewer than half of those that finished on their
    own give a final answer, so a vote over them would mean nothing."""
    counted = vote.voters + vote.no_answer
    return counted > 0 and 2 * vote.voters < counted


def free_text_line(vote: Vote, pattern: bool) -> str:
    """The panel's one line for free text: what the vote counts, that there is none here, and where
    to find one (the example button the page shows beside it)."""
    counted = vote.voters + vote.no_answer
    rule = "what the answer pattern matches" if pattern else "the last number"
    return (
        f'<span class="{FREE_TEXT_CLASS}">Free text: {vote.voters} of {counted} finished samples give '
        f"a final answer, so there is no vote. The vote counts each sample's final answer ({rule}); "
        "for a prompt with one, try the sheep question.</span>"
    )


def empty_outputs() -> list[Any]:
    """The panel before a run."""
    return [EMPTY, "Answers appear as samples finish."]


def _short(answer: str) -> str:
    return "`" + cut_answer(answer, ANSWER_CHARS).replace("`", "'") + "`"

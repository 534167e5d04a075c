"""The page in headless Debian chromium, driven by Playwright, as a person would use it."""

from __future__ import annotations

import time

from playwright.sync_api import Browser, Page, expect

from backend.engines.synthetic import synthetic_tokens
from devkit.panels import EXAMPLES as EXAMPLES_PANEL
from devkit.panels import EXPERIMENTS, SETTINGS, WHY_N, open_panel
from tests.support.backends import RunningApp
from tests.support.chromium import require_chromium
from tests.support.vote_chart import bar_label
from ui.answers import compile_answer_pattern, final_answer, tally
from ui.examples import EXAMPLES

require_chromium()


APP_RATE = 15.0
"""Tokens/s per sample of this module's app (the `synthetic_app` fixture)."""


def sample_text(page: Page, index: int) -> str:
    # The text's DOM, not innerText: blocks scrolled out of a column are not rendered
    # (content-visibility), and innerText leaves out what is not rendered.
    return page.locator(f"#sample-{index}").text_content() or ""


def header(page: Page, index: int) -> str:
    return page.locator(f"#header-{index}").inner_text()


def start(page: Page, prompt: str, n: int, max_tokens: int, seed: int | None = None) -> None:
    """Generate `prompt` at n x max tokens (and `seed`, where given; the page's default is random)."""
    if seed is not None:
        open_panel(page, SETTINGS)
        page.locator("#seed input").fill(str(seed))
    page.locator("#prompt textarea").fill(prompt)
    for elem_id, value in (("n", n), ("max-tokens", max_tokens)):
        box = page.locator(f"#{elem_id} input[type=number]")
        box.fill(str(value))
        box.press("Enter")
    page.locator("#generate").click()


def test_generate_then_cancel(page: Page) -> None:
    start(page, "Tell me about lighthouses.", 4, 1000)
    for index in range(4):
        expect(page.locator(f"#sample-{index}")).not_to_have_text("", timeout=15_000)
        expect(page.locator(f"#column-{index}")).to_be_visible()
    expect(page.locator("#column-4")).to_be_hidden()
    expect(page.locator("#status")).to_contain_text("streaming")
    # the loop trace draws live beside the columns: the loop lane and one lane per sample
    expect(page.locator("#trace svg")).to_be_visible(timeout=10_000)
    expect(page.locator("#trace svg")).to_contain_text("#3")
    expect(page.locator("#trace")).to_contain_text("loop busy")
    # the request's prefill as its own bar: handed to the engine until the first chunk
    prefill = page.locator("#trace svg g.trace-prefill")
    expect(prefill).to_contain_text("prefill", timeout=10_000)
    # The live trace's markup is replaced whole at each update: the bar and the lane are measured in
    # one script, so both come from the same drawing (two locator calls can straddle an update and
    # find the first element gone).
    bar, lane = page.wait_for_function(
        """() => {
            const bar = document.querySelector('#trace svg g.trace-prefill rect');
            const lane = document.querySelector('#trace svg');
            if (!bar || !lane) return null;
            const [b, l] = [bar.getBoundingClientRect(), lane.getBoundingClientRect()];
            return [{x: b.x, width: b.width}, {x: l.x, width: l.width}];
        }""",
        timeout=10_000,
    ).json_value()
    assert bar["width"] > 0
    assert lane["x"] <= bar["x"] and bar["x"] + bar["width"] <= lane["x"] + lane["width"]
    # the columns keep growing while streaming
    before = [len(sample_text(page, i)) for i in range(4)]
    page.wait_for_timeout(700)
    assert all(len(sample_text(page, i)) > before[i] for i in range(4))

    page.locator("#cancel").click()
    for index in range(4):
        expect(page.locator(f"#header-{index}")).to_contain_text("stopped", timeout=10_000)
    stopped = [sample_text(page, i) for i in range(4)]
    page.wait_for_timeout(1000)
    assert [sample_text(page, i) for i in range(4)] == stopped
    assert all(0 < len(text) for text in stopped)
    expect(page.locator("#status")).to_contain_text("· cancelled.")
    expect(page.locator("#summary")).to_contain_text("Run summary")
    latency = page.locator("#trace .trace-figures div", has_text="cancel latency").inner_text()
    assert "ms" in latency, latency
    # the synthetic engine reports no prompt-token counts: the span says so rather than showing 0
    expect(prefill).to_contain_text("tokens not reported", timeout=10_000)

    # the trace of the run downloads as Perfetto JSON, in one click
    with page.expect_download(timeout=15_000) as download:
        page.locator("#export-trace").click()
    assert download.value.suggested_filename.endswith(".json")


def test_stop_one_column_only(page: Page) -> None:
    start(page, "Tell me about rivers.", 3, 1000)
    for index in range(3):
        expect(page.locator(f"#sample-{index}")).not_to_have_text("", timeout=15_000)
    expect(page.locator("#column-3")).to_be_hidden()
    page.locator("#stop-1").click()
    expect(page.locator("#header-1")).to_contain_text("stopped", timeout=10_000)
    stopped = sample_text(page, 1)
    others = [len(sample_text(page, i)) for i in (0, 2)]
    time.sleep(1.0)
    assert sample_text(page, 1) == stopped
    assert all(len(sample_text(page, i)) > before for i, before in zip((0, 2), others, strict=True))
    assert "streaming" in header(page, 0) and "streaming" in header(page, 2)
    page.locator("#cancel").click()
    for index in (0, 2):
        expect(page.locator(f"#header-{index}")).to_contain_text("stopped", timeout=10_000)


def test_backend_error_is_shown_in_the_page(page: Page) -> None:
    start(page, "   ", 2, 10)
    expect(page.locator("#status")).to_contain_text("the prompt is empty", timeout=10_000)


def test_the_prompt_format_and_system_prompt_reach_the_backend(page: Page) -> None:
    open_panel(page, SETTINGS)
    system = page.locator("#system textarea")
    system.fill("You answer in one sentence.")
    start(page, "Say hello.", 2, 8)
    expect(page.locator("#status")).to_contain_text("finished", timeout=15_000)
    expect(page.locator("#status")).to_contain_text("Prompt format chat: as asked, with the system prompt")
    page.locator("#format label", has_text="raw").click()
    expect(system).to_be_disabled()  # a system prompt belongs to the chat format
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text(
        "Prompt format raw: plain completion, as asked", timeout=15_000
    )


def test_on_a_phone_wide_screen_each_sample_of_the_summary_is_a_labelled_line(
    browser: Browser, synthetic_app: RunningApp
) -> None:
    """390 px wide: the run summary's headers give way to labels on each figure, and every figure of
    every sample is inside the screen's width, none scrolled out of sight."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.goto(synthetic_app.url)
        expect(page.locator("#generate")).to_be_visible(timeout=30_000)
        start(page, "Tell me about lighthouses.", 4, 24)
        expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
        table = page.locator("#summary table")
        expect(table.locator("td").first).to_be_visible()
        expect(table.locator("th").first).to_be_hidden()
        cells = table.locator("td").evaluate_all(
            "tds => tds.map(td => [td.getBoundingClientRect().left, td.getBoundingClientRect().right,"
            " getComputedStyle(td, '::before').content])"
        )
        assert len(cells) == 4 * 9
        assert all(0 <= left and right <= 390 for left, right, _ in cells), cells
        assert [label for _, _, label in cells[:9]] == [
            '"#"',
            "none",
            '"tok "',
            '"TTFT "',
            '"TPOT "',
            '"ITL p50 "',
            '"p99 "',
            '"tok/s "',
            '"seed "',
        ]
        assert table.evaluate("t => t.scrollWidth <= t.clientWidth")
    finally:
        page.close()


def test_token_confidence_parting_points_and_the_answer_vote(page: Page) -> None:
    open_panel(page, WHY_N)
    page.locator("#logprobs input[type=checkbox]").check()
    page.locator("#answer-pattern textarea").fill(r"(\w+)\.")
    start(page, "Tell me about lighthouses.", 4, 30)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    # Each token is coloured by its probability, the value on hover; the header sums it up.
    tokens = page.locator("#sample-0 .tok")
    expect(tokens.first).to_be_visible()
    assert tokens.count() >= 10
    assert tokens.first.get_attribute("title").startswith("p = 0.0")  # the synthetic words are unlikely
    assert "hsla(" in (tokens.first.get_attribute("style") or "") or "rgba(" in (
        tokens.first.get_attribute("style") or ""
    )
    expect(page.locator("#header-0")).to_contain_text("mean logprob")
    expect(page.locator("#header-0")).to_contain_text("perplexity")
    # Four seeds, four texts: each column marks where it parts from the others, and the marker adds
    # nothing to the text a person reads or copies.
    for index in range(4):
        expect(page.locator(f"#sample-{index} .parting")).to_have_count(1)
        text = sample_text(page, index)
        pieces = page.locator(f"#sample-{index}").evaluate(
            "e => [...e.querySelectorAll('.tok')].map(span => span.textContent).join('')"
        )
        assert len(text.split()) > 5 and text == pieces  # every character is a coloured token's, nothing more
    # The vote: a line that names the majority (or the tie) and a bar chart of the answers.
    line = page.locator("#answers-line")
    expect(line).to_contain_text("of 4 samples finished")
    assert "majority:" in line.inner_text() or "tie between" in line.inner_text()
    expect(page.locator("#answers-chart")).to_be_visible()
    expect(page.locator("#answers-chart path[aria-roledescription=bar]").first).to_be_visible(timeout=10_000)


TREE_NODES = "#sample-tree button.tree-node"
BRANCHES = "#sample-tree .sample-tree > ul > li > ul > li > button.tree-node"
"""The tree's nodes, and the root's branches (the nodes one level under it)."""


def test_the_token_tree_grows_counts_its_branches_and_marks_the_columns_of_a_node(page: Page) -> None:
    # Temperature 0: four samples write the same tokens, one branch all four take.
    open_panel(page, WHY_N)
    page.locator("#logprobs input[type=checkbox]").check()
    open_panel(page, SETTINGS)
    temperature = page.locator("#temperature input[type=number]")
    temperature.fill("0")
    temperature.press("Enter")
    # 2000 tokens: a synthetic sample may stop only after 800 (53 s at APP_RATE), so the Cancel at
    # the end still finds all four running on busy cores (at 400 the greedy text stopped at 268)
    start(page, "Tell me about lighthouses.", 4, 2000)
    branch = page.locator(BRANCHES).first
    expect(branch.locator(".tree-count")).to_have_text("4", timeout=15_000)
    expect(branch.locator(".tree-p")).to_contain_text("p 0.")  # the first token's probability
    expect(branch.locator(".tree-size")).to_contain_text("tok")
    # It grows as chunks arrive: the branch's tokens now, and again later.
    tokens = int(branch.locator(".tree-size").inner_text().split()[0])
    page.wait_for_function(
        "([branch, before]) => parseInt(document.querySelector(branch + ' .tree-size').textContent) > before",
        arg=[BRANCHES, tokens],
        timeout=10_000,
    )
    # Stop sample 0: it ends where it is, the other three go on past it, and the tree has a node more.
    nodes = page.locator(TREE_NODES).count()
    page.locator("#stop-0").click()
    page.wait_for_function(
        "([selector, before]) => document.querySelectorAll(selector).length > before",
        arg=[TREE_NODES, nodes],
        timeout=10_000,
    )
    expect(page.locator(TREE_NODES, has_text="1 ended")).to_have_count(1, timeout=10_000)
    counts = [int(text) for text in page.locator(BRANCHES + " > .tree-count").all_inner_texts()]
    assert sum(counts) == 4, counts  # every sample took one of the root's branches
    # Click the node the three running samples took: their columns are marked, sample 0's is not.
    node_id = (
        page.locator(TREE_NODES)
        .filter(has=page.locator(".tree-count", has_text="3"))
        .first.get_attribute("data-id")
    )
    three = page.locator(f"#sample-tree button.tree-node[data-id='{node_id}']")
    # (on its count: the rest of the button changes width as its text grows, which Playwright's
    # wait for a still target would sit out until the run ends)
    three.locator(".tree-count").click()
    expect(three).to_have_attribute("aria-pressed", "true")
    for index in (1, 2, 3):
        expect(page.locator(f"#column-{index}")).to_have_attribute("data-picked", "")
    expect(page.locator("#column-0")).not_to_have_attribute("data-picked", "")
    styles = [
        page.locator(f"#column-{index}").evaluate(
            "e => [getComputedStyle(e).opacity, getComputedStyle(e).borderTopColor]"
        )
        for index in range(2)
    ]
    assert float(styles[0][0]) < 0.6 and styles[1][0] == "1", styles  # the others faded
    assert styles[1][1] == "rgb(124, 58, 237)" != styles[0][1], styles  # the picked outlined
    # A second click clears the mark.
    three.locator(".tree-count").click()
    expect(page.locator("#column-1")).not_to_have_attribute("data-picked", "")
    page.locator("#cancel").click()
    expect(page.locator("#header-1")).to_contain_text("stopped", timeout=15_000)


def test_cumulative_outputs_show_in_the_read_lane_and_the_task_tree_is_drawn(page: Page) -> None:
    open_panel(page, EXPERIMENTS)
    page.locator("#output-kind label", has_text="cumulative").click()
    start(page, "Tell me about rivers.", 2, 120)
    expect(page.locator("#trace")).to_contain_text("Tasks: who awaits what", timeout=15_000)
    expect(page.locator("#trace pre")).to_contain_text("(T) consume")
    expect(page.locator("#status")).to_contain_text("finished", timeout=60_000)
    figure = page.locator("#trace .trace-figures div", has_text="read per output").inner_text()
    size = int(figure.rsplit("\n", 1)[-1].split()[0].replace(",", "")) if "\n" in figure else 0
    assert size > 300, figure  # the whole text so far, not a word
    assert len(sample_text(page, 0).split()) > 20


def test_the_vote_chart_draws_every_answer_from_zero_most_votes_first(page: Page) -> None:
    """Eight samples whose answers (the first letter of the last word of their last full sentence)
    are the engine's own: three, two and three single votes. Each answer's bar is drawn, as tall as
    its votes, most votes first, the majority's bar in its own colour and named in the legend. The
    eight finish within milliseconds of each other, so the chart is redrawn in quick succession;
    a second run on the same page (eight answers, one vote each: all tied) then replaces it."""
    pattern = r"(\w)\w*\."
    compiled = compile_answer_pattern(pattern)
    expected = tally(
        [final_answer("".join(synthetic_tokens(15 + i, 12, 0.8)[0]), compiled) for i in range(8)]
    ).counts
    assert [votes for _, votes in expected] == [3, 2, 1, 1, 1]  # some answers have one vote
    open_panel(page, WHY_N)
    page.locator("#answer-pattern textarea").fill(pattern)
    open_panel(page, SETTINGS)
    page.locator("#seed input").fill("15")
    start(page, "Tell me about sheep.", 8, 12)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    expect(page.locator("#answers-line")).to_contain_text(f"majority: {expected[0][0]} (3 of 8 answers")
    bars = page.locator("#answers-chart path[aria-roledescription=bar]")
    expect(bars).to_have_count(len(expected))
    drawn = bars.evaluate_all(
        """paths => paths.map(p => {
            const box = p.getBoundingClientRect();
            return {label: p.getAttribute('aria-label'), fill: p.getAttribute('fill'),
                    left: box.left, height: box.height};
        })"""
    )
    drawn.sort(key=lambda bar: bar["left"])  # as a person reads the chart, left to right
    shown = [bar_label(bar["label"]) for bar in drawn]
    bars_read = [(s["answer"], int(s["votes"])) for s in shown]
    assert sorted(bars_read) == sorted(expected)  # every answer, each with its votes
    assert [votes for _, votes in bars_read] == [3, 2, 1, 1, 1]  # most first (ties: first reached)
    assert [s["vote"] for s in shown] == ["majority"] + ["fewer votes"] * 4
    heights = [bar["height"] for bar in drawn]
    assert all(height > 10 for height in heights), heights
    one_vote = heights[-1]
    for (_, votes), height in zip(expected, heights, strict=True):
        assert abs(height - votes * one_vote) < 2, heights  # the axis starts at zero
    fills = [bar["fill"] for bar in drawn]
    assert fills[0] != fills[1] and len(set(fills[1:])) == 1  # the majority stands out
    legend = page.locator("#answers-chart .vote-legend")
    expect(legend).to_have_text("majorityfewer votes")
    inside = page.evaluate(
        """() => {
            const chart = document.querySelector('#answers-chart').getBoundingClientRect();
            const legend = document.querySelector('#answers-chart .vote-legend').getBoundingClientRect();
            return legend.height > 0 && legend.top >= chart.top && legend.bottom <= chart.bottom;
        }"""
    )
    assert inside, "the legend is drawn outside the chart's box, where it is cut off"
    # The next run's vote replaces this one's, bars, colours and legend.
    again = tally(
        [final_answer("".join(synthetic_tokens(40 + i, 12, 0.8)[0]), compiled) for i in range(8)]
    ).counts
    assert [votes for _, votes in again] == [1] * 8
    page.locator("#seed input").fill("40")
    start(page, "Tell me about sheep.", 8, 12)
    expect(page.locator("#answers-line")).to_contain_text(
        "tie between 8 answers (1 each) · 8 of 8", timeout=30_000
    )
    expect(bars).to_have_count(8)
    labels = [
        bar_label(label)
        for label in bars.evaluate_all("paths => paths.map(p => p.getAttribute('aria-label'))")
    ]
    assert sorted((s["answer"], int(s["votes"])) for s in labels) == sorted(again)
    assert {s["vote"] for s in labels} == {"tied for most"}
    assert len(set(bars.evaluate_all("paths => paths.map(p => p.getAttribute('fill'))"))) == 1
    expect(legend).to_have_text("tied for most")


def test_the_vote_chart_is_empty_until_an_answer_and_draws_without_errors(
    browser: Browser, synthetic_app: RunningApp
) -> None:
    """Before any run the answers panel says answers appear as samples finish, with no axes drawn
    around no data, and the page logs no error. A run then draws the vote's bars, still without an
    error."""
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    try:
        tab.goto(synthetic_app.url)
        expect(tab.locator("#generate")).to_be_visible(timeout=30_000)
        open_panel(tab, WHY_N)
        expect(tab.locator("#answers-chart")).to_be_visible()
        expect(tab.locator("#answers-chart .vote-chart-empty")).to_contain_text("No answers to chart yet")
        expect(tab.locator("#answers-chart svg")).to_have_count(0)
        tab.wait_for_timeout(1_000)  # time for any error the page would log
        assert problems == []
        tab.locator("#answer-pattern textarea").fill(r"(\w)\w*\.")  # the synthetic text has no numbers
        start(tab, "Tell me about sheep.", 4, 12)
        expect(tab.locator("#status")).to_contain_text("finished", timeout=30_000)
        bars = tab.locator("#answers-chart path[aria-roledescription=bar]")
        expect(bars.first).to_be_visible(timeout=10_000)
        expect(tab.locator("#answers-chart .vote-chart-empty")).to_have_count(0)
        assert problems == []
    finally:
        tab.close()


def test_an_example_sets_the_prompt_and_settings_says_its_lesson_and_runs(page: Page) -> None:
    examples = {example.label.split(":")[0]: example for example in EXAMPLES}
    blocking = examples["Blocking the loop"]
    open_panel(page, EXAMPLES_PANEL)
    page.locator("#examples").get_by_text(blocking.label).click()
    # the first click's event waits for a loaded machine's Gradio queue: more than the default 5 s
    expect(page.locator("#example-lesson textarea")).to_have_value(blocking.lesson, timeout=20_000)
    expect(page.locator("#prompt textarea")).to_have_value(blocking.prompt)
    open_panel(page, EXPERIMENTS)
    expect(page.locator("#consumer input[value=blocking]")).to_be_checked()
    expect(page.locator("#block-ms input[type=number]")).to_have_value("30")

    confidence = examples["Token confidence"]
    page.locator("#examples").get_by_text(confidence.label).click()
    expect(page.locator("#example-lesson textarea")).to_have_value(confidence.lesson)
    expect(page.locator("#prompt textarea")).to_have_value(confidence.prompt)
    expect(page.locator("#consumer input[value=cooperative]")).to_be_checked()
    for elem_id, value in (("n", confidence.n), ("max-tokens", confidence.max_tokens)):
        expect(page.locator(f"#{elem_id} input[type=number]")).to_have_value(str(value))
    open_panel(page, SETTINGS)
    expect(page.locator("#temperature input[type=number]")).to_have_value(f"{confidence.temperature:g}")
    expect(page.locator(f"#format input[value={confidence.format}]")).to_be_checked()
    open_panel(page, WHY_N)
    expect(page.locator("#logprobs input[type=checkbox]")).to_be_checked()
    expect(page.locator("#answer-pattern textarea")).to_have_value(confidence.answer_pattern)

    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    for index in range(confidence.n):
        assert page.locator(f"#sample-{index} .tok").count() > 1  # coloured tokens: logprobs were asked
        assert len(sample_text(page, index).split()) > 1
    expect(page.locator("#column-8")).to_be_hidden()
    # The synthetic engine's words name no colour: free text, said so with what the vote counts.
    expect(page.locator("#answers-line")).to_contain_text(f"Free text: 0 of {confidence.n} finished samples")
    expect(page.locator("#answers-line")).to_contain_text("what the answer pattern matches")


def test_a_branch_of_the_tree_is_continued_as_a_new_run_of_n_samples(page: Page) -> None:
    """Generate, click a branch of the finished run's tree, Continue from here: n new columns start
    from that branch's text (shown above each), a new run with its own tree."""
    start(page, "Tell me about lighthouses.", 3, 12, seed=33)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    first_run = page.locator("#status code").first.inner_text()
    # Seeds 33-35 part at once: each branch of the root is one sample's whole text.
    branch = page.locator(BRANCHES).first
    samples = branch.get_attribute("data-samples").split(",")
    assert len(samples) == 1, samples
    branch_text = sample_text(page, int(samples[0]))
    assert 0 < len(branch_text) < 160, branch_text  # shown whole above the new columns
    expect(page.locator("#tree-continue")).to_have_count(0)  # nothing picked, nothing to continue
    branch.click()
    page.locator("#tree-continue").click()
    expect(page.locator("#status")).to_contain_text("Continuing from a branch", timeout=15_000)
    expect(page.locator("#status code").first).not_to_have_text(first_run)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    for index in range(3):
        expect(page.locator(f"#prefix-{index}")).to_have_text(branch_text)
        assert len(sample_text(page, index)) > 0  # each column's own text, after the prefix
    expect(page.locator("#column-3")).to_be_hidden()
    # The new run's tree: every sample in it, the root's branches adding up to n.
    counts = [int(c) for c in page.locator(BRANCHES + " > .tree-count").all_inner_texts()]
    assert sum(counts) == 3, counts


def test_a_column_is_continued_from_the_token_or_word_clicked(page: Page) -> None:
    """With token confidence on, a click on a finished column's third token offers Continue from
    here: the new run goes on from the column's text up to the end of that token. Without it, from
    the end of the word clicked."""
    open_panel(page, WHY_N)
    page.locator("#logprobs input[type=checkbox]").check()
    # Seed 5: both samples run to max_tokens (a random seed may end one after 4 tokens).
    start(page, "Tell me about lighthouses.", 2, 12, seed=5)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    tokens = page.locator("#sample-1 .tok").all_text_contents()
    assert len(tokens) > 4, tokens
    page.locator("#sample-1 .tok").nth(2).click()
    page.locator("#column-continue").click()
    expect(page.locator("#status")).to_contain_text("Continuing from a branch", timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    expect(page.locator("#prefix-0")).to_have_text("".join(tokens[:3]))
    # Words: token confidence off, a click in the middle of the second word of column 0.
    page.locator("#logprobs input[type=checkbox]").uncheck()
    page.locator("#generate").click()
    expect(page.locator("#status")).not_to_contain_text("Continuing", timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    text = sample_text(page, 0)
    words = text.split(" ")
    box = page.evaluate(
        """() => {
            const column = document.querySelector('#sample-0');
            const walker = document.createTreeWalker(column, NodeFilter.SHOW_TEXT);
            let node = walker.nextNode();
            while (node && !node.data.includes(' ')) node = walker.nextNode();
            const range = document.createRange();
            const start = node.data.indexOf(' ') + 2;
            range.setStart(node, start);
            range.setEnd(node, start + 1);
            const r = range.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        }"""
    )
    page.mouse.click(*box)
    page.locator("#column-continue").click()
    expect(page.locator("#status")).to_contain_text("Continuing from a branch", timeout=15_000)
    expect(page.locator("#prefix-0")).to_have_text(" ".join(words[:2]))

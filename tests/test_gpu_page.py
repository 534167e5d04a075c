"""What a person sees on the page of a GPU machine where SGLang cannot run: app.py itself, with a
stand-in `nvidia-smi` on PATH (a T4 with an old driver) and this machine's CPU torch and no SGLang,
as a GPU machine that ran `pip install -r requirements.txt` instead of the GPU install would be.
`--engine auto` serves the CPU model and the engine line says why, in headless chromium."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from playwright.sync_api import Browser, expect

from devkit.local import free_port, start_logged, stop_process_group
from tests.support.chromium import require_chromium
from tests.support.gpu_machine import executable

require_chromium()


def test_a_gpu_sglang_cannot_use_is_said_on_the_page(browser: Browser, tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    executable(fake_bin / "nvidia-smi", "echo 'Tesla T4, 535.104.05, 7.5, 15360, 14910'")
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{fake_bin}:{os.environ['PATH']}",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "DASHBOARD_ENGINE": "auto",
    }
    env.pop("DASHBOARD_ASSUME_CUDA", None)
    command = [sys.executable, "app.py", "--port", str(port), "--backend-port", str(free_port())]
    process = start_logged(command, tmp_path / "app.log", f"http://127.0.0.1:{port}/", env)
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        line = page.locator("#engine-info")
        expect(line).to_contain_text(
            "this machine has an NVIDIA GPU, but SGLang cannot use it, so the CPU model serves",
            timeout=60_000,
        )
        expect(line).to_contain_text("NVIDIA driver: the driver is 535.104.05")
        expect(line).to_contain_text("torch: torch ")
        expect(line).to_contain_text("is a CPU build and cannot use the GPU")
        expect(line).to_contain_text("SGLang: it is not installed")
        expect(line).to_contain_text("pip install -r requirements-gpu.txt")
        page.close()
    finally:
        stop_process_group(process)
    log = (tmp_path / "app.log").read_text(errors="replace")
    assert "GPU preflight: NVIDIA driver: the driver is 535.104.05" in log  # said in the log too

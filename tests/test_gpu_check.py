"""The GPU check scripts on this machine, which has no GPU: what each says, and how fast it gives up.

`scripts/gpu-device-check.sh` (a bare GPU machine: nothing installed, no package index) must say in
one line that there is no GPU here; on a stand-in GPU (a fake `nvidia-smi` on PATH) it must run
every section and say what fails. `scripts/gpu-check.sh` (a GPU machine with SGLang) must, where
test tools are missing and no package index answers, say so in one line within 10 s, with its
whole log written where the user reads it and under `$OUT`. The stand-in GPU machine that passes
the preflight: a fake `nvidia-smi` and `nvcc` on PATH, a stand-in `torch` package built for CUDA 13,
and SGLang 0.5.23's metadata, on the PYTHONPATH of a fresh environment without the test tools.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.local import ROOT
from tests.support.gpu_machine import L4, executable

DEVICE_CHECK = ROOT / "scripts" / "gpu-device-check.sh"
GPU_CHECK = ROOT / "scripts" / "gpu-check.sh"

no_gpu_here = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None or bool(glob.glob("/dev/nvidia[0-9]*")),
    reason="this machine has an NVIDIA GPU: the no-GPU paths are not what it runs",
)

SMI_TABLE = "| NVIDIA-SMI 580.82.07   Driver Version: 580.82.07   CUDA Version: 13.0 |"
SMI = f"""if [ "$#" -eq 0 ]; then echo '{SMI_TABLE}'; exit 0; fi
echo '{L4}'"""
"""A fake nvidia-smi: its table without arguments, the CSV of one L4 for the preflight's query."""

TORCH_STAND_IN = '''"""Stands in for a CUDA 13 build of torch for the GPU preflight's child (tests only)."""
__version__ = "2.14.1+cu130"


class version:
    cuda = "13.0"


class cuda:
    @staticmethod
    def init():
        return None

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def is_available():
        return True
'''


def stand_in_gpu(folder: Path, sglang: bool) -> dict[str, str]:
    """A fake nvidia-smi and nvcc on PATH and, where `sglang`, a CUDA torch stand-in and SGLang's
    metadata on PYTHONPATH: the environment of a GPU machine the preflight passes."""
    bin_dir = folder / "bin"
    executable(bin_dir / "nvidia-smi", SMI)
    executable(folder / "cuda" / "bin" / "nvcc", "echo 'Cuda compilation tools, release 13.0, V13.0.88'")
    (bin_dir / "nvcc").symlink_to(folder / "cuda" / "bin" / "nvcc")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    if sglang:
        site = folder / "site"
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text(TORCH_STAND_IN)
        meta = site / "sglang-0.5.23.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\nRequires-Dist: cuda-python>=13.0\n"
        )
        env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    return env


@no_gpu_here
def test_the_device_check_says_in_one_line_that_there_is_no_gpu() -> None:
    done = subprocess.run(
        [str(DEVICE_CHECK), sys.executable], capture_output=True, text=True, timeout=60, check=False
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, lines)
    assert "no NVIDIA GPU here" in lines[0] and "nothing to check" in lines[0], lines


@no_gpu_here
def test_the_device_check_on_a_stand_in_gpu_runs_every_section_and_says_what_fails(tmp_path: Path) -> None:
    """nvidia-smi, the preflight (this environment's torch is a CPU build: missing besides SGLang),
    the toolchain, and a kernel check that says torch sees no CUDA device; the log under $OUT."""
    env = stand_in_gpu(tmp_path, sglang=False) | {"OUT": str(tmp_path / "out")}
    started = time.monotonic()
    done = subprocess.run(
        [str(DEVICE_CHECK), sys.executable], capture_output=True, text=True, timeout=170, env=env, check=False
    )
    took = time.monotonic() - started
    said = done.stdout
    assert done.returncode == 1, said + done.stderr
    for section in ("=== nvidia-smi", "=== GPU preflight", "=== toolchain", "=== a CUDA kernel"):
        assert section in said, said
    assert "Driver Version: 580.82.07" in said, said
    assert "preflight: missing besides SGLang:" in said and "MISSING  torch" in said, said
    assert "nvcc: Cuda compilation tools, release 13.0" in said, said
    assert "kernel check: torch sees no CUDA device" in said, said
    assert said.rstrip().splitlines()[-1].startswith("=== gpu-device-check: FAILED"), said
    assert (tmp_path / "out" / "gpu-device-check.log").read_text() == said
    assert took < 180, took


@pytest.fixture
def silent_index() -> Iterator[str]:
    """A package index that accepts connections and never answers (a firewall that drops them
    answers no better): its URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/simple/"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        server.close()


@no_gpu_here
def test_gpu_check_without_a_package_index_says_so_in_one_line_within_10_s(
    tmp_path: Path, silent_index: str
) -> None:
    """A GPU machine SGLang can use (stand-ins) whose environment lacks the test tools, and whose
    only package index never answers: one line says so within 10 s of the preflight, exit status
    3, and the whole log is where the script said, and under $OUT."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=120)
    env = stand_in_gpu(tmp_path, sglang=True)
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": silent_index,
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_NO_INPUT": "1",
        "GPU_CHECK_LOG": str(tmp_path / "logs" / "gpu-check.log"),
        "OUT": str(tmp_path / "out"),
        "DASHBOARD_CACHE": str(tmp_path / "cache"),
    }
    process = subprocess.Popen(
        [str(GPU_CHECK), str(bare / "bin" / "python")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    lines: list[str] = []
    stamps: dict[str, float] = {}
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("=== test tools"):
            stamps["asked"] = time.monotonic()
        if "no package index answers" in line:
            stamps["said"] = time.monotonic()
    process.wait(timeout=60)
    said = "\n".join(lines)
    assert process.returncode == 3, said
    assert "SGLang can use this GPU" in said, said  # the stand-in machine passed the preflight
    (line,) = [line for line in lines if "no package index answers" in line]
    assert line.startswith("gpu-check: ") and "within 10 s, no retries" in line, line
    assert "pytest" in line and "scripts/gpu-device-check.sh" in line, line
    assert stamps["said"] - stamps["asked"] < 10.5, stamps
    assert "Retrying" not in said, said
    logged = (tmp_path / "logs" / "gpu-check.log").read_text()
    assert logged.strip() == said.strip()
    assert (tmp_path / "out" / "gpu-check.log").read_text() == logged

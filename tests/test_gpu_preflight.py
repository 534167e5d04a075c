"""The GPU preflight on stand-in machines: each missing or wrong part gives its message, on the page
and in the log; a GPU that SGLang cannot use never makes `--engine auto` serve the CPU model
silently; the settings each GPU gets (fp16 below compute capability 8.0), in the arguments built."""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from backend.engines import ENGINES, EngineOptions
from backend.engines.auto import auto_engine
from backend.engines.gpu_preflight import (
    PINNED_SGLANG,
    Gpu,
    GpuFacts,
    check,
    cuda_required_by_sglang,
    needs_fp16,
    parse_smi_csv,
)
from backend.engines.gpu_probe import probe, run_command, sglang_facts, torch_facts
from backend.engines.http.sglang import SGLangEngine
from backend.engines.sglang_inprocess import SGLangInProcessEngine
from backend.engines.sglang_model import SGLangModel
from tests.support.backends import serving
from tests.support.gpu_machine import L4, T4, GpuMachine, executable
from ui.engine_info import engine_line_now

SGLANG_0_5_23_CUDA_PINS = [
    "cuda-python>=13.0",
    "flashinfer_python[cu13]==0.7.2",
    "humming-kernels[cu13]==0.1.12",
    "nvidia-cutlass-dsl[cu13]==4.8.0",
    "nvshmem4py-cu13",
    "torch==2.14.1",
    "sglang-kernel==0.4.10",
]
"""Requirement lines of SGLang 0.5.23's wheel (its METADATA), those that name CUDA and two that do not."""


MACHINE_ROOT = "<machine>"
"""Stands for the stand-in machine's folder in the expected messages."""


def test_a_machine_without_an_nvidia_device_has_nothing_to_check(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    facts = probe(dev_dir=tmp_path / "dev", which=lambda name: None)
    assert not facts.has_device and check(facts).ready and not check(facts).findings


def test_a_machine_with_everything_passes(tmp_path: Path) -> None:
    facts = GpuMachine(tmp_path / "m").facts()
    assert facts.driver_version == "580.82.07" and facts.gpus[0].compute_capability == (8, 9)
    assert facts.nvcc_found and facts.nvcc_version == "13.0" and facts.cuda_home_source == "nvcc on PATH"
    assert facts.cuda_needed == 13 and facts.cxx is not None
    report = check(facts)
    assert report.ready and not report.findings, report.summary()


@pytest.mark.parametrize(
    ("machine", "said"),
    [
        (
            {"smi_lines": ["NVIDIA A10G, 535.104.05, 8.6, 23028, 22000"]},
            "NVIDIA driver: the driver is 535.104.05, and torch 2.14.1 (CUDA 13.0) needs CUDA 13, which "
            "needs driver 580 or newer; update the NVIDIA driver to 580 or newer",
        ),
        ({"smi_fails": True}, "NVIDIA driver: nvidia-smi failed: exit status 9: NVIDIA-SMI has failed"),
        ({"smi_lines": None}, "nvidia-smi is not on PATH, so the driver's version cannot be read"),
        (
            {"nvcc_release": None},
            "usr-local-cuda/bin/nvcc (found through "
            f"{MACHINE_ROOT}/usr-local-cuda, with CUDA_HOME unset and no nvcc on PATH), which does not exist",
        ),
        ({"cuda_home": "/opt/no-cuda"}, "with /opt/no-cuda/bin/nvcc (found through CUDA_HOME=/opt/no-cuda)"),
        ({"nvcc_release": "12.4"}, "is CUDA 12.4, and torch 2.14.1 (CUDA 13.0) is built for CUDA 13"),
        ({"cxx": False}, "C++ compiler: SGLang's and FlashInfer's kernel builds need a host C++ compiler"),
        ({"glibc": (2, 31)}, "glibc: this system has glibc 2.31, and SGLang's wheel is manylinux_2_34"),
        (
            {"smi_lines": ["NVIDIA L4, 580.82.07, 8.9, 23034, 900"]},
            "GPU 0 (NVIDIA L4): 900 MiB of its 23034 MiB are free, under the 2048 MiB",
        ),
        (
            {"smi_lines": ["Tesla V100-SXM2-16GB, 580.82.07, 7.0, 16384, 16000"]},
            "GPU 0 (Tesla V100-SXM2-16GB): its compute capability is 7.0, and CUDA 13",
        ),
        (
            {"torch": {"torch_version": "2.13.0", "torch_cuda": None, "torch_cuda_error": None}},
            "torch: torch 2.13.0 is a CPU build and cannot use the GPU; install the GPU requirements",
        ),
        (
            {
                "torch": {
                    "torch_version": "2.14.1",
                    "torch_cuda": "13.0",
                    "torch_cuda_error": "no kernel image",
                }
            },
            "torch: torch 2.14.1 (CUDA 13.0) cannot use the GPU: no kernel image",
        ),
        ({"sglang_version": None}, "SGLang: it is not installed, so the GPU path has no engine"),
    ],
)
def test_each_missing_part_gives_its_message(tmp_path: Path, machine: dict[str, Any], said: str) -> None:
    report = check(GpuMachine(tmp_path / "m", **machine).facts())
    assert len(report.findings) == 1, report.summary()
    assert said.replace(MACHINE_ROOT, str(tmp_path / "m")) in report.summary(), report.summary()
    nonblocking = ({"smi_lines": None},)
    assert report.ready == (machine in nonblocking), report.summary()


def test_a_busy_gpu_and_a_missing_nvidia_smi_are_said_without_stopping_sglang(tmp_path: Path) -> None:
    report = check(GpuMachine(tmp_path / "m", smi_lines=["NVIDIA L4, 580.82.07, 8.9, 23034, 12000"]).facts())
    assert report.ready and "other processes hold 11034 MiB of its 23034 MiB" in report.summary()


def test_every_part_missing_at_once_is_said_numbered(tmp_path: Path) -> None:
    machine = GpuMachine(tmp_path / "m", nvcc_release=None, cxx=False, glibc=(2, 31))
    summary = check(machine.facts()).summary()
    assert summary.startswith("(1) nvcc: ") and "(2) C++ compiler: " in summary and "(3) glibc: " in summary


def test_nvidia_smi_output_is_read_or_refused_plainly() -> None:
    driver, gpus = parse_smi_csv(f"{T4}\n{L4}\n")
    assert driver == "580.82.07" and gpus == (
        Gpu("Tesla T4", (7, 5), 15360, 14910),
        Gpu("NVIDIA L4", (8, 9), 23034, 22560),
    )
    with pytest.raises(ValueError, match="not name, driver, capability"):
        parse_smi_csv("Tesla T4, 580.82.07, [N/A], 15360, 14910")


def test_sglang_0_5_23s_requirements_say_cuda_13() -> None:
    assert cuda_required_by_sglang(SGLANG_0_5_23_CUDA_PINS) == 13
    assert cuda_required_by_sglang(["torch==2.9.1", "flashinfer_python==0.4.1"]) is None


def test_the_real_probes_read_this_cpu_machines_torch_and_sglang() -> None:
    """The torch probe's child on this machine: its CPU torch, said as a CPU build; SGLang is not
    installed in the dashboard's environment."""
    found = torch_facts(run_command, sys.executable)
    import torch

    assert found == {
        "torch_version": torch.__version__.split("+")[0],
        "torch_cuda": None,
        "torch_cuda_error": None,
    }
    assert sglang_facts() == {"sglang_version": None}


def test_fp16_below_compute_capability_8() -> None:
    assert needs_fp16(GpuFacts(gpus=(Gpu("Tesla T4", (7, 5), 15360, 15000),)))
    assert not needs_fp16(GpuFacts(gpus=(Gpu("NVIDIA L4", (8, 9), 23034, 22000),)))
    assert not needs_fp16(GpuFacts())  # no GPU listed: SGLang's own default


def auto_with(machine: GpuMachine, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Any:
    monkeypatch.delenv("DASHBOARD_ASSUME_CUDA", raising=False)
    facts = machine.facts()
    return auto_engine(EngineOptions(**options), ("synthetic", "sglang", "openai"), probe=lambda: facts)


async def test_auto_on_a_gpu_sglang_cannot_use_serves_the_cpu_model_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    machine = GpuMachine(
        tmp_path / "m", smi_lines=["Tesla T4, 535.104.05, 7.5, 15360, 14910"], nvcc_release=None
    )
    with caplog.at_level(logging.WARNING, "backend.engines.auto"):
        engine = auto_with(machine, monkeypatch)
    assert engine.name == "synthetic"
    logged = caplog.text
    assert (
        "GPU preflight: NVIDIA driver: the driver is 535.104.05" in logged
        and "GPU preflight: nvcc:" in logged
    )
    async with serving(engine) as server:
        line, _ = await engine_line_now(server.url)
    assert "⚠️ this machine has an NVIDIA GPU, but SGLang cannot use it, so the CPU model serves" in line
    assert "(1) NVIDIA driver: the driver is 535.104.05" in line and "update the NVIDIA driver to 580" in line
    assert "(2) nvcc: " in line and "set CUDA_HOME" in line


@pytest.mark.parametrize(
    ("smi", "user_flags", "dtype"),
    [(T4, "", "float16"), (L4, "", None), (T4, "--dtype bfloat16", "bfloat16"), (T4, "--dtype=half", None)],
)
def test_auto_on_a_ready_gpu_launches_sglang_with_this_gpus_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smi: str, user_flags: str, dtype: str | None
) -> None:
    engine = auto_with(
        GpuMachine(tmp_path / "m", smi_lines=[smi]), monkeypatch, sglang_server_args=user_flags
    )
    assert isinstance(engine, SGLangEngine) and engine.launcher is not None and not engine.notice
    command = engine.launcher.command()
    found = command[command.index("--dtype") + 1] if "--dtype" in command else None
    assert found == dtype, command
    assert command.count("--dtype") + sum(a.startswith("--dtype=") for a in command) <= 1, command
    assert command[command.index("--log-level") + 1] == "warning"
    assert "--incremental-streaming-output" in command and "--sleep-on-idle" in command


class StandInSGLang:
    """`sglang.Engine` as far as the in-process engine's start touches it: keeps its arguments."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        StandInSGLang.made.append(kwargs)
        self.server_args = types.SimpleNamespace(**kwargs)
        self.tokenizer_manager = types.SimpleNamespace(auto_create_handle_loop=lambda: None, tokenizer=None)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def stand_in_sglang(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=StandInSGLang))
    StandInSGLang.made = []
    return StandInSGLang.made


@pytest.mark.parametrize(
    ("smi", "user", "expected"),
    [
        (T4, {}, {"incremental_streaming_output": True, "sleep_on_idle": True, "dtype": "float16"}),
        (L4, {}, {"incremental_streaming_output": True, "sleep_on_idle": True}),
        (
            T4,
            {"dtype": "bfloat16", "incremental_streaming_output": False},
            {"incremental_streaming_output": False, "sleep_on_idle": True, "dtype": "bfloat16"},
        ),
    ],
)
async def test_in_process_sglang_gets_incremental_output_sleep_on_idle_and_this_gpus_dtype(
    tmp_path: Path,
    stand_in_sglang: list[dict[str, Any]],
    smi: str,
    user: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    facts = GpuMachine(tmp_path / "m", smi_lines=[smi]).facts()
    engine = SGLangInProcessEngine("org/model", locate=SGLangModel, probe=lambda: facts, **user)
    await engine.start()
    assert engine.incremental == expected["incremental_streaming_output"]
    await engine.stop()
    assert stand_in_sglang == [{"model_path": "org/model", **expected}]


async def test_in_process_sglang_loads_the_model_found_for_it_and_says_why(
    stand_in_sglang: list[dict[str, Any]],
) -> None:
    """Without --model, SGLang gets what `sglang_model` found (the bundled copy where the hub is out
    of reach), and the engine's notice says so."""
    asked: list[str] = []

    def locate(model: str) -> SGLangModel:
        asked.append(model)
        return SGLangModel("/cache/models/SmolLM2-135M-Instruct", "the bundled SmolLM2-135M-Instruct, ...")

    engine = SGLangInProcessEngine("", locate=locate, device="cpu")
    await engine.start()
    await engine.stop()
    assert asked == [""] and stand_in_sglang[0]["model_path"] == "/cache/models/SmolLM2-135M-Instruct"
    assert engine.notice == "the bundled SmolLM2-135M-Instruct, ..." and engine.health()["notice"]


async def test_in_process_sglang_on_the_cpu_skips_the_preflight(
    stand_in_sglang: list[dict[str, Any]],
) -> None:
    def no_probe() -> GpuFacts:
        raise AssertionError("a CPU start must not probe the GPU")

    engine = SGLangInProcessEngine("org/model", locate=SGLangModel, probe=no_probe, device="cpu")
    await engine.start()
    await engine.stop()
    assert (
        stand_in_sglang[0]["device"] == "cpu" and stand_in_sglang[0]["incremental_streaming_output"] is True
    )


async def test_in_process_sglangs_import_leaves_the_loop_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing SGLang takes seconds; meanwhile the loop keeps serving (/health, the page): a stand-in
    package whose import takes 0.6 s (its `Engine` this file's StandInSGLang) holds no tick of the loop
    for more than a fraction of that."""
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"import time\ntime.sleep(0.6)\nfrom {__name__} import StandInSGLang as Engine\n"
    )
    StandInSGLang.made = []
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = SGLangInProcessEngine("org/model", locate=SGLangModel, device="cpu")
    gaps: list[float] = []

    async def tick() -> None:
        last = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(0.01)
            now = asyncio.get_running_loop().time()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        await engine.start()
        await engine.stop()
        assert sys.modules["sglang"].__file__ == str(package / "__init__.py")
        assert [made["model_path"] for made in StandInSGLang.made] == ["org/model"]
    finally:
        ticker.cancel()
        sys.modules.pop("sglang", None)  # the stand-in is for this test alone
    assert len(gaps) >= 20 and max(gaps) < 0.3, max(gaps)


async def test_in_process_sglang_on_a_gpu_it_cannot_use_fails_to_start_naming_what_is_missing(
    tmp_path: Path, stand_in_sglang: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    facts = GpuMachine(tmp_path / "m", cxx=False, glibc=(2, 31)).facts()
    engine = SGLangInProcessEngine("org/model", locate=SGLangModel, probe=lambda: facts)
    with caplog.at_level(logging.WARNING, "backend.engines.sglang_inprocess"):
        async with serving(engine, background=True) as server:
            await server.engine_settled()
            line, _ = await engine_line_now(server.url)
    assert not stand_in_sglang, "SGLang must not start on a GPU it cannot use"
    assert "could not start: SGLang cannot use this machine's GPU as it stands: (1) C++ compiler:" in line
    assert (
        "install one (apt install g++) or set CXX" in line and "(2) glibc: this system has glibc 2.31" in line
    )
    assert "GPU preflight: glibc: this system has glibc 2.31" in caplog.text


def test_every_registered_engine_still_builds() -> None:
    assert {"sglang", "sglang-engine"} <= set(ENGINES)


def test_the_command_line_report_names_what_is_missing(tmp_path: Path) -> None:
    """`python -m backend.engines.gpu_probe` on this CPU machine with a stand-in nvidia-smi on PATH:
    the real torch probe finds the CPU build and says so; the exit status says SGLang cannot start."""
    import os
    import subprocess

    fake_bin = tmp_path / "bin"
    executable(fake_bin / "nvidia-smi", f"echo '{T4}'")
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    result = subprocess.run(
        [sys.executable, "-m", "backend.engines.gpu_probe"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "GPU 0: Tesla T4, compute capability 7.5, 14910 of 15360 MiB free" in result.stdout
    assert "MISSING  torch: torch " in result.stdout and "is a CPU build" in result.stdout, result.stdout
    assert "SGLang cannot use this GPU as it stands" in result.stdout


def test_a_machine_without_the_gpu_install_is_held_to_what_it_would_install(tmp_path: Path) -> None:
    """No SGLang and a CPU torch: the driver is checked against the SGLang requirements-gpu.txt pins
    (the constant and the file's pin agree)."""
    import re

    pinned = re.search(
        r"^sglang==(\S+)$", (Path(__file__).parent.parent / "requirements-gpu.txt").read_text(), re.M
    )
    assert pinned is not None and pinned.group(1) == PINNED_SGLANG[0]
    cpu_torch = {"torch_version": "2.13.0", "torch_cuda": None, "torch_cuda_error": None}
    machine = GpuMachine(
        tmp_path / "m",
        smi_lines=["Tesla T4, 535.104.05, 7.5, 15360, 14910"],
        torch=cpu_torch,
        sglang_version=None,
    )
    summary = check(machine.facts()).summary()
    assert (
        "the driver is 535.104.05, and SGLang 0.5.23, which requirements-gpu.txt installs, needs CUDA 13"
        in summary
    )

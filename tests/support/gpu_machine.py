"""A GPU machine made of stand-ins, for the GPU preflight's tests on a machine without one.

A folder of fake device files, and a folder of executables put in front of the probes' PATH: a fake
`nvidia-smi` that prints the CSV a real one prints for `--query-gpu` (or fails as one does without a
loaded driver), a fake `nvcc` in a fake CUDA toolkit, a fake `c++`. torch's and SGLang's facts are
given as the probes' child would report them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from backend.engines.gpu_preflight import GpuFacts
from backend.engines.gpu_probe import probe, run_command

T4 = "Tesla T4, 580.82.07, 7.5, 15360, 14910"
L4 = "NVIDIA L4, 580.82.07, 8.9, 23034, 22560"
SMI_FAILS = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def executable(path: Path, body: str) -> Path:
    """A shell script at `path` running `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@dataclass
class GpuMachine:
    """What the stand-in machine has; `facts()` probes it as the dashboard does."""

    root: Path
    smi_lines: list[str] | None = field(default_factory=lambda: [L4])
    """What nvidia-smi prints, one GPU a line; None: no nvidia-smi on PATH."""
    smi_fails: bool = False
    device_files: tuple[str, ...] = ("nvidia0", "nvidiactl", "nvidia-uvm")
    nvcc_release: str | None = "13.0"
    """The fake toolkit's nvcc release; None: no toolkit."""
    cuda_home: str | None = None
    """CUDA_HOME as set; None: unset (nvcc is then found on PATH)."""
    cxx: bool = True
    torch: dict[str, object] = field(
        default_factory=lambda: {"torch_version": "2.14.1", "torch_cuda": "13.0", "torch_cuda_error": None}
    )
    sglang_version: str | None = "0.5.23"
    glibc: tuple[int, int] = (2, 35)

    def facts(self) -> GpuFacts:
        """The probes' facts about this machine."""
        dev, bin_dir = self.root / "dev", self.root / "bin"
        shutil.rmtree(self.root, ignore_errors=True)
        dev.mkdir(parents=True)
        bin_dir.mkdir()
        for name in self.device_files:
            (dev / name).write_text("")
        if self.smi_lines is not None:
            if self.smi_fails:
                executable(bin_dir / "nvidia-smi", f"cat <<'EOF'\n{SMI_FAILS}\nEOF\nexit 9")
            else:
                lines = "\n".join(self.smi_lines)
                executable(bin_dir / "nvidia-smi", f"cat <<'EOF'\n{lines}\nEOF")
        toolkit = self.root / "cuda"
        if self.nvcc_release is not None:
            executable(
                toolkit / "bin" / "nvcc",
                f"echo 'Cuda compilation tools, release {self.nvcc_release}, V{self.nvcc_release}.48'",
            )
            (bin_dir / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
        if self.cxx:
            executable(bin_dir / "c++", "exit 0")
        env = {"PATH": str(bin_dir)}
        if self.cuda_home is not None:
            env["CUDA_HOME"] = self.cuda_home
        cuda = 13 if self.sglang_version else None
        return probe(
            dev_dir=dev,
            env=env,
            which=lambda name: shutil.which(name, path=str(bin_dir)),
            run=run_command,
            torch=lambda run: dict(self.torch),
            sglang=lambda: {"sglang_version": self.sglang_version, "sglang_cuda": cuda},
            glibc=lambda: self.glibc,
            default_cuda_home=str(self.root / "usr-local-cuda"),
        )

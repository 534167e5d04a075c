"""What a GPU machine lacks for SGLang, from facts about it: sans-I/O, so tests feed it any machine.

`backend.engines.gpu_probe` gathers the facts (the device files, `nvidia-smi`, torch, nvcc, the C++
compiler, glibc); `check` turns them into findings, each naming the missing or wrong part and what to
install or set. A blocking finding means SGLang cannot serve on this GPU as the machine stands (it
would fail in its start or in its first forward pass); the others are said and SGLang starts anyway.
The same facts choose the settings that depend on the GPU (`needs_fp16`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DRIVER_FOR_CUDA: dict[int, tuple[int, ...]] = {13: (580,), 12: (525, 60, 13), 11: (450, 80, 2)}
"""The oldest NVIDIA Linux driver that runs a CUDA major version (its minor-version compatibility)."""

MIN_COMPUTE_FOR_CUDA: dict[int, tuple[int, int]] = {13: (7, 5), 12: (5, 0), 11: (3, 5)}
"""The oldest GPU architecture each CUDA major version still builds for (CUDA 13 dropped Maxwell,
Pascal and Volta: below 7.5)."""

BF16_COMPUTE = (8, 0)
"""GPUs below this compute capability (T4, V100) have no bf16: the model runs in fp16 there."""

MIN_GLIBC = (2, 34)
"""SGLang's wheel is manylinux_2_34: Ubuntu 22.04, Debian 12, RHEL 9 or newer."""

MIN_FREE_GPU_MIB = 2048
"""Below this much free memory on a GPU, SGLang cannot hold a small model and a KV cache."""

BUSY_GPU_SHARE = 0.8
"""Free memory under this share of the total: another process holds part of the GPU (said, not blocking)."""

PINNED_SGLANG = ("0.5.23", 13)
"""The SGLang requirements-gpu.txt installs, and the CUDA major version it is built for (its wheel
pins cuda-python>=13.0): what a machine must run where no SGLang or CUDA torch is installed yet."""

SGLANG_DOCKER_IMAGE = "lmsysorg/sglang"
"""SGLang's own CUDA image: driver libraries, nvcc, a C++ compiler and the kernels' toolchain."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as `nvidia-smi` lists it."""

    name: str
    compute_capability: tuple[int, int]
    memory_total_mib: int
    memory_free_mib: int


@dataclass(frozen=True)
class GpuFacts:
    """What the probes found on this machine (`backend.engines.gpu_probe.probe`)."""

    device_files: tuple[str, ...] = ()
    """/dev/nvidia0, /dev/nvidiactl, ...: the kernel module is loaded."""
    smi_path: str | None = None
    """Where `nvidia-smi` is, or None where it is not on PATH."""
    smi_error: str = ""
    """Why `nvidia-smi` failed, where it ran and failed (a driver that does not match its module)."""
    driver_version: str = ""
    gpus: tuple[Gpu, ...] = ()
    cuda_needed: int | None = None
    """The CUDA major version the installed torch and SGLang are built for (None: unknown)."""
    cuda_needed_by: str = ""
    """What asks for `cuda_needed`, in words ("SGLang 0.5.23 (cuda-python>=13.0)")."""
    sglang_version: str | None = None
    """The installed SGLang's version, None where it is not installed."""
    torch_version: str | None = None
    """The installed torch's version, None where it is not installed."""
    torch_cuda: str | None = None
    """The CUDA version torch is built for (torch.version.cuda); None for a CPU build."""
    torch_cuda_error: str | None = None
    """Why torch cannot use the GPU (torch.cuda.init's error), None where it can."""
    cuda_home_source: str = ""
    """How SGLang's JIT finds the CUDA toolkit: "CUDA_HOME=...", "nvcc on PATH", "/usr/local/cuda"."""
    nvcc: str = ""
    """The nvcc SGLang's JIT would run (CUDA_HOME or CUDA_PATH, else nvcc on PATH, else /usr/local/cuda)."""
    nvcc_found: bool = False
    nvcc_version: str = ""
    """nvcc's release ("13.0"), where it ran."""
    cxx: str | None = None
    """The host C++ compiler (CXX, or c++ / g++ / clang++ on PATH), None where there is none."""
    glibc: tuple[int, int] | None = None
    """The C library's version, None where it is not glibc (musl) or unknown."""

    @property
    def has_device(self) -> bool:
        """Whether this machine has an NVIDIA GPU (device files, or nvidia-smi)."""
        return bool(self.device_files) or self.smi_path is not None

    @property
    def min_compute(self) -> tuple[int, int] | None:
        """The lowest compute capability of the listed GPUs, None where none is listed."""
        return min((gpu.compute_capability for gpu in self.gpus), default=None)


@dataclass(frozen=True)
class Finding:
    """One thing missing or wrong: the part, what was found, what to install or set."""

    part: str
    said: str
    fix: str
    blocking: bool = True

    def sentence(self) -> str:
        """The finding as one sentence for the page and the log."""
        return f"{self.part}: {self.said}; {self.fix}"


@dataclass(frozen=True)
class Preflight:
    """The findings on one machine."""

    facts: GpuFacts
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """The findings that keep SGLang from serving on the GPU."""
        return tuple(f for f in self.findings if f.blocking)

    @property
    def ready(self) -> bool:
        """Whether SGLang can start on this GPU (no blocking finding)."""
        return not self.blocking

    def summary(self, findings: tuple[Finding, ...] | None = None) -> str:
        """The findings (by default all of them) as sentences, numbered where more than one."""
        chosen = self.findings if findings is None else findings
        if len(chosen) == 1:
            return chosen[0].sentence()
        return " ".join(f"({i}) {f.sentence()}." for i, f in enumerate(chosen, 1))


def parse_version(text: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version string ("580.65.06" -> (580, 65, 6)); () if none."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def parse_smi_csv(text: str) -> tuple[str, tuple[Gpu, ...]]:
    """The driver version and the GPUs from `nvidia-smi --query-gpu=` + SMI_FIELDS'
    `--format=csv,noheader,nounits` output; ValueError naming a line it cannot read."""
    driver, gpus = "", []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise ValueError(
                f"nvidia-smi printed a line with {len(cells)} fields, not {len(SMI_FIELDS)}: {line!r}"
            )
        name, driver_version, compute, total, free = cells
        capability = parse_version(compute)
        if len(capability) < 2 or not total.isdigit() or not free.isdigit():
            raise ValueError(
                f"nvidia-smi printed a line that is not name, driver, capability, MiB, MiB: {line!r}"
            )
        driver = driver or driver_version
        gpus.append(Gpu(name, (capability[0], capability[1]), int(total), int(free)))
    return driver, tuple(gpus)


SMI_FIELDS = ("name", "driver_version", "compute_cap", "memory.total", "memory.free")
"""What the probe asks `nvidia-smi --query-gpu` for, in this order."""


def cuda_major(version: str | None) -> int | None:
    """The major version of a CUDA version string ("13.0" -> 13), None for None or junk."""
    parts = parse_version(version or "")
    return parts[0] if parts else None


def cuda_required_by_sglang(requirements: list[str]) -> int | None:
    """The CUDA major version an SGLang wheel's requirements pin (`cuda-python>=13.0`,
    `flashinfer_python[cu13]`), None where they name none."""
    majors = []
    for requirement in requirements:
        name = re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        if name == "cuda-python":
            found = re.search(r">=\s*(\d+)", requirement)
            if found:
                majors.append(int(found.group(1)))
        majors += [int(m) for m in re.findall(r"\[[^\]]*cu(\d{2})[^\]]*\]", requirement)]
        majors += [int(m) for m in re.findall(r"-cu(\d{2})\b", requirement)]
    return max(majors, default=None)


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def check(facts: GpuFacts) -> Preflight:
    """The findings on a machine with these facts (none where it has no NVIDIA device)."""
    if not facts.has_device:
        return Preflight(facts)
    found: list[Finding] = []
    cuda = facts.cuda_needed
    needs = f"{facts.cuda_needed_by} needs CUDA {cuda}" if cuda else ""
    found += _driver_findings(facts, cuda, needs)
    found += _torch_findings(facts, cuda)
    if facts.sglang_version is None:
        found.append(
            Finding(
                "SGLang",
                "it is not installed, so the GPU path has no engine",
                "install the GPU requirements in a fresh environment: pip install -r requirements-gpu.txt",
            )
        )
    found += _toolchain_findings(facts, cuda)
    if facts.glibc is not None and facts.glibc < MIN_GLIBC:
        found.append(
            Finding(
                "glibc",
                f"this system has glibc {_version_text(facts.glibc)}, and SGLang's wheel is "
                f"manylinux_{MIN_GLIBC[0]}_{MIN_GLIBC[1]}",
                f"use a system with glibc {_version_text(MIN_GLIBC)} or newer (Ubuntu 22.04, Debian 12, "
                f"RHEL 9 or newer), or SGLang's Docker image ({SGLANG_DOCKER_IMAGE})",
            )
        )
    found += _gpu_findings(facts, cuda)
    return Preflight(facts, tuple(found))


def _driver_findings(facts: GpuFacts, cuda: int | None, needs: str) -> list[Finding]:
    if facts.smi_path is None:
        return [
            Finding(
                "NVIDIA driver",
                f"the device files ({', '.join(facts.device_files)}) are there but nvidia-smi is not on "
                "PATH, so the driver's version cannot be read",
                "install the NVIDIA driver's utilities (nvidia-utils, of the same version as the driver)",
                blocking=False,
            )
        ]
    if facts.smi_error:
        return [
            Finding(
                "NVIDIA driver",
                f"nvidia-smi failed: {facts.smi_error}",
                "load the NVIDIA kernel module of the installed driver (a reboot after a driver update "
                "does it); on a container, run it with the GPU passed through (docker run --gpus all)",
            )
        ]
    driver = parse_version(facts.driver_version)
    wanted = DRIVER_FOR_CUDA.get(cuda or 0)
    if driver and wanted and driver < wanted:
        return [
            Finding(
                "NVIDIA driver",
                f"the driver is {facts.driver_version}, and {needs}, which needs driver "
                f"{_version_text(wanted)} or newer",
                f"update the NVIDIA driver to {wanted[0]} or newer (apt install nvidia-driver-{wanted[0]}, "
                f"or a machine image with it), or install a torch and SGLang built for an older CUDA",
            )
        ]
    return []


def _torch_findings(facts: GpuFacts, cuda: int | None) -> list[Finding]:
    if facts.torch_version is None:
        return [
            Finding(
                "torch",
                "it is not installed",
                "install the GPU requirements in a fresh environment: pip install -r requirements-gpu.txt",
            )
        ]
    if facts.torch_cuda is None:
        return [
            Finding(
                "torch",
                f"torch {facts.torch_version} is a CPU build and cannot use the GPU",
                "install the GPU requirements in a fresh environment (pip install -r requirements-gpu.txt "
                "brings SGLang's CUDA torch); requirements.txt's torch is the CPU one",
            )
        ]
    if facts.torch_cuda_error is not None:
        return [
            Finding(
                "torch",
                f"torch {facts.torch_version} (CUDA {facts.torch_cuda}) cannot use the GPU: "
                f"{facts.torch_cuda_error}",
                "fix what torch says (the driver above, if it is named), or set CUDA_VISIBLE_DEVICES to a "
                "GPU this process may use",
            )
        ]
    return []


def _toolchain_findings(facts: GpuFacts, cuda: int | None) -> list[Finding]:
    found = []
    toolkit = f"the CUDA {cuda} toolkit" if cuda else "the CUDA toolkit"
    if not facts.nvcc_found:
        found.append(
            Finding(
                "nvcc",
                f"SGLang compiles kernels at first use with {facts.nvcc or 'nvcc'} "
                f"(found through {facts.cuda_home_source or 'CUDA_HOME, PATH or /usr/local/cuda'}), "
                "which does not exist, so its warm-up's first forward pass would fail",
                f"install {toolkit} (apt install cuda-toolkit-{cuda or 13}-0 from NVIDIA's repository) "
                f"and set CUDA_HOME to it, or run SGLang's Docker image ({SGLANG_DOCKER_IMAGE})",
            )
        )
    elif cuda and facts.nvcc_version and cuda_major(facts.nvcc_version) != cuda:
        found.append(
            Finding(
                "nvcc",
                f"{facts.nvcc} is CUDA {facts.nvcc_version}, and {facts.cuda_needed_by} is built for "
                f"CUDA {cuda}",
                f"point CUDA_HOME at {toolkit}",
                blocking=(cuda_major(facts.nvcc_version) or 0) < cuda,
            )
        )
    if facts.cxx is None:
        found.append(
            Finding(
                "C++ compiler",
                "SGLang's and FlashInfer's kernel builds need a host C++ compiler, and there is none "
                "(CXX unset; no c++, g++ or clang++ on PATH)",
                "install one (apt install g++) or set CXX to it",
            )
        )
    return found


def _gpu_findings(facts: GpuFacts, cuda: int | None) -> list[Finding]:
    found = []
    oldest = MIN_COMPUTE_FOR_CUDA.get(cuda or 0)
    for index, gpu in enumerate(facts.gpus):
        capability = _version_text(gpu.compute_capability)
        if oldest and gpu.compute_capability < oldest:
            found.append(
                Finding(
                    f"GPU {index} ({gpu.name})",
                    f"its compute capability is {capability}, and CUDA {cuda} ({facts.cuda_needed_by}) "
                    f"runs on {_version_text(oldest)} or newer",
                    "use a newer GPU (T4, L4, A10G, L40S, A100, H100), or a torch and SGLang built for an "
                    "older CUDA",
                )
            )
        if gpu.memory_free_mib < MIN_FREE_GPU_MIB:
            found.append(
                Finding(
                    f"GPU {index} ({gpu.name})",
                    f"{gpu.memory_free_mib} MiB of its {gpu.memory_total_mib} MiB are free, under the "
                    f"{MIN_FREE_GPU_MIB} MiB a small model and its KV cache need",
                    "stop the other processes on it (nvidia-smi lists them), or choose another GPU with "
                    "CUDA_VISIBLE_DEVICES",
                )
            )
        elif gpu.memory_free_mib < BUSY_GPU_SHARE * gpu.memory_total_mib:
            used = gpu.memory_total_mib - gpu.memory_free_mib
            found.append(
                Finding(
                    f"GPU {index} ({gpu.name})",
                    f"other processes hold {used} MiB of its {gpu.memory_total_mib} MiB",
                    "SGLang sizes its KV cache to a share of the total (mem_fraction_static); lower it if "
                    "the start runs out of memory",
                    blocking=False,
                )
            )
    return found


def needs_fp16(facts: GpuFacts) -> bool:
    """Whether a GPU here lacks bf16 (compute capability below 8.0), so the model must run in fp16."""
    lowest = facts.min_compute
    return lowest is not None and lowest < BF16_COMPUTE

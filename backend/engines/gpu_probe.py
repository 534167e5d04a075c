"""The facts `backend.engines.gpu_preflight` checks, read from this machine: thin probes.

Each probe takes what it reads from as an argument (the device folder, the environment, the PATH
lookup, the command runner), so tests run it against stand-ins: a fake `nvidia-smi` script on PATH,
a folder of fake device files. torch is asked in a child process of the same Python: initialising
CUDA here would bind this process (which may fork SGLang's scheduler) to it, and a broken driver may
crash the one asking.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from backend.engines.gpu_preflight import (
    PINNED_SGLANG,
    SMI_FIELDS,
    GpuFacts,
    cuda_major,
    cuda_required_by_sglang,
    parse_smi_csv,
)

PROBE_TIMEOUT_S = 30.0
"""Limit of one probe command (nvidia-smi, nvcc --version, the torch child)."""

Runner = Callable[[Sequence[str]], tuple[int, str]]
"""Runs a command: (exit status, its output with stderr); status 127 where it could not start."""

TORCH_PROBE = """
import json
try:
    import torch
except ImportError:
    print(json.dumps({"version": None}))
    raise SystemExit
facts = {"version": torch.__version__.split("+")[0], "cuda": torch.version.cuda, "error": None}
if torch.version.cuda is not None:
    try:
        torch.cuda.init()
        if torch.cuda.device_count() < 1:
            facts["error"] = "it sees no CUDA device"
    except Exception as exc:
        facts["error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
print(json.dumps(facts))
"""
"""Run by a child Python: torch's version, CUDA build and whether it can use the GPU, as JSON."""


def run_command(command: Sequence[str]) -> tuple[int, str]:
    """`command`'s exit status and output (stdout then stderr); 127 where it could not start, 124
    where it ran past PROBE_TIMEOUT_S."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except OSError as exc:
        return 127, str(exc)
    except subprocess.TimeoutExpired:
        return 124, f"{command[0]} did not answer within {PROBE_TIMEOUT_S:g} s"
    return done.returncode, done.stdout + done.stderr


def device_files(dev_dir: Path) -> tuple[str, ...]:
    """The NVIDIA device files in `dev_dir` (/dev/nvidia0, /dev/nvidiactl, ...)."""
    try:
        return tuple(sorted(str(path) for path in dev_dir.glob("nvidia*")))
    except OSError:
        return ()


def smi_facts(smi: str | None, run: Runner) -> dict[str, object]:
    """GpuFacts' nvidia-smi fields: its path, and its driver and GPUs or why it failed."""
    if smi is None:
        return {"smi_path": None}
    query = [smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    status, output = run(query)
    if status != 0:
        first = next((line for line in output.splitlines() if line.strip()), "")
        return {"smi_path": smi, "smi_error": f"exit status {status}: {first.strip()}"}
    try:
        driver, gpus = parse_smi_csv(output)
    except ValueError as exc:
        return {"smi_path": smi, "smi_error": str(exc)}
    return {"smi_path": smi, "driver_version": driver, "gpus": gpus}


DEFAULT_CUDA_HOME = "/usr/local/cuda"
"""Where SGLang's JIT looks for the CUDA toolkit last."""


def nvcc_facts(
    env: Mapping[str, str],
    which: Callable[[str], str | None],
    run: Runner,
    default_home: str = DEFAULT_CUDA_HOME,
) -> dict[str, object]:
    """The nvcc SGLang's JIT runs, found as it finds it: CUDA_HOME or CUDA_PATH, else the nvcc on
    PATH, else `default_home`; and its release where it runs."""
    configured = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if configured:
        home, source = (
            configured,
            f"CUDA_HOME={configured}" if env.get("CUDA_HOME") else f"CUDA_PATH={configured}",
        )
    elif on_path := which("nvcc"):
        home, source = os.path.dirname(os.path.dirname(on_path)), "nvcc on PATH"
    else:
        home, source = default_home, f"{default_home}, with CUDA_HOME unset and no nvcc on PATH"
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.path.isfile(nvcc):
        return {"nvcc": nvcc, "cuda_home_source": source, "nvcc_found": False}
    status, output = run([nvcc, "--version"])
    release = re.search(r"release (\d+\.\d+)", output) if status == 0 else None
    return {
        "nvcc": nvcc,
        "cuda_home_source": source,
        "nvcc_found": True,
        "nvcc_version": release.group(1) if release else "",
    }


def host_compiler(env: Mapping[str, str], which: Callable[[str], str | None]) -> str | None:
    """The host C++ compiler: CXX where set (and found), else c++, g++ or clang++ on PATH."""
    if env.get("CXX"):
        return which(env["CXX"].split()[0])
    return next((found for name in ("c++", "g++", "clang++") if (found := which(name))), None)


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc version, None on another C library."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    match = re.fullmatch(r"glibc (\d+)\.(\d+).*", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def torch_facts(run: Runner, python: str = sys.executable) -> dict[str, object]:
    """torch's version, CUDA build and whether it can use the GPU, asked of a child Python."""
    status, output = run([python, "-c", TORCH_PROBE])
    lines = output.strip().splitlines()
    try:
        facts = json.loads(lines[-1]) if status == 0 and lines else None
    except ValueError:
        facts = None
    if not isinstance(facts, dict):
        tail = lines[-1] if lines else f"exit status {status}"
        return {"torch_version": "?", "torch_cuda": "?", "torch_cuda_error": f"asking torch failed: {tail}"}
    return {
        "torch_version": facts.get("version"),
        "torch_cuda": facts.get("cuda"),
        "torch_cuda_error": facts.get("error"),
    }


def sglang_facts() -> dict[str, object]:
    """The installed SGLang's version, and the CUDA major version its requirements pin."""
    try:
        version = importlib.metadata.version("sglang")
        requirements = importlib.metadata.requires("sglang") or []
    except importlib.metadata.PackageNotFoundError:
        return {"sglang_version": None}
    return {"sglang_version": version, "sglang_cuda": cuda_required_by_sglang(requirements)}


def probe(
    *,
    dev_dir: Path = Path("/dev"),
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
    run: Runner = run_command,
    torch: Callable[[Runner], dict[str, object]] = torch_facts,
    sglang: Callable[[], dict[str, object]] = sglang_facts,
    glibc: Callable[[], tuple[int, int] | None] = glibc_version,
    default_cuda_home: str = DEFAULT_CUDA_HOME,
) -> GpuFacts:
    """This machine's facts; nothing past the device look-ups where it has no NVIDIA device."""
    files = device_files(dev_dir)
    smi = which("nvidia-smi")
    if not files and smi is None:
        return GpuFacts()
    found: dict[str, object] = {"device_files": files, **smi_facts(smi, run)}
    found |= torch(run)
    sglang_found = sglang()
    found["sglang_version"] = sglang_found.get("sglang_version")
    torch_cuda = cuda_major(found.get("torch_cuda"))  # type: ignore[arg-type]
    sglang_cuda = sglang_found.get("sglang_cuda")
    needed = [
        (major, by)
        for major, by in (
            (torch_cuda, f"torch {found.get('torch_version')} (CUDA {found.get('torch_cuda')})"),
            (sglang_cuda, f"SGLang {found['sglang_version']}"),
        )
        if isinstance(major, int)
    ]
    if not needed:  # nothing of the GPU install yet: what it would install needs
        version, major = PINNED_SGLANG
        needed = [(major, f"SGLang {version}, which requirements-gpu.txt installs,")]
    found["cuda_needed"], found["cuda_needed_by"] = max(needed, key=lambda pair: pair[0])
    found |= nvcc_facts(env, which, run, default_cuda_home)
    found["cxx"] = host_compiler(env, which)
    found["glibc"] = glibc()
    return GpuFacts(**found)  # type: ignore[arg-type]


def main() -> int:
    """`python -m backend.engines.gpu_probe`: this machine's GPU facts and what SGLang lacks here;
    exit status 0 where SGLang can use the GPU."""
    from backend.engines.gpu_preflight import check

    facts = probe()
    if not facts.has_device:
        print("no NVIDIA device here: no /dev/nvidia* and no nvidia-smi on PATH")
        return 1
    print(f"driver {facts.driver_version or '?'}; torch {facts.torch_version} (CUDA {facts.torch_cuda})")
    sglang = facts.sglang_version or "not installed"
    print(f"SGLang {sglang}; needs CUDA {facts.cuda_needed} ({(facts.cuda_needed_by or '?').rstrip(',')})")
    for index, gpu in enumerate(facts.gpus):
        capability = ".".join(map(str, gpu.compute_capability))
        memory = f"{gpu.memory_free_mib} of {gpu.memory_total_mib} MiB free"
        print(f"GPU {index}: {gpu.name}, compute capability {capability}, {memory}")
    nvcc = f"CUDA {facts.nvcc_version}" if facts.nvcc_found else "missing"
    print(f"nvcc: {facts.nvcc} ({nvcc}, found through {facts.cuda_home_source})")
    glibc = ".".join(map(str, facts.glibc or ())) or "?"
    print(f"C++ compiler: {facts.cxx or 'missing'}; glibc {glibc}")
    report = check(facts)
    for finding in report.findings:
        print(("MISSING  " if finding.blocking else "NOTE     ") + finding.sentence())
    print("SGLang can use this GPU" if report.ready else "SGLang cannot use this GPU as it stands")
    return 0 if report.ready else 1


if __name__ == "__main__":
    sys.exit(main())

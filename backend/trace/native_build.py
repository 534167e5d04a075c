"""The tracer's C parts (step_recorder.c, trace_digest.c beside this file): whether they are built,
and building them in place where `make` did not.

`make run` and `make test` build them. A Hugging Face Space installs `requirements.txt` and runs
`python app.py`, so app.py builds them at startup there (a C compiler and Python's headers are in
the Space's image; about 2 s). Where the build fails the dashboard serves without its loop trace and
says why (docs/trace.md).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BUILD_TIMEOUT_S = 180
"""The longest a build may take before the dashboard starts without it (a few seconds here)."""

MODULES = ("backend.trace._step_recorder", "backend.trace._trace_digest")


def built() -> bool:
    """Whether both C parts can be imported."""
    return all(importlib.util.find_spec(name) is not None for name in MODULES)


def build_in_place(root: Path = ROOT) -> tuple[bool, str]:
    """Build the C parts next to their sources under `root`: (whether both are there now, what the
    build said when it did not succeed)."""
    command = [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"]
    try:
        result = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{' '.join(command)}: {exc}"
    present = all(_extension_file(root, name) is not None for name in MODULES)
    output = (result.stdout + result.stderr).strip()
    return present, "" if present else (output[-2000:] or f"exit status {result.returncode}")


def _extension_file(root: Path, module: str) -> Path | None:
    """The built file of `module` (dotted, under `root`), if there is one."""
    *package, name = module.split(".")
    folder = root.joinpath(*package)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / f"{name}{suffix}"
        if candidate.exists():
            return candidate
    return None

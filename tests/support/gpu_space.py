"""The GPU Space's image as tests read it without Docker: its entry command and its environment,
from deploy/gpu-space/Dockerfile."""

from __future__ import annotations

from pathlib import Path

from dockerfile_parse import DockerfileParser

from devkit.local import ROOT

SPACE = ROOT / "deploy" / "gpu-space"


def dockerfile() -> DockerfileParser:
    """The GPU Space's Dockerfile, parsed."""
    return DockerfileParser(str(SPACE / "Dockerfile"))


def entry_command(python: str) -> list[str]:
    """The Dockerfile's CMD (exec form: python3 app.py ...), its python3 replaced by `python`."""
    cmd = dockerfile().structure[-1]
    assert cmd["instruction"] == "CMD", cmd
    argv = [part.strip().strip('"') for part in cmd["value"].strip("[]").split(",")]
    assert argv[:2] == ["python3", "app.py"], argv
    return [python, *argv[1:]]


def image_env(data: Path) -> dict[str, str]:
    """The image's environment, its persistent storage /data moved to `data`, its HOME under it."""
    env = {name: value.replace("/data", str(data)) for name, value in dockerfile().envs.items()}
    return env | {"HOME": str(data / "home")}

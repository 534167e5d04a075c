"""The SGLang servers this dashboard launched, as it records them, and the orphans found from them.

A launched server holds most of a GPU's memory (SGLang reserves a fixed share at start). When the
dashboard launches one, it writes a record in the cache folder (`RECORDS`): the server's process
group (the keeper's pid, `backend.lifetime`), its port and start time, and the backend that launched
it, with their start times as the kernel counts them (ticks since boot, /proc/PID/stat) and the boot's
id, so that a pid used again by another process is never taken for the server or its backend. A
start that launches a server reads the records first (`look`): a recorded server still running
whose backend is gone is an orphan of this dashboard, stopped before the new one starts (`stop`);
one whose backend still runs belongs to another running dashboard, and is only named. The record
goes when the server is stopped (`forget`); a record whose server is gone is removed when read.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""Linux's id of this boot: a record from an earlier boot names no running process."""

STOP_GRACE_S = 3.0
"""How long an orphan may take to exit after SIGTERM before its process group is killed."""


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field); None
    where no such process runs (or it is a zombie) or /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def boot_id() -> str:
    """This boot's id ("" where the system does not say)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Launched:
    """One launched server's record."""

    pid: int
    """The server's process group: its keeper's pid."""
    started: int
    """The keeper's start, in ticks since boot."""
    port: int
    model: str
    backend: int
    """The pid of the backend that launched it."""
    backend_started: int | None
    boot: str
    at: float
    """time.time() at the launch, for the words."""

    def running(self) -> bool:
        """Whether the recorded server still runs (the same process, not its pid used again)."""
        return self.boot == boot_id() and start_ticks(self.pid) == self.started

    def backend_running(self) -> bool:
        """Whether the backend that launched it still runs."""
        return self.backend_started is not None and start_ticks(self.backend) == self.backend_started

    def words(self) -> str:
        """The server in words: pid, port, start, model and its backend."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        return (
            f"pid {self.pid}, port {self.port}, started {when} for {self.model} "
            f"by the backend with pid {self.backend}"
        )


def record(folder: Path, pid: int, port: int, model: str) -> Path | None:
    """Write the record of a server just launched in process group `pid` by this process; its path
    (None where the kernel cannot say when `pid` started, so that it could not be recognised)."""
    started = start_ticks(pid)
    if started is None:
        return None
    entry = Launched(
        pid,
        started,
        port,
        model,
        backend=os.getpid(),
        backend_started=start_ticks(os.getpid()),
        boot=boot_id(),
        at=time.time(),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-{pid}.json"
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(entry.__dict__))
    partial.replace(path)
    return path


def forget(path: Path | None) -> None:
    """Remove a server's record once it is stopped."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def read(path: Path) -> Launched | None:
    """The record at `path`; None where it cannot be read as one."""
    try:
        return Launched(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def look(folder: Path) -> tuple[list[Launched], list[Launched]]:
    """The recorded servers still running, as (orphans, other dashboards' servers): an orphan's
    backend is gone. Records of servers that are gone (or unreadable) are removed."""
    orphans: list[Launched] = []
    others: list[Launched] = []
    for path in sorted(folder.glob("sglang-*.json")) if folder.is_dir() else ():
        entry = read(path)
        if entry is None or not entry.running():
            forget(path)
        elif entry.backend_running():
            others.append(entry)
        else:
            orphans.append(entry)
    return orphans, others


def stop(entry: Launched, grace_s: float = STOP_GRACE_S) -> None:
    """Stop an orphan's process group: SIGTERM, up to `grace_s` for the server to exit, then SIGKILL
    to what is left of the group. Only a server still certainly the one recorded is signalled."""
    if not entry.running():
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(entry.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while entry.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(entry.pid, signal.SIGKILL)


def settle(folder: Path) -> str:
    """Before a server is launched: stop each orphan of an earlier run (its record removed) and name
    the servers of other dashboards that still run, in words for the engine line: what each is and
    what to do ("" where none is found)."""
    orphans, others = look(folder)
    said = []
    for entry in orphans:
        stop(entry)
        forget(folder / f"sglang-{entry.pid}.json")
        said.append(
            f"an SGLang server left running by an earlier run of this dashboard ({entry.words()}, "
            "which is gone) held GPU memory and was stopped before this start"
        )
    for entry in others:
        said.append(
            f"an SGLang server of another dashboard that still runs ({entry.words()}) holds GPU memory: "
            f"if this start finds the GPU full, stop that dashboard (`kill {entry.backend}`) or "
            f"use its server with --sglang-url http://127.0.0.1:{entry.port}"
        )
    return "; ".join(said)

"""Processes tied to their parent's life (`backend.lifetime`) and the launch records
(`backend.engines.http.launched`), on real processes without a server: the keeper passes on its
program's status, stops the program's whole group (SIGTERM, the grace, SIGKILL) once its parent is
killed, and the records tell an orphan from another dashboard's server and from a pid used again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend import lifetime
from backend.engines.http import launched

IGNORES_TERM_WITH_A_CHILD = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)
"""A program that ignores SIGTERM and has a child of its own (as an SGLang server its scheduler)."""


def live(pid: int) -> bool:
    return launched.start_ticks(pid) is not None


def in_group(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize(
    ("program", "status"),
    [("raise SystemExit(3)", 3), ("import os; os.abort()", -6), ("import os; os.kill(os.getpid(), 9)", -9)],
)
def test_the_keeper_exits_as_its_program_does(program: str, status: int) -> None:
    keeper = subprocess.Popen(lifetime.keeper_command([sys.executable, "-c", program], 1.0))
    assert keeper.wait(30) == status


def test_the_keeper_passes_the_groups_sigterm_to_its_program_and_waits_for_it() -> None:
    program = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); time.sleep(60)"
    )
    keeper = subprocess.Popen(
        lifetime.keeper_command([sys.executable, "-c", program], 1.0), start_new_session=True
    )
    time.sleep(1.0)
    os.killpg(keeper.pid, signal.SIGTERM)
    assert keeper.wait(30) == 7


def test_a_killed_parent_takes_the_keepers_whole_group_within_the_grace() -> None:
    """The parent (a process that started the keeper) killed with SIGKILL: the program, which
    ignores SIGTERM, and its child are killed GRACE_S later, the keeper with them."""
    grace_s = 1.0
    starter = (
        "import subprocess, sys\n"
        "from backend import lifetime\n"
        f"program = [sys.executable, '-c', {IGNORES_TERM_WITH_A_CHILD!r}]\n"
        f"command = lifetime.keeper_command(program, {grace_s})\n"
        "keeper = subprocess.Popen(command, start_new_session=True, stdout=sys.stdout)\n"
        "print(keeper.pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[1],
    )
    assert parent.stdout is not None
    keeper = int(parent.stdout.readline())
    grandchild = int(parent.stdout.readline())
    try:
        assert len(in_group(keeper)) == 3 and grandchild in in_group(keeper)
        killed = time.monotonic()
        parent.kill()
        parent.wait()
        while in_group(keeper):
            assert time.monotonic() - killed < grace_s + 3.0, in_group(keeper)
            time.sleep(0.02)
        took = time.monotonic() - killed
        assert took >= grace_s * 0.9, f"SIGKILL before the grace: {took:.2f} s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(keeper, signal.SIGKILL)


def test_a_killed_keeper_takes_its_program_with_it() -> None:
    """The kernel's parent-death signal: the keeper killed outright, its program gets SIGKILL."""
    keeper = subprocess.Popen(
        lifetime.keeper_command([sys.executable, "-c", IGNORES_TERM_WITH_A_CHILD], 1.0),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert keeper.stdout is not None
    keeper.stdout.readline()
    (program,) = [
        pid for pid in in_group(keeper.pid) if pid != keeper.pid and f"{keeper.pid}" in stat_ppid(pid)
    ]
    keeper.kill()
    keeper.wait()
    deadline = time.monotonic() + 3
    while live(program):
        assert time.monotonic() < deadline, "the program outlived its keeper"
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(keeper.pid, signal.SIGKILL)


def stat_ppid(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]


def test_tie_to_parent_calls_back_once_the_parent_is_gone(tmp_path: Path) -> None:
    """A child tied to its parent writes a file once the parent, killed, is gone."""
    flag = tmp_path / "gone"
    child = (
        "import os, sys, time\n"
        "from backend import lifetime\n"
        "lifetime.tie_to_parent(int(sys.argv[1]), lambda: (open(sys.argv[2], 'w').close(), os._exit(0)))\n"
        "print('tied', flush=True)\n"
        "time.sleep(60)\n"
    )
    starter = (
        "import subprocess, sys, os\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid()), sys.argv[1]])\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter, str(flag)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[1],
    )
    assert parent.stdout is not None
    assert parent.stdout.readline() == b"tied\n"
    assert not flag.exists()
    killed = time.monotonic()
    parent.kill()
    parent.wait()
    while not flag.exists():
        assert time.monotonic() - killed < 2.0, "the child did not see its parent go"
        time.sleep(0.01)


def write_record(folder: Path, entry: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-{entry['pid']}.json"
    path.write_text(json.dumps(entry))
    return path


def test_the_records_tell_orphans_other_dashboards_and_reused_pids_apart(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    gone_backend = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_backend.wait()
    try:
        mine = launched.record(tmp_path, server.pid, 30001, "m")
        assert mine is not None
        entry = json.loads(mine.read_text())
        assert entry["backend"] == os.getpid() and entry["port"] == 30001
        orphans, others = launched.look(tmp_path)
        assert orphans == [] and [o.pid for o in others] == [server.pid]  # this test is its backend

        write_record(tmp_path, {**entry, "backend": gone_backend.pid})
        orphans, others = launched.look(tmp_path)
        assert [o.pid for o in orphans] == [server.pid] and others == []

        # The same pid started at another time is another process: the record is dropped, nothing stopped.
        reused = write_record(
            tmp_path, {**entry, "backend": gone_backend.pid, "started": entry["started"] - 1}
        )
        assert launched.look(tmp_path) == ([], []) and not reused.exists()
        (tmp_path / "sglang-1.json").write_text("{not json")
        assert launched.look(tmp_path) == ([], []) and not (tmp_path / "sglang-1.json").exists()
        assert server.poll() is None

        write_record(tmp_path, {**entry, "backend": gone_backend.pid})
        said = launched.settle(tmp_path)
        assert f"pid {server.pid}, port 30001" in said and "was stopped before this start" in said, said
        assert server.wait(10) == -signal.SIGTERM
        assert list(tmp_path.glob("*.json")) == []
    finally:
        server.kill()
        server.wait()

"""Child processes that end with the process that started them, however it dies.

A process killed outright (SIGKILL: the out-of-memory killer, `kill -9`, a container runtime past its
grace) runs no cleanup, so each process the dashboard starts watches its own parent instead:

- `tie_to_parent`, called in a child of ours (app.py's backend, the embedded engine's process, the
  keeper below), calls its `on_gone` the moment the parent exits: a thread waits on a pidfd of the
  parent (Linux 5.3+: the kernel wakes it as the parent exits), or, where there is none, asks for the
  parent's pid every WATCH_S (a dead parent's children are handed to another process).
- A program that is not ours (an SGLang server) runs under a keeper: `python -P backend/lifetime.py
  --parent PID --grace S -- COMMAND...`, started in a session of its own. The keeper starts COMMAND
  in its process group with the kernel's parent-death signal set before it execs (Linux's
  `PR_SET_PDEATHSIG`, SIGKILL: the program dies with the keeper, however the keeper dies), ties
  itself to PID, and when PID is gone sends the group SIGTERM, waits up to S seconds for COMMAND to
  exit, then sends the group SIGKILL, so the program's own children go too. While PID lives the
  keeper only waits, and exits as COMMAND exits, with its status (killed by a signal: by the same
  signal), so the starter sees the program's own exit.

What holds where: on Linux both ties, and the parent-death signal also where the keeper itself is
killed with SIGKILL. On other POSIX systems (macOS) there is no parent-death signal: the watch polls
(WATCH_S), and a keeper killed with SIGKILL leaves its program running (docs/limits.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

WATCH_S = 0.5
"""How often the watch asks for the parent's pid where the kernel cannot wake it (no pidfd)."""

PR_SET_PDEATHSIG = 1
"""prctl's option for the signal a process gets when its parent dies (linux/prctl.h)."""


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """Where the system has one (Linux's prctl PR_SET_PDEATHSIG), a function that asks the kernel to
    send the calling process `sig` when the thread that started it exits, and ends the process at
    once if that parent is already gone: a `preexec_fn`, for a process forked with no other thread
    (the keeper). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl
    parent = os.getpid()

    def set_it() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set
            os._exit(1)

    return set_it


def _wait_for_exit(parent: int) -> None:
    """Return once process `parent` (this process's parent) has exited."""
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # not Linux 5.3+, or already gone
        fd = None
    if fd is not None:
        try:
            if os.getppid() == parent:  # the pidfd is of the parent, not of a reused pid
                select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while os.getppid() == parent:
        threading.Event().wait(WATCH_S)


def tie_to_parent(parent: int, on_gone: Callable[[], None]) -> threading.Thread:
    """Call `on_gone` (on a daemon thread of its own) once `parent`, the process that started this
    one, has exited, at once where it already has. The thread, started."""
    thread = threading.Thread(
        target=lambda: (_wait_for_exit(parent), on_gone()), name="parent watch", daemon=True
    )
    thread.start()
    return thread


def exit_like(code: int) -> None:
    """End this process as a child that returned `code` did: with its status, or killed by its signal."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's and SIGSTOP's cannot be set
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def keep(command: Sequence[str], parent: int, grace_s: float) -> int:
    """The keeper's life (see the module's words): run `command` in this process group, tied to this
    process by the parent-death signal; stop the group when `parent` is gone. `command`'s status."""
    # The group's SIGTERM (the starter stopping the program) is the program's to act on: the keeper
    # stays to pass on its status. A handler, not SIG_IGN, which the program would inherit.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        # preexec_fn is safe here: no other thread runs in the keeper yet.
        program = subprocess.Popen(list(command), preexec_fn=parent_death_signal(signal.SIGKILL))
    except OSError as exc:  # as a shell says it: the program cannot be run
        print(f"cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    gone = threading.Event()
    tie_to_parent(parent, gone.set)
    while program.poll() is None and not gone.wait(0.1):
        pass
    if program.poll() is None:  # the parent is gone: stop the group, as its stop would have
        with contextlib.suppress(ProcessLookupError):
            os.killpg(0, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            program.wait(grace_s)
        os.killpg(0, signal.SIGKILL)  # the program's children, and this keeper
    return program.wait()


def keeper_command(command: Sequence[str], grace_s: float, parent: int | None = None) -> list[str]:
    """The command line that runs `command` under a keeper tied to `parent` (by default this process).
    The keeper is this file run as a script (it needs only the standard library), with `-P` so that
    its folder's modules do not shadow the standard library's."""
    parent = os.getpid() if parent is None else parent
    keeper = [sys.executable, "-P", __file__, "--parent", str(parent), "--grace", f"{grace_s:g}"]
    return [*keeper, "--", *command]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -P backend/lifetime.py --parent PID --grace S -- COMMAND...`: the keeper."""
    parser = argparse.ArgumentParser(prog="backend/lifetime.py", description=__doc__)
    parser.add_argument("--parent", type=int, required=True, help="the process whose death stops COMMAND")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to keep")
    exit_like(keep(command, args.parent, args.grace))


if __name__ == "__main__":
    main()

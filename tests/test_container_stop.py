"""app.py stopped as a container platform stops it: SIGTERM, then SIGKILL 10 s later (a Space,
`docker stop`). With each engine this CPU can run without SGLang (synthetic, the embedded model, and
`--engine auto` launching a server: the stand-in of tests/support/fake_sglang_server, here one that
ignores SIGTERM as a server stuck in its shutdown would), idle and while a request streams, every
process app.py started must be gone within CONTAINER_GRACE_S of the signal. Each stop's time is
printed. The same with real SGLang (launched and in-process) is in tests/test_engines_real.py.

And killed outright (SIGKILL: the out-of-memory killer, `kill -9`): app.py or `python -m backend`
leaves no process of theirs within KILLED_GONE_S, counted by the mark in their environment, by
process group and by the launch records; a start that finds a server left by an earlier run stops
it (or names another running dashboard's) and says so in the engine line (`backend.lifetime`,
`backend.engines.http.launched`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from devkit.local import ROOT, free_port, wait_for_http
from tests.support.answers import LONG_PROMPT

CONTAINER_GRACE_S = 10.0
"""What a container platform waits after SIGTERM before it kills."""

KILLED_GONE_S = 5.0
"""How soon after app.py or the backend is killed outright every process they started must be gone."""

STAND_IN = ROOT / "tests" / "support" / "fake_sglang_server"
MARK = "DASHBOARD_STOP_TEST"


def marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of each live process whose environment holds MARK=mark."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found.append((int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def kill_marked(mark: str) -> None:
    for pid, _ in marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_app(tmp_path: Path, engine: str, mark: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """app.py with `engine`, once its engine is ready: the process and the page's URL."""
    port, backend_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False", MARK: mark, **env}
    command = [sys.executable, str(ROOT / "app.py"), "--engine", engine, "--port", str(port)]
    command += ["--backend-port", str(backend_port)]
    with (tmp_path / "app.log").open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/"
    wait_for_http(url, process, 240)
    wait_engine_ready(process, backend_port)
    return process, url


def wait_engine_ready(process: subprocess.Popen[bytes], backend_port: int) -> None:
    """Wait until the backend at `backend_port` (started by `process`) has started its engine; fail
    if it failed to, or the process exited first."""
    deadline = time.monotonic() + 240
    while (state := backend_health(backend_port)["engine_state"]) == "starting":
        assert time.monotonic() < deadline and process.poll() is None, "the engine did not start"
        time.sleep(0.5)
    assert state == "ready", backend_health(backend_port)


def sigterm_and_wait_gone(process: subprocess.Popen[bytes], mark: str) -> float:
    """Send `process` SIGTERM, as a container stop does, and wait until no process carrying `mark` is
    left, failing past CONTAINER_GRACE_S; the seconds that took."""
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while left := marked(mark):
        took = time.monotonic() - signalled
        assert took < CONTAINER_GRACE_S, f"still running {took:.1f} s after SIGTERM: {left}"
        time.sleep(0.1)
    return time.monotonic() - signalled


def backend_health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.loads(response.read())


ENGINES = {
    "synthetic": ("synthetic", {}),
    "embedded": ("embedded", {}),
    "auto-launched-server": (
        "auto",
        {
            "DASHBOARD_ASSUME_CUDA": "1",
            "PYTHONPATH": f"{ROOT}:{STAND_IN}",
            "FAKE_SGLANG_IGNORE_SIGTERM": "1",
            "DASHBOARD_MODEL": str(STAND_IN / "model"),  # a folder: no hub asked, nothing converted
            "XDG_CACHE_HOME": "",  # set per test: the launched server's log goes under it
        },
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("running", [False, True], ids=["idle", "streaming"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_app_py_and_every_child_are_gone_within_a_containers_grace(
    tmp_path: Path, engine: str, running: bool
) -> None:
    from gradio_client import Client

    name, env = ENGINES[engine]
    env = {key: value or str(tmp_path / "cache") for key, value in env.items()}
    mark = f"{engine}-{running}-{os.getpid()}-{time.monotonic_ns()}"
    process, url = start_app(tmp_path, name, mark, **env)
    try:
        client = Client(url, verbose=False)
        raw = ("cooperative", 0, "n", "raw", "")  # consumer, block ms, fan-out, format, system prompt
        final = client.predict("Once upon a time", 2, 8, 0.8, 0.95, 1, *raw, api_name="/generate")
        assert final[0]["samples"] and all(sample["text"] for sample in final[0]["samples"]), final
        children = marked(mark)
        if engine == "auto-launched-server":
            assert any(launched_server(command) for _, command in children), children
        if running:
            job = client.submit(LONG_PROMPT, 4, 2000, 0.8, 0.95, 1, api_name="/generate")
            deadline = time.monotonic() + 120
            while not any(o[0]["samples"] and any(s["text"] for s in o[0]["samples"]) for o in job.outputs()):
                assert time.monotonic() < deadline, "the columns did not start streaming"
                time.sleep(0.2)
            assert not job.done()
        took = sigterm_and_wait_gone(process, mark)
        print(
            f"{engine} ({'streaming' if running else 'idle'}): every process gone {took:.1f} s after SIGTERM"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(mark)
        process.wait()


@pytest.mark.timeout(300)
def test_python_m_backend_stops_the_server_it_launched_on_sigterm(tmp_path: Path) -> None:
    """`python -m backend --engine auto`, the backend alone, sent SIGTERM (`kill`, systemd, `docker
    stop`): it exits and the SGLang server it launched in a session of its own (the stand-in, ignoring
    SIGTERM as a stuck server would) is gone too, rather than left running with its memory."""
    _, env = ENGINES["auto-launched-server"]
    mark = f"backend-alone-{os.getpid()}-{time.monotonic_ns()}"
    env = {key: value or str(tmp_path / "cache") for key, value in env.items()}
    process, _ = start_backend(tmp_path, "auto", mark, **env)
    try:
        assert any(launched_server(command) for _, command in marked(mark)), marked(mark)
        took = sigterm_and_wait_gone(process, mark)
        assert process.wait(5) == 0, (tmp_path / "backend.log").read_text()
        print(f"python -m backend: it and its launched server gone {took:.1f} s after SIGTERM")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(mark)
        process.wait()


def launched_server(command: str) -> bool:
    """Whether `command` is a launched SGLang server's own (not its keeper's, whose line holds it)."""
    return command.startswith(f"{sys.executable} -m sglang.launch_server")


def group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(proc.name))
    return found


def recorded(cache: Path) -> list[int]:
    """The process groups of the SGLang servers recorded as launched under the cache folder `cache`."""
    folder = cache / "parallel-sampling-dashboard" / "launched"
    return [json.loads(path.read_text())["pid"] for path in folder.glob("sglang-*.json")]


def sigkill_and_wait_gone(process: subprocess.Popen[bytes], mark: str, groups: list[int]) -> float:
    """SIGKILL `process` and wait until nothing of it is left: no process carrying `mark`, none in
    `groups`; fail past KILLED_GONE_S. The seconds that took."""
    signalled = time.monotonic()
    process.kill()
    process.wait()
    while left := marked(mark) + [(pid, f"group {pgid}") for pgid in groups for pid in group(pgid)]:
        took = time.monotonic() - signalled
        assert took < KILLED_GONE_S, f"still running {took:.1f} s after SIGKILL: {left}"
        time.sleep(0.05)
    return time.monotonic() - signalled


def start_backend(tmp_path: Path, engine: str, mark: str, **env: str) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m backend --engine ENGINE` in a session of its own, once its engine is ready: the
    process and its port."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", MARK: mark, **env}
    port = free_port()
    command = [sys.executable, "-m", "backend", "--engine", engine, "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with (tmp_path / "backend.log").open("ab") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    wait_for_http(f"http://127.0.0.1:{port}/health", process, 240)
    wait_engine_ready(process, port)
    return process, port


def run_blocking(url: str) -> None:
    """A blocking-consumer run through the page (it runs on the experiment server's loop), to the end."""
    from gradio_client import Client

    blocking = ("blocking", 5, "n", "raw", "")  # consumer, block ms, fan-out, format, system prompt
    client = Client(url, verbose=False)
    final = client.predict("Once upon a time", 2, 8, 0.8, 0.95, 1, *blocking, api_name="/generate")
    assert final[0]["samples"] and all(sample["text"] for sample in final[0]["samples"]), final


KILLED = {
    "auto-launched-server": "auto-launched-server",
    "embedded-and-experiments": "embedded",
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(KILLED))
def test_python_m_backend_killed_outright_leaves_nothing(tmp_path: Path, case: str) -> None:
    """SIGKILL to `python -m backend`: the SGLang server it launched (the stand-in, ignoring SIGTERM,
    with its scheduler child), or the embedded engine's process with the experiment server started,
    gone within KILLED_GONE_S."""
    name, env = ENGINES[KILLED[case]]
    env = {key: value or str(tmp_path / "cache") for key, value in env.items()}
    mark = f"killed-backend-{case}-{os.getpid()}-{time.monotonic_ns()}"
    process, port = start_backend(tmp_path, name, mark, **env)
    try:
        children = marked(mark)
        groups = [process.pid]
        if name == "auto":
            assert any(launched_server(command) for _, command in children), children
            groups += recorded(tmp_path / "cache")
            assert len(groups) == 2, groups
        else:
            assert any("backend.engines.embedded.child" in command for _, command in children), children
            assert backend_health(port)["experiment_url"], backend_health(port)
        took = sigkill_and_wait_gone(process, mark, groups)
        print(f"python -m backend ({case}) killed: every process gone {took:.1f} s after SIGKILL")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(mark)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(KILLED))
def test_app_py_killed_outright_leaves_nothing(tmp_path: Path, case: str) -> None:
    """SIGKILL to app.py while a request streams: its backend, the engine's process or the launched
    server (the stand-in ignoring SIGTERM) gone within KILLED_GONE_S; with the embedded engine after a
    blocking-consumer run on the experiment server."""
    from gradio_client import Client

    name, env = ENGINES[KILLED[case]]
    env = {key: value or str(tmp_path / "cache") for key, value in env.items()}
    mark = f"killed-app-{case}-{os.getpid()}-{time.monotonic_ns()}"
    process, url = start_app(tmp_path, name, mark, **env)
    try:
        groups = [process.pid] + (recorded(tmp_path / "cache") if name == "auto" else [])
        if name == "embedded":
            run_blocking(url)
        job = Client(url, verbose=False).submit(LONG_PROMPT, 4, 2000, 0.8, 0.95, 1, api_name="/generate")
        deadline = time.monotonic() + 120
        while not any(o[0]["samples"] and any(s["text"] for s in o[0]["samples"]) for o in job.outputs()):
            assert time.monotonic() < deadline, "the columns did not start streaming"
            time.sleep(0.2)
        took = sigkill_and_wait_gone(process, mark, groups)
        print(f"app.py ({case}) killed while streaming: every process gone {took:.1f} s after SIGKILL")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(mark)


LEAVE_A_SERVER = """
import os, subprocess, sys
from pathlib import Path
from backend.engines.http import launched
server = subprocess.Popen(
    [sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--port", sys.argv[2]],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
launched.record(Path(sys.argv[1]), server.pid, int(sys.argv[2]), "m")
print(server.pid, flush=True)
if sys.argv[3] == "stay":
    sys.stdin.read()
"""
"""A backend of an earlier run, as a killed one without the keeper left it: it starts an SGLang
server (the stand-in, ignoring SIGTERM) in a session of its own, records it as the launcher does,
prints its pid and exits ("leave") or stays until its stdin closes ("stay")."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("earlier", ["gone", "running"])
def test_a_start_finds_an_earlier_runs_server_and_says_so(tmp_path: Path, earlier: str) -> None:
    """A server left by an earlier run whose backend is gone is stopped before `--engine auto`
    launches its own, and the engine line says so; one whose backend still runs (another dashboard)
    is named with what to do, and left running."""
    _, env = ENGINES["auto-launched-server"]
    env = {key: value or str(tmp_path / "cache") for key, value in env.items()}
    mark = f"orphan-{earlier}-{os.getpid()}-{time.monotonic_ns()}"
    folder = tmp_path / "cache" / "parallel-sampling-dashboard" / "launched"
    stay = "stay" if earlier == "running" else "leave"
    leaver = subprocess.Popen(
        [sys.executable, "-c", LEAVE_A_SERVER, str(folder), str(free_port()), stay],
        cwd=ROOT,
        env={**os.environ, **env, MARK: mark},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert leaver.stdout is not None
    left = int(leaver.stdout.readline())
    if earlier == "gone":
        assert leaver.wait(30) == 0
    process = None
    try:
        assert group(left), "the earlier run's server is not running"
        process, port = start_backend(tmp_path, "auto", mark, **env)
        notice = backend_health(port)["notice"]
        assert f"pid {left}, port" in notice, notice
        if earlier == "gone":
            assert "left running by an earlier run of this dashboard" in notice, notice
            assert "was stopped before this start" in notice, notice
            assert not group(left), "the orphan still runs"
        else:
            assert "another dashboard that still runs" in notice and f"kill {leaver.pid}" in notice, notice
            assert group(left), "another running dashboard's server was stopped"
        print(f"engine line: {notice}")
    finally:
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(left, signal.SIGKILL)
        leaver.kill()
        leaver.wait()
        kill_marked(mark)

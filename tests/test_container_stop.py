"""app.py stopped as a container platform stops it: SIGTERM, then SIGKILL 10 s later (a Space,
`docker stop`). With each engine this CPU can run without SGLang (synthetic, the embedded model, and
`--engine auto` launching a server: the stand-in of tests/support/fake_sglang_server, here one that
ignores SIGTERM as a server stuck in its shutdown would), idle and while a request streams, every
process app.py started must be gone within CONTAINER_GRACE_S of the signal. Each stop's time is
printed. The same with real SGLang (launched and in-process) is in tests/test_engines_real.py.
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
    deadline = time.monotonic() + 240
    while (state := backend_health(backend_port)["engine_state"]) == "starting":
        assert time.monotonic() < deadline and process.poll() is None, "the engine did not start"
        time.sleep(0.5)
    assert state == "ready", backend_health(backend_port)
    return process, url


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
            assert any("sglang.launch_server" in command for _, command in children), children
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
    env = {**os.environ, **env, "GRADIO_ANALYTICS_ENABLED": "False", MARK: mark}
    port = free_port()
    command = [sys.executable, "-m", "backend", "--engine", "auto", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--no-trace"]
    with (tmp_path / "backend.log").open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", process, 240)
        assert backend_health(port)["engine_state"] == "ready", backend_health(port)
        launched = [pid for pid, command in marked(mark) if "sglang.launch_server" in command]
        assert launched, marked(mark)
        took = sigterm_and_wait_gone(process, mark)
        assert process.wait(5) == 0, (tmp_path / "backend.log").read_text()
        print(f"python -m backend: it and its launched server gone {took:.1f} s after SIGTERM")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        kill_marked(mark)
        process.wait()

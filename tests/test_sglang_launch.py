"""The launched SGLang server's life, with a stand-in server (tests/support/fake_sglang_server): a port
that another program takes before the server binds it given up for a fresh one, its log rotated and
its handle closed, the first start's longer time limit said on the page while it
counts, and a server whose scheduler dies ending the requests it ran with the cause."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

import backend.engines.http.sglang_launch as launch
from backend.engines.http.sglang import SGLangEngine
from backend.engines.http.sglang_launch import (
    FIRST_START_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    SGLangServerProcess,
    exit_words,
)
from backend.frames import generate_frame
from devkit.frames import recv_frame
from devkit.local import ROOT
from tests.support.backends import serving
from tests.support.wire import until_done
from ui.engine_info import engine_line_now

STAND_IN = ROOT / "tests" / "support" / "fake_sglang_server"


def stand_in_server(tmp_path: Path, **env: str) -> SGLangServerProcess:
    """The launcher, running the stand-in server, its log under `tmp_path`."""
    cache = tmp_path / "jit"
    cache.mkdir(exist_ok=True)
    (cache / "built").write_text("")  # not a first start
    return SGLangServerProcess(
        "stand-in/model",
        extra_args=["--log-level", "warning"],
        env={"PYTHONPATH": str(STAND_IN), "SGLANG_JIT_CACHE_DIR": str(cache), **env},
        log_path=tmp_path / "logs" / "sglang-server.log",
        start_timeout=None,
    )


def open_files(path: Path) -> list[str]:
    """This process's descriptors open on `path` or its rotated copy."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def model_info(url: str) -> object:
    """What the server at `url` answers to GET /model_info."""
    with urllib.request.urlopen(url + "/model_info", timeout=5) as response:
        return json.load(response)


def children(pid: int) -> list[str]:
    """The child process ids of `pid`, from /proc."""
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def test_the_server_log_is_rotated_and_its_handle_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "LOG_MAX_BYTES", 20_000)
    server = stand_in_server(tmp_path, FAKE_SGLANG_LOG_LINES="2000")  # ~180 KB of output
    server.start(timeout=60)
    try:
        deadline = time.monotonic() + 30
        while "log line 1999" not in server.log_tail(5):
            assert time.monotonic() < deadline, server.log_tail(5)
            time.sleep(0.2)
    finally:
        server.stop()
    log = server.log_path
    assert log is not None
    sizes = [log.stat().st_size, log.with_name(log.name + ".1").stat().st_size]
    assert all(size <= 20_000 for size in sizes), sizes
    assert sorted(p.name for p in log.parent.iterdir()) == ["sglang-server.log", "sglang-server.log.1"]
    assert open_files(log) == []  # the copying thread closed the log when the server's output ended


async def test_a_port_another_program_takes_first_is_given_up_for_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chosen port was free, but another program binds it before the server does: a dashboard
    backend (it answers /health with 200, as SGLang does), then a listener that answers nothing. The
    launcher does not take either for SGLang: it starts the server again on the next port, the log
    saying why, and the engine streams from the server there."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen()
    launcher = stand_in_server(tmp_path)
    free = launch.free_port
    next_ports = iter([mute.getsockname()[1]])
    monkeypatch.setattr(launch, "free_port", lambda: next(next_ports, None) or free())
    try:
        async with serving() as other:
            taken = [other.port, mute.getsockname()[1]]
            launcher.port = other.port
            async with serving(SGLangEngine(launcher.url, launcher=launcher), background=True) as server:
                await server.engine_settled()
                health = server.health()
                assert health["engine_state"] == "ready" and health["model"] == "stand-in/model", health
                assert launcher.port not in taken and health["server"] == launcher.url, health
                async with connect(server.url) as ws:
                    frame = generate_frame("a", "Hi", 2, format="raw")
                    await ws.send(json.dumps(frame | {"params": {"max_tokens": 3}}))
                    frames = await until_done(ws, limit_s=None)
    finally:
        mute.close()
    texts = ["".join(f["text"] for f in frames if f["type"] == "chunk" and f["index"] == i) for i in (0, 1)]
    assert texts == [" w1 w2 w3"] * 2, frames  # the stand-in's three words, in both columns
    log = launcher.log_tail(100)
    other_said = "GET /model_info answered HTTP 404; GET /v1/models answered HTTP 404"
    assert f"port {taken[0]} is held by another program ({other_said})" in log, log
    assert f"port {taken[1]} is held by another program (a program listening there)" in log, log


def test_a_server_started_with_an_api_key_is_known_for_sglang_through_it(tmp_path: Path) -> None:
    """SGLang with --api-key answers /model_info only with the key: the launcher sends it (from the
    flags it starts the server with), and takes a refusal of another key for SGLang, not a stranger."""
    server = stand_in_server(tmp_path)
    server.extra_args += ["--api-key", "k-1"]
    server.api_key = launch.api_key_of(server.extra_args)
    assert server.api_key == "k-1" and launch.api_key_of(["--api-key=k-2", "--port", "1"]) == "k-2"
    assert launch.api_key_of(["--api-key-file", "f"]) is None
    server.start(timeout=60)
    try:
        assert launch.port_holder(server.url, "k-1") is None
        assert launch.port_holder(server.url, "wrong") is None
        with pytest.raises(urllib.error.HTTPError) as refused:
            model_info(server.url)
        assert refused.value.code == 401
    finally:
        server.stop()
    assert "held by another program" not in server.log_tail(100)


def test_a_free_port_is_picked_under_the_ports_the_kernel_hands_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, _ = launch.ephemeral_ports()
    picked = {launch.free_port() for _ in range(20)}
    assert all(low - launch.PICKED_PORTS <= port < low for port in picked), (low, picked)
    assert len(picked) > 1
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked.pop()))
    no_room = tmp_path / "ip_local_port_range"
    no_room.write_text("1024\t65535\n")
    monkeypatch.setattr(launch, "EPHEMERAL_RANGE_FILE", no_room)
    assert launch.ephemeral_ports() == (1024, 65535)
    assert 1024 <= launch.free_port() <= 65535


async def test_a_launcher_whose_every_port_is_taken_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving() as backend:
        monkeypatch.setattr(launch, "free_port", lambda: backend.port)
        server = stand_in_server(tmp_path)
        server.port = backend.port
        with pytest.raises(RuntimeError) as raised:
            await asyncio.to_thread(server.start, 60)
    assert server.process is None
    said = str(raised.value)
    assert said.startswith("the SGLang server could not keep a port: another program took each one first")
    assert said.count(f"port {backend.port}: GET /model_info answered HTTP 404") == launch.PORT_ATTEMPTS


def test_a_first_start_gets_longer_and_a_given_limit_stays(tmp_path: Path) -> None:
    empty = tmp_path / "empty-jit"
    empty.mkdir()
    first = SGLangServerProcess("m", env={"SGLANG_JIT_CACHE_DIR": str(empty)}, start_timeout=None)
    assert first.first_start and first.start_timeout == FIRST_START_TIMEOUT_S
    (empty / "kernel.so").write_text("")
    again = SGLangServerProcess("m", env={"SGLANG_JIT_CACHE_DIR": str(empty)}, start_timeout=None)
    assert not again.first_start and again.start_timeout == STARTUP_TIMEOUT_S
    given = SGLangServerProcess("m", env={"SGLANG_JIT_CACHE_DIR": str(tmp_path / "none")}, start_timeout=42)
    assert not given.first_start and given.start_timeout == 42


async def test_the_page_says_how_long_a_first_start_may_take_while_it_counts(tmp_path: Path) -> None:
    never_ready = tmp_path / "never-ready"
    never_ready.write_text("#!/bin/sh\nexec sleep 600\n")
    never_ready.chmod(0o755)
    cache = tmp_path / "jit"
    cache.mkdir()
    launcher = SGLangServerProcess(
        "org/model",
        python=str(never_ready),
        env={"SGLANG_JIT_CACHE_DIR": str(cache)},
        log_path=tmp_path / "server.log",
        start_timeout=None,
    )
    async with serving(SGLangEngine(launcher.url, launcher=launcher), background=True) as server:
        await asyncio.sleep(1.5)
        line, starting = await engine_line_now(server.url)
    assert starting and "starting an SGLang server for org/model" in line, line
    assert f"s of at most {FIRST_START_TIMEOUT_S:g} s (a first start: SGLang compiles its kernels" in line, (
        line
    )


def test_exit_statuses_in_words() -> None:
    assert exit_words(-9) == "killed by SIGKILL" and exit_words(1) == "exit status 1"


async def test_a_launched_server_whose_scheduler_dies_ends_its_requests_with_the_cause(
    tmp_path: Path,
) -> None:
    launcher = stand_in_server(tmp_path)
    async with serving(SGLangEngine(launcher.url, launcher=launcher), background=True) as server:
        await server.engine_settled()
        assert server.health()["engine_state"] == "ready", server.health()
        async with connect(server.url) as ws:
            frame = generate_frame("a", "Hi", 3, format="raw")
            await ws.send(json.dumps(frame | {"params": {"max_tokens": 2000}}))
            while (await recv_frame(ws))["type"] != "chunk":
                pass
            assert launcher.process is not None
            (server_pid,) = children(launcher.process.pid)  # under its keeper
            (scheduler,) = children(int(server_pid))
            killed_at = time.monotonic()
            os.kill(int(scheduler), signal.SIGKILL)
            frames = await until_done(ws, limit_s=None)
            ended_in = time.monotonic() - killed_at
            finishes = [f for f in frames if f["type"] == "finish"]
            assert sorted((f["index"], f["reason"]) for f in finishes) == [
                (0, "error"),
                (1, "error"),
                (2, "error"),
            ]
            causes = {f["engine"]["error"] for f in finishes}
            assert all("the SGLang server it started exited (exit status 1)" in c for c in causes), causes
            assert all("crashed with exit code -9" in c for c in causes), causes
            assert ended_in < 5, ended_in
            await ws.send(json.dumps(generate_frame("b", "Hi", 1, format="raw")))
            refused = await recv_frame(ws, 10)
        deadline = time.monotonic() + 5
        while server.health()["engine_state"] != "lost":
            assert time.monotonic() < deadline, server.health()
            await asyncio.sleep(0.2)
        line, _ = await engine_line_now(server.url)
    assert (
        line.startswith("⚠️") and "stopped working while serving: the SGLang server it started exited" in line
    )
    assert "Subprocess scheduler_0" in line and "crashed with exit code -9" in line, line
    assert refused["type"] == "error" and refused["code"] in ("engine_not_ready", "engine_error"), refused

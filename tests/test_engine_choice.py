"""`--engine auto`'s choice, and the command line's engine flags."""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import pytest

from backend.engines import ENGINES
from backend.engines.auto import choose_engine
from backend.engines.flags import add_engine_arguments, engine_from_args
from backend.engines.http.openai import OpenAIEngine
from backend.engines.http.sglang import SGLangEngine
from backend.engines.http.sglang_launch import SGLangServerProcess

WITH_EMBEDDED = ("synthetic", "embedded", "sglang", "openai")
WITHOUT_EMBEDDED = ("synthetic", "sglang", "openai")


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"sglang_url": "http://h:30000", "cuda": True, "sglang_importable": True}, ("sglang", False)),
        ({"sglang_url": "http://h:30000", "openai_url": "http://o:8000"}, ("sglang", False)),
        ({"openai_url": "http://o:8000", "cuda": True, "sglang_importable": True}, ("openai", False)),
        ({"cuda": True, "sglang_importable": True}, ("sglang", True)),
        ({"cuda": True, "sglang_importable": False}, ("embedded", False)),
        ({"cuda": False, "sglang_importable": True}, ("embedded", False)),
        ({}, ("embedded", False)),
    ],
)
def test_auto_choice(facts: dict, expected: tuple[str, bool]) -> None:
    args = {"sglang_url": "", "openai_url": "", "cuda": False, "sglang_importable": False, **facts}
    choice = choose_engine(**args, registered=WITH_EMBEDDED)
    assert (choice.name, choice.launch_sglang) == expected
    assert choice.why


def test_auto_falls_back_to_synthetic_only_without_the_embedded_engine() -> None:
    facts = {"sglang_url": "", "openai_url": "", "cuda": False, "sglang_importable": False}
    assert choose_engine(**facts, registered=WITHOUT_EMBEDDED).name == "synthetic"
    assert choose_engine(**facts, registered=WITH_EMBEDDED).name == "embedded"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser.parse_args(argv)


def test_auto_is_the_default_and_every_engine_is_a_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DASHBOARD_ENGINE", raising=False)
    assert parse([]).engine == "auto"
    for name in ("sglang", "sglang-engine", "openai", "synthetic"):
        assert name in ENGINES
        assert parse(["--engine", name]).engine == name


def test_a_server_url_makes_auto_pick_that_servers_engine() -> None:
    engine = engine_from_args(parse(["--sglang-url", "http://127.0.0.1:30001/"]))
    assert isinstance(engine, SGLangEngine) and engine.url == "http://127.0.0.1:30001"
    engine = engine_from_args(parse(["--openai-url", "http://127.0.0.1:8001/v1", "--model", "m"]))
    assert isinstance(engine, OpenAIEngine) and engine.url == "http://127.0.0.1:8001"
    assert engine.requested_model == "m"


def test_api_keys_come_from_the_environment_or_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", "from-env")
    monkeypatch.setenv("OPENAI_API_KEY", "openai-env")
    engine = engine_from_args(parse(["--sglang-url", "http://127.0.0.1:30001"]))
    assert isinstance(engine, SGLangEngine) and engine.api_key == "from-env"
    assert engine.client.headers["Authorization"] == "Bearer from-env"
    engine = engine_from_args(parse(["--sglang-url", "http://h:1", "--sglang-api-key", "from-flag"]))
    assert engine.api_key == "from-flag"  # type: ignore[attr-defined]
    engine = engine_from_args(parse(["--openai-url", "http://127.0.0.1:8001"]))
    assert isinstance(engine, OpenAIEngine) and engine.api_key == "openai-env"
    monkeypatch.delenv("SGLANG_API_KEY")
    engine = engine_from_args(parse(["--sglang-url", "http://h:1"]))
    assert "Authorization" not in engine.client.headers  # type: ignore[attr-defined]


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="http://"):
        engine_from_args(parse(["--engine", "sglang", "--sglang-url", "127.0.0.1:30000"]))


def test_a_launched_server_that_fails_to_start_is_quoted_from_its_log(tmp_path: Path) -> None:
    """Here SGLang is not installed, so `python -m sglang.launch_server` fails as a broken install
    would: the error quotes the end of the server's own output instead of only its exit status."""
    server = SGLangServerProcess("some/model", log_path=tmp_path / "logs" / "sglang-server.log")
    with pytest.raises(RuntimeError) as caught:
        server.start(timeout=60)
    message = str(caught.value)
    assert "exited with 1 while starting" in message and "No module named" in message
    assert str(tmp_path / "logs" / "sglang-server.log") in message


def slow_server(tmp_path: Path) -> SGLangServerProcess:
    """A launcher whose "server" is a process that never answers /health (a slow first start)."""
    never_ready = tmp_path / "never-ready"
    never_ready.write_text("#!/bin/sh\nexec sleep 600\n")
    never_ready.chmod(0o755)
    return SGLangServerProcess("some/model", python=str(never_ready), log_path=tmp_path / "server.log")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_launched_server_slower_than_the_wait_is_stopped(tmp_path: Path) -> None:
    server = slow_server(tmp_path)
    with pytest.raises(TimeoutError, match="did not answer /health within 2 s"):
        server.start(timeout=2)
    assert server.process is None


def test_stopping_while_the_server_starts_ends_it_and_the_start(tmp_path: Path) -> None:
    server = slow_server(tmp_path)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start(timeout=120)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 10
    while server.process is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = server.process.pid
    server.stop()
    starting.join(10)
    assert not starting.is_alive() and "stopped while it started" in str(errors[0])
    assert not process_alive(pid)


def test_auto_on_a_gpu_launches_sglang_with_the_flags_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `--engine auto` starts where it takes the GPU path (assumed here, as the CPU tests do)."""
    monkeypatch.setenv("DASHBOARD_ASSUME_CUDA", "1")
    monkeypatch.setattr("backend.engines.auto.sglang_importable", lambda: True)
    monkeypatch.setenv("SGLANG_SERVER_ARGS", "--tp-size 2 --mem-fraction-static 0.8")
    monkeypatch.setenv("SGLANG_API_KEY", "k")
    argv = ["--model", "org/model", "--sglang-start-timeout", "1200"]
    engine = engine_from_args(parse(argv))
    assert isinstance(engine, SGLangEngine) and engine.launcher is not None
    command = engine.launcher.command()
    assert command[command.index("--model-path") + 1] == "org/model"
    ours = ["--incremental-streaming-output", "--sleep-on-idle", "--log-level", "warning"]
    assert command[-8:] == [*ours, "--tp-size", "2", "--mem-fraction-static", "0.8"]
    assert engine.launcher.start_timeout == 1200 and engine.api_key == "k"
    assert engine.url == engine.launcher.url


def test_unreadable_server_flags_are_said_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASHBOARD_ASSUME_CUDA", "1")
    monkeypatch.setattr("backend.engines.auto.sglang_importable", lambda: True)
    with pytest.raises(ValueError, match=r"--sglang-server-args .* cannot be read"):
        engine_from_args(parse(["--sglang-server-args", "--chat-template 'unclosed"]))

"""The smoke tier of `make gpu-check`: each SGLang engine once, through the backend's websocket.

For each engine (`--engine auto`, which launches an SGLang server on a machine whose GPU SGLang can
use, then `--engine sglang-engine`, SGLang in the backend's process) it starts `python -m backend`
with this Python on the local model, waits for the engine, sends one chat request of n samples and
prints each sample's finish, tokens, tokens/s and text, then stops the backend (and what it
started). It passes where every sample of both answered with text; the full suite runs after it.

The engines take their SGLang settings from the environment, as app.py does
(`SGLANG_SERVER_ARGS`, `SGLANG_ENGINE_ARGS`), so the same script runs on SGLang's CPU build in
tests (tests/test_gpu_check.py).

Usage: python -m scripts.gpu_smoke --model FOLDER [--n 4] [--max-tokens 96] [--engines auto,sglang-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from backend.frames import generate_frame
from devkit.frames import recv_frame
from devkit.local import ROOT, free_port, start_logged, stop_process_group

PROMPT = "Name three colours and say something about each."
"""One chat turn every sample answers in a few sentences."""

START_LIMIT_S = 600.0
"""How long one engine may take to start: a first start on a GPU compiles SGLang's kernels."""

LOG_LINES = 15
"""Lines of a backend's log printed where it did not come up."""

FRAME_LIMIT_S = 120.0
"""Longest wait for one websocket frame."""

ENGINE_WORDS = {
    "auto": "an SGLang server launched by --engine auto",
    "sglang-engine": "SGLang in the backend's process (--engine sglang-engine)",
}


def health(port: int) -> dict[str, Any]:
    """The backend's /health."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.loads(response.read())


def wait_engine(port: int, limit_s: float) -> dict[str, Any]:
    """/health once the engine's start has ended, ready or failed; TimeoutError past `limit_s`."""
    deadline = time.monotonic() + limit_s
    while (found := health(port))["engine_state"] == "starting":
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the engine did not start within {limit_s:g} s: {found.get('loading_status')}"
            )
        time.sleep(1.0)
    return found


async def one_request(port: int, n: int, max_tokens: int) -> dict[int, dict[str, Any]]:
    """Each sample's text and finish frame for one chat request of `n` samples."""
    samples: dict[int, dict[str, Any]] = {i: {"text": ""} for i in range(n)}
    params = {"max_tokens": max_tokens, "temperature": 0.7, "top_p": 0.95}
    frame = generate_frame("smoke", PROMPT, n, params)
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        await ws.send(json.dumps(frame))
        while True:
            got = await recv_frame(ws, FRAME_LIMIT_S)
            if got["type"] == "chunk":
                samples[got["index"]]["text"] += got["text"]
            elif got["type"] == "finish":
                samples[got["index"]]["finish"] = got
            elif got["type"] == "error":
                print(f"  error: {got.get('message')}")
            elif got["type"] == "done":
                return samples


def smoke(engine: str, model: str, n: int, max_tokens: int, logs: Path) -> bool:
    """Start the backend on `engine`, run one request, print what each sample did; whether all answered."""
    print(f"=== smoke: {ENGINE_WORDS.get(engine, engine)}, model {model}", flush=True)
    port = free_port()
    log = logs / f"backend-{engine}.log"
    command = [sys.executable, "-m", "backend", "--engine", engine, "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-trace"]
    started = time.monotonic()
    try:
        # `python -m backend` starts its engine before it listens: /health answers once it is up.
        process = start_logged(
            command, log, f"http://127.0.0.1:{port}/health", dict(os.environ), ROOT, START_LIMIT_S
        )
    except (RuntimeError, TimeoutError) as exc:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-LOG_LINES:])
        print(f"  the backend did not come up: {exc}; the end of its log ({log}):\n{tail}")
        return False
    try:
        found = wait_engine(port, START_LIMIT_S)
        took = time.monotonic() - started
        if found["engine_state"] != "ready":
            print(f"  the engine did not start ({took:.0f} s): {found.get('engine_error')}")
            print(f"  the backend's log: {log}")
            return False
        print(f"  ready in {took:.1f} s: {found.get('model')}", flush=True)
        asked = time.monotonic()
        samples = asyncio.run(one_request(port, n, max_tokens))
        print(f"  {n} samples in {time.monotonic() - asked:.2f} s")
        answered = True
        for index, sample in sorted(samples.items()):
            finish = sample.get("finish") or {}
            stats = finish.get("stats") or {}
            reason = finish.get("reason", "no finish")
            text = " ".join(sample["text"].split())
            print(
                f"  sample {index} [{reason}] {stats.get('tokens', 0)} tokens, "
                f"{stats.get('tokens_per_s') or 0:.1f} tok/s: {text[:300]!r}",
                flush=True,
            )
            answered = answered and reason in ("stop", "length") and bool(text)
        return answered
    except (OSError, TimeoutError, ValueError) as exc:
        print(f"  failed: {type(exc).__name__}: {exc}; the backend's log: {log}")
        return False
    finally:
        stop_process_group(process)


def main(argv: list[str] | None = None) -> int:
    """Run the smoke tier; exit status 0 where every engine's every sample answered."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the local model folder both engines load")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--engines", default="auto,sglang-engine", help="comma-separated, run in turn")
    parser.add_argument("--logs", type=Path, default=None, help="folder for the backends' logs")
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    logs.mkdir(parents=True, exist_ok=True)
    results = {
        engine: smoke(engine, args.model, args.n, args.max_tokens, logs) for engine in args.engines.split(",")
    }
    failed = [engine for engine, ok in results.items() if not ok]
    print(
        f"smoke {'passed' if not failed else 'FAILED'}: "
        + ", ".join(f"{engine} {'answered' if ok else 'failed'}" for engine, ok in results.items())
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

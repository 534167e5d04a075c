"""Memory of the whole dashboard (page, backend, embedded engine) idle and while streaming.

Starts `python app.py` on the embedded engine, reads the resident memory (RSS) of every process it
started from /proc, once the engine is ready and then every 0.2 s while the page's Generate streams
n samples of 256 tokens (through gradio_client, as a browser's request would). Prints each process
and the total, idle and at the peak. This is the figure to hold against a Space's memory
(`cpu-basic`: 16 GB).

Usage: python -m bench.memory [--n 32] [--max-tokens 256] [--model FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from devkit.local import ROOT, free_port, start_logged, stop_process_group


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return found


def rss_by_process(pid: int) -> dict[str, float]:
    """MB of resident memory of each process under `pid`, named by its command line."""
    out: dict[str, float] = {}
    for child in descendants(pid):
        try:
            status = Path(f"/proc/{child}/status").read_text()
            command = Path(f"/proc/{child}/cmdline").read_text().replace("\0", " ").strip()
        except OSError:
            continue
        kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        out[f"{process_name(command, child == pid)} [{child}]"] = kb / 1024
    return out


def process_name(command: str, is_app: bool) -> str:
    """What a process of the dashboard is, from its command line."""
    if is_app:
        return "page (app.py, Gradio)"
    for marker, name in (
        ("embedded.child", "embedded engine (model, scheduler)"),
        ("multiprocessing.spawn", "backend (websocket server, traced loop)"),
        ("multiprocessing.resource_tracker", "multiprocessing resource tracker"),
    ):
        if marker in command:
            return name
    return command[:50]


def wait_ready(backend_health: str, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(backend_health, timeout=2) as response:
                if json.loads(response.read()).get("engine_state") == "ready":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the engine did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    port, backend_port = free_port(), free_port()
    command = [sys.executable, str(ROOT / "app.py"), "--engine", "embedded", "--port", str(port)]
    command += ["--backend-port", str(backend_port), "--n-max", str(max(args.n, 1))]
    if args.model:
        command += ["--model", args.model]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    log = Path(tempfile.mkdtemp(prefix="bench-memory-")) / "app.log"
    app = start_logged(command, log, f"http://127.0.0.1:{port}/", env, limit_s=300)
    try:
        wait_ready(f"http://127.0.0.1:{backend_port}/health")
        from gradio_client import Client

        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        time.sleep(2)
        idle = rss_by_process(app.pid)
        peak: dict[str, float] = {}
        job = client.submit(
            "Write a long story about a dragon.", args.n, args.max_tokens, 0.8, 0.95, 1, api_name="/generate"
        )
        started = time.monotonic()

        def sample() -> None:
            while not job.done():
                now = rss_by_process(app.pid)
                if sum(now.values()) > sum(peak.values()):
                    peak.clear()
                    peak.update(now)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        job.result(timeout=600)
        sampler.join()
        elapsed = time.monotonic() - started
    finally:
        stop_process_group(app)
    print(f"n = {args.n} x {args.max_tokens} tokens, {elapsed:.1f} s; resident memory (MB):")
    print(f"{'process':<52} {'idle':>6} {'peak':>6}")
    for name in idle:
        print(f"{name:<52} {idle[name]:>6.0f} {peak.get(name, 0):>6.0f}")
    print(f"{'total':<52} {sum(idle.values()):>6.0f} {sum(peak.values()):>6.0f}")


if __name__ == "__main__":
    main()

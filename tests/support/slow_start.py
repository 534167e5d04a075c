"""A backend whose engine takes a while to start, as a model download does: `python -m
tests.support.slow_start --port P --start-s S [--fail REASON]`.

The engine is the synthetic one; its start sleeps `--start-s` seconds, saying how long is left in
/health's `loading_status`, then succeeds or, with `--fail`, fails with REASON. The server answers
/health and refuses requests (`engine_not_ready`) while it starts, as the real engines' backends do.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Any

from backend.config.settings import ServerOptions
from backend.engines.synthetic import SyntheticEngine
from backend.serving.servers import Servers
from devkit.local import ROOT, stop_process, wait_for_http


class SlowStartEngine(SyntheticEngine):
    """Synthetic text after a start of `start_s` seconds that fails with `failure` if given."""

    def __init__(self, start_s: float, failure: str = "", rate: float = 20.0) -> None:
        super().__init__(rate=rate)
        self.start_s = start_s
        self.failure = failure
        self._ready_at: float | None = None

    async def start(self) -> None:
        self._ready_at = time.monotonic() + self.start_s
        await asyncio.sleep(self.start_s)
        if self.failure:
            raise RuntimeError(self.failure)

    def health(self) -> dict[str, Any]:
        left = 0.0 if self._ready_at is None else max(0.0, self._ready_at - time.monotonic())
        return {**super().health(), "loading_status": f"downloading weights, {left:.0f} s left"}


async def serve(port: int, start_s: float, failure: str, rate: float) -> None:
    """Serve on 127.0.0.1:`port` until killed, the engine starting in the background."""
    servers = Servers(SlowStartEngine(start_s, failure, rate), ServerOptions(host="127.0.0.1", port=port))
    await servers.start(engine_in_background=True)
    try:
        await asyncio.Future()
    finally:
        await servers.close()


def start_slow_backend(port: int, start_s: float, failure: str = "") -> subprocess.Popen[bytes]:
    """This module's backend in a process of its own on `port`, once its /health answers (its
    engine then still starting)."""
    command = [
        sys.executable,
        "-m",
        "tests.support.slow_start",
        "--port",
        str(port),
        "--start-s",
        str(start_s),
    ]
    process = subprocess.Popen([*command, *(["--fail", failure] if failure else [])], cwd=ROOT)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", process, limit_s=60)
    except BaseException:
        stop_process(process)
        raise
    return process


def main() -> None:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.slow_start")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--start-s", type=float, required=True)
    parser.add_argument("--fail", default="", help="fail the start with this reason")
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.start_s, args.fail, args.rate))


if __name__ == "__main__":
    main()

"""A stand-in SGLang server: the HTTP calls the dashboard's `sglang` engine makes, on stdlib only.

`python -m sglang.launch_server --model-path M --host H --port P [...]` with this folder on
PYTHONPATH: /health, /model_info, /server_info (incremental streaming output), and /generate
streaming one incremental word per sample every 0.1 s for max_new_tokens words. Like SGLang's
server, it runs a "scheduler" child process in its process group and exits when that child dies
(SGLang's SubprocessWatchdog). With FAKE_SGLANG_IGNORE_SIGTERM=1 it ignores SIGTERM, as a server
stuck in its shutdown would; FAKE_SGLANG_LOG_LINES=N prints N log lines at start. With
`--api-key K` every path but /health wants `Authorization: Bearer K`, as SGLang's do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_S = 0.1


class Handler(BaseHTTPRequestHandler):
    model = ""
    api_key = ""

    def refused(self) -> bool:
        """With --api-key, as SGLang: every path but /health wants the key (HTTP 401 without it)."""
        if self.api_key and self.path != "/health":
            if self.headers.get("Authorization") != f"Bearer {self.api_key}":
                self.reply(401, {"error": "Unauthorized"})
                return True
        return False

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.refused():
            return
        if self.path == "/health":
            self.reply(200, {})
        elif self.path == "/model_info":
            self.reply(200, {"model_path": self.model})
        elif self.path == "/server_info":
            self.reply(200, {"incremental_streaming_output": True})
        else:
            self.reply(404, {"message": "not found"})

    def do_POST(self) -> None:
        if self.refused():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path == "/abort_request":
            self.reply(200, {})
            return
        if self.path != "/generate":
            self.reply(404, {"message": "not found"})
            return
        sampling = body.get("sampling_params", {})
        n, steps = int(sampling.get("n", 1)), int(sampling.get("max_new_tokens", 16))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for step in range(1, steps + 1):
                for index in range(n):
                    done = "length" if step == steps else None
                    meta = {"id": f"r{id(self)}-{index}", "completion_tokens": step}
                    meta["finish_reason"] = {"type": done} if done else None
                    event = {"text": f" w{step}", "index": index, "meta_info": meta}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                time.sleep(STEP_S)
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass


def watch(scheduler: subprocess.Popen) -> None:
    code = scheduler.wait()
    print(f"Subprocess scheduler_0 (pid={scheduler.pid}) crashed with exit code {code}.", flush=True)
    os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default="")
    args, _ = parser.parse_known_args()
    if os.environ.get("FAKE_SGLANG_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for i in range(int(os.environ.get("FAKE_SGLANG_LOG_LINES", "0"))):
        print(f"[stand-in] log line {i} " + "x" * 80, flush=True)
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10**6)",
        ]
        if os.environ.get("FAKE_SGLANG_IGNORE_SIGTERM") == "1"
        else [sys.executable, "-c", "import time; time.sleep(10**6)"]
    )
    threading.Thread(target=watch, args=(scheduler,), daemon=True).start()
    Handler.model = args.model_path
    Handler.api_key = args.api_key
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"stand-in SGLang serving {args.model_path} at {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""A local stand-in for the Hugging Face Hub's file API, serving model folders from disk.

The hub cannot be reached from the test machines; `huggingface_hub` honours `HF_ENDPOINT`, so a
process started with `HF_ENDPOINT=http://127.0.0.1:PORT` downloads from here instead, through the
same client code a Space runs. It answers what `snapshot_download` and `hf_hub_download` ask:

- `GET /api/models/{repo}/revision/{revision}`: the repo's commit and file list;
- `GET /api/models/{repo}/tree/{revision}`: every file with its size and blob id;
- `HEAD` and `GET /{repo}/resolve/{revision}/{path}`: a file, with the commit, ETag and size headers
  the client checks (byte ranges too, for resumed downloads).

Anything else is a 404 with the hub's error headers. `requests` lists the paths asked, so a test can
see that a second start downloaded nothing. A file named in `held` trickles (a byte every quarter
second, so the client's read timeout never fires) until `release()`, so a test can see a download
while it runs however slowly the machine starts the client.
Run alone: `python -m tests.support.hub_standin REPO=FOLDER`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    """The git blob id (sha1 of "blob LEN\\0" + content), which the hub reports as a file's oid."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubRepo:
    """One model repo: a folder's files (read once), under one commit id."""

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.files = {
            p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
        }
        self.blob_ids = {name: git_blob_id(data) for name, data in self.files.items()}
        digest = hashlib.sha1(json.dumps(sorted(self.blob_ids.items())).encode()).hexdigest()
        self.commit = digest

    def info(self) -> dict[str, object]:
        return {
            "id": self.repo_id,
            "modelId": self.repo_id,
            "sha": self.commit,
            "private": False,
            "disabled": False,
            "gated": False,
            "siblings": [{"rfilename": name} for name in self.files],
        }

    def tree(self) -> list[dict[str, object]]:
        return [
            {"type": "file", "oid": self.blob_ids[name], "size": len(data), "path": name}
            for name, data in self.files.items()
        ]


class HubStandIn:
    """The stand-in server on 127.0.0.1, on a thread; `endpoint` is the value for HF_ENDPOINT."""

    def __init__(
        self, repos: dict[str, Path], held: tuple[str, ...] = (), hold_limit_s: float = 300.0
    ) -> None:
        """`held`: file names whose bodies trickle until `release()` (or `hold_limit_s` passes)."""
        self.repos = {repo_id: HubRepo(repo_id, folder) for repo_id, folder in repos.items()}
        self.held = set(held)
        self.hold_limit_s = hold_limit_s
        self.released = threading.Event()
        self.requests: list[str] = []
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub stand-in", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubStandIn:
        self._thread.start()
        return self

    def release(self) -> None:
        """Let the held files' bodies go at full speed."""
        self.released.set()

    def stop(self) -> None:
        """Stop serving (a second call does nothing): the port then refuses, as an unreachable hub."""
        self.released.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read `hub.requests` instead."""

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _find(self, parts: list[str]) -> tuple[HubRepo | None, list[str]]:
        for length in (2, 1):
            repo = self.hub.repos.get("/".join(parts[:length]))
            if repo is not None:
                return repo, parts[length:]
        return None, parts

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append(f"{self.command} {path}")
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            repo, rest = self._find(parts[2:])
            if repo is not None and len(rest) >= 2 and rest[0] == "revision":
                return self._json(repo.info(), body)
            if repo is not None and len(rest) >= 2 and rest[0] == "tree":
                return self._json(repo.tree(), body)
            return self._missing("RepoNotFound", body)
        repo, rest = self._find(parts)
        if repo is None or len(rest) < 3 or rest[0] != "resolve":
            return self._missing("RepoNotFound", body)
        name = "/".join(rest[2:])
        if name not in repo.files:
            return self._missing("EntryNotFound", body, repo.commit)
        self._file(repo, name, body)

    def _file(self, repo: HubRepo, name: str, body: bool) -> None:
        data = repo.files[name]
        start, end = 0, len(data)
        status = HTTPStatus.OK
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes=") :].partition("-")
            start = int(first or 0)
            end = min(len(data), int(last) + 1) if last else len(data)
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.blob_ids[name]}"')
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        if name in self.hub.held:
            deadline = time.monotonic() + self.hub.hold_limit_s
            while start < end - 1 and time.monotonic() < deadline and not self.hub.released.wait(0.25):
                self.wfile.write(data[start : start + 1])
                self.wfile.flush()
                start += 1
        self.wfile.write(data[start:end])

    def _json(self, payload: object, body: bool) -> None:
        data = json.dumps(payload).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _missing(self, code: str, body: bool, commit: str | None = None) -> None:
        data = json.dumps({"error": f"{code}: {self.path}"}).encode()
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def main(argv: list[str]) -> None:
    """Serve `REPO=FOLDER` pairs until interrupted; prints the endpoint."""
    repos = {pair.partition("=")[0]: Path(pair.partition("=")[2]) for pair in argv}
    with HubStandIn(repos) as hub:
        print(hub.endpoint, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])

"""A run recorded as its client gets it: the frames of one request in, a saved run out.

The page's websocket client (`ui.client.BackendRun`) feeds every frame of its run here, so a
finished run can be downloaded (`backend.saved_run`'s format) and replayed; `scripts/record_run.py`
records runs the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backend.saved_run import (
    AT_DIGITS,
    LOGPROB_DIGITS,
    SAVED_RUN_KIND,
    SAVED_RUN_VERSION,
    SavedRun,
    SavedRunError,
)
from backend.saved_run_reader import saved_run_from_dict


class RunRecorder:
    """Builds the saved run of one request from the frames its client gets.

    `request` is the client's `generate` frame (the prompt and settings the server does not echo:
    system prompt, top_k, stop, logprobs); feed every server frame to `apply`, in order; once the
    request's `done` came, `saved_run` is the run. Cheap per frame: a chunk is one tuple appended.
    """

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.request_id = request.get("id")
        replayed = request.get("run") if request.get("type") == "replay" else None
        if isinstance(replayed, Mapping) and isinstance(replayed.get("runs"), list) and replayed["runs"]:
            replayed = replayed["runs"][0]  # a file of the current version: its one run
        if isinstance(replayed, Mapping):  # a replay runs the saved run's own prompt and settings
            prompt = replayed.get("prompt") or {}
            settings = replayed.get("settings") or {}
            request = {"prompt": prompt.get("text"), "system": prompt.get("system"), "params": settings}
            request["logprobs"] = settings.get("logprobs", False)
            request["alternatives"] = settings.get("alternatives")
            request["prefix"] = prompt.get("prefix") or ""
        self.prompt = str(request.get("prompt", ""))
        self.system = str(request.get("system") or "")
        self.prefix = str(request.get("prefix") or "")
        self._request_params = dict(request.get("params") or {})
        self._logprobs = bool(request.get("logprobs", False))
        alternatives = request.get("alternatives")
        self._alternatives = alternatives if isinstance(alternatives, int) and self._logprobs else 0
        self._accepted: dict[str, Any] | None = None
        self._chunks: list[list[tuple[float, str, int, tuple[float, ...] | None, list[Any] | None]]] = []
        self._finishes: dict[int, dict[str, Any]] = {}
        self._done: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """The request's `done` came: the run is complete."""
        return self._done is not None

    def apply(self, frame: Mapping[str, Any]) -> None:
        """Take one server frame; frames of other requests, and trace frames, are ignored."""
        if frame.get("id") != self.request_id:
            return
        kind = frame.get("type")
        if kind == "chunk" and self._accepted is not None:
            index = frame.get("index")
            if isinstance(index, int) and 0 <= index < len(self._chunks):
                pieces = frame.get("logprobs")
                logprobs = listed = None
                if pieces:
                    logprobs = tuple(round(value, LOGPROB_DIGITS) for piece in pieces for value in piece[1])
                    if self._alternatives:
                        listed = [entry for piece in pieces if len(piece) > 2 for entry in piece[2]]
                at = round(max(float(frame.get("at", 0.0)) - self._accepted.get("at", 0.0), 0.0), AT_DIGITS)
                self._chunks[index].append((at, frame["text"], int(frame["tokens"]), logprobs, listed))
        elif kind == "finish":
            self._finishes[int(frame["index"])] = dict(frame)
        elif kind == "accepted":
            self._accepted = dict(frame)
            self._chunks = [[] for _ in range(int(frame["n"]))]
        elif kind == "done":
            self._done = dict(frame.get("stats") or {})

    def _sample(self, index: int, chunks: list[Any]) -> dict[str, Any]:
        """Sample `index` as the saved run's JSON has it, from its chunks and its `finish` frame."""
        finish = self._finishes.get(index, {})
        entries = [
            [at, text, tokens]
            + ([list(lp)] if lp is not None else [])
            + ([listed] if lp is not None and listed is not None else [])
            for at, text, tokens, lp, listed in chunks
        ]
        return {
            "index": index,
            "seed": (finish.get("stats") or {}).get("seed", index),
            "finish_reason": finish.get("reason", "error"),
            "text": "".join(chunk[1] for chunk in chunks),
            "tokens": sum(chunk[2] for chunk in chunks),
            "chunks": entries,
            "stats": finish.get("stats") or {},
            "engine": finish.get("engine") or {},
        }

    def saved_run(self, source: Mapping[str, str] | None = None) -> SavedRun:
        """The run (a run of its own: a continuation's `continues` is the caller's to set), with
        `source` saying where it was recorded; SavedRunError while it is not done (or if the frames
        do not make a valid run)."""
        accepted = self._accepted
        if accepted is None or self._done is None:
            raise SavedRunError("the run has not finished yet; download it once every sample has ended")
        if "at" not in accepted:
            raise SavedRunError(
                "the backend did not send the request's start time, so chunk times are unknown"
            )
        echoed = accepted.get("params") or {}
        stop = self._request_params.get("stop") or []
        settings = {
            "n": accepted["n"],
            "max_tokens": echoed.get("max_tokens"),
            "temperature": echoed.get("temperature"),
            "top_p": echoed.get("top_p"),
            "top_k": self._request_params.get("top_k", 0),
            "seed": echoed.get("seed"),
            "stop": [stop] if isinstance(stop, str) else list(stop),
            "logprobs": self._logprobs,
        }
        if self._alternatives:
            settings["alternatives"] = self._alternatives
        samples = [self._sample(index, chunks) for index, chunks in enumerate(self._chunks)]
        run = {
            "engine": accepted.get("engine", ""),
            "model": accepted.get("model", ""),
            "prompt": {
                "text": self.prompt,
                "format": accepted.get("format", "chat"),
                "system": self.system if accepted.get("format") == "chat" else "",
                "format_reason": accepted.get("format_reason", ""),
                "prefix": self.prefix,
            },
            "continues": None,
            "settings": settings,
            "samples": samples,
            "stats": self._done,
        }
        data = {
            "kind": SAVED_RUN_KIND,
            "version": SAVED_RUN_VERSION,
            "source": dict(source or {}),
            "runs": [run],
        }
        return saved_run_from_dict(data)

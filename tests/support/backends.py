"""The backend in the test's own loop (started on a free port, closed after, whatever the test does),
and what a test gets of `python app.py` running for it (the `synthetic_app` fixture of conftest)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from backend.config.settings import Limits, ServerOptions
from backend.engines.base import Engine
from backend.engines.synthetic import SyntheticEngine
from backend.serving.server import BackendServer


@contextlib.asynccontextmanager
async def serving(
    engine: Engine | None = None,
    limits: Limits | None = None,
    background: bool = False,
    keep_engine: bool = False,
    **options: Any,
) -> AsyncIterator[BackendServer]:
    """A `BackendServer` for `engine` (the synthetic engine at 100 tokens/s by default) with `limits`
    and the server's other `options` (`ServerOptions` fields), listening on a free port; its engine
    started before it serves, or on a task while it does (`background`, as app.py's backend starts
    it); closed on the way out, its engine stopped too unless `keep_engine` (an engine a test module
    shares, loaded once)."""
    server = BackendServer(
        engine or SyntheticEngine(rate=100, jitter=0.2),
        ServerOptions(limits=limits or Limits(), port=0, **options),
    )
    await server.start(engine_in_background=background)
    try:
        yield server
    finally:
        await server.close()
        if not keep_engine:
            await server.engine.stop()


def synthetic_serving(
    rate: float = 100.0, jitter: float = 0.2, limits: Limits | None = None, **options: Any
) -> contextlib.AbstractAsyncContextManager[BackendServer]:
    """`serving` the synthetic engine at `rate` tokens/s per sample with `jitter`, `limits` and the
    server's other `options` (the conftest `server` fixture's backend, and tests' own variants)."""
    return serving(SyntheticEngine(rate=rate, jitter=jitter), limits, **options)


@dataclass(frozen=True)
class RunningApp:
    """`python app.py` serving a test module: its page's URL and its backend's /health URL."""

    url: str
    health: str

"""The backend's servers started and stopped together: the main server, the experiment server, the engine.

`Servers` is the one place that starts them, in this order: the experiment server (a loop of its
own, `experiments`), where `ServerOptions.experiment_port` asks for one; then the main server,
told the experiment server's URL (its `/health` names it, and its clients' blocking-consumer runs
are refused with it); and the engine, which the main server starts and watches. `close` stops them
in the reverse order: the main server, the experiment server, then the engine, which both drove.
`python -m backend` and app.py's backend process (`process`) serve through it.
"""

from __future__ import annotations

import asyncio

from backend.config.settings import ServerOptions
from backend.engines.base import Engine
from backend.serving.experiments import ExperimentServer
from backend.serving.server import BackendServer


class Servers:
    """`engine` served by a main server with `options`, and by an experiment server where they ask."""

    def __init__(self, engine: Engine, options: ServerOptions) -> None:
        self.engine = engine
        self.main = BackendServer(engine, options)
        self.experiments = (
            ExperimentServer(engine, self.main.engine_problem, options)
            if options.experiment_port is not None
            else None
        )

    @property
    def url(self) -> str:
        """The main server's websocket URL."""
        return self.main.url

    @property
    def experiment_url(self) -> str | None:
        """The experiment server's websocket URL, where it runs one."""
        return self.main.experiment_url

    async def start(self, engine_in_background: bool = False) -> None:
        """Start the experiment server, then the main server and the engine (on a task while the main
        server listens, with `engine_in_background`: `BackendServer.start`)."""
        if self.experiments is not None:
            await self.experiments.start()
            self.main.experiment_url = self.experiments.url
            self.main.experiment_watch = self.experiments.watch
        try:
            await self.main.start(engine_in_background=engine_in_background)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the main server, the experiment server, then stop the engine."""
        await self.main.close()
        if self.experiments is not None:
            await self.experiments.close()
        await self.engine.stop()

    async def serve_forever(self) -> None:
        """Start, then serve until cancelled."""
        await self.start()
        try:
            await asyncio.Future()
        finally:
            await self.close()

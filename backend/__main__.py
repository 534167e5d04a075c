"""`python -m backend`: the websocket backend alone, for any websocket client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from backend.cli import DEFAULT_BACKEND_PORT, add_engine_arguments, engine_from_args, env, limits_from_args
from backend.server import BackendServer


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, serve until interrupted; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m backend", description=__doc__)
    add_engine_arguments(parser)
    parser.add_argument(
        "--host", default=env("DASHBOARD_HOST", "127.0.0.1"), help="address to bind (env DASHBOARD_HOST)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("DASHBOARD_BACKEND_PORT", str(DEFAULT_BACKEND_PORT))),
        help="port to bind, 0 for any free one (env DASHBOARD_BACKEND_PORT; default %(default)s)",
    )
    parser.add_argument(
        "--no-trace",
        action="store_true",
        default=env("DASHBOARD_NO_TRACE", "") == "1",
        help="do not trace the event loop (env DASHBOARD_NO_TRACE=1)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        server = BackendServer(
            engine_from_args(args), limits_from_args(args), args.host, args.port, trace=not args.no_trace
        )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(server.serve_forever())
    except (ValueError, OSError) as exc:
        print(f"backend: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

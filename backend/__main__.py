"""`python -m backend`: the websocket backend alone, for any websocket client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from backend.config.engine_flags import DEFAULT_BACKEND_PORT, add_engine_arguments, env
from backend.config.server_flags import add_server_arguments, servers_from_args


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
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        servers = servers_from_args(args, args.host, args.port)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(servers.serve_forever())
    except (ValueError, OSError) as exc:
        print(f"backend: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

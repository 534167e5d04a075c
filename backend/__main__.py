"""`python -m backend`: the websocket backend alone, for any websocket client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from backend.config.engine_flags import add_engine_arguments
from backend.config.server_flags import BACKEND_PORT, HOST, add_server_arguments, servers_from_args


def parser() -> argparse.ArgumentParser:
    """`python -m backend`'s arguments: the engines', the address and port, the server's."""
    arguments = argparse.ArgumentParser(prog="python -m backend", description=__doc__)
    add_engine_arguments(arguments)
    HOST.add_to(arguments)
    BACKEND_PORT.add_to(arguments, "--port")
    add_server_arguments(arguments)
    return arguments


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, serve until interrupted; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        servers = servers_from_args(args, args.host, args.backend_port)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(servers.serve_forever())
    except (ValueError, OSError) as exc:
        print(f"backend: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m backend`: the websocket backend alone, for any websocket client.

It serves until SIGINT (Ctrl-C) or SIGTERM (what `kill`, systemd, `docker stop` and a container
platform send) and on either closes its servers and stops its engine, so an SGLang server that
`--engine auto` launched in a session of its own is stopped with it rather than left running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from backend.engines.flags import add_engine_arguments
from backend.serving.flags import BACKEND_PORT, HOST, add_server_arguments, servers_from_args
from backend.serving.servers import Servers


def parser() -> argparse.ArgumentParser:
    """`python -m backend`'s arguments: the engines', the address and port, the server's."""
    arguments = argparse.ArgumentParser(prog="python -m backend", description=__doc__)
    add_engine_arguments(arguments)
    HOST.add_to(arguments)
    BACKEND_PORT.add_to(arguments, "--port")
    add_server_arguments(arguments)
    return arguments


async def serve_until_terminated(servers: Servers) -> None:
    """Serve until cancelled or sent SIGTERM; either way the servers close and the engine stops."""
    serving = asyncio.current_task()
    assert serving is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, serving.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await servers.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, serve until interrupted; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        servers = servers_from_args(args, args.host, args.backend_port)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_until_terminated(servers))
    except (ValueError, OSError) as exc:
        print(f"backend: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

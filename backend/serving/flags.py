"""Command-line settings of the websocket server itself (the engines': `backend.engines.flags`).

`HOST` and `BACKEND_PORT` are read by both `python -m backend` (the address and port it binds) and
app.py (the page's address; the port of the backend it starts).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from backend.config.declared import Setting, add_settings, in_a_space
from backend.config.settings import Limits, ServerOptions
from backend.engines.flags import engine_from_args
from backend.serving.servers import Servers

HOST = Setting(
    "host",
    "--host",
    ("DASHBOARD_HOST",),
    "address the page binds (`python -m backend`: the address the backend binds)",
    default=in_a_space("0.0.0.0", "127.0.0.1"),
    default_words="`127.0.0.1` (`0.0.0.0` in a Space)",
)

BACKEND_PORT = Setting(
    "backend_port",
    "--backend-port",
    ("DASHBOARD_BACKEND_PORT",),
    "port of the websocket backend (0: any free one; `python -m backend` takes it as `--port`)",
    default=8765,
    kind=int,
)

N_MAX = Setting(
    "n_max",
    "--n-max",
    ("DASHBOARD_N_MAX",),
    "most samples per request, and columns in the page",
    default=Limits.n_max,
    kind=int,
)

LIMIT_SETTINGS = tuple(
    Setting(field, flag, (env_name,), what, default=getattr(Limits, field), kind=type(getattr(Limits, field)))
    for field, flag, env_name, what in (
        (
            "max_total_samples",
            "--max-total-samples",
            "DASHBOARD_MAX_TOTAL_SAMPLES",
            "samples running at once, all clients",
        ),
        (
            "max_connections_per_address",
            "--max-connections-per-address",
            "DASHBOARD_MAX_CONNECTIONS_PER_ADDRESS",
            "open connections from one address",
        ),
        (
            "requests_per_minute",
            "--requests-per-minute",
            "DASHBOARD_REQUESTS_PER_MINUTE",
            "requests per address a minute",
        ),
        (
            "max_blocking_requests",
            "--max-blocking-requests",
            "DASHBOARD_MAX_BLOCKING_REQUESTS",
            "blocking-consumer experiments at once, all clients",
        ),
        ("send_stall_s", "--send-stall-s", "DASHBOARD_SEND_STALL_S", "seconds a non-reading client is kept"),
    )
)
"""Server-wide limits settable on the command line, each a `Limits` field (backend/config/settings.py
says what each protects)."""

EXPERIMENT_PORT = Setting(
    "experiment_port",
    "--experiment-port",
    ("DASHBOARD_EXPERIMENT_PORT",),
    "port of the experiment server, where the page runs blocking-consumer experiments on a loop of "
    "their own so they do not stall other users' streams; 0: any free port, -1: none",
    default=0,
    kind=int,
)


NO_TRACE = Setting(
    "no_trace",
    "--no-trace",
    ("DASHBOARD_NO_TRACE",),
    "do not trace the backend's event loop ([docs/trace.md](docs/trace.md))",
    default=False,
    kind=bool,
)

ALLOWED_ORIGINS = Setting(
    "allowed_origin",
    "--allowed-origin",
    ("DASHBOARD_ALLOWED_ORIGINS",),
    "a web page (`https://host:port`) allowed to open the backend's websocket from a browser; "
    "repeatable, the variable comma-separated; clients that send no Origin, like the page's server "
    "side, always may",
    repeatable=True,
)

TOKEN = Setting(
    "token",
    "--token",
    ("DASHBOARD_TOKEN",),
    "require `Authorization: Bearer TOKEN` from websocket clients (app.py gives the backend it starts "
    "a random one)",
)

LOG_PROMPTS = Setting(
    "log_prompts",
    "--log-prompts",
    ("DASHBOARD_LOG_PROMPTS",),
    "log each request's prompt (off: prompts stay out of logs)",
    default=False,
    kind=bool,
)

SERVER_SETTINGS = (N_MAX, NO_TRACE, ALLOWED_ORIGINS, TOKEN, LOG_PROMPTS, EXPERIMENT_PORT, *LIMIT_SETTINGS)
"""The backend's own settings, after the engines' (`HOST` and `BACKEND_PORT` are added by each program)."""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Tracing, access and limits, each with its environment variable."""
    add_settings(parser, SERVER_SETTINGS)


def server_options(args: argparse.Namespace, host: str, port: int) -> ServerOptions:
    """The server options (limits, tracing, access rules, experiment port) the parsed arguments give."""
    limits = replace(
        limits_from_args(args), **{setting.name: getattr(args, setting.name) for setting in LIMIT_SETTINGS}
    )
    return ServerOptions(
        limits=limits,
        host=host,
        port=port,
        trace=not args.no_trace,
        allowed_origins=tuple(args.allowed_origin or ()),
        token=args.token or None,
        log_prompts=args.log_prompts,
        experiment_port=args.experiment_port if args.experiment_port >= 0 else None,
    )


def servers_from_args(args: argparse.Namespace, host: str, port: int) -> Servers:
    """The engine and servers the parsed arguments describe, not yet started."""
    return Servers(engine_from_args(args), server_options(args, host, port))


def limits_from_args(args: argparse.Namespace) -> Limits:
    """Server limits with the parsed --n-max."""
    if args.n_max < 1:
        raise ValueError(f"--n-max must be at least 1, got {args.n_max}")
    return Limits(n_max=args.n_max)

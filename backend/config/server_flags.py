"""Command-line settings of the websocket server itself (the engine's: `backend.config.engine_flags`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from backend.config.declared import Setting, add_settings
from backend.config.engine_flags import engine_from_args, env
from backend.config.settings import Limits, ServerOptions
from backend.serving.servers import Servers

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


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Tracing, access and limits, each with its environment variable."""
    add_settings(parser, [N_MAX])
    parser.add_argument(
        "--no-trace",
        action="store_true",
        default=env("DASHBOARD_NO_TRACE", "") == "1",
        help="do not trace the backend's event loop (env DASHBOARD_NO_TRACE=1)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=[o for o in env("DASHBOARD_ALLOWED_ORIGINS", "").split(",") if o],
        help="a web page origin (https://host:port) allowed to open the backend's websocket from a "
        "browser; repeatable (env DASHBOARD_ALLOWED_ORIGINS, comma-separated). Clients that send no "
        "Origin, like the Gradio app's server side, are always allowed",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("DASHBOARD_TOKEN") or None,
        help="require 'Authorization: Bearer TOKEN' from websocket clients (env DASHBOARD_TOKEN)",
    )
    parser.add_argument(
        "--log-prompts",
        action="store_true",
        default=env("DASHBOARD_LOG_PROMPTS", "") == "1",
        help="log each request's prompt (off by default: prompts stay out of logs)",
    )
    add_settings(parser, [EXPERIMENT_PORT, *LIMIT_SETTINGS])


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
        token=args.token,
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

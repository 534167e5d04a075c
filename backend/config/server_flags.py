"""Command-line settings of the websocket server itself (the engine's: `backend.config.engine_flags`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from backend.config.engine_flags import engine_from_args, env
from backend.config.settings import Limits
from backend.serving.server import BackendServer

LIMIT_FLAGS = {
    "max_total_samples": (
        "--max-total-samples",
        "DASHBOARD_MAX_TOTAL_SAMPLES",
        "samples running at once, all clients",
    ),
    "max_connections_per_address": (
        "--max-connections-per-address",
        "DASHBOARD_MAX_CONNECTIONS_PER_ADDRESS",
        "open connections from one address",
    ),
    "requests_per_minute": (
        "--requests-per-minute",
        "DASHBOARD_REQUESTS_PER_MINUTE",
        "requests per address a minute",
    ),
    "max_blocking_requests": (
        "--max-blocking-requests",
        "DASHBOARD_MAX_BLOCKING_REQUESTS",
        "blocking-consumer experiments at once, all clients",
    ),
    "send_stall_s": ("--send-stall-s", "DASHBOARD_SEND_STALL_S", "seconds a non-reading client is kept"),
}
"""Server-wide limits settable on the command line (see backend/config/settings.py for what each protects)."""


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Tracing, access and limits, each with its environment variable."""
    parser.add_argument(
        "--n-max",
        type=int,
        default=int(env("DASHBOARD_N_MAX", str(Limits.n_max))),
        help="most samples per request, and columns in the page (env DASHBOARD_N_MAX; default %(default)s)",
    )
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
    parser.add_argument(
        "--experiment-port",
        type=int,
        default=int(env("DASHBOARD_EXPERIMENT_PORT", "0")),
        help="port of the experiment server, where the page runs blocking-consumer experiments on a "
        "loop of their own so they do not stall other users' streams; 0: any free port, -1: none "
        "(env DASHBOARD_EXPERIMENT_PORT; default %(default)s)",
    )
    for field, (flag, env_name, what) in LIMIT_FLAGS.items():
        default = getattr(Limits, field)
        kind = type(default)
        parser.add_argument(
            flag,
            type=kind,
            default=kind(env(env_name, str(default))),
            help=f"{what} (env {env_name}; default %(default)s)",
        )


def server_from_args(args: argparse.Namespace, host: str, port: int) -> BackendServer:
    """The backend server (engine, limits, tracing, access rules) the parsed arguments describe."""
    limits = replace(limits_from_args(args), **{field: getattr(args, field) for field in LIMIT_FLAGS})
    return BackendServer(
        engine_from_args(args),
        limits,
        host,
        port,
        trace=not args.no_trace,
        allowed_origins=tuple(args.allowed_origin or ()),
        token=args.token,
        log_prompts=args.log_prompts,
        experiment_port=args.experiment_port if args.experiment_port >= 0 else None,
    )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """Server limits with the parsed --n-max."""
    if args.n_max < 1:
        raise ValueError(f"--n-max must be at least 1, got {args.n_max}")
    return Limits(n_max=args.n_max)

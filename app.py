"""Entry point: the backend in a child process with its own loop, and the Gradio dashboard in front.

`python app.py` is what a Hugging Face Space runs. It binds 0.0.0.0 inside a Space (where SPACE_ID
is set) and 127.0.0.1 elsewhere, unless --host says otherwise. With --backend-url it starts no
backend and uses the one at that URL (say, `python -m backend` on another machine).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
import sys
from typing import Any

from backend.config.declared import Setting, add_settings
from backend.config.settings import Limits
from backend.engines.flags import add_engine_arguments, all_engine_settings
from backend.serving.flags import (
    BACKEND_PORT,
    HOST,
    SERVER_SETTINGS,
    add_server_arguments,
    limits_from_args,
)
from backend.serving.process import BackendProcess
from backend.trace import native_build
from ui.engine_info import running_backend

DEFAULT_UI_PORT = 7860


PAGE_PORT = Setting(
    "port",
    "--port",
    ("DASHBOARD_PORT", "GRADIO_SERVER_PORT"),
    "port of the page",
    default=DEFAULT_UI_PORT,
    kind=int,
)

BACKEND_URL = Setting(
    "backend_url",
    "--backend-url",
    ("DASHBOARD_BACKEND_URL",),
    "use a running backend instead of starting one",
)

APP_SETTINGS = (HOST, PAGE_PORT, BACKEND_PORT, BACKEND_URL)
"""The page's settings (the engines' and the backend's own are `backend.config`'s)."""


def readme_settings() -> tuple[Setting, ...]:
    """The settings in the README's table, in its order, of the engines registered now
    (tests/test_readme.py checks they agree)."""
    return (*all_engine_settings(), *APP_SETTINGS, *SERVER_SETTINGS)


def parser() -> argparse.ArgumentParser:
    """app.py's arguments: the engines', the page's, the backend's."""
    arguments = argparse.ArgumentParser(prog="python app.py", description=__doc__)
    add_engine_arguments(arguments)
    add_settings(arguments, APP_SETTINGS)
    add_server_arguments(arguments)
    return arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags, each defaulting to its environment variable."""
    return parser().parse_args(argv)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def page_origins(host: str, port: int) -> list[str]:
    """The origins this page is served from, allowed by the backend's Origin check."""
    hosts = {host, "127.0.0.1", "localhost"} if host in ("127.0.0.1", "0.0.0.0", "localhost") else {host}
    return sorted(f"http://{h}:{port}" for h in hosts if h != "0.0.0.0")


def page_port_problem(host: str, port: int) -> str | None:
    """Why the page could not listen on host:port, or None: checked before anything starts, so a
    port in use is said in one line instead of a traceback after the backend has loaded."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the page's server does
            probe.bind(address)
    except socket.gaierror as exc:
        return f"the page's address {host!r} (--host, DASHBOARD_HOST) does not resolve: {exc.strerror or exc}"
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return (
            f"the page cannot listen on {host}:{port} ({reason}); "
            "choose another port with --port or DASHBOARD_PORT"
        )
    return None


PAGE_CHECK_ATTEMPTS = 3
"""Starts of the page tried when Gradio's own check that it answers fails (see `launch_page`)."""


def launch_page(demo: Any, attempts: int = PAGE_CHECK_ATTEMPTS, **launch_args: Any) -> None:
    """`demo.launch(**launch_args)`, started again when Gradio's check of its own page fails.

    After starting its server, `launch` asks the page once with a 3 s timeout and raises when that
    times out ("localhost is not accessible"); on a machine busy starting engines the page can be
    slower than that to answer its first request (seen with four apps and three SGLang servers
    starting on 2 cores). Each retry closes the server and launches it again on the same port.
    """
    for attempt in range(1, attempts + 1):
        try:
            demo.launch(**launch_args)
            return
        except ValueError as exc:
            if "localhost is not accessible" not in str(exc) or attempt == attempts:
                raise
            logging.getLogger("app").warning(
                "the page did not answer Gradio's check of it in time (attempt %d of %d); starting it again",
                attempt,
                attempts,
            )
            demo.close()


def build_tracer_in_a_space() -> None:
    """A Space installs requirements.txt only: build the tracer's C parts before the backend starts;
    if that fails it serves untraced and says why."""
    if not os.environ.get("SPACE_ID") or native_build.built():
        return
    ok, message = native_build.build_in_place()
    log = logging.getLogger("app")
    if ok:
        log.info("built the tracer's C parts")
    else:
        log.warning("the tracer's C parts did not build; serving without the loop trace: %s", message)


def start_backend(args: argparse.Namespace) -> tuple[BackendProcess | None, str, str | None, Limits]:
    """The backend the page talks to: its process (None: --backend-url's, someone else's), its URL,
    its experiment server's URL and its limits. ValueError, RuntimeError or TimeoutError say why not."""
    limits = limits_from_args(args)
    if args.backend_url:  # a backend of another's: what it serves, as its /health says
        experiment_url, limits = running_backend(args.backend_url, limits)
        return None, args.backend_url, experiment_url, limits
    # A backend of our own gets a token of our own: other local processes cannot use it.
    args.token = args.token or secrets.token_urlsafe(24)
    args.allowed_origin = [*(args.allowed_origin or ()), *page_origins(args.host, args.port)]
    # The backend listens on loopback only: the page is its one client here.
    backend = BackendProcess(args, "127.0.0.1", args.backend_port)
    url = backend.start_and_wait()
    return backend, url, backend.experiment_url, limits


def main(argv: list[str] | None = None) -> int:
    """Start the backend (unless --backend-url) and serve the page until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build_tracer_in_a_space()
    problem = page_port_problem(args.host, args.port)
    if problem is not None:
        print(f"app: {problem}", file=sys.stderr)
        return 2
    try:
        backend, backend_url, experiment_url, limits = start_backend(args)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        print(f"app: {exc}", file=sys.stderr)
        return 2
    # No usage reporting to a third party unless the operator asks for it.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from ui.app import CSS, PAGE_JS, build_demo  # imported late: Gradio takes seconds to import

    demo = build_demo(backend_url, limits, token=args.token, experiment_url=experiment_url)
    print(f"backend: {backend_url}", flush=True)
    # SIGTERM (a supervisor, a Space restarting) ends the process like Ctrl-C does, so the
    # `finally` below stops the backend process instead of leaving it running.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        # No run history: Gradio's default keeps every call's inputs and outputs in the browser's
        # localStorage and reads and rewrites that history as a run streams. With n columns of text
        # it grew by hundreds of KB a run, and by the seventh run at n = 32 the page spent more
        # time on it than on drawing (docs/benchmarks.md, "What the browser page costs"). Prompts stay
        # out of the browser's storage too.
        launch_page(
            demo,
            server_name=args.host,
            server_port=args.port,
            show_error=True,
            css=CSS,
            js=PAGE_JS,
            run_history=False,
        )
    except OSError as exc:  # the port was taken after the check above
        print(f"app: the page could not start: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # the page never answered Gradio's check of it
        print(f"app: the page started but did not answer its own check: {exc}", file=sys.stderr)
        return 2
    finally:
        if backend is not None:
            backend.stop()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as stopped:  # SIGTERM (`_exit_on_signal`), after main's `finally` stopped the backend
        code = stopped.code if isinstance(stopped.code, int) else 1
    # Everything app.py started is stopped by now; the interpreter's teardown of Gradio and torch
    # took seconds on a loaded machine, time a container's 10 s stop grace does not have.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Limits and defaults of the backend, each with the one thing it protects."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parallel-sampling-dashboard"
"""The dashboard's cache outside the repo: converted model copies, the auto-launched server's log."""

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The dashboard's model as a Hugging Face Hub id: the embedded engine's default where it comes from
the hub (a Space), and what SGLang loads when --model names nothing."""

# Hard cap enforced by the websockets library before a frame is parsed: a larger frame closes the
# connection with code 1009. It bounds the memory one incoming message can take.
WS_MAX_MESSAGE_BYTES = 1 << 20

# Frames queued for one client that is not reading (chunks merge, so only errors and finishes pile
# up). Past this the connection is closed: it bounds a stalled client's memory on the server.
OUTBOX_MAX_FRAMES = 10_000

# Kernel send buffer of each client socket. It bounds how far a slow client lags behind the engine:
# once this much is unread, sends wait and new chunks merge in the outbox instead of queueing.
SEND_BUFFER_BYTES = 32 * 1024

# Default sampling parameters when a generate frame leaves them out.
DEFAULT_MAX_TOKENS = 128
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95

TEMPERATURE_MAX = 2.0
"""Above this, sampling is close to uniform noise; engines disagree on what it means."""

BLOCK_MS_MAX = 200.0
"""Longest CPU block per chunk in "blocking" mode: enough to show the cost, not to hang the server."""

DEFAULT_BLOCK_MS = 20.0
"""CPU block per chunk in "blocking" mode when a generate frame does not say."""

TOP_K_MAX = 1000
"""Largest top_k: beyond a thousand candidates it no longer changes what gets sampled."""

STOP_STRINGS_MAX = 4
STOP_CHARS_MAX = 64
"""At most 4 stop strings of 64 characters: each is matched against the text after every token."""

# Largest seed accepted; per-sample seeds are seed + index, which must stay a 32-bit value.
SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class Limits:
    """Per-request and per-connection bounds the server enforces with an `error` frame."""

    n_max: int = 32
    """Samples per request: bounds the engine's batch and the number of UI columns."""

    max_tokens_max: int = 2048
    """Tokens per sample: bounds how long one request can hold the engine."""

    max_prompt_chars: int = 16_000
    """Prompt length: bounds tokenisation and prefill work for one request."""

    max_frame_bytes: int = 64 * 1024
    """Client frame size answered with `frame_too_large` instead of being parsed (below the
    library's hard cap, so the client gets an explanation rather than a closed socket)."""

    max_replay_frame_bytes: int = WS_MAX_MESSAGE_BYTES - 4096
    """Size of a `replay` frame, which carries a saved run (`backend.saved_run.SAVED_RUN_BYTES_MAX`
    of JSON, and the frame's other fields): under the library's hard cap, like `max_frame_bytes`."""

    max_requests_per_connection: int = 8
    """Concurrent requests on one connection: keeps one client from monopolising the engine."""

    max_id_chars: int = 128
    """Length of a client's request id: ids are echoed in every frame, so they stay small."""

    max_total_samples: int = 256
    """Samples running at once over all connections: bounds the engine's total work."""

    max_connections_per_address: int = 64
    """Open connections from one address: one client cannot exhaust sockets and tasks. The page is
    one connection per run, counted by its visitor's address, and lets one address stream 32 runs
    at once (a class behind one NAT address, `ui.visitor_limits.RUNS_PER_ADDRESS`), each session's
    finished run keeping its connection for Export: twice that."""

    requests_per_minute: int = 120
    """Requests one address may start in a minute: bounds a flood of short requests."""

    max_blocking_requests: int = 1
    """Requests in the "blocking" consumer mode at once, over all connections: the experiment blocks
    the loop every client shares for up to `BLOCK_MS_MAX` per chunk, so one runs at a time and
    other clients' streams wait at most one block between chunks (docs/trace.md, "Other clients")."""

    send_stall_s: float = 15.0
    """A client whose socket takes nothing for this long is dropped and its requests aborted."""


@dataclass(frozen=True)
class ServerOptions:
    """How one websocket server serves: its limits, address, tracing, access rules and prompt logging."""

    limits: Limits = Limits()
    host: str = "127.0.0.1"
    port: int = 8765
    """The port to bind, 0 for any free one."""
    trace: bool = True
    """Trace the server's loop, where the tracer's C parts are built (else it serves untraced, saying why)."""
    allowed_origins: tuple[str, ...] = ()
    """Web pages (https://host:port) allowed to open the websocket from a browser."""
    token: str | None = None
    """A bearer token every websocket client must send, or None for none."""
    log_prompts: bool = False
    """Log each request's prompt (off by default: prompts stay out of logs)."""
    experiment_port: int | None = None
    """Where `Servers` runs the experiment server (blocking-consumer runs on a loop of their own): its
    port, 0 for any free one, None for no experiment server."""

"""Who may connect and start work, without I/O: per-address connections and request rate, total samples.

Addresses are the client's IP, or, for connections from a trusted local proxy (the Gradio app on
the same machine), the address it forwards in `X-Forwarded-For`: otherwise every page user would
share the app's one address. Each refusal says which limit was hit and what to do.
"""

from __future__ import annotations

from collections import defaultdict, deque

from backend.config.settings import Limits
from backend.protocol import ProtocolError

TRUSTED_PROXIES = frozenset({"127.0.0.1", "::1"})
"""Peers whose `X-Forwarded-For` is believed: only processes on this machine (the Gradio app)."""

RATE_WINDOW_S = 60.0


def client_address(peer: str, forwarded_for: str | None) -> str:
    """The address limits apply to: the forwarded client's, when a trusted local proxy says so."""
    if forwarded_for and peer in TRUSTED_PROXIES:
        first = forwarded_for.split(",")[0].strip()
        if first:
            return first
    return peer


class Admission:
    """Counts connections per address, requests per address per minute, and samples running."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: dict[str, int] = defaultdict(int)
        self.running_samples = 0
        self.blocking_requests = 0
        self._starts: dict[str, deque[float]] = defaultdict(deque)

    def connect(self, address: str) -> str | None:
        """Count a new connection; a message saying why it is refused, or None."""
        if self.connections[address] >= self.limits.max_connections_per_address:
            return (
                f"too many connections from your address ({self.limits.max_connections_per_address} "
                "already open); close one and retry"
            )
        self.connections[address] += 1
        return None

    def disconnect(self, address: str) -> None:
        """A connection that `connect` admitted has closed."""
        self.connections[address] -= 1
        if self.connections[address] <= 0:
            del self.connections[address]

    def start_request(
        self, address: str, n: int, now: float, request_id: str, blocking: bool = False
    ) -> None:
        """Admit a request of n samples at time `now` (seconds), or raise ProtocolError saying why;
        `blocking` when its consumer blocks the loop (the "blocking" experiment)."""
        starts = self._starts[address]
        while starts and starts[0] <= now - RATE_WINDOW_S:
            starts.popleft()
        if len(starts) >= self.limits.requests_per_minute:
            wait = starts[0] + RATE_WINDOW_S - now
            raise ProtocolError(
                "rate_limited",
                f"more than {self.limits.requests_per_minute} requests a minute from your address; "
                f"retry in {wait:.0f} s",
                request_id,
            )
        if self.running_samples + n > self.limits.max_total_samples:
            raise ProtocolError(
                "server_busy",
                f"the server is running {self.running_samples} samples, and takes at most "
                f"{self.limits.max_total_samples} at once; retry when some finish or ask for fewer",
                request_id,
            )
        if blocking and self.blocking_requests >= self.limits.max_blocking_requests:
            raise ProtocolError(
                "experiment_busy",
                "another blocking-consumer experiment is running (it blocks the loop every client "
                f"shares, so {self.limits.max_blocking_requests} at a time); retry when it ends, or "
                "use the cooperative or greedy consumer",
                request_id,
            )
        starts.append(now)
        self.running_samples += n
        self.blocking_requests += blocking

    def end_request(self, n: int, blocking: bool = False) -> None:
        """A request that `start_request` admitted (with the same `blocking`) has ended."""
        self.running_samples -= n
        self.blocking_requests -= blocking

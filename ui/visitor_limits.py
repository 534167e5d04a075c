"""What one visitor of the page may have running at once, counted on the page's side.

A public page is open to anyone, and its API to scripts: without a bound of its own, one visitor
with many tabs or a loop of API calls could fill the engine and the backend's loops, and everyone
else would wait. The backend has its own limits per address (docs/limits.md); these are the page's,
checked before a run opens a connection, each said to the visitor in plain words when reached. A
visitor is their address (`visitor_address`), which the page also forwards to the backend.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from backend.config.settings import Limits
from ui.run_request import RunRequest

RUNS_PER_VISITOR = 3
"""Runs one visitor may have streaming at once (each tab runs one; a new Generate replaces its tab's
run): two tabs side by side are a person comparing, more are a script filling the engine."""

TOKENS_PER_VISITOR = Limits.n_max * Limits.max_tokens_max
"""Samples x max tokens over one visitor's running runs: one run of the largest size the backend
takes (`Limits`: n = 32 x 2,048 tokens by default), so nobody holds more than that share of the
engine; a backend with other limits gives its own (`VisitorLimits.for_backend`)."""

BLOCKING_RUNS_PER_VISITOR = 1
"""Blocking-consumer experiments one visitor may run at once: the experiment loop runs one at a time
for everyone, and a second of the same visitor's would only wait for the first."""

BLOCKING_RUNS_AT_ONCE = 1
"""Blocking-consumer experiments running at once on the page, all visitors together: the backend runs
them on one experiment loop, one at a time (`Limits.max_blocking_requests`), and while one blocks
that loop it cannot even answer a second visitor's connection; the page says so instead."""

BLOCKING_BUDGET_S = 30.0
"""The longest a blocking-consumer run may hold its loop, worked out as n x max tokens x block ms
(one block per chunk, a chunk at most a token; the page's defaults make 10 s): the experiment loop
is every experimenting visitor's, one at a time, so one run may not keep it for minutes."""


def visitor_address(peer: str | None, forwarded_for: str | None, behind_proxy: bool) -> str:
    """Who a request comes from: the connection's peer, or `behind_proxy` (a Space, where every peer
    is the platform's own proxy, an internal address) the last address in `X-Forwarded-For`, the
    one that proxy appended. Earlier entries are whatever the client sent, so they are not believed."""
    if behind_proxy and forwarded_for:
        last = forwarded_for.split(",")[-1].strip()
        if last:
            return last
    return peer or "unknown"


class VisitorLimitReached(Exception):
    """A visitor's run would pass one of the limits above; the message says which and what to do."""


@dataclass(frozen=True)
class VisitorLimits:
    """The page-side limits (defaults above)."""

    runs: int = RUNS_PER_VISITOR
    tokens: int = TOKENS_PER_VISITOR
    blocking_runs: int = BLOCKING_RUNS_PER_VISITOR
    blocking_at_once: int = BLOCKING_RUNS_AT_ONCE
    blocking_budget_s: float = BLOCKING_BUDGET_S

    @classmethod
    def for_backend(cls, limits: Limits) -> VisitorLimits:
        """The page-side limits for a backend with `limits`: a visitor's share is one of its largest runs."""
        return cls(tokens=limits.n_max * limits.max_tokens_max)


@dataclass
class Ticket:
    """One admitted run, handed back to `VisitorLedger.release` when it ends."""

    visitor: str
    tokens: int
    blocking: bool
    released: bool = False


@dataclass
class VisitorLedger:
    """Counts each visitor's running runs, their tokens and their blocking experiments."""

    limits: VisitorLimits = field(default_factory=VisitorLimits)
    runs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    blocking: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def admit(self, visitor: str, request: RunRequest) -> Ticket:
        """Count `request` for `visitor`, or raise VisitorLimitReached saying which limit it passes."""
        limits = self.limits
        runs, tokens = self.runs.get(visitor, 0), self.tokens.get(visitor, 0)
        if runs >= limits.runs:
            raise VisitorLimitReached(
                f"you already have {runs} runs streaming (the page runs at most "
                f"{limits.runs} per visitor at once); cancel one or wait for it to finish"
            )
        if tokens + request.tokens > limits.tokens:
            raise VisitorLimitReached(
                f"this run asks for up to {request.tokens:,} tokens (n x max tokens) while your other "
                f"runs hold {tokens:,}; the page allows {limits.tokens:,} per visitor at "
                "once: lower n or max tokens, or wait for your other runs"
            )
        if request.blocking:
            if self.blocking.get(visitor, 0) >= limits.blocking_runs:
                raise VisitorLimitReached(
                    "you already have a blocking-consumer experiment running; wait for it to finish"
                )
            if sum(self.blocking.values()) >= limits.blocking_at_once:
                raise VisitorLimitReached(
                    "another visitor's blocking-consumer experiment is running (it blocks its loop on "
                    f"purpose, so {limits.blocking_at_once} at a time); try again in a few seconds, or "
                    "use the cooperative or greedy consumer"
                )
            block_ms = request.options["consumer"]["block_ms"]
            held_s = request.tokens * block_ms / 1000
            if held_s > limits.blocking_budget_s:
                raise VisitorLimitReached(
                    f"a blocking run of n = {request.n} x {request.params['max_tokens']} tokens at "
                    f"{block_ms:g} ms a chunk could hold the experiment loop for {held_s:,.0f} s; the "
                    f"page allows {limits.blocking_budget_s:g} s: lower n, max tokens or the block"
                )
        self.runs[visitor] += 1
        self.tokens[visitor] += request.tokens
        self.blocking[visitor] += request.blocking
        return Ticket(visitor, request.tokens, request.blocking)

    def release(self, ticket: Ticket) -> None:
        """The run of `ticket` has ended (once; a second call does nothing)."""
        if ticket.released:
            return
        ticket.released = True
        visitor = ticket.visitor
        self.runs[visitor] -= 1
        self.tokens[visitor] -= ticket.tokens
        self.blocking[visitor] -= ticket.blocking
        if self.runs[visitor] <= 0:
            for counts in (self.runs, self.tokens, self.blocking):
                counts.pop(visitor, None)

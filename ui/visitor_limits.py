"""What one visitor of the page may have running at once, counted on the page's side.

A public page is open to anyone, and its API to scripts: without a bound of its own, one visitor
with many tabs or a loop of API calls could fill the engine and the backend's loops, and everyone
else would wait. The backend has its own limits per address (docs/limits.md); these are the page's,
checked before a run opens a connection, each said to the visitor in plain words when reached.

A visitor is a browser session (Gradio's session: a tab), held to RUNS_PER_VISITOR runs and
TOKENS_PER_VISITOR tokens at once. An address (`visitor_address`, which the page also forwards to
the backend) is held to a class's share, RUNS_PER_ADDRESS runs and TOKENS_PER_ADDRESS tokens: the
students of a school reach a Space through one NAT address, and each gets their run, while a script
opening many sessions from one address is still bounded. A refusal names the session's own runs and
the address's count, never another session's runs.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from backend.config.settings import Limits
from ui.run_request import RunRequest

RUNS_PER_VISITOR = 3
"""Runs one visitor may have streaming at once (each tab runs one; a new Generate replaces its tab's
run): two tabs side by side are a person comparing, more are a script filling the engine."""

TOKENS_PER_VISITOR = Limits.n_max * Limits.max_tokens_max
"""Samples x max tokens over one visitor's running runs: one run of the largest size the backend
takes (`Limits`: n = 32 x 2,048 tokens by default), so nobody holds more than that share of the
engine; a backend with other limits gives its own (`VisitorLimits.for_backend`)."""

RUNS_PER_ADDRESS = 32
"""Runs streaming at once from one address, all its sessions together: a class of 30 behind one NAT
address each gets a run, and a script opening many sessions from one address holds at most this
many of the engine's runs; the backend's connections per address (`Limits.max_connections_per_address`,
64) leave room for each of these runs and the connection its session's previous run keeps."""

TOKENS_PER_ADDRESS = 4 * TOKENS_PER_VISITOR
"""Samples x max tokens over one address's running runs: four of the largest runs (32 x 2,048 tokens
each by default), or the class's 32 runs at n = 8 x 1,024 tokens: enough for a class of ordinary runs,
while one address cannot hold the engine's work that other addresses need."""

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
    address_runs: int = RUNS_PER_ADDRESS
    address_tokens: int = TOKENS_PER_ADDRESS

    @classmethod
    def for_backend(cls, limits: Limits) -> VisitorLimits:
        """The page-side limits for a backend with `limits`: a visitor's share is one of its largest
        runs, an address's four of them."""
        largest = limits.n_max * limits.max_tokens_max
        return cls(tokens=largest, address_tokens=4 * largest)


@dataclass
class Ticket:
    """One admitted run, handed back to `VisitorLedger.release` when it ends."""

    visitor: str
    tokens: int
    blocking: bool
    address: str = ""
    """The address the run came from ("": counted as the visitor's own)."""
    released: bool = False


@dataclass
class VisitorLedger:
    """Counts each visitor's (browser session's) running runs, their tokens and their blocking
    experiments, and each address's runs and tokens."""

    limits: VisitorLimits = field(default_factory=VisitorLimits)
    runs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    blocking: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    address_runs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    address_tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def admit(self, visitor: str, request: RunRequest, address: str = "") -> Ticket:
        """Count `request` for `visitor` (a browser session) from `address` (""): the visitor's
        own), or raise VisitorLimitReached saying which limit it passes."""
        limits = self.limits
        runs, tokens = self.runs.get(visitor, 0), self.tokens.get(visitor, 0)
        if runs >= limits.runs:
            raise VisitorLimitReached(
                f"you already have {runs} runs streaming in this browser session (the page runs at "
                f"most {limits.runs} per visitor at once); cancel one or wait for it to finish"
            )
        self._check_address(address or visitor, runs, request)
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
        self.address_runs[address or visitor] += 1
        self.address_tokens[address or visitor] += request.tokens
        return Ticket(visitor, request.tokens, request.blocking, address or visitor)

    def _check_address(self, address: str, own: int, request: RunRequest) -> None:
        """VisitorLimitReached where `request` would pass its address's share; `own`: the
        session's own runs, which the message names (the others are other people's)."""
        limits = self.limits
        runs, tokens = self.address_runs.get(address, 0), self.address_tokens.get(address, 0)
        yours = (
            f"{own} of them {'is' if own == 1 else 'are'} this session's" if own else "none is this session's"
        )
        if runs >= limits.address_runs:
            raise VisitorLimitReached(
                f"{runs} runs are streaming from your network's address ({yours}), the most the page "
                f"runs at once for one address ({limits.address_runs}: a class behind one address "
                "shares them, and other visitors keep their turn); wait a few seconds for some to "
                "finish, then press Generate again"
            )
        if tokens + request.tokens > limits.address_tokens:
            raise VisitorLimitReached(
                f"this run asks for up to {request.tokens:,} tokens (n x max tokens), and the runs "
                f"streaming from your network's address ({yours}) hold {tokens:,} of the "
                f"{limits.address_tokens:,} the page allows one address at once: lower n or max "
                "tokens, or wait for some to finish"
            )

    def release(self, ticket: Ticket) -> None:
        """The run of `ticket` has ended (once; a second call does nothing)."""
        if ticket.released:
            return
        ticket.released = True
        visitor, address = ticket.visitor, ticket.address or ticket.visitor
        self.runs[visitor] -= 1
        self.tokens[visitor] -= ticket.tokens
        self.blocking[visitor] -= ticket.blocking
        if self.runs[visitor] <= 0:
            for counts in (self.runs, self.tokens, self.blocking):
                counts.pop(visitor, None)
        self.address_runs[address] -= 1
        self.address_tokens[address] -= ticket.tokens
        if self.address_runs[address] <= 0:
            self.address_runs.pop(address, None)
            self.address_tokens.pop(address, None)


BEHIND_PROXY = bool(os.environ.get("SPACE_ID"))
"""In a Space every request comes through the platform's proxy, which says who sent it in
X-Forwarded-For (`visitor_address`)."""


def request_address(request: Any) -> str:
    """The address of the visitor who sent a Gradio request, for the page's limits and the backend's."""
    if request is None:
        return "unknown"
    peer = request.client.host if request.client else None
    return visitor_address(peer, request.headers.get("x-forwarded-for"), BEHIND_PROXY)


def session_of(request: Any) -> str:
    """The browser session a Gradio request comes from (its `session_hash`): a visitor."""
    return (request.session_hash if request is not None else None) or "anonymous"

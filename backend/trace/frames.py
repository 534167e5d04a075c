"""Tracer events turned into what clients see, without I/O: live `trace` frames and Chrome export.

The tracer's new events are digested once per frame interval for every connection together
(`digest_ring`: one pass over the ring's raw entries), and each connection's frame is cut from that
digest (`connection_frame`), so the cost of live frames follows the events, not events x
connections. Live frames are compact: consecutive steps of one task less than `MERGE_GAP_NS` apart
merge into one slice `[start_ms, end_ms, busy_ms, name, count, longest_step_ms]`, so a frame's size
follows the loop's activity in tasks, not in callbacks; a sample's chunks within `CHUNK_BIN_NS` merge into one
entry `[t_ms, request_id, index, tokens, chunks]`. A connection sees its own requests' chunks and
cancels, the loop's work under the names of its own tasks, and other connections' tasks only as
"other connection".

Export is Chrome trace-event JSON (https://perfetto.dev opens it): `X` slices for loop work (`cat`
"loop", `name` the task; `cat` "idle" for select() waits), `i` instants for chunk arrivals (`cat`
"chunk", `args.index`) on one lane per sample, `i` instants for the cancel chain (`cat` "cancel"), a
`C` counter for loop lag in ms, an `X` slice for the request's prefill (`cat` "prefill", handed to
the engine until its first chunk, `args` the prompt tokens computed and reused) on a lane of its
own, and `M` metadata naming the process and lanes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backend.trace.recorder import CANCEL, CHUNK, FRAME, IDLE, LAG, STEP, Event, Stall

if TYPE_CHECKING:
    from backend.trace.prefill import PrefillSpan

try:
    from backend.trace._trace_digest import digest as _c_digest
except ImportError:  # not built: there is no tracer either (trace.recorder.available())
    _c_digest = None
assert (STEP, IDLE, LAG, CHUNK, FRAME, CANCEL) == (0, 1, 2, 3, 4, 5), "the kinds trace_digest.c reads"

MERGE_GAP_NS = 5_000_000
"""Steps of one task closer than this merge into one live slice (bounds a frame's size). The panel's
pixel columns are 5-100 ms wide, so merging finer than this shows nothing more; at 0.2 ms every
engine sample's step is its own slice, and building and encoding them is a tenth of the backend."""

CHUNK_BIN_NS = 20_000_000
"""A sample's chunks less than this after the first of a run of them go in one live entry, with
their count: at hundreds of tokens a second per sample, one entry per chunk made trace frames most
of the bytes sent. The page keeps one tick per sample per 20 ms (`ui.trace_state.TICK_MS`) and
draws a pixel per 50 ms or more, so finer entries show nothing more (at 10 ms, building and
encoding them is a third of the live trace's cost at n = 32); the export keeps every chunk."""

OTHER_BUCKET_NS = 5_000_000
"""Other connections' work reaches a connection as one "other connection" slice per 5 ms: its
size then does not grow with the number of connections (each connection's frame had a slice per
task of every connection: quadratic in connections)."""

_NUMBERED = re.compile(r"[-_ #]*\d+$")
"""The number at the end of a task name ("synthetic-sample-3", "Task-12")."""

MIN_IDLE_NS = 1_000_000
"""Shorter select() waits are counted in the stats but not sent as idle spans (a busy loop makes
thousands a second)."""

OTHER_CONNECTION = "other connection"

LOOP_TID = 1
SAMPLE_TID_BASE = 100


def task_label(name: str, connection: str) -> str:
    """A task name as `connection` may see it: its own tasks without the suffix, others anonymous."""
    head, separator, owner = name.rpartition(" @")
    if not separator:
        return name
    return head if owner == connection else OTHER_CONNECTION


@dataclass
class TraceDigest:
    """A batch of tracer events reduced once, for every connection: times in ns."""

    start_ns: int = -1
    end_ns: int = -1
    names: list[str] = field(default_factory=list)
    """Task names as recorded (with their `@connection`), indexed by the slices."""
    names_by_owner: dict[str | None, list[int]] = field(default_factory=dict)
    """Name indexes per owning connection (None: tasks of no connection: engine, tracer, I/O)."""
    slices_by_owner: dict[str | None, list[list[Any]]] = field(default_factory=dict)
    """Per owning connection: [start, end, busy, name index, steps, longest step]."""
    owned_buckets: dict[int, list[Any]] = field(default_factory=dict)
    """All connections' tasks per OTHER_BUCKET_NS bucket: [busy, steps, longest, its owner, longest
    of any other owner], so that each connection's "other connection" lane is a subtraction."""
    buckets_by_owner: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    """One connection's tasks per bucket: [busy, steps]."""
    idle: list[list[float]] = field(default_factory=list)
    lag: list[list[float]] = field(default_factory=list)
    chunks: dict[str, list[list[Any]]] = field(default_factory=dict)
    """Per connection: [first arrival, request id, index, tokens, chunks]."""
    cancels: dict[str, list[list[Any]]] = field(default_factory=dict)
    frames: dict[str, list[int]] = field(default_factory=dict)
    """Per connection: [frames, bytes]."""
    steps: int = 0
    busy_ns: int = 0
    idle_ns: int = 0


@functools.lru_cache(maxsize=4096)
def _classify(name: str) -> tuple[str, str | None]:
    """A task name's lane and owning connection: `name @c1` belongs to c1; numbered tasks of no
    connection (an engine's task per sample) share one lane.

    Cached: each digest classifies every name it meets, and the regular expression for the
    numbered names cost about 100 us a frame at n = 64."""
    _, separator, owner = name.rpartition(" @")
    if separator:
        return name, owner
    return _NUMBERED.sub("", name) or name, None


def _to_ms(ns: int) -> float:
    """ns as ms to the microsecond (rounded down): live frames make thousands of these a second, and
    `round(ns / 1e6, 3)` cost 0.7 us a call here, this 0.1 us."""
    return ns // 1000 / 1000


def digest_ring(times: Sequence[int], items: list[Any], boundary: int, origin_ns: int) -> TraceDigest:
    """Reduce raw ring entries (see `LoopTracer.raw_since`) in one pass, in C
    (backend/trace/trace_digest.c: this runs for every event the loop records).

    An item that is a str is a step of that task which ended at its time and began at `boundary`, the
    end of the step or idle wait before it; any other item is `(kind, duration, subject, detail)`
    starting at its time (STEP items of that form carry their own start). A step whose start is
    unknown (boundary -1, the step before it overwritten) is left out; an unknown kind is ignored.
    Each step's name is classified (`_classify`) into a lane and its owning connection; steps of one
    lane less than MERGE_GAP_NS apart merge into one slice; connections' steps are also summed per
    OTHER_BUCKET_NS bucket; a sample's chunks within CHUNK_BIN_NS of the first of a run merge; idle
    waits shorter than MIN_IDLE_NS are counted but not listed.
    """
    if _c_digest is None:
        raise RuntimeError("the tracer's C digest (backend/trace/trace_digest.c) is not built")
    return _c_digest(
        times,
        items,
        boundary,
        origin_ns,
        TraceDigest(),
        MERGE_GAP_NS,
        CHUNK_BIN_NS,
        OTHER_BUCKET_NS,
        MIN_IDLE_NS,
        _to_ms,
        _classify,
    )


def loop_watch(
    stall: Stall, now_ns: int, origin_ns: int, waiting: int | None, running: list[str]
) -> dict[str, Any]:
    """A loop as watched from outside it (`LoopTracer.stall`), in the trace's ms: `at_ms` now,
    `since_ms` when the step running now began, `stall_ms` how long it has run, `lag_ms` how late
    the heartbeat is, `taken` the chunks taken in that step, `waiting` the chunks the engine has
    handed over and the loop not taken (None where the engine hands none over), `running` the
    request ids on the loop."""
    known = stall.since_ns >= 0
    return {
        "at_ms": _ms(now_ns, origin_ns),
        "since_ms": _ms(stall.since_ns, origin_ns) if known else None,
        "stall_ms": _to_ms(stall.stall_ns),
        "lag_ms": _to_ms(stall.lag_ns),
        "taken": stall.taken,
        "waiting": waiting,
        "running": running,
    }


def connection_frame(digest: TraceDigest, origin_ns: int, connection: str) -> dict[str, Any]:
    """The `trace` frame `connection` gets from a digest: its own requests' chunks and cancels, the
    loop's work under its own task names, other connections' work as "other connection" (one slice
    per OTHER_BUCKET_NS). Its cost follows this connection's own work, not every connection's."""
    names: list[str] = []
    remap: dict[int, int] = {}
    for owner in (None, connection):
        for index in digest.names_by_owner.get(owner, ()):
            name = digest.names[index]
            remap[index] = len(names)
            names.append(task_label(name, connection))
    slices = [
        [s, e, busy, remap[name], count, longest]
        for owner in (None, connection)
        for s, e, busy, name, count, longest in digest.slices_by_owner.get(owner, ())
    ]
    others = _other_connections(digest, connection)
    if others:
        slices.extend([*bucket[:3], len(names), *bucket[3:]] for bucket in others)
        names.append(OTHER_CONNECTION)
    slices.sort()
    frames, frame_bytes = digest.frames.get(connection, (0, 0))
    empty = digest.end_ns < 0
    return {
        "type": "trace",
        "start_ms": None if empty else _ms(digest.start_ns, origin_ns),
        "end_ms": None if empty else _ms(digest.end_ns, origin_ns),
        "names": names,
        "slices": [
            [_ms(s, origin_ns), _ms(e, origin_ns), _to_ms(busy), name, count, _to_ms(longest)]
            for s, e, busy, name, count, longest in slices
        ],
        "idle": digest.idle,
        "lag": digest.lag,
        "chunks": [
            [_ms(t, origin_ns), request_id, index, tokens, count]
            for t, request_id, index, tokens, count in digest.chunks.get(connection, ())
        ],
        "cancels": digest.cancels.get(connection, []),
        "counts": {
            "steps": digest.steps,
            "busy_ms": _to_ms(digest.busy_ns),
            "idle_ms": _to_ms(digest.idle_ns),
            "frames": frames,
            "frame_bytes": frame_bytes,
        },
    }


def _other_connections(digest: TraceDigest, connection: str) -> list[list[int]]:
    """Other connections' work, one `[start, end, busy, count, longest]` per OTHER_BUCKET_NS that
    holds any: each bucket's owned work less `connection`'s own."""
    mine = digest.buckets_by_owner.get(connection, {})
    buckets = []
    for bucket, (busy, count, longest, longest_owner, runner_up) in digest.owned_buckets.items():
        own = mine.get(bucket)
        if own is not None:
            busy -= own[0]
            count -= own[1]
        if count <= 0:
            continue
        start = bucket * OTHER_BUCKET_NS
        longest_other = runner_up if longest_owner == connection else longest
        buckets.append([start, start + OTHER_BUCKET_NS, busy, count, longest_other])
    return buckets


def _ms(ns: int, origin_ns: int) -> float:
    """Time `ns` as ms since `origin_ns`, to the microsecond (see `_to_ms`)."""
    return _to_ms(ns - origin_ns)


def live_frame(events: Iterable[Event], origin_ns: int, connection: str) -> dict[str, Any]:
    """One `trace` frame for `connection` from event tuples (as `LoopTracer.since` gives them)."""
    times: list[int] = []
    items: list[Any] = []
    for kind, start, duration, subject, detail in events:
        times.append(start)
        items.append((kind, duration, subject, detail))
    return connection_frame(digest_ring(times, items, -1, origin_ns), origin_ns, connection)


def chrome_trace(
    events: Iterable[Event],
    origin_ns: int,
    connection: str,
    request_id: str,
    window: tuple[int, int],
    prefills: Sequence[PrefillSpan] = (),
) -> list[dict[str, Any]]:
    """Chrome trace events for one request: the loop's work in `window` (ns), the request's chunks,
    and its prefill spans whose first chunk came (one, or one per sub-request of fan-out)."""
    low, high = window
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": CHROME_PID, "args": {"name": "backend event loop"}},
        {
            "ph": "M",
            "name": "thread_name",
            "pid": CHROME_PID,
            "tid": LOOP_TID,
            "args": {"name": "event loop"},
        },
    ]
    for position, prefill in enumerate(prefills):
        if prefill.end_ns is not None:
            out.extend(_prefill_events(prefill, origin_ns, position, len(prefills)))
    sample_lanes: set[int] = set()
    names: dict[str, str] = {}
    mine = (connection, request_id)
    for kind, start, duration, subject, detail in events:
        if start + duration < low or start > high:
            continue
        ts = round((start - origin_ns) / 1e3, 3)
        if kind == STEP:
            if subject not in names:
                names[subject] = task_label(subject, connection)
            out.append(_loop_slice("loop", names[subject], ts, duration))
        elif kind == IDLE:
            out.append({**_loop_slice("idle", "idle (select)", ts, duration), "args": {"events": detail}})
        elif kind == LAG:
            lag = {"lag_ms": round(duration / 1e6, 3)}
            out.append({"ph": "C", "name": "loop lag", "ts": ts, "pid": CHROME_PID, "args": lag})
        elif kind == CHUNK and subject == mine:
            index, tokens = detail
            sample_lanes.add(index)
            chunk = {"index": index, "tokens": tokens}
            out.append(_instant("chunk", "chunk", "t", ts, SAMPLE_TID_BASE + index, chunk))
        elif kind == CANCEL and subject == mine:
            stage, index = detail
            cancel = {"stage": stage, "index": index}
            out.append(_instant("cancel", f"cancel {stage}", "p", ts, LOOP_TID, cancel))
    for index in sorted(sample_lanes):
        name = {"name": f"sample {index}"}
        tid = SAMPLE_TID_BASE + index
        out.append({"ph": "M", "name": "thread_name", "pid": CHROME_PID, "tid": tid, "args": name})
    return out


CHROME_PID = 1
"""The one process of a request's Chrome trace: the backend's loop."""

PREFILL_TID = 2
"""The Chrome trace's lane of the request's prefill span (sub-request i's: PREFILL_TID_BASE + i)."""

PREFILL_TID_BASE = 50
"""The lanes of fan-out's sub-requests' prefill spans, one each (under the sample lanes' base)."""


def _prefill_events(
    prefill: PrefillSpan, origin_ns: int, position: int = 0, of: int = 1
) -> list[dict[str, Any]]:
    """A prefill span (`cat` "prefill") on a lane of its own, with the engine's prompt-token counts:
    the request's, or sub-request `position`'s of `of`."""
    assert prefill.end_ns is not None
    args: dict[str, Any] = {"prompt_tokens": None, "computed": None, "reused": None}
    if prefill.counts is not None:
        prompt, cached = prefill.counts
        args = {"prompt_tokens": prompt, "computed": prompt - cached, "reused": cached}
    tid = PREFILL_TID if of == 1 else PREFILL_TID_BASE + position
    span = _loop_slice("prefill", "prefill", round((prefill.start_ns - origin_ns) / 1e3, 3), 0)
    span.update(tid=tid, dur=round((prefill.end_ns - prefill.start_ns) / 1e3, 3), args=args)
    whose = "" if of == 1 else f" of request {position}"
    lane = {"name": f"prefill{whose} (handed to engine → first chunk)"}
    return [{"ph": "M", "name": "thread_name", "pid": CHROME_PID, "tid": tid, "args": lane}, span]


def _loop_slice(category: str, name: str, ts: float, duration_ns: int) -> dict[str, Any]:
    """A complete event (`X`) on the loop's lane: a step or an idle wait."""
    dur = round(duration_ns / 1e3, 3)
    return {
        "ph": "X",
        "cat": category,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": CHROME_PID,
        "tid": LOOP_TID,
    }


def _instant(
    category: str, name: str, scope: str, ts: float, tid: int, args: dict[str, Any]
) -> dict[str, Any]:
    """An instant event (`i`): a chunk on its sample's lane (`scope` "t") or a cancel (`"p"`)."""
    return {
        "ph": "i",
        "cat": category,
        "name": name,
        "s": scope,
        "ts": ts,
        "pid": CHROME_PID,
        "tid": tid,
        "args": args,
    }

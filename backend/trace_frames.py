"""Tracer events turned into what clients see, without I/O: live `trace` frames and Chrome export.

Live frames are compact: consecutive steps of one task less than `MERGE_GAP_NS` apart merge into one
slice `[start_ms, end_ms, busy_ms, name, count, longest_step_ms]`, so a frame's size follows the
loop's activity in tasks, not in callbacks; a sample's chunks within `CHUNK_BIN_NS` merge into one
entry `[t_ms, request_id, index, tokens, chunks]`. A connection sees its own requests' chunks and
cancels, the loop's work under the names of its own tasks, and other connections' tasks only as
"other connection".

Export is Chrome trace-event JSON (https://perfetto.dev opens it): `X` slices for loop work (`cat`
"loop", `name` the task; `cat` "idle" for select() waits), `i` instants for chunk arrivals (`cat`
"chunk", `args.index`) on one lane per sample, `i` instants for the cancel chain (`cat` "cancel"), a
`C` counter for loop lag in ms, and `M` metadata naming the process and lanes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from backend.trace import CANCEL, CHUNK, FRAME, IDLE, LAG, STEP, Event

MERGE_GAP_NS = 200_000
"""Steps of one task closer than this merge into one live slice (bounds a frame's size)."""

CHUNK_BIN_NS = 10_000_000
"""A sample's chunks less than this after the first of a run of them go in one live entry, with
their count: at hundreds of tokens a second per sample, one entry per chunk made trace frames most
of the bytes sent. The page draws a tick per pixel (about 50 ms); the export keeps every chunk."""

MIN_IDLE_NS = 100_000
"""Shorter select() waits are counted in the stats but not sent as idle spans."""

OTHER_CONNECTION = "other connection"

LOOP_TID = 1
SAMPLE_TID_BASE = 100


def task_label(name: str, connection: str) -> str:
    """A task name as `connection` may see it: its own tasks without the suffix, others anonymous."""
    head, separator, owner = name.rpartition(" @")
    if not separator:
        return name
    return head if owner == connection else OTHER_CONNECTION


_NO_EVENT = 1 << 80
"""Larger than any perf_counter_ns(): the first event's start is always below it."""


def _ms(ns: int, origin_ns: int) -> float:
    return round((ns - origin_ns) / 1e6, 3)


def live_frame(events: Iterable[Event], origin_ns: int, connection: str) -> dict[str, Any]:
    """One `trace` frame for `connection` from a batch of events in recording order."""
    names: list[str] = []
    name_index: dict[str, int] = {}
    labels: dict[str, int] = {}
    slices: list[list[Any]] = []
    open_slice: dict[int, list[Any]] = {}
    idle: list[list[float]] = []
    lag: list[list[float]] = []
    chunks: list[list[Any]] = []
    open_chunk: dict[tuple[Any, int], list[Any]] = {}
    cancels: list[list[Any]] = []
    busy_ns = idle_ns = steps = frames = frame_bytes = 0
    # Comparisons, not min()/max() calls: this loop runs for every event the loop recorded.
    start_ns, end_ns = _NO_EVENT, -1
    for kind, start, duration, subject, detail in events:
        if start < start_ns:
            start_ns = start
        if start + duration > end_ns:
            end_ns = start + duration
        if kind == STEP:
            steps += 1
            busy_ns += duration
            index = labels.get(subject)
            if index is None:
                label = task_label(subject, connection)
                index = name_index.setdefault(label, len(names))
                if index == len(names):
                    names.append(label)
                labels[subject] = index
            current = open_slice.get(index)
            if current is not None and start - current[1] <= MERGE_GAP_NS:
                current[1] = start + duration
                current[2] += duration
                current[4] += 1
                current[5] = max(current[5], duration)
            else:
                current = [start, start + duration, duration, index, 1, duration]
                open_slice[index] = current
                slices.append(current)
        elif kind == IDLE:
            idle_ns += duration
            if duration >= MIN_IDLE_NS:
                idle.append([_ms(start, origin_ns), round(duration / 1e6, 3)])
        elif kind == LAG:
            lag.append([_ms(start, origin_ns), round(duration / 1e6, 3)])
        elif kind == CHUNK and subject[0] == connection:
            key = (subject[1], detail[0])
            entry = open_chunk.get(key)
            if entry is not None and start - entry[0] <= CHUNK_BIN_NS:
                entry[3] += detail[1]
                entry[4] += 1
            else:
                entry = open_chunk[key] = [start, subject[1], detail[0], detail[1], 1]
                chunks.append(entry)
        elif kind == CANCEL and subject[0] == connection:
            cancels.append([_ms(start, origin_ns), subject[1], detail[1], detail[0]])
        elif kind == FRAME and subject == connection:
            frames += 1
            frame_bytes += detail[1]
    return {
        "type": "trace",
        "start_ms": None if end_ns < 0 else _ms(start_ns, origin_ns),
        "end_ms": None if end_ns < 0 else _ms(end_ns, origin_ns),
        "names": names,
        "slices": [
            [
                round((s - origin_ns) / 1e6, 3),
                round((e - origin_ns) / 1e6, 3),
                round(busy / 1e6, 3),
                name,
                count,
                round(longest / 1e6, 3),
            ]
            for s, e, busy, name, count, longest in slices
        ],
        "idle": idle,
        "lag": lag,
        "chunks": [
            [_ms(t, origin_ns), request_id, index, tokens, count]
            for t, request_id, index, tokens, count in chunks
        ],
        "cancels": cancels,
        "counts": {
            "steps": steps,
            "busy_ms": round(busy_ns / 1e6, 3),
            "idle_ms": round(idle_ns / 1e6, 3),
            "frames": frames,
            "frame_bytes": frame_bytes,
        },
    }


def chrome_trace(
    events: Iterable[Event], origin_ns: int, connection: str, request_id: str, window: tuple[int, int]
) -> list[dict[str, Any]]:
    """Chrome trace events for one request: the loop's work in `window` (ns) and the request's chunks."""
    low, high = window
    pid = 1
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "backend event loop"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": LOOP_TID, "args": {"name": "event loop"}},
    ]
    sample_lanes: set[int] = set()
    names: dict[str, str] = {}

    def us(ns: int) -> float:
        return round((ns - origin_ns) / 1e3, 3)

    for kind, start, duration, subject, detail in events:
        if start + duration < low or start > high:
            continue
        if kind == STEP:
            if subject not in names:
                names[subject] = task_label(subject, connection)
            out.append(
                {
                    "ph": "X",
                    "cat": "loop",
                    "name": names[subject],
                    "ts": us(start),
                    "dur": round(duration / 1e3, 3),
                    "pid": pid,
                    "tid": LOOP_TID,
                }
            )
        elif kind == IDLE:
            out.append(
                {
                    "ph": "X",
                    "cat": "idle",
                    "name": "idle (select)",
                    "ts": us(start),
                    "dur": round(duration / 1e3, 3),
                    "pid": pid,
                    "tid": LOOP_TID,
                    "args": {"events": detail},
                }
            )
        elif kind == LAG:
            out.append(
                {
                    "ph": "C",
                    "name": "loop lag",
                    "ts": us(start),
                    "pid": pid,
                    "args": {"lag_ms": round(duration / 1e6, 3)},
                }
            )
        elif kind == CHUNK and subject == (connection, request_id):
            index, tokens = detail
            sample_lanes.add(index)
            out.append(
                {
                    "ph": "i",
                    "cat": "chunk",
                    "name": "chunk",
                    "s": "t",
                    "ts": us(start),
                    "pid": pid,
                    "tid": SAMPLE_TID_BASE + index,
                    "args": {"index": index, "tokens": tokens},
                }
            )
        elif kind == CANCEL and subject == (connection, request_id):
            stage, index = detail
            out.append(
                {
                    "ph": "i",
                    "cat": "cancel",
                    "name": f"cancel {stage}",
                    "s": "p",
                    "ts": us(start),
                    "pid": pid,
                    "tid": LOOP_TID,
                    "args": {"stage": stage, "index": index},
                }
            )
    for index in sorted(sample_lanes):
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": SAMPLE_TID_BASE + index,
                "args": {"name": f"sample {index}"},
            }
        )
    return out

"""What a request's consumer read from the engine, per output: its size and the consumer's own time.

With cumulative outputs (`"output_kind": "cumulative"`) the `consume` task notes each engine output
it takes (`ReadLog.add`): the bytes the output carries (its text so far, in UTF-8) and the time the
consumer spent on it until it handed the loop back. Delta outputs, the default, are not noted: each
is one token's text, and the note itself (two clock reads and an entry per token) cost 5-10 % of the
loop at 64 samples. A sample's outputs within
`CHUNK_BIN_NS` of the first of a run of them go in one entry (the largest output, the total time,
the count), as the live trace's chunk entries do, so the trace frame's size follows time, not
tokens. `take` hands the entries over for the next trace frame.
"""

from __future__ import annotations

from typing import Any

from backend.trace.frames import CHUNK_BIN_NS

ReadEntry = list[Any]
"""[first output's time (ns), request id, index, largest output (bytes), consumer time (ns), outputs]."""


class ReadLog:
    """One connection's consumer reads since its last trace frame, binned per sample."""

    def __init__(self) -> None:
        self._entries: list[ReadEntry] = []
        self._open: dict[tuple[str, int], ReadEntry] = {}

    def add(self, at_ns: int, request_id: str, index: int, size: int, spent_ns: int) -> None:
        """The consumer of `request_id` took an output of sample `index` of `size` bytes at `at_ns`
        and spent `spent_ns` on it."""
        key = (request_id, index)
        entry = self._open.get(key)
        if entry is not None and at_ns - entry[0] <= CHUNK_BIN_NS:
            if size > entry[3]:
                entry[3] = size
            entry[4] += spent_ns
            entry[5] += 1
        else:
            entry = self._open[key] = [at_ns, request_id, index, size, spent_ns, 1]
            self._entries.append(entry)

    def take(self, origin_ns: int) -> list[list[Any]]:
        """The entries since the last take, for a trace frame: `[t_ms, request_id, index, bytes,
        us_per_output, outputs]`, t in ms since `origin_ns`; `bytes` is the largest output's."""
        entries, self._entries = self._entries, []
        self._open.clear()
        return [
            [(at - origin_ns) // 1000 / 1000, request_id, index, size, round(spent / count / 1000, 1), count]
            for at, request_id, index, size, spent, count in entries
        ]

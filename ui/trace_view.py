"""The trace panel, without I/O: live `trace` frames in, loop figures and a swimlane SVG out.

Lanes, top to bottom: the loop (how busy it was in each pixel column, stacked by kind of task:
consuming streams, sending frames, socket I/O, the engine's own tasks, the tracer, other clients),
the loop's lag (how late a 20 ms heartbeat woke), the consumer's reads, the request's prefill (from
when the backend handed it to the engine until its first chunk, labelled with the prompt tokens the
engine computed and reused from its cache), then one lane per sample with a tick for each
chunk, aligned with the columns. Red lines mark the cancel chain. Everything is drawn from the
server's measurements (folded in by `ui.trace_state.TraceView`); only the last `WINDOW_MS` is kept
and drawn.

A step of STALL_MS or more is outlined to scale in the loop lane (`trace-stall`), the longest
labelled with its length. While a blocking run holds its loop, nothing comes on the run's
connection: the panel draws the backend's watch of that loop instead (`ui.loop_watch`), the step
running now as a growing band (`trace-stall live`) and the heartbeat's lag as it rises (dashed),
and a Cancel waiting for the loop as a band from its press until the loop read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

from ui.trace_state import WINDOW_MS, TraceView

__all__ = ["TraceView", "category", "panel_html"]

STALL_MS = 100.0
"""A step this long or longer is outlined in the loop lane, to scale: a stall a person should see."""

STALL_COLOR = "#dc2626"

WIDTH = 440
LABEL_W = 56
LOOP_H = 40
LAG_H = 40
LANE_H = 10
READ_H = 30
PREFILL_H = 12
PREFILL_COLOR = "#db2777"
COLUMN_PX = 2

TICK_GAP_PX = 2
"""Chunk ticks this close (pixels) are drawn as one bar."""

CATEGORY_COLORS = {
    "consume": "#2563eb",
    "send": "#16a34a",
    "socket": "#64748b",
    "engine": "#f59e0b",
    "tracer": "#c084fc",
    "other": "#94a3b8",
}


SERVER_ENGINE_TASKS = ("fanout", "engine")
"""The server's own tasks that drive the engine: fan-out's pumps, the engine's start and watch."""


def category(task: str, engine_tasks: str = "") -> str:
    """The kind of work a task name stands for, for the loop lane's colours; `engine_tasks` is how
    the run's engine's task names begin (its `accepted` frame's `engine_tasks`)."""
    if task.startswith("consume"):
        return "consume"
    if task.startswith("send"):
        return "send"
    if task.startswith(("ws reader", "socket", "accept")):
        return "socket"
    if task.startswith(SERVER_ENGINE_TASKS) or (engine_tasks and task.startswith(engine_tasks)):
        return "engine"
    if task.startswith(("heartbeat", "trace")):
        return "tracer"
    return "other"


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def figures_html(view: TraceView) -> str:
    """The numbers beside the timeline."""
    f = view.figures()
    cells = [
        ("loop busy", _fmt(f["utilisation"], "{:.0%}")),
        (
            "lag p50 / p99 / max",
            " / ".join(_fmt(f[k], "{:.1f}") for k in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms")) + " ms",
        ),
        ("longest stall", _fmt(f["longest_stall_ms"], "{:.1f} ms")),
        (
            "consumer steps / mean",
            f"{_fmt(f['consume_steps'], '{:.0f}')} / {_fmt(f['consume_step_ms'], '{:.2f} ms')}",
        ),
        ("callbacks/s", _fmt(f["callbacks_per_s"], "{:.0f}")),
        ("chunks/s", _fmt(f["chunks_per_s"], "{:.0f}")),
        ("frames/s", _fmt(f["frames_per_s"], "{:.0f}")),
        ("cancel latency", _fmt(f["cancel_latency_ms"], "{:.1f} ms")),
        ("tracer cost", _fmt(view.record_ns, "{:.0f} ns/step")),
        ("read per output (latest)", _fmt(f["read_bytes"], "{:,.0f} B")),
        ("consumer per output (latest)", _fmt(f["read_us"], "{:.1f} µs")),
    ]
    live = view.live
    if live is not None and live.blocked:
        behind = "" if live.waiting is None else f", {live.waiting} chunks waiting"
        cells.insert(0, ("blocked now", f"{live.stall_ms / 1000:.1f} s{behind}"))
    items = "".join(f"<div><span>{escape(k)}</span><b>{escape(v)}</b></div>" for k, v in cells)
    return f'<div class="trace-figures">{items}</div>{_compared(view, f)}'


COMPARED = (
    ("consumer steps", "consume_steps", "{:.0f}"),
    ("mean consumer step", "consume_step_ms", "{:.2f} ms"),
    ("longest stall", "longest_stall_ms", "{:.1f} ms"),
    ("lag p99", "lag_p99_ms", "{:.1f} ms"),
)
"""The figures set side by side with the previous run's where the consumer differs."""


def _compared(view: TraceView, figures: dict[str, float | None]) -> str:
    """This run's consumer figures beside the session's previous run's, where that run's consumer
    was another ("" otherwise)."""
    if view.compare is None or not view.consumer or view.compare[0] in ("", view.consumer):
        return ""
    mode, before = view.compare
    head = f"<tr><th></th><th>this run ({escape(view.consumer)})</th><th>last run ({escape(mode)})</th></tr>"
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(_fmt(figures.get(key), pattern))}</td>"
        f"<td>{escape(_fmt(before.get(key), pattern))}</td></tr>"
        for name, key, pattern in COMPARED
    )
    return f'<table class="trace-compare">{head}{rows}</table>'


@dataclass(frozen=True)
class _Plot:
    """The trace's time window on the panel's width: `t0` ms at the left of the plot, `span` ms wide."""

    t0: float
    span: float

    @property
    def columns(self) -> int:
        """Pixel columns of COLUMN_PX across the plot."""
        return (WIDTH - LABEL_W) // COLUMN_PX

    def x(self, t: float) -> float:
        """Where time `t` (ms) is drawn."""
        return LABEL_W + (t - self.t0) / self.span * (WIDTH - LABEL_W)


def trace_svg(view: TraceView, n: int) -> str:
    """The swimlane timeline: loop work, loop lag, one lane per sample, cancel markers."""
    live = view.live
    if view.first_ms is None or (view.last_ms is None and live is None):
        return '<div class="trace-empty">The loop trace appears here while samples stream.</div>'
    ends = [t for t in (view.last_ms, live.at_ms if live is not None else None) if t is not None]
    t1 = max(ends)
    t0 = max(view.first_ms, t1 - WINDOW_MS)
    plot = _Plot(t0, max(t1 - t0, 1.0))
    parts: list[str] = []
    y = _loop_lane(view, plot, parts, 4)
    y = _lag_lane(view, plot, parts, y)
    y = _read_lane(view, plot, parts, y)
    y = _prefill_lane(view, plot, parts, y)
    lanes_top = y
    y = _sample_lanes(view, n, plot, parts, y)
    _cancel_marks(view, plot, parts, lanes_top, y)
    _cancel_wait(view, plot, parts, y)
    height = y + 14
    axis = f'y="{height - 2}" font-size="9" fill="#64748b"'
    parts.append(
        f'<text x="{LABEL_W}" {axis}>0 ms</text>'
        f'<text x="{WIDTH}" {axis} text-anchor="end">{plot.span:.0f} ms</text>'
    )
    legend = "".join(
        f'<span><i style="background:{color}"></i>{name}</span>' for name, color in CATEGORY_COLORS.items()
    )
    return (
        f'<svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" aria-label="event loop trace" '
        f'class="trace-svg">' + "".join(parts) + f'</svg><div class="trace-legend">{legend}</div>'
    )


def _lane_rule(y: float) -> str:
    """The line under a lane."""
    return f'<line x1="{LABEL_W}" x2="{WIDTH}" y1="{y}" y2="{y}" stroke="#cbd5e1"/>'


def _loop_lane(view: TraceView, plot: _Plot, parts: list[str], y: float) -> float:
    """The loop lane at `y`: its busy fraction per pixel column, stacked by category; the next lane's y."""
    columns = plot.columns
    column_ms = plot.span / columns
    busy: dict[str, list[float]] = {c: [0.0] * columns for c in CATEGORY_COLORS}
    for start, end, work, name, _count, _longest in view.slices:
        if end < plot.t0:
            continue
        first = max(0, min(columns - 1, int((start - plot.t0) / column_ms)))
        last = max(first, min(columns - 1, int((end - plot.t0) / column_ms)))
        share = work / (last - first + 1)
        lane = busy[category(name, view.engine_tasks)]
        for col in range(first, last + 1):
            lane[col] += share
    parts.append(_label("loop", y + LOOP_H / 2))
    stacked = [0.0] * columns
    for name, color in CATEGORY_COLORS.items():
        runs = []
        for col, value in enumerate(busy[name]):
            px = round(min(1.0, value / column_ms) * LOOP_H)
            if px:
                runs.append((col, px, y + LOOP_H - stacked[col] - px))
                stacked[col] += px
        parts.extend(
            f'<rect x="{LABEL_W + col * COLUMN_PX:.0f}" y="{base:.0f}" width="{count * COLUMN_PX:.0f}" '
            f'height="{px:.0f}" fill="{color}"/>'
            for col, count, px, base in _merged(runs)
        )
    _stalls(view, plot, parts, y)
    parts.append(_lane_rule(y + LOOP_H))
    return y + LOOP_H + 6


def _stalls(view: TraceView, plot: _Plot, parts: list[str], y: float) -> None:
    """Each step of STALL_MS or more outlined to scale over the loop lane (a slice of one step is
    exactly that step; in a slice of several the longest is drawn at its end), the longest labelled;
    and the step the watched loop runs now, growing, where it has run BLOCKED_AFTER_MS."""
    stalls = []
    for start, end, _busy, name, count, longest in view.slices:
        if longest >= STALL_MS and end >= plot.t0:
            stalls.append((start if count == 1 else max(start, end - longest), end, name, False))
    live = view.live
    if live is not None and live.blocked and live.since_ms is not None:
        stalls.append((live.since_ms, live.at_ms, "the step running now", True))
    if not stalls:
        return
    longest_ms = max(end - start for start, end, _, _ in stalls)
    for start, end, name, running in stalls:
        x0, x1 = max(LABEL_W, plot.x(start)), plot.x(end)
        ms = end - start
        what = f"{name}: {'running for' if running else 'one step of'} {ms / 1000:.2f} s without yielding"
        live_class = " live" if running else ""
        parts.append(
            f'<g class="trace-stall{live_class}" data-ms="{ms:.1f}"><title>{escape(what)}</title>'
            f'<rect x="{x0:.1f}" y="{y:g}" width="{max(x1 - x0, 1.5):.1f}" height="{LOOP_H}" '
            f'fill="{STALL_COLOR}" fill-opacity="{0.35 if running else 0.12}" stroke="{STALL_COLOR}"/>'
        )
        if ms == longest_ms and x1 - x0 >= 40:
            label = f"{'blocked ' if running else ''}{ms / 1000:.1f} s step"
            parts.append(
                f'<text x="{(x0 + x1) / 2:.1f}" y="{y + 12:g}" font-size="10" fill="{STALL_COLOR}" '
                f'text-anchor="middle" font-weight="bold">{escape(label)}</text>'
            )
        parts.append("</g>")


def _cancel_wait(view: TraceView, plot: _Plot, parts: list[str], bottom: float) -> None:
    """A Cancel that waited for the loop: a band from its press until the loop read it."""
    if view.cancel_band is None or view.cancel_delay_ms is None:
        return
    pressed, read = view.cancel_band
    if read < plot.t0:
        return
    x0, x1 = max(LABEL_W, plot.x(pressed)), plot.x(read)
    what = f"cancel latency: pressed, then read by the loop {view.cancel_delay_ms / 1000:.2f} s later"
    parts.append(
        f'<g class="trace-cancel-wait"><title>{escape(what)}</title>'
        f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 1.5):.1f}" height="{bottom:g}" fill="{STALL_COLOR}" '
        'fill-opacity="0.08" stroke="#dc2626" stroke-dasharray="3,2"/></g>'
    )


def _merged(runs: list[tuple[int, int, float]]) -> list[list[float]]:
    """Neighbouring columns of the same height and base as one rect (`[col, count, px, base]`): the
    SVG stays small."""
    merged: list[list[float]] = []
    for col, px, base in runs:
        if merged and merged[-1][0] + merged[-1][1] == col and merged[-1][2:] == [px, base]:
            merged[-1][1] += 1
        else:
            merged.append([col, 1, px, base])
    return merged


def _lag_lane(view: TraceView, plot: _Plot, parts: list[str], y: float) -> float:
    """How late the loop's heartbeat woke, as a line; the next lane's y."""
    lags = [(t, ms) for t, ms in view.lag if t >= plot.t0]
    watched = [(t, ms) for t, ms in view.watched_lag if t >= plot.t0] if view.live is not None else []
    top = max([ms for _, ms in lags + watched] + [1.0])
    parts.append(_label(f"lag ≤{_duration(top)}", y + LAG_H / 2))
    for series, dash in ((lags, ""), (watched, ' stroke-dasharray="3,2"')):
        if series:
            points = " ".join(f"{plot.x(t):.1f},{y + LAG_H - ms / top * LAG_H:.1f}" for t, ms in series)
            parts.append(f'<polyline points="{points}" fill="none" stroke="#dc2626" stroke-width="1"{dash}/>')
    parts.append(_lane_rule(y + LAG_H))
    return y + LAG_H + 6


def _read_lane(view: TraceView, plot: _Plot, parts: list[str], y: float) -> float:
    """The largest output the consumer read in each pixel column (bytes: flat for deltas, climbing
    with the text for cumulative outputs); the next lane's y."""
    reads = [(t, size) for t, _index, size, _us in view.reads if t >= plot.t0]
    most = max([size for _, size in reads] + [1])
    parts.append(_label(f"read ≤{_bytes(most)}" if reads else "read: deltas", y + READ_H / 2, size=8))
    if reads:
        tallest: dict[int, int] = {}
        for t, size in reads:
            col = int(plot.x(t))
            tallest[col] = max(tallest.get(col, 0), size)
        path = "".join(
            f"M{col} {y + READ_H:g}V{y + READ_H - size / most * READ_H:.1f}"
            for col, size in sorted(tallest.items())
        )
        parts.append(f'<path d="{path}" stroke="#0d9488" stroke-width="{COLUMN_PX}"/>')
    parts.append(_lane_rule(y + READ_H))
    return y + READ_H + 6


def prefill_label(prefill: tuple[float, float, int | None, int | None, bool]) -> str:
    """What the prefill span says: its length and the prompt tokens computed / reused, once reported."""
    start, end, prompt, cached, ended = prefill
    if prompt is not None and cached is not None:
        counts = f"{prompt - cached} computed / {cached} reused"
    else:
        counts = "tokens not reported" if ended else "tokens …"
    return f"prefill {end - start:.0f} ms: {counts}"


def _prefill_lane(view: TraceView, plot: _Plot, parts: list[str], y: float) -> float:
    """The run's prefill as a bar from hand-over to first chunk, its label beside it (fan-out: a bar
    per request, `_sub_prefills`); the next lane's y."""
    if view.sub_prefills:
        return _sub_prefills(view, plot, parts, y)
    parts.append(_label("prefill", y + PREFILL_H / 2, size=8))
    if view.prefill is not None and view.prefill[1] >= plot.t0:
        start, end = view.prefill[:2]
        x0, x1 = max(LABEL_W, plot.x(start)), plot.x(end)
        text = prefill_label(view.prefill)
        # the label reads beside the bar, on whichever side has the room
        at, anchor = (x1 + 3, "start") if x1 < (LABEL_W + WIDTH) / 2 else (x0 - 3, "end")
        parts.append(
            f'<g class="trace-prefill"><title>{escape(text)} (handed to the engine → first chunk)</title>'
            f'<rect x="{x0:.1f}" y="{y + 2:g}" width="{max(x1 - x0, 1.5):.1f}" height="{PREFILL_H - 4}" '
            f'fill="{PREFILL_COLOR}"/><text x="{at:.1f}" y="{y + PREFILL_H - 3:g}" font-size="8" '
            f'fill="{PREFILL_COLOR}" text-anchor="{anchor}">{escape(text)}</text></g>'
        )
    parts.append(_lane_rule(y + PREFILL_H))
    return y + PREFILL_H + 4


SUB_PREFILL_H = 3
"""The height of each fan-out request's prefill bar (one row each, under one another)."""


def _sub_prefills(view: TraceView, plot: _Plot, parts: list[str], y: float) -> float:
    """Fan-out's prefills: one bar per request, each from the hand-over to its own sample's first
    chunk, one row each, labelled with the first and the last to end; the next lane's y."""
    spans = sorted(view.sub_prefills.items())
    height = max(PREFILL_H, len(spans) * SUB_PREFILL_H + 4)
    parts.append(_label(f"{len(spans)} prefills", y + height / 2, size=8))
    lengths = [end - start for _, (start, end, *_rest) in spans]
    for row, (index, span) in enumerate(spans):
        start, end = span[:2]
        if end < plot.t0:
            continue
        x0, x1 = max(LABEL_W, plot.x(start)), plot.x(end)
        parts.append(
            f'<g class="trace-prefill" data-sample="{index}"><title>request {index}: '
            f"{escape(prefill_label(span))} (handed to the engine → its first chunk)</title>"
            f'<rect x="{x0:.1f}" y="{y + 2 + row * SUB_PREFILL_H:g}" width="{max(x1 - x0, 1.5):.1f}" '
            f'height="{SUB_PREFILL_H - 1}" fill="{PREFILL_COLOR}"/></g>'
        )
    text = f"{len(spans)} prefills, one per request: {min(lengths):.0f}-{max(lengths):.0f} ms"
    parts.append(
        f'<text x="{WIDTH - 2}" y="{y + height - 2:g}" font-size="8" fill="{PREFILL_COLOR}" '
        f'text-anchor="end">{escape(text)}</text>'
    )
    parts.append(_lane_rule(y + height))
    return y + height + 4


def _sample_lanes(view: TraceView, n: int, plot: _Plot, parts: list[str], y: float) -> float:
    """One lane per sample: a tick per chunk (one per pixel column at most); the y under them."""
    ticks: dict[int, set[int]] = {}
    for t, index in view.chunks:
        if t >= plot.t0 and index < n:
            ticks.setdefault(index, set()).add(int(plot.x(t)))
    for index in range(n):
        parts.append(_label(f"#{index}", y + LANE_H / 2, size=8))
        mid = y + LANE_H / 2 - 1
        path = "".join(f"M{start} {mid:g}H{end + 1}" for start, end in _runs(ticks.get(index, ())))
        if path:
            parts.append(f'<path d="{path}" stroke="#0f172a" stroke-width="{LANE_H - 2}"/>')
        y += LANE_H
    return y


def _cancel_marks(view: TraceView, plot: _Plot, parts: list[str], lanes_top: float, bottom: float) -> None:
    """The cancel chain: a line where a cancel was received, across the lanes, and one on each sample's
    lane where it was aborted or finished."""
    for t, index, stage in view.cancels:
        if t < plot.t0:
            continue
        if stage == "received":
            top_y, bottom_y = 0.0, bottom
        else:
            lane = lanes_top + (index or 0) * LANE_H
            top_y, bottom_y = (lanes_top, bottom) if index is None else (lane, lane + LANE_H)
        dash = "" if stage == "received" else ' stroke-dasharray="2,2"'
        at = f"{plot.x(t):.1f}"
        parts.append(
            f'<line x1="{at}" x2="{at}" y1="{top_y:g}" y2="{bottom_y:g}" stroke="#dc2626"{dash}>'
            f"<title>cancel {escape(stage)} {'' if index is None else index}</title></line>"
        )


def _runs(pixels: Iterable[int]) -> list[tuple[int, int]]:
    """Tick pixels as runs [start, end]: ticks up to TICK_GAP_PX apart draw as one bar. A busy lane
    is then a few bars instead of a segment per pixel (the SVG at n=32 was 70 KB of ticks, which
    the browser re-parsed on every redraw)."""
    runs: list[tuple[int, int]] = []
    for px in sorted(pixels):
        if runs and px - runs[-1][1] <= TICK_GAP_PX:
            runs[-1] = (runs[-1][0], px)
        else:
            runs.append((px, px))
    return runs


def _duration(ms: float) -> str:
    """A span in words short enough for a lane's label: ms below 10 s, else s."""
    return f"{ms / 1000:.0f}s" if ms >= 10_000 else f"{ms:.0f}ms"


def _bytes(size: float) -> str:
    return f"{size / 1024:.0f}KB" if size >= 10_240 else f"{size:.0f}B"


def _label(text: str, y_mid: float, size: int = 10) -> str:
    return (
        f'<text x="{LABEL_W - 4}" y="{y_mid + size / 3:.1f}" font-size="{size}" fill="#334155" '
        f'text-anchor="end">{escape(text)}</text>'
    )


def panel_html(view: TraceView, n: int) -> str:
    """The whole trace panel: timeline and figures, or why there is no trace."""
    if view.off:
        why = escape(view.off)
        return f'<div class="trace-panel"><p class="trace-off">No event-loop trace: {why}</p></div>'
    tasks = ""
    if view.tasks:
        tasks = (
            '<details class="trace-tasks" open>'
            "<summary>Tasks: who awaits what (live, once a second)</summary>"
            f"<pre>{escape(view.tasks)}</pre></details>"
        )
    return f'<div class="trace-panel">{trace_svg(view, n)}{figures_html(view)}{tasks}</div>'

"""The tracer's C step recorder: it records each task's steps, the loop's idle waits and the server's
events, and runs callbacks exactly as asyncio's own `Handle._run` does."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from backend.trace import native_build
from backend.trace import recorder as trace
from backend.trace.recorder import STEP, LoopTracer

pytestmark = pytest.mark.skipif(
    not trace.available() and not os.environ.get("CI"), reason="the tracer's C parts are not built here"
)


def test_the_c_parts_are_built_where_make_installs() -> None:
    # In CI `make test` built them: their absence fails here instead of skipping every tracer test.
    assert native_build.built()
    assert trace.available()


async def _workload() -> None:
    async def ticker(count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    # Set from another thread 30 ms on: with nothing ready meanwhile, the loop waits in select() (an
    # idle wait) however late a busy machine runs it, where a short timer may already be due when the
    # loop comes back to select() (a poll, not recorded).
    threading.Timer(0.03, loop.call_soon_threadsafe, (done.set_result, None)).start()
    await done
    await asyncio.sleep(0.005)  # a timer wake-up: a callback that is not a task step
    await asyncio.gather(
        asyncio.create_task(ticker(20), name="ticker a"), asyncio.create_task(ticker(10), name="ticker b")
    )


async def _names_recorded() -> tuple[dict[str, int], LoopTracer]:
    tracer = LoopTracer(heartbeat_s=10)
    tracer.install(asyncio.get_running_loop())
    tracer.chunk(("c1", "r1"), 2, 3)
    await asyncio.create_task(_workload(), name="workload")
    tracer.uninstall()
    counts: dict[str, int] = {}
    for event in tracer.events:
        if event[0] == STEP:
            counts[event[3]] = counts.get(event[3], 0) + 1
    return counts, tracer


async def test_each_tasks_steps_idle_waits_and_chunks_are_recorded() -> None:
    counts, tracer = await _names_recorded()
    # A task that awaits sleep(0) k times runs k + 1 steps; the workload's task runs one step per
    # await that suspends it (the future, the timer, the gather) plus its first.
    assert counts["ticker a"] == 21 and counts["ticker b"] == 11
    assert counts["workload"] == 4
    assert counts["timer wake-up"] >= 1  # the 5 ms sleep's timer: a callback that is no task's step
    others = [e for e in tracer.events if e[0] != STEP]
    assert [e[3:] for e in others if e[0] == trace.CHUNK] == [(("c1", "r1"), (2, 3))]
    idle = [e for e in others if e[0] == trace.IDLE]
    assert idle and all(e[2] > 0 and e[3] is None and isinstance(e[4], int) for e in idle)
    assert sum(e[2] for e in idle) >= 4_000_000  # the thread's 30 ms were mostly spent waiting
    assert tracer.overhead_per_event_ns() > 0
    # Steps are contiguous: each starts where the previous step or idle wait ended.
    events = [e for e in tracer.events if e[0] in (STEP, trace.IDLE)]
    for before, after in itertools.pairwise(events):
        assert after[1] >= before[1] + before[2] - 1


async def _failing_callback_context(traced: bool) -> tuple[dict[str, Any], LoopTracer | None]:
    """What the loop's exception handler gets for a callback that raises, traced or not."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    tracer = LoopTracer(heartbeat_s=10) if traced else None
    if tracer is not None:
        tracer.install(loop)
    try:

        def fail(what: str) -> None:
            raise ValueError(what)

        loop.call_soon(fail, "boom")
        await asyncio.sleep(0.01)
    finally:
        if tracer is not None:
            tracer.uninstall()
        loop.set_exception_handler(previous_handler)
    assert len(seen) == 1
    return seen[0], tracer


async def test_a_failing_callback_reaches_the_loop_exception_handler_as_untraced() -> None:
    untraced, _ = await _failing_callback_context(False)
    traced, tracer = await _failing_callback_context(True)
    assert traced["message"] == untraced["message"]  # the same callback source
    assert traced["message"].startswith("Exception in callback ") and "fail('boom')" in traced["message"]
    assert isinstance(traced["exception"], ValueError) and traced["exception"].args == ("boom",)
    assert traced["exception"].__traceback__ is not None
    assert isinstance(traced["handle"], asyncio.Handle)
    assert tracer is not None
    assert any(str(e[3]).endswith(".fail") for e in tracer.events if e[0] == STEP)


async def test_other_loops_pass_through_and_uninstall_restores_the_handle() -> None:
    original = asyncio.events.Handle._run
    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
    tracer = LoopTracer(heartbeat_s=10)
    tracer.install(asyncio.get_running_loop())
    assert asyncio.events.Handle._run is not original
    assert "select" in vars(selector)  # the loop's own selector, its select() timed
    other_results: list[int] = []

    def other_loop() -> None:
        async def other() -> int:
            await asyncio.sleep(0)
            return 7

        async def main() -> int:
            return await asyncio.create_task(other(), name="other loop task")

        other_results.append(asyncio.run(main()))

    thread = threading.Thread(target=other_loop)
    thread.start()
    await asyncio.to_thread(thread.join)
    before = tracer.recorded
    tracer.uninstall()
    assert asyncio.events.Handle._run is original
    assert "select" not in vars(selector) and asyncio.get_running_loop()._selector is selector  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    assert tracer.recorded == before  # nothing recorded once uninstalled
    assert other_results == [7]
    assert "other loop task" not in {e[3] for e in tracer.events if e[0] == STEP}


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


async def _context_results(traced: bool) -> tuple[list[tuple[str, tuple[int, ...]]], list[str]]:
    loop = asyncio.get_running_loop()
    tracer = LoopTracer(heartbeat_s=10) if traced else None
    if tracer is not None:
        tracer.install(loop)
    seen: list[tuple[str, tuple[int, ...]]] = []
    errors: list[str] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(
        lambda _loop, context: errors.append(re.sub(" at 0x[0-9a-f]+", "", repr(context.get("exception"))))
    )
    try:

        def note(*args: int) -> None:
            seen.append((_REQUEST.get(), args))
            _REQUEST.set("changed inside")  # stays in the callback's own context

        mine = contextvars.copy_context()
        mine.run(_REQUEST.set, "r7")
        loop.call_soon(note, 1, 2, 3, context=mine)
        loop.call_soon(note, *range(12))  # more arguments than the C recorder runs itself
        await asyncio.sleep(0)
        loop.call_soon(note, context=mine)
        # A callback in a context that is already entered fails as Context.run fails.
        loop.call_soon(mine.run, note, context=mine)
        for _ in range(3):
            await asyncio.sleep(0)

        async def in_task() -> None:
            seen.append((_REQUEST.get(), ()))

        token = _REQUEST.set("task")
        await asyncio.create_task(in_task(), name="context task")
        _REQUEST.reset(token)
    finally:
        loop.set_exception_handler(previous_handler)
        if tracer is not None:
            tracer.uninstall()
    return seen, errors


async def test_callbacks_run_in_their_context_with_their_arguments() -> None:
    untraced = await _context_results(False)
    assert await _context_results(True) == untraced
    seen, errors = untraced
    assert seen[:3] == [("r7", (1, 2, 3)), ("none", tuple(range(12))), ("changed inside", ())]
    assert seen[-1] == ("task", ())
    assert errors == [
        "RuntimeError('cannot enter context: <_contextvars.Context object> is already entered')"
    ]


def test_the_c_parts_build_in_place_from_their_sources(tmp_path: Path) -> None:
    (tmp_path / "backend" / "trace").mkdir(parents=True)
    for source in ("setup.py", "backend/trace/step_recorder.c", "backend/trace/trace_digest.c"):
        shutil.copy(native_build.ROOT / source, tmp_path / source)
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        ok, message = native_build.build_in_place(tmp_path)
        assert not ok and message  # says why, and the dashboard goes on untraced
        return
    ok, message = native_build.build_in_place(tmp_path)
    assert ok, message
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "backend" / "trace").glob("_*.so")) == [
        "_step_recorder",
        "_trace_digest",
    ]
    (tmp_path / "backend" / "trace" / "step_recorder.c").write_text("this is not C\n")
    for built in (tmp_path / "backend" / "trace").glob("_step_recorder*"):
        built.unlink()
    shutil.rmtree(tmp_path / "build")  # no earlier object to fall back on
    ok, message = native_build.build_in_place(tmp_path)
    assert not ok and "step_recorder" in message

"""The tracer's step recorders: the C one records what the Python one does, and neither changes
how the loop runs callbacks."""

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
from backend.trace.recorder import AVAILABLE_RECORDERS, STEP, LoopTracer


def test_the_c_recorder_is_built_where_make_installs() -> None:
    if not os.environ.get("CI"):
        pytest.skip("checked in CI, where `make test` builds the extension")
    assert AVAILABLE_RECORDERS == ("c", "python")
    assert LoopTracer().recorder == "c"


def test_an_unbuilt_or_unknown_recorder_is_refused() -> None:
    with pytest.raises(ValueError, match="recorder must be one of"):
        LoopTracer(recorder="rust")
    if "c" not in AVAILABLE_RECORDERS:
        with pytest.raises(RuntimeError, match="build_ext"):
            LoopTracer(recorder="c")


async def _workload() -> None:
    async def ticker(count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done
    await asyncio.sleep(0.005)  # a timer wake-up: a callback that is not a task step
    await asyncio.gather(
        asyncio.create_task(ticker(20), name="ticker a"), asyncio.create_task(ticker(10), name="ticker b")
    )


async def _names_recorded(recorder: str) -> tuple[dict[str, int], LoopTracer]:
    tracer = LoopTracer(recorder=recorder, heartbeat_s=10)
    tracer.install(asyncio.get_running_loop())
    tracer.chunk(("c1", "r1"), 2, 3)
    await asyncio.create_task(_workload(), name="workload")
    tracer.uninstall()
    counts: dict[str, int] = {}
    for event in tracer.events:
        if event[0] == STEP:
            counts[event[3]] = counts.get(event[3], 0) + 1
    return counts, tracer


@pytest.mark.skipif("c" not in AVAILABLE_RECORDERS, reason="the C recorder is not built here")
async def test_c_and_python_recorders_record_the_same_steps() -> None:
    c_counts, c_tracer = await _names_recorded("c")
    py_counts, py_tracer = await _names_recorded("python")
    for name in ("ticker a", "ticker b", "workload", "timer wake-up"):
        assert c_counts.get(name) == py_counts.get(name), name
    assert c_counts["ticker a"] == 21 and c_counts["ticker b"] == 11
    for tracer in (c_tracer, py_tracer):
        others = [e for e in tracer.events if e[0] != STEP]
        assert [e[3:] for e in others if e[0] == trace.CHUNK] == [(("c1", "r1"), (2, 3))]
        idle = [e for e in others if e[0] == trace.IDLE]
        assert idle and all(e[2] > 0 and e[3] is None and isinstance(e[4], int) for e in idle)
        assert sum(e[2] for e in idle) >= 4_000_000  # the 5 ms sleep was spent waiting
    assert c_tracer.overhead_per_event_ns() > 0 and py_tracer.overhead_per_event_ns() > 0
    # Steps are contiguous: each starts where the previous step or idle wait ended.
    events = [e for e in c_tracer.events if e[0] in (STEP, trace.IDLE)]
    for before, after in itertools.pairwise(events):
        assert after[1] >= before[1] + before[2] - 1


async def _failing_callback_context(recorder: str | None) -> tuple[dict[str, Any], LoopTracer | None]:
    """What the loop's exception handler gets for a callback that raises, traced or not."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    tracer = LoopTracer(recorder=recorder, heartbeat_s=10) if recorder else None
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


@pytest.mark.parametrize("recorder", AVAILABLE_RECORDERS)
async def test_a_failing_callback_reaches_the_loop_exception_handler_as_untraced(recorder: str) -> None:
    untraced, _ = await _failing_callback_context(None)
    traced, tracer = await _failing_callback_context(recorder)
    assert traced["message"] == untraced["message"]  # the same callback source
    assert traced["message"].startswith("Exception in callback ") and "fail('boom')" in traced["message"]
    assert isinstance(traced["exception"], ValueError) and traced["exception"].args == ("boom",)
    assert traced["exception"].__traceback__ is not None
    assert isinstance(traced["handle"], asyncio.Handle)
    assert tracer is not None
    assert any(str(e[3]).endswith(".fail") for e in tracer.events if e[0] == STEP)


@pytest.mark.parametrize("recorder", AVAILABLE_RECORDERS)
async def test_other_loops_pass_through_and_uninstall_restores_the_handle(recorder: str) -> None:
    original = asyncio.events.Handle._run
    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
    tracer = LoopTracer(recorder=recorder, heartbeat_s=10)
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


async def _context_results(recorder: str | None) -> tuple[list[tuple[str, tuple[int, ...]]], list[str]]:
    loop = asyncio.get_running_loop()
    tracer = LoopTracer(recorder=recorder, heartbeat_s=10) if recorder else None
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


@pytest.mark.parametrize("recorder", AVAILABLE_RECORDERS)
async def test_callbacks_run_in_their_context_with_their_arguments(recorder: str) -> None:
    untraced = await _context_results(None)
    assert await _context_results(recorder) == untraced
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
        assert not ok and message  # says why, and the dashboard goes on in Python
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

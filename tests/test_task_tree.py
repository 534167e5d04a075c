"""The task tree (backend.trace.tasks) of real asyncio loops, read as a person reading the tree would."""

from __future__ import annotations

import asyncio
import collections.abc
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from backend.trace.frames import task_label
from backend.trace.tasks import TaskNode, render, snapshot


async def wait_on_queue(queue: asyncio.Queue[int]) -> None:
    await queue.get()


async def nap() -> None:
    await asyncio.sleep(10)


async def gather_both(first: asyncio.Task[None], second: asyncio.Task[None]) -> None:
    await asyncio.gather(first, second)


async def gather_nested(
    first: asyncio.Task[None], second: asyncio.Task[None], third: asyncio.Task[None]
) -> None:
    await asyncio.gather(asyncio.gather(first, second), third)


async def await_task(other: asyncio.Task[Any]) -> None:
    await other


async def ticks(event: asyncio.Event) -> Any:
    await event.wait()
    yield 1


async def read_ticks(event: asyncio.Event) -> None:
    async for _ in ticks(event):
        pass


async def quick() -> None:
    return None


async def in_group() -> None:
    async with asyncio.TaskGroup() as group:
        group.create_task(nap(), name="grouped")
        group.create_task(nap(), name="grouped")


async def with_timeout() -> None:
    await asyncio.wait_for(nap(), 100)


def line(function: Callable[..., Any], offset: int = 1) -> int:
    """The line `offset` lines below `function`'s `def` (its await, in the coroutines above)."""
    return function.__code__.co_firstlineno + offset


def node(nodes: list[TaskNode], name: str) -> TaskNode:
    (found,) = [n for n in nodes if n.name == name]
    return found


async def settle() -> None:
    """Let new tasks run up to the await they stop at."""
    for _ in range(5):
        await asyncio.sleep(0)


async def cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_gather_nests_children_under_the_awaiting_frame() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    child_a = asyncio.create_task(wait_on_queue(queue), name="child_a")
    child_b = asyncio.create_task(nap(), name="child_b")
    parent = asyncio.create_task(gather_both(child_a, child_b), name="parent")
    await settle()
    try:
        nodes = snapshot()
        assert node(nodes, "parent").awaits == ("child_a", "child_b")
        assert node(nodes, "parent").awaits_ids == (id(child_a), id(child_b))
        assert node(nodes, "parent").frames == (f"gather_both test_task_tree.py:{line(gather_both)}",)
        assert node(nodes, "child_a").leaf == "Queue.get"
        assert node(nodes, "child_b").leaf == "sleep"
        text = render(nodes)
        print(text)
        assert (
            "\n".join(
                [
                    "└── (T) parent",
                    f"    └──  gather_both test_task_tree.py:{line(gather_both)}",
                    "        ├── (T) child_a",
                    f"        │   └──  wait_on_queue test_task_tree.py:{line(wait_on_queue)}",
                    "        │       └──  Queue.get",
                    "        └── (T) child_b",
                    f"            └──  nap test_task_tree.py:{line(nap)}",
                    "                └──  sleep",
                ]
            )
            in text
        )
        roots = [row for row in text.splitlines() if row.startswith("└── ")]
        assert "└── (T) child_a" not in roots and "└── (T) parent" in roots
    finally:
        await cancel(parent, child_a, child_b)


async def test_nested_gathers_keep_their_order() -> None:
    children = [asyncio.create_task(nap(), name=name) for name in ("one", "two", "three")]
    parent = asyncio.create_task(gather_nested(*children), name="nested")
    await settle()
    try:
        assert node(snapshot(), "nested").awaits == ("one", "two", "three")
    finally:
        await cancel(parent, *children)


async def test_awaiting_a_task_directly_nests_it() -> None:
    sleeper = asyncio.create_task(nap(), name="sleeper")
    waiter = asyncio.create_task(await_task(sleeper), name="waiter")
    await settle()
    try:
        nodes = snapshot()
        assert node(nodes, "waiter").awaits_ids == (id(sleeper),)
        assert "\n".join(
            [
                "└── (T) waiter",
                f"    └──  await_task test_task_tree.py:{line(await_task)}",
                "        └── (T) sleeper",
                f"            └──  nap test_task_tree.py:{line(nap)}",
                "                └──  sleep",
            ]
        ) in render(nodes)
    finally:
        await cancel(waiter, sleeper)


async def test_async_generator_frames_are_in_the_chain() -> None:
    event = asyncio.Event()
    reader = asyncio.create_task(read_ticks(event), name="reader")
    await settle()
    try:
        found = node(snapshot(), "reader")
        assert found.frames == (
            f"read_ticks test_task_tree.py:{line(read_ticks)}",
            f"ticks test_task_tree.py:{line(ticks)}",
        )
        assert found.leaf == "Event.wait"
        assert "\n".join(
            [
                "└── (T) reader",
                f"    └──  read_ticks test_task_tree.py:{line(read_ticks)}",
                f"        └──  ticks test_task_tree.py:{line(ticks)}",
                "            └──  Event.wait",
            ]
        ) in render([found])
    finally:
        await cancel(reader)


async def test_not_started_finished_and_running_tasks() -> None:
    child_a = asyncio.create_task(quick(), name="finishes")
    child_b = asyncio.create_task(nap(), name="still napping")
    parent = asyncio.create_task(gather_both(child_a, child_b), name="parent")
    await settle()
    fresh = asyncio.create_task(nap(), name="fresh")
    try:
        nodes = snapshot()
        assert node(nodes, "fresh").leaf == "not started"
        assert node(nodes, "fresh").frames == (f"nap test_task_tree.py:{line(nap, 0)}",)
        finished = node(nodes, "finishes")
        assert finished.done and finished.frames == () and finished.leaf == "done"
        assert node(nodes, "parent").awaits == ("finishes", "still napping")
        me = asyncio.current_task()
        assert me is not None
        assert node(nodes, me.get_name()).leaf == "running"
        text = render(nodes)
        print(text)
        assert "        ├── (T) finishes\n        │   └──  done\n" in text
        assert "└── (T) fresh\n" in text and "        └──  not started" in text
    finally:
        await cancel(parent, child_b, fresh)


async def test_repeated_names_nest_under_their_own_parent() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    first = asyncio.create_task(wait_on_queue(queue), name="worker")
    second = asyncio.create_task(nap(), name="worker")
    parents = [
        asyncio.create_task(await_task(first), name="p1"),
        asyncio.create_task(await_task(second), name="p2"),
    ]
    await settle()
    try:
        nodes = snapshot()
        assert [n.name for n in nodes].count("worker") == 2
        text = render(nodes)
        assert (
            "\n".join(
                [
                    "└── (T) p1",
                    f"    └──  await_task test_task_tree.py:{line(await_task)}",
                    "        └── (T) worker",
                    f"            └──  wait_on_queue test_task_tree.py:{line(wait_on_queue)}",
                    "                └──  Queue.get",
                    "└── (T) p2",
                    f"    └──  await_task test_task_tree.py:{line(await_task)}",
                    "        └── (T) worker",
                    f"            └──  nap test_task_tree.py:{line(nap)}",
                    "                └──  sleep",
                ]
            )
            in text
        )
        assert not any(row.startswith("└── (T) worker") for row in text.splitlines())
    finally:
        await cancel(*parents, first, second)


async def test_label_hides_other_connections() -> None:
    mine = asyncio.create_task(nap(), name="consume r1 @c1")
    theirs = asyncio.create_task(nap(), name="consume r1 @c2")
    parent = asyncio.create_task(gather_both(mine, theirs), name="connection @c1")
    await settle()
    try:
        text = render(snapshot(), label=lambda name: task_label(name, "c1"))
        print(text)
        assert "└── (T) connection\n" in text
        assert "├── (T) consume r1\n" in text
        assert "└── (T) other connection\n" in text
        assert "@c2" not in text and "@c1" not in text
    finally:
        await cancel(parent, mine, theirs)


async def test_task_group_wait_for_and_wait() -> None:
    group = asyncio.create_task(in_group(), name="group")
    timed = asyncio.create_task(with_timeout(), name="timed")
    waited = asyncio.create_task(nap(), name="waited")
    waiting = asyncio.create_task(asyncio.wait([waited]), name="waiting")
    await settle()
    try:
        nodes = snapshot()
        assert node(nodes, "group").awaits == ("grouped", "grouped")
        assert node(nodes, "group").frames[-1].startswith("TaskGroup.__aexit__ taskgroups.py:")
        assert len(node(nodes, "timed").awaits) == 1
        assert node(nodes, "waiting").awaits == ("waited",)
        text = render(nodes)
        print(text)
        assert text.count("(T) grouped") == 2
    finally:
        await cancel(group, timed, waiting, waited)


class PythonAwaitFuture(asyncio.Future[None]):
    """A future whose `__await__` is a Python generator (as a pure-Python future's is)."""

    def __await__(self) -> Generator[Any, None, None]:
        return (yield from super().__await__())


class Spin:
    """An awaitable that is its own iterator: it yields to the loop until it is cancelled."""

    def __await__(self) -> Spin:
        return self

    def __iter__(self) -> Spin:
        return self

    def __next__(self) -> None:
        return None


class HandRolled(collections.abc.Coroutine[Any, Any, None]):
    """A coroutine that is not a Python coroutine: it waits on a future it makes."""

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None

    def send(self, value: Any) -> Any:
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        if self.future.done():
            raise StopIteration
        self.future._asyncio_future_blocking = True
        return self.future

    def throw(self, *args: Any) -> Any:
        raise asyncio.CancelledError

    def close(self) -> None:
        return None

    def __await__(self) -> Any:
        return self


async def await_it(awaitable: Awaitable[Any]) -> None:
    await awaitable


async def test_odd_awaitables_degrade_to_what_is_known() -> None:
    loop = asyncio.get_running_loop()
    python_future = PythonAwaitFuture(loop=loop)
    tasks = [
        asyncio.create_task(await_it(python_future), name="python future"),
        asyncio.create_task(await_it(Spin()), name="spinning"),
        asyncio.create_task(HandRolled(), name="hand rolled"),
        asyncio.create_task(await_it(loop.create_future()), name="plain future"),
    ]
    await settle()
    try:
        nodes = snapshot(loop)
        assert node(nodes, "python future").leaf == "PythonAwaitFuture"
        assert node(nodes, "spinning").frames == (f"await_it test_task_tree.py:{line(await_it)}",)
        assert node(nodes, "spinning").leaf == "Spin"
        assert node(nodes, "hand rolled").frames == ()
        assert node(nodes, "hand rolled").leaf == "HandRolled"
        assert node(nodes, "plain future").leaf == "Future"
        text = render(nodes)
        print(text)
        assert f"└── (T) spinning\n    └──  await_it test_task_tree.py:{line(await_it)}\n" in text
    finally:
        python_future.cancel()
        await cancel(*tasks)


def test_a_cycle_is_drawn_once_and_marked() -> None:
    """Tasks awaiting each other (a deadlock asyncio cannot even cancel) are drawn, not followed."""
    nodes = [
        TaskNode(name="a", frames=("first x.py:1",), awaits=("b",), task_id=1, awaits_ids=(2,)),
        TaskNode(name="b", frames=("second x.py:2",), awaits=("a",), task_id=2, awaits_ids=(1,)),
        TaskNode(name="c", frames=("third x.py:3",), leaf="sleep", task_id=3),
    ]
    assert render(nodes).splitlines() == [
        "└── (T) c",
        "    └──  third x.py:3",
        "        └──  sleep",
        "└── (T) a",
        "    └──  first x.py:1",
        "        └── (T) b",
        "            └──  second x.py:2",
        "                └── (T) a (cycle)",
    ]


def test_render_caps_its_lines() -> None:
    nodes = [TaskNode(name=f"t{i:02}", frames=("f x.py:1",), leaf="sleep", task_id=i) for i in range(10)]
    text = render(nodes, max_lines=7)
    assert text.splitlines()[:3] == ["└── (T) t00", "    └──  f x.py:1", "        └──  sleep"]
    assert len(text.splitlines()) == 8
    assert text.splitlines()[-1] == "... 23 more lines"
    assert len(render(nodes, max_lines=None).splitlines()) == 30


async def test_three_hundred_tasks_cost_milliseconds() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []
    for i in range(100):
        first = asyncio.create_task(wait_on_queue(queue), name=f"reader {i}")
        second = asyncio.create_task(nap(), name=f"sleeper {i}")
        tasks += [first, second, asyncio.create_task(gather_both(first, second), name=f"parent {i:03}")]
    await settle()
    try:
        costs: list[tuple[float, float]] = []
        for _ in range(5):
            start = time.perf_counter()
            nodes = snapshot()
            taken = time.perf_counter() - start
            text = render(nodes, max_lines=None)
            costs.append((taken, time.perf_counter() - start - taken))
        best = min(costs)
        print(
            f"{len(nodes)} tasks: snapshot {best[0] * 1e3:.2f} ms, render {best[1] * 1e3:.2f} ms (best of 5)"
        )
        assert len(nodes) >= 300
        assert sum(row.startswith("└── (T) parent ") for row in text.splitlines()) == 100
        assert max(taken + drawn for taken, drawn in costs) < 0.5
    finally:
        await cancel(*tasks)

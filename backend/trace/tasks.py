"""The task tree of an asyncio loop, read in-process from the tasks' coroutine chains.

`snapshot` describes every task of a loop as a `TaskNode`: its coroutine frames, outermost first, and
what the innermost one waits on: other tasks (an awaited task, the children of an `asyncio.gather`,
a TaskGroup's tasks, what `asyncio.wait` or `asyncio.wait_for` waits for) or a plain wait, named by
asyncio's function that waits (`sleep`, `Queue.get`, `Event.wait`, `StreamReader.readline`).
`render` draws the nodes as the tree Python 3.14's `python -m asyncio pstree` prints: a task no other
task awaits is a root, its frames nest one level each, and the tasks it awaits nest under its
innermost frame.

A chain is followed through each coroutine's `cr_await` (an async generator's `ag_await`, a
generator's `gi_yieldfrom`) down to the first object that is not a coroutine. With CPython's C futures
that is an `_asyncio.FutureIter`, which has no attribute for its future: `gc.get_referents` gives it
(an async generator's `asend`/`athrow` awaitable, likewise, its generator). The tasks behind a
future that is not itself a task (gather's outer future) are found by `gc.get_referents` from that
future a few levels deep, only through containers and futures, never through the loop, callbacks or
the awaiting task; a plain `asyncio.Future` (a sleep, a queue get) is not searched. Nothing walks the
heap: a snapshot costs about 15-25 us a task (5-8 ms for 300 tasks, 100 gathers of two, on a busy
two-core machine), `render` of its tree 2-3 ms more.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import inspect
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

CHAIN_DEPTH = 256
"""Coroutines followed in one task's chain at most (a chain this deep is a runaway recursion)."""

SEARCH_DEPTH = 6
"""Levels of `gc.get_referents` searched from a future for the tasks behind it: gather's children
are three levels down (future, its attribute dict, `_children`), a nested gather's six."""

SEARCH_BUDGET = 10_000
"""Objects looked at in one such search at most."""

_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep

_CONTAINERS = (list, tuple, set, frozenset, collections.deque)
"""What a search for awaited tasks goes through, besides dicts and futures."""

_ATOMS = frozenset({str, bytes, int, float, bool, type(None), type})
"""What a search for awaited tasks passes over at once: they refer to no task."""

_REFERRING = frozenset({"FutureIter", "async_generator_asend", "async_generator_athrow", "coroutine_wrapper"})
"""Awaitables without a public attribute for what they wrap, by type name: the future, async
generator or coroutine they wrap is among their `gc.get_referents`."""

_CHAIN_TYPES = (types.CoroutineType, types.AsyncGeneratorType, types.GeneratorType)

_SEARCHED_LOCALS = {"TaskGroup.__aexit__": "self", "wait_for": "fut", "_wait": "fs"}
"""asyncio's coroutines that wait on a future of their own for other tasks, and the local that holds
those tasks (searched like gather's future): on 3.11 `wait_for` waits on a future its task's
callback completes, and `asyncio.wait` on one every task's callback may complete."""

_LEAF_NAMES = {"_GatheringFuture": "gather"}


@dataclass(frozen=True)
class TaskNode:
    """One task of a snapshot."""

    name: str
    frames: tuple[str, ...]
    """Its coroutine chain, outermost first, each `qualname file.py:line` (no line once finished).
    asyncio's own frames at the end of a chain that waits on a plain future are left out: `leaf`
    names the outermost of them."""
    awaits: tuple[str, ...] = ()
    """Names of the tasks its innermost frame waits for, in the order it waits for them."""
    leaf: str = ""
    """What it waits on when that is not a task: asyncio's function that waits (`sleep`,
    `Queue.get`, `Event.wait`), else the awaited object's type (`Future`); or "not started",
    "running" (the task that took the snapshot), "done"; empty when it waits for tasks or nothing
    is known."""
    done: bool = False
    task_id: int = 0
    """`id()` of the task: task names repeat; ids are unique within a snapshot."""
    awaits_ids: tuple[int, ...] = ()
    """`task_id`s of the tasks in `awaits`, in the same order."""


def snapshot(loop: asyncio.AbstractEventLoop | None = None) -> list[TaskNode]:
    """Every task of `loop` (default: the running loop), and every finished task one of them still
    awaits, as `TaskNode`s sorted by name. Call it from the loop's thread.

    A task that cannot be read (an unusual coroutine type) becomes a node with its name only; this
    raises only when there is no loop to read (RuntimeError from `asyncio.get_running_loop`)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    current = asyncio.current_task(loop)
    queue = list(asyncio.all_tasks(loop))
    known = {id(task) for task in queue}
    nodes: list[TaskNode] = []
    index = 0
    while index < len(queue):
        task = queue[index]
        index += 1
        try:
            node, awaited = _describe(task, loop, current)
        except Exception:  # noqa: BLE001 - an unreadable task is shown by name, never fails the snapshot
            node, awaited = TaskNode(name=_name(task), frames=(), task_id=id(task)), []
        nodes.append(node)
        for other in awaited:
            if id(other) not in known:
                known.add(id(other))
                queue.append(other)
    nodes.sort(key=lambda node: (node.name, node.frames))
    return nodes


def render(
    nodes: list[TaskNode], label: Callable[[str], str] = lambda name: name, max_lines: int | None = 200
) -> str:
    """The tree of `nodes` as text, as `python -m asyncio pstree` draws it (3.14):

        └── (T) Task-1
            └──  main example.py:13
                └── (T) album
                    └──  album example.py:8
                        ├── (T) TMBTE
                        │   └──  play example.py:4
                        │       └──  sleep

    Roots are the tasks no other task awaits, sorted by label; a task awaited by several tasks is
    drawn under each; a task awaited in a cycle is drawn once more, marked "(cycle)", and not
    followed. `label` maps each task name before it is drawn (and sorted). Past `max_lines` lines
    (None: no limit) one last line says how many were left out."""
    by_id = {node.task_id: node for node in nodes}
    awaited = {
        other for node in nodes for other in node.awaits_ids if other in by_id and other != node.task_id
    }

    def order(node: TaskNode) -> tuple[str, str, tuple[str, ...]]:
        return label(node.name), node.name, node.frames

    lines: list[str] = []
    left_out = 0
    drawn: set[int] = set()
    for root in _roots(sorted(nodes, key=order), awaited, drawn):
        for line in _draw(_task_entry(root, by_id, label, frozenset(), drawn)):
            if max_lines is None or len(lines) < max_lines:
                lines.append(line)
            else:
                left_out += 1
    if left_out:
        lines.append(f"... {left_out} more line{'s' if left_out != 1 else ''}")
    return "\n".join(lines)


def _describe(
    task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop, current: asyncio.Task[Any] | None
) -> tuple[TaskNode, list[asyncio.Task[Any]]]:
    """One task's node, and the tasks it awaits."""
    name = task.get_name()
    coro = task.get_coro()
    if task.done() or coro is None:
        return TaskNode(name=name, frames=(), leaf="done", done=task.done(), task_id=id(task)), []
    frames, codes, frame, end = _chain(coro)
    awaited = _awaited_tasks(end, frame, codes[-1] if codes else None, task, loop)
    library = len(codes)
    while library > 0 and codes[library - 1].co_filename.startswith(_ASYNCIO_DIR):
        library -= 1
    leaf = ""
    if awaited:
        pass
    elif task is current:
        leaf = "running"
    elif (
        end is None
        and type(coro) is types.CoroutineType
        and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
    ):
        leaf = "not started"
    elif library < len(codes):
        leaf = codes[library].co_qualname
        frames = frames[:library]
    elif end is not None:
        leaf = _LEAF_NAMES.get(type(end).__name__, type(end).__name__)
    return (
        TaskNode(
            name=name,
            frames=tuple(frames),
            awaits=tuple(other.get_name() for other in awaited),
            leaf=leaf,
            task_id=id(task),
            awaits_ids=tuple(id(other) for other in awaited),
        ),
        awaited,
    )


def _chain(coro: Any) -> tuple[list[str], list[types.CodeType], types.FrameType | None, Any]:
    """A coroutine's chain: its frames' texts and code objects, outermost first, the innermost frame,
    and what that frame awaits that is not a coroutine or generator (a future, another awaitable, or
    None when it awaits nothing: not started, running, or yielded to the loop)."""
    frames: list[str] = []
    codes: list[types.CodeType] = []
    innermost: types.FrameType | None = None
    current = coro
    for _ in range(CHAIN_DEPTH):
        kind = type(current)
        if kind is types.CoroutineType:
            code, frame, inner = current.cr_code, current.cr_frame, current.cr_await
        elif kind is types.AsyncGeneratorType:
            code, frame, inner = current.ag_code, current.ag_frame, current.ag_await
        elif kind is types.GeneratorType:
            code, frame, inner = current.gi_code, current.gi_frame, current.gi_yieldfrom
            if code.co_name == "__await__" and frame is not None:
                owner = frame.f_locals.get("self")
                if asyncio.isfuture(owner):  # a pure-Python future's __await__
                    return frames, codes, innermost, owner
        elif kind.__name__ in _REFERRING:
            for inner in gc.get_referents(current):
                if type(inner) in _CHAIN_TYPES:
                    current = inner
                    break
                if asyncio.isfuture(inner):
                    return frames, codes, innermost, inner
            else:
                return frames, codes, innermost, current
            continue
        else:
            return frames, codes, innermost, current
        frames.append(_frame_text(code, frame))
        codes.append(code)
        innermost = frame
        if inner is None:
            return frames, codes, innermost, None
        current = inner
    return frames, codes, innermost, None


def _awaited_tasks(
    end: Any,
    frame: types.FrameType | None,
    code: types.CodeType | None,
    task: asyncio.Task[Any],
    loop: asyncio.AbstractEventLoop,
) -> list[asyncio.Task[Any]]:
    """The tasks a chain ending in `end` (awaited by `frame`) waits for: `end` itself when it is a
    task, else tasks found from `end` and from the local of asyncio's waiting functions that holds
    them (`_SEARCHED_LOCALS`)."""
    roots: list[Any] = []
    if end is None or type(end) is asyncio.Future:
        pass  # a plain Future (a sleep, a queue get) refers to no task but its waiter's callback
    elif _is_task(end):
        return [end] if end is not task else []
    elif asyncio.isfuture(end):
        roots.append(end)
    if frame is not None and code is not None and code.co_filename.startswith(_ASYNCIO_DIR):
        local = _SEARCHED_LOCALS.get(code.co_qualname)
        if local is not None:
            value = frame.f_locals.get(local)
            if value is not None:
                roots.append(value)
    return _search(roots, task, loop) if roots else []


def _search(roots: list[Any], awaiting: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> list[Any]:
    """Tasks of `loop` among the referents of `roots`, depth first (so in the order gather was given
    them, nested gathers included), at most SEARCH_DEPTH levels down, going through the roots
    themselves, dicts, other containers and futures that are not tasks only."""
    found: dict[int, Any] = {}
    seen = {id(awaiting), id(loop)}
    stack = [(root, 0) for root in reversed(roots)]
    budget = SEARCH_BUDGET
    while stack:
        obj, depth = stack.pop()
        if type(obj) in _ATOMS or id(obj) in seen:
            continue
        seen.add(id(obj))
        budget -= 1
        if budget < 0:
            break
        if _is_task(obj):
            if obj.get_loop() is loop:
                found.setdefault(id(obj), obj)
            continue
        if depth == SEARCH_DEPTH:
            continue
        if isinstance(obj, dict):
            below = [*obj, *obj.values()]
        elif isinstance(obj, _CONTAINERS):
            below = list(obj)  # in order: a list's referents come last item first
        elif depth == 0 or asyncio.isfuture(obj):
            below = gc.get_referents(obj)
        else:
            continue
        stack.extend((item, depth + 1) for item in reversed(below))
    return list(found.values())


def _is_task(obj: Any) -> bool:
    """Whether `obj` is an asyncio task (C or pure-Python), judged by its class only."""
    return isinstance(obj, asyncio.Task) or (asyncio.isfuture(obj) and hasattr(type(obj), "get_coro"))


@functools.lru_cache(maxsize=4096)
def _base_name(path: str) -> str:
    return os.path.basename(path)


def _frame_text(code: types.CodeType, frame: types.FrameType | None) -> str:
    """`qualname file.py:line`, without the line when the frame is gone (finished)."""
    line = frame.f_lineno if frame is not None else None
    where = _base_name(code.co_filename)
    return f"{code.co_qualname} {where}:{line}" if line is not None else f"{code.co_qualname} {where}"


def _name(task: Any) -> str:
    """A task's name, or its repr's type when even that cannot be read."""
    try:
        return str(task.get_name())
    except Exception:  # noqa: BLE001 - the fallback name of an unreadable task
        return type(task).__name__


_Entry = tuple[str, Callable[[], list[Any]]]
"""A line of the tree and a function giving the entries under it (built as they are drawn)."""


def _roots(ordered: list[TaskNode], awaited: set[int], drawn: set[int]) -> Iterator[TaskNode]:
    """Tasks no other task awaits, in order; then, while any task is left undrawn (only tasks that
    await each other in a cycle can be), the first of those."""
    for node in ordered:
        if node.task_id not in awaited:
            yield node
    for node in ordered:
        if node.task_id not in drawn:
            yield node


def _task_entry(
    node: TaskNode,
    by_id: dict[int, TaskNode],
    label: Callable[[str], str],
    path: frozenset[int],
    drawn: set[int],
) -> _Entry:
    """A task's entry: its frames nested one in the other, the tasks it awaits (or its leaf) under
    the innermost. `path`: the tasks above it, to stop at a cycle; `drawn` collects drawn tasks."""
    text = f"(T) {label(node.name)}"
    if node.task_id in path:
        return text + " (cycle)", list
    drawn.add(node.task_id)
    below = path | {node.task_id}

    def children() -> list[_Entry]:
        tail: list[_Entry] = []
        for name, other in zip(node.awaits, node.awaits_ids, strict=False):
            target = by_id.get(other)
            if target is None:
                tail.append((f"(T) {label(name)}", list))
            else:
                tail.append(_task_entry(target, by_id, label, below, drawn))
        if node.leaf:
            tail.append((f" {node.leaf}", list))
        for frame in reversed(node.frames):
            tail = [(f" {frame}", functools.partial(list, tail))]
        return tail

    return text, children


def _draw(root: _Entry) -> Iterator[str]:
    """The lines of one root's tree, depth first, without recursion (chains can be deep)."""
    stack: list[tuple[_Entry, str, bool]] = [(root, "", True)]
    while stack:
        (text, children), prefix, last = stack.pop()
        yield f"{prefix}{'└── ' if last else '├── '}{text}"
        inner = prefix + ("    " if last else "│   ")
        entries = children()
        for position in range(len(entries) - 1, -1, -1):
            stack.append((entries[position], inner, position == len(entries) - 1))

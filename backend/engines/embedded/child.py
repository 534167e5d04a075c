"""The embedded engine's child process: the model and its scheduler, fed and read through two pipes.

Started by `worker.WorkerProcess` as `python -m backend.engines.embedded.child COMMAND_FD RESULT_FD
PARENT_PID` (the message formats are in `worker`). The child reads its commands on a thread of its own, so an
abort is stamped with the step count at the moment it arrives, as on an in-process thread; the
scheduler steps on the main thread and sends each pass's output of all requests as one message.
When the parent stops it, the child aborts its requests and exits after the step under way; when the
parent dies without a word (SIGKILL), the child exits at once, loading or stepping, tied to the
parent's life (`backend.lifetime`). It ignores SIGINT, which a terminal sends to the
whole process group, and leaves stopping to its parent.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from backend import lifetime
from backend.engines.embedded.worker import WorkerSetup
from backend.vocabulary import Chunk

log = logging.getLogger("backend.embedded")


class RemoteSink:
    """A request's sink in the child: its chunks and queue positions wait in the step's outbox."""

    def __init__(self, request_id: int, n: int, outbox: StepOutbox) -> None:
        self.request_id = request_id
        self.unfinished = n
        self.outbox = outbox

    def deliver(self, chunks: list[Chunk]) -> None:
        """Queue this step's chunks for the parent (called on the scheduler thread)."""
        self.outbox.outputs.append(
            (
                self.request_id,
                [
                    (c.index, c.text, c.tokens, c.finish_reason, c.meta or None, c.logprobs, c.alternatives)
                    for c in chunks
                ],
            )
        )
        self.unfinished -= sum(1 for c in chunks if c.finish_reason is not None)
        if self.unfinished <= 0:
            self.outbox.jobs.pop(self.request_id, None)

    def set_queue_position(self, position: int) -> None:
        """Queue the request's new place for the parent."""
        self.outbox.positions.append((self.request_id, position))


class StepOutbox:
    """What one scheduler pass produced, sent to the parent as one message at the pass's end."""

    def __init__(self, results: Connection) -> None:
        self.results = results
        self.outputs: list[tuple[int, list[tuple[Any, ...]]]] = []
        self.positions: list[tuple[int, int]] = []
        self.jobs: dict[int, Any] = {}
        """Running or queued requests by id, so that aborts find them."""
        self.scheduler: Any = None

    def flush(self) -> None:
        """Send the pass's output, if any, with the scheduler's figures; stop if the parent is gone."""
        if not self.outputs and not self.positions:
            return
        message = ("step", self.outputs, self.positions, self.scheduler.snapshot())
        self.outputs, self.positions = [], []
        try:
            self.results.send(message)
        except OSError:
            self.scheduler.request_stop()


def read_commands(commands: Connection, outbox: StepOutbox) -> None:
    """The child's command thread: submits and aborts into the scheduler's inbox until stop or EOF."""
    from backend.engines.embedded.scheduler import Job

    scheduler = outbox.scheduler
    while True:
        try:
            message = commands.recv()
        except (EOFError, OSError):
            log.warning("the backend is gone; the embedded engine's process stops")
            break
        kind = message[0]
        if kind == "submit":
            _, request_id, prompt_ids, n, params = message
            job = Job(prompt_ids, n, params, RemoteSink(request_id, n, outbox))
            outbox.jobs[request_id] = job
            scheduler.submit(job)
        elif kind == "abort":
            job = outbox.jobs.get(message[1])
            if job is not None:
                scheduler.abort(job, message[2])
        elif kind == "stop":
            break
    scheduler.request_stop()


def build_scheduler(setup: WorkerSetup, on_pass_end: Callable[[], None]) -> Any:
    """Load the weights and tokenizer, choose the compute path (compute.py), build the model in its
    format and make the scheduler (in the child)."""
    import torch

    from backend.engines.embedded.scheduler import BatchScheduler, stop_token_ids
    from backend.engines.embedded.weights import read_tokenizer

    torch.set_num_threads(setup.threads)
    source, decision = _read_model(setup)
    model, choice, reason, linear_path = _build_model(source, decision, setup)
    log.info("compute path %s (%s); linear layers: %s", choice.label, reason, linear_path)
    tokenizer = read_tokenizer(Path(setup.folder))
    chosen = {
        "path": choice.path.name,
        "block": choice.block,
        "label": choice.label,
        "sizes": list(choice.sizes),
        "batch_invariant": choice.batch_invariant,
        "why": reason,
        "weight_bytes": model.weights.nbytes(),
    }
    return BatchScheduler(
        model,
        tokenizer,
        stop_token_ids(tokenizer),
        max_rows=setup.max_rows,
        context=setup.context,
        on_pass_end=on_pass_end,
        linear_path=linear_path,
        compute=chosen,
    )


def _read_model(setup: WorkerSetup) -> tuple[Any, Any]:
    """Decide which compute paths may run (compute.decide) and read the model's float32 tensors, with
    the GGUF's blocks where a candidate path reads them; returns them (startup_probe.Source) and the
    decision (taken again without the blocks where they could not be read)."""
    from backend.engines.embedded import compute, int8
    from backend.engines.embedded.linear import kernel_status
    from backend.engines.embedded.quantized import load_blocks
    from backend.engines.embedded.startup_probe import Source
    from backend.engines.embedded.weights import LlamaConfig, read_config, read_tensors

    # No block (nor timed step) larger than the batch can be: the row cap.
    sizes = (setup.block_rows,) if setup.block_rows else compute.capped(compute.BLOCK_ROWS, setup.max_rows)
    ladders = not setup.block_rows  # a block set by the caller is used alone
    can_int8 = int8.available()
    decision = compute.decide(setup.compute, kernel_status(), bool(setup.gguf), sizes, ladders, can_int8)
    folder = Path(setup.folder)
    source = Source(LlamaConfig.from_hf(read_config(folder)), read_tensors(folder))
    if any(option.path.form == "blocks" for option in (decision.choice, *decision.options)):
        try:
            source.blocks = load_blocks(folder, Path(setup.gguf), source.tensors)
        except Exception as exc:  # noqa: BLE001 - the other paths serve as well
            log.warning("the GGUF's blocks could not be read (%s)", exc)
            if setup.compute == "fp32-blocks":
                raise ValueError(
                    f"--compute fp32-blocks cannot run: the GGUF's blocks could not be read ({exc})"
                ) from None
            decision = compute.decide(setup.compute, kernel_status(), False, sizes, ladders, can_int8)
    return source, decision


def _build_model(source: Any, decision: Any, setup: WorkerSetup) -> tuple[Any, Any, str, str]:
    """Settle the compute path (probing `decision`'s options where it has several) and build the
    model in its format; returns the model, the choice, the engine line's words for why, and the
    linear layers' description."""
    from backend.engines.embedded import decode_ops, int8
    from backend.engines.embedded.formats import Form
    from backend.engines.embedded.linear import kernel_status
    from backend.engines.embedded.model import Llama

    choice, reason = decision.choice, decision.reason
    if decision.options:
        choice, reason = _probe(source, decision, setup)
    source.release()
    decode_ops.configure()
    model = Llama.from_tensors(source.config, source.tensors, Form.of(choice), source.blocks)
    source.tensors.clear()
    source.blocks.clear()
    if choice.path.form == "int8":
        linear_path = int8.describe()
    elif choice.path.form == "blocks":
        linear_path = (
            kernel_status()[1]
            + f"; from the GGUF's blocks ({model.weights.step_bytes() / 1e6:.0f} MB a step)"
        )
    else:
        linear_path = _library_words(choice)
    return model, choice, reason, linear_path


def _library_words(choice: Any) -> str:
    """The engine line's words for a library path's products."""
    if not choice.sizes:
        return "PyTorch, a decode step's products at any row count"
    if len(choice.sizes) > 1:
        counts = "/".join(map(str, choice.sizes))
        return f"PyTorch, a decode step's products at {counts} rows (whole blocks of {choice.block})"
    return f"PyTorch, a decode step's products in blocks of {choice.block} rows"


def _probe(source: Any, decision: Any, setup: WorkerSetup) -> tuple[Any, str]:
    """Time `decision`'s options on the model's own matrices and check the fastest block size
    (compute.probe); returns the choice and the engine line's words for it."""
    from backend.engines.embedded import compute

    started = time.perf_counter()
    rows = compute.capped(compute.PROBE_ROWS, setup.max_rows)
    found = compute.probe(decision.options, source.step, source.check, rows)
    took = time.perf_counter() - started
    log.info("compute paths timed and checked in %.2f s: %s", took, found.times)
    if found.choice is not None:
        return found.choice, compute.probe_reason(setup.compute, found, took)
    what = "; ".join(found.failed)
    if setup.block_rows:
        raise ValueError(f"--compute {setup.compute} in blocks of {setup.block_rows} rows: {what}")
    path = compute.PATHS["bf16-torch" if setup.compute == "auto" else setup.compute]
    words = f"{setup.compute}: no block size gives a row the same bits in every slot ({what})"
    return compute.Choice(path), words


def parent_gone() -> None:
    """The backend died without stopping this process (SIGKILL): end at once, even mid-load."""
    log.warning("the backend is gone; the embedded engine's process stops")
    logging.shutdown()
    os._exit(0)


def main(argv: list[str]) -> int:
    """Child entry: `python -m backend.engines.embedded.child COMMAND_FD RESULT_FD PARENT_PID`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lifetime.tie_to_parent(int(argv[2]), parent_gone)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the folder is local; never let a library try the hub
    commands = Connection(int(argv[0]), writable=False)
    results = Connection(int(argv[1]), readable=False)
    try:
        setup = commands.recv()
    except (EOFError, OSError):
        return 0
    outbox = StepOutbox(results)
    try:
        outbox.scheduler = build_scheduler(setup, outbox.flush)
    except Exception as exc:  # noqa: BLE001 - every loading failure goes to the parent, which reports it
        results.send(("failed", type(exc).__name__, str(exc)))
        return 1
    results.send(("ready", outbox.scheduler.snapshot()))
    threading.Thread(target=read_commands, args=(commands, outbox), name="commands", daemon=True).start()
    outbox.scheduler.run()
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # Straight out: the interpreter's teardown of torch and the model took seconds here (3.5 s on a
    # loaded 2-core machine), time a container's 10 s stop grace does not have; nothing in this
    # process needs it (its results pipe closes with it).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

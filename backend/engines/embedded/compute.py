"""Which compute path the embedded engine runs, and why: its dtype, what multiplies its linear layers,
and whether a seeded sample is the same whatever else runs beside it.

The paths (`--compute`, environment EMBEDDED_COMPUTE):

- `fp32-blocks`: float32; the rows kernel (linear.py) multiplies the GGUF's quantized blocks, the
  ops between the linear layers run in decode_ops.c. Needs the C parts, an AVX2/FMA CPU, one thread
  and a model that came from a GGUF (the bundled SmolLM2).
- `fp32-rows`: the same on float32 weights (a `--model` folder, or for comparisons).
- `fp32-torch`: float32 through PyTorch alone (what runs without the C parts).
- `bf16-torch`: bfloat16 through PyTorch.

The two rows-kernel paths are batch-invariant: every op computes each row on its own, in an order
that does not depend on how many rows share the step, and requests are prefilled together only
there (scheduler), so a seeded sample gives the same tokens alone, at any n and while other requests
come and go. The PyTorch paths are not: a general matrix product (MKL, oneDNN) may block and round
differently for another row count, and the masked attention runs up to the longest row.

`auto` takes the batch-invariant paths this process can run and, where there are two, times them on
the model's own matrices at start (`probe`, well under a second) and keeps the faster; the name of
a CPU flag decides nothing. Where neither can run (no C part, a CPU without AVX2, more than one
thread), it is `fp32-torch`, and the engine line says that samples may change with load.

This module imports no torch: the command line reads its choices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ComputePath:
    """One way of computing the model's steps."""

    name: str
    dtype: str
    """The torch dtype's name: "float32" or "bfloat16"."""
    rows_kernel: bool
    """The linear layers go to the rows kernel (and the ops between them to decode_ops)."""
    gguf_blocks: bool
    """The rows kernel multiplies the GGUF's quantized blocks rather than float32 weights."""

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's values do not depend on the rows computed beside it."""
        return self.rows_kernel


PATHS: dict[str, ComputePath] = {
    path.name: path
    for path in (
        ComputePath("fp32-blocks", "float32", rows_kernel=True, gguf_blocks=True),
        ComputePath("fp32-rows", "float32", rows_kernel=True, gguf_blocks=False),
        ComputePath("fp32-torch", "float32", rows_kernel=False, gguf_blocks=False),
        ComputePath("bf16-torch", "bfloat16", rows_kernel=False, gguf_blocks=False),
    )
}
"""Every path, by its `--compute` name."""

COMPUTE_CHOICES = ("auto", *PATHS)
"""What `--compute` accepts."""

VARIES_WITH_LOAD = "seeded samples may change with load: this path is not batch-invariant"
"""Said wherever a path that is not batch-invariant runs."""


def check_setting(name: str) -> str:
    """`name` if it is a `--compute` choice, else ValueError naming the choices."""
    if name not in COMPUTE_CHOICES:
        raise ValueError(f"--compute must be one of {', '.join(COMPUTE_CHOICES)}, got {name!r}")
    return name


def unavailable(path: ComputePath, kernel: tuple[bool, str], has_gguf: bool) -> str | None:
    """Why `path` cannot run in this process (None where it can): `kernel` is linear.kernel_status()."""
    if path.rows_kernel and not kernel[0]:
        return kernel[1].removeprefix("PyTorch ").strip("()")
    if path.gguf_blocks and not has_gguf:
        return "the model did not come from a GGUF"
    return None


@dataclass(frozen=True)
class Decision:
    """The path chosen, the candidates `auto` times (empty when there is nothing to time), and why."""

    path: ComputePath
    candidates: tuple[ComputePath, ...]
    reason: str


def decide(setting: str, kernel: tuple[bool, str], has_gguf: bool) -> Decision:
    """The path for `--compute setting`: a forced path where it can run (ValueError saying why not
    where it cannot); for `auto` the batch-invariant paths that can run, to be timed by `probe`."""
    check_setting(setting)
    if setting != "auto":
        path = PATHS[setting]
        why = unavailable(path, kernel, has_gguf)
        if why is not None:
            raise ValueError(f"--compute {setting} cannot run here: {why}")
        return Decision(path, (), "set by --compute")
    runnable = [path for path in PATHS.values() if unavailable(path, kernel, has_gguf) is None]
    candidates = tuple(path for path in runnable if path.batch_invariant)
    if not candidates:
        why = unavailable(PATHS["fp32-rows"], kernel, has_gguf)
        return Decision(PATHS["fp32-torch"], (), f"auto: no batch-invariant path runs here ({why})")
    if len(candidates) == 1:
        return Decision(candidates[0], (), "auto: the one batch-invariant path this process runs")
    return Decision(candidates[0], candidates, "auto: to be timed")


def probe(
    candidates: tuple[ComputePath, ...],
    step: Callable[[ComputePath, int], None],
    rows: tuple[int, ...] = (1, 16),
    repeats: int = 2,
) -> tuple[ComputePath, dict[str, float]]:
    """The fastest of `candidates`: `step(path, rows)` runs a sample of a decode step's work on
    `path` for `rows` rows; each is timed at each row count (best of `repeats`) and the times summed.
    Returns the path and each path's time in seconds."""
    times: dict[str, float] = {}
    for path in candidates:
        total = 0.0
        for count in rows:
            step(path, count)  # warm: caches, first-touch pages
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                step(path, count)
                best = min(best, time.perf_counter() - started)
            total += best
        times[path.name] = total
    fastest = min(candidates, key=lambda path: times[path.name])
    return fastest, times


def probe_reason(fastest: ComputePath, times: dict[str, float]) -> str:
    """The engine line's words for what `probe` found."""
    others = ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in times.items() if name != fastest.name)
    took = times[fastest.name] * 1e3
    return f"auto: the fastest batch-invariant path here ({took:.1f} ms against {others}, timed at start)"

"""Which compute path the embedded engine runs, and why: its dtype, what multiplies its linear layers,
and whether a seeded sample is the same whatever else runs beside it.

The paths (`--compute`, environment EMBEDDED_COMPUTE), each with its weight format (linear.py):

- `int8-exact`: the weights, and each step's rows, turned by a Hadamard matrix and rounded to int8
  (int8.py), their products summed in int32, which is exact: a row's values are the same at any row
  count, with no block to check (the C part int8_rows.c for a few rows, `torch._int_mm` beyond where
  it is timed faster and found exact here, oneDNN's VNNI or AMX kernels). 0.006 nats a token from
  float32 on the README's text (the output layer in int8 too). Needs the C parts (AVX2 or AVX-512
  VNNI kernels on x86, plain C loops elsewhere). What `auto` takes on the AMD EPYC Zen 1 and Zen 4.
- `fp32-blocks`: the model's exact weights: the rows kernel (rows_linear.c) multiplies the GGUF's
  quantized blocks in float32. Needs the C parts, an AVX2/FMA CPU, one thread and a model that came
  from a GGUF (the bundled SmolLM2). What `auto` took on the Intel Xeon with AMX.
- `bf16-torch`: bfloat16 weights through PyTorch's matrix product (oneDNN on AMX or AVX-512-BF16
  where the CPU has them, any CPU PyTorch runs on otherwise), called at checked row counts
  (fixed_rows.py): the path wherever the C parts cannot run (no C compiler, ARM without AVX2).

Every path keeps its activations in float32 and runs the ops between the linear layers row by row
(decode_ops.c where built, else PyTorch on one row at a time), with each row attending to its own
positions only. The rows kernel computes each row on its own, and `int8-exact`'s sums are exact
integers, so their paths are batch-invariant as they stand. A library product is made so by its
shape: a PyTorch path multiplies a decode step's rows only at row counts this process has checked at
start: a block of one size (`Choice.block`), padded, or a ladder of sizes up to it (1, 2, 4, ...,
the block: a step's last rows at the smallest that holds them), where the same row gives the same
bits at every size of the ladder and in every slot beside any other rows (fixed_rows.check). Where
no size passes, the path multiplies every step whole and the engine line says that samples may
change with load. Prefill multiplies one prompt's new tokens at a time (PyTorch paths) or prompts
arriving together at once (the rows kernel and `int8-exact`, whose rows are independent at any
count), so a prompt gives the same first-token logits whoever else is running.

`auto` times every path this process can run, `bf16-torch` at each of BLOCK_ROWS as a ladder
(a block alone where the ladder fails its check), on the model's own matrices at start (`probe`, with
startup_probe.py's timings and checks: a decode step's linear layers at PROBE_ROWS rows, a PyTorch
path at the row counts it would call, a token's time at each summed), and keeps the fastest that is
batch-invariant (its row counts checked, the slower ones only where a faster one fails its check;
times within TIE of the fastest taken in order); a forced PyTorch path picks its sizes the same way.
No CPU flag decides.

This module imports no torch: the command line reads its choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FORMS = ("int8", "blocks", "library")
"""The weight formats (linear.py): int8.Int8Matrix, linear.BlockWeight, linear.LibraryWeight."""


@dataclass(frozen=True)
class ComputePath:
    """One way of computing the model's steps."""

    name: str
    dtype: str
    """The weights' torch dtype name: "float32" or "bfloat16" (activations are float32 on every path;
    int8's weights hold float32 scales)."""
    form: str
    """Its weight format, one of FORMS."""

    @property
    def any_rows(self) -> bool:
        """Whether a row's values do not depend on the row count at all (no block to check): the
        rows kernel's, int8's exact sums."""
        return self.form != "library"


PATHS: dict[str, ComputePath] = {
    path.name: path
    for path in (
        ComputePath("int8-exact", "float32", "int8"),
        ComputePath("fp32-blocks", "float32", "blocks"),
        ComputePath("bf16-torch", "bfloat16", "library"),
    )
}
"""Every path, by its `--compute` name, in the order ties are settled in: `int8-exact` first. Its
lead over `fp32-blocks` in a probe is thin where one row's step (memory-bound, int8's weights
larger than the GGUF's blocks) weighs most: 14 against 17.7 ms summed over 1, 8 and 32 rows, and
a start slowed by other work can bring them within TIE, while at 8 and 32 rows int8-exact's steps
take a third of fp32-blocks' (2-core AMD EPYC Zen 4: 1.9 against 5.1 ms a token at 8 rows, 1.1
against 3.1 at 32)."""

COMPUTE_CHOICES = ("auto", *PATHS)
"""What `--compute` accepts."""

BLOCK_ROWS = (8, 32)
"""The row counts `bf16-torch`'s blocks are timed at (as ladders: `auto` times at most four options)."""

TIE = 0.10
"""Options whose times are within this fraction of the fastest's are taken as equal, in the order of
`decide`'s options (PATHS' order): on a busy machine the paths' times move by more than they differ
here, and a tie settled by the order takes the same path at every start (a seed's samples with it)."""

PROBE_ROWS = (1, 8, 32)
"""The batches `probe` times a step at: one sample, a request of 8, a full batch. A token's time at
each (the step over its rows), summed, decides: each batch counts by how fast it goes, so that the
path a full batch favours (bfloat16 on AMX: 58 ms at 32 rows, 42 at 1) does not win on the 32 rows'
long step alone while one sample, or the page's default of 4, runs at less than half the speed."""


def capped(rows: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """`rows` with each count at most `cap` (the engine's row cap), without repeats, in order."""
    return tuple(sorted({min(count, cap) for count in rows}))


VARIES_WITH_LOAD = "seeded samples may change with load: this path is not batch-invariant"
"""Said wherever a path that is not batch-invariant runs."""


def ladder(block: int) -> tuple[int, ...]:
    """The row counts a ladder up to `block` holds: the powers of two below it, and `block`."""
    return (*(1 << i for i in range(block.bit_length()) if (1 << i) < block), block)


def chunks(sizes: tuple[int, ...], rows: int) -> list[int]:
    """The row counts a product of `rows` rows is made of at checked `sizes` (ascending; the last,
    the block): whole blocks, then the rest padded to the smallest size that holds it."""
    block = sizes[-1]
    made = [block] * (rows // block)
    if rows % block:
        made.append(next(size for size in sizes if size >= rows % block))
    return made


@dataclass(frozen=True)
class Choice:
    """A path and, for a PyTorch path, the block of rows its decode steps multiply (None: unblocked)
    and whether the sizes of the ladder below the block are used too."""

    path: ComputePath
    block: int | None = None
    laddered: bool = False

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's values do not depend on the rows computed beside it: the rows kernel, the
        exact int8 products, or a library product at a block size checked at start."""
        return self.path.any_rows or self.block is not None

    @property
    def label(self) -> str:
        """The path's name, with its block size where it has one ("bf16-torch/32")."""
        if self.block is None:
            return self.path.name
        return f"{self.path.name}/{'1-' if self.laddered and self.block > 1 else ''}{self.block}"

    @property
    def sizes(self) -> tuple[int, ...]:
        """The row counts a decode step's products are made at (empty: any)."""
        if self.block is None:
            return ()
        return ladder(self.block) if self.laddered else (self.block,)

    def step_rows(self, rows: int) -> list[int]:
        """The row counts of the products per linear layer for a decode step of `rows` rows."""
        return chunks(self.sizes, rows) if self.sizes else [rows]


REMOVED = ("fp32-rows", "fp32-torch", "int4-torch")
"""Paths the engine no longer offers: never the fastest on any CPU measured (docs/engines.md)."""


def check_setting(name: str) -> str:
    """`name` if it is a `--compute` choice, else ValueError naming the choices."""
    if name in REMOVED:
        raise ValueError(
            f"--compute {name} is no longer offered (never the fastest on any CPU measured); "
            f"the paths are {', '.join(COMPUTE_CHOICES)}"
        )
    if name not in COMPUTE_CHOICES:
        raise ValueError(f"--compute must be one of {', '.join(COMPUTE_CHOICES)}, got {name!r}")
    return name


INT8_OK = (True, "")


def unavailable(
    path: ComputePath,
    kernel: tuple[bool, str],
    has_gguf: bool,
    int8: tuple[bool, str] = INT8_OK,
) -> str | None:
    """Why `path` cannot run in this process (None where it can): `kernel` is linear.kernel_status(),
    `int8` int8.available()."""
    if path.form == "blocks" and not kernel[0]:
        return kernel[1].removeprefix("PyTorch ").strip("()")
    if path.form == "blocks" and not has_gguf:
        return "the model did not come from a GGUF"
    if path.form == "int8" and not int8[0]:
        return int8[1]
    return None


def library_options(path: ComputePath, blocks: tuple[int, ...], ladders: bool) -> list[Choice]:
    """A PyTorch path's options: at each of `blocks` as a ladder (where `ladders` and the block is
    above 1 row; `probe` tries the block alone where the ladder fails its check), else as a block
    alone; the largest block first, so that a tie goes to it: a ladder multiplies as a smaller one
    does up to the smaller's block, and more rows in products of its own larger size."""
    options = []
    for block in sorted(blocks, reverse=True):
        options.append(Choice(path, block, laddered=ladders and block > 1))
    return options


@dataclass(frozen=True)
class Decision:
    """The path chosen, the options `probe` times (empty when there is nothing to time), and why."""

    choice: Choice
    options: tuple[Choice, ...]
    reason: str


def decide(
    setting: str,
    kernel: tuple[bool, str],
    has_gguf: bool,
    blocks: tuple[int, ...] = BLOCK_ROWS,
    ladders: bool = True,
    int8: tuple[bool, str] = INT8_OK,
) -> Decision:
    """What `--compute setting` runs: a forced rows-kernel path where it can (ValueError saying why
    not where it cannot), a forced PyTorch path at each of `blocks` (to be timed and checked by
    `probe`); for `auto` every path that can run, the PyTorch ones at each of `blocks`, each as a
    ladder (where `ladders`) and alone (library_options). `int8` is int8.available()."""
    check_setting(setting)
    if any(block < 1 for block in blocks) or not blocks:
        raise ValueError(f"block sizes must be at least 1 row, got {blocks}")
    if setting != "auto":
        path = PATHS[setting]
        why = unavailable(path, kernel, has_gguf, int8)
        if why is not None:
            raise ValueError(f"--compute {setting} cannot run here: {why}")
        if path.any_rows:
            return Decision(Choice(path), (), "set by --compute")
        return Decision(Choice(path), tuple(library_options(path, blocks, ladders)), "set by --compute")
    options: list[Choice] = []
    for path in PATHS.values():
        if unavailable(path, kernel, has_gguf, int8) is None:
            options.extend([Choice(path)] if path.any_rows else library_options(path, blocks, ladders))
    return Decision(options[0], tuple(options), "auto")


@dataclass(frozen=True)
class Probe:
    """What `probe` found."""

    choice: Choice | None
    """The fastest option that is batch-invariant; None where every one failed its check."""
    times: dict[str, float]
    """Seconds a token takes at each of PROBE_ROWS, summed, by option label (a partial sum where
    unfinished)."""
    unfinished: set[str]
    """Options left once their partial sum passed the fastest whole one's."""
    failed: list[str]
    """Block sizes that failed their check, faster than the choice, and what differed."""
    rows: tuple[int, ...] = PROBE_ROWS
    """The row counts each option's steps were timed at."""


def probe(
    options: tuple[Choice, ...],
    step: Callable[[Choice, int], float],
    check: Callable[[Choice], list[str]],
    rows: tuple[int, ...] = PROBE_ROWS,
    repeats: int = 2,
) -> Probe:
    """The fastest batch-invariant one of `options`: `step(option, count)` runs a sample of a decode
    step's linear layers at `count` rows and returns its estimate of a whole step's, in seconds
    (the best of `repeats`, measured once per path and row count); an option's time is the sum over
    `rows` of a token's time there, its step over the rows (a PyTorch path's step: its products at
    the row counts it calls, Choice.step_rows). Every option is timed at the first of `rows` (the
    cheapest), then each in turn over the rest, the fastest there first, so that a fast one is
    timed whole early and the slower ones are left sooner: an option is left unfinished once its
    sum so far passes the fastest whole one's by more than TIE (its time is then that partial sum,
    marked slower in `probe_reason`). The order of timing changes no choice: an option left is
    slower than the fastest by more than TIE. From the first `_ranked` on, a PyTorch path must pass
    `check(option)` (a list of what differs, empty where nothing does). A ladder that fails gives
    way to its block alone, timed then and ranked among the rest by its time."""
    times: dict[str, float] = {}
    finished: list[Choice] = []
    measured: dict[tuple[str, int], float] = {}

    def timed(option: Choice, limit: float, counts: tuple[int, ...] = rows) -> bool:
        """Time `option` over `counts` into `times`, up to `limit`; whether it was timed whole."""
        total = 0.0
        for count in counts:
            for size in option.step_rows(count):
                if (option.path.name, size) not in measured:
                    measured[option.path.name, size] = min(step(option, size) for _ in range(repeats))
                total += measured[option.path.name, size] / count
            if total > limit:
                times[option.label] = total
                return False
        times[option.label] = total
        return True

    for option in options:
        timed(option, float("inf"), rows[:1])
    for option in sorted(options, key=lambda option: times[option.label]):
        best = min((times[done.label] for done in finished), default=float("inf"))
        if timed(option, best * (1 + TIE)):
            finished.append(option)
    unfinished = {option.label for option in options} - {option.label for option in finished}
    ranked = _ranked(options, finished, times)
    failed: list[str] = []
    while ranked:
        option = ranked.pop(0)
        if option.block is None:
            return Probe(option, times, unfinished, failed, rows=rows)
        failures = check(option)
        if not failures:
            return Probe(option, times, unfinished, failed, rows=rows)
        failed.append(f"{option.label} failed its check ({failures[0]})")
        if option.laddered:
            alone = Choice(option.path, option.block)
            timed(alone, float("inf"))
            at = next((i for i, o in enumerate(ranked) if times[o.label] > times[alone.label]), len(ranked))
            ranked.insert(at, alone)
    return Probe(None, times, unfinished, failed, rows=rows)


def _ranked(options: tuple[Choice, ...], finished: list[Choice], times: dict[str, float]) -> list[Choice]:
    """The order `probe` checks options in: those timed whole within TIE of the fastest in the
    options' order, then the other timed ones fastest first, then those left unfinished (by their
    sums so far): a slower option is checked only where every faster one failed."""
    fastest = min((times[option.label] for option in finished), default=float("inf"))
    ranked = [o for o in options if o in finished and times[o.label] <= fastest * (1 + TIE)]
    ranked += sorted((o for o in finished if o not in ranked), key=lambda option: times[option.label])
    left = [option for option in options if option not in finished]
    return ranked + sorted(left, key=lambda option: times[option.label])


def probe_reason(setting: str, found: Probe, took: float) -> str:
    """The engine line's words for what `probe` found (a choice), in `took` seconds."""
    assert found.choice is not None
    chosen = found.choice.label
    others = ", ".join(
        f"{label} {'>' if label in found.unfinished else ''}{t * 1e3:.0f}"
        for label, t in found.times.items()
        if label != chosen
    )
    rows = "/".join(map(str, found.rows))
    words = "auto: the fastest batch-invariant path here" if setting == "auto" else "set by --compute"
    failed = {failure.split(" failed its check")[0] for failure in found.failed}
    faster = [
        label
        for label, t in found.times.items()
        if t < found.times[chosen] and label not in found.unfinished and label not in failed
    ]
    if faster:  # passed over for the order of those tied
        words += f", first in order of those within {TIE:.0%} of the fastest"
    words += f" ({chosen} {found.times[chosen] * 1e3:.0f} ms"
    words += f" against {others}" if others else ""
    words += f", steps of {rows} rows timed at start in {took:.2f} s"
    if found.choice.laddered:
        words += f"; products of {'/'.join(map(str, found.choice.sizes))} rows checked row by row"
    elif found.choice.block is not None:
        words += f"; blocks of {found.choice.block} rows checked row by row"
    return words + "".join(f"; {failure}" for failure in found.failed) + ")"

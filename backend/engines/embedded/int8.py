"""Weight matrices and rows in int8, multiplied exactly in int32 (the `int8-exact` path).

A row x [K] and a weight row w [K] are each turned by the same orthonormal matrix H (the
Walsh-Hadamard matrix of 64, scaled by 1/8, on each group of 64 values), so x @ w^T = (xH) @ (wH)^T,
and each is rounded to int8 steps of its own scale (its greatest magnitude / 127): the weights once,
a row of each step on the fly (`_int8_rows.rotate_quantize`, int8_rows.c). The turn spreads a row's
few large values over their group, so one scale a row loses less of the others: on the README's
text, the layers' and output layer's rows and weights in int8 this way cost 0.0057 nats a token
against float32 (`python -m bench.rounding`; about six times that without the turn).

The product of the int8 rows and weights is summed in int32, where every order of addition gives
the same integer: by the C part (int8_rows.c, from the weights packed for it; its AVX-512 VNNI
kernel where the CPU has it, else its AVX2 one: `kernel`) for up to `c_max_rows()` rows, by
PyTorch's `torch._int_mm` (oneDNN, with AVX-512 VNNI or AMX where the CPU has them; from a second
copy of the steps in its layout, kept only where it is used) beyond, where this process timed
`_int_mm` faster and found it exact (`int_mm_exact`), else by the C part for every row count. Where
the one takes over from the other is timed at start (`take_over`). Each sum is then scaled to
float32 by two rounded products, the row's scale and the weight row's, the same in C and in
PyTorch: a row's values are the same alone, beside any rows and at any row count, with either
kernel, on every CPU, with no block size to check.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from backend.engines.embedded.linear import deliver

try:
    from backend.engines.embedded import _int8_rows
except ImportError:  # not built (no C compiler)
    _int8_rows = None

GROUP = 64
"""Values turned together (each group of a row by the Walsh-Hadamard matrix of this size)."""

TIMED_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""Row counts at which the C part and `torch._int_mm` are timed against each other (`take_over`),
up to the first where `_int_mm` takes over."""

TIMED_SHAPES = (((960, 576), 30), ((576, 576), 30), ((3072, 576), 30), ((576, 1536), 30), ((12288, 576), 4))
"""The stand-in weight matrices [N, K] they are timed on, and how many of each a step multiplies:
a decode step of the default model (30 layers' query, key and value rows, output, gate and up rows
and down rows; its output layer of 49,152 rows as four of a quarter of them)."""

TAKE_OVER = 0.9
"""`torch._int_mm` takes rows over from the C part where its products take at most this share of
the C part's time: a margin over the timings' noise, so that where the two are level (on the
Zen 4 host, 24 to 48 rows) the choice does not change from one start to the next."""

TIMING_BUDGET_S = 0.5
"""Seconds `take_over` times for at most: it starts no row count whose timings, predicted from the
last one's in proportion to the rows, would end past them, and where `_int_mm` has not taken over
by then, the C part takes every row count. Where both are slow and level, timing every one of
TIMED_ROWS costs more than it can win."""

FAR = 2.0
"""At each row count `_int_mm` and the C part are first timed on the step's largest stand-in alone
(`glance_shape`); where `_int_mm` takes more than FAR times the C part's time there, it does not
take over at that row count and the step's other stand-ins are not timed. Where it is that far
behind and no nearer than at the row count before, it is not gaining on the C part as rows grow
(a library product that gains does so by sharing its weight reads among more rows, as the C part's
already does), and the timings stop there: on a 2-core AMD EPYC Zen 1, AVX2 only, `_int_mm` took
10-15 times the C part's time at every row count up to 64 (a step at 1 row: 128 ms against 13 ms),
and timing whole steps within the budget cost 0.49 s of the engine's start, the glances 0.01 s."""

WEIGHT_ROWS = 4
"""Weight rows the C part multiplies together (int8_rows.c)."""

CHUNK = 32
"""Columns of a packed group's row side by side (int8_rows.c)."""


HELD_BELOW_VNNI = {
    "ATEN_CPU_CAPABILITY": ("default", "avx2"),
    "ONEDNN_MAX_CPU_ISA": ("sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core"),
}
"""The settings that hold PyTorch's and oneDNN's kernels below AVX-512 VNNI, and their values that do:
in a process run with one of them the C part holds to its AVX2 kernel too, as an AVX2-only CPU runs
it."""


def available() -> tuple[bool, str]:
    """(whether the int8 products can run here, why not where they cannot)."""
    if _int8_rows is None:
        return False, "the int8 products' C part is not built"
    if not _int8_rows.available():
        return False, "this CPU lacks AVX2 for the int8 products' C part"
    return True, ""


def kernels() -> tuple[str, ...]:
    """The C part's kernels this CPU runs, in the order of their numbers: "avx2", then "avx512-vnni"
    where the CPU has AVX-512 VNNI ("portable": plain C loops, off x86)."""
    return tuple(_int8_rows.kernels()) if _int8_rows is not None else ()


@functools.cache
def kernel() -> str:
    """The kernel the C part multiplies with in this process: the last of `kernels()`, unless a
    setting of `HELD_BELOW_VNNI` holds the process's libraries below AVX-512 VNNI."""
    here = kernels()
    held = any(os.environ.get(name, "").lower() in values for name, values in HELD_BELOW_VNNI.items())
    if held and "avx512-vnni" in here:
        return "avx2"
    return here[-1]


@functools.cache
def kernel_number() -> int:
    """`kernel()`'s number in the C part (its place in `kernels()`)."""
    return kernels().index(kernel())


EXACT_ROWS = tuple(range(1, 65))
"""The row counts at which `int_mm_exact` checks `torch._int_mm`'s sums (oneDNN picks its kernel by
the row count)."""

GLANCE_ROWS = (1, 64)
"""The row counts checked before `take_over` times `_int_mm`: a kernel that adds in 16 bits
saturates at any row count, so one found there is not timed."""


@functools.cache
def int_mm_exact() -> bool:
    """Whether `torch._int_mm` gives the exact int32 sums here, at every row count of EXACT_ROWS,
    with the largest steps of both signs (where the CPU lacks VNNI, oneDNN's AVX2 kernel adds
    products in 16 bits and saturates): checked once per process."""
    return _exact_at(EXACT_ROWS)


def _exact_at(row_counts: tuple[int, ...]) -> bool:
    """Whether `torch._int_mm`'s sums at each of `row_counts` equal the exact ones, made in float64
    (every product and partial sum an integer below 127 * 127 * 1536 < 2**53: exact in any order)."""
    if not hasattr(torch, "_int_mm"):
        return False
    generator = torch.Generator().manual_seed(0)
    weights = torch.randint(-127, 128, (64, 1536), dtype=torch.int8, generator=generator)
    weights[:8] = 127
    weights[8:16] = -127
    exact_weights = weights.double().t()
    for rows in row_counts:
        x = torch.randint(-127, 128, (rows, 1536), dtype=torch.int8, generator=generator)
        x[0] = 127
        x[-1] = -127
        try:
            got = torch._int_mm(x, weights.t())
        except RuntimeError:
            return False
        if not torch.equal(got.double(), x.double() @ exact_weights):
            return False
    return True


@dataclass(frozen=True)
class TakeOver:
    """Where `torch._int_mm` takes rows over from the C part in this process (`take_over`)."""

    c_max_rows: int
    """The most rows the C part multiplies (sys.maxsize: every row count)."""
    timed_rows: int
    """The most rows the two were timed at (0 where `_int_mm` is not exact and nothing was timed)."""
    exact: bool | None
    """Whether `_int_mm` gave the exact sums: checked at GLANCE_ROWS before the timings, at every row
    of EXACT_ROWS only where it was faster; None where that was not needed."""
    behind: float | None = None
    """Where the timings stopped for `_int_mm` being FAR behind and no nearer than at the row count
    before: how many times the C part's time it took at `timed_rows` on `glance_shape`."""


@functools.cache
def take_over() -> TakeOver:
    """The C part takes the largest of TIMED_ROWS before the first at which `_int_mm`'s products over
    a step's TIMED_SHAPES took at most TAKE_OVER of the C part's time (each product timed twice, the
    shorter kept, times how many a step has; 0.2-0.3 s at start on one thread on the Zen 4 host),
    none where that happened at one row, where `_int_mm` is exact (`int_mm_exact`, checked then);
    every row count where it never happened up to the last of TIMED_ROWS, up to the last row count
    the timings started within TIMING_BUDGET_S, or up to the first at which `_int_mm` was FAR
    behind on `glance_shape` and no nearer than at the one before. Where `_int_mm` is not exact at
    GLANCE_ROWS, every row count, untimed."""
    if not _exact_at(GLANCE_ROWS):
        return TakeOver(sys.maxsize, 0, False)
    found = _timed()
    if found.c_max_rows == sys.maxsize:
        return found
    if not int_mm_exact():
        return TakeOver(sys.maxsize, found.timed_rows, False)
    return found


def glance_shape() -> int:
    """The index in TIMED_SHAPES of the stand-in a step spends the most multiply-adds on (a layer's
    gate and up rows): the one `_timed` glances at first."""

    def work(index: int) -> int:
        (n, k), count = TIMED_SHAPES[index]
        return n * k * count

    return max(range(len(TIMED_SHAPES)), key=work)


def _timed() -> TakeOver:
    """`take_over`'s timings: where `_int_mm` would take over from the C part by speed alone."""
    generator = torch.Generator().manual_seed(0)
    matrices = [(stand_in(shape, generator), count) for shape, count in TIMED_SHAPES]
    glance = glance_shape()
    started = last = time.perf_counter()
    fastest = 0
    before = float("inf")
    for rows in TIMED_ROWS:
        if fastest:  # the next row count's timings, predicted in proportion to the rows from the last's
            now = time.perf_counter()
            if now - started + (now - last) * rows / fastest > TIMING_BUDGET_S:
                break
            last = now
        times = {}
        for index in (glance, *(i for i in range(len(matrices)) if i != glance)):
            matrix = matrices[index][0]
            x = torch.randn(rows, matrix.shape[1], generator=generator)
            times[index] = shortest(2, matrix.c_product, x), shortest(2, matrix.int_mm_product, x)
            if index == glance and times[index][1] > FAR * times[index][0]:
                break
        behind = times[glance][1] / times[glance][0]
        if behind > FAR:
            if behind >= before:
                return TakeOver(sys.maxsize, rows, None, behind)
        else:
            c_part = sum(matrices[i][1] * c for i, (c, _) in times.items())
            int_mm = sum(matrices[i][1] * m for i, (_, m) in times.items())
            if int_mm <= TAKE_OVER * c_part:
                return TakeOver(fastest, rows, True)
        before = behind
        fastest = rows
    return TakeOver(sys.maxsize, fastest, None)


STAND_IN_ROWS = 64
"""Rows of random steps a timing stand-in repeats (`stand_in`); every TIMED_SHAPES' N is a multiple."""


def stand_in(shape: tuple[int, int], generator: torch.Generator) -> Int8Matrix:
    """A weight matrix of `shape` [N, K] for `_timed`, its steps for `_int_mm` kept: STAND_IN_ROWS
    rows of random steps packed once and repeated down the rows. An integer product takes the same
    time whatever its values, and so made the stand-ins cost 0.02 s rather than the 0.17 s of
    turning and rounding random float32 matrices (a 2-core AMD EPYC Zen 1)."""
    n, k = shape
    times = n // STAND_IN_ROWS
    steps = torch.randint(-127, 128, (STAND_IN_ROWS, k), generator=generator, dtype=torch.int8)
    block = Int8Matrix.from_steps(steps, torch.ones(STAND_IN_ROWS), int_mm=True)
    assert block.steps is not None and times * STAND_IN_ROWS == n
    return Int8Matrix(
        block.packed.repeat(times, 1, 1, 1),
        block.scales.repeat(times),
        block.sums.repeat(times),
        block.steps.repeat(times, 1),
    )


def int_mm_takes_rows() -> bool:
    """Whether `torch._int_mm` multiplies some row counts in this process (`take_over`): only then is
    the second copy of the steps kept for it."""
    return take_over().c_max_rows < sys.maxsize


def c_max_rows() -> int:
    """The most rows the C part multiplies in this process; `torch._int_mm` takes more (`take_over`)."""
    return take_over().c_max_rows


def shortest(times: int, product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """The shortest of `times` timings of `product(x)`, in seconds (after one call that is not
    timed: a library's first call at a shape prepares its kernel)."""
    product(x)
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        product(x)
        best = min(best, time.perf_counter() - started)
    return best


def describe() -> str:
    """The engine line's words for how the int8 products run here."""
    made = "turned by a Hadamard matrix, summed exactly in int32"
    part = f"the C part's {kernel()} kernel"
    found = take_over()
    if found.exact is False:
        return f"int8 rows and weights, {made} by {part} (torch._int_mm is not exact here)"
    limit = found.c_max_rows
    if limit == sys.maxsize and found.behind is not None:
        rows = found.timed_rows
        before = TIMED_ROWS[TIMED_ROWS.index(rows) - 1]
        level = f"torch._int_mm {found.behind:.0f}x slower at {rows} rows and no nearer than at {before}"
        return f"int8 rows and weights, {made} by {part} ({level})"
    if limit == sys.maxsize:
        level = f"torch._int_mm no faster at up to {found.timed_rows} rows"
        return f"int8 rows and weights, {made} by {part} ({level})"
    if limit == 0:
        return f"int8 rows and weights, {made} by torch._int_mm (faster than {part} at one row)"
    return f"int8 rows and weights, {made}: {part} up to {limit} rows, torch._int_mm beyond (timed at start)"


def _hadamard() -> torch.Tensor:
    """H: the Walsh-Hadamard matrix of GROUP, scaled to be orthonormal (for `dequantize`)."""
    h = torch.ones(1, 1)
    while h.shape[0] < GROUP:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h / GROUP**0.5


def rotate_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [rows, K] (float32, K whole groups) turned and rounded: (int8 [rows, K], float32 scales
    [rows]), each row computed alone."""
    assert _int8_rows is not None, available()[1]
    x = x.to(torch.float32).contiguous()
    rows, k = x.shape
    if k % GROUP:
        raise ValueError(f"rows of {k} values are not whole groups of {GROUP}")
    q = torch.empty(rows, k, dtype=torch.int8)
    scales = torch.empty(rows, dtype=torch.float32)
    _int8_rows.rotate_quantize(q.data_ptr(), scales.data_ptr(), x.data_ptr(), rows, k)
    return q, scales


@dataclass(frozen=True)
class Int8Matrix:
    """A weight matrix [out_features, in_features], each row turned and in int8 with its scale."""

    packed: torch.Tensor
    """int8 [ceil(out_features / 4), in_features / 32, 4, 32]: four rows' steps at each 32 columns
    side by side (zero rows after the last), as the C part reads them."""
    scales: torch.Tensor
    """float32 [out_features]."""
    sums: torch.Tensor
    """int32 [out_features rounded up to 4]: each weight row's sum of steps (the VNNI kernel's
    products are of x + 128, 128 times this too many)."""
    steps: torch.Tensor | None
    """int8 [out_features, in_features], for `torch._int_mm`; None where it takes no row count here."""
    rows_independent: ClassVar[bool] = True

    @classmethod
    def quantize(cls, weight: torch.Tensor, int_mm: bool | None = None) -> Int8Matrix:
        """`weight` [N, K] (K whole groups) turned and in int8, row by row; the steps kept for
        `torch._int_mm` too with `int_mm`, by default where it takes some row counts here
        (`take_over`)."""
        return cls.from_steps(*rotate_quantize(weight.detach()), int_mm=int_mm)

    @classmethod
    def from_steps(cls, steps: torch.Tensor, scales: torch.Tensor, int_mm: bool | None = None) -> Int8Matrix:
        """The matrix of int8 `steps` [N, K] (K whole CHUNKs) with float32 `scales` [N], packed for
        the C part; the steps kept for `torch._int_mm` as `quantize` keeps them."""
        assert _int8_rows is not None, available()[1]
        if steps.dtype != torch.int8 or steps.dim() != 2:
            raise ValueError(f"steps must be int8 [N, K], not {steps.dtype} {tuple(steps.shape)}")
        n, k = steps.shape
        steps = steps.contiguous()
        groups = -(-n // WEIGHT_ROWS)
        packed = torch.empty(groups, k // CHUNK, WEIGHT_ROWS, CHUNK, dtype=torch.int8)
        sums = torch.empty(groups * WEIGHT_ROWS, dtype=torch.int32)
        _int8_rows.pack(packed.data_ptr(), sums.data_ptr(), steps.data_ptr(), n, k)
        if int_mm is None:
            int_mm = int_mm_takes_rows()
        return cls(packed, scales, sums, steps if int_mm else None)

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), as a weight tensor's."""
        return self.scales.shape[0], self.packed.shape[1] * CHUNK

    @property
    def dtype(self) -> torch.dtype:
        """The dtype rows come out in (float32; they go in as float32 and are rounded to int8 here)."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed steps, the steps for `_int_mm` where kept, the scales and sums."""
        steps = 0 if self.steps is None else self.steps.numel()
        return self.packed.numel() + steps + self.scales.numel() * 4 + self.sums.numel() * 4

    @property
    def step_bytes(self) -> int:
        """Bytes a product reads: one copy of the steps (packed or for `_int_mm`) and the scales."""
        return self.packed.numel() + self.scales.numel() * 4

    def product(
        self, x: torch.Tensor, out: torch.Tensor | None = None, add: bool = False, step: bool = False
    ) -> torch.Tensor:
        """x[rows, K] @ weight^T as float32 [rows, N], into `out` (float32, contiguous; added to it
        with `add`) or new: x turned and rounded row by row, the int32 sums times the row's scale,
        rounded, times the weight row's, rounded (by the C part, or by `torch._int_mm` beyond
        `c_max_rows()` rows: the same values, at any row count, so `step` changes nothing)."""
        if out is not None and x.dim() == 2 and self.in_c(x.shape[0]):
            self.c_product_into(out, x, add)  # a step's buffers: float32, contiguous (checked there)
            return out
        flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        made = self.c_product(flat) if self.in_c(flat.shape[0]) else self.int_mm_product(flat)
        made = deliver(made, out, add)
        return made if x.dim() == 2 else made.reshape(*x.shape[:-1], made.shape[-1])

    def in_c(self, rows: int) -> bool:
        """Whether `product` multiplies `rows` rows in the C part (else in `torch._int_mm`)."""
        return rows <= c_max_rows() or self.steps is None

    def int_mm_product(self, x: torch.Tensor) -> torch.Tensor:
        """`product` with the sums made by `torch._int_mm` (where `steps` is kept)."""
        assert self.steps is not None, "the steps for torch._int_mm are not kept here"
        x = x.to(torch.float32).contiguous()
        rows, n = x.shape[0], self.shape[0]
        q, row_scales = rotate_quantize(x)
        sums = torch._int_mm(q, self.steps.t())
        out = torch.empty(rows, n, dtype=torch.float32)
        scales = self.scales.data_ptr()
        _int8_rows.scale(out.data_ptr(), sums.data_ptr(), row_scales.data_ptr(), scales, rows, n)
        return out

    @functools.cached_property
    def _c_weights(self) -> tuple[int, int, int, int, int]:
        """What `c_product` passes the C part of the weights, read once: the packed steps', scales' and
        sums' addresses, out_features and in_features."""
        n, k = self.shape
        return self.packed.data_ptr(), self.scales.data_ptr(), self.sums.data_ptr(), n, k

    def c_product(self, x: torch.Tensor) -> torch.Tensor:
        """`product` with the sums made by the C part, with `kernel()`."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.to(torch.float32).contiguous()
        out = torch.empty(x.shape[0], self.shape[0], dtype=torch.float32)
        self.c_product_into(out, x)
        return out

    def c_product_into(self, out: torch.Tensor, x: torch.Tensor, add: bool = False) -> None:
        """`c_product` of x [rows, K] (float32, contiguous) written into `out` [rows, N] (float32,
        contiguous), or with `add` added to what it holds (each value rounded as out + the product):
        a decode step's buffers and residual connection, without a tensor made per call."""
        packed, scales, sums, n, k = self._c_weights
        rows = x.shape[0]
        if x.shape[1] != k or out.shape != (rows, n):
            raise ValueError(f"rows of {tuple(x.shape)} into {tuple(out.shape)} for weights of {n} x {k}")
        if x.dtype != torch.float32 or out.dtype != torch.float32:
            raise ValueError(f"rows of {x.dtype} into {out.dtype}: the C part takes float32")
        if not (x.is_contiguous() and out.is_contiguous()):
            raise ValueError("the C part takes contiguous rows")
        kernel = kernel_number()
        _int8_rows.linear(out.data_ptr(), x.data_ptr(), packed, scales, sums, rows, n, k, kernel, add)

    def dequantize(self) -> torch.Tensor:
        """The weights as float32 [N, K], as the steps hold them (turned back; for tests and
        comparisons)."""
        n, k = self.shape
        steps = self.packed.permute(0, 2, 1, 3).reshape(-1, k)[:n]
        turned = (steps.float() * self.scales[:, None]).reshape(n, k // GROUP, GROUP)
        return (turned @ _hadamard()).reshape(n, k)

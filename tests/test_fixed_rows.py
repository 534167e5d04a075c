"""Batch invariance on every compute path this machine runs (compute.py, fixed_rows.py), each forced
as `--compute` forces it and set up by the engine's own start (child.build_scheduler: the probe, the
block size's check): a row's logits are the same bits alone, at every n from 1 to 32, beside other
requests' rows and in every slot. And the check itself: it finds a row that depends on its slot,
agrees with a comparison of every slot, and a product at a row count other than the checked one is
refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from backend.engines.embedded import compute, decode_ops, fixed_rows, int8
from backend.engines.embedded.fixed_rows import FixedRows, check
from backend.engines.embedded.linear import deliver
from backend.engines.embedded.row_cache import RowCache
from backend.engines.embedded.weights import resolve_model
from tests.support.embedded import kernel_status_on_one_thread

STEPS = 1
"""Decode steps compared per arrangement of rows. One is enough: a decode step writes the row's keys
and values into its slot of the cache and attends over them there (the write read back through the
cache's rounding), so a second step would read again what the first read; the second took 40 % of
the sweep's time (bf16-torch on a 2-core AMD EPYC Zen 1: 73 s of decode, 19 of prefill)."""


def test_a_product_at_a_row_count_other_than_the_checked_one_is_refused() -> None:
    weight = torch.randn(64, 32)
    fixed = FixedRows(8)
    with pytest.raises(ValueError, match="a product of 12 rows on a path checked at 8 rows"):
        fixed.product(torch.empty(12, 64), torch.randn(12, 32), weight)
    with pytest.raises(ValueError, match="row counts"):
        FixedRows(0)
    x = torch.randn(13, 32)
    out = fixed.linear(x, weight)  # padded to 16 rows, two products of 8
    assert out.shape == (13, 64) and out.dtype == torch.float32
    assert torch.allclose(out, F.linear(x, weight), atol=1e-5)
    laddered = FixedRows(compute.ladder(8))
    assert laddered.chunks(13) == [8, 8] and laddered.chunks(3) == [4] and laddered.chunks(1) == [1]
    with pytest.raises(ValueError, match="a product of 3 rows on a path checked at 1/2/4/8 rows"):
        laddered.product(torch.empty(3, 64), torch.randn(3, 32), weight)
    assert torch.allclose(laddered.linear(x[:3], weight), F.linear(x[:3], weight), atol=1e-5)
    assert torch.allclose(laddered.linear(x, weight), F.linear(x, weight), atol=1e-5)


def test_the_check_finds_a_row_that_depends_on_its_slot_or_its_neighbours(monkeypatch: Any) -> None:
    weights = [torch.randn(48, 32), torch.randn(16, 64).bfloat16()]
    assert check(8, weights) == []
    product = FixedRows.product

    def last_slot_rounds_another_way(
        self: FixedRows, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor
    ) -> None:
        product(self, out, x, w)
        out[-1] += out[-1].abs().max() * 1e-3  # the edge row takes another kernel

    monkeypatch.setattr(FixedRows, "product", last_slot_rounds_another_way)
    found = check(8, weights)
    # Each of the two orders fills two blocks of 8 with the 16 rows: four last slots.
    assert found == [
        "48 x 32 float32: rows differ (4 at 8 rows)",
        "16 x 64 bfloat16: rows differ (4 at 8 rows)",
    ]
    # On a ladder, rows are compared across its sizes too (the first product, at 1 row, is the
    # reference): the last slot of each size rounding another way shows at 2 and at 4 rows.
    on_ladder = check((1, 2, 4), weights)
    assert all("at 2 rows" in failure and "at 4 rows" in failure for failure in on_ladder), on_ladder

    def reads_its_neighbour(self: FixedRows, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
        product(self, out, x, w)
        out[0] += x[1].sum() * 1e-2  # a sum across rows

    monkeypatch.setattr(FixedRows, "product", reads_its_neighbour)
    found = check(8, weights)
    assert [failure.split(":")[0] for failure in found] == ["48 x 32 float32", "16 x 64 bfloat16"], found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [4, 8, 32])
def test_the_check_agrees_with_every_slot_beside_every_fill(dtype: torch.dtype, block: int) -> None:
    """What the check says of this machine's library at the model's shapes is what multiplying one
    row in every slot beside five fills (random, large, zeros, itself) finds: on some CPUs a size
    fails (float32 at 8 rows with MKL held to AVX2 on an AMX Xeon), and then both say so."""
    generator = torch.Generator().manual_seed(1)
    weights = [
        (torch.randn(n, k, generator=generator) * 0.05).to(dtype) for n, k in ((960, 576), (576, 1536))
    ]
    fixed = FixedRows(block)
    differs = False
    for weight in weights:
        row = torch.randn(weight.shape[1], generator=generator).to(dtype)
        reference = None
        for scale in (1.0, 100.0, 0.0, None):
            for slot in range(block):
                x = (
                    row.expand(block, -1).clone()
                    if scale is None
                    else (torch.randn(block, weight.shape[1], generator=generator) * scale).to(dtype)
                )
                x[slot] = row
                out = torch.empty(block, weight.shape[0], dtype=dtype)
                fixed.product(out, x, weight)
                reference = out[slot].clone() if reference is None else reference
                differs |= not torch.equal(out[slot], reference)
    assert bool(check(block, weights)) == differs


def _unavailable(name: str) -> str | None:
    return compute.unavailable(compute.PATHS[name], kernel_status_on_one_thread(), True, int8.available())


@pytest.fixture(scope="module", params=list(compute.PATHS))
def started(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The engine's scheduler (its model in the path's weight format) for one path, forced, as its
    process starts it, on one thread; the thread count and decode ops as they were afterwards."""
    from backend.engines.embedded.child import build_scheduler
    from backend.engines.embedded.worker import WorkerSetup

    why = _unavailable(request.param)
    if why is not None:
        pytest.skip(f"{request.param} does not run here: {why}")
    threads = torch.get_num_threads()
    folder = resolve_model()
    setup = WorkerSetup(str(folder.path), request.param, 1, 40, 256, str(folder.gguf or ""))
    try:
        scheduler = build_scheduler(setup, lambda: None)
        yield scheduler
    finally:
        decode_ops.configure()
        torch.set_num_threads(threads)


def _decode_beside(scheduler: Any, n: int, slot: int, others: tuple[str, str]) -> list[torch.Tensor]:
    """The logits of a row of the prompt "The capital of France is" in `slot` of a batch of n rows,
    the rows before it of the prompt others[0], after it of others[1] (each row fed its own token),
    over STEPS decode steps."""
    model, tokenizer = scheduler.model, scheduler.tokenizer
    cache = RowCache(model.config, 40, 256, torch.float32)
    if slot:
        model.prefill(tokenizer(others[0])["input_ids"], cache, cache.add_rows(slot))
    model.prefill(tokenizer("The capital of France is")["input_ids"], cache, cache.add_rows(1))
    if n - slot - 1:
        model.prefill(tokenizer(others[1])["input_ids"], cache, cache.add_rows(n - slot - 1))
    generator = torch.Generator().manual_seed(n)
    logits = []
    for step in range(STEPS):
        tokens = torch.randint(0, model.config.vocab_size, (n,), generator=generator)
        tokens[slot] = 100 + step
        logits.append(model.decode(tokens, cache)[slot].clone())
    return logits


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.timeout(600)  # bf16-torch on an AVX2-only CPU (no native bf16): over 180 s on a 2-core Zen 1
def test_a_rows_logits_are_the_same_alone_at_every_n_and_in_every_slot(started: Any) -> None:
    """Bit for bit: alone, then in slot n - 1 of n = 2..32 rows (so every slot of a full batch,
    beside 1 to 31 rows of two other prompts), then in the first slots beside a request of another
    prompt and in a batch of 32 rows of the same prompt fed other tokens."""
    health = started.snapshot()
    assert health["batch_invariant"], health["compute_why"]
    alone = _decode_beside(started, 1, 0, ("", ""))
    others = ("Once upon a time there was a", "Hi")
    differing = [n for n in range(2, 33) if not _same(_decode_beside(started, n, n - 1, others), alone)]
    assert differing == [], (health["compute_path"], health["compute_block"])
    for n, slot in ((9, 0), (17, 8), (32, 15)):
        assert _same(_decode_beside(started, n, slot, ("Tell me a story.", "Say hi.")), alone), (n, slot)


def test_the_same_rows_without_the_c_ops_row_by_row_in_pytorch(started: Any) -> None:
    """Where decode_ops is not built (an ARM CPU, no compiler) the ops between the linear layers run
    in PyTorch one row at a time: a row's logits are still the same alone and among others, and
    within rounding of the C ops'."""
    if not decode_ops.built():
        pytest.skip("decode_ops is not built here: the PyTorch ops are what every test runs")
    with_c = _decode_beside(started, 1, 0, ("", ""))
    decode_ops.configure(allow=False)
    try:
        alone = _decode_beside(started, 1, 0, ("", ""))
        for n in (3, 11, 20):
            assert _same(_decode_beside(started, n, n - 1, ("Once upon a time", "Hi")), alone), n
    finally:
        decode_ops.configure()
    # bf16 rounds every product's inputs and outputs to 8 bits: a few steps of that apart. int8 rounds
    # every product's rows to 255 steps, where a value the two ops' rounding puts on either side of
    # a step's edge moves by a whole step: 5 % of the largest logit here.
    form = started.model.weights.form
    tolerance = {"blocks": 1e-4, "library": 2**-4, "int8": 2**-3}[form.name]
    for mine, theirs in zip(alone, with_c, strict=True):
        assert (mine - theirs).abs().max() <= tolerance * theirs.abs().max()


def test_the_invariance_check_fails_where_a_step_pads_to_a_size_it_did_not_check(
    started: Any, monkeypatch: Any
) -> None:
    """A step whose products ran at another row count than the checked block is refused, and a
    product whose rows depend on their slot is what the comparison above catches."""
    health = started.snapshot()
    if started.model.weights.form.name == "int8":
        _int8_rows_rounded_by_the_batch_differ(started, monkeypatch)
        return
    if health["compute_block"] is None:
        pytest.skip(f"{health['compute_path']} multiplies on the rows kernel, at any row count")
    block = health["compute_block"]
    checked = "/".join(map(str, health["compute_sizes"]))

    def padded_to_another_size(self: FixedRows, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = torch.empty(block + 1, weight.shape[0], dtype=weight.dtype)
        inputs = torch.zeros(block + 1, weight.shape[1], dtype=weight.dtype)
        inputs[: x.shape[0]] = x[: block + 1]
        self.product(out, inputs, weight)
        return out[: x.shape[0]].float()

    monkeypatch.setattr(FixedRows, "linear", padded_to_another_size)
    with pytest.raises(ValueError, match=f"rows on a path checked at {checked} rows"):
        _decode_beside(started, 2, 1, ("Hi", "Hi"))
    monkeypatch.undo()
    alone = _decode_beside(started, 1, 0, ("", ""))
    product = FixedRows.product

    def by_slot(self: FixedRows, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
        product(self, out, x, w)
        out[-1] *= 1 + 2**-5  # the last slot of a block rounds another way (by more than a bf16 step)

    monkeypatch.setattr(fixed_rows.FixedRows, "product", by_slot)
    assert not _same(_decode_beside(started, block, block - 1, ("Hi", "Hi")), alone)


def _int8_rows_rounded_by_the_batch_differ(started: Any, monkeypatch: Any) -> None:
    """int8-exact has no block: its rows are the same at any count because each row is rounded to
    int8 by its own scale. Rounded by one scale for the whole batch (as PyTorch's dynamic
    quantization does), a row's logits change with the rows beside it, and the comparison above
    catches it."""
    alone = _decode_beside(started, 1, 0, ("", ""))

    def one_scale_a_batch(
        self: int8.Int8Matrix,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        add: bool = False,
        step: bool = False,
    ) -> torch.Tensor:
        steps, scales = int8.rotate_quantize(x.reshape(-1, x.shape[-1]))
        shared = scales.max()
        coarser = torch.round(steps.float() * (scales / shared)[:, None]).long()
        n, k = self.shape
        weights = self.packed.permute(0, 2, 1, 3).reshape(-1, k)[:n].long()
        made = ((coarser @ weights.t()).float() * shared * self.scales).reshape(*x.shape[:-1], n)
        return deliver(made, out, add)

    monkeypatch.setattr(int8.Int8Matrix, "product", one_scale_a_batch)
    assert not _same(_decode_beside(started, 4, 3, ("Once upon a time", "Hi")), alone)


HELD_TO_AVX2 = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
"""PyTorch, oneDNN and MKL held to AVX2: the kernels an AVX2-only CPU runs, on any newer x86 CPU."""


KERNELS_RUN = """
import hashlib
import torch
from backend.engines.embedded import int8

torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
weight = torch.randn(960, 576, generator=generator)
x = torch.randn(32, 576, generator=generator)
products = [
    lambda rows: torch.nn.functional.linear(rows, weight),
    lambda rows: torch.nn.functional.linear(rows.bfloat16(), weight.bfloat16()),
]
if int8.available()[0]:
    matrix = int8.Int8Matrix.quantize(weight, int_mm=int8.int_mm_exact())
    products.append(matrix.c_product)
    if matrix.steps is not None:
        products.append(matrix.int_mm_product)
digest = hashlib.sha256()
for product in products:
    for count in range(1, 33):
        digest.update(product(x[:count]).float().numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), len(products), digest.hexdigest())
"""
"""Prints PyTorch's CPU capability and a digest of the bits every library path's product gives at
1 to 32 rows (float32 and bfloat16 `F.linear`, int8's C part and `_int_mm`):
equal in two processes only where they run the same kernels."""


def _kernels_run(env: dict[str, str]) -> str:
    """KERNELS_RUN's line in a process run with `env`."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", KERNELS_RUN], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


@pytest.mark.timeout(1500)  # a pytest of its own, an engine for each path (minutes on 2 busy cores)
def test_the_library_paths_are_batch_invariant_with_the_libraries_held_to_avx2() -> None:
    """The row-by-row invariance above, in a process whose libraries run their AVX2 kernels (as on
    the AVX2-only machines users and Spaces have), for every PyTorch path: each settles on row
    counts that pass its check there (int8-exact: its products exact there too, `torch._int_mm`
    where it still is), and a row's logits are the same alone and among others. Skipped where the
    libraries held to AVX2 give every product the bits they give unheld (an AVX2-only CPU): the
    tests above ran those kernels already."""
    import os
    import subprocess
    import sys

    if os.environ.get("ATEN_CPU_CAPABILITY"):
        pytest.skip("this process already runs with its ISA set")
    held = _kernels_run({**os.environ, **HELD_TO_AVX2})
    if not held.startswith("AVX2 "):
        pytest.skip(f"PyTorch cannot run its AVX2 kernels here ({held.split()[0]})")
    if held == _kernels_run(dict(os.environ)):
        pytest.skip(f"held to AVX2 the libraries give every product the bits they give unheld ({held})")
    library = [name for name, path in compute.PATHS.items() if path.form != "blocks"]
    names = " or ".join(library)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            f"alone_at_every_n and ({names})",
        ],
        env={**os.environ, **HELD_TO_AVX2},
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"{len(library)} passed" in run.stdout, run.stdout[-3000:]

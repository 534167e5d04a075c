"""The bundled GGUF's quantized blocks in the rows kernel (backend/engines/embedded/quantized.py,
rows_linear.c): dequantized bit for bit as gguf-py does, matched to the converted float32 weights
(q and k reordered), multiplied to the weights' products with each row's outputs independent of the
rows beside it, and used by the engine."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGUFReader
from gguf.quants import dequantize

from backend.engines.embedded import startup_probe
from backend.engines.embedded.compute import PATHS, Choice
from backend.engines.embedded.formats import FLOAT32, Form
from backend.engines.embedded.linear import BlockWeight
from backend.engines.embedded.model import Llama
from backend.engines.embedded.quantized import (
    BLOCKS_FILE,
    KINDS,
    PANEL_ROWS,
    BlockMatrix,
    PackedMatrix,
    load_blocks,
    match_rows,
    read_saved_blocks,
)
from backend.engines.embedded.startup_probe import PROBE_OUTPUT_ROWS, Source
from backend.engines.embedded.weights import LlamaConfig, bundled_gguf, resolve_model
from tests.support.embedded import bundled_model
from tests.test_rows_linear import kernel_on

LAYER_MATRICES = 7
"""q, k, v, o, gate, up, down."""


@pytest.fixture(scope="module")
def kernel() -> Iterator[None]:
    with kernel_on():
        yield


@pytest.fixture(scope="module")
def weights(kernel: None) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict[str, BlockMatrix]]:
    read = bundled_model()
    assert read.folder.gguf == bundled_gguf()
    return read.config, read.tensors, read.blocks()


@pytest.fixture(scope="module")
def reader() -> GGUFReader:
    """The bundled GGUF, read once (gguf-py parses its metadata in Python: seconds)."""
    return GGUFReader(bundled_gguf())


@pytest.fixture(scope="module")
def models(weights: tuple) -> tuple[Llama, Llama]:
    """The model with the GGUF's blocks (`fp32-blocks`' format), and in float32 through PyTorch."""
    config, tensors, blocks = weights
    return Llama.from_tensors(config, tensors, Form("blocks"), blocks), Llama.from_tensors(config, tensors)


def test_blocks_dequantize_to_gguf_pys_values_bit_for_bit(kernel: None, reader: GGUFReader) -> None:
    checked = 0
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in KINDS:
            continue
        raw = np.array(tensor.data, dtype=np.uint8)
        blocks = BlockMatrix(torch.from_numpy(raw), kind, int(tensor.shape[0]))
        want = dequantize(raw, tensor.tensor_type).reshape(blocks.out_features, blocks.in_features)
        assert np.array_equal(blocks.dequantize().numpy(), want.astype(np.float32)), tensor.name
        checked += 1
    assert checked == 30 * LAYER_MATRICES + 1  # every layer matrix (Q4_1) and the embedding (Q8_0)


def test_every_matrix_matches_the_converted_weights_q_and_k_reordered(
    weights: tuple, reader: GGUFReader
) -> None:
    config, tensors, blocks = weights
    assert len(blocks) == config.layers * LAYER_MATRICES + 1
    assert blocks["model.embed_tokens.weight"].kind == "Q8_0"
    assert blocks["model.layers.0.mlp.down_proj.weight"].kind == "Q4_1"
    for name, matrix in blocks.items():
        assert torch.equal(matrix.dequantize(), tensors[name]), name
    # llama.cpp's GGUFs store q and k rows permuted; the conversion put them back, and so do the blocks
    stored_tensors = {t.name: t for t in reader.tensors}
    stored = np.array(stored_tensors["blk.0.attn_q.weight"].data, dtype=np.uint8)
    assert not np.array_equal(blocks["model.layers.0.self_attn.q_proj.weight"].data.numpy(), stored)
    stored = np.array(stored_tensors["blk.0.attn_v.weight"].data, dtype=np.uint8)
    assert np.array_equal(blocks["model.layers.0.self_attn.v_proj.weight"].data.numpy(), stored)


def test_a_matrix_that_differs_anywhere_stays_float32(weights: tuple) -> None:
    _, tensors, blocks = weights
    name = "model.layers.3.mlp.up_proj.weight"
    changed = tensors[name].clone()
    changed[100, 7] = torch.nextafter(changed[100, 7], torch.tensor(1.0))  # one unit in the last place
    assert match_rows(blocks[name], changed) is None
    assert match_rows(blocks[name], tensors[name]) is blocks[name]


def matrices(model: Llama) -> list[tuple[torch.Tensor, BlockWeight]]:
    """A layer's four matrices and the output layer: (float32 weights, the matrix from its blocks)."""
    layer = model.layers[5]
    found = [getattr(layer, n) for n in ("qkv", "out", "gate_up", "down")] + [model.lm_head]
    assert all(isinstance(matrix, BlockWeight) and matrix.blocks is not None for matrix in found)
    return [(matrix.dense, matrix) for matrix in found]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 33, 64])
def test_products_from_blocks_are_the_weights_products(models: tuple, rows: int) -> None:
    """Within float32 rounding of the exact product: each output summed over the columns in order,
    one fused multiply-add at a time (a few units in the last place of |x| . |w| more than the
    float64 product), the same as `F.linear` to its own rounding."""
    torch.manual_seed(rows)
    for dense, matrix in matrices(models[0]):
        x = torch.randn(rows, dense.shape[1])
        got = matrix.product(x)
        exact = (x.double() @ dense.double().T).float()
        scale = x.abs().double() @ dense.abs().double().T
        assert ((got.double() - exact.double()).abs() <= 1e-6 * scale + 1e-6).all(), dense.shape
        assert torch.allclose(got, F.linear(x, dense), rtol=1e-5, atol=2e-4)


def test_the_probe_times_a_quarter_of_the_output_layer_from_its_own_first_rows(
    weights: tuple, models: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up probe multiplies the output layer's first rows in whole groups, about a quarter:
    from the packed blocks' first groups (`first_rows`) the same values as the first outputs of the
    whole layer's product; a block size is checked on the whole layer."""
    config, tensors, blocks = weights
    source = Source(config, tensors, blocks)
    share = source.output_rows()
    assert share % PROBE_OUTPUT_ROWS == 0 and share == models[0].lm_head.shape[0] // 4  # 49,152 rows
    x = torch.randn(3, config.hidden_size)
    whole = models[0].lm_head.product(x, step=True)
    *_, output = source.sample(Form("blocks"))
    assert output["output"].blocks is not None and output["output"].shape[0] == share
    assert torch.equal(output["output"].product(x, step=True), whole[:, :share])
    checked: list[torch.Tensor] = []
    monkeypatch.setattr(startup_probe, "check", lambda sizes, weights: checked.extend(weights) or [])
    assert source.check(Choice(PATHS["bf16-torch"], 8)) == []
    assert checked[-1].shape == models[0].lm_head.shape and len(checked) == 5  # the whole output layer
    with pytest.raises(ValueError, match="whole groups of 24"):
        output["output"].blocks.first_rows(share + 1)
    source.release()


def test_a_rows_product_from_blocks_does_not_depend_on_the_rows_beside_it(models: tuple) -> None:
    """One or two rows (multiplied straight from the blocks) and up to 64 (in tiles of four from
    dequantized groups), at every place in a tile: each row's outputs bit for bit the same."""
    torch.manual_seed(0)
    for dense, matrix in matrices(models[0]):
        x = torch.randn(64, dense.shape[1])
        alone = torch.cat([matrix.product(x[i : i + 1]) for i in range(9)])
        for rows in (2, 3, 4, 5, 9, 64):
            together = matrix.product(x[:rows])
            assert torch.equal(together[:9], alone[: min(rows, 9)]), (dense.shape, rows)


@pytest.mark.parametrize("out_features", [1, 7, 24, 25, 50])
def test_groups_of_any_height_and_residuals_added(kernel: None, weights: tuple, out_features: int) -> None:
    """A matrix whose rows do not fill the last group of 24 (packed with zero rows, whose outputs
    are not written), and a product added in place, which rounds y + x @ W^T as `y + product` does."""
    _, tensors, blocks = weights
    for name in ("model.layers.2.mlp.down_proj.weight", "model.embed_tokens.weight"):
        whole = blocks[name]
        part = BlockMatrix(whole.data[:out_features].contiguous(), whole.kind, whole.in_features)
        dense = tensors[name][:out_features].contiguous()
        assert torch.equal(part.dequantize(), dense)
        matrix = BlockWeight(dense, part.packed())
        for rows in (1, 2, 5):
            x = torch.randn(rows, dense.shape[1])
            got = matrix.product(x)
            assert torch.allclose(got, F.linear(x, dense), rtol=1e-5, atol=2e-4)
            base = torch.randn(rows, out_features)
            summed = base.clone()
            matrix.product(x, summed, add=True)
            assert torch.equal(summed, base + got)


def test_a_step_reads_a_sixth_of_the_bytes(weights: tuple, models: tuple) -> None:
    config, tensors, blocks = weights
    quantized, dense = models[0].weights.step_bytes(), models[1].weights.step_bytes()
    assert 5.5 < dense / quantized < 5.7  # 538 MB against 96 MB
    bf16 = Llama.from_tensors(config, tensors, Form("library", torch.bfloat16), blocks)  # blocks unused
    assert bf16.weights.step_bytes() * 2 == dense and FLOAT32.name == "library"


def test_greedy_tokens_are_the_same_with_and_without_blocks(weights: tuple, models: tuple) -> None:
    config = weights[0]
    from backend.engines.embedded.row_cache import RowCache

    def greedy(model: Llama) -> list[int]:
        cache = RowCache(config, 2, 128, torch.float32)
        logits, _ = model.prefill([1, 504, 3458, 282, 2761, 30], cache, cache.add_rows(2))
        tokens = [int(logits.argmax())] * 2
        out = [tokens[0]]
        for _ in range(24):
            step = model.decode(torch.tensor(tokens), cache)
            tokens = step.argmax(-1).tolist()
            assert tokens[0] == tokens[1]
            out.append(tokens[0])
        return out

    assert greedy(models[0]) == greedy(models[1])


def test_the_matched_blocks_are_kept_and_a_changed_file_is_rebuilt(weights: tuple, tmp_path) -> None:
    """Read from the GGUF once (its reader is slow), then from the folder; a kept file that no
    longer matches the weights, or is unreadable, is replaced by the GGUF's blocks again."""
    _, tensors, blocks = weights
    some = {name: tensors[name] for name in list(blocks)[:3]}
    first = load_blocks(tmp_path, bundled_gguf(), some)
    assert set(first) == set(some) and (tmp_path / BLOCKS_FILE).is_file()
    assert list(tmp_path.glob("*.safetensors")) == []  # never read as the model's weights
    again = read_saved_blocks(tmp_path / BLOCKS_FILE)
    assert {n: m.data.tolist() == first[n].data.tolist() for n, m in again.items()} == dict.fromkeys(
        some, True
    )
    name = next(iter(some))
    changed = dict(some) | {name: some[name].clone()}
    changed[name][0, 0] += 1.0
    assert load_blocks(tmp_path, bundled_gguf(), changed).keys() == set(some) - {name}
    (tmp_path / BLOCKS_FILE).write_bytes(b"not a safetensors file")
    assert read_saved_blocks(tmp_path / BLOCKS_FILE) == {}
    assert load_blocks(tmp_path, bundled_gguf(), some).keys() == set(some)


def test_a_gguf_that_cannot_be_read_leaves_the_engine_on_its_float32_weights(
    kernel: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from backend.engines.embedded.child import build_scheduler
    from backend.engines.embedded.worker import WorkerSetup

    folder = tmp_path / "model"
    folder.mkdir()
    for file in resolve_model().path.iterdir():
        if file.is_file():
            (folder / file.name).symlink_to(file)  # the weights without their saved blocks
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    with caplog.at_level(logging.WARNING, logger="backend.embedded"):
        setup = WorkerSetup(str(folder), "auto", 1, 2, 128, str(broken))
        scheduler = build_scheduler(setup, lambda: None)
    assert "the GGUF's blocks could not be read" in caplog.text
    assert "GGUF" not in scheduler.linear_path and scheduler.compute["batch_invariant"]
    # auto timed the paths that need no blocks: the int8 products, or PyTorch's
    if scheduler.compute["path"] == "int8-exact":
        assert scheduler.linear_path.startswith("int8 rows and weights")
    else:
        assert scheduler.compute["path"] == "bf16-torch", scheduler.compute
        assert scheduler.linear_path.startswith("PyTorch")


def test_blocks_of_the_wrong_shape_never_reach_the_kernel() -> None:
    """The kernel reads rows x in_features / 32 blocks from the address it is given: a matrix whose
    bytes do not add up is refused when it is made."""
    row = 576 // 32 * 20  # Q4_1: 20 bytes a block
    BlockMatrix(torch.zeros(4, row, dtype=torch.uint8), "Q4_1", 576)
    for data, kind, width in (
        (torch.zeros(4, row - 1, dtype=torch.uint8), "Q4_1", 576),
        (torch.zeros(4, row, dtype=torch.uint8), "Q8_0", 576),
        (torch.zeros(4, row, dtype=torch.uint8), "Q4_1", 570),
        (torch.zeros(4, row, dtype=torch.int16), "Q4_1", 576),
        (torch.zeros(row, 4, dtype=torch.uint8).t(), "Q4_1", 576),
        (torch.zeros(4, row, dtype=torch.uint8), "Q5_K", 576),
    ):
        with pytest.raises(ValueError):
            BlockMatrix(data, kind, width)
    group = 576 // 32 * 20 * PANEL_ROWS  # a packed group of Q4_1 rows
    PackedMatrix(torch.zeros(2, group, dtype=torch.uint8), "Q4_1", 48, 576)
    for data, kind, rows, width in (
        (torch.zeros(2, group, dtype=torch.uint8), "Q4_1", 49, 576),  # 49 rows take three groups
        (torch.zeros(2, group - 1, dtype=torch.uint8), "Q4_1", 48, 576),
        (torch.zeros(2, group, dtype=torch.uint8), "Q8_0", 48, 576),
        (torch.zeros(2, group, dtype=torch.uint8), "Q4_1", 48, 570),
    ):
        with pytest.raises(ValueError):
            PackedMatrix(data, kind, rows, width)


def test_packed_blocks_of_another_matrix_are_refused(kernel: None, weights: tuple) -> None:
    _, tensors, blocks = weights
    packed = blocks["model.layers.0.self_attn.o_proj.weight"].packed()
    with pytest.raises(ValueError, match=r"blocks of 576 x 576 for a weight of \(1536, 576\)"):
        BlockWeight(tensors["model.layers.0.mlp.up_proj.weight"], packed)


def test_the_kernels_calls_refuse_negative_sizes_with_a_value_error(kernel: None) -> None:
    """The C part checks what it is given before it reads an address (a negative count is an error
    that says so, not a crash)."""
    from backend.engines.embedded import _rows_linear

    with pytest.raises(ValueError, match="N must be >= 0"):
        _rows_linear.pack(0, 0, 1, -1, 32)
    with pytest.raises(ValueError, match="N must be >= 0"):
        _rows_linear.dequantize(0, 0, 1, -1, 32)
    with pytest.raises(ValueError, match="M and N must be >= 0"):
        _rows_linear.linear_packed(0, 0, 0, 1, -1, 24, 32)
    with pytest.raises(ValueError, match="K a multiple of 32"):
        _rows_linear.pack(0, 0, 1, 24, 31)

"""The decode step's C ops (backend/engines/embedded/decode_ops.py, decode_ops.c) against the PyTorch
step they replace: each op on random inputs, their refusals, and whole decode steps of the bundled
model, which must pick the same greedy tokens and give every row the same values whatever rows run
beside it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.engines.embedded import decode_ops
from backend.engines.embedded.linear import LibraryWeight
from backend.engines.embedded.model import rms_norm, rotate
from tests.test_rows_linear import kernel_on


@pytest.fixture(autouse=True)
def ops_on() -> None:
    with kernel_on():
        if not decode_ops.usable():
            pytest.skip("the decode ops' C part is not built or this CPU lacks AVX2/FMA")
        yield


def test_rms_norm_matches_pytorch() -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(5, 576) * 3, torch.randn(576)
    assert torch.allclose(
        decode_ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5), rtol=1e-5, atol=1e-6
    )


def test_silu_mul_matches_pytorch_across_the_range_of_exp() -> None:
    torch.manual_seed(0)
    gate_up = torch.randn(4, 2 * 1536) * 8
    gate_up[0, :6] = torch.tensor([-200.0, -90.0, -20.0, 0.0, 20.0, 200.0])
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    assert torch.allclose(decode_ops.silu_mul(gate_up), expected, rtol=2e-6, atol=1e-30)


def test_rope_store_rotates_as_pytorch_does_bit_for_bit_and_writes_only_each_rows_position() -> None:
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, capacity = 3, 9, 3, 64, 16
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim)
    angles = torch.randn(40, dim)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.tensor([0, 7, 15])
    keys, values = torch.zeros(4, kv_heads, capacity, dim), torch.zeros(4, kv_heads, capacity, dim)
    q = decode_ops.rope_store(qkv, cos, sin, positions, keys, values, heads)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    q_ref, k_ref, v_ref = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    assert torch.equal(q, rotate(q_ref.view(rows, heads, dim), c, s).reshape(rows, -1))
    expected_keys, expected_values = torch.zeros_like(keys), torch.zeros_like(values)
    rows_index = torch.arange(rows)
    expected_keys[rows_index, :, positions] = rotate(k_ref.view(rows, kv_heads, dim), c, s)
    expected_values[rows_index, :, positions] = v_ref.view(rows, kv_heads, dim)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_attention_reads_each_rows_own_positions_as_masked_sdpa_does() -> None:
    torch.manual_seed(0)
    kv_heads, group, dim, capacity = 3, 3, 64, 64
    lengths = torch.tensor([1, 7, 8, 9, 50, 64])  # partial and whole groups of 8 positions
    rows = len(lengths)
    q = torch.randn(rows, kv_heads * group * dim)
    keys, values = (
        torch.randn(rows + 2, kv_heads, capacity, dim),
        torch.randn(rows + 2, kv_heads, capacity, dim),
    )
    out = decode_ops.attention(q, keys, values, lengths, dim**-0.5)
    for r, length in enumerate(lengths.tolist()):
        expected = F.scaled_dot_product_attention(
            q[r].view(kv_heads, group, dim), keys[r, :, :length], values[r, :, :length]
        )
        assert torch.allclose(out[r], expected.reshape(-1), atol=2e-6), (r, length)


def test_a_float16_cache_holds_the_rounded_keys_and_attention_reads_them_exactly() -> None:
    """With a float16 cache (the scheduler's), rope_store writes each key and value rounded as
    PyTorch rounds float32 to float16, and attention over it gives, bit for bit, what attention gives
    over a float32 cache holding those rounded values."""
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, capacity = 3, 9, 3, 64, 16
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim) * 4
    qkv[0, -dim:] = 70000.0  # past float16's range: infinity, as PyTorch rounds it
    angles = torch.randn(40, dim)
    cos, sin = angles.cos(), angles.sin()
    positions = torch.tensor([0, 7, 15])
    wide = torch.zeros(4, kv_heads, capacity, dim), torch.zeros(4, kv_heads, capacity, dim)
    half = tuple(torch.zeros(4, kv_heads, capacity, dim, dtype=torch.float16) for _ in range(2))
    q = decode_ops.rope_store(qkv, cos, sin, positions, *wide, heads)
    assert torch.equal(decode_ops.rope_store(qkv, cos, sin, positions, *half, heads), q)
    for rounded, exact in zip(half, wide, strict=True):
        assert torch.equal(rounded, exact.to(torch.float16))
    assert half[1][0, -1, 0].isinf().all()
    keys, values = torch.randn(6, kv_heads, 64, dim).half(), torch.randn(6, kv_heads, 64, dim).half()
    q = torch.randn(5, kv_heads * 3 * dim)
    lengths = torch.tensor([1, 8, 9, 50, 64])
    assert torch.equal(
        decode_ops.attention(q, keys, values, lengths, 0.125),
        decode_ops.attention(q, keys.float(), values.float(), lengths, 0.125),
    )
    with pytest.raises(ValueError, match="bfloat16"):
        decode_ops.attention(q, keys.bfloat16(), values.bfloat16(), lengths, 0.125)
    with pytest.raises(ValueError, match="values must be"):
        decode_ops.attention(q, keys, values.float(), lengths, 0.125)


def test_a_product_added_in_place_rounds_as_the_sum_of_the_product() -> None:
    torch.manual_seed(0)
    x, weight, y = torch.randn(6, 576), torch.randn(1536, 576) * 0.05, torch.randn(6, 1536)
    matrix = LibraryWeight(weight)
    expected = y + matrix.product(x)
    matrix.product(x, y, add=True)
    assert torch.equal(y, expected)


def test_bad_shapes_and_positions_are_refused_before_anything_is_written() -> None:
    keys, values = torch.zeros(2, 3, 8, 64), torch.zeros(2, 3, 8, 64)
    qkv, angles = torch.randn(2, 15 * 64), torch.zeros(32, 64)
    with pytest.raises(ValueError, match="position outside"):
        decode_ops.rope_store(qkv, angles, angles, torch.tensor([0, 8]), keys, values, 9)
    assert not keys.any() and not values.any()
    with pytest.raises(ValueError, match="qkv"):
        decode_ops.rope_store(qkv[:, :-64], angles, angles, torch.tensor([0, 1]), keys, values, 9)
    with pytest.raises(ValueError, match="positions"):
        decode_ops.rope_store(qkv, angles, angles, torch.tensor([0, 1], dtype=torch.int32), keys, values, 9)
    q = torch.randn(2, 9 * 64)
    with pytest.raises(ValueError, match="length outside"):
        decode_ops.attention(q, keys, values, torch.tensor([0, 3]), 0.125)
    with pytest.raises(ValueError, match="cache rows"):
        decode_ops.attention(torch.randn(3, 9 * 64), keys, values, torch.tensor([1, 1, 1]), 0.125)
    with pytest.raises(ValueError, match="x must be"):
        decode_ops.rms_norm(torch.randn(4, 576).t(), torch.randn(4), 1e-5)
    with pytest.raises(ValueError, match="even width"):
        decode_ops.silu_mul(torch.randn(2, 9))


@pytest.fixture(scope="module")
def bundled() -> tuple:
    from transformers import AutoTokenizer

    from backend.engines.embedded.formats import Form
    from backend.engines.embedded.model import Llama
    from tests.support.embedded import bundled_model

    read = bundled_model()
    blocks = read.blocks()
    model = Llama.from_tensors(read.config, read.tensors, Form("blocks") if blocks else Form(), blocks)
    return read.config, model, AutoTokenizer.from_pretrained(read.folder.path)


def prompts_in(cache, model, tokenizer, texts: list[str], copies: int) -> list[int]:
    """Prefill each text into `copies` rows; the greedy first token of each row."""
    from backend.engines.base import template_token_ids

    firsts = []
    for text in texts:
        ids = template_token_ids(tokenizer, [{"role": "user", "content": text}])
        logits, _ = model.prefill(ids, cache, cache.add_rows(copies))
        firsts += [int(logits.argmax())] * copies
    return firsts


TEXTS = ["Name three colours.", "Why is the sky blue?", "Write a haiku about rain."]


@pytest.mark.parametrize(("dtype", "within"), [(torch.float32, 2e-4), (torch.float16, 2e-2)])
def test_decode_on_the_ops_picks_the_pytorch_steps_greedy_tokens(
    bundled, dtype: torch.dtype, within: float
) -> None:
    """Rows of three prompts at different lengths, 40 greedy steps each way, with a float32 cache
    and with a float16 one (the scheduler's): the same tokens at every step, logits within 2e-4 in
    float32 (the sums add in another order: up to 1.1e-4 measured, logits of magnitude up to ~20),
    2e-2 in float16 (a key or value that far apart can round to the neighbouring float16, 2^-11 of
    it away, and the next steps read it: 1.5e-3 after one step, up to 1.1e-2 measured over 40)."""
    from backend.engines.embedded.row_cache import RowCache

    config, model, tokenizer = bundled
    caches, tokens = {}, {}
    for way in ("ops", "pytorch"):
        caches[way] = RowCache(config, 6, 512, dtype)
        tokens[way] = torch.tensor(prompts_in(caches[way], model, tokenizer, TEXTS, 2))
    words = [int(tokens["ops"][2])]
    for _ in range(40):
        logits = {}
        for way, cache in caches.items():
            decode_ops.configure(allow=way == "ops")
            try:
                logits[way] = model.decode(tokens[way], cache)
            finally:
                decode_ops.configure()
        assert (logits["ops"] - logits["pytorch"]).abs().max() < within
        tokens = {way: values.argmax(-1) for way, values in logits.items()}
        assert torch.equal(tokens["ops"], tokens["pytorch"])
        words.append(int(tokens["ops"][2]))
    answer = tokenizer.decode(words).lower()  # the second prompt's: why the sky is blue
    assert any(word in answer for word in ("scatter", "light", "atmosphere", "sky")), answer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_rows_values_do_not_depend_on_the_rows_beside_it(bundled, dtype: torch.dtype) -> None:
    """One prompt decoded alone and beside rows of other prompts: its logits bit for bit the same,
    with a float32 cache and with a float16 one."""
    from backend.engines.embedded.row_cache import RowCache

    config, model, tokenizer = bundled
    alone, crowded = RowCache(config, 1, 512, dtype), RowCache(config, 7, 512, dtype)
    mine = torch.tensor(prompts_in(alone, model, tokenizer, TEXTS[1:2], 1))
    theirs = prompts_in(crowded, model, tokenizer, TEXTS[1:2] + TEXTS[:1] + TEXTS[2:], 1)
    theirs = torch.tensor(theirs + prompts_in(crowded, model, tokenizer, TEXTS[:1], 4))
    for _ in range(8):
        own, shared = model.decode(mine, alone), model.decode(theirs, crowded)
        assert torch.equal(own[0], shared[0])
        mine, theirs = own.argmax(-1), shared.argmax(-1)


def test_rows_reading_their_prompt_from_one_row_get_what_their_own_copies_give() -> None:
    """Attention with each row's first positions read from a source row holding the same keys
    and values equals, bit for bit, attention over each row's own copy, wherever the shared part
    ends (inside a block of eight positions or at its edge)."""
    torch.manual_seed(0)
    kv_heads, group, dim, capacity = 3, 3, 64, 64
    rows = 5
    keys, values = torch.randn(rows, kv_heads, capacity, dim), torch.randn(rows, kv_heads, capacity, dim)
    sources, shared = torch.tensor([0, 0, 0, 3, 3]), torch.tensor([13, 13, 13, 16, 16])
    for r in range(rows):  # a row holds its source's prompt, then its own tokens
        s, p = int(sources[r]), int(shared[r])
        keys[r, :, :p], values[r, :, :p] = keys[s, :, :p], values[s, :, :p]
    q = torch.randn(rows, kv_heads * group * dim)
    lengths = torch.tensor([13, 20, 30, 17, 40])
    own = decode_ops.attention(q, keys, values, lengths, 0.125)
    scrambled_keys, scrambled_values = keys.clone(), values.clone()
    for r in range(rows):  # what a follower holds of the prompt must no longer matter
        if int(sources[r]) != r:
            scrambled_keys[r, :, : int(shared[r])] = float("nan")
            scrambled_values[r, :, : int(shared[r])] = float("nan")
    read_once = decode_ops.attention(q, scrambled_keys, scrambled_values, lengths, 0.125, sources, shared)
    assert torch.equal(own, read_once)
    with pytest.raises(ValueError, match="source row"):
        decode_ops.attention(q, keys, values, lengths, 0.125, torch.tensor([0, 0, 0, 3, 5]), shared)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_leaving_row_hands_its_followers_to_a_row_with_the_same_prompt(bundled, dtype: torch.dtype) -> None:
    """Rows of two prompts leave in an order that removes each prompt's first row and moves others:
    every row's source is a live row holding the same shared positions, and each remaining row's
    logits stay those of a cache where no row ever left."""
    from backend.engines.embedded.row_cache import RowCache

    config, model, tokenizer = bundled
    cache, fresh = RowCache(config, 8, 512, dtype), RowCache(config, 8, 512, dtype)
    firsts = prompts_in(cache, model, tokenizer, TEXTS[:2], 4)
    prompts_in(fresh, model, tokenizer, TEXTS[:2], 4)
    tokens = torch.tensor(firsts)
    logits = model.decode(tokens, cache)
    model.decode(tokens, fresh)
    origin = list(range(8))  # origin[r]: the row of `fresh` that row r of `cache` is
    for leaving in (0, 4, 1, 2):
        moved = cache.remove_row(leaving)
        if moved is not None:
            origin[leaving] = origin[moved]
        origin.pop()
        for r in range(cache.rows):
            source, shared = int(cache.source[r]), int(cache.shared[r])
            assert 0 <= source < cache.rows and shared > 0
            assert torch.equal(cache.keys[:, source, :, :shared], cache.keys[:, r, :, :shared])
            assert torch.equal(cache.values[:, source, :, :shared], cache.values[:, r, :, :shared])
    tokens = logits.argmax(-1)
    after = model.decode(tokens[origin], cache)
    expected = model.decode(tokens, fresh)[origin]
    assert torch.equal(after, expected)


def test_a_steps_ops_give_the_functions_values_on_each_layer_of_the_cache() -> None:
    """StepOps, which checks a step's tensors once and writes into its own buffers, gives bit for bit
    what the functions give, layer by layer of a many-layer float16 cache (each layer's keys and
    values where the layer's view of the cache holds them), and refuses a buffer not its own."""
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, capacity, layers, width, inner = 3, 9, 3, 64, 16, 4, 576, 1536
    x = torch.randn(rows, width)
    angles = torch.randn(40, dim)
    cos, sin = angles.cos(), angles.sin()
    positions, sources, shared = torch.tensor([0, 7, 15]), torch.tensor([0, 0, 2]), torch.tensor([0, 1, 0])
    shape = (layers, rows + 1, kv_heads, capacity, dim)
    keys, values = torch.randn(shape).half(), torch.randn(shape).half()
    keys_alone, values_alone = keys.clone(), values.clone()
    ops = decode_ops.StepOps(
        x,
        keys,
        values,
        positions,
        sources=sources,
        shared=shared,
        rotary=(cos, sin),
        heads=heads,
        scale=dim**-0.5,
        intermediate=inner,
    )
    weight = torch.randn(width)
    assert torch.equal(ops.rms_norm(weight, 1e-5), decode_ops.rms_norm(x, weight, 1e-5))
    for layer in (0, 2, 3):
        ops.qkv.copy_(torch.randn(rows, (heads + 2 * kv_heads) * dim))
        q = decode_ops.rope_store(ops.qkv, cos, sin, positions, keys_alone[layer], values_alone[layer], heads)
        expected = decode_ops.attention(
            q, keys_alone[layer], values_alone[layer], positions + 1, dim**-0.5, sources, shared
        )
        assert torch.equal(ops.attend(layer, ops.qkv), expected), layer
        assert torch.equal(keys, keys_alone) and torch.equal(values, values_alone), layer
    ops.gate_up.copy_(torch.randn(rows, 2 * inner))
    assert torch.equal(ops.silu_mul(ops.gate_up), decode_ops.silu_mul(ops.gate_up))
    with pytest.raises(ValueError, match="own qkv buffer"):
        ops.attend(0, ops.qkv.clone())
    with pytest.raises(ValueError, match="own gate_up buffer"):
        ops.silu_mul(ops.gate_up.clone())

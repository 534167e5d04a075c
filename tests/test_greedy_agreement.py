"""Greedy tokens of the embedded engine's model against transformers' forward of the same weights, on every
compute path this machine runs.

For each prompt (chat-templated), greedy tokens two ways: the engine's `Llama` as the engine runs it on
the path (every prompt a row of one batch: prefilled, then decoded together; on the default path, the
rows kernel from the GGUF's packed blocks and the C decode ops) and transformers'
`generate(do_sample=False)` on the converted weights in the path's dtype (in float32 the prompts as one
batch padded on the left, in bfloat16 one at a time). The end of turn is ignored on both sides (its logit
-inf; `min_new_tokens` for transformers), so every answer is exactly that long. The two forwards sum in
other orders, so they may part only where the reference's two best tokens are within the dtype's rounding
of each other: each prompt agrees on every token, or parts at such a near-tie. On `int8-exact` the
reference has the weights its int8 steps give back, and the engine's rows are rounded to int8 at every
product besides: its near-tie is that rounding's.
"""

from __future__ import annotations

import functools

import pytest
import torch

from backend.engines.base import template_token_ids
from backend.engines.embedded import compute, decode_ops, int8
from backend.engines.embedded.formats import Form
from backend.engines.embedded.model import Llama
from backend.engines.embedded.row_cache import RowCache
from backend.engines.embedded.weights import LlamaConfig, resolve_model
from tests.support.embedded import bundled_model, kernel_status_on_one_thread

PROMPTS = (
    "Name three colours.",
    "Why is the sky blue?",
    "What is the capital of France?",
    "What is 12 times 7?",
)

TOKENS = 32
"""Greedy tokens a prompt: long enough to part where the forwards can, short enough for 2 cores."""

NEAR_TIE = {"float32": 1e-3, "bfloat16": 0.25, "int8": 0.25}
"""Logits (about 10 to 30) within this of each other are a tie at the path's rounding: float32
keeps 24 bits (a sum in another order moves a logit by about 1e-5), bfloat16 8 (0.125 steps at
16-32); int8-exact rounds each product's rows to 255 steps (against a reference with its weights,
two of the four prompts parted, at 0.06 and 0.12)."""


@torch.inference_mode()
def engine_greedy(model: Llama, config: LlamaConfig, prompts: list[list[int]], eos: int) -> list[list[int]]:
    """Greedy tokens of every prompt, all decoded together as rows of one batch."""
    cache = RowCache(config, len(prompts), max(map(len, prompts)) + TOKENS + 1, model.dtype)
    firsts = []
    for ids in prompts:
        logits, _ = model.prefill(ids, cache, cache.add_rows(1))
        logits[eos] = float("-inf")
        firsts.append(int(logits.argmax()))
    out = [[first] for first in firsts]
    step = torch.tensor(firsts)
    for _ in range(TOKENS - 1):
        logits = model.decode(step, cache).float()
        logits[:, eos] = float("-inf")
        step = logits.argmax(-1)
        for row, token in zip(out, step.tolist(), strict=True):
            row.append(token)
    return out


@torch.inference_mode()
def reference_greedy(
    reference: torch.nn.Module, prompts: list[list[int]], eos: int
) -> list[tuple[list[int], list[torch.Tensor]]]:
    """transformers' greedy tokens and each step's logits for every prompt: in float32 the prompts
    generated together as one batch padded on the left (each attends to its own tokens alone; the
    weights read once a step for all of them; the same tokens as one prompt at a time), in another
    dtype one prompt at a time (a bfloat16 product rounds by its row count: batched, its greedy
    tokens part from those of one prompt alone)."""
    if reference.dtype != torch.float32 and len(prompts) > 1:
        return [reference_greedy(reference, [ids], eos)[0] for ids in prompts]
    width = max(map(len, prompts))
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = reference.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=TOKENS,
        min_new_tokens=TOKENS,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
        output_scores=True,
        return_dict_in_generate=True,
    )
    return [
        (out.sequences[row, width:].tolist(), [score[row].float() for score in out.scores])
        for row in range(len(prompts))
    ]


def _as_engine_weights(reference: torch.nn.Module, model: Llama) -> None:
    """Give transformers' layers the weights the engine's int8 steps hold, and its output layer too
    (untied from the embedding, which the engine keeps as it was)."""
    q, kv = model.q_size, model.kv_size
    with torch.no_grad():
        for theirs, ours in zip(reference.model.layers, model.layers, strict=True):
            attn, mlp = theirs.self_attn, theirs.mlp
            parts = {
                "qkv": ((attn.q_proj, q), (attn.k_proj, kv), (attn.v_proj, kv)),
                "out": ((attn.o_proj, attn.o_proj.weight.shape[0]),),
                "gate_up": (
                    (mlp.gate_proj, mlp.gate_proj.weight.shape[0]),
                    (mlp.up_proj, mlp.up_proj.weight.shape[0]),
                ),
                "down": ((mlp.down_proj, mlp.down_proj.weight.shape[0]),),
            }
            for name, projections in parts.items():
                weights = getattr(ours, name).dequantize().split([size for _, size in projections])
                for (projection, _), weight in zip(projections, weights, strict=True):
                    projection.weight.copy_(weight.to(projection.weight.dtype))
        if model.weights.form.name == "int8":
            reference.lm_head.weight = torch.nn.Parameter(model.lm_head.dequantize())


@functools.cache
def _plain_reference(dtype: torch.dtype) -> tuple[tuple[list[int], list[torch.Tensor]], ...]:
    """transformers' greedy tokens and scores for PROMPTS on the converted weights in `dtype`, made
    once per dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model()
    tokenizer = AutoTokenizer.from_pretrained(folder.path)
    eos = int(tokenizer.eos_token_id)
    reference = AutoModelForCausalLM.from_pretrained(folder.path, dtype=dtype)
    return tuple(reference_greedy(reference, _prompts(tokenizer), eos))


def _prompts(tokenizer: object) -> list[list[int]]:
    return [template_token_ids(tokenizer, [{"role": "user", "content": text}]) for text in PROMPTS]


@pytest.mark.parametrize("name", list(compute.PATHS))
def test_greedy_tokens_agree_with_transformers_or_part_at_a_near_tie(name: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = compute.PATHS[name]
    why = compute.unavailable(path, kernel_status_on_one_thread(), True, int8.available())
    if why is not None:
        pytest.skip(f"{name} does not run here: {why}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine's process runs
    dtype = getattr(torch, path.dtype)
    # A PyTorch path multiplies a decode step's rows at the sizes of a ladder, as the engine does by
    # default (here one product of 4 for the 4 rows; tests/test_fixed_rows.py runs the sizes the
    # engine checked); int8's sums are exact at any row count.
    sizes = () if path.any_rows else compute.ladder(16)
    decode_ops.configure()
    try:
        read = bundled_model()
        folder, config = read.folder, read.config
        blocks = read.blocks() if path.form == "blocks" else {}
        model = Llama.from_tensors(config, read.tensors, Form(path.form, dtype, sizes), blocks)
        tokenizer = AutoTokenizer.from_pretrained(folder.path)
        eos = int(tokenizer.eos_token_id)
        prompts = _prompts(tokenizer)
        if path.form == "int8":
            reference = AutoModelForCausalLM.from_pretrained(folder.path, dtype=dtype)
            _as_engine_weights(reference, model)
            references = reference_greedy(reference, prompts, eos)
        else:
            references = list(_plain_reference(dtype))
        partings = []
        engine = engine_greedy(model, config, prompts, eos)
        for text, ours, (theirs, scores) in zip(PROMPTS, engine, references, strict=True):
            agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), TOKENS)
            if agree < TOKENS:
                margin = float(scores[agree][theirs[agree]] - scores[agree][ours[agree]])
                partings.append((text, agree, margin))
    finally:
        decode_ops.configure()
        torch.set_num_threads(threads)
    rounding = "int8" if path.form == "int8" else path.dtype
    far = [(text, at, margin) for text, at, margin in partings if margin > NEAR_TIE[rounding]]
    assert not far, f"{name} parts from transformers where its best token was clear: {far}"
    if rounding == "float32":
        assert len(partings) <= 1, f"{name}: more than one prompt parted at a float32 near-tie: {partings}"

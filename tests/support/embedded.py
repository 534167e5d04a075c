"""Helpers of the embedded engine's tests: the bundled model read once, a request's texts, finish
reasons and last chunks."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from backend.engines.embedded.engine import EmbeddedGeneration
from backend.engines.embedded.linear import kernel_status
from backend.engines.embedded.quantized import BlockMatrix, load_blocks
from backend.engines.embedded.weights import (
    LlamaConfig,
    ModelFolder,
    read_config,
    read_tensors,
    resolve_model,
)
from backend.vocabulary import SamplingParams

PROMPT = "Name three colors."


@dataclass(frozen=True)
class BundledModel:
    """The bundled model's folder (its float32 weights converted from the GGUF), config and
    tensors, as the engine reads them."""

    folder: ModelFolder
    config: LlamaConfig
    tensors: dict[str, torch.Tensor]

    def blocks(self) -> dict[str, BlockMatrix]:
        """The GGUF's blocks of the float32 weights (none where the folder has no GGUF), read once."""
        return _blocks()


@functools.cache
def bundled_model() -> BundledModel:
    """The bundled model, read once for the test process (the modules that read it share it)."""
    folder = resolve_model()
    return BundledModel(folder, LlamaConfig.from_hf(read_config(folder.path)), read_tensors(folder.path))


@functools.cache
def _blocks() -> dict[str, BlockMatrix]:
    model = bundled_model()
    gguf = model.folder.gguf
    return load_blocks(model.folder.path, gguf, model.tensors) if gguf else {}


async def collect(generation: EmbeddedGeneration | object, n: int) -> tuple[list[str], list, list]:
    """Each sample's whole text, its finish reason and its last chunk, once the request is done."""
    texts, reasons, finals = [""] * n, [None] * n, [None] * n
    async for chunk in generation:  # type: ignore[attr-defined]
        texts[chunk.index] += chunk.text
        if chunk.finish_reason is not None:
            reasons[chunk.index] = chunk.finish_reason
            finals[chunk.index] = chunk
    return texts, reasons, finals


def params(max_tokens: int = 12, temperature: float = 0.8, seed: int = 5, **extra: object) -> SamplingParams:
    """Sampling settings with top_p 0.95 and a seed."""
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed, **extra)


def kernel_status_on_one_thread() -> tuple[bool, str]:
    """linear.kernel_status() as the engine's one-thread process sees it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine's process runs
    try:
        return kernel_status()
    finally:
        torch.set_num_threads(threads)

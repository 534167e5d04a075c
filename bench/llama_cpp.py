"""llama.cpp's side of `bench.embedded_vs_vllm`: `llama-batched-bench` on the bundled GGUF.

llama.cpp is what a CPU user would run instead of the engine. `scripts/prepare-engine-envs.sh
llamacpp` builds it from the tree the `llama-cpp-python` sdist vendors, with cmake, for the ISA
extensions this CPU's flags name (AMX off), into the engine cache. One measurement is one run of
`llama-batched-bench -npp P -ntg T -npl n -pps -t 1 -tb 1`: a P-token prompt decoded once and
shared by n sequences (`-pps`), then T tokens generated for each, on one thread, the same GGUF the
engine's blocks come from. Its JSON line gives the prompt's time (`t_pp`), the generation's
(`t_tg`) and both together (`t`): tokens per second as a user meets them are n x T over `t`
(prefill included, as the engine's and vLLM's are counted), and llama.cpp's own generation rate is
n x T over `t_tg`. The process's peak RSS is sampled while it runs (model, KV cache and buffers).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from devkit.local import ENGINE_CACHE
from devkit.memory import PeakRss

BINARY = ENGINE_CACHE / "llama.cpp" / "build" / "bin" / "llama-batched-bench"
BUILD_COMMAND = "scripts/prepare-engine-envs.sh llamacpp"
RUN_TIMEOUT_S = 600.0
"""Longest a single llama-batched-bench run may take on 2 shared cores."""


def available() -> bool:
    """Whether the llama.cpp build is there."""
    return BINARY.exists()


def command(gguf: Path, prompt: int, tokens: int, n: int, threads: int) -> list[str]:
    """The llama-batched-bench command for one measurement: a context of n equal parts (its KV cache
    is split per sequence), each large enough for the shared prompt and the tokens."""
    context = n * (prompt + tokens + 16)
    return [
        str(BINARY), "-m", str(gguf), "-c", str(context), "-b", "2048", "-ub", "512",
        "-npp", str(prompt), "-ntg", str(tokens), "-npl", str(n), "-pps",
        "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl",
    ]  # fmt: skip


ATTEMPTS = 3
"""Runs tried for one measurement: llama.cpp prints from a logging thread of its own, and on a
loaded machine its process now and then exits before that thread wrote the measurement."""


def run(gguf: Path, prompt: int, tokens: int, n: int, threads: int = 1) -> dict[str, float]:
    """One measurement: tok_s (n x tokens over the whole time, prefill included), gen_tok_s (over
    the generation alone), ttft_ms (the shared prompt's time: a lower bound of the first token's)
    and mem_mb (the process's peak RSS)."""
    for attempt in range(ATTEMPTS):
        try:
            return _run_once(gguf, prompt, tokens, n, threads)
        except MissingMeasurement:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class MissingMeasurement(RuntimeError):
    """llama-batched-bench exited without printing its measurement."""


def _run_once(gguf: Path, prompt: int, tokens: int, n: int, threads: int) -> dict[str, float]:
    process = subprocess.Popen(
        command(gguf, prompt, tokens, n, threads), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    with PeakRss(process.pid, above_entry=False) as memory:  # the whole process's peak
        try:
            out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    peak = memory.peak
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"llama-batched-bench exited {process.returncode}: {' / '.join(tail)}")
    result = parse(out.decode() + err.decode())
    if result["pl"] != n or result["tg"] != tokens:
        raise RuntimeError(f"llama-batched-bench measured n={result['pl']}, {result['tg']} tokens")
    generated = n * tokens
    return {
        "tok_s": generated / result["t"],
        "gen_tok_s": generated / result["t_tg"],
        "ttft_ms": 1000 * result["t_pp"],
        "mem_mb": peak / 2**20,
    }


def parse(output: str) -> dict[str, float]:
    """The JSON line llama-batched-bench prints for its one measurement."""
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and '"t_tg"' in line:
            return json.loads(line)
    raise MissingMeasurement(f"no measurement in llama-batched-bench's output: {output[-300:]!r}")


def version() -> str:
    """The build's version line (`--version`), or what kept it from answering."""
    try:
        done = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = (done.stdout + done.stderr).strip().splitlines()
    found = next((line for line in lines if line.startswith("version")), lines[0] if lines else "")
    return found

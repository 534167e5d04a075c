"""Bytes an SGLang `/generate` stream sends per request: cumulative (the default) against incremental.

Without `--incremental-streaming-output`, SGLang sends each sample's whole text and all its
`output_ids` in every event, so a request's bytes grow with the square of its length; with it,
each event holds only what is new. `--engine auto` starts its SGLang server with the flag. This
starts the CPU SGLang server both ways (from the environment `scripts/prepare-engine-envs.sh`
caches), streams n samples of `--max-tokens` tokens with the `sglang` engine's request and parser
(checking that the engine detects the mode and that every sample streams and finishes), and prints
the bytes on the wire per request, per token, and their ratio.

Usage: python -m bench.sglang_stream_bytes [--n 32] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import httpx

from backend.engines.base import SamplingParams
from backend.engines.http.sglang import SGLangEngine, sglang_request
from backend.engines.http.sglang_launch import SGLangServerProcess
from backend.engines.http.streams import SGLangStream, SSEDecoder

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DASHBOARD_CACHE") or Path.home() / ".cache" / "parallel-sampling-dashboard")
CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "65536"]
CPU_ARGS += ["--context-length", "2048", "--served-model-name", "smollm2"]
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": str(ROOT / "tests" / "support"),
}
"""SGLang on this CPU: its CUDA-only packages stood in for on the server's path (docs/engines.md)."""


async def measure(url: str, n: int, max_tokens: int) -> dict[str, float]:
    """Stream one request of n samples and count its bytes; parse it as the `sglang` engine does."""
    engine = SGLangEngine(url)
    await engine.check()  # reads /server_info: whether the server streams incrementally
    state, decoder = SGLangStream(n, incremental=engine.incremental), SSEDecoder()
    body = sglang_request("Once upon a time", n, SamplingParams(max_tokens, 0.8, 0.95, 1))
    received, tokens, started = 0, 0, time.monotonic()
    async with (
        httpx.AsyncClient(timeout=None) as client,
        client.stream("POST", url + "/generate", json=body) as response,
    ):
        async for data in response.aiter_bytes():
            received += len(data)
            for payload in decoder.feed(data):
                tokens += sum(chunk.tokens for chunk in state.feed(payload))
    await engine.stop()
    texts = [sample.text for sample in state.samples]
    assert all(texts) and not state.unfinished, "every sample streamed text and finished"
    return {
        "incremental": engine.incremental,
        "bytes": received,
        "tokens": tokens,
        "seconds": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    python = CACHE / "envs" / "sglang" / "bin" / "python"
    model = CACHE / "models" / "SmolLM2-135M-Instruct"
    results = {}
    for mode, extra in (("cumulative", []), ("incremental", ["--incremental-streaming-output"])):
        server = SGLangServerProcess(str(model), python=str(python), extra_args=CPU_ARGS + extra, env=CPU_ENV)
        server.start()
        try:
            results[mode] = asyncio.run(measure(server.url, args.n, args.max_tokens))
        finally:
            server.stop()
        assert results[mode]["incremental"] == (mode == "incremental"), "the engine misread the server's mode"
    print(f"SGLang /generate, n = {args.n} x {args.max_tokens} tokens, bytes the engine read per request:")
    for mode, r in results.items():
        print(
            f"  {mode:<12} {r['bytes'] / 1e6:8.2f} MB  {r['bytes'] / max(1, r['tokens']):8.0f} B/token  "
            f"({r['tokens']:.0f} tokens in {r['seconds']:.1f} s)"
        )
    ratio = results["cumulative"]["bytes"] / max(1, results["incremental"]["bytes"])
    print(f"  cumulative / incremental: {ratio:.1f}x")


if __name__ == "__main__":
    main()

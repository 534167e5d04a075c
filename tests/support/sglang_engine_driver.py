"""Drive the `sglang-engine` engine (SGLang in-process) on this CPU and print what happened as JSON.

Run with the SGLang environment's Python (it has `sglang`), the repo and tests/support on
PYTHONPATH, and SGLANG_USE_CPU_ENGINE=1; tests/test_engines_real.py does that and checks the output.
Usage: python tests/support/sglang_engine_driver.py MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from backend.engine import Prompt, SamplingParams
from backend.engines.sglang_engine import SGLangInProcessEngine
from tests.support.stop_one import MAX_TOKENS, StopOneSample

CPU_ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "max_total_tokens": 65536,
    "context_length": 2048,
    "log_level": "warning",
}
"""SGLang's settings for this CPU (see DESIGN.md)."""


async def run(model: str) -> dict[str, Any]:
    """n=4 to the end; n=3 with sample 1 stopped after its first chunk, then the rest; an engine error."""
    engine = SGLangInProcessEngine(model, **CPU_ENGINE_ARGS)
    await engine.start()
    report: dict[str, Any] = {"model": engine.model}
    try:
        texts, reasons = ["", "", "", ""], {}
        async for chunk in engine.generate(
            Prompt("Once upon a time", "raw"), 4, SamplingParams(16, 0.8, 0.95, 1)
        ):
            texts[chunk.index] += chunk.text
            if chunk.finish_reason:
                reasons[chunk.index] = chunk.finish_reason
        report["n4"] = {"texts": texts, "reasons": reasons}

        generation = engine.generate(
            Prompt("Once upon a time", "raw"), 3, SamplingParams(MAX_TOKENS, 0.8, 0.95, 1)
        )
        watch = StopOneSample()
        async for chunk in generation:
            action = watch.see(chunk.index, chunk.text, chunk.finish_reason)
            if action:
                await generation.abort(1 if action == "one" else None)
        await generation.aclose()
        report["stop_one"] = watch.report()

        generation = engine.generate(Prompt("Once upon a time", "raw"), 2, SamplingParams(4000, 0.8, 0.95, 1))
        try:
            report["error"] = [[c.finish_reason, dict(c.meta)] async for c in generation if c.finish_reason]
        except RuntimeError as exc:  # SGLang in-process raises what its server sends as an error event
            report["error"] = str(exc)
        finally:
            await generation.aclose()  # as the backend does after every request
        report["running_after"] = engine.health()["running_samples"]
    finally:
        await engine.stop()
    return report


if __name__ == "__main__":
    print("REPORT " + json.dumps(asyncio.run(run(sys.argv[1]))), flush=True)

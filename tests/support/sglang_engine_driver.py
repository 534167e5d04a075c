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

from backend.engines.base import Prompt, SamplingParams
from backend.engines.sglang_inprocess import SGLangInProcessEngine
from tests.support.answers import COLOUR_PROMPT, LONG_PROMPT
from tests.support.stop_one import MAX_TOKENS, StopOneSample

CPU_ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "max_total_tokens": 65536,
    "context_length": 2048,
    "log_level": "warning",
    "sleep_on_idle": True,
}
"""SGLang's settings for this CPU: the torch attention backend, a small KV pool, and an idle
scheduler that waits for work instead of polling for it."""


async def collect(
    engine: SGLangInProcessEngine, prompt: Prompt, n: int, params: SamplingParams
) -> dict[str, Any]:
    """Every sample of one request to its end: texts, token counts and finish reasons."""
    texts, tokens, reasons = [""] * n, [0] * n, [""] * n
    async for chunk in engine.generate(prompt, n, params):
        texts[chunk.index] += chunk.text
        tokens[chunk.index] += chunk.tokens
        if chunk.finish_reason:
            reasons[chunk.index] = chunk.finish_reason
    return {"texts": texts, "tokens": tokens, "reasons": reasons}


async def run(model: str) -> dict[str, Any]:
    """A chat prompt at n=4 and a raw one at n=2 to the end; n=3 with sample 1 stopped after its
    first chunk, then the rest; an engine error."""
    engine = SGLangInProcessEngine(model, **CPU_ENGINE_ARGS)
    await engine.start()
    report: dict[str, Any] = {"model": engine.model}
    try:
        choice = engine.choose_format(COLOUR_PROMPT, None)
        report["format"] = [choice.prompt.format, choice.reason]
        report["chat"] = await collect(engine, choice.prompt, 4, SamplingParams(64, 0.3, 0.95, 1))
        report["raw"] = await collect(
            engine, Prompt("Once upon a time", "raw"), 2, SamplingParams(16, 0.8, 0.95, 1)
        )

        generation = engine.generate(Prompt(LONG_PROMPT), 3, SamplingParams(MAX_TOKENS, 0.8, 0.95, 1))
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

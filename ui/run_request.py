"""The page's inputs turned into one backend request, or a plain sentence saying which input is wrong.

The page's API (`gradio_client`, or a request crafted by hand) can send anything the components'
own checks let through: None where a number belongs, NaN or infinity, a bool, text holding lone
UTF-16 surrogates that no engine can encode. Each is refused here with what to change, before any
connection opens; ranges (n, max tokens, temperature...) are the backend's to check, in one place,
and it says which limit a value broke.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backend.engines.base import PROMPT_FORMATS
from backend.protocol import CONSUMER_MODES, FANOUTS, OUTPUT_KINDS

EXPERIMENT_FIELDS = ("consumer", "fanout", "output_kind", "cancel_after")
"""The options that are the event-loop experiments (what a replay of a saved run takes from the page)."""


class InputProblem(ValueError):
    """An input the page cannot send; the message names it and says what to give instead."""


@dataclass(frozen=True)
class RunRequest:
    """What one Generate asks the backend for."""

    prompt: str
    n: int
    params: dict[str, Any]
    options: dict[str, Any]
    answer_pattern: str

    @property
    def blocking(self) -> bool:
        """Whether the run blocks its loop (the blocking-consumer experiment)."""
        consumer = self.options["consumer"]
        return consumer["mode"] == "blocking" and consumer["block_ms"] > 0

    @property
    def tokens(self) -> int:
        """Samples times max tokens: the most tokens the run can ask the engine for."""
        return self.n * int(self.params["max_tokens"])


def _number(value: Any, name: str, integer: bool = False, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputProblem(f"{name} must be a number, not {type(value).__name__} {str(value)[:40]!r}")
    if not math.isfinite(value):
        raise InputProblem(f"{name} must be a finite number, not {value}")
    if integer and value != int(value):
        raise InputProblem(f"{name} must be a whole number, not {value:g}")
    return float(value)


def _text(value: Any, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputProblem(f"{name} must be text, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputProblem(
            f"the {name} holds characters that are not text (lone UTF-16 surrogates); remove them"
        ) from None
    return value


def _choice(value: Any, name: str, choices: tuple[str, ...], default: str) -> str:
    if value in (None, ""):
        return default
    if value not in choices:
        raise InputProblem(f"{name} must be one of {', '.join(choices)}, not {str(value)[:40]!r}")
    return str(value)


def run_request(
    prompt_text: Any,
    n_value: Any,
    max_tokens_value: Any,
    temperature_value: Any,
    top_p_value: Any,
    seed_value: Any,
    consumer_mode: Any,
    block_ms_value: Any,
    fanout_value: Any,
    format_value: Any,
    system_value: Any,
    output_kind_value: Any,
    cancel_after_value: Any,
    logprobs_value: Any,
    answer_pattern_value: Any,
) -> RunRequest:
    """The request the page's inputs describe, in the order Generate takes them; InputProblem says
    which one cannot be sent."""
    prompt = _text(prompt_text, "prompt")
    n = _number(n_value, "n", integer=True)
    max_tokens = _number(max_tokens_value, "max tokens", integer=True)
    temperature = _number(temperature_value, "temperature")
    top_p = _number(top_p_value, "top-p")
    seed = _number(seed_value, "seed", integer=True, optional=True)
    block_ms = _number(0 if block_ms_value is None else block_ms_value, "block per chunk")
    cancel_after = _number(cancel_after_value, "cancel after k tokens", integer=True, optional=True)
    prompt_format = _choice(format_value, "format", tuple(PROMPT_FORMATS), "chat")
    system = _text(system_value, "system prompt")
    if not isinstance(logprobs_value, bool | None):
        raise InputProblem(f"token confidence must be true or false, not {str(logprobs_value)[:40]!r}")
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),  # type: ignore[arg-type]
        "temperature": temperature,
        "top_p": top_p,
        "seed": None if seed is None else int(seed),
    }
    options: dict[str, Any] = {
        "consumer": {
            "mode": _choice(consumer_mode, "consumer", CONSUMER_MODES, "cooperative"),
            "block_ms": block_ms,
        },
        "fanout": _choice(fanout_value, "fan-out", FANOUTS, "n"),
        "format": prompt_format,
    }
    if prompt_format == "chat" and system.strip():
        options["system"] = system
    output_kind = _choice(output_kind_value, "engine outputs", OUTPUT_KINDS, "delta")
    if output_kind != "delta":
        options["output_kind"] = output_kind
    if cancel_after:  # 0 or empty: never; anything else goes as typed (the backend checks it)
        options["cancel_after"] = int(cancel_after)
    if logprobs_value:
        options["logprobs"] = True
    return RunRequest(
        prompt, int(n), params, options, answer_pattern=_text(answer_pattern_value, "answer pattern")
    )  # type: ignore[arg-type]

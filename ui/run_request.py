"""The page's inputs turned into one backend request, or a plain sentence saying which input is wrong.

The page's API (`gradio_client`, or a request crafted by hand) can send anything the components'
own checks let through: None where a number belongs, NaN or infinity, a bool, text holding lone
UTF-16 surrogates that no engine can encode. Each is refused here with what to change, before any
connection opens; ranges (n, max tokens, temperature...) are the backend's to check, in one place,
and it says which limit a value broke.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from backend.protocol import CONSUMER_MODES, FANOUTS, OUTPUT_KINDS
from backend.vocabulary import ALTERNATIVES_DEFAULT, PROMPT_FORMATS
from ui.early_stop import RULES

STOP_CHOICES = ("off", *RULES)
"""`stop_when_decided`'s values: never, or a rule of `ui.early_stop`."""

RUN_SETTINGS = (
    "prompt",
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "consumer",
    "block_ms",
    "fanout",
    "format",
    "system",
    "output_kind",
    "cancel_after",
    "logprobs",
    "answer_pattern",
    "stop_when_decided",
    "alternatives",
)
"""The page's run settings, declared once, in the order its API takes them: each is a control the
page lays out under this name (`ui.app`), a keyword of the handlers that start runs, read here into
the request, and what an example may set (`ui.examples.Example`'s fields)."""

RUN_SETTINGS_OF_A_RUN = ("prompt", "format", "system")
"""The settings a run keeps when it is continued or replayed: its prompt as it ran."""

REPLAY_SETTINGS = ("consumer", "block_ms", "fanout", "output_kind", "cancel_after", "answer_pattern")
"""What a replay of a saved run takes from the page: the event-loop experiments and the answer pattern."""

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
    stop_rule: str = ""
    """The rule that stops the running samples once the vote is decided (`ui.early_stop`); "": none."""

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


def run_request(settings: Mapping[str, Any]) -> RunRequest:
    """The request the page's run settings describe (`RUN_SETTINGS`, by name; one left out is as
    empty); InputProblem says which one cannot be sent, TypeError names one the page does not have."""
    unknown = sorted(set(settings) - set(RUN_SETTINGS))
    if unknown:
        raise TypeError(
            f"the page has no run setting {unknown[0]!r}; its settings: {', '.join(RUN_SETTINGS)}"
        )
    get = settings.get
    prompt = _text(get("prompt"), "prompt")
    n = _number(get("n"), "n", integer=True)
    max_tokens = _number(get("max_tokens"), "max tokens", integer=True)
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),  # type: ignore[arg-type]
        "temperature": _number(get("temperature"), "temperature"),
        "top_p": _number(get("top_p"), "top-p"),
        "seed": _whole(_number(get("seed"), "seed", integer=True, optional=True)),
    }
    stop = _choice(get("stop_when_decided"), "stop when decided", STOP_CHOICES, "off")
    return RunRequest(
        prompt,
        int(n),
        params,
        _options(get),
        answer_pattern=_text(get("answer_pattern"), "answer pattern"),
        stop_rule="" if stop == "off" else stop,
    )  # type: ignore[arg-type]


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _options(get: Callable[[str], Any]) -> dict[str, Any]:
    """The request's options (consumer, fan-out, format and system prompt, output kind, cancel-after,
    logprobs and, with them, the alternatives a token) from the settings that give them."""
    block_ms = get("block_ms")
    block_ms = _number(0 if block_ms is None else block_ms, "block per chunk")
    cancel_after = _number(get("cancel_after"), "cancel after k tokens", integer=True, optional=True)
    prompt_format = _choice(get("format"), "format", tuple(PROMPT_FORMATS), "chat")
    system = _text(get("system"), "system prompt")
    logprobs = get("logprobs")
    if not isinstance(logprobs, bool | None):
        raise InputProblem(f"token confidence must be true or false, not {str(logprobs)[:40]!r}")
    alternatives = _number(get("alternatives"), "alternatives a token", integer=True, optional=True)
    options: dict[str, Any] = {
        "consumer": {
            "mode": _choice(get("consumer"), "consumer", CONSUMER_MODES, "cooperative"),
            "block_ms": block_ms,
        },
        "fanout": _choice(get("fanout"), "fan-out", FANOUTS, "n"),
        "format": prompt_format,
    }
    if prompt_format == "chat" and system.strip():
        options["system"] = system
    output_kind = _choice(get("output_kind"), "engine outputs", OUTPUT_KINDS, "delta")
    if output_kind != "delta":
        options["output_kind"] = output_kind
    if cancel_after:  # 0 or empty: never; anything else goes as typed (the backend checks it)
        options["cancel_after"] = int(cancel_after)
    if logprobs:
        options["logprobs"] = True
        # Empty: the default k; anything else goes as typed (the backend checks its range).
        options["alternatives"] = ALTERNATIVES_DEFAULT if alternatives is None else int(alternatives)
    return options

"""The stop-one-sample check of the real-engine tests: stop sample 1, watch the others go on, stop them.

`tests/test_engines_real.py` runs it over the backend's websocket against SGLang and vLLM servers
and through SGLang's router.
"""

from __future__ import annotations

MAX_TOKENS = 400
"""Every sample may run this long, so none can end on its own before its stop reaches the engine
(on this CPU a sample writes 5-20 tokens a second)."""
MAX_TOKENS_ON_GPU = 1900
"""The same on a GPU, where SmolLM2-135M writes 400 tokens in about a second: nearly the test servers'
2048-token context, within the page's own max_tokens limit (2048)."""
GOING_ON = 4
"""Chunks with text each other sample must get after sample 1's finish before the rest is stopped."""


class StopOneSample:
    """Feed it every chunk of a 3-sample request; it says when to stop sample 1 and when the rest."""

    def __init__(self) -> None:
        self.reasons: dict[int, str] = {}
        self.after_stop = {0: 0, 2: 0}
        """Chunks with text samples 0 and 2 got after sample 1 finished."""
        self.late = 0
        """Chunks of sample 1 after its finish: there must be none."""
        self.sent: list[str] = []

    def see(self, index: int, text: str, finish_reason: str | None) -> str | None:
        """Take one chunk; answer "one" (stop sample 1 now), "all" (stop the rest now) or None."""
        if index == 1 and 1 in self.reasons:
            self.late += 1
        elif finish_reason:
            self.reasons[index] = finish_reason
        elif index in self.after_stop and 1 in self.reasons and text:
            self.after_stop[index] += 1
        if index == 1 and not self.sent:
            self.sent.append("one")
            return "one"
        going_on = [i for i in self.after_stop if i not in self.reasons]
        if self.sent == ["one"] and all(self.after_stop[i] >= GOING_ON for i in going_on):
            self.sent.append("all")
            return "all"
        return None

    def problems(self) -> list[str]:
        """What went wrong, once the request is over; empty when sample 1 alone was stopped first."""
        found = []
        if self.reasons.get(1) != "abort":
            found.append(f"sample 1 ended as {self.reasons.get(1)!r}, not abort")
        if self.late:
            found.append(f"sample 1 got {self.late} chunks after its finish")
        for i, count in self.after_stop.items():
            reason = self.reasons.get(i)
            if count < GOING_ON and reason not in ("stop", "length"):
                found.append(f"sample {i}: {count} chunks after sample 1 stopped, then {reason!r}")
        if self.sent != ["one", "all"]:
            found.append(f"stops sent: {self.sent}")
        return found

    def report(self) -> dict[str, object]:
        """What happened, as JSON-ready data."""
        return {"reasons": self.reasons, "after_stop": self.after_stop, "problems": self.problems()}

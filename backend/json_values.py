"""Checks of the JSON values that come from outside (a client's frame, a saved run's file), shared
by `backend.protocol` and `backend.saved_run`: JSON's own numbers only, a whole number that is not
a bool, a finite number."""

from __future__ import annotations

import math
from typing import Any


def reject_constant(name: str) -> Any:
    """`json.loads`' `parse_constant`: NaN, Infinity and -Infinity are not numbers JSON allows."""
    raise ValueError(f"{name} is not a number JSON allows")


def is_int(value: Any) -> bool:
    """A whole number (a bool, which Python counts as one, is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite whole or decimal number (not a bool)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)

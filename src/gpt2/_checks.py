"""Argument checks that every module shares, so that one mistake reads the same everywhere.

Each returns the value (as a plain int or float) or raises a `GPT2Error` naming the argument.
bool is never a number here: `True` is an int to Python, never a count, a seed or an id to us.
"""

from __future__ import annotations

import math
import numbers

from gpt2.errors import InvalidArgumentError


def is_integer(value: object) -> bool:
    """An int (or a NumPy integer), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite int or float (or NumPy scalar), but not a bool: never NaN or infinity."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(name: str, value: object, error: type[Exception] = InvalidArgumentError) -> int:
    if not is_integer(value) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def int_between(name: str, value: object, low: int, high: int, what: str = "an integer") -> int:
    """An integer in low..high, both included; `what` reads before the range ("an integer from")."""
    if not is_integer(value) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be {what} from {low} to {high}, got {value!r}")
    return int(value)

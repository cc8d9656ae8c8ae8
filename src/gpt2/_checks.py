"""Argument checks that every module shares, so that one mistake reads the same everywhere.

Each returns the value (as a plain int or float) or raises a `GPT2Error` naming the argument,
in its message and as its `param`.
bool is never a number here: `True` is an int to Python, never a count, a seed or an id to us.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Sequence
from types import ModuleType
from typing import AbstractSet, Any, Literal

from gpt2.errors import InputTypeError, InvalidArgumentError, MissingPackageError, TokenIdError


def is_integer(value: object) -> bool:
    """An int (or a NumPy integer), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite int or float (or NumPy scalar), but not a bool: never NaN or infinity."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def boolean(name: str, value: object, error: type[Exception] = InvalidArgumentError) -> bool:
    """True or False itself: never 1, "yes" or None."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}", param=name)
    return value


def positive_int(name: str, value: object, error: type[Exception] = InvalidArgumentError) -> int:
    if not is_integer(value) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}", param=name)
    return int(value)


def check_batch_size(batch_size: object) -> int:
    """How many windows or examples `gpt2.evaluation.evaluate` scores at a time: a positive integer."""
    return positive_int("batch_size", batch_size)


def int_between(name: str, value: object, low: int, high: int | None, what: str = "an integer") -> int:
    """An integer in low..high, both included (high None: no bound above, as a bound not yet known,
    a model's before it loads); `what` reads before the range ("an integer from")."""
    if not is_integer(value) or value < low or (high is not None and value > high):
        bounds = f"from {low} up" if high is None else f"from {low} to {high}"
        raise InvalidArgumentError(f"{name} must be {what} {bounds}, got {value!r}", param=name)
    return int(value)


def check_top_k(top_k: object, n_vocab: int | None) -> int:
    """top_k: a whole number from 1 to the vocabulary's size, n_vocab (None: a model not loaded yet,
    no bound above). Every door asks this of a value given; a default fits by being none, or
    min(default, n_vocab)."""
    if not is_integer(top_k) or top_k < 1 or (n_vocab is not None and top_k > n_vocab):
        bounds = "from 1 up" if n_vocab is None else f"from 1 to {n_vocab}, the model's vocabulary size"
        raise InvalidArgumentError(f"top_k must be an integer {bounds}, got {top_k!r}", "top_k")
    return int(top_k)


def positive_real(name: str, value: object) -> float:
    """A finite number above zero (a learning rate, a temperature that is not greedy)."""
    if not is_real(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive number, got {value!r}", param=name)
    return float(value)


def real_between(
    name: str, value: object, low: float, high: float, *, open_low: bool = False, open_high: bool = False
) -> float:
    """A finite number from low to high; `open_low` / `open_high` leave that end out."""
    inside = (
        is_real(value)
        and (low < value if open_low else low <= value)
        and (value < high if open_high else value <= high)
    )
    if not inside:
        interval = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
        raise InvalidArgumentError(f"{name} must be a number in {interval}, got {value!r}", param=name)
    return float(value)


def check_token_ids(
    low: int, high: int, n_vocab: int, where: str = "", whose: str = "", param: str | None = None
) -> None:
    """Raise unless the ids low..high (the least and the greatest of a sequence) are all below
    n_vocab and not negative; `where` follows the bad id in the message (" in prompt 2"),
    `whose` precedes the range ("this model's "), `param` names the argument that holds them."""
    if low < 0 or high >= n_vocab:
        raise TokenIdError(
            f"token id {low if low < 0 else high}{where} is out of range: {whose}ids are 0..{n_vocab - 1}", param
        )


def one_token(
    token: object,
    tokenizer: Any,
    n_vocab: int,
    param: str,
    allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
) -> int:
    """A token given as its id, or as its text, which must be one token of the vocabulary (" Mary"): an
    answer, a logit difference's other side. The text is encoded with `allowed_special` read as special
    tokens, the rest as text (`<|endoftext|>` is its characters unless allowed)."""
    if isinstance(token, str):
        if token == "":
            raise InvalidArgumentError(f'{param} is empty: give one token\'s text (such as " Mary") or its id', param)
        if tokenizer is None:
            raise InvalidArgumentError(f"this model has no tokenizer to read {param}'s text with: give its id", param)
        try:
            ids = tokenizer.encode(token, allowed_special=allowed_special, disallowed_special=())
        except TokenIdError as e:  # a character a character vocabulary lacks
            raise TokenIdError(f"{param}: {e}", param) from None
        if len(ids) != 1:
            raise InvalidArgumentError(
                f"{param} must be one token of the model's vocabulary, but {token!r} is {len(ids)}: {ids}", param
            )
        return ids[0]
    if not is_integer(token):
        raise InputTypeError(f"{param} must be a token id or a string of one token, got {type(token).__name__}", param)
    check_token_ids(int(token), int(token), n_vocab, f" in {param}", param=param)
    return int(token)


def check_answer_and_other(
    answer: int | Sequence[int], other: int | Sequence[int] | None, shown: str | None = None, defaulted: str = ""
) -> None:
    """A logit difference's two sides, token ids (or lists of them, standing for their mean logit):
    one token on both sides makes logit(answer) - logit(other) 0 whatever the model does (" Mary"
    and " John" are one character, " ", to a character model), so it is refused, naming both.
    `shown`: the token as text; `defaulted`: which of them the caller chose, and how; for the message."""
    if other is None:
        return
    ids = [set([side] if is_integer(side) else side) for side in (answer, other)]
    if ids[0] == ids[1]:
        many = "s" if len(ids[0]) > 1 else ""
        which = f"id{many} {', '.join(map(str, sorted(ids[0])))}" + (f"; {defaulted}" if defaulted else "")
        raise InvalidArgumentError(
            f"answer and other are the same token{many}{'' if shown is None else f', {shown!r}'} ({which}): "
            "logit(answer) - logit(other) is 0 whatever the model does; give two different tokens",
            "other",
            also=("answer",),
        )


def require_package(name: str, extra: str, needed_by: str, param: str | None = None) -> ModuleType:
    """The optional package `name`, imported; where it is not installed, a MissingPackageError
    saying which of gpt2's extras brings it: "{needed_by} the {name} package: pip install
    'gpt2[{extra}]'" (`needed_by`: "ONNX export needs", "structured outputs need")."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise MissingPackageError(f"{needed_by} the {name} package: pip install 'gpt2[{extra}]'", param) from None

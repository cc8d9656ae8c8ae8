"""_checks: the argument checks every module shares."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from gpt2 import ConfigError, GPT2Config, GPT2Error, InvalidArgumentError
from gpt2._checks import int_between, is_integer, is_real, one_token, positive_int, require_package
from gpt2.errors import InputTypeError, MissingPackageError, TokenIdError
from gpt2.tokenizer import CharTokenizer, Tokenizer


def test_integers_and_reals():
    assert is_integer(3) and is_integer(np.int64(3)) and is_integer(-1)
    assert not any(is_integer(v) for v in (True, 3.0, "3", None, np.float32(3)))
    assert is_real(0) and is_real(0.5) and is_real(np.float32(2.5))
    assert not any(is_real(v) for v in (float("inf"), float("-inf"), float("nan"), False, "1", None))


def test_positive_int_names_the_argument():
    assert positive_int("n", np.int64(4)) == 4 and type(positive_int("n", np.int64(4))) is int
    for bad in (0, -1, True, 2.0, "2", None):
        with pytest.raises(InvalidArgumentError, match=f"n must be a positive integer, got {bad!r}"):
            positive_int("n", bad)
    with pytest.raises(ConfigError, match="n_layer must be a positive integer, got 0"):
        GPT2Config(n_layer=0)
    assert type(GPT2Config(n_layer=np.int64(2)).n_layer) is int  # config.json stays writable


def test_int_between_includes_both_ends():
    assert int_between("k", 1, 1, 5) == 1 and int_between("k", 5, 1, 5) == 5
    for bad in (0, 6, float("inf"), 2.5):
        with pytest.raises(InvalidArgumentError, match=f"k must be an integer from 1 to 5, got {bad!r}"):
            int_between("k", bad, 1, 5)


@pytest.mark.parametrize(
    "check, param",
    [
        (lambda: positive_int("num_workers", 0), "num_workers"),
        (lambda: int_between("seed", -1, 0, 9), "seed"),
        (lambda: GPT2Config(n_head=0), "n_head"),
    ],
)
def test_a_check_names_its_argument_as_the_errors_param(check, param):
    """The param that the server answers as OpenAI's `param` and the command line gives its flag."""
    with pytest.raises(GPT2Error) as caught:
        check()
    assert caught.value.param == param and param in str(caught.value)


def test_a_missing_optional_package_names_the_extra_that_brings_it(monkeypatch):
    assert require_package("json", "none", "nothing needs").dumps([]) == "[]"
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(
        MissingPackageError, match=r"^ONNX export needs the onnx package: pip install 'gpt2\[export\]'$"
    ) as caught:
        require_package("onnx", "export", "ONNX export needs", "format")
    assert caught.value.param == "format"


def test_one_token_reads_an_id_or_the_text_of_one_token(tiktoken_gpt2):
    """The answer of a logit difference, as the API, the server and the CLI take it: an id, or a text
    tiktoken encodes to one id (the id expected is tiktoken's)."""
    gpt2 = Tokenizer.gpt2()
    for text in (" Mary", "Hello", " the", "\n"):
        (expected,) = tiktoken_gpt2.encode_ordinary(text)
        assert one_token(text, gpt2, 50257, "answer") == expected
    assert (
        one_token(np.int64(17), gpt2, 50257, "answer") == 17 and type(one_token(np.int64(17), gpt2, 50257, "x")) is int
    )
    assert one_token("<|endoftext|>", gpt2, 50257, "answer", "all") == 50256  # the special token where allowed
    refused = [
        (
            " Mary Ann",
            None,
            InvalidArgumentError,
            "answer must be one token of the model's vocabulary, but ' Mary Ann' is 2: ",
        ),
        ("<|endoftext|>", None, InvalidArgumentError, "answer must be one token of the model's vocabulary, but "),
        ("", None, InvalidArgumentError, "answer is empty: give one token's text"),
        (50257, None, TokenIdError, "token id 50257 in answer is out of range: ids are 0..50256"),
        (-1, None, TokenIdError, "token id -1 in answer is out of range"),
        (True, None, InputTypeError, "answer must be a token id or a string of one token, got bool"),
        (2.0, None, InputTypeError, "answer must be a token id or a string of one token, got float"),
        (" x", "none", InvalidArgumentError, "this model has no tokenizer to read answer's text with: give its id"),
        ("z", "chars", TokenIdError, "answer: character 'z' at position 0 is not in this 2-character vocabulary"),
    ]
    for token, tokenizer, error, message in refused:
        given = {None: gpt2, "none": None, "chars": CharTokenizer(["a", "b"])}[tokenizer]
        with pytest.raises(error, match=re.escape(message)) as raised:
            one_token(token, given, 50257, "answer")
        assert raised.value.param == "answer"

"""gpt2.tokenizer.char, a character vocabulary, against nanoGPT's shakespeare_char (written out)."""

from __future__ import annotations

import json
import re

import pytest

from gpt2 import (
    IncrementalDecoder,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    VocabularyError,
    VocabularyNotFoundError,
)
from gpt2.tokenizer import CharTokenizer, load_tokenizer


def test_char_tokenizer_takes_the_same_arguments():
    """No special tokens: "all" is none, so "<|endoftext|>" is its characters whatever the arguments."""
    char = CharTokenizer(sorted(set("a<|endoftext|>")))
    ids = [char.chars.index(c) for c in "a<|endoftext|>"]
    for kwargs in [
        {},
        {"allowed_special": "all"},
        {"disallowed_special": ()},
        {"allowed_special": set(), "disallowed_special": "all"},
    ]:
        assert char.encode("a<|endoftext|>", **kwargs) == ids
        assert char.encode_batch(["a<|endoftext|>"], **kwargs) == [ids]
    assert char.encode_ordinary("a<|endoftext|>") == ids and char.encode_ordinary_batch(["a<|endoftext|>"]) == [ids]
    with pytest.raises(InvalidArgumentError, match="unknown special token"):
        char.encode("a", allowed_special={"<|endoftext|>"})


def test_char_tokenizer_is_nanogpts_shakespeare_char():
    text = "First Citizen:\nBefore we proceed, hear me speak. Ünïcödé ✓ 🎉"
    chars = sorted(set(text))  # nanoGPT's data/shakespeare_char/prepare.py, written out
    stoi = {c: i for i, c in enumerate(chars)}
    char = CharTokenizer.from_text(text)
    assert char.chars == chars and char.n_vocab == len(chars) and repr(char) == f"CharTokenizer(n_vocab={len(chars)})"
    assert char.encode(text) == [stoi[c] for c in text] and char.decode([stoi[c] for c in text]) == text
    assert CharTokenizer.from_text(["ba", "c", ""]).chars == ["a", "b", "c"]
    assert char.eot_token is None and char.special_tokens == {}
    assert char.encode_batch(["Fir", "", "🎉"]) == [[stoi["F"], stoi["i"], stoi["r"]], [], [stoi["🎉"]]]
    assert char.decode_bytes(char.encode("✓🎉")) == "✓🎉".encode()


def test_char_tokenizer_streams_through_the_incremental_decoder():
    char = CharTokenizer(["a", "é", "🎉"])
    decoder = IncrementalDecoder(char)
    assert [decoder.add([i]) for i in [2, 0, 1]] == ["🎉", "a", "é"] and decoder.flush() == ""


@pytest.mark.parametrize(
    "chars, message",
    [
        (["a", "bc"], "a character vocabulary holds single characters; entry 1 is 'bc'"),
        (["a", 7], "entry 1 is 7"),
        (["a", "b", "a"], "lists each character once; some are repeated"),
        ([], "needs at least one character"),
    ],
)
def test_char_tokenizer_rejects_bad_vocabularies(chars, message):
    with pytest.raises(VocabularyError, match=re.escape(message)):
        CharTokenizer(chars)


def test_char_tokenizer_rejects_unknown_characters_and_ids():
    char = CharTokenizer(list("abc"))
    with pytest.raises(
        TokenIdError, match=re.escape("character 'z' at position 2 is not in this 3-character vocabulary")
    ):
        char.encode("abzc")
    with pytest.raises(InputTypeError, match="encode\\(\\) takes a str, got bytes"):
        char.encode(b"abc")
    with pytest.raises(InputTypeError, match="encode_batch\\(\\) takes a list of texts"):
        char.encode_batch("abc")
    for ids, message in [
        ([0, 3], "token id 3 at position 1 is out of range: ids are 0..2"),
        ([-1], "token id -1 at position 0 is out of range"),
        ([0, 1.5], "token ids must be integers; got 1.5 at position 1"),
        ([True], "got True at position 0"),
    ]:
        with pytest.raises(TokenIdError, match=re.escape(message)):
            char.decode(ids)


def test_char_tokenizer_saves_pickles_and_loads(tmp_path):
    import pickle

    char = CharTokenizer(list("zé a\n"))  # not sorted: ids are the order given
    char.save(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "chars.json").read_text(encoding="utf-8")) == {"chars": list("zé a\n")}
    loaded = load_tokenizer(tmp_path / "new")
    assert type(loaded) is type(char) and loaded.__getstate__() == char.__getstate__() == {"chars": list("zé a\n")}
    assert loaded.encode("a z") == [3, 2, 0]
    assert pickle.loads(pickle.dumps(char)).encode("a z") == [3, 2, 0]
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["chars.json"]  # no temporary file left


def test_char_tokenizer_from_file_and_type_errors(tmp_path):
    CharTokenizer(list("ab\n")).save(tmp_path)
    assert CharTokenizer.from_file(tmp_path / "chars.json").encode("b\na") == [1, 2, 0]
    with pytest.raises(VocabularyNotFoundError, match=r"vocabulary file not found: .*nowhere\.json"):
        CharTokenizer.from_file(tmp_path / "nowhere.json")
    with pytest.raises(InputTypeError, match=re.escape("from_text() takes a str or str texts, got bytes at index 1")):
        CharTokenizer.from_text(["ab", b"cd"])
    with pytest.raises(InputTypeError, match=re.escape("encode_batch() takes str texts, got int at index 2")):
        CharTokenizer(list("ab")).encode_batch(["a", "b", 3])
    with pytest.raises(InputTypeError, match=re.escape("encode_batch() takes a list of texts, got one bytes")):
        CharTokenizer(list("ab")).encode_batch(b"ab")

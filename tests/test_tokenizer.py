"""The tokenizer against tiktoken's GPT-2 encoding (an independent Rust implementation)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2.tokenizer as tokenizer_module
from helpers import VOCAB, stdlib_sources, tiktoken_from_files
from gpt2 import (
    DisallowedSpecialTokenError,
    GPT2Error,
    IncrementalDecoder,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    Tokenizer,
    VocabularyError,
    VocabularyNotFoundError,
)


@pytest.fixture(scope="module")
def enc() -> Tokenizer:
    return Tokenizer.gpt2()


# ------------------------------------------------------------------ the vocabulary


def test_packaged_vocabulary_matches_provenance_hashes():
    provenance = (VOCAB / "PROVENANCE.md").read_text()
    expected = dict(re.findall(r"\|\s*(encoder\.json|vocab\.bpe)\s*\|\s*\d+\s*\|\s*([0-9a-f]{64})\s*\|", provenance))
    assert set(expected) == {"encoder.json", "vocab.bpe"}
    for name, digest in expected.items():
        assert hashlib.sha256((VOCAB / name).read_bytes()).hexdigest() == digest, name
    assert "Modified MIT License" in (VOCAB / "LICENSE").read_text()


def test_gpt2_vocabulary_shape(enc):
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.special_tokens == {"<|endoftext|>": 50256}
    assert enc.token_bytes(50256) == b"<|endoftext|>"
    assert enc.token_bytes(0) == b"!"
    assert enc.token_id(b"Hello") == 15496
    assert enc.token_id("<|endoftext|>") == 50256
    assert Tokenizer.gpt2() is enc


def test_token_lookups_agree_with_tiktoken(enc, tiktoken_gpt2):
    for i in range(0, enc.n_vocab, 97):
        token = enc.token_bytes(i)
        assert token == tiktoken_gpt2.decode_single_token_bytes(i)
        if i != enc.eot_token:
            assert enc.token_id(token) == i


# ------------------------------------------------------------------ exactness


def test_published_vector(enc):
    text = "Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗"
    expected = [15496, 3228, 314, 1101, 10948, 73, 509, 5117, 10036, 13, 632, 338, 33160, 13, 266, 405, 83, 1058, 35, 12520, 97, 245]
    assert enc.encode(text) == expected
    assert enc.decode(expected) == text


def test_corpus_matches_tiktoken(enc, tiktoken_gpt2, corpus_text):
    ids = enc.encode(corpus_text)
    assert ids == tiktoken_gpt2.encode_ordinary(corpus_text)
    assert enc.decode(ids) == corpus_text


def test_python_sources_match_tiktoken(enc, tiktoken_gpt2):
    files = stdlib_sources(limit=60)
    assert len(files) >= 30
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert enc.encode(text) == tiktoken_gpt2.encode_ordinary(text), path.name


ADVERSARIAL = [
    "",
    " ",
    "a",
    "   leading and trailing   ",
    "runs  of   spaces    and\t\ttabs\t \t and\n\n\nnewlines\n \n",
    "windows\r\nline\r\nendings\r\n\r\n",
    "trailing whitespace \t\n ",
    "\n\n\n",
    "\t",
    " \u00a0\u2003\u3000 unicode spaces\u2028\u2029\u0085",
    "I'm you're he's we've they'll I'd can't won't",
    "I'M YOU'RE HE'S WE'VE THEY'LL I'D CAN'T",
    "i'M yOu'Re He'S wE'vE tHeY'lL i'D",
    "'s 't 're 've 'm 'll 'd '' ''s 's's",
    "1234567890123456789012345678901234567890 3.14159 1,000,000 0x1F -42",
    "!!!??? ... --- *** ((( ))) [[[ ]]] {{{ }}} <<<>>> @@@### $$$%%% ^^^&&&",
    "a.b,c;d:e!f?g-h_i/j\\k|l`m~n",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🤗🤗🤗 ❤️‍🔥",
    "中文字符测试，你好世界。日本語のテキスト、カタカナ。한국어 텍스트",
    "العربية مرحبا بالعالم עברית שלום עולם",
    unicodedata.normalize("NFC", "café naïve Ångström résumé"),
    unicodedata.normalize("NFD", "café naïve Ångström résumé"),
    "e\u0301\u0302\u0303\u0304 a\u0308\u0308\u0308",
    "zero\u200bwidth\u200c\u200djoiner\ufeffbom",
    "control\x00\x01\x07\x08\x1b[31m\x7f\x1c\x1d\x1e\x1f",
    "\ufffd replacement \ufffd",
    "x" * 10_000,
    "supercalifragilistic" * 500,
    "<|endoftext|>",
    "text<|endoftext|>more text <|endoftext|> <|endoftext",
    "𝕳𝖊𝖑𝖑𝖔 𝒲ℴ𝓇𝓁𝒹 ℌ𝔢𝔩𝔩𝔬",
    "Ⅻ ² ½ ٣ ௰ numbers of other kinds",
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_matches_tiktoken(enc, tiktoken_gpt2, text):
    ids = enc.encode_ordinary(text)
    assert ids == tiktoken_gpt2.encode_ordinary(text)
    assert enc.decode(ids) == text


def test_ten_thousand_character_random_word(enc, tiktoken_gpt2):
    rng = random.Random(7)
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10_000))
    assert enc.encode(word) == tiktoken_gpt2.encode_ordinary(word)


def _random_unicode(rng: random.Random, length: int) -> str:
    chars = []
    while len(chars) < length:
        cp = rng.choice([rng.randrange(0x80), rng.randrange(0x3000), rng.randrange(0x110000)])
        if not 0xD800 <= cp <= 0xDFFF:
            chars.append(chr(cp))
    return "".join(chars)


def test_random_unicode_fixed_seed(enc, tiktoken_gpt2):
    rng = random.Random(1234)
    for _ in range(300):
        text = _random_unicode(rng, rng.randrange(1, 200))
        assert enc.encode(text) == tiktoken_gpt2.encode_ordinary(text), ascii(text)
        assert enc.decode(enc.encode(text)) == text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_matches_tiktoken_and_round_trips(text):
    enc = Tokenizer.gpt2()
    ids = enc.encode(text)
    assert enc.decode(ids) == text
    assert ids == _tiktoken_once().encode_ordinary(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \t\n\r\x0b\x0c'sdmtlvreAZaz09.,!?-\u00a0é🤗中")), max_size=40))
def test_whitespace_and_contraction_soup_matches_tiktoken(text):
    assert Tokenizer.gpt2().encode(text) == _tiktoken_once().encode_ordinary(text)


_TIKTOKEN = []


def _tiktoken_once():
    # hypothesis tests cannot take function-scoped fixtures; build the reference once.
    if not _TIKTOKEN:
        _TIKTOKEN.append(tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe"))
    return _TIKTOKEN[0]


def test_lone_surrogates_are_encoded_like_tiktoken(enc, tiktoken_gpt2):
    for text in ["\ud800", "a\udfffb", "x \ud83d y"]:
        assert enc.encode(text) == tiktoken_gpt2.encode(text)
    assert enc.decode(enc.encode("a\ud800b")) == "a\ufffdb"


# ------------------------------------------------------------- the ASCII fast path


def test_ascii_pattern_classes_equal_unicode_classes():
    for cp in range(128):
        ch = chr(cp)
        assert bool(regex.fullmatch(r"\s", ch)) == (ch in "\t\n\x0b\x0c\r "), hex(cp)
        assert bool(regex.fullmatch(r"\p{L}", ch)) == ch.isalpha(), hex(cp)
        assert bool(regex.fullmatch(r"\p{N}", ch)) == ch.isdigit(), hex(cp)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_ascii_pattern_splits_like_gpt2_pattern(text):
    assert tokenizer_module._ASCII_PATTERN.findall(text) == tokenizer_module._UNICODE_PATTERN.findall(text)


# ------------------------------------------------------------------ special tokens


SPECIAL_TEXTS = ["Hello world", "a<|endoftext|>b <|endoftext|>", "<|endoftext|>", "<|endoftext|><|endoftext|>x", "<|endoftext"]
ALLOWED = [set(), frozenset(), {"<|endoftext|>"}, "all"]
DISALLOWED = ["all", (), set(), {"<|endoftext|>"}, ["<|endoftext|>"]]


def _outcome(encode, *args, **kwargs):
    """The ids, or the message of the ValueError raised instead."""
    try:
        return encode(*args, **kwargs)
    except ValueError as e:
        return ("raised", str(e))


@pytest.mark.parametrize("allowed", ALLOWED, ids=repr)
@pytest.mark.parametrize("disallowed", DISALLOWED, ids=repr)
def test_special_token_text_follows_tiktoken(enc, tiktoken_gpt2, allowed, disallowed):
    """Every pair of allowed_special / disallowed_special: tiktoken's ids, or tiktoken's ValueError
    with its message word for word (ours a GPT2Error too); encode_batch raises for the first text that does."""
    kwargs = {"allowed_special": allowed, "disallowed_special": disallowed}
    for text in SPECIAL_TEXTS:
        ours = _outcome(enc.encode, text, **kwargs)
        assert ours == _outcome(tiktoken_gpt2.encode, text, **kwargs), text
        if isinstance(ours, tuple):
            with pytest.raises(GPT2Error, match="^Encountered text corresponding to disallowed special token '<|endoftext|>'"):
                enc.encode(text, **kwargs)
    ours = _outcome(enc.encode_batch, SPECIAL_TEXTS, **kwargs)
    assert ours == _outcome(tiktoken_gpt2.encode_batch, SPECIAL_TEXTS, **kwargs)


def test_defaults_are_tiktokens(enc, tiktoken_gpt2):
    """Nothing said: special-token text raises (tiktoken's default); "all" reads it as the token;
    encode_ordinary and disallowed_special=() as characters."""
    text = "a<|endoftext|>b <|endoftext|>"
    with pytest.raises(ValueError) as theirs:
        tiktoken_gpt2.encode(text)
    with pytest.raises(DisallowedSpecialTokenError) as ours:
        enc.encode(text)
    assert str(ours.value) == str(theirs.value) and isinstance(ours.value, ValueError)
    assert enc.encode("Hello world") == tiktoken_gpt2.encode("Hello world")
    assert enc.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text) == enc.encode(text, disallowed_special=())
    assert 50256 not in enc.encode_ordinary(text)
    assert enc.encode_ordinary_batch([text, "x"]) == tiktoken_gpt2.encode_ordinary_batch([text, "x"])
    allowed = enc.encode(text, allowed_special="all")
    assert allowed == tiktoken_gpt2.encode(text, allowed_special="all") and allowed.count(50256) == 2
    assert enc.decode(allowed) == text
    with pytest.raises(TypeError):  # keyword-only, as tiktoken's
        enc.encode(text, "all")


def test_bad_allowed_special(enc):
    with pytest.raises(InvalidArgumentError, match="<|startoftext|>"):
        enc.encode("x", allowed_special={"<|startoftext|>"})
    with pytest.raises(InvalidArgumentError, match="allowed_special must be a set of special tokens or 'all'"):
        enc.encode("x", allowed_special="<|endoftext|>")
    with pytest.raises(InvalidArgumentError, match=re.escape("disallowed_special: unknown special token(s) ['<|fim|>']")):
        enc.encode("x", disallowed_special={"<|fim|>"})
    with pytest.raises(InvalidArgumentError, match="disallowed_special must be a set of special tokens or 'all'"):
        enc.encode_batch(["x"], disallowed_special="<|endoftext|>")


def test_char_tokenizer_takes_the_same_arguments():
    """No special tokens: "all" is none, so "<|endoftext|>" is its characters whatever the arguments."""
    char = tokenizer_module.CharTokenizer(sorted(set("a<|endoftext|>")))
    ids = [char.chars.index(c) for c in "a<|endoftext|>"]
    for kwargs in [{}, {"allowed_special": "all"}, {"disallowed_special": ()}, {"allowed_special": set(), "disallowed_special": "all"}]:
        assert char.encode("a<|endoftext|>", **kwargs) == ids
        assert char.encode_batch(["a<|endoftext|>"], **kwargs) == [ids]
    assert char.encode_ordinary("a<|endoftext|>") == ids and char.encode_ordinary_batch(["a<|endoftext|>"]) == [ids]
    with pytest.raises(InvalidArgumentError, match="unknown special token"):
        char.encode("a", allowed_special={"<|endoftext|>"})


# ------------------------------------------------------------------ decoding


def test_invalid_utf8_decodes_to_replacement_like_tiktoken(enc, tiktoken_gpt2):
    ids = enc.encode("🤗")  # three tokens, the emoji's 4 bytes split across them
    assert len(ids) == 3
    for partial in ([ids[0]], ids[:2], [ids[1], ids[2]], [ids[2], ids[0]]):
        assert enc.decode(partial) == tiktoken_gpt2.decode(partial)
        assert "\ufffd" in enc.decode(partial)
        assert enc.decode_bytes(partial) == tiktoken_gpt2.decode_bytes(partial)


def test_decode_accepts_any_integer_sequence(enc):
    import numpy as np
    import torch

    ids = enc.encode("Hello world")
    assert enc.decode(tuple(ids)) == enc.decode(iter(ids)) == enc.decode(np.array(ids)) == "Hello world"
    assert enc.decode(np.array(ids, dtype=np.uint16)) == enc.decode(torch.tensor(ids)) == "Hello world"
    assert enc.decode(torch.tensor([ids])[0]) == enc.decode_bytes(torch.tensor(ids, dtype=torch.int32)).decode()
    assert list(enc.decode_stream(torch.tensor(ids))) == ["Hello", " world"]


@pytest.mark.parametrize("ids, message", [
    (None, "decode() takes a list of token ids (ints), or a 1-D tensor or array of them, got NoneType"),
    (15496, "decode() takes a sequence of token ids, got one int: use decode([15496])"),
    ("Hello", "decode() takes token ids, not str: to get ids from text, use encode()"),
    (b"Hello", "decode() takes token ids, not bytes"),
    ("torch-2d", "decode() takes one sequence of ids (1-D), got 2-D ids of shape [1, 2]: pick one row, e.g. decode(ids[0])"),
    ("numpy-2d", "got 2-D ids of shape [2, 1]: pick one row"),
    ("torch-0d", "got 0-D ids of shape []: wrap one id in a list, decode([id])"),
])  # fmt: skip
def test_decode_says_what_to_pass(enc, ids, message):
    import numpy as np
    import torch

    ids = {"torch-2d": torch.tensor([[15496, 995]]), "numpy-2d": np.array([[15496], [995]]),
           "torch-0d": torch.tensor(15496)}.get(ids, ids)  # fmt: skip
    with pytest.raises(InputTypeError, match=re.escape(message)):
        enc.decode(ids)


def test_decode_rejects_float_arrays(enc):
    import numpy as np
    import torch

    for ids in (torch.tensor([1.0, 2.0]), np.array([1.5])):
        with pytest.raises(TokenIdError, match="token ids must be integers; got 1"):
            enc.decode(ids)


def test_decode_stream_never_splits_a_character(enc):
    text = "Hi 🤗 中文 👨‍👩‍👧 é\u0301 done"
    ids = enc.encode(text)
    pieces = list(enc.decode_stream(ids))
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert "🤗" in pieces[1:] or any("🤗" in piece for piece in pieces)
    # the emoji's three tokens make one piece, not three halves
    assert len(pieces) < len(ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=50256), max_size=30))
def test_incremental_decoder_equals_decode_for_any_ids(ids):
    enc = Tokenizer.gpt2()
    decoder = IncrementalDecoder(enc)
    streamed = "".join(decoder.add([i]) for i in ids) + decoder.flush()
    assert streamed == enc.decode(ids)


# ------------------------------------------------------------------ batches and the cache


def test_encode_batch_matches_encode(enc):
    texts = ["Hello world", "", "🤗 emoji", "a<|endoftext|>b"] * 3
    assert enc.encode_batch(texts, disallowed_special=()) == [enc.encode_ordinary(t) for t in texts]
    assert enc.encode_batch(texts, allowed_special="all")[3] == enc.encode(texts[3], allowed_special="all")


def test_encode_batch_in_worker_processes(enc, tiktoken_gpt2, corpus_text, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "_PARALLEL_MIN_CHARS", 0)
    texts = corpus_text[:300_000].split("\n\n")
    expected = tiktoken_gpt2.encode_ordinary_batch(texts)
    fresh = Tokenizer.from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    try:
        for workers in (2, 2, 3):  # the second call reuses the warm workers
            assert fresh.encode_batch(texts, num_workers=workers) == expected
        special = ["a<|endoftext|>b"] * 4
        assert fresh.encode_batch(special, allowed_special="all", num_workers=2)[3] == [64, 50256, 65]
        assert fresh.encode_ordinary_batch(special, num_workers=2) == tiktoken_gpt2.encode_ordinary_batch(special)
        with pytest.raises(DisallowedSpecialTokenError):
            fresh.encode_batch(texts + special, num_workers=2)
    finally:
        fresh.close()
    assert fresh._pool is None


def test_split_by_length_keeps_order_and_balances():
    texts = [str(i) * (i % 7 + 1) for i in range(1000)]
    shares = tokenizer_module._split_by_length(texts, 3)
    assert [t for share in shares for t in share] == texts
    sizes = [sum(map(len, share)) for share in shares]
    assert max(sizes) - min(sizes) <= 2 * max(map(len, texts))


def test_pickled_tokenizer_encodes_the_same(enc):
    import pickle

    clone = pickle.loads(pickle.dumps(enc))
    assert clone.encode("pickled 🤗 text") == enc.encode("pickled 🤗 text")


def test_piece_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(tokenizer_module, "_CACHE_MAX_ENTRIES", 50)
    enc = Tokenizer.from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    enc.encode(" ".join(f"word{i}" for i in range(1000)))
    assert 0 < len(enc._cache) <= 50
    enc.encode("y" * 5000)
    assert "y" * 5000 not in enc._cache


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("value", [b"bytes", None, 42, ["a", "list"]])
def test_encode_rejects_non_str(enc, value):
    with pytest.raises(InputTypeError, match=type(value).__name__) as info:
        enc.encode(value)
    assert isinstance(info.value, GPT2Error) and isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([15496, -1], "token id -1 at position 1 is out of range"),
        ([50257], "token id 50257 at position 0 is out of range: ids are 0..50256"),
        ([10**20], "out of range"),
        ([1.5], "must be integers; got 1.5"),
        (["7"], "must be integers; got '7'"),
        ([None], "must be integers; got None"),
    ],
)
def test_decode_rejects_bad_ids(enc, ids, message):
    with pytest.raises(TokenIdError, match=re.escape(message)):
        enc.decode(ids)
    with pytest.raises(TokenIdError):
        list(enc.decode_stream(ids))


def test_encode_batch_rejects_bad_input(enc):
    with pytest.raises(InputTypeError, match="index 1"):
        enc.encode_batch(["ok", b"bytes"])
    with pytest.raises(InputTypeError, match=re.escape("encode_batch() takes a list of texts, got one str: for one text, use encode(text)")):
        enc.encode_batch("Hello world")  # not 11 one-character texts
    with pytest.raises(InputTypeError, match="got one bytes"):
        enc.encode_batch(b"Hello")
    with pytest.raises(InvalidArgumentError, match="num_workers"):
        enc.encode_batch(["ok"], num_workers=0)


@pytest.fixture
def vocab_copy(tmp_path):
    (tmp_path / "encoder.json").write_bytes((VOCAB / "encoder.json").read_bytes())
    (tmp_path / "vocab.bpe").write_bytes((VOCAB / "vocab.bpe").read_bytes())
    return tmp_path


def test_missing_vocabulary_file(tmp_path):
    with pytest.raises(VocabularyNotFoundError, match="vocabulary file not found: .*encoder.json"):
        Tokenizer.from_files(tmp_path / "encoder.json", tmp_path / "vocab.bpe")


def test_corrupt_encoder_json(vocab_copy):
    (vocab_copy / "encoder.json").write_text('{"a": 0, "b": ')
    with pytest.raises(VocabularyError, match="is not valid JSON"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_encoder_json_with_a_non_integer_id(vocab_copy):
    encoder = json.loads((vocab_copy / "encoder.json").read_text())
    encoder["Hello"] = "15496"
    (vocab_copy / "encoder.json").write_text(json.dumps(encoder))
    with pytest.raises(VocabularyError, match="'Hello' has id '15496'"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_encoder_json_missing_a_byte(vocab_copy):
    encoder = json.loads((vocab_copy / "encoder.json").read_text())
    del encoder["!"]
    (vocab_copy / "encoder.json").write_text(json.dumps(encoder))
    with pytest.raises(VocabularyError, match="id 0 is missing"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_merge_naming_an_unknown_token(vocab_copy):
    lines = (vocab_copy / "vocab.bpe").read_text().splitlines()
    lines.insert(5, "Ġzzq xyzzy")
    (vocab_copy / "vocab.bpe").write_text("\n".join(lines) + "\n")
    with pytest.raises(VocabularyError, match="merge 4 \\(Ġzzq xyzzy\\) names 'Ġzzq', which is not a token"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


def test_malformed_merge_line(vocab_copy):
    with open(vocab_copy / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("onlyonetoken\n")
    with pytest.raises(VocabularyError, match="line 50002: expected two tokens"):
        Tokenizer.from_files(vocab_copy / "encoder.json", vocab_copy / "vocab.bpe")


# ------------------------------------------------------------------ character vocabularies and load_tokenizer


def test_char_tokenizer_is_nanogpts_shakespeare_char():
    text = "First Citizen:\nBefore we proceed, hear me speak. Ünïcödé ✓ 🎉"
    chars = sorted(set(text))  # nanoGPT's data/shakespeare_char/prepare.py, written out
    stoi = {c: i for i, c in enumerate(chars)}
    char = tokenizer_module.CharTokenizer.from_text(text)
    assert char.chars == chars and char.n_vocab == len(chars) and repr(char) == f"CharTokenizer(n_vocab={len(chars)})"
    assert char.encode(text) == [stoi[c] for c in text] and char.decode([stoi[c] for c in text]) == text
    assert tokenizer_module.CharTokenizer.from_text(["ba", "c", ""]).chars == ["a", "b", "c"]
    assert char.eot_token is None and char.special_tokens == {}
    assert char.encode_batch(["Fir", "", "🎉"]) == [[stoi["F"], stoi["i"], stoi["r"]], [], [stoi["🎉"]]]
    assert char.decode_bytes(char.encode("✓🎉")) == "✓🎉".encode()


def test_char_tokenizer_streams_through_the_incremental_decoder():
    char = tokenizer_module.CharTokenizer(["a", "é", "🎉"])
    decoder = IncrementalDecoder(char)
    assert [decoder.add([i]) for i in [2, 0, 1]] == ["🎉", "a", "é"] and decoder.flush() == ""


@pytest.mark.parametrize("chars, message", [
    (["a", "bc"], "a character vocabulary holds single characters; entry 1 is 'bc'"),
    (["a", 7], "entry 1 is 7"),
    (["a", "b", "a"], "lists each character once; some are repeated"),
    ([], "needs at least one character"),
])  # fmt: skip
def test_char_tokenizer_rejects_bad_vocabularies(chars, message):
    with pytest.raises(VocabularyError, match=re.escape(message)):
        tokenizer_module.CharTokenizer(chars)


def test_char_tokenizer_rejects_unknown_characters_and_ids():
    char = tokenizer_module.CharTokenizer(list("abc"))
    with pytest.raises(TokenIdError, match=re.escape("character 'z' at position 2 is not in this 3-character vocabulary")):
        char.encode("abzc")
    with pytest.raises(InputTypeError, match="encode\\(\\) takes a str, got bytes"):
        char.encode(b"abc")
    with pytest.raises(InputTypeError, match="encode_batch\\(\\) takes a list of texts"):
        char.encode_batch("abc")
    for ids, message in [([0, 3], "token id 3 at position 1 is out of range: ids are 0..2"),
                         ([-1], "token id -1 at position 0 is out of range"),
                         ([0, 1.5], "token ids must be integers; got 1.5 at position 1"),
                         ([True], "got True at position 0")]:  # fmt: skip
        with pytest.raises(TokenIdError, match=re.escape(message)):
            char.decode(ids)


def test_gpt2_tokenizer_id_errors_name_the_position(enc):
    with pytest.raises(TokenIdError, match=re.escape("token id 50257 at position 2 is out of range: ids are 0..50256")):
        enc.decode([1, 2, 50257])


def test_char_tokenizer_saves_pickles_and_loads(tmp_path):
    import pickle

    char = tokenizer_module.CharTokenizer(list("zé a\n"))  # not sorted: ids are the order given
    char.save(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "chars.json").read_text(encoding="utf-8")) == {"chars": list("zé a\n")}
    loaded = tokenizer_module.load_tokenizer(tmp_path / "new")
    assert type(loaded) is type(char) and loaded.__getstate__() == char.__getstate__() == {"chars": list("zé a\n")}
    assert loaded.encode("a z") == [3, 2, 0]
    assert pickle.loads(pickle.dumps(char)).encode("a z") == [3, 2, 0]
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["chars.json"]  # no temporary file left


def test_load_tokenizer_reads_openai_and_hugging_face_names(tmp_path, tiktoken_gpt2):
    import shutil

    text = "Hello world, <|endoftext|> it's 2024 ✓"
    for encoder, merges in [("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")]:
        (tmp_path / encoder).mkdir()
        shutil.copy(VOCAB / "encoder.json", tmp_path / encoder / encoder)
        shutil.copy(VOCAB / "vocab.bpe", tmp_path / encoder / merges)
        loaded = tokenizer_module.load_tokenizer(tmp_path / encoder)
        assert isinstance(loaded, Tokenizer) and loaded.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    (tmp_path / "nothing").mkdir()
    assert tokenizer_module.load_tokenizer(tmp_path / "nothing") is None
    assert tokenizer_module.load_tokenizer(tmp_path / "nowhere") is None


def test_load_tokenizer_of_one_kind_passes_over_the_other(tmp_path):
    Tokenizer.gpt2().save(tmp_path)
    tokenizer_module.CharTokenizer(list("ab")).save(tmp_path)
    assert isinstance(tokenizer_module.load_tokenizer(tmp_path), Tokenizer)  # the pairs come first
    assert isinstance(tokenizer_module.load_tokenizer(tmp_path, "bpe"), Tokenizer)
    assert tokenizer_module.load_tokenizer(tmp_path, "char").chars == ["a", "b"]
    (tmp_path / "chars.json").unlink()
    assert tokenizer_module.load_tokenizer(tmp_path, "char") is None


def test_load_tokenizer_names_a_corrupt_or_missing_file(tmp_path):
    cases = {
        "chars1": ("not json", r"chars1/chars\.json"),
        "chars2": ('{"chars": "abc"}', r"chars\.json must hold a list of characters"),
        "chars3": ('{"chars": ["a", "a"]}', r"chars\.json: a character vocabulary lists each character once"),
        "chars4": ('["a"]', r"chars\.json"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "chars.json").write_text(content, encoding="utf-8")
        with pytest.raises(VocabularyError, match=message):
            tokenizer_module.load_tokenizer(tmp_path / name)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "vocab.json").write_text("{}", encoding="utf-8")
    with pytest.raises(VocabularyNotFoundError, match=r"vocabulary file not found: .*half/merges\.txt"):
        tokenizer_module.load_tokenizer(tmp_path / "half")


def test_char_tokenizer_from_file_and_type_errors(tmp_path):
    tokenizer_module.CharTokenizer(list("ab\n")).save(tmp_path)
    assert tokenizer_module.CharTokenizer.from_file(tmp_path / "chars.json").encode("b\na") == [1, 2, 0]
    with pytest.raises(VocabularyNotFoundError, match=r"vocabulary file not found: .*nowhere\.json"):
        tokenizer_module.CharTokenizer.from_file(tmp_path / "nowhere.json")
    with pytest.raises(InputTypeError, match=re.escape("from_text() takes a str or str texts, got bytes at index 1")):
        tokenizer_module.CharTokenizer.from_text(["ab", b"cd"])
    with pytest.raises(InputTypeError, match=re.escape("encode_batch() takes str texts, got int at index 2")):
        tokenizer_module.CharTokenizer(list("ab")).encode_batch(["a", "b", 3])
    with pytest.raises(InputTypeError, match=re.escape("encode_batch() takes a list of texts, got one bytes")):
        tokenizer_module.CharTokenizer(list("ab")).encode_batch(b"ab")


# ------------------------------------------------------------------ transformers' files

# Text that a decoder's "clean-up of tokenization spaces" would change (" ," -> ","), more whitespace, and not ASCII.
SPACED = "Hello , world !\nIt 's  don 't ? I 'm ; you 've .\r\n\t(x) [y] {z} -- 'quoted' \"too\"\n\n  café ✓ 😀 end "


def hf_tokenizer(directory):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # not the note that the corpus is longer than model_max_length
    return AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("kind", ["gpt2", "bpe"])
def test_transformers_reads_the_saved_vocabulary_and_encodes_as_ours(kind, enc, corpus_text, tmp_path):
    ours = enc if kind == "gpt2" else Tokenizer.train(corpus_text[:100_000], 1000)
    ours.save_pretrained(tmp_path, model_max_length=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    theirs = hf_tokenizer(tmp_path)
    assert len(theirs) == ours.n_vocab and theirs.model_max_length == 64
    assert theirs.eos_token == theirs.bos_token == "<|endoftext|>" and theirs.eos_token_id == ours.eot_token
    for text in (corpus_text, SPACED):
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
    every_id = [[i] for i in range(ours.n_vocab)]  # single tokens: partial UTF-8 characters decode as U+FFFD alike
    assert theirs.batch_decode(every_id) == [ours.decode(ids) for ids in every_id]
    # as in transformers' own GPT-2 files, text spelling <|endoftext|> is that token there
    assert theirs("a<|endoftext|>b")["input_ids"] == ours.encode("a<|endoftext|>b", allowed_special="all")
    # without tokenizer.json, transformers builds the same from vocab.json + merges.txt; and we read those back
    (tmp_path / "tokenizer.json").unlink()
    assert hf_tokenizer(tmp_path)(corpus_text[:50_000])["input_ids"] == ours.encode(corpus_text[:50_000])
    assert tokenizer_module.same_vocabulary(tokenizer_module.load_tokenizer(tmp_path), ours)


def test_transformers_reads_the_saved_character_vocabulary_and_encodes_as_ours(corpus_text, tmp_path):
    ours = tokenizer_module.CharTokenizer.from_text([corpus_text, SPACED])
    ours.save_pretrained(tmp_path, model_max_length=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chars.json", "tokenizer.json", "tokenizer_config.json"]
    theirs = hf_tokenizer(tmp_path)
    assert len(theirs) == ours.n_vocab and theirs.model_max_length == 64
    assert theirs.all_special_tokens == [] and theirs.eos_token_id is None
    for text in (corpus_text, SPACED):
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
    assert theirs.batch_decode([[i] for i in range(ours.n_vocab)]) == ours.chars
    unknown = next(chr(c) for c in range(0x4E00, 0x9FFF) if chr(c) not in ours.chars)
    with pytest.raises(Exception, match=r"Missing \[UNK\] token"):  # refused, as ours refuses, never some id
        theirs("a" + unknown)
    assert tokenizer_module.same_vocabulary(tokenizer_module.load_tokenizer(tmp_path), ours)


def test_save_pretrained_removes_another_tokenizers_files(enc, tmp_path):
    enc.save(tmp_path)  # encoder.json + vocab.bpe, which load_tokenizer would read first
    (tmp_path / "special_tokens_map.json").write_text('{"unk_token": "a"}')  # transformers would read this
    chars = tokenizer_module.CharTokenizer(list("ab\n"))
    chars.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chars.json", "tokenizer.json", "tokenizer_config.json"]
    assert tokenizer_module.same_vocabulary(tokenizer_module.load_tokenizer(tmp_path), chars)
    enc.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert tokenizer_module.load_tokenizer(tmp_path).encode("Hello world") == [15496, 995]


def test_token_text_is_the_text_or_the_bytes_of_part_of_a_character_as_openais_logprobs(enc, tiktoken_gpt2):
    ids = enc.encode("Hello 🤗 中文")
    for i in ids:
        raw = tiktoken_gpt2.decode_single_token_bytes(i)
        try:
            expected = raw.decode("utf-8")
        except UnicodeDecodeError:
            expected = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        assert tokenizer_module.token_text(enc, i) == expected
    assert any(tokenizer_module.token_text(enc, i).startswith("bytes:\\x") for i in ids)

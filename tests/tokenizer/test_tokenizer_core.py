"""gpt2.tokenizer.core, GPT-2's byte-level BPE, against tiktoken's GPT-2 encoding \
(an independent Rust implementation)."""

from __future__ import annotations

import random
import re
import unicodedata

import pytest
import regex
from helpers import VOCAB, stdlib_sources, tiktoken_from_files
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2.tokenizer.core as tokenizer_core
from gpt2 import (
    DisallowedSpecialTokenError,
    GPT2Error,
    IncrementalDecoder,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    Tokenizer,
)
from gpt2.tokenizer import token_text


@pytest.fixture(scope="module")
def enc() -> Tokenizer:
    return Tokenizer.gpt2()


# ------------------------------------------------------------------ the vocabulary


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
    expected = [
        15496,
        3228,
        314,
        1101,
        10948,
        73,
        509,
        5117,
        10036,
        13,
        632,
        338,
        33160,
        13,
        266,
        405,
        83,
        1058,
        35,
        12520,
        97,
        245,
    ]
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
    ids = enc.encode(text, disallowed_special=())  # text that spells <|endoftext|> too, as plain text
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
    assert tokenizer_core._ASCII_PATTERN.findall(text) == tokenizer_core._UNICODE_PATTERN.findall(text)


# ------------------------------------------------------------------ special tokens


SPECIAL_TEXTS = [
    "Hello world",
    "a<|endoftext|>b <|endoftext|>",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>x",
    "<|endoftext",
]
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
            with pytest.raises(
                GPT2Error, match="^Encountered text corresponding to disallowed special token '<|endoftext|>'"
            ):
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
    with pytest.raises(
        InvalidArgumentError, match=re.escape("disallowed_special: unknown special token(s) ['<|fim|>']")
    ):
        enc.encode("x", disallowed_special={"<|fim|>"})
    with pytest.raises(InvalidArgumentError, match="disallowed_special must be a set of special tokens or 'all'"):
        enc.encode_batch(["x"], disallowed_special="<|endoftext|>")


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


@pytest.mark.parametrize(
    "ids, message",
    [
        (None, "decode() takes a list of token ids (ints), or a 1-D tensor or array of them, got NoneType"),
        (15496, "decode() takes a sequence of token ids, got one int: use decode([15496])"),
        ("Hello", "decode() takes token ids, not str: to get ids from text, use encode()"),
        (b"Hello", "decode() takes token ids, not bytes"),
        (
            "torch-2d",
            "decode() takes one sequence of ids (1-D), got 2-D ids of shape [1, 2]: pick one row, e.g. decode(ids[0])",
        ),
        ("numpy-2d", "got 2-D ids of shape [2, 1]: pick one row"),
        ("torch-0d", "got 0-D ids of shape []: wrap one id in a list, decode([id])"),
    ],
)
def test_decode_says_what_to_pass(enc, ids, message):
    import numpy as np
    import torch

    ids = {
        "torch-2d": torch.tensor([[15496, 995]]),
        "numpy-2d": np.array([[15496], [995]]),
        "torch-0d": torch.tensor(15496),
    }.get(ids, ids)
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


# ------------------------------------------------------------------ batches, pickling and the cache


def test_encode_batch_matches_encode(enc):
    texts = ["Hello world", "", "🤗 emoji", "a<|endoftext|>b"] * 3
    assert enc.encode_batch(texts, disallowed_special=()) == [enc.encode_ordinary(t) for t in texts]
    assert enc.encode_batch(texts, allowed_special="all")[3] == enc.encode(texts[3], allowed_special="all")


def test_pickled_tokenizer_encodes_the_same(enc):
    import pickle

    clone = pickle.loads(pickle.dumps(enc))
    assert clone.encode("pickled 🤗 text") == enc.encode("pickled 🤗 text")


def test_piece_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(tokenizer_core, "_CACHE_MAX_ENTRIES", 50)
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
    with pytest.raises(
        InputTypeError,
        match=re.escape("encode_batch() takes a list of texts, got one str: for one text, use encode(text)"),
    ):
        enc.encode_batch("Hello world")  # not 11 one-character texts
    with pytest.raises(InputTypeError, match="got one bytes"):
        enc.encode_batch(b"Hello")
    with pytest.raises(InvalidArgumentError, match="num_workers"):
        enc.encode_batch(["ok"], num_workers=0)


def test_gpt2_tokenizer_id_errors_name_the_position(enc):
    with pytest.raises(TokenIdError, match=re.escape("token id 50257 at position 2 is out of range: ids are 0..50256")):
        enc.decode([1, 2, 50257])


# ------------------------------------------------------------------ log-probabilities


def test_token_text_is_the_text_or_the_bytes_of_part_of_a_character_as_openais_logprobs(enc, tiktoken_gpt2):
    ids = enc.encode("Hello 🤗 中文")
    for i in ids:
        raw = tiktoken_gpt2.decode_single_token_bytes(i)
        try:
            expected = raw.decode("utf-8")
        except UnicodeDecodeError:
            expected = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        assert token_text(enc, i) == expected
    assert any(token_text(enc, i).startswith("bytes:\\x") for i in ids)

"""gpt2.tokenizer.native, the first pass in C, against tiktoken's GPT-2 encoding (an independent Rust
implementation) and against core's Python (`_pretokenize`, `_bpe`), the reference it replaces."""

from __future__ import annotations

import pickle
import random
from itertools import chain

import pytest
from helpers import stdlib_sources, tiktoken_from_files
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2.tokenizer.core as tokenizer_core
import gpt2.tokenizer.pool as tokenizer_pool
from gpt2 import Tokenizer
from gpt2.tokenizer import native


def fresh_gpt2() -> Tokenizer:
    """GPT-2's vocabulary in a tokenizer of its own: an empty cache, its kernel not yet made."""
    shared = Tokenizer.gpt2()
    return Tokenizer(shared._encoder, shared._merges, shared._special_tokens)


def kernel(tokenizer: Tokenizer):
    merger = tokenizer._load_native()
    assert merger is not None, f"the tokenizer kernel is unavailable: {native.failure()}"
    return merger


def encode(merger, text: str, cache: dict | None = None) -> list[int]:
    """The kernel's encode with the piece cache's bounds, as core calls it."""
    bounds = tokenizer_core._CACHE_MAX_PIECE_CHARS, tokenizer_core._CACHE_MAX_ENTRIES
    return merger.encode(text, {} if cache is None else cache, *bounds)


def python_ids(tokenizer: Tokenizer, text: str, merged: dict | None = None) -> list[int]:
    """core's Python reference: its pre-tokenizer, then `_bpe` on each distinct piece (into `merged`)."""
    pieces = tokenizer_core._pretokenize(text)
    merged = {} if merged is None else merged
    merged.update((piece, tokenizer._bpe(piece)) for piece in set(pieces) - merged.keys())
    return list(chain.from_iterable(map(merged.__getitem__, pieces)))


@pytest.fixture(scope="module")
def enc() -> Tokenizer:
    return fresh_gpt2()


@pytest.fixture(scope="module")
def merger(enc):
    return kernel(enc)


def assert_exact(enc: Tokenizer, merger, text: str, reference=None) -> None:
    """The kernel's pieces are the pattern's, its ids the Python reference's (and tiktoken's, if given),
    each distinct piece's merges `_bpe`'s, with an empty cache and with a warm one."""
    assert merger.pieces(text) == tokenizer_core._pretokenize(text)
    merged: dict = {}
    expected = python_ids(enc, text, merged)
    if reference is not None:
        assert expected == reference.encode_ordinary(text)
    cache: dict = {}
    assert encode(merger, text, cache) == expected
    assert encode(merger, text, cache) == expected  # warm: every short piece from the cache
    assert all(len(piece) <= tokenizer_core._CACHE_MAX_PIECE_CHARS for piece in cache)
    for piece, ids in merged.items():
        assert merger.bpe(tokenizer_core._utf8(piece)) == ids, ascii(piece)


# ------------------------------------------------------------------ corpora


def test_tinyshakespeare(enc, merger, tiktoken_gpt2, corpus_text):
    assert_exact(enc, merger, corpus_text, tiktoken_gpt2)
    fresh = fresh_gpt2()
    assert fresh.encode(corpus_text) == tiktoken_gpt2.encode_ordinary(corpus_text)  # through encode itself
    assert fresh._native is not None and len(fresh._cache) > 10_000  # filled by the kernel


def test_source_code(enc, merger, tiktoken_gpt2):
    text = "\n".join(path.read_text(encoding="utf-8") for path in stdlib_sources(40))[:400_000]
    assert_exact(enc, merger, text, tiktoken_gpt2)


# Text in many scripts, and what is rare in a corpus: Unicode white space and digits, combining
# marks, emoji sequences, contractions' corner cases, runs with no merge, pieces over the cache's cap.
SCRIPTS = [
    "Ünïcödé façade naïve — “quotes” ‘single’ … 1½ ²³ €100 £5 ¥6",
    "Русский текст, ёжик; Ελληνικά κείμενα; Հայերեն; ქართული",
    "العربية ١٢٣٤٥ والأرقام؛ עברית עם ניקוד: שָׁלוֹם; فارسی ۱۲۳",
    "हिन्दी पाठ १२३; বাংলা লেখা; தமிழ் உரை; ไทยภาษาไทย; ລາວ; ខ្មែរ; မြန်မာ",
    "中文文本，日本語のテキスト、한국어 텍스트。１２３ＡＢＣ 〇一二三 ㊀㊁",
    "emoji 🤗🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈",
    "spaces:\u00a0\u2000\u2001\u3000\u2028\u2029\u0085\u1680\u202f\u205f end \t\n\x0b\x0c\r \x1c\x1d\x1e\x1f",
    "e\u0301 a\u0308\u0323 z\u0336\u0336 \u200b\u200c\u200d\ufeff \ufffd \x00\x01\x7f",
    "I'm you're they've we'll she'd it's don't 'S 'T ''s '''ll x'sy  's \t're \n've",
    "x" * 150 + " " + "9" * 300 + " " + "!" * 250 + " " * 400 + "a\n" + "\n" * 300 + "é" * 120,
    "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(600)),  # CJK: few merges, one long piece
    "\x01\x02\x03\x04" * 200 + " " + "\U0001f600\U0001f680" * 100,  # bytes that never merge
]


def test_many_scripts(enc, merger, tiktoken_gpt2):
    for text in SCRIPTS:
        assert_exact(enc, merger, text, tiktoken_gpt2)
    assert_exact(enc, merger, "\n".join(SCRIPTS), tiktoken_gpt2)


def test_lone_surrogates_as_core_encodes_them(enc, merger, tiktoken_gpt2):
    for text in ["\ud800", "a\udfffb", "x \ud83d y", "\ud83d\ude00 pair", "é\udc80é" * 60, "\ud800" * 150]:
        assert_exact(enc, merger, text)
    for text in ["\ud800", "a\udfffb", "x \ud83d y"]:  # lone ones: tiktoken's U+FFFD too
        assert encode(merger, text) == tiktoken_gpt2.encode_ordinary(text)


def test_the_cache_is_bounded_as_the_piece_cache(enc, merger):
    """Emptied when full, as _PieceCache is, and still exact."""
    cache: dict = {}
    text = " ".join(f"w{i}x" for i in range(40)) + " " + "y" * 12
    assert merger.encode(text, cache, 10, 5) == python_ids(enc, text)
    assert 0 < len(cache) <= 5 and "y" * 12 not in cache


# ------------------------------------------------------------------ random text


SOUP = list(" \t\n\r\x0b\x0c\x85\xa0\u2028\u3000'sdmtlvreAZaz09.,!?-é🤗中١")


@settings(max_examples=200, deadline=None)
@given(text=st.text() | st.text(alphabet=st.sampled_from(SOUP), max_size=60))
def test_random_text_matches_tiktoken(enc, merger, tiktoken_gpt2, text):
    assert merger.pieces(text) == tokenizer_core._pretokenize(text)
    assert encode(merger, text) == tiktoken_gpt2.encode_ordinary(text) == python_ids(enc, text)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=()), max_size=40))
def test_random_text_with_surrogates_matches_python(enc, merger, text):
    assert merger.pieces(text) == tokenizer_core._pretokenize(text)
    assert encode(merger, text) == python_ids(enc, text)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("abehinorst")), min_size=65, max_size=400))
def test_random_long_pieces_merge_as_python(enc, merger, text):
    """Pieces past 64 bytes take the kernel's heap, not its rescans: `_bpe`'s rule there too."""
    assert merger.bpe(text.encode()) == enc._bpe(text)


def test_character_classes_are_the_patterns():
    """The table the scanner reads agrees with the pattern's own classes, code point by code point
    (all of the first 0x3000, then every 11th)."""
    import regex

    letter, number, space = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    classes = native.character_classes()
    for cp in [*range(0x3000), *range(0x3000, 0x110000, 11)]:
        ch = chr(cp)
        expected = 1 if letter.match(ch) else 2 if number.match(ch) else 3 if space.match(ch) else 0
        assert classes[cp] == expected, hex(cp)


# ------------------------------------------------------------------ other vocabularies


def test_a_trained_tokenizer(tmp_path, corpus_text):
    text = corpus_text[:60_000] + "\n".join(SCRIPTS)
    trained = Tokenizer.train(text, vocab_size=500)
    trained.save(tmp_path / "tok")
    reference = tiktoken_from_files(tmp_path / "tok" / "encoder.json", tmp_path / "tok" / "vocab.bpe", eot=499)
    assert_exact(trained, kernel(trained), text, reference)
    assert trained.encode(text) == reference.encode_ordinary(text)


def test_odd_vocabulary_byte_order_and_repeated_merge():
    """Byte tokens at shuffled ids, and a merge listed twice (the first rank counts, as in `_bpe`)."""
    order = list(range(256))
    random.Random(0).shuffle(order)
    encoder = {bytes([b]): i for i, b in enumerate(order)}
    merges = [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"c", b"a"), (b"b", b"c"), (b"a", b"bc"), (b" ", b"a")]
    for a, b in merges:
        encoder.setdefault(a + b, len(encoder))
    tokenizer = Tokenizer(encoder, merges, {"<|endoftext|>": len(encoder)})
    merger = kernel(tokenizer)
    rng = random.Random(1)
    for _ in range(300):
        text = "".join(rng.choices("abc a", k=rng.randint(1, 90)))
        assert encode(merger, text) == python_ids(tokenizer, text), text


# ------------------------------------------------------------------ without the kernel, across processes


@pytest.fixture
def unloaded(monkeypatch, tmp_path):
    """native's module forgotten (restored after), gpt2's caches in tmp_path: the next use loads afresh."""
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setenv("GPT2_CACHE", str(tmp_path / "gpt2-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "default"))
    return monkeypatch


@pytest.mark.parametrize("how", ["turned off", "no compiler"])
def test_the_python_fallback_gives_the_same_ids(unloaded, tiktoken_gpt2, how):
    if how == "turned off":
        unloaded.setenv("GPT2_BPE_KERNEL", "0")
    else:
        unloaded.setenv("CC", "/nonexistent/cc")
    tokenizer = fresh_gpt2()
    text = "\n".join(SCRIPTS) + " Hello world, it's 2026."
    assert tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text)
    assert tokenizer._native is None and native.extension() is None
    assert ("GPT2_BPE_KERNEL" if how == "turned off" else "/nonexistent/cc") in native.failure()
    assert native._built() is None


def test_built_once_then_loaded(unloaded, capsys, tmp_path, tiktoken_gpt2):
    """`python -m gpt2.tokenizer.native` compiles into gpt2's cache, and a later process loads it,
    also one pointed at a cache of its own (GPT2_CACHE), as the docs' tests point theirs."""
    unloaded.delenv("GPT2_CACHE")
    assert native.main() == 0
    assert "tokenizer kernel: compiled in" in capsys.readouterr().out
    built = native._built()
    assert built is not None and built.is_relative_to(tmp_path / "default")
    unloaded.setattr(native, "_module", None)
    unloaded.setenv("GPT2_CACHE", str(tmp_path / "gpt2-cache"))
    assert native.main() == 0
    assert f"tokenizer kernel: ready ({tmp_path / 'default'}" in capsys.readouterr().out
    tokenizer = fresh_gpt2()
    assert tokenizer.encode("Hello world 🤗") == tiktoken_gpt2.encode_ordinary("Hello world 🤗")
    assert tokenizer._native is not None


def test_pickled_and_worker_processes(enc, merger, tiktoken_gpt2, corpus_text, monkeypatch):
    copy = pickle.loads(pickle.dumps(enc))
    assert copy._native is tokenizer_core._NOT_LOADED  # tables are made again, never pickled
    assert copy.encode("Hello 🤗 world") == tiktoken_gpt2.encode_ordinary("Hello 🤗 world")
    assert copy._native is not None and copy._native is not merger
    monkeypatch.setattr(tokenizer_pool, "_PARALLEL_MIN_CHARS", 0)
    texts = corpus_text[:100_000].split("\n\n") + SCRIPTS
    tokenizer = fresh_gpt2()
    tokenizer.encode("warm")  # the kernel made before the fork: the workers inherit it
    try:
        assert tokenizer.encode_batch(texts, num_workers=2) == tiktoken_gpt2.encode_ordinary_batch(texts)
    finally:
        tokenizer.close()

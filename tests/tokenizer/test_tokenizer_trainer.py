"""BPE training (gpt2.tokenizer.trainer, through Tokenizer.train) against textbook BPE and tiktoken."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
from helpers import tiktoken_from_files

import gpt2.tokenizer.core as tokenizer_core
from gpt2 import GPT2Warning, InputTypeError, InvalidArgumentError, Tokenizer


def naive_train(text: str, n_merges: int) -> list[tuple[bytes, bytes]]:
    """Textbook BPE training: recount every pair from scratch before each merge."""
    words = Counter(tokenizer_core._UNICODE_PATTERN.findall(text))
    symbols = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    merges = []
    for _ in range(n_merges):
        counts: Counter = Counter()
        for w, parts in symbols.items():
            for pair in zip(parts, parts[1:]):
                counts[pair] += words[w]
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        for w, parts in symbols.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            symbols[w] = out
    return merges


def test_training_equals_textbook_bpe(corpus_text):
    text = corpus_text[:20_000]
    trained = Tokenizer.train(text, vocab_size=257 + 150)
    assert trained._merges == naive_train(text, 150)


def test_trained_vocabulary_round_trips_and_loads_in_tiktoken(tmp_path, corpus_text):
    text = corpus_text[:200_000]
    trained = Tokenizer.train(text, vocab_size=1000)
    assert trained.n_vocab == 1000 and trained.eot_token == 999
    ids = trained.encode(text)
    assert trained.decode(ids) == text
    assert len(ids) < len(text.encode("utf-8")) / 2  # it learned to compress
    trained.save(tmp_path / "tok")
    loaded = Tokenizer.from_files(tmp_path / "tok" / "encoder.json", tmp_path / "tok" / "vocab.bpe")
    assert loaded.encode(text) == ids
    # tiktoken checks the saved files follow GPT-2's layout, then encodes independently.
    reference = tiktoken_from_files(tmp_path / "tok" / "encoder.json", tmp_path / "tok" / "vocab.bpe", eot=999)
    sample = text[:50_000] + " unseen wörds 🤗"
    assert trained.encode(sample) == reference.encode_ordinary(sample)


def test_training_is_deterministic_and_accepts_iterables(corpus_text):
    texts = corpus_text[:30_000].split("\n")
    a = Tokenizer.train(texts, vocab_size=400)
    b = Tokenizer.train(iter(texts), vocab_size=400)
    assert a._merges == b._merges


def test_training_on_a_tiny_corpus_warns_and_stops():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = Tokenizer.train("abab abab", vocab_size=1000)
    assert [w.category for w in caught if "ran out of pairs" in str(w.message)] == [
        GPT2Warning
    ]  # gpt2's own: filterable as one
    assert trained.n_vocab < 1000
    assert trained.decode(trained.encode("abab abba")) == "abab abba"


@pytest.mark.parametrize("vocab_size", [0, 100, 255, 256])
def test_training_rejects_small_vocab_size(vocab_size):
    with pytest.raises(InvalidArgumentError, match=f"at least 257.*got {vocab_size}"):
        Tokenizer.train("some text", vocab_size=vocab_size)


def test_training_rejects_bad_corpus_and_types():
    with pytest.raises(InvalidArgumentError, match="empty corpus"):
        Tokenizer.train("", vocab_size=300)
    with pytest.raises(InvalidArgumentError, match="empty corpus"):
        Tokenizer.train([], vocab_size=300)
    with pytest.raises(InputTypeError, match="vocab_size must be an integer"):
        Tokenizer.train("text", vocab_size="300")
    with pytest.raises(InputTypeError, match="bytes at index 1"):
        Tokenizer.train(["ok", b"bytes"], vocab_size=300)

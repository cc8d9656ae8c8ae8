"""gpt2.tokenizer.pool, encode_batch's worker processes, against tiktoken's GPT-2 encoding."""

from __future__ import annotations

import pytest
from helpers import VOCAB

import gpt2.tokenizer.pool as tokenizer_pool
from gpt2 import DisallowedSpecialTokenError, Tokenizer


@pytest.fixture(scope="module")
def enc() -> Tokenizer:
    return Tokenizer.gpt2()


def test_encode_batch_in_worker_processes(enc, tiktoken_gpt2, corpus_text, monkeypatch):
    monkeypatch.setattr(tokenizer_pool, "_PARALLEL_MIN_CHARS", 0)
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
    shares = tokenizer_pool._split_by_length(texts, 3)
    assert [t for share in shares for t in share] == texts
    sizes = [sum(map(len, share)) for share in shares]
    assert max(sizes) - min(sizes) <= 2 * max(map(len, texts))

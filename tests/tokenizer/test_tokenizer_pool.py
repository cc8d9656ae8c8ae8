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


def test_encode_stream_hands_back_each_share_in_order(enc, tiktoken_gpt2, corpus_text):
    texts = corpus_text[:200_000].split("\n\n")
    shares = [(f"share {i}", texts[i : i + 40]) for i in range(0, len(texts), 40)]  # more than are ever in flight
    expected = [tiktoken_gpt2.encode_ordinary_batch(items) for _, items in shares]
    for workers in (1, 3):
        got = list(tokenizer_pool.encode_stream(enc.encode_ordinary, iter(shares), workers))
        assert len(shares) > 3 * tokenizer_pool.SHARES_PER_WORKER
        assert [key for key, _, _ in got] == [key for key, _ in shares]
        for (_, lengths, flat), ids in zip(got, expected):
            assert lengths.tolist() == list(map(len, ids)) and flat.tolist() == [i for each in ids for i in each]


def test_a_stream_left_half_way_stops_its_workers(enc, corpus_text):
    import multiprocessing

    before = set(multiprocessing.active_children())
    shares = ((i, [corpus_text[i * 1000 : (i + 1) * 1000]]) for i in range(200))
    stream = tokenizer_pool.encode_stream(enc.encode_ordinary, shares, 2)
    assert next(stream)[0] == 0
    started = set(multiprocessing.active_children()) - before
    assert len(started) == 2
    stream.close()  # as when writing the ids fails: the generator's finally shuts the workers down
    assert not started & set(multiprocessing.active_children())
    assert all(p.exitcode is not None for p in started)

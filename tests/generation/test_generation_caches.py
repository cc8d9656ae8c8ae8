"""What an engine keeps (gpt2.generation.caches): the KV cache, the same logits as recomputing, allocated once and
refused when it cannot fit; the prefix cache, its blocks found, evicted and reused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from gpt2 import MemoryLimitError, devices
from gpt2.checkpoints.config import GPT2Config
from gpt2.generation.caches import Block, PrefixCache
from gpt2.generation.engines import TorchEngine
from gpt2.model.model import GPT2

# ------------------------------------------------------------------ the KV cache


def test_cache_gives_the_same_logits_and_tokens_as_recomputing(small):
    model = small
    prompts = [[464, 3290, 373], [15496, 11, 995]]
    cached, fresh = TorchEngine(model, 2, 23), TorchEngine(model, 2, 23, use_cache=False)
    with torch.inference_mode():
        a = torch.stack([cached.prefill(b, p) for b, p in enumerate(prompts)])
        b = torch.stack([fresh.prefill(b, p) for b, p in enumerate(prompts)])
        for _ in range(20):
            assert (a - b).abs().max() < 1e-4
            token = a.argmax(-1)
            assert torch.equal(token, b.argmax(-1))
            a, b = cached.decode(token), fresh.decode(token)
    idx = torch.tensor(prompts)
    assert torch.equal(model.generate(idx, 30, temperature=0), model.generate(idx, 30, temperature=0, use_cache=False))


def test_cache_is_preallocated_once(small):
    model = small
    engine = TorchEngine(model, 1, 13)
    with torch.inference_mode():
        engine.prefill(0, [1, 2, 3])
        first = engine.cache.k[0].data_ptr()
        for t in range(9):
            engine.decode(torch.tensor([t]))
    assert engine.cache.k[0].data_ptr() == first and engine.cache.k[0].shape[2] == 13 and engine.cache.lengths[0] == 12


def test_generate_refuses_rows_whose_kv_cache_cannot_fit(monkeypatch):
    model = GPT2(GPT2Config(n_vocab=100, n_ctx=32, n_embd=16, n_head=2, n_layer=1)).eval()
    monkeypatch.setattr(devices, "available_memory", lambda device: 100_000)
    needed = 64 * (
        2 * 1 * 12 * 16 * 4 + 3 * 100 * 4
    )  # 64 rows of 2 + 10 positions: keys and values, and a step's logits
    with pytest.raises(
        MemoryLimitError,
        match=f"a KV cache of 64 rows of 12 positions needs about {needed / 1e3:.0f} kB of "
        f"memory, but the CPU has 100 kB available: fewer rows in idx at once",
    ):
        model.generate(torch.zeros(64, 2, dtype=torch.long), 10)
    model.generate(torch.zeros(8, 2, dtype=torch.long), 10)  # 8 rows fit


# ------------------------------------------------------------------ the prefix cache


def kv_block(value: float) -> Callable[[Block], None]:
    """Fill a block (of 4 positions of a model of 2 layers, 1 head of 2 channels) with `value`."""

    def write(block: Block) -> None:
        assert block.k.shape == block.v.shape == (2, 1, 4, 2) and block.hidden.shape == (4, 2)
        for tensor in (block.k, block.v, block.hidden):
            tensor.fill_(value)

    return write


def test_the_prefix_cache_finds_blocks_by_every_token_before_them_and_evicts_the_least_recently_used():
    config = GPT2Config(n_vocab=10, n_ctx=32, n_embd=2, n_head=1, n_layer=2)
    per_block = 4 * 2 * (2 * 2 + 1) * 4  # 4 positions x 2 channels x (keys and values of 2 layers, hidden) x 4 bytes
    cache = PrefixCache(config, max_bytes=3 * per_block, block_size=4)
    assert cache.block_bytes == per_block
    reads = []
    cache.add([1, 2, 3, 4, 5, 6, 7, 8, 9], lambda i, j, block: reads.append((i, j)) or kv_block(i)(block))
    assert reads == [(0, 4), (4, 8)]  # whole blocks only
    assert [b.k[0, 0, 0, 0].item() for b in cache.match([1, 2, 3, 4, 5, 6, 7, 8, 0])] == [0, 4]
    assert len(cache.match([1, 2, 3, 4, 5, 6, 7, 8])) == 1  # the last token is always computed: its logits are needed
    assert cache.match([9, 2, 3, 4, 5, 6, 7, 8, 0]) == []  # a different first block: its second is not the same block
    assert (cache.queries, cache.hits) == (9 + 8 + 9, 8 + 4)
    cache.add([1, 2, 3, 4, 0, 0, 0, 0], lambda i, j, block: reads.append((i, j)) or kv_block(-i)(block))
    assert reads[2:] == [(4, 8)]  # the first block is kept already
    assert cache.bytes == 3 * per_block
    cache.add(
        [5, 5, 5, 5], lambda i, j, block: kv_block(99)(block)
    )  # over the bound: the least recently used leaf goes
    assert cache.bytes == 3 * per_block
    assert len(cache.match([1, 2, 3, 4, 5, 6, 7, 8, 0])) == 1 and len(cache.match([1, 2, 3, 4, 0, 0, 0, 0, 1])) == 2
    assert len(cache.match([5, 5, 5, 5, 1])) == 1
    for i in range(20):  # past the bound, each new block takes an evicted one's place: no memory more
        cache.add([i, i, i, i, 7], lambda i_, j, block, value=i: kv_block(value)(block))
    assert cache.bytes == cache.reserved_bytes == 3 * per_block
    assert [b.k.sum().item() for b in cache.match([19, 19, 19, 19, 0])] == [19 * 16]
    cache.add(list(range(20)), lambda i, j, block: kv_block(i)(block))  # 5 blocks: its first 3 kept
    assert [b.hidden[0, 0].item() for b in cache.match(list(range(21)))] == [0, 4, 8]
    tiny = PrefixCache(config, max_bytes=per_block - 1, block_size=4)
    tiny.add([1, 2, 3, 4], lambda i, j, block: kv_block(0)(block))
    assert tiny.bytes == tiny.reserved_bytes == 0  # not even one block fits: none kept


def test_a_prompt_that_reuses_kept_blocks_gets_the_logits_of_one_computed_whole(small_pair):
    """Two prompts share 24 tokens (a block of 16 is kept); the second's logits at every position,
    the kept ones from their hidden states, equal transformers' on the whole prompt within 1e-5."""
    hf, model = small_pair
    shared = torch.randint(0, 50257, (24,), generator=torch.Generator().manual_seed(7)).tolist()
    first, second = shared + [11, 12, 13], shared + [21, 22]
    cache = PrefixCache(model.config, 1 << 20, block_size=16)
    engine = TorchEngine(model, 2, prefix_cache=cache)
    with torch.inference_mode():
        engine.prefill(1, first)
        engine.remember(1, first)
        filled = engine.reuse(0, second)
        logits = torch.cat(
            [engine.cached_logits(0, filled), engine.extend([0], [filled], [second[filled:]], [True])[0]]
        )
        expected = hf(torch.tensor([second])).logits[0]  # (T, V)
    assert filled == 16 and (cache.queries, cache.hits) == (26, 16)
    assert (logits - expected).abs().max() < 1e-5

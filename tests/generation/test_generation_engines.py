"""Engines (gpt2.generation.engines): the KV cache and the torch engine over it, its steps replayed as
CUDA graphs, the NumPy engine, and the rules of which engine runs where."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import make_hf_model

from gpt2 import InvalidArgumentError, MemoryLimitError, Tokenizer, devices
from gpt2.checkpoints.config import GPT2Config
from gpt2.generation.caches import Block, PrefixCache
from gpt2.generation.decoding import Row, run
from gpt2.generation.engines import (
    TorchEngine,
    check_cuda_graphs,
    check_numpy_engine,
    cuda_graphs,
    kept_engine,
    set_cuda_graphs,
)
from gpt2.generation.generate import generate_text
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2
from gpt2.reference import ReferenceModel

ENC = Tokenizer.gpt2()
TINY = dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3)
SLIDING = dict(vocab_size=64, n_positions=40, n_embd=56, n_layer=5, n_head=7)  # 7 heads of 8 channels


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A small model with GPT-2's vocabulary, so text round-trips through the tokenizer:
    transformers' (the reference) and ours, loaded from it."""
    directory = tmp_path_factory.mktemp("small")
    hf = make_hf_model(vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3)
    hf.save_pretrained(directory)
    return hf, GPT2.from_pretrained(directory, device="cpu")


@pytest.fixture(scope="module")
def small(small_pair) -> GPT2:
    return small_pair[1]


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


# ------------------------------------------------------------------ CUDA graphs


def decode_rows(
    model: GPT2, prompts: list[list[int]], slots: int, max_len: int, graphs: bool, temperature: float = 1.0
):
    """Each prompt continued (by 6, 9, 12, ... tokens: rows end at different steps): each row's
    tokens and their log-probabilities, and the engine."""
    rows = [Row(p, 6 + 3 * i, Sampling(temperature), seed=i, logprobs=1) for i, p in enumerate(prompts)]
    engine = TorchEngine(model, slots, max_len, graphs=graphs)
    run(engine, rows)
    return [row.tokens for row in rows], [row.token_logprobs for row in rows], engine


@pytest.mark.parametrize("slots, buckets", [(3, {1, 2, 3}), (5, {1, 2, 4, 5})])  # 4 holds batches of 3, padded
def test_fixed_shape_steps_decode_as_plain_steps(slots, buckets, tmp_path):
    """The steps CUDA graphs replay (the whole cache attended, masked by each row's position;
    batches padded to a bucket), run here without capture: the same tokens and log-probabilities
    as plain decoding, with rows of different lengths joining and leaving and one context sliding."""
    make_hf_model(**SLIDING).save_pretrained(tmp_path)  # n_positions 40
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    prompts = [[1, 2, 3], [4] * 7, [5, 6], [7] * 30, [8], [9, 10, 11, 12]]  # 30 + 15 new tokens slide past 40
    plain, plain_logprobs, _ = decode_rows(model, prompts, slots, 40, graphs=False)
    fixed, fixed_logprobs, engine = decode_rows(model, prompts, slots, 40, graphs=True)
    assert fixed == plain  # sampled, so every logit counts
    assert np.allclose(sum(fixed_logprobs, []), sum(plain_logprobs, []), atol=1e-5)
    assert engine.graphs is not None and not engine.graphs.capture  # no capture off the GPU
    assert set(engine.graphs.steps) == buckets  # the batch shrank from `slots` to 1 as rows ended


def test_with_graphs_generate_keeps_one_engine_over_the_whole_context(tmp_path):
    """So that each batch-size bucket is captured once, not at every call; its tokens are plain
    decoding's. (Set as use_cuda_graphs sets it on a GPU; here the fixed steps run uncaptured.)"""
    make_hf_model(**SLIDING).save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    idx = torch.randint(0, 64, (3, 5))
    expected = [model.generate(idx[:b], 8, seed=1) for b in (2, 1, 3)]
    set_cuda_graphs(model)
    got, engines = [], []
    for b in (2, 1, 3):
        got.append(model.generate(idx[:b], 8, seed=1))
        engines.append(kept_engine(model))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert engines[0] is engines[1] and engines[0].slots == 2 and engines[2].slots == 3  # grown once, for 3 rows
    assert set(engines[0].graphs.steps) == {1, 2} and set(engines[2].graphs.steps) == {3} and engines[2].max_len == 40


def test_cuda_graphs_are_off_by_default_and_refused_off_the_gpu(tmp_path):
    make_hf_model(**TINY).save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu")
    assert cuda_graphs(model) is False
    with pytest.raises(InvalidArgumentError, match="cuda_graphs replays decoding on a CUDA GPU; device is cpu"):
        model.use_cuda_graphs()
    assert cuda_graphs(model.use_cuda_graphs(False)) is False


def test_a_model_that_decoded_with_graphs_is_freed_with_its_kept_engine():
    """The engine kept for a model's calls is held beside the model, not on it: a model no one
    holds any more is freed, with the engine (its cache and graphs), as an attribute's would be."""
    model = GPT2(GPT2Config(n_vocab=64, n_ctx=16, n_embd=16, n_head=2, n_layer=1)).eval()
    set_cuda_graphs(model)  # as use_cuda_graphs sets it on a GPU; here the fixed steps run uncaptured
    model.generate(torch.zeros(2, 3, dtype=torch.long), 4)
    freed_model, freed_engine = weakref.ref(model), weakref.ref(kept_engine(model))
    del model
    gc.collect()
    assert freed_model() is None and freed_engine() is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("slots", [1, 3, 8])
def test_cuda_graphs_decode_as_eager_and_transformers(slots, tmp_path):
    """Issue 12: greedy tokens replayed from CUDA graphs equal eager decoding's in float32, and
    transformers' (batch 1); bfloat16 graphs run and stay near."""
    hf = make_hf_model(n_positions=256)  # the 124M shape
    hf.save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cuda")
    model.set_attention("math")  # the same attention kernel with and without a mask
    prompts = [[(13 * i + j) % 50257 for j in range(5 + 7 * i)] for i in range(slots + 2)]
    eager, _, _ = decode_rows(model, prompts, slots, 256, graphs=False, temperature=0)
    graphed, _, engine = decode_rows(model, prompts, slots, 256, graphs=True, temperature=0)
    assert engine.graphs.capture and all(step.graph is not None for step in engine.graphs.steps.values())
    assert graphed == eager
    idx = torch.tensor([prompts[0]])
    expected = hf.generate(
        idx, max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=50256
    )
    assert graphed[0] == expected[0, idx.size(1) :].tolist()
    bf16 = GPT2.from_pretrained(tmp_path, device="cuda", dtype="bfloat16")
    low, _, _ = decode_rows(bf16, prompts, slots, 256, graphs=True, temperature=0)
    assert sum(a == b for x, y in zip(low, eager) for a, b in zip(x, y)) >= 0.5 * sum(map(len, eager))


# ------------------------------------------------------------------ the NumPy engine


def test_numpy_engine_generates_the_same_greedy_text(small_pair, tmp_path_factory):
    hf, ours = small_pair
    directory = tmp_path_factory.mktemp("np")
    ours.save_pretrained(directory)
    prompt = "The meaning of life is"
    idx = torch.tensor([ENC.encode(prompt)])
    with torch.no_grad():  # transformers' greedy text on the same weights
        out = hf.generate(
            idx, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=50256
        )
    expected = [ENC.decode(out[0, idx.size(1) :].tolist())]
    assert generate_text(ReferenceModel.load(directory), ENC, prompt, max_new_tokens=10, temperature=0) == expected


# ------------------------------------------------------------------ which engine runs where


def test_the_engine_rules_name_each_setting_as_the_caller_knows_it():
    """The library names its arguments; the command line passes its flags (tests/test_cli.py)."""
    with pytest.raises(InvalidArgumentError, match="^cuda_graphs is for engine torch on a CUDA GPU, not engine numpy$"):
        check_cuda_graphs("cpu", "numpy")
    with pytest.raises(InvalidArgumentError, match="^cuda_graphs replays decoding on a CUDA GPU; device cpu is cpu$"):
        check_cuda_graphs("cpu")
    flag = lambda setting: "--" + setting.replace("_", "-")  # noqa: E731
    with pytest.raises(
        InvalidArgumentError,
        match="^--engine numpy computes in float32 only, not --dtype bfloat16: use --engine torch$",
    ):
        check_numpy_engine("cpu", torch.bfloat16, flag)
    with pytest.raises(
        InvalidArgumentError, match="^engine numpy runs on the CPU only, not on device cuda: use engine torch$"
    ):
        check_numpy_engine("cuda", "float32")
    check_numpy_engine("auto", "float32")
    check_numpy_engine(torch.device("cpu"), torch.float32)


# ------------------------------------------------------------------ extending slots, in padded groups


def test_extending_slots_in_ragged_chunks_equals_prefilling_each_whole(small):
    """Three slots continued from different positions, in one call: each slot's logits at every
    position equal those of its whole prompt prefilled alone (float32, within 1e-5)."""
    model = small
    prompts = [torch.randint(0, 50257, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 7, 33)]
    engine, reference = TorchEngine(model, 3), TorchEngine(model, 1)
    cuts = [(0, 9, 20), (0, 1, 7), (0, 16, 33)]  # each prompt in two pieces
    with torch.inference_mode():
        first = engine.extend([0, 1, 2], [c[0] for c in cuts], [p[: c[1]] for p, c in zip(prompts, cuts)], [True] * 3)
        second = engine.extend(
            [2, 0, 1],
            [cuts[2][1], cuts[0][1], cuts[1][1]],
            [prompts[2][cuts[2][1] :], prompts[0][cuts[0][1] :], prompts[1][cuts[1][1] :]],
            [True, False, True],
        )
        whole = [reference.prefill(0, p, every_position=True) for p in prompts]
    assert engine.cache.lengths == [20, 7, 33]
    for b, (head, tail) in enumerate([(first[0], second[1]), (first[1], second[2]), (first[2], second[0])]):
        if tail.dim() == 1:  # only the last position asked for
            tail = tail[None]
        got = torch.cat([head, tail])
        want = torch.cat([whole[b][: cuts[b][1]], whole[b][-len(tail) :]])
        assert (got - want).abs().max() < 1e-5


def test_padded_groups_keep_padding_small():
    from gpt2.generation.engines import padded_groups

    assert padded_groups([16] * 8) == [list(range(8))]  # prompts of one length: one batch
    assert padded_groups([16, 400, 15, 14]) == [[1], [0, 2, 3]]  # the long one alone
    assert padded_groups([10, 9, 8, 1]) == [[0, 1, 2], [3]]  # 4 x 10 would be 40 for 28


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

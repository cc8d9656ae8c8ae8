"""Engines (gpt2.generation.engines): the torch engine, the one kept for a model's calls with CUDA graphs, the NumPy
engine, and the rules of which engine runs where. (The KV and prefix caches: test_generation_caches.py; the steps
CUDA graphs replay: test_generation_graphs.py.)"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from helpers import make_hf_model

from gpt2 import InvalidArgumentError, Tokenizer
from gpt2.checkpoints.config import GPT2Config
from gpt2.generation.engines import (
    TorchEngine,
    check_cuda_graphs,
    check_numpy_engine,
    cuda_graphs,
    kept_engine,
    set_cuda_graphs,
)
from gpt2.generation.generate import generate_text
from gpt2.model.model import GPT2
from gpt2.reference import ReferenceModel

ENC = Tokenizer.gpt2()
TINY = dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3)
SLIDING = dict(vocab_size=64, n_positions=40, n_embd=56, n_layer=5, n_head=7)  # 7 heads of 8 channels


# ------------------------------------------------------------------ CUDA graphs


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
    """The library names its arguments; the command line passes its flags (tests/cli/test_cli_generate.py)."""
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

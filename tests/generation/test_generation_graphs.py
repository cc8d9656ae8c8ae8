"""Decoding steps of a fixed shape, replayed as CUDA graphs (gpt2.generation.graphs): the same tokens as plain
decoding, uncaptured on the CPU and captured on a CUDA GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_hf_model

from gpt2.generation.decoding import Row, run
from gpt2.generation.engines import TorchEngine
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2

SLIDING = dict(vocab_size=64, n_positions=40, n_embd=56, n_layer=5, n_head=7)  # 7 heads of 8 channels


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

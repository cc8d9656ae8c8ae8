"""Choosing a token (greedy, temperature, top-k, top-p) and seeded random streams: gpt2.sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from gpt2.sampling import Sampling, filter_logits, mt19937_init_by_array, sample_next, seeded_generator

# ------------------------------------------------------------------ filters and draws


def test_top_k_keeps_exactly_k_with_ties_by_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.5, 3.0]])
    kept = filter_logits(logits, top_k=2) > float("-inf")
    assert kept.tolist() == [[False, True, True, False, False, False]]
    assert (filter_logits(logits, top_k=6) == logits).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    keep = lambda p: (filter_logits(logits, top_p=p) > float("-inf")).sum().item()  # noqa: E731
    assert keep(0.5) == 1  # 0.5 alone reaches 0.5
    assert keep(0.51) == 2
    assert keep(0.8) == 2
    assert keep(0.81) == 3
    assert keep(1.0) == 4
    assert keep(0.01) == 1  # the most likely token always stays


def test_filters_combine_top_k_first():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top_k=3 renormalises to 4/9, 3/9, 2/9; top_p=0.7 then needs the first two
    assert (filter_logits(logits, top_k=3, top_p=0.7) > float("-inf")).tolist() == [[True, True, False, False]]


@pytest.mark.parametrize("sampling", [
    Sampling(temperature=1.0), Sampling(temperature=0.7), Sampling(temperature=1.5, top_k=5), Sampling(top_p=0.8),
    Sampling(temperature=0.9, top_k=6, top_p=0.9),
], ids=["t1", "t0.7", "topk", "topp", "all"])  # fmt: skip
def test_sampled_frequencies_match_the_filtered_distribution(sampling):
    logits = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0])
    target = torch.softmax(filter_logits(logits[None] / sampling.temperature, sampling.top_k, sampling.top_p)[0], -1)
    n = 20_000
    draws = sample_next(logits.expand(n, -1).clone(), sampling, torch.Generator().manual_seed(7))
    counts = torch.bincount(draws, minlength=10).double()
    support = target > 0
    assert counts[~support].sum() == 0  # nothing outside the kept set
    expected = target[support].double() / target[support].double().sum() * n
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 0.001


def test_greedy_is_argmax_with_lowest_id_on_ties():
    assert sample_next(torch.tensor([[0.0, 5.0, 5.0]]), Sampling(temperature=0)).item() == 1


# ------------------------------------------------------------------ seeds


def test_seeds_below_2_32_are_torchs_own():
    for seed in (0, 1, 42, 2**32 - 1):
        assert torch.equal(torch.rand(8, generator=seeded_generator(seed)), torch.rand(8, generator=torch.Generator().manual_seed(seed)))


def test_every_bit_of_a_64_bit_seed_counts():
    """torch's CPU generator alone reads only a seed's low 32 bits: 2**32 and 2**63 would replay seed 0."""
    seeds = [0, 1, 2**32, 2**32 + 1, 2**33, 2**63, 2**63 + 1, 2**64 - 1]
    draws = {seed: tuple(torch.rand(4, generator=seeded_generator(seed)).tolist()) for seed in seeds}
    assert len(set(draws.values())) == len(seeds)
    assert draws[2**63] == tuple(torch.rand(4, generator=seeded_generator(2**63)).tolist())  # reproducible
    assert seeded_generator(2**63 + 5).initial_seed() == 2**63 + 5


@pytest.mark.parametrize("seed", [2**32, 2**40 + 12345, 2**63, 2**64 - 1])
def test_large_seeds_set_the_twister_as_init_by_array_does(seed):
    """The state equals NumPy's legacy MT19937 seeded with the seed's two 32-bit halves (init_by_array)."""
    key = np.random.RandomState(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)).get_state()[1]
    state = seeded_generator(seed).get_state().numpy()
    words = np.frombuffer(state[24 : 24 + 624 * 8].tobytes(), dtype="<u8")
    assert words.tolist() == key.astype(np.uint64).tolist()
    assert mt19937_init_by_array([seed & 0xFFFFFFFF, seed >> 32]) == key.tolist()

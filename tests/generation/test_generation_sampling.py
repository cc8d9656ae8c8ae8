"""Choosing a token (greedy, temperature, top-k, top-p) and seeded random streams: gpt2.generation.sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, chisquare

from gpt2 import GPT2Error
from gpt2.generation.sampling import (
    Sampling,
    filter_logits,
    mt19937_init_by_array,
    probabilities,
    row_probabilities,
    sample_next,
    sampling_of,
    seeded_generator,
    speculative_accept,
)

# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "settings, param, message",
    [
        (dict(temperature=-1), "temperature", "temperature must be a finite number >= 0 \\(0 is greedy\\), got -1"),
        (
            dict(temperature=float("nan")),
            "temperature",
            "temperature must be a finite number >= 0 \\(0 is greedy\\), got nan",
        ),
        (dict(top_k=0), "top_k", "top_k must be an integer from 1 up, got 0"),
        (dict(top_k=2.5), "top_k", "top_k must be an integer from 1 up, got 2.5"),
        (dict(top_p=0), "top_p", "top_p must be in \\(0, 1\\], got 0"),
        (dict(top_p=1.5), "top_p", "top_p must be in \\(0, 1\\], got 1.5"),
    ],
)
def test_a_sampling_is_checked_as_it_is_made_naming_the_setting(settings, param, message):
    with pytest.raises(GPT2Error, match=message) as caught:
        Sampling(**settings)
    assert caught.value.param == param


def test_only_top_ks_bound_waits_for_the_vocabulary():
    Sampling(top_k=10).check_vocab(10)
    with pytest.raises(GPT2Error, match="top_k must be an integer from 1 to 10, the model's vocabulary size, got 11"):
        Sampling(top_k=11).check_vocab(10)


def test_a_top_k_over_the_vocabulary_is_refused_by_every_door_of_the_library_naming_the_size():
    """The shipped character model: Shakespeare's 65 characters. top_k 200 (gpt2 generate's default
    elsewhere) is an error naming top_k and 65 as the vocabulary's size; no top_k is no limit."""
    from gpt2.examples import corpus_text
    from gpt2.generation.generate import generate_text
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained("shakespeare_char", device="cpu")
    size = len(set(corpus_text("shakespeare")))  # its characters, counted in the corpus it learnt
    idx = torch.tensor([model.tokenizer.encode("ROMEO:")])
    doors = {
        "GPT2.generate": lambda **top_k: model.generate(idx, 2, seed=0, **top_k),
        "generate_text": lambda **top_k: generate_text(
            model, model.tokenizer, "ROMEO:", max_new_tokens=2, seed=0, **top_k
        ),
    }
    for door, call in doors.items():
        with pytest.raises(
            GPT2Error, match=f"^top_k must be an integer from 1 to {size}, the model's vocabulary size, got 200$"
        ) as caught:
            call(top_k=200)
        assert caught.value.param == "top_k", door
        call(top_k=size)
        call()


def test_a_sampling_made_already_or_the_settings_not_both():
    made = Sampling(0.5, 3)
    assert sampling_of(sampling=made) is made and sampling_of(0.5, 3) == made
    with pytest.raises(GPT2Error, match="give sampling, or temperature, top_k and top_p, not both") as caught:
        sampling_of(0.5, sampling=made)
    assert caught.value.param == "sampling"
    with pytest.raises(GPT2Error, match="sampling must be a gpt2.generation.sampling.Sampling, got dict"):
        sampling_of(sampling={"temperature": 0.5})


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


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=1.0),
        Sampling(temperature=0.7),
        Sampling(temperature=1.5, top_k=5),
        Sampling(top_p=0.8),
        Sampling(temperature=0.9, top_k=6, top_p=0.9),
    ],
    ids=["t1", "t0.7", "topk", "topp", "all"],
)
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


def test_probabilities_are_the_filtered_distribution_and_greedy_is_one_hot():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top_k=3: 4/9, 3/9, 2/9; top_p=0.7 keeps the first two (7/9), renormalised
    assert torch.allclose(probabilities(logits, Sampling(top_k=3, top_p=0.7)), torch.tensor([[4 / 7, 3 / 7, 0, 0]]))
    assert torch.allclose(probabilities(logits * 2, Sampling(temperature=2.0)), torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert probabilities(torch.tensor([[0.0, 5.0, 5.0]]), Sampling(temperature=0)).tolist() == [[0, 1, 0]]
    rows = row_probabilities(torch.cat([logits, logits]), [Sampling(temperature=0), Sampling(top_k=1)])
    assert rows.tolist() == [[1, 0, 0, 0], [1, 0, 0, 0]]


# ------------------------------------------------------------------ speculative sampling's rule


def one_hot(*ids: int, V: int = 8) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_greedy_drafts_are_kept_while_they_are_the_argmax_then_the_argmax_follows_without_a_draw():
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert speculative_accept(one_hot(2, 5, 3, 7), one_hot(2, 5, 1), [2, 5, 1], generator) == (2, 3)
    assert speculative_accept(one_hot(2, 5, 3, 7), one_hot(2, 5, 3), [2, 5, 3], generator) == (
        3,
        7,
    )  # all kept: p's last
    assert speculative_accept(one_hot(4), one_hot(4)[:0], [], generator) == (0, 4)  # no drafts: the model's token
    assert torch.equal(generator.get_state(), state)  # nothing was random


def test_a_refused_draft_is_replaced_from_the_residual_distribution():
    """p = (0.1, 0.9), q = (0.9, 0.1): draft 0 is kept with probability p/q = 1/9; refused, the
    token comes from max(0, p - q) = (0, 0.8): always token 1. Draft 1 (p > q) is always kept."""
    p = torch.tensor([[0.1, 0.9, 0, 0], [0, 0, 1.0, 0]])
    q = torch.tensor([[0.9, 0.1, 0, 0]])
    generator = torch.Generator().manual_seed(1)
    outcomes = [speculative_accept(p, q, [0], generator) for _ in range(9000)]
    kept = sum(n for n, _ in outcomes)
    assert {token for n, token in outcomes if n == 0} == {1} and {token for n, token in outcomes if n == 1} == {2}
    assert binomtest(kept, 9000, 1 / 9).pvalue > 1e-3
    assert all(speculative_accept(p, q, [1], generator) == (1, 2) for _ in range(100))


def test_the_first_token_follows_the_models_distribution_whatever_the_drafts():
    """Drafts drawn from q, kept or replaced by the rule: the token that comes first is drawn
    from p, not from q (a chi-square test tells them apart)."""
    target, proposal = np.array([0.05, 0.4, 0.05, 0.3, 0.2, 0, 0, 0]), np.array([0.3, 0.1, 0.2, 0.1, 0.05, 0.25, 0, 0])
    p, q = (
        torch.tensor(np.stack([target, np.full(8, 1 / 8)]), dtype=torch.float32),
        torch.tensor(proposal[None], dtype=torch.float32),
    )
    generator = torch.Generator().manual_seed(2)
    firsts = []
    for draft in torch.multinomial(q[0], 20_000, replacement=True, generator=generator).tolist():
        kept, token = speculative_accept(p, q, [draft], generator)
        firsts.append(draft if kept else token)
    counts = np.bincount(firsts, minlength=8)
    assert counts[5:].sum() == 0  # p gives them nothing, though q gives token 5 a quarter
    assert chisquare(counts[:5], target[:5] * 20_000).pvalue > 1e-3
    assert chisquare(counts[:5], proposal[:5] / proposal[:5].sum() * 20_000).pvalue < 1e-3  # q's, on p's tokens


# ------------------------------------------------------------------ seeds


def test_seeds_below_2_32_are_torchs_own():
    for seed in (0, 1, 42, 2**32 - 1):
        assert torch.equal(
            torch.rand(8, generator=seeded_generator(seed)),
            torch.rand(8, generator=torch.Generator().manual_seed(seed)),
        )


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

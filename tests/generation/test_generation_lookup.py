"""Prompt-lookup speculation: drafts from a row's own earlier tokens, verified by the model.
Greedy text is the text without speculation, token for token; sampled text follows the model's
distribution exactly (a chi-square test), under a constraint too."""

from __future__ import annotations

import random

import numpy as np
import pytest
from helpers import chi_square_p, exact_distribution, hf_and_ours

from gpt2 import Tokenizer
from gpt2.errors import GPT2Error
from gpt2.generation.decoding import Decoder, Row, run
from gpt2.generation.engines import TorchEngine
from gpt2.generation.generate import TextGeneration
from gpt2.generation.lookup import PromptLookup, lookup_of
from gpt2.generation.processors import Constraint, processing_of
from gpt2.generation.sampling import Sampling
from gpt2.tokenizer.char import CharTokenizer

ENC = Tokenizer.gpt2()


def proposed_by_definition(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """The draft as the module's docstring defines it, by brute force: for n from n_max down to
    n_min, the latest earlier place where the last n tokens occur; the k tokens after it, the
    text going on as it went from there where they reach the present (each token the one p back)."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                text = list(tokens)
                for i in range(k):
                    text.append(text[start + n + i])  # a copy that runs on into what it copies
                return text[len(tokens) :]
    return []


def test_proposals_equal_the_definition_on_random_sequences():
    rng = random.Random(0)
    found = 0
    for _ in range(3000):
        tokens = [rng.randrange(rng.choice([2, 3, 5, 50])) for _ in range(rng.randrange(1, 40))]
        n_min = rng.randrange(1, 4)
        n_max, k = n_min + rng.randrange(0, 4), rng.randrange(1, 6)
        expected = proposed_by_definition(tokens, k, n_max, n_min)
        assert PromptLookup(n_max, n_min).propose(tokens, k) == expected, (tokens, k, n_max, n_min)
        assert not expected or len(expected) == k
        found += bool(expected)
    assert 1000 < found < 2900  # both kinds of case


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return hf_and_ours(
        tmp_path_factory.mktemp("lookup"), seed=4, vocab_size=50257, n_positions=128, n_embd=48, n_layer=2, n_head=3
    )


COPIES = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5,",
    "Hello",
]


def test_greedy_text_by_prompt_lookup_is_the_text_without_it_and_takes_several_tokens_a_pass(small):
    """4 prompts, 2 rows each in 3 slots (rows join and leave), greedy and 40 tokens: the tokens equal
    those without speculation, and lookup gets more than one token per pass of the model."""
    _, model = small
    plain = TextGeneration(model, ENC, COPIES, max_new_tokens=40, temperature=0, num_samples=2)
    speculated = TextGeneration(
        model,
        ENC,
        COPIES,
        max_new_tokens=40,
        temperature=0,
        num_samples=2,
        speculative="ngram",
        prompt_lookup_min=1,
        draft_tokens=5,
    )
    for generation in (plain, speculated):
        generation.engine = TorchEngine(model, 3)
        list(generation)
    assert [row.tokens for row in speculated.rows] == [row.tokens for row in plain.rows]
    assert speculated.stats.tokens_per_pass > 1.3 and speculated.stats.accepted > 0


def test_drafts_a_constraint_refuses_are_refused_and_the_text_is_the_constrained_greedy_text(small):
    _, model = small
    options = dict(
        max_new_tokens=30, temperature=0, constraint=Constraint.regex(r"(ab|cd|[0-9]){4,30}"), repetition_penalty=1.1
    )
    plain = TextGeneration(model, ENC, "abab 1212 abab", **options)
    speculated = TextGeneration(model, ENC, "abab 1212 abab", speculative="ngram", prompt_lookup_min=1, **options)
    assert list(speculated) == list(plain) and speculated.stats.proposed > 0


V, PROMPT, N_RUNS = 8, [3, 1, 4, 3, 1, 4, 3, 1], 4000


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """transformers' model of 8 tokens, peaked (large weights), and ours."""
    return hf_and_ours(
        tmp_path_factory.mktemp("peaked"),
        seed=1,
        vocab_size=V,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        initializer_range=0.5,
    )


def sampled(model, sampling: Sampling, lookup: PromptLookup | None, processing=None) -> tuple[np.ndarray, Decoder]:
    """N_RUNS rows of PROMPT, seeded 0.., 4 tokens each, in one batch."""
    rows = [Row(PROMPT, 4, sampling, seed=i, processing=processing) for i in range(N_RUNS)]
    decoder = run(TorchEngine(model, N_RUNS), rows, lookup=lookup, draft_tokens=3)
    return np.array([row.tokens for row in rows]), decoder


def test_sampling_by_prompt_lookup_follows_the_models_distribution_exactly(peaked):
    """4000 rows of a prompt that repeats (3 1 4 3 1 4 3 1), so lookup drafts at every step, under
    top-k and top-p: the 8**4 continuations' frequencies pass a chi-square test against the model's
    exact distribution, and the drafts (4 1 4 ...) are kept often, not always."""
    hf, model = peaked
    sampling = Sampling(temperature=0.8, top_k=5, top_p=0.9)
    tokens, decoder = sampled(model, sampling, PromptLookup(2, 1))
    assert chi_square_p(tokens, exact_distribution(hf, PROMPT, 4, sampling)) > 1e-3
    assert 0.05 < decoder.stats.acceptance < 0.95


def test_sampling_by_prompt_lookup_under_a_constraint_follows_the_constrained_distribution(peaked):
    """A character vocabulary of the 8 tokens and a regex that allows some characters at each place:
    the frequencies pass against the model's distribution with the refused tokens at 0, and fail
    against it without the constraint."""
    hf, model = peaked
    chars = CharTokenizer(list("abcdefgh"))
    processing = processing_of(chars, Constraint.regex("[a-e][bdf][a-h][c-g]"))
    allowed = np.zeros((4, V), dtype=bool)
    for place, letters in enumerate(["abcde", "bdf", "abcdefgh", "cdefg"]):
        allowed[place, [chars.encode(c)[0] for c in letters]] = True
    sampling = Sampling(temperature=1.0)
    tokens, decoder = sampled(model, sampling, PromptLookup(2, 1), processing)
    assert chi_square_p(tokens, exact_distribution(hf, PROMPT, 4, sampling, allowed)) > 1e-3
    assert chi_square_p(tokens, exact_distribution(hf, PROMPT, 4, sampling)) < 1e-3
    assert decoder.stats.accepted > 0


@pytest.mark.parametrize(
    "args, param, message",
    [
        (("tree",), "speculative", "unknown speculative method 'tree'"),
        (("ngram", 2, 3), "prompt_lookup_min", "prompt_lookup_min (3) must not exceed prompt_lookup_max (2)"),
        (("ngram", 0), "prompt_lookup_max", "prompt_lookup_max must be an integer from 1 up, got 0"),
        ((None, 6), "prompt_lookup_max", "prompt_lookup_max and prompt_lookup_min set speculative='ngram'"),
        (("ngram", 4, 2, object()), "draft", "draft and speculative='ngram' contradict"),
    ],
)
def test_bad_speculation_settings_are_named(args, param, message):
    with pytest.raises(GPT2Error) as caught:
        lookup_of(*args)
    assert caught.value.param == param and message in str(caught.value)

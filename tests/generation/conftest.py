"""Fixtures the generation tests share."""

from __future__ import annotations

import pytest
from helpers import hf_and_ours


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A small model with GPT-2's vocabulary, so text round-trips through the tokenizer:
    transformers' (the reference) and ours, loaded from it."""
    return hf_and_ours(
        tmp_path_factory.mktemp("small"), vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3
    )


@pytest.fixture(scope="module")
def small(small_pair):
    return small_pair[1]

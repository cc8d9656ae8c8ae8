"""The NumPy reference engine on its own (its parity with torch and transformers is in test_model_model.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt2 import ContextLengthError, InvalidArgumentError, TokenIdError
from gpt2.checkpoints.config import GPT2Config
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict, sinusoidal_positions
from gpt2.reference import ReferenceModel
from gpt2.reference import sinusoidal_positions as np_sinusoidal_positions


@pytest.fixture
def tiny() -> GPT2:
    torch.manual_seed(0)
    return GPT2(GPT2Config(n_vocab=50, n_ctx=8, n_embd=16, n_head=2, n_layer=1)).eval()


def test_sinusoidal_table_matches_the_numpy_engine():
    for n_embd in (16, 15):
        assert np.abs(sinusoidal_positions(50, n_embd).numpy() - np_sinusoidal_positions(50, n_embd)).max() < 1e-6
    table = sinusoidal_positions(4, 4).numpy()
    assert np.allclose(table[1], [np.sin(1), np.cos(1), np.sin(1 / 100), np.cos(1 / 100)])


def test_numpy_engine_rejects_the_same_bad_input(tiny):
    reference = ReferenceModel(tiny.config, {k: v.numpy() for k, v in hf_state_dict(tiny).items()})
    with pytest.raises(TokenIdError, match="token id -2 is out of range: this model's ids are 0..49"):
        reference([1, -2])
    with pytest.raises(ContextLengthError, match="sequence of 9 tokens is longer than the model's context of n_ctx=8"):
        reference(list(range(9)))
    with pytest.raises(InvalidArgumentError, match="non-empty sequence of integer token ids"):
        reference([])

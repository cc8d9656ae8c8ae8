"""The NumPy reference engine on its own (its parity with torch and transformers is in test_model_model.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import positions_written_out

from gpt2 import ContextLengthError, InvalidArgumentError, TokenIdError
from gpt2.checkpoints.config import GPT2Config
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict
from gpt2.reference import ReferenceModel, gelu, gelu_exact
from gpt2.reference import sinusoidal_positions as np_sinusoidal_positions


@pytest.fixture
def tiny() -> GPT2:
    torch.manual_seed(0)
    return GPT2(GPT2Config(n_vocab=50, n_ctx=8, n_embd=16, n_head=2, n_layer=1)).eval()


def test_sinusoidal_tables_of_both_engines_are_the_formula_written_out():
    """The table the torch model adds (its wpe buffer) and the NumPy engine's, against the formula."""
    for n_embd in (16, 15):
        expected = positions_written_out(50, n_embd)
        config = GPT2Config(n_vocab=50, n_ctx=50, n_embd=n_embd, n_head=1, n_layer=1, positions="sinusoidal")
        torch_table = GPT2(config).transformer.wpe.weight.numpy()
        assert torch_table.shape == expected.shape and np.abs(torch_table - expected).max() < 1e-6
        assert np.abs(np_sinusoidal_positions(50, n_embd) - expected).max() < 1e-6
    # the formula itself, at t = 1, C = 4: wavelengths 2 pi and 100 * 2 pi
    assert np.allclose(positions_written_out(4, 4)[1], [np.sin(1), np.cos(1), np.sin(1 / 100), np.cos(1 / 100)])


def test_numpy_gelus_are_torchs_and_the_normal_cdfs():
    """The NumPy engine's GELUs against torch's (the tanh approximation GPT-2 uses, and the exact
    one) and against x * Phi(x) with SciPy's standard normal CDF."""
    from scipy.stats import norm

    x = np.linspace(-8, 8, 2001)
    t = torch.from_numpy(x)
    assert np.abs(gelu(x) - torch.nn.functional.gelu(t, approximate="tanh").numpy()).max() < 1e-12
    assert np.abs(gelu_exact(x) - torch.nn.functional.gelu(t, approximate="none").numpy()).max() < 1e-12
    assert np.abs(gelu_exact(x) - x * norm.cdf(x)).max() < 1e-12
    assert np.abs(gelu(x) - x * norm.cdf(x)).max() > 1e-4  # the two differ: the test tells them apart


def test_numpy_engine_rejects_the_same_bad_input(tiny):
    reference = ReferenceModel(tiny.config, {k: v.numpy() for k, v in hf_state_dict(tiny).items()})
    with pytest.raises(TokenIdError, match="token id -2 is out of range: this model's ids are 0..49"):
        reference([1, -2])
    with pytest.raises(ContextLengthError, match="sequence of 9 tokens is longer than the model's context of n_ctx=8"):
        reference(list(range(9)))
    with pytest.raises(InvalidArgumentError, match="non-empty sequence of integer token ids"):
        reference([])

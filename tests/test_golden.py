"""Golden tests on OpenAI's real GPT-2 124M weights.

They run only where the weights are on disk: set GPT2_WEIGHTS to a Hugging Face directory
(config.json + model.safetensors) or to OpenAI's release (hparams.json + model.ckpt.*), or
have openai-community/gpt2 in the Hugging Face cache. Elsewhere they are skipped, since
the weights cannot be downloaded here. The expected tokens are OpenAI's model's own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt2 import Tokenizer
from gpt2.model import GPT2
from gpt2.reference import ReferenceModel

pytestmark = pytest.mark.real_weights


@pytest.fixture(scope="module")
def model(real_gpt2_dir) -> GPT2:
    return GPT2.from_pretrained(real_gpt2_dir, device="cpu")


def greedy(model: GPT2, ids: list[int], n: int) -> list[int]:
    """The n most likely next tokens, one at a time, recomputing the whole context each step."""
    idx = torch.tensor([ids])
    for _ in range(n):
        with torch.no_grad():
            next_id = model(idx)[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, next_id], dim=1)
    return idx[0, len(ids) :].tolist()


def test_the_dog(model):
    assert greedy(model, [464, 3290], 18) == [373, 1043, 287, 257, 2214, 1474, 262, 16246, 286, 2688, 290, 2688, 27262, 13, 198, 198, 464, 3290]


def test_alan_turing(model):
    enc = Tokenizer.gpt2()
    prompt = enc.encode("Alan Turing theorized that computers would one day become")
    expected = " the most powerful machines on the planet."
    assert enc.decode(greedy(model, prompt, len(enc.encode(expected)))) == expected


def test_numpy_engine_agrees_on_the_real_weights(model, real_gpt2_dir):
    ids = Tokenizer.gpt2().encode("The quick brown fox jumps over the lazy dog.")
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0].numpy()
    assert np.abs(ReferenceModel.load(real_gpt2_dir)(ids) - logits).max() < 1e-4

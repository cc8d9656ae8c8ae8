"""Golden tests on OpenAI's real GPT-2 124M weights.

They run only where the weights are on disk: set GPT2_WEIGHTS to a Hugging Face directory
(config.json + model.safetensors) or to OpenAI's release (hparams.json + model.ckpt.*), or
have openai-community/gpt2 in the Hugging Face cache. Elsewhere they are skipped, since
the weights cannot be downloaded here. The expected tokens are OpenAI's model's own.

The benchmark tests also need the task's file: in gpt2's cache (downloaded once by `gpt2 eval
--task NAME`) or at $GPT2_LAMBADA / $GPT2_HELLASWAG. Their expected numbers are published ones:
llm.c's for HellaSwag (dev/data/hellaswag.py), lm-evaluation-harness's for LAMBADA
(lambada_openai, gpt2: acc 0.3256, perplexity 40.0554). On a CPU they take an hour or more.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gpt2 import GPT2Error, Tokenizer
from gpt2.evaluation.evaluate import hellaswag, lambada
from gpt2.evaluation.tasks import read_hellaswag, read_lambada, task_file
from gpt2.model.model import GPT2
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
    assert greedy(model, [464, 3290], 18) == [
        373,
        1043,
        287,
        257,
        2214,
        1474,
        262,
        16246,
        286,
        2688,
        290,
        2688,
        27262,
        13,
        198,
        198,
        464,
        3290,
    ]


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


def task_path(task: str):
    try:
        path = task_file(task, os.environ.get(f"GPT2_{task.upper()}"), progress=False)
    except GPT2Error as e:
        pytest.skip(f"{task}'s file is not on this machine: {e}")
    if not path.is_file():
        pytest.skip(f"{path} does not exist")
    return path


def test_hellaswag_as_llm_c_reports_it(model):
    result = hellaswag(model, read_hellaswag(task_path("hellaswag")))
    assert result["examples"] == 10042
    assert round(result["acc_norm"], 4) == 0.2955 and round(result["acc"], 4) == 0.2859


def test_lambada_as_lm_evaluation_harness_reports_it(model):
    result = lambada(model, read_lambada(task_path("lambada")))
    assert result["examples"] == 5153
    assert abs(result["acc"] - 0.3256) <= 1 / 5153  # one example either way: float noise at a near tie
    assert abs(result["perplexity"] - 40.0554) < 0.01

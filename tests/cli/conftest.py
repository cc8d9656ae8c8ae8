"""What the tests of the `gpt2` command line (tests/cli/) share: a tiny model of GPT-2's vocabulary and a text file."""

from __future__ import annotations

import pytest
from helpers import make_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model of GPT-2's vocabulary (random weights) saved as transformers saves it, once per test file."""
    directory = tmp_path_factory.mktemp("model")
    make_hf_model(vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3).save_pretrained(directory)
    return str(directory)


@pytest.fixture
def text_file(tmp_path):
    """A few lines of tinyshakespeare's first speech, as a text file to evaluate."""
    path = tmp_path / "text.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 8, encoding="utf-8")
    return path

"""The fixtures the tests of training on several processes share (distributed and elastic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import SETTINGS

from gpt2.training.train import train


@pytest.fixture(scope="module")
def one_process(char_data, tmp_path_factory) -> Path:
    """The reference: 20 iterations in this process."""
    out = tmp_path_factory.mktemp("one") / "out"
    train(out, data=char_data, max_iters=20, sample_prompt="The", progress=False, **SETTINGS)
    return out

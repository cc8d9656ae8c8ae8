"""Helpers the benchmark scripts share."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import corpus  # noqa: E402  the tests' corpus: tinyshakespeare, or the stdlib's sources

__all__ = ["corpus", "print_table", "random_124m", "timed"]


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of `repeat` calls of fn, and the last call's result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table, ready for benchmarks/RESULTS.md."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def random_124m():
    """transformers' GPT2LMHeadModel of the 124M shape with random weights (seed 0), in eval
    mode, and a temporary directory it is saved in, for gpt2 to load the same weights."""
    import tempfile

    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig()).eval()
    directory = tempfile.mkdtemp()
    hf.save_pretrained(directory)
    return hf, directory

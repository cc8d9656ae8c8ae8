"""gpt2.inspect.trace's own speed, this checkout against another (issue 53: the traced pass gained batches and
hook points; it must not get slower). Run it alternately on both and compare the times it prints:

    .venv/bin/python benchmarks/trace_versions.py after
    PYTHONPATH=<a worktree of the other commit>/src .venv/bin/python benchmarks/trace_versions.py before

A random 124M model (GPT2Config(), seed 0), T = --tokens, one torch thread, the best of --repeat after a warm-up.
"""

from __future__ import annotations

import argparse
import time

import torch

from gpt2.checkpoints.config import GPT2Config
from gpt2.inspect import trace
from gpt2.model.model import GPT2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("label", help="what to print the time as (before, after)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2(GPT2Config()).eval()
    ids = torch.randint(0, 50257, (args.tokens,)).tolist()
    trace(model, ids[:8])  # warm-up
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        trace(model, ids)
        best = min(best, time.perf_counter() - start)
    print(f"{args.label}: trace of {args.tokens} tokens, best of {args.repeat}: {best:.3f} s")


if __name__ == "__main__":
    main()

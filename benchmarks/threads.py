"""Decoding on a busy machine: torch's threads against each other, and what --threads does.

    .venv/bin/python benchmarks/threads.py [--rounds N] [--tokens N]

`gpt2 generate` with the 124M shape (random weights), greedy, on a quiet machine and with one
busy process per core but one beside it (a Python loop that never sleeps, as another program
would be), with torch's default threads (one per core) and with `--threads 1`. Each setting
runs as its own `gpt2 generate` process, the settings alternating for N rounds; the table gives
the median tokens/s each printed. Run it on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from contextlib import contextmanager

from _common import print_table, random_124m

BUSY = "while True: pass"


@contextmanager
def busy_cores(n: int):
    """n processes that keep a core each busy, for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def tokens_per_s(model: str, tokens: int, threads: int | None) -> float:
    argv = [
        sys.executable,
        "-m",
        "gpt2",
        "generate",
        "The meaning of life is",
        "--model",
        model,
        "--temperature",
        "0",
        "--max-new-tokens",
        str(tokens),
        "--no-stream",
    ] + ([] if threads is None else ["--threads", str(threads)])
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return float(re.search(r"([0-9.]+) tokens/s", out.stderr).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    _, model = random_124m()
    cores = os.cpu_count() or 1
    settings = [("quiet", None), ("quiet", 1), (f"{max(cores - 1, 1)} busy", None), (f"{max(cores - 1, 1)} busy", 1)]
    rates: dict[tuple[str, int | None], list[float]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for load, threads in settings:
            if load == "quiet":
                rates[(load, threads)].append(tokens_per_s(model, args.tokens, threads))
            else:
                with busy_cores(max(cores - 1, 1)):
                    rates[(load, threads)].append(tokens_per_s(model, args.tokens, threads))
    quiet = statistics.median(rates[("quiet", None)])
    print(f"{cores} cores; gpt2 generate, 124M shape, {args.tokens} greedy tokens, median of {args.rounds} rounds\n")
    rows = []
    for (load, threads), values in rates.items():
        rate = statistics.median(values)
        rows.append((load, "default" if threads is None else str(threads), f"{rate:.1f}", f"{rate / quiet:.2f}x"))
    print_table(("other processes", "--threads", "tokens/s", "/ quiet, default threads"), rows)


if __name__ == "__main__":
    main()

"""Speculative decoding on the CPU: a 2-layer draft for an 8-layer model, both trained on the same text.

    .venv/bin/python benchmarks/speculative.py [--quick] [--draft-tokens 2,3,4,6] [--max-tokens 96]
        [--rounds 3] [--iters 600]

1. The corpus (tinyshakespeare from ../shared, else the tests' fallback) is prepared by
   characters, and two models of the same width are trained on it with the same recipe and
   seed (`gpt2.training.train`): 2 layers (the draft) and 8 (the model). Their validation losses are
   reported: a pair agrees as real pairs do when the larger is clearly the better.
2. Prompts: the first characters of lines of the validation text. Each is continued alone
   (batch 1, the case speculative decoding is for), greedy and sampled at temperature 1 (seed
   i for prompt i), by the 8-layer model alone and then with the draft proposing k tokens a
   step, for each k, in the same run and round, alternating. Reported for each: the share of
   draft tokens kept (acceptance), the tokens a row gets per pass of the model, tokens/s (the
   median over the rounds of all prompts' tokens over their time), and the speed-up against
   the model alone. Greedy texts with the draft must equal the model's alone (checked).

--quick trains for a few iterations, tiny, and runs k 2 and 4 on 2 short prompts once: a smoke
run of the script, not a measurement. Run the full one on a quiet machine: with 2 cores, any
other process slows torch several times.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import corpus, print_table

from gpt2.data.text import prepare
from gpt2.generation.decoding import Row, run
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2
from gpt2.training.train import train

FULL = dict(n_embd=128, n_head=4, block_size=128, batch_size=12, max_iters=600, lr=2e-3, min_lr=2e-4, warmup_iters=50)
QUICK = dict(n_embd=64, n_head=4, block_size=128, batch_size=8, max_iters=20, lr=1e-3, min_lr=1e-4, warmup_iters=5)
LAYERS = {"draft": 2, "model": 8}
MODES = {"greedy": Sampling(temperature=0), "temperature 1": Sampling(temperature=1.0)}


def train_pair(root: Path, recipe: dict) -> dict[str, tuple[GPT2, float, float]]:
    """The draft and the model, trained on the corpus by characters: {name: (model, val loss, seconds)}."""
    name, text = corpus()
    (root / "input.txt").write_text(text, encoding="utf-8")
    prepare([root / "input.txt"], root / "data", "char", progress=False)
    print(f"corpus: {name}, {len(text):,} characters\n")
    trained = {}
    for which, n_layer in LAYERS.items():
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # its evaluations' lines: stdout is the tables'
            result = train(
                root / which,
                data=str(root / "data"),
                n_layer=n_layer,
                grad_accum=1,
                eval_interval=recipe["max_iters"],
                eval_iters=20,
                dropout=0.0,
                device="cpu",
                compile="off",
                progress=False,
                **recipe,
            )
        seconds = time.perf_counter() - start
        trained[which] = (GPT2.from_pretrained(root / which, device="cpu"), result.last_eval["val_loss"], seconds)
    return trained


def prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """The first `length` characters of `count` lines of the validation text (its last 10%), as ids."""
    text = corpus()[1]
    lines = [line for line in text[int(len(text) * 0.9) :].splitlines() if len(line) >= length]
    return [tokenizer.encode(line[:length]) for line in lines[:: max(1, len(lines) // count)][:count]]


def generate(model: GPT2, draft: GPT2 | None, k: int, ids: list[int], new: int, sampling: Sampling, seed: int):
    """One prompt continued by `new` tokens (with the draft proposing k a step): (tokens, seconds, decoder stats)."""
    row = Row(ids, new, sampling, seed)
    engine, draft_engine = (
        None if m is None else m.engine(1, len(ids) + new) for m in (model, draft)
    )  # allocated untimed
    start = time.perf_counter()
    decoder = run(engine, [row]) if draft is None else run(engine, [row], draft_engine, k)
    return row.tokens, time.perf_counter() - start, decoder.stats


def measure(
    model: GPT2, draft: GPT2, ks: list[int], prompts: list[list[int]], new: int, rounds: int
) -> list[list[str]]:
    rows = []
    for mode, sampling in MODES.items():
        runs: dict[int, list] = {0: [], **{k: [] for k in ks}}  # k 0: the model alone
        for _ in range(rounds):  # alternating, so that a slower spell of the machine hits all alike
            for k in runs:
                results = [
                    generate(model, draft if k else None, k, p, new, sampling, seed=i) for i, p in enumerate(prompts)
                ]
                runs[k].append(results)
        alone = [tokens for tokens, _, _ in runs[0][0]]
        rate = {
            k: statistics.median(sum(len(t) for t, _, _ in r) / sum(s for _, s, _ in r) for r in runs[k]) for k in runs
        }
        rows.append([mode, "model alone", "", "1.00", f"{rate[0]:.1f}", "1.00x", ""])
        for k in ks:
            proposed = sum(stats.proposed for _, _, stats in runs[k][0])
            accepted = sum(stats.accepted for _, _, stats in runs[k][0])
            per_pass = sum(stats.tokens for _, _, stats in runs[k][0]) / sum(stats.passes for _, _, stats in runs[k][0])
            same = [tokens for tokens, _, _ in runs[k][0]] == alone
            if mode == "greedy" and not same:
                raise SystemExit(f"greedy tokens with a draft of k={k} differ from the model's alone")
            equal = ("yes" if same else "no") if mode == "greedy" else "(other random draws)"
            rows.append(
                [
                    mode,
                    f"draft, k={k}",
                    f"{accepted / proposed:.0%}",
                    f"{per_pass:.2f}",
                    f"{rate[k]:.1f}",
                    f"{rate[k] / rate[0]:.2f}x",
                    equal,
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny models, few tokens")
    parser.add_argument(
        "--draft-tokens", default=None, help="the values of k, comma-separated (default: 2,3,4,6; quick: 2,4)"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="new tokens per prompt (default: 96; quick: 24)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts (default: 4; quick: 2)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every run (default: 3; quick: 1)")
    parser.add_argument(
        "--iters", type=int, default=None, help="training iterations of each model (default: 600; quick: 20)"
    )
    args = parser.parse_args()
    quick = args.quick
    ks = [int(k) for k in (args.draft_tokens or ("2,4" if quick else "2,3,4,6")).split(",")]
    new = args.max_tokens or (24 if quick else 96)
    count, rounds = args.prompts or (2 if quick else 4), args.rounds or (1 if quick else 3)
    recipe = dict(QUICK if quick else FULL, **({} if args.iters is None else {"max_iters": args.iters}))

    with tempfile.TemporaryDirectory() as tmp:
        trained = train_pair(Path(tmp), recipe)
        model, draft = trained["model"][0], trained["draft"][0]
        chosen = prompts(model.tokenizer, count, 16)
        for k in [0, *ks]:  # warm-up: the decode kernels, the first allocations, each shape's first pass
            generate(model, draft if k else None, k, chosen[0], 2 * max(ks) + 2, Sampling(temperature=0), 0)
        rows = measure(model, draft, ks, chosen, new, rounds)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"{rounds} round(s), medians\n"
    )
    width = f"{recipe['n_embd']} wide, {recipe['n_head']} heads, block {recipe['block_size']}"
    print_table(
        ["model (characters, " + width + ")", "parameters", "iterations", "training time", "validation loss"],
        [
            [
                f"{which}: {LAYERS[which]} layers",
                f"{m.num_parameters() / 1e6:.2f}M",
                str(recipe["max_iters"]),
                f"{seconds:.0f} s",
                f"{loss:.3f}",
            ]
            for which, (m, loss, seconds) in trained.items()
        ],
    )
    print()
    print_table(
        [
            f"decoding ({count} prompts of 16 characters, {new} new tokens each, one at a time)",
            "with",
            "acceptance",
            "tokens per model pass",
            "tokens/s",
            "speed-up",
            "tokens equal the model's alone",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

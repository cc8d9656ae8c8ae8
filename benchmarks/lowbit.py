"""Narrow weights on the CPU (bfloat16, float16, int8) against float32: accuracy.

    .venv/bin/python benchmarks/lowbit.py [--iters 600]

Accuracy: a small GPT-2-vocabulary model (4 layers, 4 heads, 128 wide) trained here for
--iters iterations on the tests' corpus (tinyshakespeare where ../shared has it), then loaded
in each dtype: mean KL divergence per token from float32, top-1 agreement, and the perplexity
of the validation split (llama.cpp reports its quantisations the same way). Their decoding
speed is measured by benchmarks/generate.py.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import corpus, print_table

DTYPES = ("float32", "bfloat16", "float16", "int8")


def accuracy(iters: int) -> list[list[str]]:
    from gpt2.data.files import open_data
    from gpt2.data.text import prepare
    from gpt2.evaluation.evaluate import agreement, evaluate_data
    from gpt2.model.model import GPT2
    from gpt2.training.train import train

    root = Path(tempfile.mkdtemp())
    name, text = corpus()
    (root / "input.txt").write_text(text, encoding="utf-8")
    prepare([root / "input.txt"], root / "data", "gpt2", progress=False)
    train(
        root / "out",
        data=str(root / "data"),
        n_layer=4,
        n_head=4,
        n_embd=128,
        block_size=128,
        batch_size=12,
        grad_accum=1,
        max_iters=iters,
        eval_interval=iters,
        eval_iters=10,
        warmup_iters=50,
        lr=2e-3,
        min_lr=2e-4,
        device="cpu",
        progress=False,
        log_interval=iters,
    )
    val = open_data(root / "data").val
    reference = GPT2.from_pretrained(root / "out", device="cpu")
    base = evaluate_data(reference, root / "data").perplexity
    rows = []
    for dtype in DTYPES[1:]:
        model = GPT2.from_pretrained(root / "out", device="cpu", dtype=dtype)
        result = agreement(reference, model, val)
        ppl = evaluate_data(model, root / "data").perplexity
        rows.append(
            [
                dtype,
                f"{result.kl:.2e}",
                f"{result.top1:.2%}",
                f"{ppl:.3f} (float32 {base:.3f})",
                f"{(ppl / base - 1):+.3%}",
            ]
        )
    print(f"accuracy: {name}, {len(val):,} validation tokens, a 4x4x128 model trained {iters} iterations\n")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=600)
    args = parser.parse_args()
    rows = accuracy(args.iters)
    print_table(["weights", "KL per token (nats)", "top-1 agreement", "validation perplexity", "change"], rows)


if __name__ == "__main__":
    main()

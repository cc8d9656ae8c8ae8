"""Narrow weights on the CPU (bfloat16, float16, int8) against float32: accuracy and decoding speed.

    .venv/bin/python benchmarks/lowbit.py [--iters 600] [--rounds 3]

Accuracy: a small GPT-2-vocabulary model (4 layers, 4 heads, 128 wide) trained here for
--iters iterations on the tests' corpus (tinyshakespeare where ../shared has it), then loaded
in each dtype: mean KL divergence per token from float32, top-1 agreement, and the perplexity
of the validation split (llama.cpp reports its quantisations the same way). Speed: the 124M
shape with random weights, 16-token prompt, 128 new greedy tokens, batch 1 and 8, each dtype
against float32 and transformers (float32) in the same run, rounds alternating, medians; and
the fraction of the memory-bandwidth ceiling each reaches for its own bytes per token.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from _common import corpus, print_table, random_124m, timed

DTYPES = ("float32", "bfloat16", "float16", "int8")


def accuracy(iters: int) -> list[list[str]]:
    from gpt2.data import open_data, prepare
    from gpt2.evaluate import agreement, evaluate_data
    from gpt2.model import GPT2
    from gpt2.train import train

    root = Path(tempfile.mkdtemp())
    name, text = corpus()
    (root / "input.txt").write_text(text, encoding="utf-8")
    prepare([root / "input.txt"], root / "data", "gpt2", progress=False)
    train(root / "out", data=str(root / "data"), n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=12, grad_accum=1,
          max_iters=iters, eval_interval=iters, eval_iters=10, warmup_iters=50, lr=2e-3, min_lr=2e-4, device="cpu",
          progress=False, log_interval=iters)  # fmt: skip
    val = open_data(root / "data").val
    reference = GPT2.from_pretrained(root / "out", device="cpu")
    base = evaluate_data(reference, root / "data").perplexity
    rows = []
    for dtype in DTYPES[1:]:
        model = GPT2.from_pretrained(root / "out", device="cpu", dtype=dtype)
        result = agreement(reference, model, val)
        ppl = evaluate_data(model, root / "data").perplexity
        rows.append([dtype, f"{result.kl:.2e}", f"{result.top1:.2%}", f"{ppl:.3f} (float32 {base:.3f})", f"{(ppl / base - 1):+.3%}"])
    print(f"accuracy: {name}, {len(val):,} validation tokens, a 4x4x128 model trained {iters} iterations\n")
    return rows


def speed(rounds: int) -> list[list[str]]:
    from gpt2.model import GPT2
    from generate import WEIGHT_BYTES, read_bandwidth

    hf, directory = random_124m()
    models = {dtype: GPT2.from_pretrained(directory, device="cpu", dtype=dtype) for dtype in DTYPES}
    bytes_per_token = {dtype: sum(p.numel() * p.element_size() for p in m.parameters()) for dtype, m in models.items()}
    ceiling = read_bandwidth()
    rows = []
    with torch.inference_mode():
        for batch in (1, 8):
            idx = torch.randint(0, 50257, (batch, 16), generator=torch.Generator().manual_seed(batch))
            reference = models["float32"].generate(idx, 128, temperature=0)
            times = {dtype: [] for dtype in (*DTYPES, "transformers")}
            for _ in range(rounds):
                for dtype, model in models.items():
                    times[dtype].append(timed(lambda: model.generate(idx, 128, temperature=0), 1)[0])
                mask = torch.ones_like(idx)
                times["transformers"].append(timed(lambda: hf.generate(idx, max_new_tokens=128, do_sample=False, attention_mask=mask,
                                                                       pad_token_id=50256), 1)[0])  # fmt: skip
            rate = {k: batch * 128 / statistics.median(v) for k, v in times.items()}
            for dtype in DTYPES:
                same = (models[dtype].generate(idx, 128, temperature=0) == reference).float().mean()
                steps = rate[dtype] / batch  # decoding steps a second, each reading every weight once
                rows.append([f"batch {batch}, {dtype}", f"{rate[dtype]:.1f} tok/s", f"{rate[dtype] / rate['float32']:.2f}x",
                             f"{rate[dtype] / rate['transformers']:.2f}x", f"{steps * bytes_per_token[dtype] / ceiling:.0%}",
                             f"{same:.0%}"])  # fmt: skip
    print(f"speed: the 124M shape, random weights; transformers float32 decoded at {rate['transformers']:.1f} tok/s at batch 8; "
          f"memory read bandwidth {ceiling / 1e9:.1f} GB/s; float32 weights {WEIGHT_BYTES / 1e6:.0f} MB\n")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = accuracy(args.iters)
    print_table(["weights", "KL per token (nats)", "top-1 agreement", "validation perplexity", "change"], rows)
    print()
    rows = speed(args.rounds)
    print_table(["decode, 16-token prompt, 128 new tokens, greedy", "gpt2", "/ float32", "/ transformers", "of the bandwidth ceiling",
                 "greedy tokens equal to float32's"], rows)  # fmt: skip


if __name__ == "__main__":
    main()

"""Decoding on a CUDA GPU: eager steps against CUDA graphs (`--cuda-graphs`), and transformers.

    .venv/bin/python benchmarks/cuda_graphs.py [--rounds 3] [--shapes 124m,xl]

Random weights of the 124M and gpt2-xl shapes in bfloat16; a 16-token prompt, 128 new greedy
tokens, batch 1 and 8; rounds alternating, medians; and the time to the first token (the
prompt's prefill, eager with or without graphs). Checks first that the graphs' greedy tokens equal eager
decoding's in float32. Needs a CUDA GPU: without one it says so and exits 1. It has not run
yet (no GPU was lent when it was written); its figures go in RESULTS.md when it has.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import torch
from _common import print_table, timed

SHAPES = {"124m": dict(n_embd=768, n_layer=12, n_head=12), "xl": dict(n_embd=1600, n_layer=48, n_head=25)}
NEW_TOKENS = 128


def random_model(shape: str):
    """transformers' GPT2LMHeadModel of `shape` with random weights, and the directory it is saved in."""
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig(**SHAPES[shape])).eval()
    directory = tempfile.mkdtemp()
    hf.save_pretrained(directory)
    return hf, directory


def synchronized(fn):
    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def check_equal_in_float32(directory: str) -> None:
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained(directory, device="cuda")
    idx = torch.randint(0, 50257, (3, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    eager = model.generate(idx, 64, temperature=0)
    graphed = model.use_cuda_graphs().generate(idx, 64, temperature=0)
    assert torch.equal(eager, graphed), "greedy tokens from CUDA graphs differ from eager decoding's in float32"


def measure(shape: str, rounds: int) -> list[tuple[str, ...]]:
    from gpt2.model.model import GPT2

    hf, directory = random_model(shape)
    check_equal_in_float32(directory)
    eager = GPT2.from_pretrained(directory, device="cuda", dtype="bfloat16")
    graphed = GPT2.from_pretrained(directory, device="cuda", dtype="bfloat16").use_cuda_graphs()  # keeps its engine
    hf = hf.to("cuda", torch.bfloat16)
    rows = []
    with torch.inference_mode():
        for batch in (1, 8):
            idx = torch.randint(
                0, 50257, (batch, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(batch)
            )
            mask = torch.ones_like(idx)
            runs = {
                "eager": synchronized(lambda idx=idx: eager.generate(idx, NEW_TOKENS, temperature=0)),
                "graphs": synchronized(lambda idx=idx: graphed.generate(idx, NEW_TOKENS, temperature=0)),
                "transformers": synchronized(
                    lambda idx=idx, mask=mask: hf.generate(
                        idx, max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=mask, pad_token_id=50256
                    )
                ),
            }
            for run in runs.values():  # warm-up; the graphs' buckets are captured here, once
                run()
            times = {name: [] for name in runs}
            for _ in range(rounds):
                for name, run in runs.items():
                    times[name].append(timed(run, 1)[0])
            rate = {name: batch * NEW_TOKENS / statistics.median(t) for name, t in times.items()}
            # the first token is the prompt's prefill, eager in both: graphs replay the steps after it
            ttft = timed(synchronized(lambda idx=idx: graphed.generate(idx, 1, temperature=0)), rounds)[0]
            rows.append(
                (
                    f"{shape}, batch {batch}",
                    f"{rate['eager']:.0f} tok/s",
                    f"{rate['graphs']:.0f} tok/s",
                    f"{rate['transformers']:.0f} tok/s",
                    f"{rate['graphs'] / rate['eager']:.2f}x",
                    f"{rate['graphs'] / rate['transformers']:.2f}x",
                    f"{ttft * 1e3:.1f} ms",
                )
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="124m,xl", help="comma-separated: 124m, xl")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/cuda_graphs.py needs a CUDA GPU; none is here", file=sys.stderr)
        return 1
    rows = [row for shape in args.shapes.split(",") for row in measure(shape, args.rounds)]
    print(
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, bfloat16, 16-token prompt, "
        f"{NEW_TOKENS} new greedy tokens\n"
    )
    print_table(
        [
            "shape, batch",
            "eager",
            "CUDA graphs",
            "transformers",
            "graphs / eager",
            "graphs / transformers",
            "time to first token",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

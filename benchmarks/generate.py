"""Generation speed against transformers, on the same random 124M weights, in the same run.

    .venv/bin/python benchmarks/generate.py [--rounds N]

On the CPU with torch's default threads: transformers in float32, gpt2 in float32 and with
weight-only bfloat16, float16 and int8 (`--dtype`). Each measure alternates them for N rounds
and reports medians, so a noisy machine skews all alike. Also measures the machine's memory
read bandwidth, to say how close decoding comes to its ceiling: every new token reads every
weight once, so the ceiling is the bandwidth over the bytes of the weights. Run it on a quiet
machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys

import torch
from _common import print_table, random_124m, timed

N_PARAMS = 124_439_808
WEIGHT_BYTES = N_PARAMS * 4


def read_bandwidth() -> float:
    """Bytes per second that summing a 1 GiB float32 tensor reads, best of 5."""
    x = torch.ones(256 * 1024 * 1024)
    best = min(timed(x.sum, 1)[0] for _ in range(5))
    return x.numel() * 4 / best


PEAK_PROBE = """
import sys, torch
from transformers.utils import logging; logging.set_verbosity_error()
def status(f):
    for line in open("/proc/self/status"):
        if line.startswith(f): return int(line.split()[1]) * 1024
B = int(sys.argv[2])
idx = torch.randint(0, 50257, (B, 16), generator=torch.Generator().manual_seed(0))
if sys.argv[3] == "gpt2":
    from gpt2.model.model import GPT2
    model = GPT2.from_pretrained(sys.argv[1], device="cpu")
    run = lambda: model.generate(idx, 128, temperature=0)
else:
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
    run = lambda: model.generate(idx, max_new_tokens=128, do_sample=False, attention_mask=torch.ones_like(idx), \
pad_token_id=50256)
with torch.inference_mode():
    run()
print(status("VmHWM"))
"""


def peak_memory(path: str, batch: int, which: str) -> int:
    """Peak resident memory of a process that loads the model and generates 128 tokens."""
    out = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, path, str(batch), which], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


DTYPES = ("float32", "bfloat16", "float16", "int8")  # on the CPU the last three are weight-only (issue 12)


def decode_rows(models: dict, hf, rounds: int, bandwidth: float) -> tuple[list[tuple[str, ...]], float]:
    """Decoding at batch 1 and 8 for each dtype and transformers (float32), rounds alternating;
    returns the table's rows and gpt2's float32 batch-1 rate."""
    gen, rows = torch.Generator().manual_seed(0), []
    weight_bytes = {dtype: sum(p.numel() * p.element_size() for p in m.parameters()) for dtype, m in models.items()}

    def hf_generate(idx: torch.Tensor) -> torch.Tensor:
        return hf.generate(
            idx, max_new_tokens=128, do_sample=False, attention_mask=torch.ones_like(idx), pad_token_id=50256
        )

    for batch in (1, 8):
        idx = torch.randint(0, 50257, (batch, 16), generator=gen)
        runs = {dtype: (lambda m=m, idx=idx: m.generate(idx, 128, temperature=0)) for dtype, m in models.items()}
        runs["transformers"] = lambda idx=idx: hf_generate(idx)
        outputs = {name: run() for name, run in runs.items()}  # warm-up, and parity
        assert torch.equal(outputs["float32"], outputs["transformers"]), "greedy tokens differ from transformers"
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(timed(run, 1)[0])
        rate = {name: batch * 128 / statistics.median(t) for name, t in times.items()}
        for dtype in models:
            ratios = sorted(h / o for o, h in zip(times[dtype], times["transformers"]))
            steps = rate[dtype] / batch  # decoding steps a second, each reading every weight once
            rows.append(
                (
                    f"decode, batch {batch}, {dtype}",
                    f"{rate[dtype]:.1f} tok/s",
                    f"{rate['transformers']:.1f} tok/s",
                    f"{rate[dtype] / rate['transformers']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})",
                    f"{rate[dtype] / rate['float32']:.2f}x",
                    f"{steps * weight_bytes[dtype] / bandwidth:.0%}",
                )
            )
        if batch == 1:
            decode_rate = rate["float32"]
    return rows, decode_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from gpt2.generation.engines import TorchEngine
    from gpt2.model.model import GPT2

    hf, tmp = random_124m()
    models = {dtype: GPT2.from_pretrained(tmp, device="cpu", dtype=dtype) for dtype in DTYPES}
    ours = models["float32"]
    gen = torch.Generator().manual_seed(0)
    bandwidth = read_bandwidth()

    with torch.inference_mode():
        rows, decode_rate = decode_rows(models, hf, args.rounds, bandwidth)
        for T in (512, 1024):
            idx = torch.randint(0, 50257, (1, T), generator=gen)
            ours(idx), hf(idx)  # warm-up
            t_ours = timed(lambda idx=idx: ours(idx), args.rounds)[0]
            t_hf = timed(lambda idx=idx: hf(idx), args.rounds)[0]
            rows.append(
                (
                    f"prefill {T} tokens (one forward pass, all logits)",
                    f"{T / t_ours:.0f} tok/s",
                    f"{T / t_hf:.0f} tok/s",
                    f"{t_hf / t_ours:.2f}x",
                    "",
                    "",
                )
            )
            t_cached = timed(lambda T=T, idx=idx: TorchEngine(ours, 1, T).prefill(0, idx[0].tolist()), args.rounds)[0]
            rows.append(
                (
                    f"  prefill {T} tokens into the KV cache (last logits only)",
                    f"{T / t_cached:.0f} tok/s",
                    "",
                    "",
                    "",
                    "",
                )
            )

    for batch in (1, 8):
        ours_peak, hf_peak = peak_memory(tmp, batch, "gpt2"), peak_memory(tmp, batch, "transformers")
        rows.append(
            (
                f"peak memory of a process: load + generate 128 tokens, batch {batch}",
                f"{ours_peak / 1e6:.0f} MB",
                f"{hf_peak / 1e6:.0f} MB",
                f"{ours_peak / hf_peak:.2f}x the memory",
                "",
                "",
            )
        )

    ceiling = bandwidth / WEIGHT_BYTES
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; transformers {__import__('transformers').__version__}\n"
    )
    print_table(
        [
            "measure",
            "gpt2",
            "transformers (float32)",
            "gpt2 / transformers",
            "/ gpt2 float32",
            "of the bandwidth ceiling for its bytes",
        ],
        rows,
    )
    print(
        f"\nmemory read bandwidth (sum of a 1 GiB tensor): {bandwidth / 1e9:.1f} GB/s; weights read per token: "
        f"{WEIGHT_BYTES / 1e6:.0f} MB; ceiling {ceiling:.1f} tok/s; "
        f"batch-1 decode reaches {decode_rate / ceiling:.0%} of it "
        f"({decode_rate * WEIGHT_BYTES / 1e9:.1f} GB/s of weights)"
    )


if __name__ == "__main__":
    main()

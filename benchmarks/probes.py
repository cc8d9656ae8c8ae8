"""What a run's probes cost (gpt2/training/probes.py): one probe record (a traced pass, the head scores from
its patterns, the logit lens, 16 greedy tokens) against one training step of the same model, in the same run.

    .venv/bin/python benchmarks/probes.py [--repeat 5] [--threads 1]

Two shapes: the induction recipe's (2 layers, 2 heads, 128 wide, n_ctx 64, batch 64 x 64, its probe 16
random tokens written twice) and the 124M shape (batch 4 x 256 as benchmarks/train.py section 2, the same
probe). Reported: the median ms of a probe and of a step (forward, backward, AdamW), and what the probes
add to the training time at a probe every 50 steps (the induction recipe's probe_interval) and every 500.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpt2 import GPT2, GPT2Config
from gpt2.inspect.circuits import repeated_tokens
from gpt2.training.probes import probe_record

SHAPES = {
    "induction_2l": (dict(n_layer=2, n_head=2, n_embd=128, n_ctx=64, n_vocab=64), (64, 64)),
    "124M": (dict(n_layer=12, n_head=12, n_embd=768, n_ctx=1024, n_vocab=50257), (4, 256)),
}


def median_ms(fn, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def measure(name: str, repeat: int) -> None:
    config, (B, T) = SHAPES[name]
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, config["n_vocab"], (B, T + 1))

    def step() -> None:
        model.train()
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ids = repeated_tokens(16, config["n_vocab"], seed=0)

    def probe() -> None:
        model.eval()
        probe_record(model, None, ids, 0)

    step_ms, probe_ms = median_ms(step, repeat), median_ms(probe, repeat)
    print(
        f"{name}: probe {probe_ms:.1f} ms, step {step_ms:.1f} ms ({probe_ms / step_ms:.2f} steps); "
        f"+{100 * probe_ms / (50 * step_ms):.1f}% of training at a probe every 50 steps, "
        f"+{100 * probe_ms / (500 * step_ms):.2f}% every 500"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in SHAPES:
        measure(name, args.repeat)


if __name__ == "__main__":
    main()

"""Does the gemv kernel (src/gpt2/generation/kernels.py) make fp32 CPU decoding faster than oneDNN?

    .venv/bin/python benchmarks/gemv_experiment.py [--rounds 5] [--steps 20] [--rows 1] [--skip-generate]

1. Streaming: one decode step's weights (12 layers x c_attn 768x2304, attn c_proj 768x768,
   c_fc 768x3072 + GELU, mlp c_proj 3072x768, then the 768x50257 unembedding given as wte.t())
   through each option, in GB/s of weights read: the gemv kernel, oneDNN's _linear_pointwise
   (gpt2.generation.kernels.linear's fallback) and plain `x @ w (+ b)`.
2. Generation: GPT2(GPT2Config()).generate(16-token prompt, 128 new tokens, greedy), with
   the kernel (what gpt2.generation.kernels.linear tries first) and without it (oneDNN then).

The machine is shared, so options alternate within every round (in a rotating order) and the
script prints medians with min-max spreads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import gpt2.generation.kernels
from gpt2.checkpoints.config import GPT2Config
from gpt2.generation.kernels import _extension, gemv
from gpt2.model.model import GPT2

onednn = torch.ops.mkldnn._linear_pointwise
C, V, LAYERS = 768, 50257, 12


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} (min {fmt.format(min(values))}, max {fmt.format(max(values))})"


def streaming(rounds: int, steps: int, rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    shapes = [(C, 3 * C, None), (C, C, None), (C, 4 * C, "tanh"), (4 * C, C, None)] * LAYERS
    layers = [
        (torch.randn(k, n, generator=g) * 0.02, torch.randn(n, generator=g) * 0.02, gelu) for k, n, gelu in shapes
    ]
    wte = torch.randn(V, C, generator=g) * 0.02
    xs = {k: torch.randn(rows, k, generator=g) for k in (C, 4 * C)}
    block_bytes = sum(w.numel() * 4 for w, _, _ in layers)
    unembed_bytes = wte.numel() * 4

    def with_gemv(x, w, b, gelu):
        return gemv(x, w, b, gelu)

    def with_onednn(x, w, b, gelu):
        return onednn(x, w.t(), b, "none" if gelu is None else "gelu", [], gelu or "")

    def with_matmul(x, w, b, gelu):
        y = x @ w
        y = y if b is None else y + b
        return y if gelu is None else F.gelu(y, approximate=gelu)

    options = {"gemv": with_gemv, "oneDNN": with_onednn, "x @ w": with_matmul}
    # the same answers first, so the speeds compare like with like
    for name, fn in options.items():
        for w, b, gelu in layers[:4]:
            x = xs[w.size(0)]
            ref = with_matmul(x.double(), w.double(), b.double(), gelu)
            err = ((fn(x, w, b, gelu).double() - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-5, (name, err)
        ref = xs[C].double() @ wte.double().t()
        assert ((fn(xs[C], wte.t(), None, None).double() - ref).abs().max() / ref.abs().max()).item() < 1e-5, name

    def step(fn) -> tuple[float, float]:
        start = time.perf_counter()
        for w, b, gelu in layers:
            fn(xs[w.size(0)], w, b, gelu)
        mid = time.perf_counter()
        fn(xs[C], wte.t(), None, None)
        return mid - start, time.perf_counter() - mid

    for fn in options.values():  # warm up: page in, spin up threads
        step(fn)
    results = {name: {"blocks": [], "unembedding": [], "step": []} for name in options}
    names = list(options)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times = [step(options[name]) for _ in range(steps)]
            blocks = statistics.median(t[0] for t in times)
            unembed = statistics.median(t[1] for t in times)
            step_time = statistics.median(t[0] + t[1] for t in times)
            results[name]["blocks"].append(block_bytes / blocks / 1e9)
            results[name]["unembedding"].append(unembed_bytes / unembed / 1e9)
            results[name]["step"].append((block_bytes + unembed_bytes) / step_time / 1e9)

    print(f"\n1. Streaming one decode step's weights, x of {rows} row(s), {torch.get_num_threads()} threads")
    print(f"   GB/s of weights read: median of {rounds} rounds (each the median of {steps} steps), min-max over rounds")
    print(f"   blocks: 48 weights, {block_bytes / 1e6:.0f} MB; unembedding: wte.t(), {unembed_bytes / 1e6:.0f} MB")
    print(f"   {'option':<8} {'blocks':>28} {'unembedding':>28} {'whole step':>28}")
    for name in names:
        res = results[name]
        print(f"   {name:<8} {spread(res['blocks']):>28} {spread(res['unembedding']):>28} {spread(res['step']):>28}")


def generation(rounds: int) -> None:
    torch.manual_seed(0)
    model = GPT2(GPT2Config()).eval()
    idx = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(0))
    new = 128
    # gpt2.generation.kernels.linear tries the kernel first; with it answering None, decoding takes oneDNN
    with_kernel, without_kernel = gpt2.generation.kernels.gemv, lambda *args: None

    def run(kernel) -> tuple[float, torch.Tensor]:
        gpt2.generation.kernels.gemv = kernel
        try:
            start = time.perf_counter()
            out = model.generate(idx, new, temperature=0)
            return new / (time.perf_counter() - start), out
        finally:
            gpt2.generation.kernels.gemv = with_kernel

    _, ref = run(without_kernel)  # warm up both, and check they pick the same tokens
    _, out = run(with_kernel)
    same = int((ref == out).all(dim=0).sum()) - idx.size(1)
    tps = {"oneDNN (as is)": [], "gemv": []}
    for r in range(rounds):
        order = [("oneDNN (as is)", without_kernel), ("gemv", with_kernel)]
        for name, kernel in order if r % 2 == 0 else order[::-1]:
            tps[name].append(run(kernel)[0])

    print(
        f"\n2. Generation: random GPT-2 124M, fp32, prompt 16 tokens, {new} new greedy tokens, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"   greedy tokens identical with and without gemv: {same}/{new}")
    for name, values in tps.items():
        print(f"   {name:<15} tok/s median {spread(values)}; rounds: {', '.join(f'{v:.1f}' for v in values)}")
    base, fast = statistics.median(tps["oneDNN (as is)"]), statistics.median(tps["gemv"])
    pairs = [b / a for a, b in zip(tps["oneDNN (as is)"], tps["gemv"])]
    print(f"   speed-up of the medians: {fast / base:.3f}x; per round: {', '.join(f'{p:.3f}' for p in pairs)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--skip-generate", action="store_true")
    args = parser.parse_args()

    start = time.perf_counter()
    available = _extension() is not None
    print(f"gemv kernel {'loaded' if available else 'UNAVAILABLE'} in {time.perf_counter() - start:.2f} s")
    if not available:
        return
    with torch.inference_mode():
        streaming(args.rounds, args.steps, args.rows)
    if not args.skip_generate:
        generation(args.rounds)


if __name__ == "__main__":
    main()

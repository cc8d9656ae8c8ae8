"""The speed of two checkouts of gpt2, before and after a change, in the same run.

    git worktree add /tmp/before REV
    .venv/bin/python benchmarks/trees.py --before /tmp/before [--after .] [--rounds 6]

Each measure runs in a process of its own that imports gpt2 from one tree's `src/` (this
environment's torch and transformers for both); the trees alternate (ABBA...) for N rounds and
the table gives medians, so a machine that drifts slows both alike. Measures, on the 124M shape
(random weights): decoding 128 greedy tokens at batch 1 and 8, in float32 and int8; a forward
pass of 512 tokens; a training step (forward, backward, AdamW) of 2 x 255 tokens; and on a
tiny 12-layer model, where Python's work per step dominates, decoding 200 tokens.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _common import print_table, random_124m

WORKER = """
import json, statistics, sys, time, torch
from gpt2 import GPT2  # the public name: the same in every tree, whatever its modules
path, kind = sys.argv[1], sys.argv[2]
if kind == "tiny":
    torch.set_num_threads(1)


def timed(run, tokens):
    run()  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return tokens / statistics.median(times)


out = {}
cases = [("float32", 1, 200)] if kind == "tiny" else [(d, b, 128) for d in ("float32", "int8") for b in (1, 8)]
for dtype, batch, tokens in cases:
    model = GPT2.from_pretrained(path, device="cpu", dtype=dtype)
    idx = torch.randint(0, model.config.n_vocab, (batch, 16), generator=torch.Generator().manual_seed(0))
    out[f"decode {tokens} tokens, {dtype}, batch {batch}"] = timed(lambda: model.generate(idx, tokens, temperature=0), \
batch * tokens)
if kind != "tiny":
    model = GPT2.from_pretrained(path, device="cpu")
    idx = torch.randint(0, model.config.n_vocab, (1, 512), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out["forward, 512 tokens, all logits"] = timed(lambda: model(idx), 512)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        _, loss = model(idx[:, :510].reshape(2, 255), idx[:, 1:511].reshape(2, 255))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    out["training step, 2 x 255 tokens, AdamW"] = timed(step, 510)
print(json.dumps(out))
"""


def measure(tree: Path, model: str, kind: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", WORKER, model, kind], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def tiny_model() -> str:
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    directory = tempfile.mkdtemp()
    GPT2LMHeadModel(HFConfig(n_layer=12, n_embd=64, n_head=4, n_positions=512, vocab_size=1000)).save_pretrained(
        directory
    )
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of gpt2 (its src/ is imported)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    for tree in (args.before, args.after):
        if not (tree / "src" / "gpt2" / "__init__.py").is_file():
            raise SystemExit(f"--before/--after: {tree} is not a checkout of gpt2 (no src/gpt2/__init__.py)")
    _, big = random_124m()
    models = {"124M": big, "tiny": tiny_model()}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            tree = args.before if name == "before" else args.after
            result = {f"124M, {k}": v for k, v in measure(tree, models["124M"], "124M").items()}
            result |= {f"tiny 12-layer, {k}": v for k, v in measure(tree, models["tiny"], "tiny").items()}
            runs[name].append(result)
            print(f"round {r + 1} {name}: " + ", ".join(f"{v:.1f}" for v in result.values()), file=sys.stderr)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; {args.rounds} rounds alternating, medians\n"
    )
    rows = []
    for key in runs["before"][0]:
        before = [run[key] for run in runs["before"]]
        after = [run[key] for run in runs["after"]]
        pairs = sorted(a / b for a, b in zip(after, before))
        rows.append(
            (
                key,
                f"{statistics.median(before):.1f} tok/s",
                f"{statistics.median(after):.1f} tok/s",
                f"{statistics.median(after) / statistics.median(before):.3f}x",
                f"{pairs[0]:.2f} to {pairs[-1]:.2f}",
            )
        )
    print_table(("measure (tokens/s)", "before", "after", "after / before", "round pairs"), rows)


if __name__ == "__main__":
    main()

"""Memory estimates against what runs really take: training and a KV cache, on the CPU.

    .venv/bin/python benchmarks/memory.py

gpt2 refuses a size whose estimate is over 1.25 times the memory available, and warns over 1x
(`gpt2.devices.check_fits`): the estimates (`gpt2.training.plan.training_memory`,
`gpt2.generation.caches.KVCache.bytes_needed`) should sit near the truth, and above it rather than below.
Each case runs in a process of its own: the resident memory just before the work, against its
peak (VmHWM) after it, is what the work took. Memory, not time: a busy machine does not skew it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import print_table

TRAIN = """
import json, sys, torch
import matplotlib.pyplot  # loaded before the baseline: the plot is not what is measured
from gpt2.data.files import open_data
from gpt2.devices import resolve_device
from gpt2.settings import TrainSettings
from gpt2.training.plan import planned_config, training_memory
from gpt2.training.train import train
torch.set_num_threads(1)
data, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field): return int(line.split()[1]) * 1024
s = TrainSettings(data=data, **settings)
estimate = training_memory(planned_config(s, open_data(data), None), s, resolve_device("cpu"), torch.float32).total
before = status("VmRSS")
train(out, data=data, progress=False, **settings)
print(json.dumps({"estimate": estimate, "used": status("VmHWM") - before}))
"""

GENERATE = """
import json, sys, torch
from gpt2.generation.engines import KVCache
from gpt2.model.model import GPT2
torch.set_num_threads(1)
model = GPT2.from_pretrained(sys.argv[1], device="cpu")
rows, new = int(sys.argv[2]), int(sys.argv[3])
idx = torch.zeros(rows, 16, dtype=torch.long)
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field): return int(line.split()[1]) * 1024
model.generate(idx[:1], 2)  # the first call's one-off allocations are not the cache's
before = status("VmRSS")
model.generate(idx, new, temperature=0)
print(json.dumps({"estimate": KVCache.bytes_needed(model.config, rows, 16 + new, torch.float32), \
"used": status("VmHWM") - before}))
"""

# (n_layer, n_head, n_embd, block_size, batch_size, vocabulary, dropout, checkpoint_activations)
TRAIN_CASES = [
    (4, 4, 128, 256, 64, "char", 0.0, False),
    (4, 4, 128, 256, 64, "char", 0.2, False),
    (6, 6, 384, 256, 16, "char", 0.0, False),
    (4, 4, 256, 1024, 8, "char", 0.0, False),
    (2, 2, 64, 128, 8, "gpt2", 0.0, False),
    (12, 12, 768, 256, 4, "gpt2", 0.0, False),
    (12, 12, 768, 256, 4, "gpt2", 0.0, True),
]
GENERATE_CASES = [(64, 128), (256, 64), (16, 1000)]  # (rows, new tokens) of the 124M shape


def run(code: str, *argv: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepared(root: Path, vocabulary: str) -> Path:
    """Random ids in nanoGPT's format (train.bin, val.bin; a meta.pkl of 65 characters for "char")."""
    import pickle

    import numpy as np

    directory = root / vocabulary
    if directory.is_dir():
        return directory
    directory.mkdir()
    n_vocab = 65 if vocabulary == "char" else 50257
    ids = np.random.default_rng(0).integers(0, n_vocab, size=300_000).astype(np.uint16)
    ids[:270_000].tofile(directory / "train.bin")
    ids[270_000:].tofile(directory / "val.bin")
    if vocabulary == "char":
        chars = [chr(ord("!") + i) for i in range(n_vocab)]
        pickle.dump(
            {"vocab_size": n_vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}},
            open(directory / "meta.pkl", "wb"),
        )
    return directory


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (L, H, C, T, B, vocabulary, dropout, checkpointed) in enumerate(TRAIN_CASES):
            settings = dict(
                n_layer=L,
                n_head=H,
                n_embd=C,
                block_size=T,
                batch_size=B,
                grad_accum=1,
                max_iters=2,
                eval_iters=1,
                eval_interval=1000,
                warmup_iters=0,
                dropout=dropout,
                checkpoint_activations=checkpointed,
                device="cpu",
            )
            got = run(TRAIN, str(prepared(root, vocabulary)), str(root / f"out{i}"), json.dumps(settings))
            shape = f"train {L}x{H}x{C}, {B}x{T} tokens, {vocabulary}" + (f", dropout {dropout}" if dropout else "")
            rows.append((shape + (", checkpointed" if checkpointed else ""), got))
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from _common import random_124m

        _, model = random_124m()
        for n_rows, new in GENERATE_CASES:
            rows.append(
                (f"generate 124M, {n_rows} rows x (16 + {new}) positions", run(GENERATE, model, str(n_rows), str(new)))
            )
    table = [
        (
            name,
            f"{got['used'] / 1e6:,.0f} MB",
            f"{got['estimate'] / 1e6:,.0f} MB",
            f"{got['estimate'] / got['used']:.2f}",
        )
        for name, got in rows
    ]
    print_table(("case", "measured (peak less before)", "estimate", "estimate / measured"), table)


if __name__ == "__main__":
    main()

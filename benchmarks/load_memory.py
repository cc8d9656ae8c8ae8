"""Peak memory of loading the 124M model, against transformers loading the same files.

    .venv/bin/python benchmarks/load_memory.py

Writes a randomly initialised 124M checkpoint (safetensors, and the legacy pytorch_model.bin)
to a temporary directory, then loads it in fresh processes, one per loader, and reports each
one's peak resident memory above what its imports alone used, as a multiple of the weights'
size (124,439,808 float32 parameters = 498 MB): while loading, and after a first forward pass
(a loader that memory-maps the file lazily reads the weights only then). Linux only.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

WEIGHT_BYTES = 124_439_808 * 4

LOADERS = {
    "gpt2 GPT2.from_pretrained": "from gpt2.model.model import GPT2\nmodel = GPT2.from_pretrained(PATH, device='cpu')",
    "transformers GPT2LMHeadModel.from_pretrained": (
        "from transformers import GPT2LMHeadModel\nmodel = GPT2LMHeadModel.from_pretrained(PATH)"
    ),
}

# Imports happen before the baseline, so only the loading itself is measured. Linux keeps
# the peak resident size (VmHWM) since process start; writing 5 to clear_refs resets it.
PROBE = """
import gc, sys
import torch, transformers, safetensors, gpt2.model.model

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

# Torch's first operations set up thread pools and kernels (over 100 MB, whatever the model):
# do that before the baseline, so both loaders are measured on their loading alone.
torch.nn.functional.gelu(torch.ones(64, 64).t().contiguous() @ torch.ones(64, 64)).sum()
gc.collect()
open("/proc/self/clear_refs", "w").write("5")
baseline = status("VmRSS")
PATH = sys.argv[1]
{code}
load_peak = status("VmHWM")
with torch.no_grad():  # touch every weight: a lazily mapped file is read now
    model(torch.zeros(1, 8, dtype=torch.long))
print(load_peak - baseline, status("VmHWM") - baseline)
"""


def peak_bytes(code: str, path: Path) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code), str(path)], capture_output=True, text=True, check=True
    )
    load, forward = out.stdout.strip().splitlines()[-1].split()
    return int(load), int(forward)


def main() -> None:
    import argparse

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tf-checkpoint",
        type=Path,
        help="also load this OpenAI TensorFlow 124M checkpoint (write one with benchmarks/make_tf_124m.py)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        safetensors_dir, bin_dir = Path(tmp, "safetensors"), Path(tmp, "bin")
        model = GPT2LMHeadModel(GPT2Config())
        model.save_pretrained(safetensors_dir)
        model.config.save_pretrained(bin_dir)
        torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
        del model
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}\n"
        )
        print("| loader | format | peak while loading | / weights (498 MB) | peak after a first forward | / weights |")
        print("|---|---|---|---|---|---|")
        for name, code in LOADERS.items():
            for fmt, path in (("model.safetensors", safetensors_dir), ("pytorch_model.bin", bin_dir)):
                load, forward = peak_bytes(code, path)
                print(
                    f"| {name} | {fmt} | {load / 1e6:.0f} MB | {load / WEIGHT_BYTES:.2f}x "
                    f"| {forward / 1e6:.0f} MB | {forward / WEIGHT_BYTES:.2f}x |"
                )
        if args.tf_checkpoint:  # transformers cannot read these without TensorFlow
            load, forward = peak_bytes(LOADERS["gpt2 GPT2.from_pretrained"], args.tf_checkpoint)
            print(
                f"| gpt2 GPT2.from_pretrained | TensorFlow model.ckpt | {load / 1e6:.0f} MB | "
                f"{load / WEIGHT_BYTES:.2f}x "
                f"| {forward / 1e6:.0f} MB | {forward / WEIGHT_BYTES:.2f}x |"
            )


if __name__ == "__main__":
    main()

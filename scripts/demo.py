"""`make demo`: GPT-2 continues a prompt, with OpenAI's weights where they can be downloaded.

    python scripts/demo.py [--model NAME_OR_DIR] [PROMPT]

Where a released model's weights cannot be downloaded (no network), the same pipeline runs
on a small model with random weights, seeded so that its text is the same on every run. A
directory that is missing or broken is an error (exit 2), never a silent fallback.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gpt2.cli import main as gpt2_main
from gpt2.errors import CheckpointNotFoundError
from gpt2.weights import HUB_REPOS, download

PROMPT = "Alan Turing theorized that computers would one day become"


def random_model(directory: Path) -> str:
    """A small GPT-2 (4 layers, 256 wide) with seeded random weights, saved in `directory`."""
    import torch

    from gpt2 import GPT2, GPT2Config

    torch.manual_seed(0)  # the same weights, so the same text, on every run
    GPT2(GPT2Config(n_layer=4, n_head=4, n_embd=256)).save_pretrained(directory)
    return str(directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default=PROMPT)
    parser.add_argument("--model", default="gpt2")
    args = parser.parse_args()
    if args.model in HUB_REPOS and not Path(args.model).exists():  # a released name, as gpt2 generate reads it
        try:
            download(args.model)  # once; later runs read the Hugging Face cache
        except CheckpointNotFoundError as e:
            print(f"gpt2 demo: {e}", file=sys.stderr)
            print("gpt2 demo: so the same pipeline runs on a small model with random weights instead, seeded: "
                  "gibberish, the same on every run", file=sys.stderr)  # fmt: skip
            with tempfile.TemporaryDirectory() as scratch:
                model = random_model(Path(scratch))
                return gpt2_main(["generate", args.prompt, "--model", model, "--max-new-tokens", "40", "--seed", "0"])
    return gpt2_main(["generate", args.prompt, "--model", args.model, "--max-new-tokens", "40", "--temperature", "0"])


if __name__ == "__main__":
    raise SystemExit(main())

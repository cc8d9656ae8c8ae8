"""`make demo`: GPT-2 continues a prompt, with OpenAI's weights where they can be downloaded.

    python scripts/demo.py [--model NAME_OR_DIR] [PROMPT]

Where a released model's weights cannot be downloaded (no network), the same pipeline runs on
shakespeare_char, the small model gpt2 ships (trained on tinyshakespeare), and one line says so.
A directory that is missing or broken is an error (exit 2), never a silent fallback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt2.checkpoints.weights import HUB_REPOS, download
from gpt2.cli import main as gpt2_main
from gpt2.errors import CheckpointNotFoundError

PROMPT = "Alan Turing theorized that computers would one day become"
SHIPPED = "shakespeare_char"  # gpt2.examples.MODELS: in the package, so it needs no network


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default=PROMPT)
    parser.add_argument("--model", default="gpt2")
    args = parser.parse_args()
    if args.model in HUB_REPOS and not Path(args.model).exists():  # a released name, as gpt2 generate reads it
        try:
            download(args.model)  # once; later runs read the Hugging Face cache
        except CheckpointNotFoundError:
            print(
                f"gpt2 demo: {args.model!r} cannot be downloaded here (offline?), so {SHIPPED}, the small model of "
                f"Shakespeare's characters that gpt2 ships, continues the prompt instead",
                file=sys.stderr,
            )
            # 120 characters, sampled with a seed (greedy, a model this small repeats "the the the"): the same each run
            return gpt2_main(["generate", args.prompt, "--model", SHIPPED, "--max-new-tokens", "120", "--seed", "0"])
    return gpt2_main(["generate", args.prompt, "--model", args.model, "--max-new-tokens", "40", "--temperature", "0"])


if __name__ == "__main__":
    raise SystemExit(main())

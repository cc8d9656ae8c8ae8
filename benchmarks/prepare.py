"""`gpt2 prepare` throughput against tiktoken's encode_ordinary_batch, on the same text and cores.

    .venv/bin/python benchmarks/prepare.py [--copies N] [--rounds R] [--workers W]
    .venv/bin/python benchmarks/prepare.py --quick      # a smoke run: 2 copies, 1 round

The corpus (tinyshakespeare, or the stdlib's sources without ../shared) is written N times as
N documents. gpt2: the whole of `prepare` (reading the files in chunks, encoding on W worker
processes with our pool, writing train.bin/val.bin). tiktoken: `encode_ordinary_batch` of the
same N texts, already in memory, on W threads: the encoding alone. jsonl -> shards: the same
text as records of a JSON Lines file (a paragraph each), into llm.c's shards of 100,000 tokens.
W defaults to 2 (the cores of the machine the figures in RESULTS.md come from). Medians of R
rounds. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _common import corpus, print_table, timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import VOCAB, tiktoken_from_files  # noqa: E402

from gpt2.data.text import prepare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="our worker processes and tiktoken's threads")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 copies, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.copies, args.rounds = 2, 1
    name, text = corpus()
    cores = args.workers
    texts = [text] * args.copies
    megabytes = len(text.encode("utf-8")) * args.copies / 1e6
    enc = tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.copies):
            (Path(tmp) / "in" / f"{i:03d}.txt").parent.mkdir(exist_ok=True)
            (Path(tmp) / "in" / f"{i:03d}.txt").write_text(text, encoding="utf-8")
        with open(Path(tmp) / "pages.jsonl", "w", encoding="utf-8") as f:  # the same text, a record a paragraph
            for _ in range(args.copies):
                f.writelines(json.dumps({"text": paragraph}) + "\n" for paragraph in text.split("\n\n"))
        out = Path(tmp) / "out"
        ours, _ = timed(
            lambda: prepare([Path(tmp) / "in"], out, overwrite=True, progress=False, num_workers=cores), args.rounds
        )
        shards, _ = timed(
            lambda: prepare(
                [Path(tmp) / "pages.jsonl"],
                Path(tmp) / "shards",
                overwrite=True,
                progress=False,
                num_workers=cores,
                shard_tokens=100_000,
            ),
            args.rounds,
        )
    theirs, _ = timed(lambda: enc.encode_ordinary_batch(texts, num_threads=cores), args.rounds)
    print(f"corpus: {name}, {args.copies} copies, {megabytes:.1f} MB; {cores} workers, {os.cpu_count()} cores\n")
    print_table(
        [
            "",
            f"gpt2 prepare ({cores} processes: read, encode, write)",
            f"jsonl -> llm.c shards ({cores} processes)",
            f"tiktoken encode_ordinary_batch ({cores} threads)",
            "gpt2 / tiktoken",
        ],
        [
            [
                "MB/s",
                f"{megabytes / ours:.2f}",
                f"{megabytes / shards:.2f}",
                f"{megabytes / theirs:.2f}",
                f"{theirs / ours:.2f}x",
            ]
        ],
    )


if __name__ == "__main__":
    main()

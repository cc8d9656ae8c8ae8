"""`gpt2 prepare` throughput, and how it scales with processes, against tiktoken's encode_ordinary_batch.

    .venv/bin/python benchmarks/prepare.py [--copies N] [--rounds R] [--workers W] [--fresh]
    .venv/bin/python benchmarks/prepare.py --quick      # a smoke run: 4 copies, 1 round, 1 and 2 processes

The corpus (tinyshakespeare, as gpt2 ships it) is written N times as N text files, and as a JSON
Lines file of its paragraphs (a record each). For each count of processes P, 1 up to W (default:
the cores, os.cpu_count()):

    files -> bin     the whole of `prepare` on the N files: reading them in chunks, encoding on P
                     worker processes (one: in this process), writing train.bin and val.bin
    jsonl -> shards  the same text as records, into llm.c's shards of 1,000,000 tokens
    tiktoken         `encode_ordinary_batch` of the same N texts, already in memory, on P threads:
                     the encoding alone, tiktoken's Rust (the peer)

with each one's speed-up against its own 1, and gpt2's MB/s over tiktoken's at the same P; and for
gpt2, the CPU time a MB took, in all processes and in this one (reading, cutting, writing: what no
worker can do for it; at P processes the speed-up is at most all / this one). CPU time says what
wall time cannot on a busy machine: whether more processes cost more work, and what stays serial. Copies
of one text are what a large corpus looks like to the piece cache once warm (most pieces seen
before); --fresh makes each copy new text (its letters shifted, copy by copy), every piece a miss,
as the first pass over new text is. Medians of R rounds. Run it on a quiet machine: a busy core
says nothing of scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

from _common import corpus, print_table, timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import VOCAB, tiktoken_from_files  # noqa: E402

from gpt2.data.text import prepare  # noqa: E402


def copies_of(text: str, n: int, fresh: bool) -> list[str]:
    """n copies of text; fresh: the k-th with its ASCII letters shifted by k (new words, the same shape)."""
    if not fresh:
        return [text] * n
    low, up = string.ascii_lowercase, string.ascii_uppercase
    shifted = [str.maketrans(low + up, low[k:] + low[:k] + up[k:] + up[:k]) for k in range(26)]
    return [text.translate(shifted[k % 26]) + ("\n" * (k // 26)) for k in range(n)]


def write_corpus(directory: Path, texts: list[str]) -> tuple[Path, Path]:
    """The texts as files (directory/in/NNN.txt) and as records of directory/pages.jsonl, a paragraph each."""
    (directory / "in").mkdir()
    for i, text in enumerate(texts):
        (directory / "in" / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    with open(directory / "pages.jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            f.writelines(json.dumps({"text": paragraph}) + "\n" for paragraph in text.split("\n\n"))
    return directory / "in", directory / "pages.jsonl"


def measured(fn, rounds: int) -> tuple[float, float, float]:
    """Median seconds of `rounds` calls of fn, and the median CPU seconds each took in all processes
    (this one and the workers it waited for) and in this one."""
    walls, everywhere, here = [], [], []
    for _ in range(rounds):
        before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
        after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        cpu = [a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before)]
        everywhere.append(sum(cpu))
        here.append(cpu[0])
    return statistics.median(walls), statistics.median(everywhere), statistics.median(here)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="the most processes (ours) and threads (tiktoken's)"
    )
    parser.add_argument("--fresh", action="store_true", help="each copy new text: every piece a miss of the cache")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 copies, 1 round, 1 and 2 processes")
    args = parser.parse_args()
    if args.quick:
        args.copies, args.rounds, args.workers = 4, 1, 2
    name, text = corpus()
    texts = copies_of(text, args.copies, args.fresh)
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    enc = tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    rows, first = [], None
    with tempfile.TemporaryDirectory() as tmp:
        files, jsonl = write_corpus(Path(tmp), texts)
        # warm up first (the C kernel loaded, the piece cache of this process filled), or 1 process would pay for it
        prepare([files / "000.txt"], Path(tmp) / "warm", overwrite=True, progress=False, num_workers=1)
        enc.encode_ordinary(texts[0])
        for p in range(1, args.workers + 1):
            bins = measured(
                lambda p=p: prepare([files], Path(tmp) / "bin", overwrite=True, progress=False, num_workers=p),
                args.rounds,
            )
            shards = measured(
                lambda p=p: prepare(
                    [jsonl], Path(tmp) / "shards", overwrite=True, progress=False, num_workers=p, shard_tokens=1_000_000
                ),
                args.rounds,
            )
            theirs, _ = timed(lambda p=p: enc.encode_ordinary_batch(texts, num_threads=p), args.rounds)
            speeds = [megabytes / bins[0], megabytes / shards[0], megabytes / theirs]
            first = first or speeds
            said = [f"{s:.1f} ({s / f:.2f}x)" for s, f in zip(speeds, first)]
            cpu = [f"{1000 * ours[1] / megabytes:.0f} ({1000 * ours[2] / megabytes:.0f})" for ours in (bins, shards)]
            rows.append([str(p), said[0], cpu[0], said[1], cpu[1], said[2], f"{speeds[0] / speeds[2]:.2f}"])
    print(
        f"corpus: {name}, {args.copies} {'fresh ' if args.fresh else ''}copies, {megabytes:.1f} MB; "
        f"{os.cpu_count()} cores; medians of {args.rounds} rounds\n"
    )
    print_table(
        [
            "processes (tiktoken: threads)",
            "gpt2 prepare files -> bin, MB/s (speed-up)",
            "CPU ms a MB: all (this process)",
            "gpt2 prepare jsonl -> shards, MB/s (speed-up)",
            "CPU ms a MB: all (this process)",
            "tiktoken encode_ordinary_batch, MB/s (speed-up)",
            "gpt2 files / tiktoken",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

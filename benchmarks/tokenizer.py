"""Tokenizer speed against tiktoken, measured in the same run on the same text.

    .venv/bin/python benchmarks/tokenizer.py [--corpus PATH] [--repeat N]

Needs the dev extra (tiktoken). The corpus is the tests' own: ../shared/data/tinyshakespeare.txt
where it exists, else about 1 MB of the Python standard library's sources.
Run it on a quiet machine: another busy process skews every number here.
Prints a Markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
import tracemalloc
from pathlib import Path

import tiktoken
from _common import corpus, print_table, timed
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

import gpt2.tokenizer.core as tokenizer_core
from gpt2 import Tokenizer

REPO = Path(__file__).resolve().parents[1]
VOCAB = REPO / "src" / "gpt2" / "tokenizer" / "vocab"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="default: the tests' corpus")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.corpus is None:
        corpus_name, text = corpus()  # tinyshakespeare from ../shared, else the standard library's sources
    elif args.corpus.is_file():
        corpus_name, text = corpus_name, args.corpus.read_text(encoding="utf-8")
    else:
        sys.exit(f"corpus not found: {args.corpus} (pass --corpus PATH to a text file, or leave it out)")
    mb = len(text.encode("utf-8")) / 1e6
    rows: list[tuple[str, str, str, str]] = []

    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(VOCAB / "vocab.bpe"), encoder_json_file=str(VOCAB / "encoder.json")
    )
    ref = tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )

    start = time.perf_counter()
    ours = Tokenizer.from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    load = time.perf_counter() - start
    rows.append(("load the GPT-2 vocabulary", f"{load * 1000:.0f} ms", "", ""))

    # Cold: the first pass over the text, with our piece cache empty.
    start = time.perf_counter()
    ids = ours.encode(text)
    cold_ours = time.perf_counter() - start
    start = time.perf_counter()
    ref_ids = ref.encode_ordinary(text)
    cold_ref = time.perf_counter() - start
    assert ids == ref_ids, "token ids differ from tiktoken"
    rows.append(
        (
            "encode, 1 thread, cold (first pass)",
            f"{mb / cold_ours:.2f} MB/s",
            f"{mb / cold_ref:.2f} MB/s",
            f"{cold_ref / cold_ours:.2f}x",
        )
    )

    warm_ours, _ = timed(lambda: ours.encode(text), args.repeat)
    warm_ref, _ = timed(lambda: ref.encode_ordinary(text), args.repeat)
    rows.append(
        (
            "encode, 1 thread, warm (median)",
            f"{mb / warm_ours:.2f} MB/s",
            f"{mb / warm_ref:.2f} MB/s",
            f"{warm_ref / warm_ours:.2f}x",
        )
    )

    dec_ours, decoded = timed(lambda: ours.decode(ids), args.repeat)
    dec_ref, _ = timed(lambda: ref.decode(ids), args.repeat)
    assert decoded == text
    rows.append(
        (
            "decode (median)",
            f"{len(ids) / dec_ours / 1e6:.1f} M tokens/s",
            f"{len(ids) / dec_ref / 1e6:.1f} M tokens/s",
            f"{dec_ref / dec_ours:.2f}x",
        )
    )

    workers = os.cpu_count() or 1
    for copies in (1, 4):
        texts = text.split("\n\n") * copies
        ours.encode_batch(texts, num_workers=workers)  # start the workers and warm their caches
        batch_ours, batch_ids = timed(lambda texts=texts: ours.encode_batch(texts, num_workers=workers), 5)
        batch_ref, batch_ref_ids = timed(lambda texts=texts: ref.encode_ordinary_batch(texts, num_threads=workers), 5)
        assert batch_ids == batch_ref_ids
        serial, _ = timed(lambda texts=texts: ours.encode_batch(texts, num_workers=1), 5)
        size = f"{len(texts):,} texts, {mb * copies:.1f} MB"
        rows.append(
            (
                f"encode_batch, {workers} workers, {size} (warm, median)",
                f"{mb * copies / batch_ours:.2f} MB/s",
                f"{mb * copies / batch_ref:.2f} MB/s",
                f"{batch_ref / batch_ours:.2f}x",
            )
        )
        rows.append((f"  same, 1 worker: speed-up from {workers} workers", f"{serial / batch_ours:.2f}x", "", ""))

    start = time.perf_counter()
    trained = Tokenizer.train(text, vocab_size=4096)
    train_s = time.perf_counter() - start
    rows.append((f"train a 4,096-token vocabulary on {corpus_name}", f"{train_s:.1f} s", "", ""))
    rows.append(("  its compression: UTF-8 bytes per token", f"{mb * 1e6 / len(trained.encode(text)):.2f}", "", ""))

    # The cache's bound: 150,000 distinct words through a fresh tokenizer.
    rng = random.Random(0)
    words = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12))) for _ in range(150_000))
    fresh = Tokenizer.from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    tracemalloc.start()
    fresh.encode(words)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rows.append(
        (
            "piece cache after 150,000 distinct words",
            (
                f"{len(fresh._cache):,} entries (cap {tokenizer_core._CACHE_MAX_ENTRIES:,}), "
                f"{current / 2**20:.1f} MiB held"
            ),
            "",
            "",
        )
    )

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"tiktoken {tiktoken.__version__}; corpus {corpus_name} ({mb:.2f} MB, {len(ids):,} tokens)\n"
    )
    print_table(["measure", "gpt2", "tiktoken", "gpt2 / tiktoken throughput"], rows)


if __name__ == "__main__":
    main()

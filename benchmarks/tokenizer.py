"""Tokenizer speed against tiktoken, measured in the same run on the same text.

    .venv/bin/python benchmarks/tokenizer.py [--corpus PATH] [--repeat N] [--quick]

Needs the dev extra (tiktoken). Two corpora: the tests' (tinyshakespeare as gpt2 ships it, or
--corpus PATH) and a mixed one of another kind, about 1.5 MB of source code in several
programming languages and natural text in many languages found on this machine
(`_common.mixed_corpus`, which says what it holds). On each, one thread: the first pass
("cold", a fresh tokenizer: every distinct piece merged) and later passes ("warm", the pieces
from the tokenizer's cache), with the compiled kernel (`gpt2.tokenizer.native`) and without it
(the Python path, as GPT2_BPE_KERNEL=0 gives); tiktoken keeps no cache, so its one speed is the
peer of both. --quick: fewer repeats and batches, to check the script runs (a minute).
Run it on a quiet machine: another busy process skews every number here.
Prints a Markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import tiktoken
from _common import corpus, mixed_corpus, print_table, timed
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

import gpt2.tokenizer.core as tokenizer_core
from gpt2 import Tokenizer
from gpt2.tokenizer import native

REPO = Path(__file__).resolve().parents[1]
VOCAB = REPO / "src" / "gpt2" / "tokenizer" / "vocab"

Row = tuple[str, str, str, str]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="default: the tests' corpus")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and batches: check that it runs")
    args = parser.parse_args()
    repeat = 3 if args.quick else args.repeat
    if args.corpus is None:
        corpus_name, text = corpus()  # tinyshakespeare, as gpt2 ships it
    elif args.corpus.is_file():
        corpus_name, text = args.corpus.name, args.corpus.read_text(encoding="utf-8")
    else:
        sys.exit(f"corpus not found: {args.corpus} (pass --corpus PATH to a text file, or leave it out)")
    mixed_name, mixed = mixed_corpus()
    mb = len(text.encode("utf-8")) / 1e6
    ref = reference()

    start = time.perf_counter()
    ours = Tokenizer.from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    rows: list[Row] = [("load the GPT-2 vocabulary", f"{(time.perf_counter() - start) * 1000:.0f} ms", "", "")]
    ours.encode("")  # its kernel's tables made (about 50 ms, once a tokenizer), its cache still empty
    for name, sample in ((corpus_name.split(" (")[0], text), ("mixed", mixed)):
        rows += first_pass_rows(name, sample, ref, repeat)
    ids = ours.encode(text)
    assert ids == ref.encode_ordinary(text), "token ids differ from tiktoken"
    dec_ours, decoded = timed(lambda: ours.decode(ids), repeat)
    dec_ref, _ = timed(lambda: ref.decode(ids), repeat)
    assert decoded == text
    rows.append(
        (
            "decode (median)",
            f"{len(ids) / dec_ours / 1e6:.1f} M tokens/s",
            f"{len(ids) / dec_ref / 1e6:.1f} M tokens/s",
            f"{dec_ref / dec_ours:.2f}x",
        )
    )
    rows += batch_rows(ours, ref, text, (1,) if args.quick else (1, 4))
    rows += training_rows(text[: 200_000 if args.quick else None], corpus_name)
    rows.append(cache_row())

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"tiktoken {tiktoken.__version__}; corpus {corpus_name} ({mb:.2f} MB, {len(ids):,} tokens); "
        f"second corpus {mixed_name}\n"
        f"tokenizer kernel: {native.failure() or native.extension().__file__}\n"
    )
    print_table(["measure", "gpt2", "tiktoken", "gpt2 / tiktoken throughput"], rows)


def reference() -> tiktoken.Encoding:
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(VOCAB / "vocab.bpe"), encoder_json_file=str(VOCAB / "encoder.json")
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
        explicit_n_vocab=50257,
    )


def fresh(kernel: bool) -> Tokenizer:
    """GPT-2's vocabulary in a tokenizer of its own, its cache empty; without the kernel: the
    Python path, as GPT2_BPE_KERNEL=0 gives (set here so that both run in this process)."""
    shared = Tokenizer.gpt2()
    tokenizer = Tokenizer(shared._encoder, shared._merges, shared._special_tokens)
    tokenizer.encode("")  # the kernel's tables made, outside the timing; nothing cached
    if not kernel:
        tokenizer._native = None
    return tokenizer


def first_pass_rows(name: str, text: str, ref: tiktoken.Encoding, repeat: int) -> list[Row]:
    """Cold and warm encode of `text`, kernel on and off, one thread, against tiktoken: each cold
    pass on a fresh tokenizer, interleaved with tiktoken's passes; medians."""
    mb = len(text.encode("utf-8")) / 1e6
    expected = ref.encode_ordinary(text)
    rows = []
    for kernel in (True, False):
        cold, theirs, warm_tokenizer = [], [], None
        for _ in range(repeat):
            warm_tokenizer = fresh(kernel)
            start = time.perf_counter()
            ids = warm_tokenizer.encode(text)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            ref.encode_ordinary(text)
            theirs.append(time.perf_counter() - start)
            assert ids == expected, f"token ids differ from tiktoken on {name}"
        warm, ids = timed(lambda tokenizer=warm_tokenizer: tokenizer.encode(text), repeat)
        ref_s, _ = timed(lambda: ref.encode_ordinary(text), repeat)
        assert ids == expected
        how = "kernel" if kernel else "Python (GPT2_BPE_KERNEL=0)"
        for what, ours_s, their_s in (("cold (first pass)", cold, theirs), ("warm", [warm], [ref_s])):
            ours_s, their_s = statistics.median(ours_s), statistics.median(their_s)
            rows.append(
                (
                    f"encode, 1 thread, {what}, {how}: {name}",
                    f"{mb / ours_s:.2f} MB/s",
                    f"{mb / their_s:.2f} MB/s",
                    f"{their_s / ours_s:.2f}x",
                )
            )
    return rows


def batch_rows(ours: Tokenizer, ref: tiktoken.Encoding, text: str, copies_list: tuple[int, ...]) -> list[Row]:
    rows = []
    mb = len(text.encode("utf-8")) / 1e6
    workers = os.cpu_count() or 1
    for copies in copies_list:
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
    ours.close()
    return rows


def training_rows(text: str, corpus_name: str) -> list[Row]:
    mb = len(text.encode("utf-8")) / 1e6
    start = time.perf_counter()
    trained = Tokenizer.train(text, vocab_size=4096)
    train_s = time.perf_counter() - start
    return [
        (f"train a 4,096-token vocabulary on {mb:.2f} MB of {corpus_name}", f"{train_s:.1f} s", "", ""),
        ("  its compression: UTF-8 bytes per token", f"{mb * 1e6 / len(trained.encode(text)):.2f}", "", ""),
    ]


def cache_row() -> Row:
    """The cache's bound: 150,000 distinct words through a fresh tokenizer."""
    rng = random.Random(0)
    words = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12))) for _ in range(150_000))
    tokenizer = fresh(kernel=True)
    tracemalloc.start()
    tokenizer.encode(words)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = (
        f"{len(tokenizer._cache):,} entries (cap {tokenizer_core._CACHE_MAX_ENTRIES:,}), {current / 2**20:.1f} MiB held"
    )
    return ("piece cache after 150,000 distinct words", held, "", "")


if __name__ == "__main__":
    main()

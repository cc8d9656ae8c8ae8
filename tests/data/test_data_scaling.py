"""gpt2.data.text at scale: `gpt2 prepare`'s memory does not grow with the corpus (one file, many files into llm.c's
shards, a JSON Lines file), and what it writes is tiktoken's encoding of the text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_helpers import EOT
from helpers import corpus

from gpt2.data.corpora import HEADER_BYTES

# `gpt2 prepare` run in a child as a user runs it, a list of commands one after another, each one's
# peak resident memory (VmHWM, kB) reset before it (clear_refs 5) and read after it. Chunks of 64 kB
# rather than a MB make a corpus of a few MB many times what memory should hold (the shares in flight).
# ru_maxrss would not do: on Linux a child's counts the memory of the process that started it.
CHILD = """import json, sys
import gpt2.data.text as text_module
from gpt2.cli import main
text_module.CHUNK_BYTES = 1 << 16

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

peaks = []
for argv in json.loads(sys.argv[1]):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    assert main(argv) == 0, argv
    peaks.append(peak())
print(json.dumps(peaks))
"""

SMALL, LARGE = 3, 12  # copies of tinyshakespeare (1.1 MB): 3.3 MB and 13.4 MB


def _layouts(directory: Path, text: str, copies: int) -> list[list[str]]:
    """The corpus as one text file, as a file a copy (into shards), as a JSON Lines file of its
    paragraphs; the `gpt2 prepare` commands that prepare each."""
    directory.mkdir()
    (directory / "one.txt").write_text(text * copies, encoding="utf-8", newline="")
    (directory / "many").mkdir()
    for i in range(copies):
        (directory / "many" / f"{i:02d}.txt").write_text(text, encoding="utf-8", newline="")
    record = "".join(json.dumps({"text": p}) + "\n" for p in text.split("\n\n"))
    (directory / "pages.jsonl").write_text(record * copies, encoding="utf-8")
    flags = ["--workers", "2", "--no-progress", "--overwrite"]
    return [
        ["prepare", str(directory / "one.txt"), "--out", str(directory / "one"), *flags],
        ["prepare", str(directory / "many"), "--out", str(directory / "many-out"), "--shard-tokens", "100000", *flags],
        ["prepare", str(directory / "pages.jsonl"), "--out", str(directory / "pages"), *flags],
    ]


def _split_ids(out: Path) -> np.ndarray:
    return np.concatenate([np.fromfile(out / f"{s}.bin", dtype="<u2") for s in ("train", "val")])


def _shard_ids(out: Path) -> np.ndarray:
    """llm.c's shards read as llm.c writes them, header and all, in their order (val_000000 first)."""
    files = sorted(out.glob("*_[0-9][0-9][0-9][0-9][0-9][0-9].bin"), key=lambda p: p.name[-10:])
    return np.concatenate([np.fromfile(f, dtype="<u2", offset=HEADER_BYTES) for f in files])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux's /proc")
def test_memory_does_not_grow_with_the_corpus_and_the_ids_are_tiktokens(tmp_path, tiktoken_gpt2):
    text = corpus()[1]
    small, large = _layouts(tmp_path / "small", text, SMALL), _layouts(tmp_path / "large", text, LARGE)
    # the small corpus twice: the first time warms what a process keeps (allocator arenas, imports)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(small + small + large)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    peaks = json.loads(result.stdout)[len(small) :]
    grown_kb = (len((text * LARGE).encode()) - len((text * SMALL).encode())) / 1024
    for layout, before, after in zip(("one file", "many files", "jsonl"), peaks[:3], peaks[3:]):
        # Holding the text, its ids or a copy of a split would add about as much as the corpus grew (10 MB)
        assert after - before < grown_kb / 4, f"{layout}: peak {before} kB, then {after} kB with the corpus 4x"

    one = np.array(tiktoken_gpt2.encode_ordinary(text))
    assert tiktoken_gpt2.encode_ordinary(text + text) == one.tolist() * 2  # copies encode as copies: no cut across
    paragraphs = np.array([i for ids in tiktoken_gpt2.encode_ordinary_batch(text.split("\n\n")) for i in ids + [EOT]])
    for directory, copies in ((tmp_path / "small", SMALL), (tmp_path / "large", LARGE)):
        assert np.array_equal(_split_ids(directory / "one"), np.append(np.tile(one, copies), EOT))
        assert np.array_equal(_shard_ids(directory / "many-out"), np.tile(np.insert(one, 0, EOT), copies))
        assert np.array_equal(_split_ids(directory / "pages"), np.tile(paragraphs, copies))

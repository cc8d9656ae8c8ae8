"""The benchmarks run on a fresh clone: their corpus is the one gpt2 ships, not ../shared's."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_a_corpus_that_is_not_there_is_one_line():
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "tokenizer.py"), "--corpus", "nowhere.txt"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "corpus not found: nowhere.txt (pass --corpus PATH to a text file, or leave it out)\n"

"""The benchmarks run on a fresh clone: without ../shared they use the tests' fallback corpus."""

from __future__ import annotations

import subprocess
import sys

import helpers
from helpers import REPO


def test_without_shared_the_corpus_is_the_standard_librarys_sources(monkeypatch, tmp_path):
    monkeypatch.setattr(helpers, "SHAKESPEARE", tmp_path / "absent.txt")
    name, text = helpers.corpus()
    assert name == "the standard library's sources" and len(text) > 1_000_000
    assert text.startswith(helpers.stdlib_sources(1)[0].read_text(encoding="utf-8", errors="replace"))


def test_a_corpus_that_is_not_there_is_one_line():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tokenizer.py"), "--corpus", "nowhere.txt"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == "corpus not found: nowhere.txt (pass --corpus PATH to a text file, or leave it out)\n"

"""Shared fixtures: independent references and corpora.

`../shared` (beside the repository) is used when present; a fresh clone without it
builds its corpus from the Python standard library's own sources instead.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

# Tests never wait on the Hugging Face hub's retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
VOCAB = REPO / "src" / "gpt2" / "vocab"


def stdlib_sources(limit: int | None = None) -> list[Path]:
    """Python files of the standard library, in a fixed order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return files[:limit] if limit else files


@pytest.fixture(scope="session")
def corpus_text() -> str:
    """About 1 MB of text: tinyshakespeare if ../shared has it, else stdlib sources."""
    shakespeare = SHARED / "data" / "tinyshakespeare.txt"
    if shakespeare.is_file():
        return shakespeare.read_text(encoding="utf-8")
    text, size = [], 0
    for path in stdlib_sources():
        text.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(text[-1])
        if size > 1_000_000:
            break
    return "".join(text)


@pytest.fixture(scope="session")
def tiktoken_gpt2():
    """tiktoken's GPT-2 encoding, built offline from the packaged vocabulary files."""
    return tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")


def tiktoken_from_files(encoder_json: Path, vocab_bpe: Path, eot: int = 50256):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json))
    return tiktoken.Encoding(
        name="gpt2-reference",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": eot},
        explicit_n_vocab=len(ranks) + 1,
    )

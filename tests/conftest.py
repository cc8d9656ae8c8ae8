"""Shared fixtures: independent references and corpora (built by helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests run tiny models, on which torch's threads only wait on each other: on 2 cores, two threads
# ran the command line's tests (tests/cli/) 2x slower, and 7x when another process was busy. Set before
# torch is imported, so this process and every command the tests start run on one thread (docs/devices.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from forks import Forks  # noqa: E402
from helpers import REPO, SMALL, VOCAB, corpus, make_hf_model, tiktoken_from_files  # noqa: E402

from gpt2.data.text import prepare  # noqa: E402

# The served models and servers of tests/serve/test_serve_*.py, each started once per test run; the
# page's tests' browser.
pytest_plugins = ["serve_fixtures", "browser_fixtures"]

# Tests never wait on the Hugging Face hub's retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def forks(tmp_path_factory):
    """The `gpt2` program whose runs are forked from one process that imported torch (tests/forks.py)."""
    forks = Forks(tmp_path_factory.mktemp("forks"), REPO / "src")
    yield forks
    forks.stop()


@pytest.fixture(scope="module")
def hf_small():
    """transformers' GPT-2 of the SMALL shape, random weights (seed 0)."""
    return make_hf_model(**SMALL)


@pytest.fixture
def hf_dir(hf_small, tmp_path) -> Path:
    """hf_small saved as a Hugging Face directory."""
    hf_small.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


@pytest.fixture(scope="session")
def corpus_text() -> str:
    """tinyshakespeare, 1.1 MB, as gpt2 ships it."""
    return corpus()[1]


@pytest.fixture(scope="session")
def tiktoken_gpt2():
    """tiktoken's GPT-2 encoding, built offline from the packaged vocabulary files."""
    return tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")


@pytest.fixture(scope="session")
def real_gpt2_dir():
    """A directory with OpenAI's real GPT-2 124M weights, or skip.

    Looked for in $GPT2_WEIGHTS (a Hugging Face or OpenAI TensorFlow directory), then in the
    Hugging Face hub cache (after e.g. `gpt2 generate --model gpt2` once online).
    """
    if os.environ.get("GPT2_WEIGHTS"):
        return Path(os.environ["GPT2_WEIGHTS"])
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache("openai-community/gpt2", "model.safetensors")
        if isinstance(cached, str):
            cached_config = try_to_load_from_cache("openai-community/gpt2", "config.json")
            if isinstance(cached_config, str):
                return Path(cached).parent
    except Exception:
        pass
    pytest.skip("the real GPT-2 weights are not on this machine: set GPT2_WEIGHTS=DIR (see README)")


def prepared(tmp_path_factory, tokenizer: str, chars: int) -> Path:
    """The first `chars` characters of the corpus as one document, prepared with `tokenizer`."""
    root = tmp_path_factory.mktemp(tokenizer)
    (root / "input.txt").write_text(corpus()[1][:chars], encoding="utf-8")
    prepare([root / "input.txt"], root / "data", tokenizer, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def char_data(tmp_path_factory) -> Path:
    """About 60 kB of text, prepared as nanoGPT's shakespeare_char is (one document, 10% validation)."""
    return prepared(tmp_path_factory, "char", 60_000)


@pytest.fixture(scope="module")
def gpt2_data(tmp_path_factory) -> Path:
    """About 30 kB of text in GPT-2's ids."""
    return prepared(tmp_path_factory, "gpt2", 30_000)


# The files that take longest start first, so that under pytest-xdist (-n 2 --dist loadfile) no
# worker is left with one of them at the end while the other waits (the Makefile passes
# --no-loadscope-reorder, else xdist orders the files by their number of tests).
# The order: each file's time in one run (pytest --durations=0, summed by file; 2026-11-29), longest first.
FIRST = (
    "training/test_training_distributed.py",  # 90 s
    "test_docs.py",  # 68 s
    "training/test_training_train.py",  # 58 s
    "serve/test_serve_cluster.py",  # 45 s (2026-12-07): Ray's cluster, started twice
    "training/test_training_elastic.py",  # 20 s (2026-12-07): two torchrun agents, one killed
    "test_finetune_chat.py",  # 40 s
    "test_playground.py",  # 28 s
    "generation/test_generation_generate.py",  # 24 s
    "test_load.py",  # 22 s
    "evaluation/test_evaluation_evaluate.py",  # 20 s
    "test_examples.py",  # 20 s
    "serve/test_serve_launch.py",  # 15 s
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        path = item.path.relative_to(Path(__file__).parent).as_posix()
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order

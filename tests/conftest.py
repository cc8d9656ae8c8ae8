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


def make_hf_model(seed: int = 0, **config):
    """A randomly initialised `transformers.GPT2LMHeadModel` (the independent reference), in eval mode.

    Config keys are Hugging Face's (vocab_size, n_positions, n_embd, n_layer, n_head, ...).
    """
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    vocab = config.get("vocab_size", 50257)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(HFConfig(bos_token_id=vocab - 1, eos_token_id=vocab - 1, **config)).eval()
    with torch.no_grad():  # LayerNorms start at 1/0: perturb them so a mix-up of g and b shows
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


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

"""What gpt2 ships so that everything runs offline on a fresh clone: a corpus and a model trained on it.

- `shakespeare`: tinyshakespeare (Karpathy's char-rnn corpus, 1,115,394 characters of
  Shakespeare's plays, public domain), gzip-compressed in `embedded/`. `gpt2 prepare shakespeare`
  reads it where no file of that name is in the way.
- `shakespeare_char`: a 4-layer, 128-wide character-level model trained on it by
  `gpt2 train --recipe shakespeare_char` (`scripts/make_shakespeare_char.sh` rebuilds it), which
  `--model shakespeare_char` and `GPT2.from_pretrained("shakespeare_char")` load.

Names are looked up after paths: a directory or file called `shakespeare` is read as itself.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from gpt2.errors import DataError, UnknownModelError

EMBEDDED = Path(__file__).resolve().parent / "embedded"
CORPORA = {"shakespeare": "tinyshakespeare.txt.gz"}
MODELS = {"shakespeare_char": "shakespeare_char"}


def corpus_text(name: str) -> str:
    """The text of a shipped corpus."""
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}: gpt2 ships {', '.join(CORPORA)}")
    return gzip.decompress((EMBEDDED / CORPORA[name]).read_bytes()).decode("utf-8")


def model_directory(name: str) -> Path:
    """The directory of a shipped model (config.json, model.safetensors and its tokenizer's files)."""
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}: gpt2 ships {', '.join(MODELS)}")
    return EMBEDDED / MODELS[name]

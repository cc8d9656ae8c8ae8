"""Where a tokenizer comes from, as tiktoken's registry: a name (`gpt2`, `char`, `bpe:N`, what
`gpt2 prepare --tokenizer` takes), the directory it was saved in, or a model's vocabulary size.

`Tokenizer.gpt2()` is the shared instance of GPT-2's own vocabulary; `char` and `bpe:N` are learned
from a corpus (`gpt2.data.text.make_tokenizer`), so a name is checked here before any file is read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from gpt2.errors import InvalidArgumentError
from gpt2.tokenizer.char import CharTokenizer
from gpt2.tokenizer.core import Tokenizer
from gpt2.tokenizer.load import CHARS_FILE, read_chat_template

SPECS = "gpt2, char, or bpe:N (a byte-level BPE of N >= 257 ids trained on the corpus)"


def parse_tokenizer_spec(spec: str) -> int | None:
    """Check a tokenizer spec before any file is touched; returns N of bpe:N (else None)."""
    match = re.fullmatch(r"bpe:([0-9]+)", spec) if isinstance(spec, str) else None
    if spec not in ("gpt2", "char") and (match is None or int(match.group(1)) < 257):
        raise InvalidArgumentError(f"unknown tokenizer {spec!r}: use {SPECS}", "tokenizer")
    return int(match.group(1)) if match else None


def same_vocabulary(a: object, b: object) -> bool:
    """Whether two tokenizers map text to the same ids (whatever their chat templates)."""
    if type(a) is not type(b):
        return False
    vocabulary = lambda t: {key: value for key, value in t.__getstate__().items() if key != "chat_template"}  # noqa: E731
    return vocabulary(a) == vocabulary(b)


def assumed_tokenizer(n_vocab: int) -> Tokenizer | None:
    """The tokenizer of a model of n_vocab ids saved without one: GPT-2's for GPT-2's vocabulary, else none known."""
    return Tokenizer.gpt2() if n_vocab == Tokenizer.gpt2().n_vocab else None


def load_tokenizer(
    directory: str | os.PathLike, kind: Literal["bpe", "char"] | None = None
) -> Tokenizer | CharTokenizer | None:
    """The tokenizer saved in a directory: encoder.json + vocab.bpe (OpenAI's names), vocab.json +
    merges.txt (Hugging Face's names for the same files), or chars.json; None if none is there.
    `kind` looks for one kind's files only: "bpe" (the pairs) or "char" (chars.json).
    One file of a pair without the other raises VocabularyNotFoundError naming the missing one."""
    directory = Path(directory)
    tokenizer: Tokenizer | CharTokenizer | None = None
    if kind != "char":
        for encoder, merges in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
            if tokenizer is None and ((directory / encoder).is_file() or (directory / merges).is_file()):
                tokenizer = Tokenizer.from_files(directory / encoder, directory / merges)
    if tokenizer is None and kind != "bpe" and (directory / CHARS_FILE).is_file():
        tokenizer = CharTokenizer.from_file(directory / CHARS_FILE)
    template = None if tokenizer is None else read_chat_template(directory)
    return tokenizer if template is None else tokenizer.with_chat_template(template)

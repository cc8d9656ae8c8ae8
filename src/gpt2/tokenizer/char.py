"""A character-level vocabulary, as nanoGPT's shakespeare_char: one id per character, no merges and
no special token. It takes `Tokenizer`'s arguments (encode, encode_batch, decode, save, save_pretrained),
so that code written for one runs with the other."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import AbstractSet, Literal

from gpt2._checks import check_token_ids
from gpt2.errors import InputTypeError, TokenIdError, VocabularyError
from gpt2.tokenizer.core import CarriesChatTemplate, check_text, check_texts, id_list, special_sets
from gpt2.tokenizer.load import chat_template_entry, read_chars_file, save_chars_file, save_pretrained_chars


class CharTokenizer(CarriesChatTemplate):
    """A character-level vocabulary (nanoGPT's shakespeare_char): one id per character, in the
    order given (`from_text`: the sorted set of a corpus's characters). No <|endoftext|>."""

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        for i, c in enumerate(chars):
            if not isinstance(c, str) or len(c) != 1:
                raise VocabularyError(f"a character vocabulary holds single characters; entry {i} is {c!r}")
        if len(set(chars)) != len(chars):
            raise VocabularyError("a character vocabulary lists each character once; some are repeated")
        if not chars:
            raise VocabularyError("a character vocabulary needs at least one character")
        self._chars = chars
        self._ids = {c: i for i, c in enumerate(chars)}
        self._chat_template: str | None = None

    @classmethod
    def from_text(cls, texts: str | Iterable[str]) -> CharTokenizer:
        """The sorted set of the characters of a text, or of several."""
        seen: set[str] = set()
        for i, text in enumerate([texts] if isinstance(texts, str) else texts):
            if not isinstance(text, str):
                raise InputTypeError(f"from_text() takes a str or str texts, got {type(text).__name__} at index {i}")
            seen.update(text)
        return cls(sorted(seen))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> CharTokenizer:
        """Load the `chars.json` that `save` writes ({"chars": [...]}, ids in list order)."""
        chars = read_chars_file(path)
        try:
            return cls(chars)
        except VocabularyError as e:
            raise VocabularyError(f"{Path(path)}: {e}") from None

    @property
    def chars(self) -> list[str]:
        return list(self._chars)

    @property
    def n_vocab(self) -> int:
        return len(self._chars)

    @property
    def eot_token(self) -> None:
        """None: a character vocabulary has no end-of-text token."""
        return None

    @property
    def special_tokens(self) -> dict[str, int]:
        return {}

    def encode(
        self,
        text: str,
        *,
        allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
        disallowed_special: Collection[str] | Literal["all"] = "all",
    ) -> list[int]:
        """One id per character. `Tokenizer.encode`'s arguments, for code that takes either: with no
        special tokens, "all" is none, and "<|endoftext|>" is its characters (if the vocabulary has them)."""
        check_text("encode", text)
        special_sets((), allowed_special, disallowed_special)  # a special token's name is refused
        return self.encode_ordinary(text)

    def encode_ordinary(self, text: str) -> list[int]:
        check_text("encode_ordinary", text)
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            position = next(i for i, c in enumerate(text) if c not in self._ids)
            raise TokenIdError(
                f"character {text[position]!r} at position {position} is not in this "
                f"{self.n_vocab}-character vocabulary"
            ) from None

    def encode_batch(
        self,
        texts: Iterable[str],
        *,
        num_workers: int | None = None,
        allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
        disallowed_special: Collection[str] | Literal["all"] = "all",
    ) -> list[list[int]]:
        """`encode` each text, in this process: a lookup per character gains nothing from workers."""
        texts = check_texts(texts)
        special_sets((), allowed_special, disallowed_special)
        return [self.encode_ordinary(text) for text in texts]

    def encode_ordinary_batch(self, texts: Iterable[str], *, num_workers: int | None = None) -> list[list[int]]:
        return self.encode_batch(texts, num_workers=num_workers)

    def decode(self, ids: Iterable[int]) -> str:
        ids = id_list(ids)
        self._check_ids(ids)
        return "".join(self._chars[i] for i in ids)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.decode(ids).encode("utf-8")

    def _check_ids(self, ids: Sequence[int]) -> None:
        for position, token_id in enumerate(ids):
            if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
                raise TokenIdError(f"token ids must be integers; got {token_id!r} at position {position}")
            check_token_ids(token_id, token_id, self.n_vocab, f" at position {position}")

    def save(self, directory: str | os.PathLike) -> None:
        """Write `chars.json` into `directory` (created if needed), atomically."""
        save_chars_file(directory, self._chars)

    def save_pretrained(self, directory: str | os.PathLike, model_max_length: int | None = None) -> None:
        """Write `chars.json`, and the vocabulary as a `tokenizer.json` of the `tokenizers` library, so
        that transformers' `AutoTokenizer.from_pretrained(directory)` encodes and decodes as this does.

        The pipeline: no normalizer; a pre-tokenizer that isolates each character (a code point, as
        Python's str counts them); a WordLevel model over the characters; a decoder that joins the
        tokens as they are. Its unknown token is in no vocabulary (a character vocabulary holds single
        characters), so a character outside the vocabulary raises an error there, as it does here,
        rather than encoding as some id. `tokenizer_config.json` names no special tokens (there are
        none), asks for no clean-up of spaces when decoding, and gives `model_max_length` if given.
        Tokenizer files of another kind in `directory`, which would be read instead, are removed.
        """
        save_pretrained_chars(directory, self._chars, self.chat_template, model_max_length)

    def __repr__(self) -> str:
        return f"CharTokenizer(n_vocab={self.n_vocab})"

    def __getstate__(self) -> dict:
        return {"chars": self._chars} | chat_template_entry(self._chat_template)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["chars"])
        self._chat_template = state.get("chat_template")

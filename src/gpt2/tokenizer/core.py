"""OpenAI's GPT-2 tokenizer: byte-level byte-pair encoding (BPE), written from scratch.

Encoding a text takes three steps:

1. Pre-tokenization: a regular expression splits the text into pieces (words with
   their leading space, runs of digits, runs of punctuation, runs of whitespace,
   English contractions). BPE never merges across two pieces.
2. Each piece is turned into its UTF-8 bytes, one symbol per byte, and adjacent
   symbols are merged, lowest merge rank first, until no adjacent pair has a rank.
   Ranks come from `vocab.bpe` (line k holds merge k).
3. Each final symbol (a byte string) is looked up in `encoder.json` for its id.

Decoding is the inverse of step 3 followed by UTF-8 decoding. This module is the encoding
itself (tiktoken's core.py); the files are read and written by `load` (the methods here that
take a path are its doors), batches go to worker processes through `pool`, and `train`
learns merges with `trainer`. Steps 1 to 3 run in C where the compiled kernel `native` is at
hand (5-8x faster on new text); the Python here is the reference it is tested against, and
what encodes where the kernel is not.
"""

from __future__ import annotations

import codecs
import heapq
import os
import re
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import AbstractSet, Any, Literal, Protocol, TypeVar

import regex

from gpt2._checks import check_token_ids, positive_int
from gpt2.errors import (
    DisallowedSpecialTokenError,
    GPT2Warning,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    VocabularyError,
)
from gpt2.tokenizer.load import (
    EOT,
    GPT2_VOCAB_DIR,
    chat_template_entry,
    files_digest,
    pretrained_bpe_files,
    read_openai_files,
    save_openai_files,
    save_pretrained_bpe,
    to_file_form,
)
from gpt2.tokenizer.pool import WorkerPool, worth_workers
from gpt2.tokenizer.trainer import count_pieces, learn_merges

# GPT-2's pre-tokenization pattern, as in OpenAI's encoder.py.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The same pattern for pure-ASCII text, where \p{L} is [A-Za-z], \p{N} is [0-9] and \s is
# [\t\n\v\f\r ] (tests check this char by char). The stdlib `re` runs it about twice as
# fast as `regex` runs the Unicode pattern, and most text is ASCII.
_WS = r"\t\n\x0b\x0c\r "
_ASCII_PATTERN = re.compile(
    rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"""
)
_UNICODE_PATTERN = regex.compile(GPT2_PATTERN)

# Pieces longer than this are not cached, so that one huge "word" cannot pin memory.
_CACHE_MAX_PIECE_CHARS = 100
# Entries kept in the piece cache before it is emptied: about 20 MB at most.
_CACHE_MAX_ENTRIES = 100_000
_NOT_LOADED = object()  # a tokenizer's C kernel before its first encode


# GPT-2 gives the 256 single-byte tokens ids 0..255 in its files' table's order (printable first).
_BYTE_TOKEN_ORDER = sorted(range(256), key=lambda b: ord(to_file_form(bytes([b]))))


def _utf8(piece: str) -> bytes:
    try:
        return piece.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; like tiktoken, encode it as U+FFFD.
        return piece.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _pretokenize(text: str) -> list[str]:
    pattern = _ASCII_PATTERN if text.isascii() else _UNICODE_PATTERN
    return pattern.findall(text)


class _PieceCache(dict):
    """piece -> token ids. Emptied when full, so a long-running process stays bounded."""

    def __init__(self, compute: Callable[[str], tuple[int, ...]]):
        super().__init__()
        self._compute = compute

    def __missing__(self, piece: str) -> tuple[int, ...]:
        ids = self._compute(piece)
        if len(piece) <= _CACHE_MAX_PIECE_CHARS:
            if len(self) >= _CACHE_MAX_ENTRIES:
                self.clear()
            self[piece] = ids
        return ids


_T = TypeVar("_T", bound="CarriesChatTemplate")


class CarriesChatTemplate:
    """A tokenizer's chat template (`gpt2.tokenizer.chat`): the format of a conversation, kept with the
    vocabulary as transformers keeps it (`tokenizer_config.json`'s `chat_template`)."""

    _chat_template: str | None = None

    @property
    def chat_template(self) -> str | None:
        """The Jinja2 source of the template, or None for a tokenizer without one."""
        return self._chat_template

    def with_chat_template(self: _T, source: str | None) -> _T:
        """A copy that carries `source` as its chat template (None: none), sharing this one's
        vocabulary. A copy, never a change: `Tokenizer.gpt2()` is one instance, shared."""
        if source is not None and (not isinstance(source, str) or not source.strip()):
            raise InvalidArgumentError(f"a chat template is Jinja2 text, got {source!r}", "chat_template")
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._chat_template = source
        return copy


class Tokenizer(CarriesChatTemplate):
    """A byte-level BPE tokenizer: GPT-2's (`Tokenizer.gpt2()`) or one you trained or loaded.

    >>> enc = Tokenizer.gpt2()
    >>> enc.encode("Hello world")
    [15496, 995]
    >>> enc.decode([15496, 995])
    'Hello world'
    """

    def __init__(
        self,
        encoder: Mapping[bytes, int],
        merges: Sequence[tuple[bytes, bytes]],
        special_tokens: Mapping[str, int],
    ):
        """Build a tokenizer from token bytes -> id, merges in rank order, and special tokens.

        Ids (ordinary and special together) must be exactly 0 .. n_vocab-1, every single byte
        must be a token, and each merge's two halves and their concatenation must be tokens.
        """
        self._encoder = dict(encoder)
        self._special_tokens = dict(special_tokens)
        if EOT not in self._special_tokens:
            raise VocabularyError(f"the vocabulary has no {EOT} token; GPT-2 needs it as its end-of-text id")
        ids = sorted([*self._encoder.values(), *self._special_tokens.values()])
        if ids != list(range(len(ids))):
            missing = sorted(set(range(len(ids))) - set(ids))
            raise VocabularyError(
                f"token ids must be 0..{len(ids) - 1}, each once; "
                + (f"id {missing[0]} is missing" if missing else "some ids are repeated")
            )
        self._decoder: list[bytes] = [b""] * len(ids)
        for token, i in self._encoder.items():
            self._decoder[i] = token
        for name, i in self._special_tokens.items():
            self._decoder[i] = name.encode("utf-8")
        for b in range(256):
            if bytes([b]) not in self._encoder:
                raise VocabularyError(
                    f"byte 0x{b:02x} ({to_file_form(bytes([b]))!r}) is not a token; every byte must be"
                )
        self._merge_ranks: dict[tuple[bytes, bytes], int] = {}
        for rank, (left, right) in enumerate(merges):
            for token in (left, right, left + right):
                if token not in self._encoder:
                    raise VocabularyError(
                        f"merge {rank} ({to_file_form(left)} {to_file_form(right)}) "
                        f"names {to_file_form(token)!r}, which is not a token in the vocabulary"
                    )
            self._merge_ranks.setdefault((left, right), rank)
        self._merges = list(merges)
        self._cache = _PieceCache(self._bpe)
        self._native: Any = _NOT_LOADED  # the C kernel's tables (native.Merger), made at the first encode
        self._special_patterns: dict[frozenset[str], re.Pattern] = {}
        self._pool: WorkerPool | None = None  # encode_batch's worker processes, started when a batch is worth them
        self._chat_template: str | None = None
        self._pretrained_files: dict[str, str] | None = None  # save_pretrained's files but its config, made once

    # ----------------------------------------------------------------- files

    @classmethod
    def gpt2(cls) -> Tokenizer:
        """OpenAI's GPT-2 tokenizer (50,257 tokens), from the vocabulary shipped in the package.

        The instance is shared: later calls return it at no cost.
        """
        return _gpt2_tokenizer()

    @classmethod
    def from_files(cls, encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike) -> Tokenizer:
        """Load a vocabulary in OpenAI's two-file format (`encoder.json`, `vocab.bpe`).

        Files read before in this process, or copies of them, give the same instance at no cost
        (GPT-2's take half a second to read): a tokenizer is never changed, `with_chat_template` copies.
        """
        key = (cls, files_digest(encoder_json, vocab_bpe))
        if key not in _LOADED:
            encoder, merges, special = read_openai_files(encoder_json, vocab_bpe)
            try:
                tokenizer = cls(encoder, merges, special)
            except VocabularyError as e:
                raise VocabularyError(f"{Path(encoder_json).parent}: {e}") from None
            if len(_LOADED) >= 4:
                del _LOADED[next(iter(_LOADED))]  # the oldest
            _LOADED[key] = tokenizer
        return _LOADED[key]

    def save(self, directory: str | os.PathLike) -> None:
        """Write `encoder.json` and `vocab.bpe` into `directory` (created if needed), atomically."""
        save_openai_files(directory, self._encoder, self._merges, self._special_tokens)

    def save_pretrained(self, directory: str | os.PathLike, model_max_length: int | None = None) -> None:
        """Write the vocabulary as Hugging Face's GPT-2 directories hold it, so that transformers'
        `AutoTokenizer.from_pretrained(directory)` encodes and decodes as this tokenizer does.

        `vocab.json` and `merges.txt` are OpenAI's two files under transformers' names (which
        `load_tokenizer` reads too); `tokenizer.json` is the `tokenizers` library's whole pipeline
        (GPT-2's byte-level pre-tokenization and decoding, BPE with these merges, the special tokens);
        `tokenizer_config.json` names GPT2Tokenizer, <|endoftext|> as its bos, eos and unk token, no
        clean-up of spaces when decoding, `model_max_length` (the model's context) if given, and the
        `chat_template` if the tokenizer carries one.
        As transformers does, text that spells a special token encodes as that token there.
        Tokenizer files of another kind in `directory`, which would be read instead, are removed.
        """
        if self._pretrained_files is None:  # the same text at each save (half a second for GPT-2's), so once
            self._pretrained_files = pretrained_bpe_files(self._encoder, self._merges, self._special_tokens)
        save_pretrained_bpe(directory, self._pretrained_files, self.chat_template, model_max_length)

    # ------------------------------------------------------------- properties

    @property
    def n_vocab(self) -> int:
        """The number of token ids, special tokens included (50,257 for GPT-2)."""
        return len(self._decoder)

    @property
    def eot_token(self) -> int:
        """The id of `<|endoftext|>` (50256 for GPT-2)."""
        return self._special_tokens[EOT]

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special_tokens)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges in rank order (merge k at index k), each its two tokens' bytes."""
        return list(self._merges)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes that one token id stands for."""
        self._check_ids([token_id])
        return self._decoder[token_id]

    def token_id(self, token: bytes | str) -> int:
        """The id of one token, given as its bytes, or as a str (UTF-8 or a special token's name)."""
        if isinstance(token, str):
            if token in self._special_tokens:
                return self._special_tokens[token]
            token = token.encode("utf-8")
        if not isinstance(token, bytes):
            raise InputTypeError(f"token_id() takes bytes or str, got {type(token).__name__}")
        try:
            return self._encoder[token]
        except KeyError:
            raise InvalidArgumentError(f"{token!r} is not a single token in this vocabulary") from None

    def __repr__(self) -> str:
        return f"Tokenizer(n_vocab={self.n_vocab}, merges={len(self._merges)})"

    def __getstate__(self) -> dict:
        # The cache and compiled patterns are rebuilt on unpickling rather than shipped.
        state = {"encoder": self._encoder, "merges": self._merges, "special_tokens": self._special_tokens}
        return state | chat_template_entry(self._chat_template)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["encoder"], state["merges"], state["special_tokens"])
        self._chat_template = state.get("chat_template")

    # ---------------------------------------------------------------- encoding

    def encode(
        self,
        text: str,
        *,
        allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
        disallowed_special: Collection[str] | Literal["all"] = "all",
    ) -> list[int]:
        """Token ids of `text`, with tiktoken's rule for text that spells a special token
        (e.g. "<|endoftext|>"): a token `allowed_special` names ("all": every one) becomes its
        id; one `disallowed_special` names ("all", the default: every one not allowed) raises
        DisallowedSpecialTokenError (tiktoken's ValueError); any other stays its characters, as
        with `disallowed_special=()` or `encode_ordinary`.
        """
        check_text("encode", text)
        allowed, disallowed = special_sets(self._special_tokens, allowed_special, disallowed_special)
        self._check_disallowed(text, disallowed)
        return self._encode_allowed(text, allowed)

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text`, special-token text read as its characters (tiktoken's `encode_ordinary`)."""
        check_text("encode_ordinary", text)
        return self._encode_ordinary(text)

    def encode_batch(
        self,
        texts: Iterable[str],
        *,
        num_workers: int | None = None,
        allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
        disallowed_special: Collection[str] | Literal["all"] = "all",
    ) -> list[list[int]]:
        """`encode` each text, in `num_workers` processes (default: one per core)."""
        texts = check_texts(texts)
        allowed, disallowed = special_sets(self._special_tokens, allowed_special, disallowed_special)
        for text in texts:  # the first text to raise raises, as in tiktoken, before any work
            self._check_disallowed(text, disallowed)
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        positive_int("num_workers", num_workers)
        if not worth_workers(texts, num_workers):
            return [self._encode_allowed(text, allowed) for text in texts]
        if self._pool is None:
            self._pool = WorkerPool(self._encode_allowed)
        return self._pool.encode_batch(texts, allowed, num_workers)

    def encode_ordinary_batch(self, texts: Iterable[str], *, num_workers: int | None = None) -> list[list[int]]:
        """`encode_ordinary` each text, in `num_workers` processes (default: one per core)."""
        return self.encode_batch(texts, num_workers=num_workers, disallowed_special=())

    def _special_pattern(self, tokens: frozenset[str]) -> re.Pattern:
        pattern = self._special_patterns.get(tokens)
        if pattern is None:  # longest first, so that a token never matches inside a longer one
            pattern = re.compile("|".join(re.escape(s) for s in sorted(tokens, key=len, reverse=True)))
            self._special_patterns[tokens] = pattern
        return pattern

    def _check_disallowed(self, text: str, disallowed: frozenset[str]) -> None:
        if disallowed and (match := self._special_pattern(disallowed).search(text)):
            raise DisallowedSpecialTokenError(disallowed_special_message(match.group()))

    def _encode_allowed(self, text: str, allowed: frozenset[str]) -> list[int]:
        """Ids of `text` with the special tokens in `allowed` read as such, the rest as characters."""
        if not allowed:
            return self._encode_ordinary(text)
        ids: list[int] = []
        for part, special in self._split_special(text, allowed):
            ids += [self._special_tokens[part]] if special else self._encode_ordinary(part)
        return ids

    def _split_special(self, text: str, allowed: frozenset[str]) -> Iterator[tuple[str, bool]]:
        """`text` as (part, is it a special token of `allowed`), in order: the text between them ordinary."""
        start = 0
        if allowed:
            for match in self._special_pattern(allowed).finditer(text):
                yield text[start : match.start()], False
                yield match.group(), True
                start = match.end()
        yield text[start:], False

    def merge_steps(
        self, text: str, *, allowed_special: AbstractSet[str] | Literal["all"] = frozenset()
    ) -> list[dict[str, Any]]:
        """How `encode` got its tokens, for each pre-tokenized piece of `text`: {"word": the piece,
        "merges": [its bytes, then the pieces after each merge, ..., its tokens]}, each piece written
        as vocab.bpe writes it (GPT-2's byte-to-unicode letters: " world" is "Ġworld"). Each step
        merges one adjacent pair, the pair of lowest rank in vocab.bpe, the leftmost on a tie: the
        rule `_bpe` follows with its heap, written out plainly. A special token of `allowed_special`
        is a piece of one step."""
        check_text("merge_steps", text)
        allowed, _ = special_sets(self._special_tokens, allowed_special, ())
        words: list[dict[str, Any]] = []
        for part, special in self._split_special(text, allowed):
            if special:
                words.append({"word": part, "merges": [[part]]})
                continue
            for piece in _pretokenize(part):
                steps = [[bytes([b]) for b in _utf8(piece)]]
                while (best := self._lowest_pair(steps[-1])) is not None:
                    parts = steps[-1]
                    steps.append(parts[:best] + [parts[best] + parts[best + 1]] + parts[best + 2 :])
                words.append({"word": piece, "merges": [[to_file_form(p) for p in parts] for parts in steps]})
        return words

    def _lowest_pair(self, parts: list[bytes]) -> int | None:
        """The index of the adjacent pair of `parts` that BPE merges next (lowest rank, leftmost), None if none."""
        ranked = [
            (rank, i)
            for i in range(len(parts) - 1)
            if (rank := self._merge_ranks.get((parts[i], parts[i + 1]))) is not None
        ]
        return min(ranked)[1] if ranked else None

    def close(self) -> None:
        """Stop the worker processes of `encode_batch`, if any (they also stop at exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _encode_ordinary(self, text: str) -> list[int]:
        merger = self._native if self._native is not _NOT_LOADED else self._load_native()
        if merger is not None:  # the same steps in C, filling the same cache
            return merger.encode(text, self._cache, _CACHE_MAX_PIECE_CHARS, _CACHE_MAX_ENTRIES)
        return list(chain.from_iterable(map(self._cache.__getitem__, _pretokenize(text))))

    def _load_native(self) -> Any:
        """The C kernel's tables for this vocabulary (None where the kernel is off or cannot be built).
        Made in each process: a copy unpickled makes its own, a forked worker inherits them."""
        # Imported here, at the first encode, not with the package: so `python -m gpt2.tokenizer.native`
        # (set-up's build) runs the module once, as __main__, rather than beside a copy already imported.
        from gpt2.tokenizer import native

        self._native = native.merger(self._encoder, self._merges, _utf8)
        return self._native

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized piece: merge its bytes, lowest rank first.

        Symbols form a linked list over byte positions, and a heap holds (rank, position)
        of each mergeable adjacent pair, so a piece of n bytes costs O(n log n) rather than
        the O(n^2) of rescanning all pairs after each merge. Equal ranks merge left first.
        The reference of the kernel's merges (`native`), and what merges where it is not.
        """
        data = _utf8(piece)
        n = len(data)
        parts: list[bytes | None] = [data[i : i + 1] for i in range(n)]
        if n == 1:
            return (self._encoder[data],)
        ranks = self._merge_ranks
        next_ = list(range(1, n + 1))  # index of the next live symbol; n means none
        prev = list(range(-1, n - 1))  # index of the previous live symbol; -1 means none
        heap = [(rank, i) for i in range(n - 1) if (rank := ranks.get((parts[i], parts[i + 1]))) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i = heapq.heappop(heap)
            j = next_[i]
            if parts[i] is None or j == n or ranks.get((parts[i], parts[j])) != rank:
                continue  # stale: a side of this pair has been merged into something else
            parts[i] += parts[j]
            parts[j] = None
            next_[i] = k = next_[j]
            if k < n:
                prev[k] = i
                if (rank := ranks.get((parts[i], parts[k]))) is not None:
                    heapq.heappush(heap, (rank, i))
            h = prev[i]
            if h >= 0 and (rank := ranks.get((parts[h], parts[i]))) is not None:
                heapq.heappush(heap, (rank, h))
        return tuple(self._encoder[part] for part in parts if part is not None)

    # ---------------------------------------------------------------- decoding

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes that `ids` stand for, concatenated (ids: as `decode` takes them)."""
        ids = id_list(ids)
        try:
            if ids and min(ids) < 0:
                raise IndexError
            return b"".join(map(self._decoder.__getitem__, ids))
        except (IndexError, TypeError):
            self._check_ids(ids)
            raise

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`: a list (or any iterable) of ints, or a 1-D tensor or NumPy array of
        integers, as in `enc.decode(model.generate(idx)[0])`. Bytes that are not valid UTF-8
        become U+FFFD, as in OpenAI's decoder."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Yield text as ids arrive, holding back the bytes of an unfinished UTF-8 character."""
        decoder = IncrementalDecoder(self)
        for token_id in ids:
            if text := decoder.add([token_id]):
                yield text
        if text := decoder.flush():
            yield text

    def _check_ids(self, ids: Iterable[int]) -> None:
        for position, token_id in enumerate(ids):
            if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
                raise TokenIdError(f"token ids must be integers; got {token_id!r} at position {position}")
            check_token_ids(int(token_id), int(token_id), self.n_vocab, f" at position {position}")

    # ---------------------------------------------------------------- training

    @classmethod
    def train(cls, corpus: str | Iterable[str], vocab_size: int, *, progress: bool = False) -> Tokenizer:
        """Learn a byte-level BPE vocabulary of `vocab_size` ids from `corpus` (a text or texts).

        The ids are laid out as GPT-2's: 256 byte tokens, then one token per merge in the
        order learned, then `<|endoftext|>` last, so `vocab_size` counts all three.
        Each step merges the most frequent adjacent pair (ties: the smaller bytes first);
        pair counts are updated only in the words that contain the merged pair (`gpt2.tokenizer.trainer`).
        If the corpus runs out of pairs first, the vocabulary is smaller (with a warning).
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise InputTypeError(f"vocab_size must be an integer, got {vocab_size!r}")
        if vocab_size < 257:
            raise InvalidArgumentError(f"vocab_size must be at least 257 (256 byte tokens and {EOT}), got {vocab_size}")
        pieces = count_pieces(corpus, _pretokenize)
        merges = learn_merges([(_utf8(piece), n) for piece, n in pieces.items()], vocab_size - 257, progress)
        if len(merges) < vocab_size - 257:
            warnings.warn(
                f"the corpus ran out of pairs to merge after {len(merges)} merges: "
                f"the vocabulary has {257 + len(merges)} ids, not {vocab_size}",
                GPT2Warning,
                stacklevel=2,
            )
        encoder = {bytes([b]): i for i, b in enumerate(_BYTE_TOKEN_ORDER)}
        for a, b in merges:
            encoder[a + b] = len(encoder)
        return cls(encoder, merges, {EOT: len(encoder)})


def id_list(ids: Iterable[int]) -> list[int] | tuple[int, ...]:
    """Token ids as a list (or tuple), from whatever `decode` takes; a clear error for the rest."""
    if isinstance(ids, (list, tuple)):
        return ids
    if isinstance(ids, (str, bytes, bytearray)):
        raise InputTypeError(f"decode() takes token ids, not {type(ids).__name__}: to get ids from text, use encode()")
    ndim = getattr(ids, "ndim", None)  # a torch tensor or a NumPy array, without importing either
    if isinstance(ndim, int) and hasattr(ids, "tolist"):
        if ndim == 1:
            return ids.tolist()
        shape = list(getattr(ids, "shape", ()))
        hint = "wrap one id in a list, decode([id])" if ndim == 0 else "pick one row, e.g. decode(ids[0])"
        raise InputTypeError(f"decode() takes one sequence of ids (1-D), got {ndim}-D ids of shape {shape}: {hint}")
    if hasattr(ids, "__index__"):
        raise InputTypeError(
            f"decode() takes a sequence of token ids, got one {type(ids).__name__}: use decode([{ids!r}])"
        )
    try:
        return list(ids)
    except TypeError:
        raise InputTypeError(
            f"decode() takes a list of token ids (ints), or a 1-D tensor or array of them, got {type(ids).__name__}"
        ) from None


class DecodesBytes(Protocol):
    """What streaming and log-probabilities need of a tokenizer (`Tokenizer` or `CharTokenizer`)."""

    def decode_bytes(self, ids: Iterable[int]) -> bytes: ...


def token_text(tokenizer: DecodesBytes, token: int) -> str:
    """One token as OpenAI's API shows it in log-probabilities: its text, or "bytes:\\xNN" where
    it is part of a character."""
    raw = tokenizer.decode_bytes([token])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class IncrementalDecoder:
    """Turns token ids into text piece by piece, for streaming.

    A character whose UTF-8 bytes are split across tokens (emoji, CJK) is held back until
    its last byte arrives, so no piece ends in half a character. The concatenation of all
    pieces and `flush()` equals `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: DecodesBytes):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, ids: Iterable[int]) -> str:
        """Text completed by `ids` (may be empty while a character is unfinished)."""
        return self._utf8.decode(self._tokenizer.decode_bytes(ids))

    def flush(self) -> str:
        """Text still held back (an unfinished character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def check_text(function: str, text: object) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes first, e.g. data.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise InputTypeError(f"{function}() takes a str, got {type(text).__name__}{hint}")


def check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, (str, bytes, bytearray)):
        raise InputTypeError(
            f"encode_batch() takes a list of texts, got one {type(texts).__name__}: "
            f"for one text, use encode(text) or encode_batch([text])"
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputTypeError(f"encode_batch() takes str texts, got {type(text).__name__} at index {i}")
    return texts


def special_sets(
    special_tokens: Iterable[str],
    allowed_special: AbstractSet[str] | Literal["all"],
    disallowed_special: Collection[str] | Literal["all"],
) -> tuple[frozenset[str], frozenset[str]]:
    """(allowed, disallowed) special tokens, as tiktoken's `encode` reads its two arguments:
    "all" allowed is every special token; "all" disallowed, every one not allowed. A name the
    vocabulary lacks is refused (tiktoken ignores it)."""
    special = frozenset(special_tokens)
    allowed = special if allowed_special == "all" else _token_names("allowed_special", allowed_special, special)
    if disallowed_special == "all":
        return allowed, special - allowed
    return allowed, _token_names("disallowed_special", disallowed_special, special)


def _token_names(param: str, names: object, special: frozenset[str]) -> frozenset[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, (AbstractSet, list, tuple)):
        raise InvalidArgumentError(f"{param} must be a set of special tokens or 'all', got {names!r}", param)
    unknown = set(names) - special
    if unknown:
        raise InvalidArgumentError(
            f"{param}: unknown special token(s) {sorted(unknown)}; this vocabulary has {sorted(special)}", param
        )
    return frozenset(names)


def disallowed_special_message(token: str) -> str:
    """tiktoken's message (core.py's `raise_disallowed_special_token`), word for word."""
    return (
        f"Encountered text corresponding to disallowed special token {token!r}.\n"
        "If you want this text to be encoded as a special token, "
        f"pass it to `allowed_special`, e.g. `allowed_special={{{token!r}, ...}}`.\n"
        f"If you want this text to be encoded as normal text, disable the check for this token "
        f"by passing `disallowed_special=(enc.special_tokens_set - {{{token!r}}})`.\n"
        "To disable this check for all special tokens, pass `disallowed_special=()`.\n"
    )


# The tokenizers `Tokenizer.from_files` read, by class and files' contents.
_LOADED: dict[tuple[type, bytes], Tokenizer] = {}


@lru_cache(maxsize=1)
def _gpt2_tokenizer() -> Tokenizer:
    return Tokenizer.from_files(GPT2_VOCAB_DIR / "encoder.json", GPT2_VOCAB_DIR / "vocab.bpe")

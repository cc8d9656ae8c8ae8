"""OpenAI's GPT-2 tokenizer: byte-level byte-pair encoding (BPE), written from scratch.

Encoding a text takes three steps:

1. Pre-tokenization: a regular expression splits the text into pieces (words with
   their leading space, runs of digits, runs of punctuation, runs of whitespace,
   English contractions). BPE never merges across two pieces.
2. Each piece is turned into its UTF-8 bytes, one symbol per byte, and adjacent
   symbols are merged, lowest merge rank first, until no adjacent pair has a rank.
   Ranks come from `vocab.bpe` (line k holds merge k).
3. Each final symbol (a byte string) is looked up in `encoder.json` for its id.

The two files store bytes as printable characters (GPT-2's `bytes_to_unicode` table,
e.g. the space byte 0x20 is written "Ġ"), so that they are valid text. Decoding is
the inverse of step 3 followed by UTF-8 decoding.
"""

from __future__ import annotations

import codecs
import gc
import heapq
import json
import multiprocessing
import os
import re
import warnings
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import AbstractSet, Literal, TypeVar

import regex

from gpt2._checks import check_token_ids, positive_int
from gpt2._files import atomic_write_text, read_json_object, writable_directory
from gpt2.bpe_trainer import count_pieces, learn_merges
from gpt2.errors import (
    DisallowedSpecialTokenError,
    GPT2Warning,
    InputTypeError,
    InvalidArgumentError,
    TokenIdError,
    VocabularyError,
    VocabularyNotFoundError,
)

EOT = "<|endoftext|>"

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
# Below this many characters in total, encode_batch does not start worker processes.
_PARALLEL_MIN_CHARS = 1_000_000


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte value to a printable character, used in the vocab files.

    Printable Latin-1 bytes stand for themselves; the 68 others (control codes, space,
    and a few more) are shifted to code points 256 and up, in order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# GPT-2 gives the 256 single-byte tokens ids 0..255 in this table's order (printable first).
_BYTE_TOKEN_ORDER = sorted(range(256), key=lambda b: ord(_BYTE_TO_CHAR[b]))


def _to_file_form(token: bytes) -> str:
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def _from_file_form(text: str) -> bytes:
    return bytes(_CHAR_TO_BYTE[c] for c in text)


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
    """A tokenizer's chat template (`gpt2.chat`): the format of a conversation, kept with the
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
                raise VocabularyError(f"byte 0x{b:02x} ({_BYTE_TO_CHAR[b]!r}) is not a token; every byte must be")
        self._merge_ranks: dict[tuple[bytes, bytes], int] = {}
        for rank, (left, right) in enumerate(merges):
            for token in (left, right, left + right):
                if token not in self._encoder:
                    raise VocabularyError(
                        f"merge {rank} ({_to_file_form(left)} {_to_file_form(right)}) "
                        f"names {_to_file_form(token)!r}, which is not a token in the vocabulary"
                    )
            self._merge_ranks.setdefault((left, right), rank)
        self._merges = list(merges)
        self._cache = _PieceCache(self._bpe)
        self._special_patterns: dict[frozenset[str], re.Pattern] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._pool_size = 0
        self._chat_template: str | None = None

    # ----------------------------------------------------------------- loading

    @classmethod
    def gpt2(cls) -> Tokenizer:
        """OpenAI's GPT-2 tokenizer (50,257 tokens), from the vocabulary shipped in the package.

        The instance is shared: later calls return it at no cost.
        """
        return _gpt2_tokenizer()

    @classmethod
    def from_files(cls, encoder_json: str | os.PathLike, vocab_bpe: str | os.PathLike) -> Tokenizer:
        """Load a vocabulary in OpenAI's two-file format (`encoder.json`, `vocab.bpe`)."""
        encoder_json, vocab_bpe = Path(encoder_json), Path(vocab_bpe)
        for path in (encoder_json, vocab_bpe):
            if not path.is_file():
                raise VocabularyNotFoundError(f"vocabulary file not found: {path}")
        raw_encoder = read_json_object(encoder_json, VocabularyError, "a JSON object of token -> id")
        encoder: dict[bytes, int] = {}
        special: dict[str, int] = {}
        for text, i in raw_encoder.items():
            if isinstance(i, bool) or not isinstance(i, int):
                raise VocabularyError(f"{encoder_json}: token {text!r} has id {i!r}, which is not an integer")
            if text == EOT:
                special[text] = i
                continue
            try:
                encoder[_from_file_form(text)] = i
            except KeyError:
                raise VocabularyError(
                    f"{encoder_json}: token {text!r} has characters outside GPT-2's byte alphabet"
                ) from None
        try:
            lines = vocab_bpe.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise VocabularyError(f"{vocab_bpe} is not UTF-8 text: {e}") from None
        merges = []
        for number, line in enumerate(lines, start=1):
            if not line or line.startswith("#version"):
                continue
            halves = line.split(" ")
            if len(halves) != 2 or not all(halves):
                raise VocabularyError(f"{vocab_bpe}, line {number}: expected two tokens separated by a space, got {line!r}")
            try:
                merges.append((_from_file_form(halves[0]), _from_file_form(halves[1])))
            except KeyError:
                raise VocabularyError(
                    f"{vocab_bpe}, line {number}: {line!r} has characters outside GPT-2's byte alphabet"
                ) from None
        try:
            return cls(encoder, merges, special)
        except VocabularyError as e:
            raise VocabularyError(f"{encoder_json.parent}: {e}") from None

    def save(self, directory: str | os.PathLike) -> None:
        """Write `encoder.json` and `vocab.bpe` into `directory` (created if needed), atomically."""
        directory = writable_directory(directory)
        atomic_write_text(directory / "encoder.json", json.dumps(self._file_vocabulary()))
        atomic_write_text(directory / "vocab.bpe", "#version: 0.2\n" + "".join(line + "\n" for line in self._merge_lines()))

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
        vocabulary, merges = self._file_vocabulary(), self._merge_lines()
        special = sorted(self._special_tokens.items(), key=lambda item: item[1])
        pipeline = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for name, i in special],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocabulary, "merges": merges},
        }  # fmt: skip
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
                  "add_prefix_space": False, "clean_up_tokenization_spaces": False, "errors": "replace",
                  **_chat_template_entry(self.chat_template)}  # fmt: skip
        files = {
            "vocab.json": json.dumps(vocabulary, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "".join(line + "\n" for line in merges),
            "tokenizer.json": json.dumps(pipeline, ensure_ascii=False),
        }
        _write_pretrained(directory, files, config, model_max_length)

    def _file_vocabulary(self) -> dict[str, int]:
        """Token (in the files' printable form, or a special token's name) -> id, in id order."""
        vocabulary = {_to_file_form(token): i for token, i in self._encoder.items()}
        vocabulary.update(self._special_tokens)
        return dict(sorted(vocabulary.items(), key=lambda item: item[1]))

    def _merge_lines(self) -> list[str]:
        """The merges in rank order, each as the two tokens' printable forms joined by a space."""
        return [f"{_to_file_form(a)} {_to_file_form(b)}" for a, b in self._merges]

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
        return state | _chat_template_entry(self._chat_template)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["encoder"], state["merges"], state["special_tokens"])
        self._chat_template = state.get("chat_template")

    # ---------------------------------------------------------------- encoding

    def encode(self, text: str, *, allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
               disallowed_special: Collection[str] | Literal["all"] = "all") -> list[int]:  # fmt: skip
        """Token ids of `text`, with tiktoken's rule for text that spells a special token
        (e.g. "<|endoftext|>"): a token `allowed_special` names ("all": every one) becomes its
        id; one `disallowed_special` names ("all", the default: every one not allowed) raises
        DisallowedSpecialTokenError (tiktoken's ValueError); any other stays its characters, as
        with `disallowed_special=()` or `encode_ordinary`.
        """
        _check_text("encode", text)
        allowed, disallowed = special_sets(self._special_tokens, allowed_special, disallowed_special)
        self._check_disallowed(text, disallowed)
        return self._encode_allowed(text, allowed)

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of `text`, special-token text read as its characters (tiktoken's `encode_ordinary`)."""
        _check_text("encode_ordinary", text)
        return self._encode_ordinary(text)

    def encode_batch(self, texts: Iterable[str], *, num_workers: int | None = None,
                     allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
                     disallowed_special: Collection[str] | Literal["all"] = "all") -> list[list[int]]:  # fmt: skip
        """`encode` each text, in `num_workers` processes (default: one per core)."""
        texts = _check_texts(texts)
        allowed, disallowed = special_sets(self._special_tokens, allowed_special, disallowed_special)
        for text in texts:  # the first text to raise raises, as in tiktoken, before any work
            self._check_disallowed(text, disallowed)
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        positive_int("num_workers", num_workers)
        num_workers = min(num_workers, len(texts))
        if num_workers <= 1 or sum(map(len, texts)) < _PARALLEL_MIN_CHARS:
            return [self._encode_allowed(text, allowed) for text in texts]
        shares = _split_by_length(texts, num_workers)
        pool = self._worker_pool(num_workers - 1)
        futures = [pool.submit(_encode_share, share, allowed) for share in shares[1:]]
        results = [self._encode_allowed(text, allowed) for text in shares[0]]  # this process works too
        for future in futures:
            results += _unpack_ids(*future.result())
        return results

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
        start = 0
        for match in self._special_pattern(allowed).finditer(text):
            ids += self._encode_ordinary(text[start : match.start()])
            ids.append(self._special_tokens[match.group()])
            start = match.end()
        ids += self._encode_ordinary(text[start:])
        return ids

    def _worker_pool(self, size: int) -> ProcessPoolExecutor:
        """Worker processes kept for later batches, so their piece caches stay warm."""
        if self._pool is None or self._pool_size != size:
            self.close()
            # fork hands the workers this tokenizer (and its warm cache) without pickling it.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(method)
            self._pool = ProcessPoolExecutor(size, context, initializer=_init_worker, initargs=(self,))
            self._pool_size = size
        return self._pool

    def close(self) -> None:
        """Stop the worker processes of `encode_batch`, if any (they also stop at exit)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _encode_ordinary(self, text: str) -> list[int]:
        return list(chain.from_iterable(map(self._cache.__getitem__, _pretokenize(text))))

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized piece: merge its bytes, lowest rank first.

        Symbols form a linked list over byte positions, and a heap holds (rank, position)
        of each mergeable adjacent pair, so a piece of n bytes costs O(n log n) rather than
        the O(n^2) of rescanning all pairs after each merge. Equal ranks merge left first.
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
        ids = _id_list(ids)
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
        pair counts are updated only in the words that contain the merged pair (`gpt2.bpe_trainer`).
        If the corpus runs out of pairs first, the vocabulary is smaller (with a warning).
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise InputTypeError(f"vocab_size must be an integer, got {vocab_size!r}")
        if vocab_size < 257:
            raise InvalidArgumentError(
                f"vocab_size must be at least 257 (256 byte tokens and {EOT}), got {vocab_size}"
            )
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


def _id_list(ids: Iterable[int]) -> list[int] | tuple[int, ...]:
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
        raise InputTypeError(f"decode() takes a sequence of token ids, got one {type(ids).__name__}: use decode([{ids!r}])")
    try:
        return list(ids)
    except TypeError:
        raise InputTypeError(
            f"decode() takes a list of token ids (ints), or a 1-D tensor or array of them, got {type(ids).__name__}"
        ) from None


def token_text(tokenizer: Tokenizer | CharTokenizer, token: int) -> str:
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

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, ids: Iterable[int]) -> str:
        """Text completed by `ids` (may be empty while a character is unfinished)."""
        return self._utf8.decode(self._tokenizer.decode_bytes(ids))

    def flush(self) -> str:
        """Text still held back (an unfinished character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def _check_text(function: str, text: object) -> None:
    if not isinstance(text, str):
        hint = " (decode bytes first, e.g. data.decode('utf-8'))" if isinstance(text, (bytes, bytearray)) else ""
        raise InputTypeError(f"{function}() takes a str, got {type(text).__name__}{hint}")


def _check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, (str, bytes, bytearray)):
        raise InputTypeError(f"encode_batch() takes a list of texts, got one {type(texts).__name__}: "
                             f"for one text, use encode(text) or encode_batch([text])")  # fmt: skip
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputTypeError(f"encode_batch() takes str texts, got {type(text).__name__} at index {i}")
    return texts


def special_sets(special_tokens: Iterable[str], allowed_special: AbstractSet[str] | Literal["all"],
                 disallowed_special: Collection[str] | Literal["all"]) -> tuple[frozenset[str], frozenset[str]]:  # fmt: skip
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
        raise InvalidArgumentError(f"{param}: unknown special token(s) {sorted(unknown)}; "
                                   f"this vocabulary has {sorted(special)}", param)  # fmt: skip
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


GPT2_VOCAB_DIR = Path(__file__).parent / "vocab"  # OpenAI's encoder.json and vocab.bpe, as released


@lru_cache(maxsize=1)
def _gpt2_tokenizer() -> Tokenizer:
    return Tokenizer.from_files(GPT2_VOCAB_DIR / "encoder.json", GPT2_VOCAB_DIR / "vocab.bpe")


_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer
    tokenizer._pool = None  # a worker's copy owns no pool of its own


def _encode_share(texts: list[str], allowed: frozenset[str]) -> tuple[array, array]:
    """Encode texts in a worker; ids travel back packed, as pickling lists of ints is slow."""
    assert _worker_tokenizer is not None
    encoded = [_worker_tokenizer._encode_allowed(text, allowed) for text in texts]
    return array("q", map(len, encoded)), array("I", chain.from_iterable(encoded))


def _unpack_ids(lengths: array, flat: array) -> list[list[int]]:
    # Making thousands of lists would trigger full garbage collections over the whole heap
    # (the piece cache included), which cost more than the unpacking; none is needed here.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ids, out, start = flat.tolist(), [], 0
        for n in lengths:
            out.append(ids[start : start + n])
            start += n
        return out
    finally:
        if gc_was_enabled:
            gc.enable()


def _split_by_length(texts: list[str], n: int) -> list[list[str]]:
    """`n` contiguous runs of `texts` holding about equal numbers of characters."""
    total = sum(map(len, texts))
    shares: list[list[str]] = [[] for _ in range(n)]
    seen = 0
    for text in texts:
        shares[min(n - 1, seen * n // max(total, 1))].append(text)
        seen += len(text)
    return shares


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
        path = Path(path)
        if not path.is_file():
            raise VocabularyNotFoundError(f"vocabulary file not found: {path}")
        data = read_json_object(path, VocabularyError, 'a JSON object {"chars": [...]}')
        if not isinstance(data.get("chars"), list):
            raise VocabularyError(f"{path} must hold a list of characters under \"chars\"")
        try:
            return cls(data["chars"])
        except VocabularyError as e:
            raise VocabularyError(f"{path}: {e}") from None

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

    def encode(self, text: str, *, allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
               disallowed_special: Collection[str] | Literal["all"] = "all") -> list[int]:  # fmt: skip
        """One id per character. `Tokenizer.encode`'s arguments, for code that takes either: with no
        special tokens, "all" is none, and "<|endoftext|>" is its characters (if the vocabulary has them)."""
        _check_text("encode", text)
        special_sets((), allowed_special, disallowed_special)  # a special token's name is refused
        return self.encode_ordinary(text)

    def encode_ordinary(self, text: str) -> list[int]:
        _check_text("encode_ordinary", text)
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            position = next(i for i, c in enumerate(text) if c not in self._ids)
            raise TokenIdError(f"character {text[position]!r} at position {position} is not in this "
                               f"{self.n_vocab}-character vocabulary") from None  # fmt: skip

    def encode_batch(self, texts: Iterable[str], *, num_workers: int | None = None,
                     allowed_special: AbstractSet[str] | Literal["all"] = frozenset(),
                     disallowed_special: Collection[str] | Literal["all"] = "all") -> list[list[int]]:  # fmt: skip
        """`encode` each text, in this process: a lookup per character gains nothing from workers."""
        texts = _check_texts(texts)
        special_sets((), allowed_special, disallowed_special)
        return [self.encode_ordinary(text) for text in texts]

    def encode_ordinary_batch(self, texts: Iterable[str], *, num_workers: int | None = None) -> list[list[int]]:
        return self.encode_batch(texts, num_workers=num_workers)

    def decode(self, ids: Iterable[int]) -> str:
        ids = _id_list(ids)
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
        directory = writable_directory(directory)
        atomic_write_text(directory / CHARS_FILE, json.dumps({"chars": self._chars}, ensure_ascii=False) + "\n")

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
        pipeline = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": self._ids, "unk_token": "<unknown character>"},
        }  # fmt: skip
        files = {
            CHARS_FILE: json.dumps({"chars": self._chars}, ensure_ascii=False) + "\n",
            "tokenizer.json": json.dumps(pipeline, ensure_ascii=False),
        }
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  **_chat_template_entry(self.chat_template)}  # fmt: skip
        _write_pretrained(directory, files, config, model_max_length)

    def __repr__(self) -> str:
        return f"CharTokenizer(n_vocab={self.n_vocab})"

    def __getstate__(self) -> dict:
        return {"chars": self._chars} | _chat_template_entry(self._chat_template)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["chars"])
        self._chat_template = state.get("chat_template")


CHARS_FILE = "chars.json"
# The files a directory's tokenizer is read from: by `load_tokenizer`, and by transformers' AutoTokenizer.
TOKENIZER_FILES = ("encoder.json", "vocab.bpe", "vocab.json", "merges.txt", CHARS_FILE, "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")  # fmt: skip


def _chat_template_entry(source: str | None) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`, where there is one."""
    return {} if source is None else {"chat_template": source}


def read_chat_template(directory: str | os.PathLike) -> str | None:
    """The chat template saved in a directory: `chat_template.jinja` (as newer transformers save it)
    or tokenizer_config.json's `chat_template`; None if neither holds one. A template that is not
    text (transformers' named templates, a list) raises VocabularyError naming the file."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    source = read_json_object(config, VocabularyError).get("chat_template")
    if source is not None and not isinstance(source, str):
        raise VocabularyError(f"{config}: chat_template must be one template's text; named templates (a list) are not supported")
    return source


def _write_pretrained(directory: str | os.PathLike, files: dict[str, str], config: dict, model_max_length: int | None) -> None:
    """Write a tokenizer's files and its `tokenizer_config.json` into `directory` (created if needed),
    each atomically, and remove the other tokenizer files there, so that no reader finds a stale one."""
    directory = writable_directory(directory)
    if model_max_length is not None:
        config = {**config, "model_max_length": positive_int("model_max_length", model_max_length)}
    files = {**files, "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}
    for name, text in files.items():
        atomic_write_text(directory / name, text)
    for name in TOKENIZER_FILES:
        if name not in files:
            (directory / name).unlink(missing_ok=True)


def same_vocabulary(a: object, b: object) -> bool:
    """Whether two tokenizers map text to the same ids (whatever their chat templates)."""
    if type(a) is not type(b):
        return False
    vocabulary = lambda t: {key: value for key, value in t.__getstate__().items() if key != "chat_template"}  # noqa: E731
    return vocabulary(a) == vocabulary(b)


def assumed_tokenizer(n_vocab: int) -> Tokenizer | None:
    """The tokenizer of a model of n_vocab ids saved without one: GPT-2's for GPT-2's vocabulary, else none known."""
    return Tokenizer.gpt2() if n_vocab == Tokenizer.gpt2().n_vocab else None


def load_tokenizer(directory: str | os.PathLike, kind: Literal["bpe", "char"] | None = None) -> Tokenizer | CharTokenizer | None:
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

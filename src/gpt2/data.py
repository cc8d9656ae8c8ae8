"""Training data: text to token ids on disk (`prepare`), reading them back (`open_data`), and batches.

A prepared directory holds what nanoGPT's data/*/prepare.py scripts write, plus what they leave
implicit:

    train.bin, val.bin   the ids, raw little-endian uint16 (uint32 past 65,536 ids): nanoGPT's format
    meta.json            tokenizer, vocabulary size, dtype, token counts, sources, split
    encoder.json + vocab.bpe, or chars.json: the tokenizer's own files, to decode what a model writes

Corpora larger than memory stream through: files are read in chunks of a few MB, cut only
where GPT-2's pre-tokenizer cuts anyway (so the ids equal those of the whole text), encoded by
all cores, and appended to disk. Batches are random windows drawn from a generator seeded by
(seed, iteration, micro-step): the same batches whether a run was resumed or how many
processes share it.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import regex
import torch

from gpt2._checks import int_between, is_integer, positive_int, real_between
from gpt2._files import atomic_path, atomic_write_text, read_json_object, writable_directory
from gpt2.errors import DataError, InputTypeError, InvalidArgumentError, TokenIdError
from gpt2.tokenizer import CHARS_FILE, GPT2_VOCAB_DIR, CharTokenizer, Tokenizer, load_tokenizer, same_vocabulary

FORMAT = "gpt2-prepared"
CHUNK_BYTES = 4 << 20  # read and encode a few MB at a time
SPLIT_SEED = 1337  # which documents go to validation, when there are several
SPECS = "gpt2, char, or bpe:N (a byte-level BPE of N >= 257 ids trained on the corpus)"
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_BYTES = 20240520, 1, 256 * 4
GPT2_VOCAB = 50257
LLMC_NAME = re.compile(r"(.+)_(train|val)\.bin")  # llm.c's names: tiny_shakespeare_val.bin

# Where GPT-2's pre-tokenizer (tokenizer.GPT2_PATTERN) cuts whatever the text around holds:
# between a non-space X and a whitespace character w ("X|w"). No piece spans X and w (only the
# \s+ alternatives take whitespace, and never X), a prefix ending in X ends in the same piece as
# in the whole text (only `\s+(?!\S)` looks ahead, and it cannot end at X), and the pattern has
# no lookbehind, so the text from w on splits the same with or without what precedes it. (Inside
# a whitespace run is not safe: "a \n\nb" splits "a", " \n", "\n", "b"; cut after " ", the
# prefix ends in " " and the suffix starts "\n", "\n".) Compiled with `regex` so that \s and \S
# are the tokenizer's (Unicode White_Space), and searched in reverse ((?r)) for the last cut.
_SAFE_CUT = regex.compile(r"(?r)(?<=\S)(?=\s)")


def ids_dtype(n_vocab: int) -> np.dtype:
    """uint16 (nanoGPT's) where every id fits, else uint32; little-endian either way."""
    return np.dtype("<u2") if n_vocab <= 65536 else np.dtype("<u4")


# ------------------------------------------------------------------ reading text


@dataclass
class Document:
    name: str  # as the user gave it, or the file found beneath a directory
    path: Path
    size: int  # bytes


def find_documents(inputs: Sequence[str | os.PathLike], spool: Path) -> list[Document]:
    """Every file an input names: itself, every file beneath a directory (sorted), or
    standard input ("-"), which is copied to `spool` first so that it can be read twice."""
    if isinstance(inputs, (str, os.PathLike)) or not inputs:
        raise InvalidArgumentError("inputs must be a list of text files, directories or '-' (standard input)")
    documents: list[Document] = []
    seen: dict[tuple[int, int], str] = {}  # (device, inode) of each file -> the name it came as
    for given in inputs:
        if not isinstance(given, (str, os.PathLike)):
            raise InputTypeError(f"inputs are paths (str or os.PathLike) or '-', got {given!r}")
        if str(given) == "-" and any(d.name == "<stdin>" for d in documents):
            raise InvalidArgumentError("'-' (standard input) is given twice: it can be read only once")
        if str(given) == "-":
            with open(spool, "wb") as f:
                while block := sys.stdin.buffer.read(CHUNK_BYTES):
                    f.write(block)
            documents.append(Document("<stdin>", spool, spool.stat().st_size))
            continue
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            if not files:
                raise DataError(f"{path} is a directory with no files in it")
        elif path.is_file():
            files = [path]
        elif path.exists():  # a pipe, a device: its size is unknown, and it cannot be read twice
            raise DataError(f"input {str(given)!r} is not a file or a directory: pipe it in as - (standard input)")
        else:
            raise DataError(f"input {str(given)!r} does not exist: give text files, directories, or - for standard input")
        for file in files:
            documents.append(_once(Document(str(file), file, file.stat().st_size), seen))
    return documents


def _once(document: Document, seen: dict[tuple[int, int], str]) -> Document:
    """The document, unless its file came before (by the same path or another, a link, or inside
    a directory given too): the same text in both splits would make the validation loss a training loss."""
    info = document.path.stat()
    key = (info.st_dev, info.st_ino)
    if key in seen:
        first = seen[key]
        same = f"{first!r} is given twice" if first == document.name else f"{document.name!r} and {first!r} are the same file"
        raise DataError(f"{same}: give each file once (twice, its text could be in both the training and the validation split)")
    seen[key] = document.name
    return document


def read_chunks(document: Document, on_bytes=lambda n: None, anywhere: bool = False) -> Iterator[str]:
    """The text of a document in pieces of about CHUNK_BYTES, each cut at a safe place (see
    _SAFE_CUT), or `anywhere` (a character vocabulary, which no cut can change)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, offset = "", 0
    with open(document.path, "rb") as f:
        while True:
            block = f.read(CHUNK_BYTES)
            held = len(decoder.getstate()[0])  # bytes of a character the last block left unfinished
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise DataError(f"{document.name} is not UTF-8 text (byte {offset - held + e.start}: {e.reason})") from None
            offset += len(block)
            on_bytes(len(block))
            if not block:
                break
            cut = len(pending) if anywhere else _last_safe_cut(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def _last_safe_cut(text: str) -> int:
    """The last safe cut in the second half of text (0: none), so chunks stay about CHUNK_BYTES.
    With none (a line of CJK text as long as a chunk), the next block is read and tried too."""
    match = _SAFE_CUT.search(text, len(text) // 2)
    return match.start() if match else 0


# ------------------------------------------------------------------ prepare


def parse_tokenizer_spec(spec: str) -> int | None:
    """Check a tokenizer spec before any file is touched; returns N of bpe:N (else None)."""
    match = re.fullmatch(r"bpe:([0-9]+)", spec) if isinstance(spec, str) else None
    if spec not in ("gpt2", "char") and (match is None or int(match.group(1)) < 257):
        raise InvalidArgumentError(f"unknown tokenizer {spec!r}: use {SPECS}")
    return int(match.group(1)) if match else None


def make_tokenizer(spec: str, documents: list[Document], progress: bool) -> Tokenizer | CharTokenizer:
    """The tokenizer a spec names; `char` and `bpe:N` learn theirs from the corpus."""
    vocab_size = parse_tokenizer_spec(spec)
    if spec == "gpt2":
        return Tokenizer.gpt2()
    if spec == "char":
        chars: set[str] = set()
        for document in documents:
            for chunk in read_chunks(document, anywhere=True):
                chars.update(chunk)
        if not chars:
            raise DataError("the corpus is empty: no characters in " + ", ".join(d.name for d in documents))
        return CharTokenizer(sorted(chars))
    texts = (chunk for document in documents for chunk in read_chunks(document))
    try:
        return Tokenizer.train(texts, vocab_size, progress=progress)
    except InvalidArgumentError as e:
        raise DataError(f"cannot train a tokenizer: {e}") from None


def encode_documents(documents: list[Document], tokenizer, out: BinaryIO, dtype: np.dtype, progress: bool,
                     num_workers: int) -> list[int]:  # fmt: skip
    """Append every document's ids (each followed by <|endoftext|> where the tokenizer has one)
    to `out`; returns the number of ids of each document.

    Chunks are batched across documents, about CHUNK_BYTES per worker, so that a corpus of many
    small files keeps every worker busy as one large file does."""
    from tqdm.auto import tqdm

    counts = [0] * len(documents)
    batch: list[tuple[int, str | None]] = []  # (document, chunk), or (document, None) at its end
    held = 0  # characters in the batch
    anywhere = isinstance(tokenizer, CharTokenizer)
    with tqdm(total=sum(d.size for d in documents), unit="B", unit_scale=True, desc="tokenizing",
              disable=not progress) as bar:  # fmt: skip
        for d, document in enumerate(documents):
            for chunk in read_chunks(document, bar.update, anywhere):
                batch.append((d, chunk))
                held += len(chunk)
                if held >= num_workers * CHUNK_BYTES:
                    _encode_batch(batch, tokenizer, out, dtype, counts, num_workers)
                    batch, held = [], 0
            batch.append((d, None))
        _encode_batch(batch, tokenizer, out, dtype, counts, num_workers)
    return counts


def _encode_batch(batch: list[tuple[int, str | None]], tokenizer, out: BinaryIO, dtype: np.dtype, counts: list[int],
                  num_workers: int) -> None:  # fmt: skip
    """Encode a batch's chunks on the workers and append their ids in order, with <|endoftext|>
    (where the tokenizer has one) where a document ends."""
    encoded = iter(tokenizer.encode_batch([c for _, c in batch if c is not None], num_workers=num_workers))
    eot = tokenizer.eot_token
    for d, chunk in batch:
        ids = next(encoded) if chunk is not None else [] if eot is None else [eot]
        out.write(np.asarray(ids, dtype=dtype).tobytes())
        counts[d] += len(ids)


@dataclass
class Split:
    """Which ids train and which validate: (start, end) ranges into the ids of every document in order."""

    train: list[tuple[int, int]]
    val: list[tuple[int, int]]
    method: str  # "tail": one document, cut; "documents": whole documents, and the tail of at most one
    val_documents: int = 0  # documents that validate whole
    cut: tuple[int, int] | None = None  # (document, its ids that validate): the one split within, if any


def split_documents(counts: list[int], val_fraction: float) -> Split:
    """Train and validation ids of documents of `counts` ids each.

    One document: its first int(n * (1 - F)) ids train, the rest validate (nanoGPT's split).
    Several: documents drawn with a fixed seed validate whole while they fit in round(F * n)
    ids (at least 1, at most n - 1); the last ids of the next one drawn make up the rest (its
    head trains), so that validation holds F of the ids whatever the documents' sizes.
    """
    n = sum(counts)
    if len(counts) == 1:
        cut = int(n * (1 - val_fraction))
        split = Split([(0, cut)], [(cut, n)], "tail", 0, (0, n - cut))
    else:
        split = _split_by_documents(counts, min(max(round(val_fraction * n), 1), n - 1))
    for name, ranges in (("training", split.train), ("validation", split.val)):
        if sum(e - s for s, e in ranges) == 0:
            raise DataError(f"a corpus of {n} tokens in {len(counts)} document(s) is too small to split with "
                            f"val_fraction {val_fraction}: the {name} split would be empty")  # fmt: skip
    return split


def _split_by_documents(counts: list[int], target: int) -> Split:
    whole, held, cut = set(), 0, None
    for d in map(int, np.random.default_rng(SPLIT_SEED).permutation(len(counts))):
        if held == target:
            break
        if held + counts[d] > target:
            cut = (d, target - held)  # 0 < its ids that validate < counts[d]
            break
        whole.add(d)
        held += counts[d]
    starts = [0, *itertools.accumulate(counts)]  # document d holds ids starts[d] .. starts[d + 1]
    train, val = [], []
    for d in range(len(counts)):
        start, end = starts[d], starts[d + 1]
        middle = end - cut[1] if cut is not None and cut[0] == d else start if d in whole else end  # train | val
        train += [(start, middle)] if middle > start else []
        val += [(middle, end)] if end > middle else []
    return Split(train, val, "documents", len(whole), cut)


def prepare(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str = "gpt2",
    val_fraction: float = 0.1,
    *,
    overwrite: bool = False,
    progress: bool = True,
    num_workers: int | None = None,
) -> dict[str, Any]:
    """Tokenize text files into `out` (train.bin, val.bin, meta.json and the tokenizer's files),
    encoding on `num_workers` processes (default: one per core); returns the meta written.
    See the module's docstring."""
    val_fraction = real_between("val_fraction", val_fraction, 0, 1, open_low=True, open_high=True)
    num_workers = positive_int("num_workers", (os.cpu_count() or 1) if num_workers is None else num_workers)
    parse_tokenizer_spec(tokenizer)
    out = Path(out)
    _check_out(out, overwrite)
    created = not out.exists()
    writable_directory(out)
    try:
        with tempfile.TemporaryDirectory(dir=out, prefix=".prepare-") as scratch:  # beside out: no copy across disks
            encoder, documents, split, dtype = _write_splits(inputs, out, Path(scratch), tokenizer, val_fraction,
                                                             progress, num_workers)  # fmt: skip
    except BaseException:
        if created:  # an error leaves no empty directory behind
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    if overwrite:
        _remove_other_tokenizers(out, tokenizer)
    _save_tokenizer(encoder, tokenizer, out)
    train_tokens, val_tokens = (sum(e - s for s, e in ranges) for ranges in (split.train, split.val))
    cut = None if split.cut is None else {"document": documents[split.cut[0]].name, "val_tokens": split.cut[1]}
    meta = {
        "format": FORMAT, "version": 1, "tokenizer": tokenizer, "vocab_size": encoder.n_vocab, "dtype": dtype.name,
        "train_tokens": train_tokens, "val_tokens": val_tokens,
        "sources": {"inputs": [str(i) for i in inputs], "documents": len(documents)},
        "split": {"val_fraction": val_fraction, "method": split.method, "seed": SPLIT_SEED,
                  "actual_val_fraction": val_tokens / (train_tokens + val_tokens), "val_documents": split.val_documents,
                  "cut": cut},  # the document split within (one at most), and how many of its ids validate
    }  # fmt: skip
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")  # last: it vouches for the rest
    return meta


def _write_splits(inputs: Sequence[str | os.PathLike], out: Path, scratch: Path, spec: str, val_fraction: float,
                  progress: bool, num_workers: int) -> tuple[Tokenizer | CharTokenizer, list[Document], Split, np.dtype]:  # fmt: skip
    """Encode every document into scratch/all.bin, then write out/train.bin and out/val.bin from it.
    Returns the tokenizer, the documents, the split, and the dtype."""
    documents = find_documents(inputs, scratch / "stdin.txt")
    if not any(d.size for d in documents):
        raise DataError("the corpus is empty: no text in " + ", ".join(d.name for d in documents))
    encoder = make_tokenizer(spec, documents, progress)
    dtype = ids_dtype(encoder.n_vocab)
    with open(scratch / "all.bin", "wb") as f:
        counts = encode_documents(documents, encoder, f, dtype, progress, num_workers)
    split = split_documents(counts, val_fraction)
    ids = np.memmap(scratch / "all.bin", dtype=dtype, mode="r")
    # Both files are renamed into place together, at the end: never a new train.bin beside an old val.bin.
    with atomic_path(out / "train.bin") as train_tmp, atomic_path(out / "val.bin") as val_tmp:
        for tmp, ranges in ((train_tmp, split.train), (val_tmp, split.val)):
            with open(tmp, "wb") as f:
                for start, end in ranges:
                    f.write(ids[start:end].tobytes())
    del ids
    return encoder, documents, split, dtype


def _check_out(out: Path, overwrite: bool) -> None:
    existing = [name for name in ("train.bin", "val.bin", "meta.json") if (out / name).exists()]
    if existing and not overwrite:
        raise DataError(f"{out} already holds prepared data ({', '.join(existing)}): pass overwrite=True to replace it", "overwrite")


def _save_tokenizer(tokenizer: Tokenizer | CharTokenizer, spec: str, out: Path) -> None:
    """The tokenizer's files in `out`. GPT-2's are OpenAI's released files, copied: the same
    vocabulary as Tokenizer.save would write, in a millisecond rather than half a second."""
    if spec != "gpt2":
        tokenizer.save(out)
        return
    for name in ("encoder.json", "vocab.bpe"):
        with atomic_path(out / name) as tmp:
            shutil.copyfile(GPT2_VOCAB_DIR / name, tmp)


def _remove_other_tokenizers(out: Path, spec: str) -> None:
    """An overwrite with another kind of tokenizer leaves no stale vocabulary to be read by mistake."""
    for name in ("encoder.json", "vocab.bpe") if spec == "char" else (CHARS_FILE,):
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()


# ------------------------------------------------------------------ reading prepared data


@dataclass
class TokenData:
    """The two splits of prepared data, as read-only arrays of ids on disk."""

    directory: Path
    format: str  # "gpt2", "nanogpt" or "llm.c"
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    tokenizer: Tokenizer | CharTokenizer | None
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # split -> the file it came from

    def check_vocabulary(self, tokenizer: Tokenizer | CharTokenizer | None, n_vocab: int, model: str) -> None:
        """Raise unless a model of n_vocab ids that reads `tokenizer` (None: unknown) can read these ids."""
        if self.vocab_size > n_vocab:
            raise InvalidArgumentError(f"the data in {self.directory} has a vocabulary of {self.vocab_size} ids, more than the "
                                       f"{n_vocab} of the model {model}: prepare it with the model's tokenizer")  # fmt: skip
        if tokenizer is not None and self.tokenizer is not None and not same_vocabulary(tokenizer, self.tokenizer):
            raise InvalidArgumentError(f"the data in {self.directory} was prepared with another tokenizer ({self.tokenizer!r}) than "
                                       f"the model {model} reads ({tokenizer!r}): prepare it with the model's tokenizer")  # fmt: skip

    def check_block_size(self, block_size: int) -> None:
        """Raise unless each split holds a window of block_size + 1 ids (the inputs and their next ids)."""
        block_size = positive_int("block_size", block_size)
        for split, ids in (("train", self.train), ("val", self.val)):
            if len(ids) < block_size + 1:
                raise DataError(f"{self.files[split]} holds {len(ids)} ids, too short for block_size {block_size}: "
                                f"a window needs {block_size + 1}; use a smaller block_size or more text", "block_size")  # fmt: skip


def open_data(path: str | os.PathLike) -> TokenData:
    """Prepared data: a directory `gpt2 prepare` wrote, nanoGPT's train.bin/val.bin (with its
    meta.pkl for character vocabularies), or llm.c's .bin files. Every id is checked against the
    vocabulary once, here, so that training never meets one out of range."""
    path = Path(path)
    if path.is_file() and LLMC_NAME.fullmatch(path.name):
        data = _open_llmc(path.parent, _llmc_pair(path))
    elif (path / "meta.json").is_file():
        data = _open_ours(path)
    elif (path / "train.bin").is_file():
        data = _open_nanogpt(path)
    elif path.is_dir() and list(path.glob("*_train.bin")) and list(path.glob("*_val.bin")):
        data = _open_llmc(path, {split: _only_llmc_file(path, split) for split in ("train", "val")})
    elif not path.exists():
        raise DataError(f"data {str(path)!r} does not exist: give a directory gpt2 prepare wrote")
    elif path.is_file():
        raise DataError(f"{path} is a file, not prepared data: give the directory that holds train.bin and val.bin "
                        f"(run gpt2 prepare), or one of llm.c's NAME_train.bin / NAME_val.bin files")  # fmt: skip
    else:
        raise DataError(f"{path} holds no prepared data: expected train.bin and val.bin (run gpt2 prepare), "
                        f"or llm.c's *_train.bin and *_val.bin")  # fmt: skip
    for split, ids in (("train", data.train), ("val", data.val)):
        _check_ids(ids, data.vocab_size, data.files[split])
    return data


def _memmap(path: Path, dtype: np.dtype, offset: int = 0) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path} is missing")
    size = path.stat().st_size - offset
    if size % dtype.itemsize:
        raise DataError(f"{path} holds {size} bytes, not a whole number of {dtype.name} ids ({dtype.itemsize} bytes each)")
    if size == 0:  # numpy cannot map an empty file
        empty = np.zeros(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset)


def _check_ids(ids: np.ndarray, vocab_size: int, path: Path, chunk: int = 1 << 26) -> None:
    for start in range(0, len(ids), chunk):
        high = int(ids[start : start + chunk].max())
        if high >= vocab_size:
            raise TokenIdError(f"{path} holds token id {high}, beyond its vocabulary of {vocab_size} ids (0..{vocab_size - 1})")


def _open_ours(path: Path) -> TokenData:
    meta = read_json_object(path / "meta.json", DataError)
    if meta.get("format") != FORMAT or meta.get("version") != 1:
        raise DataError(f"{path / 'meta.json'} is not gpt2 prepare's (format {meta.get('format')!r}, version "
                        f"{meta.get('version')!r}; expected {FORMAT!r}, version 1): run gpt2 prepare")  # fmt: skip
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise DataError(f"{path / 'meta.json'}: dtype is {meta.get('dtype')!r}, not uint16 or uint32")
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    splits = {}
    for split in ("train", "val"):
        splits[split] = _memmap(path / f"{split}.bin", dtype)
        if len(splits[split]) != meta.get(f"{split}_tokens"):
            raise DataError(f"{path / f'{split}.bin'} holds {len(splits[split])} ids, but meta.json says "
                            f"{split}_tokens = {meta.get(f'{split}_tokens')!r}: prepare the data again")  # fmt: skip
    vocab_size = meta.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise DataError(f"{path / 'meta.json'}: vocab_size is {vocab_size!r}, not a positive integer")
    tokenizer = _our_tokenizer(path, meta.get("tokenizer"))
    if tokenizer is not None and tokenizer.n_vocab != vocab_size:
        raise DataError(f"{path}: meta.json says vocab_size {vocab_size}, but its tokenizer has {tokenizer.n_vocab} ids")
    files = {s: path / f"{s}.bin" for s in splits}
    return TokenData(path, "gpt2", splits["train"], splits["val"], vocab_size, tokenizer, meta, files)


def _our_tokenizer(path: Path, spec: object) -> Tokenizer | CharTokenizer | None:
    """The tokenizer prepare saved for `spec` (GPT-2's if its files are gone), None if none is there."""
    tokenizer = load_tokenizer(path, "char" if spec == "char" else "bpe")
    return Tokenizer.gpt2() if tokenizer is None and spec == "gpt2" else tokenizer


class _DataOnlyUnpickler(pickle.Unpickler):
    """Loads dicts, lists, strings and numbers only: a pickle naming any class or function
    (which is how a pickle runs code) is refused before anything runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def read_nanogpt_meta(path: Path) -> CharTokenizer:
    """nanoGPT's meta.pkl ({'vocab_size', 'itos', 'stoi'}) as a character vocabulary."""
    try:
        with open(path, "rb") as f:
            meta = _DataOnlyUnpickler(f).load()
    except Exception as e:
        raise DataError(f"{path} is not a plain-data pickle ({e}); pickles can run code, so only dicts, "
                        f"lists, strings and numbers are read") from None  # fmt: skip
    itos = meta.get("itos") if isinstance(meta, dict) else None
    size = meta.get("vocab_size") if isinstance(meta, dict) else None
    if (not isinstance(itos, dict) or not is_integer(size) or not all(is_integer(i) for i in itos)
            or set(itos) != set(range(size))):  # fmt: skip
        raise DataError(f"{path} is not nanoGPT's meta.pkl: expected {{'vocab_size': N, 'itos': {{0..N-1: char}}, 'stoi': ...}}")
    try:
        return CharTokenizer([itos[i] for i in range(size)])
    except Exception as e:
        raise DataError(f"{path}: {e}") from None


def _open_nanogpt(path: Path) -> TokenData:
    dtype = np.dtype("<u2")
    train, val = _memmap(path / "train.bin", dtype), _memmap(path / "val.bin", dtype)
    tokenizer = read_nanogpt_meta(path / "meta.pkl") if (path / "meta.pkl").is_file() else Tokenizer.gpt2()
    files = {"train": path / "train.bin", "val": path / "val.bin"}
    return TokenData(path, "nanogpt", train, val, tokenizer.n_vocab, tokenizer, {}, files)


def read_llmc(path: Path) -> np.ndarray:
    """llm.c's token file: 256 little-endian int32 (magic 20240520, version 1, count), then uint16 ids."""
    with open(path, "rb") as f:
        head = f.read(LLMC_HEADER_BYTES)
    if len(head) < LLMC_HEADER_BYTES:
        raise DataError(f"{path} is not an llm.c token file: {len(head)} bytes, shorter than its {LLMC_HEADER_BYTES}-byte header")
    header = np.frombuffer(head, dtype="<i4")
    if header[0] != LLMC_MAGIC:
        raise DataError(f"{path} is not an llm.c token file: its magic number is {header[0]}, not {LLMC_MAGIC}")
    if header[1] != LLMC_VERSION:
        raise DataError(f"{path}: llm.c token file version {header[1]}; only version {LLMC_VERSION} (uint16 ids) is read")
    ids = _memmap(path, np.dtype("<u2"), offset=LLMC_HEADER_BYTES)
    if len(ids) != header[2]:
        raise DataError(f"{path}: its header counts {header[2]} ids, but the file holds {len(ids)}")
    return ids


def _llmc_pair(path: Path) -> dict[str, Path]:
    """Both splits, given one of llm.c's files (NAME_train.bin or NAME_val.bin)."""
    name = LLMC_NAME.fullmatch(path.name).group(1)
    files = {split: path.with_name(f"{name}_{split}.bin") for split in ("train", "val")}
    for split, file in files.items():
        if not file.is_file():
            raise DataError(f"{file} is missing: llm.c's data is a pair of files, {name}_train.bin and {name}_val.bin")
    return files


def _only_llmc_file(directory: Path, split: str) -> Path:
    found = sorted(directory.glob(f"*_{split}.bin"))
    if len(found) > 1:
        raise DataError(f"{directory} holds several llm.c {split} files ({', '.join(p.name for p in found)}): "
                        f"keep one, or give the path of one NAME_train.bin")  # fmt: skip
    return found[0]


def _open_llmc(directory: Path, files: dict[str, Path]) -> TokenData:
    train, val = read_llmc(files["train"]), read_llmc(files["val"])
    return TokenData(directory, "llm.c", train, val, GPT2_VOCAB, Tokenizer.gpt2(), {}, files)


# ------------------------------------------------------------------ batches


def get_batch(
    ids: np.ndarray, block_size: int, batch_size: int, *, seed: int, iteration: int, micro_step: int,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x, y: (batch_size, block_size) int64 windows of ids at random offsets, y = x shifted by one.

    The offsets come from a generator seeded by (seed, iteration, micro_step), so a batch
    depends on nothing else: not on resumption, not on which process draws it.
    """
    block_size, batch_size = positive_int("block_size", block_size), positive_int("batch_size", batch_size)
    for name, value in (("seed", seed), ("iteration", iteration), ("micro_step", micro_step)):
        int_between(name, value, 0, 2**63 - 1, "a whole number")
    if len(ids) < block_size + 1:
        raise DataError(f"{len(ids)} ids are too short for block_size {block_size}: a window needs {block_size + 1}")
    rng = np.random.default_rng([seed, iteration, micro_step])
    offsets = rng.integers(0, len(ids) - block_size, size=batch_size)
    windows = torch.from_numpy(np.stack([ids[i : i + block_size + 1] for i in offsets]).astype(np.int64))  # (B, T + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    if torch.device(device).type == "cuda":  # pinned, so the copy overlaps the work already queued
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)

"""Text to token ids: `prepare`. Documents (text files, records of JSON Lines and Parquet files, a Hugging Face
dataset) are read in chunks of about a MB, cut only where GPT-2's pre-tokenizer cuts anyway (so the ids equal those
of the whole text), encoded by all cores, split into training and validation by documents, and written to disk.

A corpus streams through: this process reads and cuts the text into shares of about a MB, worker processes encode
them (`gpt2.tokenizer.pool.encode_stream`: a few shares in flight, each worker taking the next as it finishes one)
and hand each share's ids back as one packed array, which this process writes as it comes, in order. Memory holds
the shares in flight and one document's longest stretch without a safe cut, whatever the corpus's size.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import os
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import regex

from gpt2._checks import int_between, positive_int, real_between
from gpt2._files import atomic_write_text
from gpt2.data.corpora import (
    SHARD_NAME,
    ShardWriter,
    dataset_texts,
    is_record_file,
    jsonl_block_records,
    jsonl_block_texts,
    jsonl_blocks,
    record_texts,
)
from gpt2.data.files import Split, finish, ids_dtype, scratch_in, write_split_files
from gpt2.errors import DataError, InputTypeError, InvalidArgumentError
from gpt2.examples import CORPORA, corpus_text
from gpt2.tokenizer import CharTokenizer, Tokenizer
from gpt2.tokenizer.pool import encode_stream
from gpt2.tokenizer.registry import parse_tokenizer_spec

CHUNK_BYTES = 1 << 20  # read a MB at a time, and send workers shares of about as many characters
SPLIT_SEED = 1337  # which documents go to validation, when there are several


# Where GPT-2's pre-tokenizer (tokenizer.GPT2_PATTERN) cuts whatever the text around holds:
# between a non-space X and a whitespace character w ("X|w"). No piece spans X and w (only the
# \s+ alternatives take whitespace, and never X), a prefix ending in X ends in the same piece as
# in the whole text (only `\s+(?!\S)` looks ahead, and it cannot end at X), and the pattern has
# no lookbehind, so the text from w on splits the same with or without what precedes it. (Inside
# a whitespace run is not safe: "a \n\nb" splits "a", " \n", "\n", "b"; cut after " ", the
# prefix ends in " " and the suffix starts "\n", "\n".) The same holds between two non-spaces of
# different classes, letter (\p{L}), number (\p{N}) and other (neither, nor space): no piece
# holds two classes (` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`) but a contraction ("'s",
# "'ll": an apostrophe, then letters), so every change of class is a cut but "'" then a letter.
# Text without white space (Chinese, Japanese) is cut at its punctuation so. Compiled with
# `regex` so that the classes are the tokenizer's (\s: Unicode White_Space), and searched in
# reverse ((?r)) for the last cut.
_CUTS = (
    r"(?<=\S)(?=\s)"  # X|w
    r"|(?<=\p{L})(?=[^\s\p{L}])"  # a letter, then a number or an other
    r"|(?<=\p{N})(?=[^\s\p{N}])"  # a number, then a letter or an other
    r"|(?<=[^\s\p{L}\p{N}'])(?=[\p{L}\p{N}])"  # an other but "'", then a letter or a number
    r"|(?<=')(?=\p{N})"  # "'", then a number (before a letter, it may start a contraction)
)
_SAFE_CUT = regex.compile(f"(?r){_CUTS}")
_NEXT_SAFE_CUT = regex.compile(_CUTS)  # the same cuts, searched forward for the first


@dataclass
class Document:
    """A text file, or a source of records (a .jsonl or .parquet file, a dataset): each record a
    document of its own, though the source splits (train | val) as one."""

    name: str  # as the user gave it, or the file found beneath a directory
    path: Path | None  # None: a dataset
    size: int  # bytes (0 for a dataset: unknown)
    records: Callable[[Callable[[int], object]], Iterator[str]] | None = None  # (on_bytes) -> each record's text
    jsonl_field: str | None = None  # a .jsonl file's text field: its lines are parsed by the workers that encode them


@dataclass(frozen=True)
class Lines:
    """Whole lines of a JSON Lines file, as read: a worker parses them and encodes their records."""

    path: Path
    first: int  # the number of the first line
    block: bytes
    text_field: str


def find_documents(inputs: Sequence[str | os.PathLike], spool: Path, text_field: str = "text") -> list[Document]:
    """Every file an input names: itself, every file beneath a directory (sorted), or
    standard input ("-"), which is copied to `spool` first so that it can be read twice.
    .jsonl and .parquet files are read as records, their `text_field` the text."""
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
        elif str(given) in CORPORA:  # a corpus gpt2 ships, written out beside the spool to be read as a file
            text = spool.with_name(f"{given}.txt")
            atomic_write_text(text, corpus_text(str(given)))
            documents.append(Document(str(given), text, text.stat().st_size))
            continue
        else:
            raise DataError(
                f"input {str(given)!r} does not exist: give text files, directories, - for standard input, "
                f"or a corpus gpt2 ships ({', '.join(CORPORA)})"
            )
        for file in files:
            records = functools.partial(record_texts, file, text_field) if is_record_file(file) else None  # (on_bytes)
            jsonl = text_field if file.suffix.lower() == ".jsonl" else None
            documents.append(_once(Document(str(file), file, file.stat().st_size, records, jsonl), seen))
    return documents


def dataset_document(name: str, config: str | None, split: str, text_field: str) -> Document:
    """A Hugging Face dataset (see corpora.dataset_texts) as a source of records."""
    return Document(f"dataset {name}", None, 0, lambda on_bytes: dataset_texts(name, config, split, text_field))


def _once(document: Document, seen: dict[tuple[int, int], str]) -> Document:
    """The document, unless its file came before (by the same path or another, a link, or inside
    a directory given too): the same text in both splits would make the validation loss a training loss."""
    info = document.path.stat()
    key = (info.st_dev, info.st_ino)
    if key in seen:
        first = seen[key]
        same = (
            f"{first!r} is given twice"
            if first == document.name
            else f"{document.name!r} and {first!r} are the same file"
        )
        raise DataError(
            f"{same}: give each file once (twice, its text could be in both the training and the validation split)"
        )
    seen[key] = document.name
    return document


def read_chunks(document: Document, on_bytes=lambda n: None, anywhere: bool = False) -> Iterator[str]:
    """The text of a document in pieces of about CHUNK_BYTES, each cut at a safe place (see
    _SAFE_CUT), or `anywhere` (a character vocabulary, which no cut can change)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending, offset, searched = "", 0, 0  # pending[:searched] holds no cut in its second half: not searched again
    with open(document.path, "rb") as f:
        while True:
            block = f.read(CHUNK_BYTES)
            held = len(decoder.getstate()[0])  # bytes of a character the last block left unfinished
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{document.name} is not UTF-8 text (byte {offset - held + e.start}: {e.reason})"
                ) from None
            offset += len(block)
            on_bytes(len(block))
            if not block:
                break
            cut = len(pending) if anywhere else _last_safe_cut(pending, searched)
            searched = 0 if cut else len(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def pieces(document: Document, on_bytes=lambda n: None, anywhere: bool = False) -> Iterator[str | None]:
    """A document's text in pieces, None after each record (or after a text file): where
    <|endoftext|> goes. A text file gives its chunks (at least one, "" when empty), a record its
    text (cut as a text file's chunks are where it is longer than a chunk)."""
    if document.records is not None:
        for text in document.records(on_bytes):
            yield from cut_text(text, anywhere)
            yield None
        return
    empty = True
    for chunk in read_chunks(document, on_bytes, anywhere):
        empty = False
        yield chunk
    if empty:
        yield ""
    yield None


def _last_safe_cut(text: str, searched: int = 0) -> int:
    """The last safe cut in the second half of text (0: none), so chunks stay about CHUNK_BYTES.
    With none (a run of letters as long as a chunk), the next block is read and tried too; the
    text up to `searched` was (and held none), so a long stretch without one costs a pass, not one
    a block."""
    match = _SAFE_CUT.search(text, max(len(text) // 2, searched - 1))
    return match.start() if match else 0


def cut_text(text: str, anywhere: bool = False) -> Iterator[str]:
    """A text already in memory (a record) in pieces of about CHUNK_BYTES characters, cut as
    read_chunks cuts a file (the first safe cut past half a chunk), so that a huge record is
    encoded by several workers, a piece at a time. "" gives "" (a record, empty)."""
    start, half = 0, max(CHUNK_BYTES // 2, 1)
    while len(text) - start > CHUNK_BYTES:
        if anywhere:
            cut = start + CHUNK_BYTES
        else:
            match = _NEXT_SAFE_CUT.search(text, start + half)
            if match is None:  # the rest holds no safe cut: one piece
                break
            cut = match.start()
        yield text[start:cut]
        start = cut
    yield text[start:] if start else text


def make_tokenizer(spec: str, documents: list[Document], progress: bool) -> Tokenizer | CharTokenizer:
    """The tokenizer a spec names; `char` and `bpe:N` learn theirs from the corpus."""
    vocab_size = parse_tokenizer_spec(spec)
    if spec == "gpt2":
        return Tokenizer.gpt2()
    if spec == "char":
        chars: set[str] = set()
        for document in documents:
            for piece in pieces(document, anywhere=True):
                chars.update(piece or "")
        if not chars:
            raise DataError("the corpus is empty: no characters in " + ", ".join(d.name for d in documents))
        return CharTokenizer(sorted(chars))
    texts = (piece for document in documents for piece in pieces(document) if piece)
    try:
        return Tokenizer.train(texts, vocab_size, progress=progress)
    except InvalidArgumentError as e:
        raise DataError(f"cannot train a tokenizer: {e}") from None


def encode_pieces(
    documents: list[Document],
    tokenizer: Tokenizer | CharTokenizer,
    num_workers: int,
    on_bytes=lambda n: None,
    eot_first: bool = False,
) -> Iterator[tuple[tuple[list[int], int], array, array]]:
    """For each share of the corpus's pieces (see `pieces`), in order: (the document of each of
    its items, how many records or text files start in it), the number of ids of each item, and
    all their ids one after another (an array of uint32). An item is a piece of text, the lines of
    a .jsonl file, or <|endoftext|> (no id for a character vocabulary), after each record or text
    file, or with `eot_first` before it (llm.c's shards).

    Pieces are gathered across documents into shares of about CHUNK_BYTES characters, so that a
    corpus of many small records keeps every worker busy as one large file does."""
    anywhere = isinstance(tokenizer, CharTokenizer)
    items = _items(documents, on_bytes, anywhere, eot_first)
    encode = functools.partial(_encode_item, tokenizer, tokenizer.eot_token, eot_first)
    return encode_stream(encode, _shares(items), num_workers)


def _items(
    documents: list[Document], on_bytes: Callable[[int], object], anywhere: bool, eot_first: bool
) -> Iterator[tuple[int, str | Lines | None]]:
    """(document, item) for every piece of every document, in order: None where <|endoftext|> goes,
    and a .jsonl file's lines as they are read (Lines), parsed by the workers."""
    for d, document in enumerate(documents):
        if document.jsonl_field is not None:
            for first, block in jsonl_blocks(document.path, CHUNK_BYTES, on_bytes):
                yield d, Lines(document.path, first, block, document.jsonl_field)
            continue
        starts = True  # with eot_first, the next piece starts a record: the token goes before it
        for piece in pieces(document, on_bytes, anywhere):
            if eot_first and piece is None:
                starts = True
                continue
            if eot_first and starts:
                yield d, None
                starts = False
            yield d, piece


def _shares(
    items: Iterable[tuple[int, str | Lines | None]],
) -> Iterator[tuple[tuple[list[int], int], list[str | Lines | None]]]:
    """((documents, how many documents start), items) of about CHUNK_BYTES each: each a worker's task."""
    documents, share, held, starts = [], [], 0, 0  # held: characters or bytes, and one an item
    for d, item in items:
        documents.append(d)
        share.append(item)
        held += (len(item.block) if isinstance(item, Lines) else len(item or "")) + 1
        starts += 1 if item is None else jsonl_block_records(item.block) if isinstance(item, Lines) else 0
        if held >= CHUNK_BYTES:
            yield (documents, starts), share
            documents, share, held, starts = [], [], 0, 0
    if share:
        yield (documents, starts), share


def _encode_item(
    tokenizer: Tokenizer | CharTokenizer, eot: int | None, eot_first: bool, item: str | Lines | None
) -> list[int]:
    # a corpus's "<|endoftext|>" is its characters, as llm.c's encode_ordinary: documents end with the token
    mark = [] if eot is None else [eot]
    if item is None:
        return mark
    if isinstance(item, str):
        return tokenizer.encode_ordinary(item)
    ids: list[int] = []
    for text in jsonl_block_texts(item.path, item.block, item.first, item.text_field):
        ids += mark if eot_first else []
        for piece in cut_text(text):  # a huge record: never all its pieces' strings at once
            ids += tokenizer.encode_ordinary(piece)
        ids += [] if eot_first else mark
    return ids


def _as_dtype(flat: array, dtype: np.dtype) -> np.ndarray:
    """A share's packed ids (uint32, the machine's byte order) as the files' dtype (little-endian uint16 or uint32)."""
    return np.frombuffer(flat, dtype=np.uint32).astype(dtype, copy=False)


def encode_documents(
    documents: list[Document], tokenizer, out: BinaryIO, dtype: np.dtype, progress: bool, num_workers: int
) -> list[int]:
    """Append every document's ids to `out`, each record or text file followed by <|endoftext|>
    (where the tokenizer has one); returns the number of ids of each document."""
    from tqdm.auto import tqdm

    counts = [0] * len(documents)
    total = sum(d.size for d in documents) if all(d.path is not None for d in documents) else None
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress) as bar:
        for (owners, _), lengths, flat in encode_pieces(documents, tokenizer, num_workers, bar.update):
            out.write(_as_dtype(flat, dtype))
            for d, n in zip(owners, lengths):
                counts[d] += n
    return counts


def encode_shards(documents: list[Document], tokenizer, writer: ShardWriter, progress: bool, num_workers: int) -> int:
    """Write every document's ids into llm.c's shards, each record or text file *preceded* by
    <|endoftext|> (llm.c's fineweb.py: "the special <|endoftext|> token delimits all documents");
    returns the number of documents (records and text files)."""
    from tqdm.auto import tqdm

    n = 0
    with tqdm(unit="tok", unit_scale=True, desc="tokenizing", disable=not progress) as bar:
        for (_, starts), _, flat in encode_pieces(documents, tokenizer, num_workers, eot_first=True):
            writer.write(_as_dtype(flat, writer.buffer.dtype))
            n += starts
            bar.update(len(flat))
    return n


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
            raise DataError(
                f"a corpus of {n} tokens in {len(counts)} document(s) is too small to split with "
                f"val_fraction {val_fraction}: the {name} split would be empty",
                "val_fraction",
            )
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
    text_field: str = "text",
    dataset: str | None = None,
    dataset_config: str | None = None,
    dataset_split: str = "train",
    shard_tokens: int | None = None,
) -> dict[str, Any]:
    """Tokenize text files, the `text_field` of JSON Lines and Parquet files' records, and a
    Hugging Face `dataset` (streamed) into `out`: train.bin, val.bin (`val_fraction` of the ids),
    or with `shard_tokens` llm.c's shards of that many ids (the first validates), plus meta.json
    and the tokenizer's files. Encodes on `num_workers` processes (default: one per core);
    returns the meta written. See the module's docstring."""
    val_fraction = real_between("val_fraction", val_fraction, 0, 1, open_low=True, open_high=True)
    num_workers = positive_int("num_workers", (os.cpu_count() or 1) if num_workers is None else num_workers)
    if shard_tokens is not None:
        shard_tokens = int_between(
            "shard_tokens", shard_tokens, 1, 2**31 - 1, "a positive whole number"
        )  # llm.c's int32 count
    named = {
        "text_field": text_field,
        "dataset_split": dataset_split,
        "dataset": dataset,
        "dataset_config": dataset_config,
    }
    for name, value in named.items():
        if (value is not None or name in ("text_field", "dataset_split")) and (not isinstance(value, str) or not value):
            raise InvalidArgumentError(f"{name} must be a non-empty string, got {value!r}", name)
    parse_tokenizer_spec(tokenizer)
    out = Path(out)
    with scratch_in(out, overwrite) as scratch:
        documents = find_documents(inputs, scratch / "stdin.txt", text_field) if inputs or dataset is None else []
        if dataset is not None:
            documents.append(dataset_document(dataset, dataset_config, dataset_split, text_field))
        if shard_tokens is None:
            encoder, meta = _write_splits(documents, out, scratch, tokenizer, val_fraction, progress, num_workers)
        else:
            encoder, meta = _write_shards(documents, out, scratch, tokenizer, shard_tokens, progress, num_workers)
    sources = {
        "inputs": [str(i) for i in inputs],
        "documents": len(documents),
        **({"text_field": text_field} if any(d.records for d in documents) else {}),
        **({} if dataset is None else {"dataset": dataset, "config": dataset_config, "split": dataset_split}),
    }
    return finish(out, encoder, tokenizer, {**meta, "sources": sources}, overwrite)


def _write_splits(
    documents: list[Document],
    out: Path,
    scratch: Path,
    spec: str,
    val_fraction: float,
    progress: bool,
    num_workers: int,
) -> tuple[Tokenizer | CharTokenizer, dict[str, Any]]:
    """Encode every document into scratch/all.bin, then write out/train.bin and out/val.bin from it.
    Returns the tokenizer and what meta.json says of the ids."""
    encoder, dtype = tokenizer_for(spec, documents, progress)
    with open(scratch / "all.bin", "wb") as f:
        counts = encode_documents(documents, encoder, f, dtype, progress, num_workers)
    split = split_documents(counts, val_fraction)
    write_split_files(out, scratch, split, {"": dtype})
    train_tokens, val_tokens = (sum(e - s for s, e in ranges) for ranges in (split.train, split.val))
    cut = None if split.cut is None else {"document": documents[split.cut[0]].name, "val_tokens": split.cut[1]}
    return encoder, {
        "dtype": dtype.name,
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "split": {
            "val_fraction": val_fraction,
            "method": split.method,
            "seed": SPLIT_SEED,
            "actual_val_fraction": val_tokens / (train_tokens + val_tokens),
            "val_documents": split.val_documents,
            "cut": cut,
        },  # the document split within (one at most), and how many of its ids validate
    }


def _write_shards(
    documents: list[Document], out: Path, scratch: Path, spec: str, shard_tokens: int, progress: bool, num_workers: int
) -> tuple[Tokenizer | CharTokenizer, dict[str, Any]]:
    """Encode every document into llm.c's shards, written into `scratch` as each fills, then
    renamed into `out` together at the end: an interrupted prepare leaves no part of a corpus that
    would read as a whole one. Returns the tokenizer and what meta.json says of the ids."""
    encoder, dtype = tokenizer_for(spec, documents, progress)
    name = out.resolve().name or "data"
    writer = ShardWriter(scratch, name, shard_tokens, dtype)
    n = encode_shards(documents, encoder, writer, progress, num_workers)
    writer.close()
    if writer.tokens["train"] == 0:
        raise DataError(
            f"the corpus's {writer.tokens['val']:,} tokens fit in one shard of shard_tokens {shard_tokens:,}, "
            f"which validates (the first shard does): none is left to train on; use a smaller shard_tokens",
            "shard_tokens",
        )
    for file in writer.files:
        os.replace(file, out / file.name)  # whole files, renamed within one disk
    files = {
        split: [f.name for f in writer.files if SHARD_NAME.fullmatch(f.name).group(2) == split]
        for split in ("val", "train")
    }
    return encoder, {
        "dtype": dtype.name,
        "train_tokens": writer.tokens["train"],
        "val_tokens": writer.tokens["val"],
        "shards": {"name": name, "shard_tokens": shard_tokens, "documents": n, **files},
    }


def tokenizer_for(spec: str, documents: list[Document], progress: bool) -> tuple[Tokenizer | CharTokenizer, np.dtype]:
    if not any(d.size or d.path is None for d in documents):
        raise DataError("the corpus is empty: no text in " + ", ".join(d.name for d in documents))
    encoder = make_tokenizer(spec, documents, progress)
    return encoder, ids_dtype(encoder.n_vocab)

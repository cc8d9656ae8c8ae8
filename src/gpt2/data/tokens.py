"""Training data: text to token ids on disk (`prepare`), reading them back (`open_data`), and batches.

A prepared directory holds what nanoGPT's data/*/prepare.py scripts write, plus what they leave
implicit:

    train.bin, val.bin   the ids, raw little-endian uint16 (uint32 past 65,536 ids): nanoGPT's format
    meta.json            tokenizer, vocabulary size, dtype, token counts, sources, split
    encoder.json + vocab.bpe, or chars.json: the tokenizer's own files, to decode what a model writes

and for conversations (`gpt2 prepare --chat`), train.mask.bin and val.mask.bin: a byte per id,
1 where the id is a target the loss counts (the assistant's replies), else 0; meta.json's "chat"
holds the template the conversations were rendered with.

or, with `shard_tokens`, llm.c's shards (NAME_val_000000.bin, NAME_train_000001.bin, ...; see
gpt2/data/corpora.py) in place of train.bin and val.bin. Inputs are text files (each a document),
JSON Lines and Parquet files (each record a document), and Hugging Face datasets, streamed.

Corpora larger than memory stream through: files are read in chunks of a few MB, cut only
where GPT-2's pre-tokenizer cuts anyway (so the ids equal those of the whole text), encoded by
all cores, and appended to disk. Batches are random windows drawn from a generator seeded by
(seed, iteration, micro-step): the same batches whether a run was resumed or how many
processes share it.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import itertools
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import regex
import torch

from gpt2._checks import int_between, is_integer, positive_int, real_between
from gpt2._files import atomic_path, atomic_write_text, read_json_object, writable_directory
from gpt2.data.corpora import (
    HEADER_BYTES,
    SHARD_NAME,
    Shards,
    ShardWriter,
    dataset_texts,
    is_record_file,
    read_header,
    record_texts,
)
from gpt2.errors import ChatTemplateError, DataError, InputTypeError, InvalidArgumentError, TokenIdError
from gpt2.examples import CORPORA, corpus_text
from gpt2.tokenizer import CHARS_FILE, EOT, GPT2_VOCAB_DIR, CharTokenizer, Tokenizer, load_tokenizer, same_vocabulary
from gpt2.tokenizer.chat import DEFAULT_TEMPLATE, ChatTemplate, read_conversations, special_token_names
from gpt2.tokenizer.registry import parse_tokenizer_spec

FORMAT = "gpt2-prepared"
CHUNK_BYTES = 4 << 20  # read and encode a few MB at a time
SPLIT_SEED = 1337  # which documents go to validation, when there are several
GPT2_VOCAB = 50257
LLMC_NAME = re.compile(r"(.+)_(train|val)\.bin")  # llm.c's names: tiny_shakespeare_val.bin
IGNORE = -100  # a target that is not scored (PyTorch's and Hugging Face's ignore_index)
MASK_DTYPE = np.dtype("u1")  # train.mask.bin, val.mask.bin: a byte per id, 1 where it is a target
MASK_FILES = ("train.mask.bin", "val.mask.bin")  # conversations': 1 (uint8) where the id is the assistant's

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
    """A text file, or a source of records (a .jsonl or .parquet file, a dataset): each record a
    document of its own, though the source splits (train | val) as one."""

    name: str  # as the user gave it, or the file found beneath a directory
    path: Path | None  # None: a dataset
    size: int  # bytes (0 for a dataset: unknown)
    records: Callable[[Callable[[int], object]], Iterator[str]] | None = None  # (on_bytes) -> each record's text


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
            documents.append(_once(Document(str(file), file, file.stat().st_size, records), seen))
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
    pending, offset = "", 0
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
            cut = len(pending) if anywhere else _last_safe_cut(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
    if pending:
        yield pending


def pieces(document: Document, on_bytes=lambda n: None, anywhere: bool = False) -> Iterator[str | None]:
    """A document's text in pieces, None after each record (or after a text file): where
    <|endoftext|> goes. A text file gives its chunks (at least one, "" when empty)."""
    if document.records is not None:
        for text in document.records(on_bytes):
            yield text
            yield None
        return
    empty = True
    for chunk in read_chunks(document, on_bytes, anywhere):
        empty = False
        yield chunk
    if empty:
        yield ""
    yield None


def _last_safe_cut(text: str) -> int:
    """The last safe cut in the second half of text (0: none), so chunks stay about CHUNK_BYTES.
    With none (a line of CJK text as long as a chunk), the next block is read and tried too."""
    match = _SAFE_CUT.search(text, len(text) // 2)
    return match.start() if match else 0


# ------------------------------------------------------------------ prepare


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
    documents: list[Document], tokenizer, num_workers: int, on_bytes=lambda n: None
) -> Iterator[tuple[int, list[int] | None]]:
    """(document, ids) for each piece of every document in order (see `pieces`), and (document,
    None) where a record or a text file ends.

    Pieces are batched across documents, about CHUNK_BYTES per worker, and each batch encoded on
    the workers, so that a corpus of many small records keeps every worker busy as one large
    file does, and memory holds one batch whatever the corpus's size."""
    batch: list[tuple[int, str | None]] = []
    held = 0  # characters in the batch, and one for each piece (a million empty records are a batch too)
    anywhere = isinstance(tokenizer, CharTokenizer)
    for d, document in enumerate(documents):
        for piece in pieces(document, on_bytes, anywhere):
            batch.append((d, piece))
            held += len(piece or "") + 1
            if held >= num_workers * CHUNK_BYTES:
                yield from _encode_batch(batch, tokenizer, num_workers)
                batch, held = [], 0
    yield from _encode_batch(batch, tokenizer, num_workers)


def _encode_batch(
    batch: list[tuple[int, str | None]], tokenizer, num_workers: int
) -> Iterator[tuple[int, list[int] | None]]:
    # a corpus's "<|endoftext|>" is its characters, as llm.c's encode_ordinary: documents end with the token
    encoded = iter(tokenizer.encode_ordinary_batch([p for _, p in batch if p is not None], num_workers=num_workers))
    for d, piece in batch:
        yield d, None if piece is None else next(encoded)


def encode_documents(
    documents: list[Document], tokenizer, out: BinaryIO, dtype: np.dtype, progress: bool, num_workers: int
) -> list[int]:
    """Append every document's ids to `out`, each record or text file followed by <|endoftext|>
    (where the tokenizer has one); returns the number of ids of each document."""
    from tqdm.auto import tqdm

    counts = [0] * len(documents)
    eot = [] if tokenizer.eot_token is None else [tokenizer.eot_token]
    total = sum(d.size for d in documents) if all(d.path is not None for d in documents) else None
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress) as bar:
        for d, ids in encode_pieces(documents, tokenizer, num_workers, bar.update):
            ids = eot if ids is None else ids
            out.write(np.asarray(ids, dtype=dtype).tobytes())
            counts[d] += len(ids)
    return counts


def encode_shards(documents: list[Document], tokenizer, writer: ShardWriter, progress: bool, num_workers: int) -> int:
    """Write every document's ids into llm.c's shards, each record or text file *preceded* by
    <|endoftext|> (llm.c's fineweb.py: "the special <|endoftext|> token delimits all documents");
    returns the number of documents (records and text files)."""
    from tqdm.auto import tqdm

    eot, starts, n = tokenizer.eot_token, True, 0
    with tqdm(unit="tok", unit_scale=True, desc="tokenizing", disable=not progress) as bar:
        for _, ids in encode_pieces(documents, tokenizer, num_workers):
            if ids is None:  # the next piece starts a document
                starts = True
                continue
            if starts:
                ids, n, starts = ([] if eot is None else [eot]) + ids, n + 1, False
            writer.write(np.asarray(ids, dtype=writer.buffer.dtype))
            bar.update(len(ids))
    return n


@dataclass
class Split:
    """Which ids train and which validate: (start, end) ranges into the ids of every document in order."""

    train: list[tuple[int, int]]
    val: list[tuple[int, int]]
    # "tail": one document, cut; "documents": whole documents, and the tail of at most one;
    # "conversations": whole ones only
    method: str
    val_documents: int = 0  # documents (or conversations) that validate whole
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
    with _scratch_in(out, overwrite) as scratch:
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
    return _finish(out, encoder, tokenizer, {**meta, "sources": sources}, overwrite)


@contextlib.contextmanager
def _scratch_in(out: Path, overwrite: bool) -> Iterator[Path]:
    """A scratch directory inside `out` (beside it: no copy across disks), `out` made if needed
    and checked first; an error leaves no empty `out` behind that this made."""
    _check_out(out, overwrite)
    created = not out.exists()
    writable_directory(out)
    try:
        with tempfile.TemporaryDirectory(dir=out, prefix=".prepare-") as scratch:
            yield Path(scratch)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _finish(
    out: Path, encoder: Tokenizer | CharTokenizer, spec: str, meta: dict[str, Any], overwrite: bool
) -> dict[str, Any]:
    """Once the ids are in place: on an overwrite, remove what the new data does not have; then
    the tokenizer's files, and meta.json last (it vouches for the rest). Returns the meta written."""
    meta = {"format": FORMAT, "version": 1, "tokenizer": spec, "vocab_size": encoder.n_vocab, **meta}
    if overwrite:
        _remove_other_tokenizers(out, spec)
        _remove_other_data(out, meta)
    _save_tokenizer(encoder, spec, out)
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


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
    encoder, dtype = _tokenizer_for(spec, documents, progress)
    with open(scratch / "all.bin", "wb") as f:
        counts = encode_documents(documents, encoder, f, dtype, progress, num_workers)
    split = split_documents(counts, val_fraction)
    _write_split_files(out, scratch, split, {"": dtype})
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
    encoder, dtype = _tokenizer_for(spec, documents, progress)
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


def _write_split_files(out: Path, scratch: Path, split: Split, kinds: dict[str, np.dtype]) -> None:
    """out/train{kind}.bin and out/val{kind}.bin for each kind ("": the ids, ".mask": their mask),
    cut from scratch/all{kind}.bin by the ranges of `split`. All are renamed into place together,
    at the end: never a new train.bin beside an old val.bin, or ids beside another's mask."""
    with contextlib.ExitStack() as renames:
        for kind, dtype in kinds.items():
            source = np.memmap(scratch / f"all{kind}.bin", dtype=dtype, mode="r")
            for name, ranges in (("train", split.train), ("val", split.val)):
                with open(renames.enter_context(atomic_path(out / f"{name}{kind}.bin")), "wb") as f:
                    for start, end in ranges:
                        f.write(source[start:end].tobytes())
            del source


def _tokenizer_for(spec: str, documents: list[Document], progress: bool) -> tuple[Tokenizer | CharTokenizer, np.dtype]:
    if not any(d.size or d.path is None for d in documents):
        raise DataError("the corpus is empty: no text in " + ", ".join(d.name for d in documents))
    encoder = make_tokenizer(spec, documents, progress)
    return encoder, ids_dtype(encoder.n_vocab)


def _data_files(out: Path) -> list[str]:
    """The names of prepared data's files in `out`: ours, and llm.c's shards."""
    names = [name for name in ("train.bin", "val.bin", *MASK_FILES, "meta.json") if (out / name).exists()]
    return names + sorted(p.name for p in out.glob("*.bin") if SHARD_NAME.fullmatch(p.name)) if out.is_dir() else names


def _check_out(out: Path, overwrite: bool) -> None:
    existing = _data_files(out)
    if existing and not overwrite:
        shown = ", ".join(existing[:4]) + (f" and {len(existing) - 4} more" if len(existing) > 4 else "")
        raise DataError(f"{out} already holds prepared data ({shown}): pass overwrite=True to replace it", "overwrite")


def _remove_other_data(out: Path, meta: dict[str, Any]) -> None:
    """An overwrite leaves no stale data to be read by mistake: train.bin and val.bin beside new
    shards, shards beside a new train.bin and val.bin, more shards than the new data has, or the
    masks of conversations beside new text."""
    shards = meta.get("shards")
    kept = {"meta.json"} | ({"train.bin", "val.bin"} if shards is None else set(shards["val"] + shards["train"]))
    kept |= set(MASK_FILES) if "chat" in meta else set()
    for name in set(_data_files(out)) - kept:
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()


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


# ------------------------------------------------------------------ conversations


def prepare_chat(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str = "gpt2",
    val_fraction: float = 0.1,
    *,
    chat_template: str | os.PathLike | ChatTemplate | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Render and encode the conversations of JSON Lines files (`{"messages": [...]}` a line; see
    `gpt2.tokenizer.chat.read_conversations`; directories and "-" as `prepare` takes them) with
    `chat_template` (a Jinja2 file, or gpt2's default) into `out`: train.bin and val.bin, the
    conversations whole and in order (`val_fraction` of them validates), train.mask.bin and
    val.mask.bin beside them (uint8, 1 on the ids of the assistant's replies), the tokenizer's
    files, and meta.json, whose "chat" entry keeps the template. `tokenizer`: gpt2, or bpe:N
    trained on the rendered conversations. Returns the meta written."""
    val_fraction = real_between("val_fraction", val_fraction, 0, 1, open_low=True, open_high=True)
    parse_tokenizer_spec(tokenizer)
    if tokenizer == "char":
        raise InvalidArgumentError(
            "the char tokenizer cannot hold a conversation: a chat template ends each reply with "
            "<|endoftext|>, a special token a vocabulary of characters does not have; use gpt2 or bpe:N",
            "tokenizer",
        )
    template = _chat_template(chat_template)
    out = Path(out)
    with _scratch_in(out, overwrite) as scratch:
        files = find_documents(inputs, scratch / "stdin.jsonl")
        encoder, meta = _write_conversations(files, out, scratch, template, tokenizer, val_fraction, progress)
    sources = {"inputs": [str(i) for i in inputs], "files": len(files)}
    return _finish(out, encoder, tokenizer, {**meta, "sources": sources}, overwrite)


def _chat_template(given: str | os.PathLike | ChatTemplate | None) -> ChatTemplate:
    if given is None:
        return ChatTemplate(DEFAULT_TEMPLATE, "gpt2's default chat template")
    if isinstance(given, ChatTemplate):
        return given
    if isinstance(given, (str, os.PathLike)):
        return ChatTemplate.from_file(given)
    raise InputTypeError(
        f"chat_template is the path of a Jinja2 file or a ChatTemplate, got {given!r}", "chat_template"
    )


def split_conversations(counts: list[int], val_fraction: float) -> Split:
    """Train and validation ids of conversations of `counts` ids each, split whole: round(F * n)
    of them (at least 1, at most n - 1), drawn with a fixed seed, validate."""
    n = len(counts)
    if n < 2:
        raise DataError(
            f"{n} conversation{'s' * (n != 1)} cannot be split whole into training and validation: each split "
            f"needs one (val_fraction {val_fraction} of them validates, at least 1); give 2 or more",
            "val_fraction",
        )
    n_val = min(max(round(val_fraction * n), 1), n - 1)
    validates = set(map(int, np.random.default_rng(SPLIT_SEED).permutation(n)[:n_val]))
    starts = [0, *itertools.accumulate(counts)]  # conversation c holds ids starts[c] .. starts[c + 1]
    train: list[tuple[int, int]] = []
    val: list[tuple[int, int]] = []
    for c in range(n):
        ranges = val if c in validates else train
        if ranges and ranges[-1][1] == starts[c]:  # runs of neighbours are one range
            ranges[-1] = (ranges[-1][0], starts[c + 1])
        else:
            ranges.append((starts[c], starts[c + 1]))
    return Split(train, val, "conversations", n_val)


def _conversations(files: list[Document]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """("FILE, line N", messages) for each conversation of the files, in order."""
    for file in files:
        for line, messages in read_conversations(file.path, file.name):
            yield f"{file.name}, line {line}", messages


def _at(where: str, render: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A template's render or encoding of the conversation at `where`; its error names the line of the file too."""
    try:
        return render(*args, **kwargs)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{where}: {e}", "chat_template") from None


def _chat_tokenizer(spec: str, template: ChatTemplate, files: list[Document], progress: bool) -> Tokenizer:
    """GPT-2's, or bpe:N trained on the rendered conversations cut at <|endoftext|>: the trained
    vocabulary's special token (as GPT-2's), never text to merge."""
    vocab_size = parse_tokenizer_spec(spec)
    if vocab_size is None:
        return Tokenizer.gpt2()
    names = special_token_names(
        Tokenizer.gpt2()
    )  # a trained vocabulary's special tokens are GPT-2's: <|endoftext|> alone
    texts = (
        piece
        for where, messages in _conversations(files)
        for piece in _at(where, template.render, messages, **names).split(EOT)
        if piece
    )
    try:
        return Tokenizer.train(texts, vocab_size, progress=progress)
    except InvalidArgumentError as e:
        raise DataError(f"cannot train a tokenizer: {e}") from None


def _write_conversations(
    files: list[Document],
    out: Path,
    scratch: Path,
    template: ChatTemplate,
    spec: str,
    val_fraction: float,
    progress: bool,
) -> tuple[Tokenizer, dict[str, Any]]:
    """Encode every conversation into scratch/all.bin and its mask into scratch/all.mask.bin,
    then cut both into out's splits. Returns the tokenizer and what meta.json says of the ids."""
    from tqdm.auto import tqdm

    encoder = _chat_tokenizer(spec, template, files, progress)
    dtype = ids_dtype(encoder.n_vocab)
    counts, replies, longest = [], 0, (0, "")
    with (
        open(scratch / "all.bin", "wb") as ids_file,
        open(scratch / "all.mask.bin", "wb") as mask_file,
        tqdm(unit="conv", desc="encoding", disable=not progress) as bar,
    ):
        for where, messages in _conversations(files):
            ids, mask = _at(where, template.encode_with_mask, encoder, messages)
            ids_file.write(np.asarray(ids, dtype=dtype).tobytes())
            mask_file.write(np.asarray(mask, dtype=MASK_DTYPE).tobytes())
            counts.append(len(ids))
            replies += sum(mask)
            longest = (len(ids), where) if len(ids) > longest[0] else longest
            bar.update()
    if not replies:
        raise DataError(
            f"{template.origin} marks no reply in {len(counts):,} conversations: the tokens to learn are those "
            f"inside {{% generation %}}...{{% endgeneration %}} blocks; put each assistant message in one",
            "chat_template",
        )
    split = split_conversations(counts, val_fraction)
    _write_split_files(out, scratch, split, {"": dtype, ".mask": MASK_DTYPE})
    mask = np.memmap(scratch / "all.mask.bin", dtype=MASK_DTYPE, mode="r")
    mask_tokens = {
        name: sum(int(mask[s:e].sum()) for s, e in ranges)
        for name, ranges in (("train", split.train), ("val", split.val))
    }
    del mask
    train_tokens, val_tokens = (sum(e - s for s, e in ranges) for ranges in (split.train, split.val))
    return encoder, {
        "dtype": dtype.name,
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "split": {
            "val_fraction": val_fraction,
            "method": "conversations",
            "seed": SPLIT_SEED,
            "actual_val_fraction": val_tokens / (train_tokens + val_tokens),
            "val_conversations": split.val_documents,
        },
        "chat": {
            "template": template.source,
            "conversations": {"train": len(counts) - split.val_documents, "val": split.val_documents},
            "mask_tokens": mask_tokens,
            "longest": longest[0],
            "longest_at": longest[1],
        },
    }


# ------------------------------------------------------------------ reading prepared data


@dataclass
class TokenData:
    """The two splits of prepared data, as read-only arrays of ids on disk (a split of several
    shards: their ids as one stream, corpora.Shards)."""

    directory: Path
    format: str  # "gpt2", "nanogpt" or "llm.c"
    train: np.ndarray | Shards
    val: np.ndarray | Shards
    vocab_size: int
    tokenizer: Tokenizer | CharTokenizer | None
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(
        default_factory=dict
    )  # split -> the file it came from (shards: DIR/NAME_train_*.bin)
    shards: dict[str, list[Path]] = field(default_factory=dict)  # split -> its files, for data in several
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # split -> uint8, 1 where an id is a target (chat data)
    chat_template: str | None = None  # the template chat data was rendered with (meta.json's chat.template)

    def check_vocabulary(self, tokenizer: Tokenizer | CharTokenizer | None, n_vocab: int, model: str) -> None:
        """Raise unless a model of n_vocab ids that reads `tokenizer` (None: unknown) can read these ids."""
        if self.vocab_size > n_vocab:
            raise InvalidArgumentError(
                f"the data in {self.directory} has a vocabulary of {self.vocab_size} ids, more than the "
                f"{n_vocab} of the model {model}: prepare it with the model's tokenizer"
            )
        if tokenizer is not None and self.tokenizer is not None and not same_vocabulary(tokenizer, self.tokenizer):
            raise InvalidArgumentError(
                f"the data in {self.directory} was prepared with another tokenizer ({self.tokenizer!r}) than "
                f"the model {model} reads ({tokenizer!r}): prepare it with the model's tokenizer"
            )

    def check_block_size(self, block_size: int) -> None:
        """Raise unless each split holds a window of block_size + 1 ids (the inputs and their next ids)."""
        block_size = positive_int("block_size", block_size)
        for split, ids in (("train", self.train), ("val", self.val)):
            if len(ids) < block_size + 1:
                raise DataError(
                    f"{self.files[split]} holds {len(ids)} ids, too short for block_size {block_size}: "
                    f"a window needs {block_size + 1}; use a smaller block_size or more text",
                    "block_size",
                )


def open_data(path: str | os.PathLike) -> TokenData:
    """Prepared data: a directory `gpt2 prepare` wrote, nanoGPT's train.bin/val.bin (with its
    meta.pkl for character vocabularies), or llm.c's .bin files. Every id is checked against the
    vocabulary once, here, so that training never meets one out of range."""
    path = Path(path)
    if path.is_file() and LLMC_NAME.fullmatch(path.name):
        data = _open_llmc(path.parent, {split: [file] for split, file in _llmc_pair(path).items()})
    elif (path / "meta.json").is_file():
        data = _open_ours(path)
    elif (path / "train.bin").is_file():
        data = _open_nanogpt(path)
    elif path.is_dir() and any(SHARD_NAME.fullmatch(p.name) for p in path.glob("*.bin")):
        data = _open_llmc(path, _llmc_shards(path))
    elif path.is_dir() and list(path.glob("*_train.bin")) and list(path.glob("*_val.bin")):
        data = _open_llmc(path, {split: [_only_llmc_file(path, split)] for split in ("train", "val")})
    elif not path.exists():
        raise DataError(f"data {str(path)!r} does not exist: give a directory gpt2 prepare wrote", "data")
    elif path.is_file():
        raise DataError(
            f"{path} is a file, not prepared data: give the directory that holds train.bin and val.bin "
            f"(run gpt2 prepare), or one of llm.c's NAME_train.bin / NAME_val.bin files"
        )
    else:
        raise DataError(
            f"{path} holds no prepared data: expected train.bin and val.bin (run gpt2 prepare), "
            f"llm.c's *_train.bin and *_val.bin, or llm.c's shards (NAME_val_000000.bin, NAME_train_000001.bin, ...)"
        )
    for split, ids in (("train", data.train), ("val", data.val)):
        for part, file in zip(ids.parts, data.shards[split]) if isinstance(ids, Shards) else [(ids, data.files[split])]:
            _check_ids(part, data.vocab_size, file)
    for split, mask in data.masks.items():
        _check_mask(
            mask, data.directory / f"{split}.mask.bin", split, data.meta["chat"].get("mask_tokens", {}).get(split)
        )
    return data


def _memmap(path: Path, dtype: np.dtype, offset: int = 0) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path} is missing")
    size = path.stat().st_size - offset
    if size % dtype.itemsize:
        raise DataError(
            f"{path} holds {size} bytes, not a whole number of {dtype.name} ids ({dtype.itemsize} bytes each)"
        )
    if size == 0:  # numpy cannot map an empty file
        empty = np.zeros(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset)


def _check_ids(ids: np.ndarray, vocab_size: int, path: Path, chunk: int = 1 << 26) -> None:
    for start in range(0, len(ids), chunk):
        high = int(ids[start : start + chunk].max())
        if high >= vocab_size:
            raise TokenIdError(
                f"{path} holds token id {high}, beyond its vocabulary of {vocab_size} ids (0..{vocab_size - 1})"
            )


def _check_mask(mask: np.ndarray, path: Path, split: str, expected: object, chunk: int = 1 << 26) -> None:
    """Raise unless the mask holds only 0 and 1, marks some target, and as many as meta.json says (where it says)."""
    marked = 0
    for start in range(0, len(mask), chunk):
        part = mask[start : start + chunk]
        if int(part.max()) > 1:
            raise DataError(
                f"{path} holds the byte {int(part.max())}: a mask holds 1 (a target) or 0; prepare the data again"
            )
        marked += int(np.count_nonzero(part))
    if marked == 0:
        raise DataError(
            f"{path} marks no target: the loss would count nothing; give conversations with assistant turns"
        )
    if expected is not None and marked != expected:
        raise DataError(
            f"{path} marks {marked} targets, but meta.json says chat.mask_tokens.{split} = {expected!r}: "
            f"prepare the data again"
        )


def _open_ours(path: Path) -> TokenData:
    meta = read_json_object(path / "meta.json", DataError)
    if meta.get("format") != FORMAT or meta.get("version") != 1:
        raise DataError(
            f"{path / 'meta.json'} is not gpt2 prepare's (format {meta.get('format')!r}, version "
            f"{meta.get('version')!r}; expected {FORMAT!r}, version 1): run gpt2 prepare"
        )
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise DataError(f"{path / 'meta.json'}: dtype is {meta.get('dtype')!r}, not uint16 or uint32")
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    shards = _our_shards(path, meta) if "shards" in meta else {s: [path / f"{s}.bin"] for s in ("train", "val")}
    splits = _read_splits(path, shards) if "shards" in meta else {s: [_memmap(f[0], dtype)] for s, f in shards.items()}
    for split, parts in splits.items():
        where = _split_files(path, shards)[split]
        if parts[0].dtype != dtype:
            raise DataError(
                f"{where} holds {parts[0].dtype.name} ids, but meta.json says {meta['dtype']}: prepare the data again"
            )
        if sum(map(len, parts)) != meta.get(f"{split}_tokens"):
            raise DataError(
                f"{where} hold{'s' * (len(parts) == 1)} {sum(map(len, parts))} ids, but meta.json says "
                f"{split}_tokens = {meta.get(f'{split}_tokens')!r}: prepare the data again"
            )
    vocab_size = meta.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise DataError(f"{path / 'meta.json'}: vocab_size is {vocab_size!r}, not a positive integer")
    tokenizer = _our_tokenizer(path, meta.get("tokenizer"))
    if tokenizer is not None and tokenizer.n_vocab != vocab_size:
        raise DataError(
            f"{path}: meta.json says vocab_size {vocab_size}, but its tokenizer has {tokenizer.n_vocab} ids"
        )
    ids = {split: parts[0] if len(parts) == 1 else Shards(parts) for split, parts in splits.items()}
    files = _split_files(path, shards)
    masks, template = _our_chat(path, meta, ids, files)
    return TokenData(
        path, "gpt2", ids["train"], ids["val"], vocab_size, tokenizer, meta, files, shards, masks, template
    )


def _our_chat(
    path: Path, meta: dict[str, Any], ids: dict[str, np.ndarray | Shards], files: dict[str, Path]
) -> tuple[dict[str, np.ndarray], str | None]:
    """The masks of conversations (train.mask.bin, val.mask.bin, each as long as its ids) and
    their template, where meta.json has "chat"; ({}, None) for other data."""
    if "chat" not in meta:
        return {}, None
    chat = meta["chat"]
    if (
        not isinstance(chat, dict)
        or not isinstance(chat.get("template"), str)
        or not isinstance(chat.get("mask_tokens", {}), dict)
    ):
        raise DataError(
            f"{path / 'meta.json'}: chat is not an object with the template's text (chat.template) and "
            f"mask_tokens by split: prepare the data again"
        )
    masks = {}
    for split in ("train", "val"):
        file = path / f"{split}.mask.bin"
        if not file.is_file():
            raise DataError(
                f"{file} is missing: meta.json says the data holds conversations (chat), whose loss counts the "
                f"targets the mask marks; prepare the data again"
            )
        masks[split] = _memmap(file, MASK_DTYPE)
        if len(masks[split]) != len(ids[split]):
            raise DataError(
                f"{file} holds {len(masks[split])} mask bytes, but {files[split]} holds {len(ids[split])} ids: "
                f"a mask has a byte for each id; prepare the data again"
            )
    return masks, chat["template"]


def _our_shards(path: Path, meta: dict[str, Any]) -> dict[str, list[Path]]:
    """The shards meta.json lists for each split."""
    shards = meta["shards"]
    names = {split: shards.get(split) if isinstance(shards, dict) else None for split in ("train", "val")}
    for split, listed in names.items():
        if (
            not isinstance(listed, list)
            or not listed
            or not all(isinstance(n, str) and SHARD_NAME.fullmatch(n) for n in listed)
        ):
            raise DataError(
                f"{path / 'meta.json'}: shards.{split} is {listed!r}, not a list of shard files: prepare the data again"
            )
    return {split: [path / name for name in listed] for split, listed in names.items()}


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
        raise DataError(
            f"{path} is not a plain-data pickle ({e}); pickles can run code, so only dicts, "
            f"lists, strings and numbers are read"
        ) from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    size = meta.get("vocab_size") if isinstance(meta, dict) else None
    if (
        not isinstance(itos, dict)
        or not is_integer(size)
        or not all(is_integer(i) for i in itos)
        or set(itos) != set(range(size))
    ):
        raise DataError(
            f"{path} is not nanoGPT's meta.pkl: expected {{'vocab_size': N, 'itos': {{0..N-1: char}}, 'stoi': ...}}"
        )
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
    """llm.c's token file: 256 little-endian int32 (magic, version, count), then the ids: uint16
    (version 1, GPT-2's) or uint32 (version 7, Llama 3's). See gpt2/data/corpora.py."""
    if not path.is_file():
        raise DataError(f"{path} is missing")
    dtype, count = read_header(path)
    ids = _memmap(path, dtype, offset=HEADER_BYTES)
    if len(ids) != count:
        raise DataError(f"{path}: its header counts {count} ids, but the file holds {len(ids)}")
    return ids


def _read_splits(directory: Path, files: dict[str, list[Path]]) -> dict[str, list[np.ndarray]]:
    """Each split's llm.c token files; all of one dtype (a run cannot read uint16 and uint32 ids as one)."""
    splits = {split: [read_llmc(file) for file in files[split]] for split in ("train", "val")}
    by_dtype: dict[str, list[str]] = {}
    for split in ("val", "train"):
        for file, ids in zip(files[split], splits[split]):
            by_dtype.setdefault(ids.dtype.name, []).append(file.name)
    if len(by_dtype) > 1:
        said = " and ".join(
            f"{dtype} ids ({', '.join(names[:3])}{', ...' * (len(names) > 3)})" for dtype, names in by_dtype.items()
        )
        raise DataError(
            f"{directory} mixes llm.c token files of {said}: keep the files of one tokenizer in a directory"
        )
    return splits


def _split_files(directory: Path, files: dict[str, list[Path]]) -> dict[str, Path]:
    """The file of each split, as messages name it: DIR/NAME_train_*.bin for several shards."""
    return {
        split: found[0]
        if len(found) == 1
        else directory / f"{SHARD_NAME.fullmatch(found[0].name).group(1)}_{split}_*.bin"
        for split, found in files.items()
    }


def _llmc_pair(path: Path) -> dict[str, Path]:
    """Both splits, given one of llm.c's files (NAME_train.bin or NAME_val.bin)."""
    name = LLMC_NAME.fullmatch(path.name).group(1)
    files = {split: path.with_name(f"{name}_{split}.bin") for split in ("train", "val")}
    for file in files.values():
        if not file.is_file():
            raise DataError(f"{file} is missing: llm.c's data is a pair of files, {name}_train.bin and {name}_val.bin")
    return files


def _only_llmc_file(directory: Path, split: str) -> Path:
    found = sorted(directory.glob(f"*_{split}.bin"))
    if len(found) > 1:
        raise DataError(
            f"{directory} holds several llm.c {split} files ({', '.join(p.name for p in found)}): "
            f"keep one, or give the path of one NAME_train.bin"
        )
    return found[0]


def _llmc_shards(directory: Path) -> dict[str, list[Path]]:
    """The shards of each split in a directory of llm.c's shards (of one data set), in order."""
    found = sorted(p for p in directory.glob("*.bin") if SHARD_NAME.fullmatch(p.name))
    names = sorted({SHARD_NAME.fullmatch(p.name).group(1) for p in found})
    if len(names) > 1:
        raise DataError(
            f"{directory} holds the shards of several data sets ({', '.join(names)}): keep one in a directory"
        )
    files = {split: [p for p in found if SHARD_NAME.fullmatch(p.name).group(2) == split] for split in ("train", "val")}
    for split, shards in files.items():
        if not shards:
            raise DataError(
                f"{directory} holds llm.c shards of {names[0]} but no {split} shard ({names[0]}_{split}_NNNNNN.bin)"
            )
    return files


def _open_llmc(directory: Path, files: dict[str, list[Path]]) -> TokenData:
    """llm.c's token files, without gpt2 prepare's meta.json: GPT-2's ids (uint16, version 1)."""
    splits = _read_splits(directory, files)
    if splits["train"][0].dtype.itemsize != 2:
        raise DataError(
            f"{_split_files(directory, files)['train']} holds llm.c's uint32 ids (version 7, Llama 3's), of a "
            f"vocabulary gpt2 does not know: read are GPT-2's uint16 ids, "
            f"or data gpt2 prepare wrote (with its meta.json)"
        )
    ids = {split: parts[0] if len(parts) == 1 else Shards(parts) for split, parts in splits.items()}
    return TokenData(
        directory,
        "llm.c",
        ids["train"],
        ids["val"],
        GPT2_VOCAB,
        Tokenizer.gpt2(),
        {},
        _split_files(directory, files),
        files,
    )


# ------------------------------------------------------------------ batches


def get_batch(
    ids: np.ndarray,
    block_size: int,
    batch_size: int,
    *,
    seed: int,
    iteration: int,
    micro_step: int,
    device: str | torch.device = "cpu",
    mask: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y: (batch_size, block_size) int64 windows of ids at random offsets, y = x shifted by one;
    with a `mask` (a byte per id, TokenData.masks), y is IGNORE where the mask of y's id is 0.

    The offsets come from a generator seeded by (seed, iteration, micro_step), so a batch
    depends on nothing else: not on resumption, not on which process draws it, not on the mask.
    """
    block_size, batch_size = positive_int("block_size", block_size), positive_int("batch_size", batch_size)
    for name, value in (("seed", seed), ("iteration", iteration), ("micro_step", micro_step)):
        int_between(name, value, 0, 2**63 - 1, "a whole number")
    if len(ids) < block_size + 1:
        raise DataError(
            f"{len(ids)} ids are too short for block_size {block_size}: a window needs {block_size + 1}", "block_size"
        )
    if mask is not None and len(mask) != len(ids):
        raise InvalidArgumentError(f"mask holds {len(mask)} bytes for {len(ids)} ids: it needs one for each id", "mask")
    rng = np.random.default_rng([seed, iteration, micro_step])
    offsets = rng.integers(0, len(ids) - block_size, size=batch_size)
    windows = torch.from_numpy(np.stack([ids[i : i + block_size + 1] for i in offsets]).astype(np.int64))  # (B, T + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    if mask is not None:
        scored = torch.from_numpy(np.stack([mask[i + 1 : i + block_size + 1] for i in offsets]) != 0)  # (B, T): y's
        y = y.masked_fill(~scored, IGNORE)
    if torch.device(device).type == "cuda":  # pinned, so the copy overlaps the work already queued
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)

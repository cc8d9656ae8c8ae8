"""The token files' format, written and read. A prepared directory holds what nanoGPT's data/*/prepare.py
scripts write, plus what they leave implicit:

    train.bin, val.bin   the ids, raw little-endian uint16 (uint32 past 65,536 ids): nanoGPT's format
    meta.json            tokenizer, vocabulary size, dtype, token counts, sources, split
    encoder.json + vocab.bpe, or chars.json: the tokenizer's own files, to decode what a model writes

and, where meta.json has a "mask" entry (what the mask marks, and how many by split) or a "chat"
one (conversations, `gpt2 prepare --chat`: the template they were rendered with), train.mask.bin
and val.mask.bin: a byte per id, 1 where the id is a target the loss counts (the assistant's
replies; in synthetic data the ids copying predicts), else 0. Data made of rows of N ids (each a
sample on its own, `gpt2 prepare --synthetic`) says so in meta.json's "row": training draws whole
rows, never a window across two (gpt2/data/batches.py). Or, with `shard_tokens`, llm.c's shards
(NAME_val_000000.bin, NAME_train_000001.bin, ...; see gpt2/data/corpora.py) in place of train.bin
and val.bin. A directory is written in a scratch directory beside it and moved into place whole;
`open_data` reads ours, nanoGPT's and llm.c's back as a `TokenData`, each file checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from gpt2._checks import is_integer, positive_int
from gpt2._files import atomic_path, atomic_write_text, read_json_object, writable_directory
from gpt2.data.corpora import HEADER_BYTES, SHARD_NAME, Shards, read_header
from gpt2.errors import DataError, InvalidArgumentError, TokenIdError
from gpt2.tokenizer import CHARS_FILE, GPT2_VOCAB_DIR, CharTokenizer, Tokenizer, load_tokenizer, same_vocabulary

FORMAT = "gpt2-prepared"
GPT2_VOCAB = 50257
LLMC_NAME = re.compile(r"(.+)_(train|val)\.bin")  # llm.c's names: tiny_shakespeare_val.bin
MASK_DTYPE = np.dtype("u1")  # train.mask.bin, val.mask.bin: a byte per id, 1 where it is a target
MASK_FILES = ("train.mask.bin", "val.mask.bin")  # 1 (uint8) where the id is a target: conversations' replies, ...
CHAT_MARKS = "the replies"  # what the mask of conversations marks (their meta.json has "chat", no "mask")
COPY_BYTES = 1 << 20  # train.bin and val.bin are cut from the ids a MB at a time


def ids_dtype(n_vocab: int) -> np.dtype:
    """uint16 (nanoGPT's) where every id fits, else uint32; little-endian either way."""
    return np.dtype("<u2") if n_vocab <= 65536 else np.dtype("<u4")


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


@contextlib.contextmanager
def scratch_in(out: Path, overwrite: bool) -> Iterator[Path]:
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


def finish(
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


def write_split_files(out: Path, scratch: Path, split: Split, kinds: dict[str, np.dtype]) -> None:
    """out/train{kind}.bin and out/val{kind}.bin for each kind ("": the ids, ".mask": their mask),
    cut from scratch/all{kind}.bin by the ranges of `split`. All are renamed into place together,
    at the end: never a new train.bin beside an old val.bin, or ids beside another's mask."""
    with contextlib.ExitStack() as renames:
        for kind, dtype in kinds.items():
            size = np.dtype(dtype).itemsize
            with open(scratch / f"all{kind}.bin", "rb") as source:
                for name, ranges in (("train", split.train), ("val", split.val)):
                    with open(renames.enter_context(atomic_path(out / f"{name}{kind}.bin")), "wb") as f:
                        for start, end in ranges:
                            _copy_range(source, f, start * size, end * size)


def _copy_range(source: BinaryIO, target: BinaryIO, start: int, end: int) -> None:
    """Bytes start..end of `source` appended to `target`, COPY_BYTES at a time: memory holds a
    block, not the split (which a slice of a memory map, made bytes, would hold whole)."""
    source.seek(start)
    while start < end:
        block = source.read(min(COPY_BYTES, end - start))
        if not block:
            raise DataError(f"{source.name} ends at byte {start}, before byte {end} of the ids it should hold")
        target.write(block)
        start += len(block)


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
    kept |= set(MASK_FILES) if "chat" in meta or "mask" in meta else set()
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
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # split -> uint8, 1 where an id is a target
    chat_template: str | None = None  # the template chat data was rendered with (meta.json's chat.template)
    mask_marks: str | None = None  # what the masks mark, as a sentence ends: "the replies" (conversations)
    row: int | None = None  # ids a row, for data made of rows (meta.json's "row"): batches draw whole rows

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
        """Raise unless each split holds a window of block_size + 1 ids (the inputs and their next ids),
        and, for data made of rows, a row holds one (a batch takes the first block_size + 1 ids of rows)."""
        block_size = positive_int("block_size", block_size)
        if self.row is not None and block_size + 1 > self.row:
            raise DataError(
                f"the data in {self.directory} is made of rows of {self.row} ids, too short for block_size "
                f"{block_size}: a window needs {block_size + 1} ids of one row; use a block_size up to {self.row - 1}",
                "block_size",
            )
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
        _check_mask(mask, data.directory / f"{split}.mask.bin", split, *_mask_count(data.meta, split))
    return data


def _mask_count(meta: dict[str, Any], split: str) -> tuple[object, str]:
    """The targets meta.json says a split's mask marks (None: it does not say), and the entry that says it."""
    if "mask" in meta:
        return meta["mask"]["tokens"].get(split), f"mask.tokens.{split}"
    return meta["chat"].get("mask_tokens", {}).get(split), f"chat.mask_tokens.{split}"


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


def _check_mask(mask: np.ndarray, path: Path, split: str, expected: object, entry: str, chunk: int = 1 << 26) -> None:
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
            f"{path} marks no target: the loss would count nothing; give conversations with assistant turns "
            f"(or more rows of synthetic data)"
        )
    if expected is not None and marked != expected:
        raise DataError(
            f"{path} marks {marked} targets, but meta.json says {entry} = {expected!r}: prepare the data again"
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
    row = _our_row(path, meta, ids, files)
    template = _our_chat_template(path, meta)
    masks = _our_masks(path, meta, ids, files)
    marks = None if not masks else meta["mask"]["marks"] if "mask" in meta else CHAT_MARKS
    return TokenData(
        path, "gpt2", ids["train"], ids["val"], vocab_size, tokenizer, meta, files, shards, masks, template, marks, row
    )


def _our_row(
    path: Path, meta: dict[str, Any], ids: dict[str, np.ndarray | Shards], files: dict[str, Path]
) -> int | None:
    """The ids a row (meta.json's "row") of data made of rows, each split a whole number of them; None for a stream."""
    if "row" not in meta:
        return None
    row = meta["row"]
    if not is_integer(row) or row < 2:
        raise DataError(
            f"{path / 'meta.json'}: row is {row!r}, not a whole number from 2 up (the ids a row): "
            f"prepare the data again"
        )
    for split in ("train", "val"):
        if len(ids[split]) % row or not len(ids[split]):
            raise DataError(
                f"{files[split]} holds {len(ids[split])} ids, not a whole number of rows of {row} (meta.json's row): "
                f"prepare the data again"
            )
    return int(row)


def _our_chat_template(path: Path, meta: dict[str, Any]) -> str | None:
    """The template conversations were rendered with (meta.json's chat.template); None for other data."""
    if "chat" not in meta:
        return None
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
    return chat["template"]


def _our_masks(
    path: Path, meta: dict[str, Any], ids: dict[str, np.ndarray | Shards], files: dict[str, Path]
) -> dict[str, np.ndarray]:
    """The masks (train.mask.bin, val.mask.bin, each as long as its ids) where meta.json has "mask"
    (any data: what it marks, and how many by split) or "chat" (conversations, whose meta.json
    says their counts in chat.mask_tokens); {} for other data."""
    if "mask" not in meta and "chat" not in meta:
        return {}
    said = meta.get("mask")
    if "mask" in meta and (
        not isinstance(said, dict)
        or not isinstance(said.get("marks"), str)
        or not said["marks"]
        or not isinstance(said.get("tokens"), dict)
    ):
        raise DataError(
            f"{path / 'meta.json'}: mask is not an object with what the mask marks (mask.marks, a phrase) and "
            f"how many by split (mask.tokens): prepare the data again"
        )
    what = "a loss mask (mask)" if "mask" in meta else "conversations (chat)"
    masks = {}
    for split in ("train", "val"):
        file = path / f"{split}.mask.bin"
        if not file.is_file():
            raise DataError(
                f"{file} is missing: meta.json says the data holds {what}, whose loss counts the targets the mask "
                f"marks; prepare the data again"
            )
        masks[split] = _memmap(file, MASK_DTYPE)
        if len(masks[split]) != len(ids[split]):
            raise DataError(
                f"{file} holds {len(masks[split])} mask bytes, but {files[split]} holds {len(ids[split])} ids: "
                f"a mask has a byte for each id; prepare the data again"
            )
    return masks


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

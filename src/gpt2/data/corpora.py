"""Corpora at scale: records streamed from JSON Lines, Parquet and Hugging Face datasets, and
token files in llm.c's shard format, written as they fill and read back as one stream.

Records are read one at a time (JSON Lines line by line, Parquet a batch of rows at a time, a
dataset with `streaming=True`), so memory never holds more than a batch of them whatever the
corpus's size. llm.c's format (dev/data/data_common.py, `write_datafile`) is a header of 256
little-endian int32 (magic, version, number of ids) and then the ids: version 1 (magic
20240520, GPT-2's) holds uint16 ids, version 7 (magic 20240801, Llama 3's) uint32 ids.
Shards are named NAME_val_000000.bin, NAME_train_000001.bin, ...: the first validates, as in
llm.c's fineweb.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from gpt2._hub import check_reachable
from gpt2.errors import DataError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# llm.c's two headers (data_common.py's HEADERS_INFO): version -> (magic, dtype of the ids)
HEADERS = {1: (20240520, np.dtype("<u2")), 7: (20240801, np.dtype("<u4"))}
SHARD_NAME = re.compile(r"(.+)_(train|val)_([0-9]{6})\.bin")  # llm.c's fineweb.py: fineweb_train_000001.bin
RECORD_SUFFIXES = (".jsonl", ".parquet")
PARQUET_BATCH_ROWS = 1024  # rows read from a Parquet file at a time
JSONL_BLOCK_BYTES = 1 << 20  # lines read from a JSON Lines file at a time


# ------------------------------------------------------------------ records


def is_record_file(path: Path) -> bool:
    """Whether a file holds records (one document each) rather than one text."""
    return path.suffix.lower() in RECORD_SUFFIXES


def record_texts(path: Path, text_field: str, on_bytes: Callable[[int], object] = lambda n: None) -> Iterator[str]:
    """The `text_field` of each record of a .jsonl or .parquet file, one at a time."""
    if path.suffix.lower() == ".jsonl":
        return _jsonl_texts(path, text_field, on_bytes)
    return _parquet_texts(path, text_field, on_bytes)


def _missing_field(where: str, text_field: str, fields: Sequence[str]) -> DataError:
    return DataError(
        f"{where} has no field {text_field!r}: its fields are {', '.join(map(str, fields)) or 'none'}; "
        f"give the one that holds the text as text_field",
        "text_field",
    )


def _jsonl_texts(path: Path, text_field: str, on_bytes: Callable[[int], object]) -> Iterator[str]:
    for first, block in jsonl_blocks(path, JSONL_BLOCK_BYTES, on_bytes):
        yield from jsonl_block_texts(path, block, first, text_field)


def jsonl_blocks(path: Path, block_bytes: int, on_bytes: Callable[[int], object]) -> Iterator[tuple[int, bytes]]:
    """A JSON Lines file as blocks of whole lines, about `block_bytes` each (a longer line: whole),
    with the number of each block's first line: raw bytes, for `jsonl_block_texts` to parse
    (prepare's workers do, while this process reads the next block)."""
    with open(path, "rb") as f:
        first = 1
        while block := f.read(block_bytes):
            if not block.endswith(b"\n"):
                block += f.readline()
            on_bytes(len(block))
            yield first, block
            first += block.count(b"\n")


def jsonl_block_texts(path: Path, block: bytes, first: int, text_field: str) -> Iterator[str]:
    """The `text_field` of each record of a block of JSON Lines whose first line is line `first`."""
    lines = block.split(b"\n")
    if not lines[-1]:  # the block ends with its last line's newline
        lines.pop()
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path}, line {number}: not a JSON record ({e})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}, line {number}: a JSON {type(record).__name__}, not an object of fields")
        if text_field not in record:
            raise _missing_field(f"{path} (line {number})", text_field, list(record))
        yield _text(record[text_field], f"{path}, line {number}", text_field)


def jsonl_block_records(block: bytes) -> int:
    """How many records a block of JSON Lines holds (its lines that are not blank), where each is
    one (`jsonl_block_texts` raises on any other)."""
    return sum(1 for line in block.split(b"\n") if line.strip())


def _parquet_texts(path: Path, text_field: str, on_bytes: Callable[[int], object]) -> Iterator[str]:
    pq = _pyarrow_parquet(path)
    try:
        file = pq.ParquetFile(path)
    except Exception as e:
        raise DataError(f"{path} is not a readable Parquet file: {_first_line(e)}") from None
    if text_field not in file.schema_arrow.names:
        raise _missing_field(str(path), text_field, file.schema_arrow.names)
    row = 0
    for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field]):
        for value in batch.column(0).to_pylist():
            row += 1
            yield _text(value, f"{path}, row {row}", text_field)
    on_bytes(path.stat().st_size)


def _pyarrow_parquet(path: Path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path} is a Parquet file, which needs pyarrow: pip install 'gpt2[data]'") from None
    return pq


def _text(value: object, where: str, text_field: str) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{where}: the field {text_field!r} holds {type(value).__name__} {str(value)[:40]!r}, not text",
            "text_field",
        )
    return value


def dataset_texts(name: str, config: str | None, split: str, text_field: str) -> Iterator[str]:
    """The `text_field` of each example of a Hugging Face dataset (a name on the hub, or a local
    directory of data files), streamed: nothing is downloaded whole or held in memory."""
    if not Path(name).exists():
        try:  # a name on the hub: one quick request first, not the datasets library's 25 s of retries
            check_reachable()
        except OSError as e:
            raise _unreadable(name, config, split, str(e)) from None
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading the dataset {name!r} needs the datasets library: pip install 'gpt2[data]'") from None
    datasets.disable_progress_bars()  # ours counts tokens; theirs would interleave with it
    try:
        stream = datasets.load_dataset(name, config, split=split, streaming=True)
        for number, example in enumerate(stream, 1):
            if text_field not in example:
                raise _missing_field(f"the dataset {name!r}", text_field, list(example))
            yield _text(example[text_field], f"the dataset {name!r}, example {number}", text_field)
    except DataError:
        raise
    except Exception as e:  # offline, an unknown name, config or split
        raise _unreadable(name, config, split, _first_line(e)) from None


def _unreadable(name: str, config: str | None, split: str, reason: str) -> DataError:
    which = f"config {config!r}, split {split!r}" if config is not None else f"split {split!r}"
    return DataError(f"cannot read the dataset {name!r} ({which}): {reason}", "dataset")


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ------------------------------------------------------------------ llm.c's token files


def write_shard(path: Path, ids: np.ndarray) -> None:
    """A token file in llm.c's format: uint16 ids as version 1, uint32 as version 7."""
    version = 1 if ids.dtype.itemsize == 2 else 7
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = [HEADERS[version][0], version, len(ids)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.astype(HEADERS[version][1], copy=False).tobytes())


def read_header(path: Path) -> tuple[np.dtype, int]:
    """The dtype of the ids in one of llm.c's token files and how many its header counts."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        raise DataError(
            f"{path} is not an llm.c token file: {len(head)} bytes, shorter than its {HEADER_BYTES}-byte header"
        )
    magic, version, count = (int(v) for v in np.frombuffer(head, dtype="<i4")[:3])
    if magic not in (m for m, _ in HEADERS.values()):
        raise DataError(
            f"{path} is not an llm.c token file: its magic number is {magic}, not "
            f"{HEADERS[1][0]} (GPT-2's, uint16 ids) or {HEADERS[7][0]} (Llama 3's, uint32 ids)"
        )
    if HEADERS.get(version, (None,))[0] != magic:
        raise DataError(
            f"{path}: llm.c token file version {version} (magic {magic}); only version 1 (magic "
            f"{HEADERS[1][0]}, uint16 ids) and version 7 (magic {HEADERS[7][0]}, uint32 ids) are read"
        )
    return HEADERS[version][1], count


class ShardWriter:
    """Ids appended in order, written as shards of exactly `shard_tokens` ids (the last holds the
    rest) into `directory` as each fills: memory holds one shard whatever the corpus's size. As in
    llm.c's fineweb.py, shard 0 is NAME_val_000000.bin and the others NAME_train_NNNNNN.bin, and
    a document that overflows a shard goes on in the next."""

    def __init__(self, directory: Path, name: str, shard_tokens: int, dtype: np.dtype):
        self.directory, self.name = directory, name
        self.buffer = np.empty(shard_tokens, dtype=dtype)
        self.filled = 0
        self.files: list[Path] = []
        self.tokens = {"train": 0, "val": 0}

    def write(self, ids: np.ndarray) -> None:
        while len(ids):
            take = min(len(ids), len(self.buffer) - self.filled)
            self.buffer[self.filled : self.filled + take] = ids[:take]
            self.filled += take
            ids = ids[take:]
            if self.filled == len(self.buffer):
                self._flush()

    def close(self) -> None:
        """Write the last shard, if any ids are left."""
        if self.filled:
            self._flush()

    def _flush(self) -> None:
        index = len(self.files)
        split = "val" if index == 0 else "train"
        path = self.directory / f"{self.name}_{split}_{index:06d}.bin"
        write_shard(path, self.buffer[: self.filled])
        self.files.append(path)
        self.tokens[split] += self.filled
        self.filled = 0


class Shards:
    """Several token files read as one stream of ids, in order (the shards of a split: a document
    cut at the end of one goes on in the next, so a window may span the two). Indexed by slices
    only, as `get_batch` and `perplexity` read it; nothing is copied but the slices asked for."""

    ndim = 1

    def __init__(self, parts: Sequence[np.ndarray]):
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])  # part k holds ids starts[k] .. starts[k + 1]
        self.dtype = self.parts[0].dtype

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("Shards are read by contiguous slices (ids[a:b])")
        start, stop, _ = index.indices(len(self))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        for k in range(first, len(self.parts)):
            if self.starts[k] >= stop:
                break
            pieces.append(self.parts[k][max(start - self.starts[k], 0) : stop - self.starts[k]])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def min(self) -> int:
        return min(int(p.min()) for p in self.parts if len(p))

    def max(self) -> int:
        return max(int(p.max()) for p in self.parts if len(p))

    def tolist(self) -> list[int]:
        return [i for p in self.parts for i in p.tolist()]

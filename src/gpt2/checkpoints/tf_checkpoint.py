"""Read OpenAI's GPT-2 TensorFlow checkpoints without TensorFlow: numpy and the standard library only.

A TF checkpoint (tensor bundle V2, as written by `tf.train.Saver`) is a *prefix*, e.g.
`models/124M/model.ckpt`, naming these files::

    prefix.index                    which tensors exist and where their bytes are (below)
    prefix.data-00000-of-00001      the tensors' raw bytes, back to back; one file per shard
    checkpoint                      text in the directory: model_checkpoint_path: "model.ckpt"

The .index file is a LevelDB SSTable: sorted key -> value entries in blocks, then a footer::

    [data block]... [metaindex block] [index block] [footer: 48 bytes]
    footer       metaindex BlockHandle, index BlockHandle, zero padding to 40 bytes,
                 magic 0xdb4775248b80fb57 (uint64, little-endian)
    BlockHandle  varint offset, varint size (of the block's contents, trailer excluded)
    block        entry... restart uint32[n] n:uint32, then a 5-byte trailer:
                 compression type (0 = none; TF never compresses) and masked crc32c
    entry        varint shared, varint non_shared, varint value_length,
                 key bytes [shared:] (bytes [:shared] are the previous key's), value
    index block  one entry per data block; its value is that block's BlockHandle

Values are protobuf messages (tensorflow/core/protobuf/tensor_bundle.proto); field numbers:

    key ""      BundleHeaderProto {1 num_shards, 2 endianness (0 little, 1 big),
                                   3 version: VersionDef {1 producer, 2 min_consumer}}
    key name    BundleEntryProto  {1 dtype, 2 shape: TensorShapeProto {2 dim: {1 size}},
                                   3 shard_id, 4 offset, 5 size, 6 crc32c, 7 slices}

Tensor `name` is bytes [offset, offset + size) of shard `prefix.data-{shard_id:05d}-of-{num_shards:05d}`,
in C order and the header's byte order. The data's crc32c is not checked (too slow in Python);
sizes are.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpt2.errors import CheckpointError, CheckpointNotFoundError

__all__ = ["bfloat16_to_float32", "iter_tf_checkpoint", "read_tf_checkpoint"]

_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_TRAILER_SIZE = 5  # 1 byte compression type + 4 bytes masked crc32c
_BFLOAT16 = 14
# DataType enum (tensorflow/core/framework/types.proto) -> numpy dtype; bfloat16 is read as its bits.
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16, _BFLOAT16: np.uint16}
_REDOWNLOAD = "re-download the checkpoint"


class _Corrupt(Exception):
    """Raised by the parsers below; `_read_index` turns it into a CheckpointError naming the file."""


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly: a bfloat16 is the top half of a float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# --- crc32c (Castagnoli), as LevelDB stores it in each block trailer ----------------------------


def _crc_of_byte(n: int) -> int:
    for _ in range(8):  # reflected polynomial 0x1EDC6F41
        n = (n >> 1) ^ 0x82F63B78 if n & 1 else n >> 1
    return n


_CRC_TABLE = [_crc_of_byte(n) for n in range(256)]


def _masked_crc32c(data: bytes) -> int:
    """crc32c of `data`, masked the way LevelDB stores it in block trailers."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    # LevelDB rotates and offsets stored crcs so that a crc of data holding crcs stays well-mixed.
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- protobuf wire format ------------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode the base-128 varint at `pos`; return (value, position after it)."""
    value = shift = 0
    while shift < 70:
        if pos >= len(buf):
            raise _Corrupt("a varint runs past the end of its data")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Corrupt("a varint is longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Yield (field number, value) of a protobuf message: ints for varint/fixed, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 5):  # fixed64, fixed32, little-endian
            width = 8 if wire == 1 else 4
            if pos + width > len(buf):
                raise _Corrupt("a fixed-width protobuf field runs past the end of its message")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        elif wire == 2:  # length-delimited: bytes, string or sub-message
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise _Corrupt("a protobuf field runs past the end of its message")
            value, pos = buf[pos : pos + length], pos + length
        else:
            raise _Corrupt(f"a protobuf field has unsupported wire type {wire}")
        yield number, value


def _signed(value: int) -> int:
    """int32/int64 fields are encoded as 64-bit two's complement varints."""
    return value - (1 << 64) if value >= 1 << 63 else value


# --- LevelDB table -------------------------------------------------------------------------------


def _block(data: bytes, handle: bytes, pos: int = 0) -> bytes:
    """Contents of the block whose BlockHandle starts at handle[pos], after checking its trailer."""
    offset, pos = _varint(handle, pos)
    size, _ = _varint(handle, pos)
    end = offset + size
    if end + _TRAILER_SIZE > len(data) - _FOOTER_SIZE:
        raise _Corrupt(f"a block at offset {offset} runs past the end of the file")
    contents, kind = data[offset:end], data[end]
    if kind != 0:
        raise CheckpointError(
            f"a block is compressed (type {kind}), which this reader does not support; "
            "re-save the checkpoint with TensorFlow's default (uncompressed) settings"
        )
    if _masked_crc32c(data[offset : end + 1]) != int.from_bytes(data[end + 1 : end + 5], "little"):
        raise _Corrupt(f"the block at offset {offset} fails its crc32c check")
    return contents


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield a block's (key, value) pairs, undoing the prefix compression of keys."""
    if len(block) < 4:
        raise _Corrupt("a block is shorter than its restart count")
    n_restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 - 4 * n_restarts  # entries end where the restart array begins
    if limit < 0:
        raise _Corrupt("a block's restart array is larger than the block")
    key, pos = b"", 0
    while pos < limit:
        shared, pos = _varint(block, pos)
        non_shared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        if shared > len(key) or pos + non_shared + value_len > limit:
            raise _Corrupt("a block entry runs past the end of its block")
        key = key[:shared] + block[pos : pos + non_shared]
        pos += non_shared
        yield key, block[pos : pos + value_len]
        pos += value_len


def _read_index(index: Path) -> tuple[dict[int, int], dict[bytes, bytes]]:
    """Parse `index`; return (header fields, {tensor name: BundleEntryProto bytes})."""
    data = index.read_bytes()
    if len(data) < _FOOTER_SIZE:
        raise CheckpointError(f"{index} is too short to be a checkpoint index ({len(data)} bytes); {_REDOWNLOAD}")
    if int.from_bytes(data[-8:], "little") != _MAGIC:
        raise CheckpointError(f"{index} is not a TensorFlow checkpoint index (bad magic number); {_REDOWNLOAD}")
    try:
        footer = data[-_FOOTER_SIZE:]
        _, pos = _varint(footer, 0)  # skip the metaindex handle (offset, size): TF writes no meta blocks
        _, pos = _varint(footer, pos)
        entries = {}
        for _, handle in _entries(_block(data, footer, pos)):
            entries.update(_entries(_block(data, handle)))
        if b"" not in entries:
            raise _Corrupt("it has no bundle header")
        header = dict(_fields(entries.pop(b"")))
        version = dict(_fields(header.get(3, b"")))
        if not all(isinstance(x, int) for x in (header.get(1, 1), header.get(2, 0), version.get(2, 0))):
            raise _Corrupt("its bundle header has a field of the wrong type")
    except CheckpointError as e:
        raise CheckpointError(f"{index}: {e}") from None
    except (_Corrupt, IndexError, TypeError) as e:  # TypeError: a protobuf field holds bytes, not an int
        raise CheckpointError(f"{index} is corrupt ({e}); {_REDOWNLOAD}") from None
    if version.get(2, 0) > 1:  # min_consumer: this reader knows bundle version 1
        raise CheckpointError(
            f"{index} needs tensor-bundle version {version[2]}, newer than the version 1 "
            "this reader understands; re-save it with tf.compat.v1.train.Saver"
        )
    return header, entries


def _parse_entry(value: bytes) -> tuple[int, list[int], int, int, int, bool]:
    """BundleEntryProto bytes -> (dtype enum, shape, shard_id, offset, size, has slices)."""
    entry = dict(_fields(value))
    # TensorShapeProto.dim (field 2) is repeated, so collect every occurrence; each is Dim {1 size}.
    dims = [_signed(dict(_fields(dim)).get(1, 0)) for n, dim in _fields(entry.get(2, b"")) if n == 2]
    dtype, shard_id, offset, size = (entry.get(f, 0) for f in (1, 3, 4, 5))
    if not all(isinstance(x, int) for x in (dtype, shard_id, offset, size)):
        raise _Corrupt("a numeric field holds bytes")
    return dtype, dims, shard_id, _signed(offset), _signed(size), 7 in entry


def _resolve_prefix(path: Path) -> Path:
    """A checkpoint directory or prefix (or its .index file) -> the prefix."""
    if path.suffix == ".index":
        return path.with_suffix("")
    if not path.is_dir():
        return path
    try:  # the `checkpoint` text file names the latest prefix, relative to the directory (or absolute)
        text = (path / "checkpoint").read_text("utf-8")
        match = re.search(r'^model_checkpoint_path:\s*"(.*)"', text, re.MULTILINE)
    except (OSError, UnicodeDecodeError):
        match = None
    if match:
        named = path / match.group(1)
        # An absolute path that no longer exists usually means the directory was moved: look beside it.
        return named if Path(f"{named}.index").exists() else path / named.name
    indexes = sorted(path.glob("*.index"))
    if not indexes:
        raise CheckpointNotFoundError(
            f"{path} holds no checkpoint (no `checkpoint` or *.index file); "
            "download the model into it or pass the checkpoint's prefix"
        )
    if len(indexes) > 1:
        raise CheckpointError(
            f"{path} holds {len(indexes)} checkpoints and no `checkpoint` file naming one; "
            f"pass a prefix such as {indexes[0].with_suffix('')}"
        )
    return indexes[0].with_suffix("")


def read_tf_checkpoint(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read every tensor of a TF checkpoint: {variable name: array}, in the index's (sorted) order.

    `path` is a checkpoint directory (the prefix comes from its `checkpoint` file, else its single
    `*.index` file) or a prefix such as `models/124M/model.ckpt`. Arrays are read-only views of
    memory-mapped data files (copy them with `np.array(a)` to modify); bfloat16 tensors are
    converted to float32, so those are copies.
    """
    shards: dict[Path, np.ndarray] = {}
    tensors = {}
    for entry in _entries_of(path):
        if entry.shard not in shards:
            # mmap cannot map an empty file; an empty shard only works if all its tensors are empty.
            shards[entry.shard] = np.memmap(entry.shard, np.uint8, "r") if entry.shard_size else np.empty(0, np.uint8)
        array = shards[entry.shard][entry.offset : entry.offset + entry.size].view(entry.dtype).reshape(entry.dims)
        tensors[entry.name] = bfloat16_to_float32(array) if entry.bfloat16 else array
    return tensors


def iter_tf_checkpoint(path: str | os.PathLike) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) one tensor at a time, each read into memory of its own (writable).

    For loading a model: unlike the mapped views of `read_tf_checkpoint`, whose pages stay
    resident while the file is mapped, a tensor read here is freed once the caller drops it.
    """
    files: dict[Path, BinaryIO] = {}
    try:
        for entry in _entries_of(path):
            if entry.shard not in files:
                files[entry.shard] = open(entry.shard, "rb")
            array = np.empty(entry.dims, dtype=entry.dtype)
            files[entry.shard].seek(entry.offset)
            files[entry.shard].readinto(array.reshape(-1).view(np.uint8))
            if entry.bfloat16:
                array = bfloat16_to_float32(array)
            elif not array.dtype.isnative:  # torch shares only native-order memory
                array = array.astype(array.dtype.newbyteorder("="))
            yield entry.name, array
    finally:
        for f in files.values():
            f.close()


@dataclass
class _Entry:
    name: str
    dtype: np.dtype
    dims: list[int]
    shard: Path
    shard_size: int
    offset: int
    size: int
    bfloat16: bool


def _entries_of(path: str | os.PathLike) -> Iterator[_Entry]:
    """Every tensor's location in the data files, checked against the files' sizes."""
    prefix = _resolve_prefix(Path(path))
    index = Path(f"{prefix}.index")
    if not index.is_file():
        if Path(path).is_dir():  # the prefix came from the directory's `checkpoint` file
            raise CheckpointNotFoundError(f"{index}: checkpoint index file not found; {_REDOWNLOAD}")
        raise CheckpointNotFoundError(
            f"{path} is neither a checkpoint directory nor a prefix with a {index.name} file beside it; check the path"
        )
    header, entries = _read_index(index)
    num_shards, big_endian = header.get(1, 1), header.get(2, 0) == 1
    shard_sizes: dict[int, int] = {}
    for key, value in entries.items():
        try:
            name = key.decode("utf-8")
            dtype_enum, dims, shard_id, offset, size, sliced = _parse_entry(value)
        except (_Corrupt, UnicodeDecodeError, TypeError) as e:
            raise CheckpointError(f"{index} is corrupt (entry {key[:40]!r}: {e}); {_REDOWNLOAD}") from None
        if sliced:
            raise CheckpointError(
                f"{index}: tensor {name!r} is partitioned into slices, which this reader "
                "does not support; re-save it as one unpartitioned variable"
            )
        if dtype_enum not in _DTYPES:
            raise CheckpointError(
                f"{index}: tensor {name!r} has TensorFlow dtype enum {dtype_enum}, which this reader "
                "does not support (it reads float32/64, float16, bfloat16, int32, int64); "
                "cast the variable before saving"
            )
        dtype = np.dtype(_DTYPES[dtype_enum]).newbyteorder(">" if big_endian else "<")
        if (
            min(dims, default=0) < 0
            or offset < 0
            or size != dtype.itemsize * math.prod(dims)
            or not 0 <= shard_id < num_shards
        ):
            raise CheckpointError(
                f"{index} is corrupt (tensor {name!r} has shape {dims}, {size} bytes, "
                f"shard {shard_id} of {num_shards}); {_REDOWNLOAD}"
            )
        shard = Path(f"{prefix}.data-{shard_id:05d}-of-{num_shards:05d}")
        if shard_id not in shard_sizes:
            if not shard.is_file():
                raise CheckpointNotFoundError(f"{shard}: checkpoint data file not found; {_REDOWNLOAD}")
            shard_sizes[shard_id] = shard.stat().st_size
        if offset + size > shard_sizes[shard_id]:
            raise CheckpointError(
                f"{shard} is truncated: tensor {name!r} needs bytes {offset}..{offset + size} "
                f"but the file has {shard_sizes[shard_id]}; {_REDOWNLOAD}"
            )
        yield _Entry(name, dtype, dims, shard, shard_sizes[shard_id], offset, size, dtype_enum == _BFLOAT16)

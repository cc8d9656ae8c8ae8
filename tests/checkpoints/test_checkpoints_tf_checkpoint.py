"""`gpt2.checkpoints.tf_checkpoint` against checkpoints written by real TensorFlow (no TensorFlow needed here).

The fixtures in tests/fixtures/ come from `make_tf_gpt2_tiny.py`, which saved them with
`tf.compat.v1.train.Saver` the way OpenAI saved GPT-2 and stored the arrays it fed TF in
expected.npz. Error cases damage a copy in tmp_path. A few cases TF cannot easily be made
to write (compressed blocks, sliced variables, big-endian data, several index blocks) use
a small SSTable writer defined below.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpt2.checkpoints.tf_checkpoint import _masked_crc32c, bfloat16_to_float32, iter_tf_checkpoint, read_tf_checkpoint
from gpt2.errors import CheckpointError, CheckpointNotFoundError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "tf_gpt2_tiny"
DTYPES = FIXTURES / "tf_dtypes_tiny"
HPARAMS = {"n_vocab": 96, "n_ctx": 16, "n_embd": 12, "n_head": 3, "n_layer": 2}
DATA = "model.ckpt.data-00000-of-00001"


def expected(directory: Path) -> dict[str, np.ndarray]:
    with np.load(directory / "expected.npz") as npz:
        return {name: npz[name] for name in npz.files}


def gpt2_shapes(n_vocab: int, n_ctx: int, n_embd: int, n_layer: int, **_: int) -> dict[str, tuple[int, ...]]:
    """OpenAI's variable names and shapes, written out independently of the fixture script."""
    e = n_embd
    shapes = {"model/wte": (n_vocab, e), "model/wpe": (n_ctx, e), "model/ln_f/g": (e,), "model/ln_f/b": (e,)}
    for i in range(n_layer):
        for name, shape in [
            ("ln_1/g", (e,)),
            ("ln_1/b", (e,)),
            ("ln_2/g", (e,)),
            ("ln_2/b", (e,)),
            ("attn/c_attn/w", (1, e, 3 * e)),
            ("attn/c_attn/b", (3 * e,)),
            ("attn/c_proj/w", (1, e, e)),
            ("attn/c_proj/b", (e,)),
            ("mlp/c_fc/w", (1, e, 4 * e)),
            ("mlp/c_fc/b", (4 * e,)),
            ("mlp/c_proj/w", (1, 4 * e, e)),
            ("mlp/c_proj/b", (e,)),
        ]:
            shapes[f"model/h{i}/{name}"] = shape
    return shapes


@pytest.fixture
def tiny_copy(tmp_path: Path) -> Path:
    """A copy of the GPT-2 fixture that a test may damage."""
    return Path(shutil.copytree(TINY, tmp_path / "tiny"))


# --- reading what TensorFlow wrote ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [TINY, str(TINY), TINY / "model.ckpt", str(TINY / "model.ckpt"), TINY / "model.ckpt.index"],
    ids=["dir", "dir-str", "prefix", "prefix-str", "index"],
)
def test_reads_tf_fixture_exactly(path: str | Path) -> None:
    want = expected(TINY)
    got = read_tf_checkpoint(path)
    assert list(got) == sorted(want)  # the index's order: keys sorted bytewise
    for name, array in want.items():
        assert got[name].dtype == np.float32 and got[name].shape == array.shape, name
        assert np.array_equal(got[name], array), name


def test_fixture_has_gpt2_names_shapes_and_hparams() -> None:
    assert json.loads((TINY / "hparams.json").read_text(encoding="utf-8")) == HPARAMS
    got = read_tf_checkpoint(TINY)
    assert {name: a.shape for name, a in got.items()} == gpt2_shapes(**HPARAMS)
    assert not (TINY / "model.ckpt.meta").exists()
    assert 'model_checkpoint_path: "model.ckpt"' in (TINY / "checkpoint").read_text(encoding="utf-8")


def test_arrays_are_read_only_memory_maps_the_caller_can_copy() -> None:
    wte = read_tf_checkpoint(TINY)["model/wte"]
    assert isinstance(wte, np.memmap) and not wte.flags.writeable
    copy = np.array(wte)
    copy[0, 0] += 1.0
    assert copy.flags.writeable and copy[0, 0] != wte[0, 0]


def test_every_supported_dtype_from_tf() -> None:
    want = expected(DTYPES)
    many = want.pop("many")
    got = read_tf_checkpoint(DTYPES)
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert np.array_equal(got[name], array), name
    assert got["bfloat16"].dtype == np.float32 and got["scalar"].shape == () and got["empty"].shape == (0, 3)
    assert [int(got[f"many/v{i:03d}"]) for i in range(len(many))] == many.tolist()


@pytest.mark.parametrize("path", [TINY, DTYPES], ids=["gpt2", "dtypes"])
def test_iter_reads_the_same_tensors_into_writable_memory(path: Path) -> None:
    mapped = read_tf_checkpoint(path)
    read = dict(iter_tf_checkpoint(path))
    assert list(read) == list(mapped)
    for name, array in read.items():
        assert array.dtype == mapped[name].dtype and np.array_equal(array, mapped[name]), name
        assert array.flags.writeable and not isinstance(array, np.memmap), name


def test_directory_without_checkpoint_file_uses_its_single_index(tiny_copy: Path) -> None:
    (tiny_copy / "checkpoint").unlink()
    assert np.array_equal(read_tf_checkpoint(tiny_copy)["model/wpe"], expected(TINY)["model/wpe"])


def test_checkpoint_file_naming_an_absolute_path_elsewhere(tiny_copy: Path) -> None:
    # A release directory moved after saving: its `checkpoint` file still names the old absolute prefix.
    (tiny_copy / "checkpoint").write_text('model_checkpoint_path: "/gone/models/124M/model.ckpt"\n')
    assert len(read_tf_checkpoint(tiny_copy)) == len(gpt2_shapes(**HPARAMS))


def test_bfloat16_to_float32_is_exact_on_known_bit_patterns() -> None:
    cases = {
        0x0000: 0.0,
        0x3F80: 1.0,
        0xBF80: -1.0,
        0xC000: -2.0,
        0x3F81: 1.0 + 2.0**-7,
        0x7F7F: (2 - 2.0**-7) * 2.0**127,  # largest finite bfloat16
        0x0080: 2.0**-126,
        0x0001: 2.0**-133,  # smallest normal, smallest subnormal
        0x7F80: np.inf,
        0xFF80: -np.inf,
    }
    bits = np.array(list(cases), dtype=np.uint16)
    assert bfloat16_to_float32(bits).tolist() == list(cases.values())
    assert np.signbit(bfloat16_to_float32(np.array([0x8000], np.uint16)))[0]  # -0.0 keeps its sign
    assert np.isnan(bfloat16_to_float32(np.array([0x7FC0, 0xFFC1], np.uint16))).all()
    # Exhaustively: every bfloat16 is exactly the float32 whose top half it is (NaN payloads included).
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(bfloat16_to_float32(every).view(np.uint32), every.astype(np.uint32) << 16)


def test_crc32c_matches_the_standard_check_value() -> None:
    crc = 0xE3069283  # crc32c(b"123456789"), the published check value
    assert _masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- missing and damaged files --------------------------------------------------------------------


def check_error(exc: type[Exception], call, names: str, *words: str) -> None:
    """`call()` raises exactly `exc` (not a subclass of the other kind) with `names` and `words` in its message."""
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert names in message and all(w in message for w in words), message
    if exc is CheckpointError:
        assert not isinstance(info.value, FileNotFoundError)


def test_missing_directory(tmp_path: Path) -> None:
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tmp_path / "nope"), "nope", "neither")
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tmp_path / "no" / "model.ckpt"), "model.ckpt.index")
    assert issubclass(CheckpointNotFoundError, FileNotFoundError)


def test_empty_directory(tmp_path: Path) -> None:
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tmp_path), str(tmp_path), "no checkpoint")


def test_missing_index(tiny_copy: Path) -> None:
    (tiny_copy / "model.ckpt.index").unlink()
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tiny_copy), "model.ckpt.index", "not found")
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tiny_copy / "model.ckpt"), "model.ckpt.index")


def test_missing_data_shard(tiny_copy: Path) -> None:
    (tiny_copy / DATA).unlink()
    check_error(CheckpointNotFoundError, lambda: read_tf_checkpoint(tiny_copy), DATA, "not found", "re-download")


def test_truncated_data_shard(tiny_copy: Path) -> None:
    data = tiny_copy / DATA
    data.write_bytes(data.read_bytes()[:-4])
    check_error(CheckpointError, lambda: read_tf_checkpoint(tiny_copy), DATA, "truncated", "re-download")


def test_empty_data_shard(tiny_copy: Path) -> None:
    (tiny_copy / DATA).write_bytes(b"")
    check_error(CheckpointError, lambda: read_tf_checkpoint(tiny_copy), DATA, "truncated")


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), ["magic", "re-download"]),
        (lambda b: b[:5], ["too short", "re-download"]),
        (lambda b: b"", ["too short"]),
        (lambda b: b[: len(b) // 2], ["magic"]),
        (lambda b: np.random.default_rng(0).bytes(len(b)), ["magic"]),
        (lambda b: b[:100] + b[-48:], ["corrupt", "past the end"]),  # middle cut out: handles point past the end
        (lambda b: b[:20] + bytes([b[20] ^ 0x40]) + b[21:], ["corrupt", "crc32c"]),  # one flipped bit in a block
    ],
    ids=["bad-magic", "5-bytes", "empty", "first-half", "garbage", "middle-cut", "bit-flip"],
)
def test_damaged_index(tiny_copy: Path, damage, words: list[str]) -> None:
    index = tiny_copy / "model.ckpt.index"
    index.write_bytes(damage(index.read_bytes()))
    check_error(CheckpointError, lambda: read_tf_checkpoint(tiny_copy), "model.ckpt.index", *words)


def test_garbage_with_a_valid_footer_magic_never_escapes_as_a_raw_error(tiny_copy: Path) -> None:
    index = tiny_copy / "model.ckpt.index"
    rng = np.random.default_rng(1)
    magic = (0xDB4775248B80FB57).to_bytes(8, "little")
    for size in list(range(48, 120)) + [500, 2000] * 20:
        index.write_bytes(rng.bytes(size - 8) + magic)
        check_error(CheckpointError, lambda: read_tf_checkpoint(tiny_copy), "model.ckpt.index")


def test_every_single_byte_change_of_the_index_is_caught_or_harmless(tiny_copy: Path) -> None:
    index, original, want = tiny_copy / "model.ckpt.index", (TINY / "model.ckpt.index").read_bytes(), expected(TINY)
    # Unchecked and unused: the (empty) metaindex block, whose handle opens the footer, and the footer's padding.
    footer, values, pos = original[-48:], [], 0
    while len(values) < 4:  # metaindex offset, size; index offset, size: varints
        value = shift = 0
        while footer[pos] & 0x80:
            value, shift, pos = value | (footer[pos] & 0x7F) << shift, shift + 7, pos + 1
        values.append(value | footer[pos] << shift)
        pos += 1
    meta_offset, meta_size = values[:2]
    padding = range(len(original) - 48 + pos, len(original) - 8)
    unused = set(range(meta_offset, meta_offset + meta_size + 5)) | set(padding)
    caught = 0
    for i in range(len(original)):
        index.write_bytes(original[:i] + bytes([original[i] ^ 0xFF]) + original[i + 1 :])
        try:
            got = read_tf_checkpoint(tiny_copy)
        except CheckpointError as e:
            assert "model.ckpt.index" in str(e)
            caught += 1
        else:
            assert i in unused and all(np.array_equal(got[k], want[k]) for k in want), i
    assert caught >= len(original) - len(unused)


# --- what TensorFlow did not write here: a hand-built bundle ---------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def proto(*fields: tuple[int, int | bytes]) -> bytes:
    """A protobuf message from (field number, int or bytes) pairs; ints as varints, bytes length-delimited."""
    return b"".join(
        varint(n << 3) + varint(v % (1 << 64)) if isinstance(v, int) else varint(n << 3 | 2) + varint(len(v)) + v
        for n, v in fields
    )


def bundle_entry(dtype: int, shape: tuple[int, ...], offset: int, size: int, *extra: tuple[int, int | bytes]) -> bytes:
    return proto((1, dtype), (2, proto(*[(2, proto((1, d))) for d in shape])), (4, offset), (5, size), *extra)


def sstable(items: list[tuple[bytes, bytes]], per_block: int = 2, compression: int = 0) -> bytes:
    """A LevelDB table of sorted `items`, `per_block` entries a data block, keys prefix-compressed."""
    out = bytearray()

    def block(entries: list[tuple[bytes, bytes]]) -> bytes:
        body, previous = bytearray(), b""
        for key, value in entries:
            shared = len(os.path.commonprefix([previous, key]))
            body += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
            previous = key
        body += (0).to_bytes(4, "little") + (1).to_bytes(4, "little")  # one restart point, at 0
        handle = varint(len(out)) + varint(len(body))
        typed = bytes(body) + bytes([compression])
        out.extend(typed + _masked_crc32c(typed).to_bytes(4, "little"))
        return handle

    chunks = [items[i : i + per_block] for i in range(0, len(items), per_block)]
    index = [(chunk[-1][0], block(chunk)) for chunk in chunks]  # key: the block's last key
    footer = block([]) + block(index)  # metaindex (empty), then the index block
    return bytes(out + footer.ljust(40, b"\0") + (0xDB4775248B80FB57).to_bytes(8, "little"))


def write_bundle(
    directory: Path, entries: dict[bytes, bytes], data: bytes, header: bytes | None = None, **table: int
) -> Path:
    directory.mkdir()
    items = {b"": proto((1, 1), (3, proto((1, 1)))) if header is None else header, **entries}
    (directory / "model.ckpt.index").write_bytes(sstable(sorted(items.items()), **table))
    (directory / DATA).write_bytes(data)
    return directory / "model.ckpt"


def test_hand_built_bundle_with_several_blocks_and_big_endian_data(tmp_path: Path) -> None:
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = np.array([-(2**40), 7], dtype=">i8")
    c = np.array([0x3FC0, 0xC080], dtype=">u2")  # bfloat16 1.5, -4.0
    data = a.tobytes() + b.tobytes() + c.tobytes()
    entries = {
        b"model/a": bundle_entry(1, (2, 3), 0, 24),
        b"model/b": bundle_entry(9, (2,), 24, 16),
        b"model/c": bundle_entry(14, (2,), 40, 4),
    }
    header = proto((1, 1), (2, 1), (3, proto((1, 1))))  # endianness BIG
    got = read_tf_checkpoint(write_bundle(tmp_path / "ckpt", entries, data, header, per_block=1))
    assert list(got) == ["model/a", "model/b", "model/c"]
    assert np.array_equal(got["model/a"], a) and np.array_equal(got["model/b"], b)
    assert got["model/c"].tolist() == [1.5, -4.0]
    read = dict(iter_tf_checkpoint(tmp_path / "ckpt"))
    assert read["model/a"].dtype.isnative and np.array_equal(read["model/a"], a)
    assert np.array_equal(read["model/b"], b) and read["model/c"].tolist() == [1.5, -4.0]


@pytest.mark.parametrize(
    "entries, table, words",
    [
        ({b"x": bundle_entry(1, (1,), 0, 4)}, {"compression": 1}, ["compressed", "uncompressed"]),
        ({b"x": bundle_entry(1, (1,), 0, 4, (7, proto((1, b""))))}, {}, ["'x'", "partitioned", "slices"]),
        ({b"x": bundle_entry(7, (1,), 0, 4)}, {}, ["'x'", "dtype enum 7"]),
        ({b"x": bundle_entry(1, (2,), 0, 4)}, {}, ["corrupt", "'x'"]),  # size disagrees with shape
        ({b"x": bundle_entry(1, (1,), 0, 4, (3, 5))}, {}, ["corrupt", "shard 5 of 1"]),
        ({b"x": proto((1, b"not an int"))}, {}, ["corrupt"]),
    ],
    ids=["compressed", "sliced", "string-dtype", "bad-size", "bad-shard", "wrong-wire-type"],
)
def test_hand_built_bundle_errors(tmp_path: Path, entries: dict, table: dict, words: list[str]) -> None:
    prefix = write_bundle(tmp_path / "ckpt", entries, b"\0" * 8, **table)
    check_error(CheckpointError, lambda: read_tf_checkpoint(prefix), "model.ckpt.index", *words)


@pytest.mark.parametrize(
    "header, words",
    [
        (proto((3, proto((1, 3), (2, 2)))), ["newer"]),  # min_consumer 2
        (proto((1, b"x")), ["corrupt", "header"]),
    ],
)
def test_hand_built_bundle_header_errors(tmp_path: Path, header: bytes, words: list[str]) -> None:
    prefix = write_bundle(tmp_path / "ckpt", {}, b"", header)
    check_error(CheckpointError, lambda: read_tf_checkpoint(prefix), "model.ckpt.index", *words)


def test_index_without_bundle_header(tmp_path: Path) -> None:
    (tmp_path / "model.ckpt.index").write_bytes(sstable([(b"x", bundle_entry(1, (1,), 0, 4))]))
    check_error(CheckpointError, lambda: read_tf_checkpoint(tmp_path), "model.ckpt.index", "no bundle header")


def test_directory_with_several_indexes_and_no_checkpoint_file(tiny_copy: Path) -> None:
    (tiny_copy / "checkpoint").unlink()
    shutil.copy(tiny_copy / "model.ckpt.index", tiny_copy / "other.ckpt.index")
    check_error(CheckpointError, lambda: read_tf_checkpoint(tiny_copy), str(tiny_copy), "2 checkpoints", "prefix")

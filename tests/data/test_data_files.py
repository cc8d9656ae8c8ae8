"""gpt2.data.files: the token files' format, written and read: open_data over ours, nanoGPT's and llm.c's files, the
conversations' masks, the checks that refuse data that does not hold together, and the overwrites and failures that
leave no stale or half-written files."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
from data_helpers import EOT, QA, TEMPLATE, chat_splits
from helpers import write_chat_data, write_conversations

from gpt2 import DataError, InvalidArgumentError, TokenIdError, Tokenizer
from gpt2.data import text as text_module
from gpt2.data.chat import prepare_chat
from gpt2.data.files import ids_dtype, open_data
from gpt2.data.text import prepare
from gpt2.tokenizer import CharTokenizer


def test_wide_vocabularies_take_uint32():
    assert ids_dtype(65536) == np.dtype("<u2") and ids_dtype(65537) == np.dtype("<u4")


def test_prepared_data_is_never_overwritten_by_accident(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    with pytest.raises(DataError, match="already holds prepared data .*pass overwrite=True") as e:
        prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    assert e.value.param == "overwrite"
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", overwrite=True, progress=False)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_nanogpt_character_data_with_its_meta_pkl(tmp_path):
    chars = sorted(set("hello world"))
    ids = np.array([chars.index(c) for c in "hello world" * 10], dtype=np.uint16)
    ids[:80].tofile(tmp_path / "train.bin")
    ids[80:].tofile(tmp_path / "val.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:  # as nanoGPT's shakespeare_char/prepare.py writes it
        pickle.dump(
            {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}, f
        )
    data = open_data(tmp_path)
    assert data.format == "nanogpt" and data.vocab_size == len(chars)
    assert isinstance(data.tokenizer, CharTokenizer) and data.tokenizer.decode(data.train[:11]) == "hello world"
    assert data.val.tolist() == ids[80:].tolist()


def test_nanogpt_gpt2_data_without_meta(tmp_path):
    np.array([15496, 995, EOT] * 10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.array([15496, 995], dtype=np.uint16).tofile(tmp_path / "val.bin")
    data = open_data(tmp_path)
    assert data.vocab_size == 50257 and data.tokenizer.decode(data.train[:2]) == "Hello world"


class _Exploit:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))  # unpickling would create the file


def test_a_pickle_never_runs_code(tmp_path):
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "val.bin")
    victim = tmp_path / "pwned"
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "x": _Exploit(victim)}, f)
    with pytest.raises(DataError, match="meta.pkl is not a plain-data pickle .*only dicts, lists, strings and numbers"):
        open_data(tmp_path)
    assert not victim.exists()


def write_llmc(path, ids, magic=20240520, version=1, count=None):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [magic, version, len(ids) if count is None else count]
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype="<u2").tobytes())


def test_llmc_token_files(tmp_path):
    write_llmc(tmp_path / "tiny_shakespeare_train.bin", list(range(100)))
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", [5, 6, 7])
    data = open_data(tmp_path)
    assert data.format == "llm.c" and data.train.tolist() == list(range(100)) and data.val.tolist() == [5, 6, 7]
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", [5, 6, 7], magic=1234)
    with pytest.raises(
        DataError, match="tiny_shakespeare_val.bin is not an llm.c token file: its magic number is 1234"
    ):
        open_data(tmp_path)
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", [5, 6, 7], version=2)
    with pytest.raises(DataError, match="version 2"):
        open_data(tmp_path)
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", [5, 6, 7], count=4)
    with pytest.raises(DataError, match="its header counts 4 ids, but the file holds 3"):
        open_data(tmp_path)


def test_data_that_does_not_hold_together(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    out = tmp_path / "out"
    data = open_data(out)
    with pytest.raises(DataError, match=re.escape(f"{out / 'val.bin'} holds 3 ids, too short for block_size 8")):
        data.check_block_size(8)
    (out / "val.bin").write_bytes(b"\x00\x00\x01")
    with pytest.raises(DataError, match="val.bin holds 3 bytes, not a whole number of uint16 ids"):
        open_data(out)
    np.array([1, 2, 3, 4], dtype=np.uint16).tofile(out / "val.bin")
    with pytest.raises(DataError, match="val.bin holds 4 ids, but meta.json says val_tokens = 3"):
        open_data(out)
    np.array([1, 2, 99], dtype=np.uint16).tofile(out / "val.bin")
    with pytest.raises(TokenIdError, match="val.bin holds token id 99, beyond its vocabulary of 14 ids"):
        open_data(out)
    (out / "train.bin").unlink()
    with pytest.raises(DataError, match="train.bin is missing"):
        open_data(out)
    with pytest.raises(DataError, match="holds no prepared data: expected train.bin and val.bin"):
        open_data(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        open_data(tmp_path / "nowhere")


def test_read_data_is_read_only(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    data = open_data(tmp_path / "out")
    assert not data.train.flags.writeable and not data.val.flags.writeable
    with pytest.raises(InvalidArgumentError, match="block_size must be a positive integer, got 0"):
        data.check_block_size(0)
    data.check_block_size(2)


def test_a_meta_json_of_another_tool(tmp_path):
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "val.bin")
    (tmp_path / "meta.json").write_text('{"dataset": "something else"}')
    with pytest.raises(
        DataError, match=r"meta.json is not gpt2 prepare's \(format None, version None; .*run gpt2 prepare"
    ):
        open_data(tmp_path)


@pytest.mark.parametrize(
    "meta",
    [
        {"vocab_size": 2, "itos": {0: "a", "1": "b"}},
        {"vocab_size": 3, "itos": {0: "a", 1: "b"}},
        {"vocab_size": "2", "itos": {0: "a", 1: "b"}},
        ["a", "b"],
    ],
)
def test_a_meta_pkl_that_is_not_nanogpts(tmp_path, meta):
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "val.bin")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta))
    with pytest.raises(DataError, match="meta.pkl is not nanoGPT's meta.pkl"):
        open_data(tmp_path)


def test_llmc_files_too_short_or_too_many(tmp_path):
    (tmp_path / "x_train.bin").write_bytes(b"\x01\x02\x03\x04\x05")
    write_llmc(tmp_path / "x_val.bin", [1, 2])
    with pytest.raises(
        DataError, match="x_train.bin is not an llm.c token file: 5 bytes, shorter than its 1024-byte header"
    ):
        open_data(tmp_path)
    write_llmc(tmp_path / "x_train.bin", [1, 2, 3])
    write_llmc(tmp_path / "y_train.bin", [1, 2, 3])
    with pytest.raises(DataError, match=r"several llm.c train files \(x_train.bin, y_train.bin\)"):
        open_data(tmp_path)
    (tmp_path / "y_train.bin").unlink()
    write_llmc(tmp_path / "x_val.bin", [1, 50257])
    with pytest.raises(TokenIdError, match="x_val.bin holds token id 50257, beyond its vocabulary of 50257 ids"):
        open_data(tmp_path)


def test_an_overwrite_with_another_tokenizer_leaves_no_stale_vocabulary(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi " * 20, encoding="utf-8")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "gpt2", progress=False)
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", overwrite=True, progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["chars.json", "meta.json", "train.bin", "val.bin"]
    data = open_data(tmp_path / "out")
    assert isinstance(data.tokenizer, CharTokenizer) and data.vocab_size == len(set("hello there, general kenobi "))
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "gpt2", overwrite=True, progress=False)
    assert not (tmp_path / "out" / "chars.json").exists()
    assert open_data(tmp_path / "out").tokenizer.encode("hello") == [31373]


def test_a_stray_vocabulary_is_not_taken_for_the_datas(tmp_path):
    (tmp_path / "doc.txt").write_text("abcabcabc", encoding="utf-8")
    (tmp_path / "out").mkdir()
    Tokenizer.gpt2().save(tmp_path / "out")  # someone else's files, not prepared data: left alone
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    assert (tmp_path / "out" / "encoder.json").exists()
    assert isinstance(open_data(tmp_path / "out").tokenizer, CharTokenizer)


def test_a_failed_prepare_keeps_the_older_data_and_leaves_nothing_behind(tmp_path, monkeypatch):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi", encoding="utf-8")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}

    def interrupted(documents, tokenizer, out, *args):
        out.write(b"\x01\x00" * 1000)  # half-way through, Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(text_module, "encode_documents", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    with pytest.raises(KeyboardInterrupt):
        prepare([tmp_path / "doc.txt"], tmp_path / "new" / "out", "char", progress=False)
    assert not (tmp_path / "new" / "out").exists()  # made by this prepare, removed by it


def test_a_path_to_one_of_llmcs_files(tmp_path):
    write_llmc(tmp_path / "tiny_shakespeare_train.bin", [1, 2, 3, 4])
    write_llmc(tmp_path / "tiny_shakespeare_val.bin", [5, 6])
    write_llmc(tmp_path / "other_train.bin", [7])  # another data set beside it: not read
    for name in ("tiny_shakespeare_train.bin", "tiny_shakespeare_val.bin"):
        data = open_data(tmp_path / name)
        assert data.format == "llm.c" and data.train.tolist() == [1, 2, 3, 4] and data.val.tolist() == [5, 6]
        assert data.files == {
            "train": tmp_path / "tiny_shakespeare_train.bin",
            "val": tmp_path / "tiny_shakespeare_val.bin",
        }
    with pytest.raises(
        DataError, match=re.escape(f"{tmp_path / 'other_val.bin'} is missing: llm.c's data is a pair of files")
    ):
        open_data(tmp_path / "other_train.bin")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(
        DataError, match="notes.txt is a file, not prepared data: give the directory that holds train.bin"
    ):
        open_data(tmp_path / "notes.txt")


def _run_code_by_reduce(victim):
    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {victim}",))

    return Exploit()


def test_a_pickle_that_would_run_a_shell_command_runs_nothing(tmp_path):
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.zeros(10, dtype=np.uint16).tofile(tmp_path / "val.bin")
    victim = tmp_path / "pwned"
    payload = pickle.dumps(_run_code_by_reduce(victim), protocol=2)
    assert b"system" in payload
    (tmp_path / "meta.pkl").write_bytes(payload)
    with pytest.raises(DataError, match=r"meta.pkl is not a plain-data pickle \(it names (posix|os|nt)\.system\)"):
        open_data(tmp_path)
    assert not victim.exists()


def test_a_wide_vocabulary_is_read_as_uint32(tmp_path):
    ids = np.array([0, 65536, 69999, 7], dtype="<u4")  # as prepare writes a bpe:70000 corpus
    ids[:3].tofile(tmp_path / "train.bin")
    ids[3:].tofile(tmp_path / "val.bin")
    meta = {
        "format": "gpt2-prepared",
        "version": 1,
        "tokenizer": "bpe:70000",
        "vocab_size": 70000,
        "dtype": "uint32",
        "train_tokens": 3,
        "val_tokens": 1,
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    data = open_data(tmp_path)
    assert data.train.tolist() == [0, 65536, 69999] and data.val.tolist() == [7] and data.tokenizer is None
    for key, value, message in [
        ("dtype", "float32", "dtype is 'float32', not uint16 or uint32"),
        ("vocab_size", 0, "vocab_size is 0, not a positive integer"),
        ("vocab_size", 50257, "train.bin holds token id 69999, beyond its vocabulary of 50257 ids"),
    ]:
        (tmp_path / "meta.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises((DataError, TokenIdError), match=message):
            open_data(tmp_path)
    Tokenizer.gpt2().save(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="meta.json says vocab_size 70000, but its tokenizer has 50257 ids"):
        open_data(tmp_path)


def test_chat_data_reads_its_masks_and_template(tmp_path):
    ids, masks = chat_splits()
    data = open_data(write_chat_data(tmp_path / "chat", ids, masks, TEMPLATE))
    assert data.chat_template == TEMPLATE and sorted(data.masks) == ["train", "val"]
    for split in ("train", "val"):
        assert data.masks[split].dtype == np.uint8 and data.masks[split].tolist() == masks[split].tolist()
        with pytest.raises(ValueError, match="read-only"):
            data.masks[split][0] = 1
    assert data.train.tolist() == ids["train"].tolist()
    (tmp_path / "doc.txt").write_text("plain text, no conversations")
    prepare([tmp_path / "doc.txt"], tmp_path / "plain", "char", progress=False)
    plain = open_data(tmp_path / "plain")
    assert plain.masks == {} and plain.chat_template is None


def test_chat_data_that_does_not_hold_together(tmp_path):
    ids, masks = chat_splits()
    out = write_chat_data(tmp_path / "chat", ids, masks, TEMPLATE)
    (out / "val.mask.bin").unlink()
    with pytest.raises(
        DataError, match=re.escape(f"{out / 'val.mask.bin'} is missing: meta.json says the data holds conversations")
    ):
        open_data(out)
    np.asarray(masks["val"][:150], dtype=np.uint8).tofile(out / "val.mask.bin")
    with pytest.raises(
        DataError, match=re.escape(f"{out / 'val.mask.bin'} holds 150 mask bytes, but {out / 'val.bin'} holds 200 ids")
    ):
        open_data(out)
    two = masks["val"].astype(np.uint8) * 2
    write_chat_data(out, ids, {**masks, "val": two}, TEMPLATE)
    with pytest.raises(DataError, match="val.mask.bin holds the byte 2: a mask holds 1 \\(a target\\) or 0"):
        open_data(out)
    write_chat_data(out, ids, {**masks, "train": np.zeros(600)}, TEMPLATE)
    with pytest.raises(DataError, match="train.mask.bin marks no target: the loss would count nothing"):
        open_data(out)
    write_chat_data(out, ids, masks, TEMPLATE)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(
        json.dumps({**meta, "chat": {**meta["chat"], "mask_tokens": {"train": 1, "val": 200}}})
    )
    with pytest.raises(
        DataError,
        match=f"train.mask.bin marks {int(masks['train'].sum())} targets, but meta.json says "
        f"chat.mask_tokens.train = 1",
    ):
        open_data(out)
    for chat in ("a template", {"template": 3}, {"template": TEMPLATE, "mask_tokens": [1, 2]}):
        (out / "meta.json").write_text(json.dumps({**meta, "chat": chat}))
        with pytest.raises(DataError, match="meta.json: chat is not an object with the template's text"):
            open_data(out)


def test_a_failed_chat_prepare_keeps_the_older_data(tmp_path):
    write_conversations(tmp_path / "chat.jsonl", QA)
    prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    with open(tmp_path / "chat.jsonl", "a", encoding="utf-8") as f:
        f.write(
            '{"messages": [{"role": "user", "content": "the last line is wrong"}]}\n'
        )  # after 12 conversations encoded
    with pytest.raises(DataError, match=r"line 13: the conversation has no assistant message"):
        prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", overwrite=True, progress=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before  # and no scratch directory


def test_an_overwrite_leaves_no_stale_masks(tmp_path):
    """Conversations over text, then text over conversations: never a mask beside ids that are not its own."""
    write_conversations(tmp_path / "chat.jsonl", QA)
    (tmp_path / "doc.txt").write_text("hello there, general kenobi " * 20, encoding="utf-8")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="already holds prepared data"):
        prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", progress=False)
    prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", overwrite=True, progress=False)
    names = {"train.bin", "val.bin", "train.mask.bin", "val.mask.bin", "meta.json", "encoder.json", "vocab.bpe"}
    assert {p.name for p in (tmp_path / "out").iterdir()} == names
    prepare([tmp_path / "doc.txt"], tmp_path / "out", overwrite=True, progress=False)
    assert {p.name for p in (tmp_path / "out").iterdir()} == names - {"train.mask.bin", "val.mask.bin"}
    assert "chat" not in json.loads((tmp_path / "out" / "meta.json").read_text())
    (tmp_path / "out" / "meta.json").unlink()
    (tmp_path / "out" / "train.bin").unlink()
    (tmp_path / "out" / "val.bin").unlink()
    (tmp_path / "out" / "val.mask.bin").write_bytes(
        b"\x01"
    )  # a mask alone is prepared data too: not overwritten by accident
    with pytest.raises(DataError, match=r"already holds prepared data \(val.mask.bin\)"):
        prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", progress=False)


# ------------------------------------------------------------------ rows and masks of any data (meta.json's row, mask)

MARKS = "the ids copying predicts"


def write_rows_data(directory, ids: dict, masks: dict | None, row: int | None, n_vocab: int = 64) -> dict:
    """Prepared data written by hand (not by the code under test): train.bin and val.bin of `ids`, no tokenizer,
    meta.json with "row" (unless None) and, with `masks`, train.mask.bin, val.mask.bin and "mask" (what it marks and
    how many by split), no "chat". Returns the meta.json written."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"format": "gpt2-prepared", "version": 1, "tokenizer": None, "vocab_size": n_vocab, "dtype": "uint16"}
    for split in ("train", "val"):
        np.asarray(ids[split], dtype="<u2").tofile(directory / f"{split}.bin")
        meta[f"{split}_tokens"] = len(ids[split])
    if row is not None:
        meta["row"] = row
    if masks is not None:
        for split in ("train", "val"):
            np.asarray(masks[split], dtype=np.uint8).tofile(directory / f"{split}.mask.bin")
        meta["mask"] = {"marks": MARKS, "tokens": {s: int(np.count_nonzero(m)) for s, m in masks.items()}}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def rows_splits(row: int = 13, n_train: int = 20, n_val: int = 4) -> tuple[dict, dict]:
    """Ids of rows (row r holds r, r + 1, ... mod 64) and a mask of random bytes, by split."""
    rng = np.random.default_rng(0)
    ids = {s: (np.arange(n)[:, None] + np.arange(row)).ravel() % 64 for s, n in (("train", n_train), ("val", n_val))}
    masks = {split: rng.integers(0, 2, len(v)) for split, v in ids.items()}
    return ids, masks


def test_data_of_rows_reads_its_row_and_its_mask(tmp_path):
    ids, masks = rows_splits()
    write_rows_data(tmp_path / "rows", ids, masks, 13)
    data = open_data(tmp_path / "rows")
    assert (data.row, data.mask_marks, data.chat_template, data.tokenizer) == (13, MARKS, None, None)
    for split in ("train", "val"):
        assert data.masks[split].tolist() == masks[split].tolist() and data.train.tolist() == ids["train"].tolist()
    data.check_block_size(12)  # a window of 13 ids: a whole row
    with pytest.raises(DataError, match=r"made of rows of 13 ids, too short for block_size 13: a window needs 14 ids"):
        data.check_block_size(13)

    write_rows_data(tmp_path / "masked", ids, masks, None)  # a mask without rows: a stream of ids, scored where marked
    masked = open_data(tmp_path / "masked")
    assert (masked.row, masked.mask_marks, sorted(masked.masks)) == (None, MARKS, ["train", "val"])
    write_rows_data(tmp_path / "plain", ids, None, 13)  # rows without a mask: every target scored
    plain = open_data(tmp_path / "plain")
    assert (plain.row, plain.masks, plain.mask_marks) == (13, {}, None)


def test_chat_data_as_written_before_the_mask_entry_is_still_read(tmp_path):
    """Conversations' meta.json says their masks in "chat" (chat.mask_tokens), with no "mask": still read, the mask
    marking the replies, the counts still checked against chat.mask_tokens."""
    ids, masks = chat_splits()
    out = write_chat_data(tmp_path / "chat", ids, masks, TEMPLATE)
    meta = json.loads((out / "meta.json").read_text())
    assert "mask" not in meta and "row" not in meta
    data = open_data(out)
    assert (data.mask_marks, data.chat_template, data.row) == ("the replies", TEMPLATE, None)
    assert [data.masks[s].tolist() for s in ("train", "val")] == [masks[s].tolist() for s in ("train", "val")]
    (out / "meta.json").write_text(json.dumps({**meta, "chat": {**meta["chat"], "mask_tokens": {"train": 1}}}))
    with pytest.raises(DataError, match=r"marks \d+ targets, but meta.json says chat.mask_tokens.train = 1"):
        open_data(out)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"row": 1}, "meta.json: row is 1, not a whole number from 2 up (the ids a row): prepare the data again"),
        ({"row": "13"}, "meta.json: row is '13', not a whole number from 2 up"),
        ({"row": True}, "meta.json: row is True, not a whole number from 2 up"),
        ({"row": 7}, "train.bin holds 260 ids, not a whole number of rows of 7 (meta.json's row): prepare the data"),
        ({"mask": "copies"}, "meta.json: mask is not an object with what the mask marks (mask.marks, a phrase)"),
        ({"mask": {"marks": "", "tokens": {}}}, "meta.json: mask is not an object with what the mask marks"),
        ({"mask": {"marks": MARKS, "tokens": [1, 2]}}, "meta.json: mask is not an object with what the mask marks"),
        ({"mask": {"marks": MARKS, "tokens": {"val": 1}}}, "targets, but meta.json says mask.tokens.val = 1: prepare"),
    ],
)
def test_data_of_rows_that_does_not_hold_together(tmp_path, change, message):
    ids, masks = rows_splits()
    meta = write_rows_data(tmp_path / "rows", ids, masks, 13)
    (tmp_path / "rows" / "meta.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(DataError) as caught:
        open_data(tmp_path / "rows")
    assert message in str(caught.value)


def test_a_mask_meta_json_names_must_be_there(tmp_path):
    ids, masks = rows_splits()
    write_rows_data(tmp_path / "rows", ids, masks, 13)
    (tmp_path / "rows" / "val.mask.bin").unlink()
    with pytest.raises(
        DataError,
        match=re.escape(
            f"{tmp_path / 'rows' / 'val.mask.bin'} is missing: meta.json says the data holds a loss mask (mask), "
            f"whose loss counts the targets the mask marks; prepare the data again"
        ),
    ):
        open_data(tmp_path / "rows")

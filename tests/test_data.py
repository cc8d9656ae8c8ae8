"""Training data: prepare's ids against independent encoders, the splits, other tools' formats, batches, errors."""

from __future__ import annotations

import io
import json
import pickle
import re
import sys

import numpy as np
import pytest
import torch

from helpers import corpus
from gpt2 import DataError, InvalidArgumentError, TokenIdError, Tokenizer
from gpt2 import data as data_module
from gpt2.data import get_batch, ids_dtype, open_data, prepare
from gpt2.tokenizer import CharTokenizer

EOT = 50256


def read_ids(path, dtype="<u2") -> list[int]:
    return np.fromfile(path, dtype=dtype).tolist()


# ------------------------------------------------------------------ prepare


def test_char_data_equals_nanogpts_preparation(tmp_path):
    text = corpus()[1][:200_000]
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    meta = prepare([tmp_path / "input.txt"], tmp_path / "out", "char", progress=False)
    # nanoGPT's shakespeare_char/prepare.py, written out: sorted characters, a 90/10 cut
    chars = sorted(set(text))
    ids = [chars.index(c) for c in text]
    n = len(ids)
    assert read_ids(tmp_path / "out" / "train.bin") == ids[: int(n * 0.9)]
    assert read_ids(tmp_path / "out" / "val.bin") == ids[int(n * 0.9) :]
    assert meta["vocab_size"] == len(chars) and meta["dtype"] == "uint16"
    assert (meta["train_tokens"], meta["val_tokens"]) == (int(n * 0.9), n - int(n * 0.9))
    assert json.loads((tmp_path / "out" / "chars.json").read_text(encoding="utf-8"))["chars"] == chars
    data = open_data(tmp_path / "out")
    assert data.tokenizer.decode(data.val[:50]) == text[int(n * 0.9) :][:50]


def test_gpt2_ids_equal_tiktoken_per_document(tmp_path, tiktoken_gpt2):
    docs = {"a.txt": "Hello world.\n\nA second <|endoftext|> paragraph.", "b/c.txt": "  spaces\t\tand tabs \n", "b/d.txt": "日本語 ✓ 🎉"}
    for name, text in docs.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_text(text, encoding="utf-8")
    prepare([tmp_path / "in"], tmp_path / "out", val_fraction=0.3, progress=False)
    expected = {name: tiktoken_gpt2.encode_ordinary(text) + [EOT] for name, text in docs.items()}
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert sorted(got) == sorted(sum(expected.values(), []))
    # whole documents in each split, in their sorted order
    train, val = read_ids(tmp_path / "out" / "train.bin"), read_ids(tmp_path / "out" / "val.bin")
    order = ["a.txt", "b/c.txt", "b/d.txt"]
    in_val = [name for name in order if _contains(val, expected[name])]
    assert val == sum((expected[n] for n in in_val), []) and train == sum((expected[n] for n in order if n not in in_val), [])
    assert len(val) >= 0.3 * len(got) and in_val and len(in_val) < 3


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


ADVERSARIAL = "a \n\nb\n\n\nc's \n  don't\nI'll\n\n 123\n456\r\nx\n\u3000\ny!\n?\n\t\nz" * 40


@pytest.mark.parametrize("text", [ADVERSARIAL, corpus()[1][:300_000]], ids=["adversarial", "corpus"])
def test_chunks_never_change_the_ids(tmp_path, monkeypatch, tiktoken_gpt2, text):
    monkeypatch.setattr(data_module, "CHUNK_BYTES", 97)  # thousands of chunks, cut wherever they may be
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", val_fraction=0.5, progress=False)
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert got == tiktoken_gpt2.encode_ordinary(text) + [EOT]


def test_safe_cuts_are_where_the_pretokenizer_cuts():
    from gpt2.tokenizer import GPT2_PATTERN

    import regex

    text = ADVERSARIAL + corpus()[1][:20_000]
    pieces = regex.findall(GPT2_PATTERN, text)
    boundaries = set(np.cumsum([len(p) for p in pieces]).tolist())
    cuts = [m.start() for m in data_module._SAFE_CUT.finditer(text)]
    assert cuts and set(cuts) <= boundaries


def test_bpe_data_equals_its_own_tokenizer(tmp_path):
    text = corpus()[1][:50_000]
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    meta = prepare([tmp_path / "doc.txt"], tmp_path / "out", "bpe:300", progress=False)
    trained = Tokenizer.from_files(tmp_path / "out" / "encoder.json", tmp_path / "out" / "vocab.bpe")
    assert meta["vocab_size"] == trained.n_vocab == 300
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert got == trained.encode(text) + [trained.eot_token]


def test_standard_input_is_a_document(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("to be or not to be".encode())))
    prepare(["-"], tmp_path / "out", "char", val_fraction=0.5, progress=False)
    chars = sorted(set("to be or not to be"))
    ids = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert "".join(chars[i] for i in ids) == "to be or not to be"


def test_wide_vocabularies_take_uint32():
    assert ids_dtype(65536) == np.dtype("<u2") and ids_dtype(65537) == np.dtype("<u4")


@pytest.mark.parametrize("args, error, message", [
    (dict(tokenizer="bpe:100"), InvalidArgumentError, "unknown tokenizer 'bpe:100': use gpt2, char, or bpe:N"),
    (dict(tokenizer="sentencepiece"), InvalidArgumentError, "unknown tokenizer 'sentencepiece'"),
    (dict(val_fraction=0.0), InvalidArgumentError, r"val_fraction must be a number in \(0, 1\), got 0.0"),
    (dict(val_fraction=1.5), InvalidArgumentError, r"val_fraction must be a number in \(0, 1\)"),
])  # fmt: skip
def test_bad_settings(tmp_path, args, error, message):
    (tmp_path / "doc.txt").write_text("some text", encoding="utf-8")
    with pytest.raises(error, match=message):
        prepare([tmp_path / "doc.txt"], tmp_path / "out", progress=False, **{"tokenizer": "gpt2", **args})


def test_bad_inputs(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "hollow").mkdir()
    (tmp_path / "a.txt").write_text("a")
    cases = [
        ([tmp_path / "empty.txt"], "the corpus is empty"),
        ([tmp_path / "latin1.txt"], r"latin1.txt is not UTF-8 text \(byte 3"),
        ([tmp_path / "nowhere.txt"], "input '.*nowhere.txt' does not exist"),
        ([tmp_path / "hollow"], "hollow is a directory with no files in it"),
        ([tmp_path / "a.txt"], "a corpus of 1 tokens in 1 document\\(s\\) is too small to split with val_fraction 0.1: the training split"),
    ]
    for inputs, message in cases:
        with pytest.raises(DataError, match=message):
            prepare(inputs, tmp_path / "out", "char", progress=False)
    with pytest.raises(DataError, match="is a file, not a directory"):
        prepare([tmp_path / "a.txt"], tmp_path / "a.txt", progress=False)


def test_prepared_data_is_never_overwritten_by_accident(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    with pytest.raises(DataError, match="already holds prepared data .*pass --overwrite"):
        prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", overwrite=True, progress=False)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ other tools' data


def test_nanogpt_character_data_with_its_meta_pkl(tmp_path):
    chars = sorted(set("hello world"))
    ids = np.array([chars.index(c) for c in "hello world" * 10], dtype=np.uint16)
    ids[:80].tofile(tmp_path / "train.bin")
    ids[80:].tofile(tmp_path / "val.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:  # as nanoGPT's shakespeare_char/prepare.py writes it
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}, f)
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
    with pytest.raises(DataError, match="tiny_shakespeare_val.bin is not an llm.c token file: its magic number is 1234"):
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


# ------------------------------------------------------------------ batches


def test_batches_are_windows_and_their_next_ids():
    ids = np.arange(1000, dtype=np.uint16)
    x, y = get_batch(ids, 8, 5, seed=1, iteration=3, micro_step=2)
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.int64
    assert (y == x + 1).all() and (x[:, 1:] == x[:, :-1] + 1).all()
    assert int(x.max()) < 1000 - 1 and int(y.max()) <= 999


def test_batches_depend_only_on_seed_iteration_and_micro_step():
    ids = np.arange(10_000, dtype=np.uint16)
    first = get_batch(ids, 16, 4, seed=7, iteration=10, micro_step=1)[0]
    for other in [(7, 11, 1), (7, 10, 0), (8, 10, 1)]:
        get_batch(ids, 16, 4, seed=other[0], iteration=other[1], micro_step=other[2])  # draws in between change nothing
        assert not torch.equal(get_batch(ids, 16, 4, seed=other[0], iteration=other[1], micro_step=other[2])[0], first)
    assert torch.equal(get_batch(ids, 16, 4, seed=7, iteration=10, micro_step=1)[0], first)
    assert get_batch(ids, 16, 4, seed=7, iteration=0, micro_step=2**32 + 5)[0].shape == (4, 16)

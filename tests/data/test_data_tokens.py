"""Training data: prepare's ids against independent encoders, the splits, other tools' formats, batches, errors."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import sys

import numpy as np
import pytest
import torch
from helpers import VOCAB, corpus, tiktoken_from_files, write_chat_data, write_conversations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt2 import DataError, InvalidArgumentError, TokenIdError, Tokenizer, UnwritablePathError
from gpt2.data import text as text_module
from gpt2.data.batches import get_batch
from gpt2.data.chat import prepare_chat
from gpt2.data.files import Split, ids_dtype, open_data
from gpt2.data.text import prepare, split_documents
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
    docs = {
        "a.txt": "Hello world.\n\nA second <|endoftext|> paragraph.",
        "b/c.txt": "  spaces\t\tand tabs \n",
        "b/d.txt": "日本語 ✓ 🎉",
    }
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
    assert val == sum((expected[n] for n in in_val), []) and train == sum(
        (expected[n] for n in order if n not in in_val), []
    )
    assert len(val) == round(0.3 * len(got)) and in_val and len(in_val) < 3  # here whole documents make up the share


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


ADVERSARIAL = "a \n\nb\n\n\nc's \n  don't\nI'll\n\n 123\n456\r\nx\n\u3000\ny!\n?\n\t\nz" * 40


@pytest.mark.parametrize("text", [ADVERSARIAL, corpus()[1][:300_000]], ids=["adversarial", "corpus"])
def test_chunks_never_change_the_ids(tmp_path, monkeypatch, tiktoken_gpt2, text):
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 97)  # thousands of chunks, cut wherever they may be
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", val_fraction=0.5, progress=False)
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert got == tiktoken_gpt2.encode_ordinary(text) + [EOT]


def test_safe_cuts_are_where_the_pretokenizer_cuts():
    import regex

    from gpt2.tokenizer import GPT2_PATTERN

    text = ADVERSARIAL + corpus()[1][:20_000]
    pieces = regex.findall(GPT2_PATTERN, text)
    boundaries = set(np.cumsum([len(p) for p in pieces]).tolist())
    cuts = [m.start() for m in text_module._SAFE_CUT.finditer(text)]
    assert cuts and set(cuts) <= boundaries


def test_bpe_data_equals_tiktoken_on_the_trained_vocabulary(tmp_path):
    """The ids of a trained vocabulary are tiktoken's encoding with its files (which tiktoken checks
    follow GPT-2's layout): 256 bytes, the 43 merges, <|endoftext|> last, at 299."""
    text = corpus()[1][:50_000]
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    meta = prepare([tmp_path / "doc.txt"], tmp_path / "out", "bpe:300", progress=False)
    reference = tiktoken_from_files(tmp_path / "out" / "encoder.json", tmp_path / "out" / "vocab.bpe", eot=299)
    assert meta["vocab_size"] == reference.n_vocab == 300
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert got == reference.encode_ordinary(text) + [299]


def test_standard_input_is_a_document(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"to be or not to be")))
    prepare(["-"], tmp_path / "out", "char", val_fraction=0.5, progress=False)
    chars = sorted(set("to be or not to be"))
    ids = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert "".join(chars[i] for i in ids) == "to be or not to be"


def test_wide_vocabularies_take_uint32():
    assert ids_dtype(65536) == np.dtype("<u2") and ids_dtype(65537) == np.dtype("<u4")


@pytest.mark.parametrize(
    "args, error, message",
    [
        (dict(tokenizer="bpe:100"), InvalidArgumentError, "unknown tokenizer 'bpe:100': use gpt2, char, or bpe:N"),
        (dict(tokenizer="sentencepiece"), InvalidArgumentError, "unknown tokenizer 'sentencepiece'"),
        (dict(val_fraction=0.0), InvalidArgumentError, r"val_fraction must be a number in \(0, 1\), got 0.0"),
        (dict(val_fraction=1.5), InvalidArgumentError, r"val_fraction must be a number in \(0, 1\)"),
    ],
)
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
        (
            [tmp_path / "a.txt"],
            "a corpus of 1 tokens in 1 document\\(s\\) is too small to split with val_fraction 0.1: the training split",
        ),
    ]
    for inputs, message in cases:
        with pytest.raises(DataError, match=message):
            prepare(inputs, tmp_path / "out", "char", progress=False)
    with pytest.raises(UnwritablePathError, match="a.txt is a file, not a directory"):
        prepare([tmp_path / "a.txt"], tmp_path / "a.txt", progress=False)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(DataError, match="input '.*pipe' is not a file or a directory: pipe it in as -"):
            prepare([tmp_path / "pipe"], tmp_path / "out", progress=False)


def test_prepared_data_is_never_overwritten_by_accident(tmp_path):
    (tmp_path / "doc.txt").write_text("hello there, general kenobi")
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    with pytest.raises(DataError, match="already holds prepared data .*pass overwrite=True") as e:
        prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", progress=False)
    assert e.value.param == "overwrite"
    prepare([tmp_path / "doc.txt"], tmp_path / "out", "char", overwrite=True, progress=False)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ other tools' data


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


# ------------------------------------------------------------------ chunk boundaries, more inputs and errors

_SOUP = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u3000",
    "\xa0",
    "\x1c",
    "\x85",
    "'",
    "'s",
    "'ll",
    "'t",
    "s",
    "ll",
    "a",
    "Z",
    "1",
    "23",
    "!",
    "?!",
    "é",
    "日本",
    "🎉",
    "<|endoftext|>",
    "x\n",
    "\n y",
]
_TIKTOKEN = None


def _reference():
    global _TIKTOKEN  # hypothesis tests cannot take function-scoped fixtures; build the reference once
    _TIKTOKEN = _TIKTOKEN or tiktoken_from_files(VOCAB / "encoder.json", VOCAB / "vocab.bpe")
    return _TIKTOKEN


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_SOUP), max_size=120).map("".join), st.integers(1, 24))
def test_chunks_of_whitespace_and_contraction_soup_encode_as_the_whole(text, chunk_bytes):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(text_module, "CHUNK_BYTES", chunk_bytes)
        path = Path(tmp) / "doc.txt"
        path.write_text(text, encoding="utf-8", newline="")
        chunks = list(text_module.read_chunks(text_module.Document("doc.txt", path, path.stat().st_size)))
    assert "".join(chunks) == text and all(chunks)
    assert sum((_reference().encode_ordinary(c) for c in chunks), []) == _reference().encode_ordinary(text)


def test_a_multi_megabyte_document_through_small_chunks(tmp_path, monkeypatch, tiktoken_gpt2):
    text = (ADVERSARIAL + corpus()[1][:700_000] + "日本語のテキスト\n") * 3
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 8192)
    document = text_module.find_documents([tmp_path / "doc.txt"], tmp_path / "unused")[0]
    assert document.size > 2_000_000 and sum(1 for _ in text_module.read_chunks(document)) > 200
    prepare([tmp_path / "doc.txt"], tmp_path / "out", val_fraction=0.25, progress=False)
    got = np.concatenate([np.fromfile(tmp_path / "out" / f, dtype="<u2") for f in ("train.bin", "val.bin")])
    assert got.tolist() == tiktoken_gpt2.encode_ordinary(text) + [EOT]


def test_a_document_with_no_safe_cut_is_read_whole(tmp_path, monkeypatch, tiktoken_gpt2):
    text = "日本語" * 5000 + "\n" + "x" * 3000  # one long piece: the pre-tokenizer never cuts it either
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 100)
    prepare([tmp_path / "doc.txt"], tmp_path / "out", val_fraction=0.5, progress=False)
    got = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert got == tiktoken_gpt2.encode_ordinary(text) + [EOT]
    # a character vocabulary is cut anywhere: no cut can change its ids
    prepare([tmp_path / "doc.txt"], tmp_path / "char", "char", progress=False)
    chars = sorted(set(text))
    got = read_ids(tmp_path / "char" / "train.bin") + read_ids(tmp_path / "char" / "val.bin")
    assert got == [chars.index(c) for c in text]


def test_one_worker_writes_the_same_files(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"{i}.txt").write_text(corpus()[1][i * 20_000 : (i + 1) * 20_000], encoding="utf-8")
    meta = prepare([docs], tmp_path / "a", val_fraction=0.2, progress=False)
    assert prepare([docs], tmp_path / "b", val_fraction=0.2, progress=False, num_workers=1) == meta
    for name in ("train.bin", "val.bin", "meta.json", "encoder.json", "vocab.bpe"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for name in ("encoder.json", "vocab.bpe"):  # GPT-2's vocabulary travels as OpenAI's own files
        assert (tmp_path / "a" / name).read_bytes() == (VOCAB / name).read_bytes()
    assert meta["sources"] == {"inputs": [str(docs)], "documents": 6} and meta["tokenizer"] == "gpt2"
    n = meta["train_tokens"] + meta["val_tokens"]
    assert {k: meta["split"][k] for k in ("val_fraction", "method", "seed")} == {
        "val_fraction": 0.2,
        "method": "documents",
        "seed": text_module.SPLIT_SEED,
    }
    assert meta["val_tokens"] == round(0.2 * n) and meta["split"]["actual_val_fraction"] == meta["val_tokens"] / n
    assert meta["format"] == "gpt2-prepared" and meta["version"] == 1 and meta["vocab_size"] == 50257


def test_bad_inputs_and_workers(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("some text to split", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"text")))
    cases = [
        (dict(inputs=["-", "-"]), InvalidArgumentError, r"'-' \(standard input\) is given twice"),
        (dict(inputs=[tmp_path / "a.txt", 3]), TypeError, "inputs are paths .* got 3"),
        (dict(inputs=str(tmp_path / "a.txt")), InvalidArgumentError, "inputs must be a list"),
        (dict(inputs=[]), InvalidArgumentError, "inputs must be a list"),
        (dict(num_workers=0), InvalidArgumentError, "num_workers must be a positive integer, got 0"),
        (dict(val_fraction=float("nan")), InvalidArgumentError, "val_fraction must be a number in"),
        (dict(tokenizer="bpe:3.5"), InvalidArgumentError, "unknown tokenizer 'bpe:3.5'"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            prepare(**{"inputs": [tmp_path / "a.txt"], "out": tmp_path / "out", "progress": False, **args})


def test_an_unwritable_out_is_named_before_any_input_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # reading it would fail otherwise
    (tmp_path / "a-file").write_text("x")
    cases = [(tmp_path / "a-file" / "out", f"{tmp_path / 'a-file'} is a file, not a directory")]
    if os.path.isdir("/proc/self"):  # Linux
        cases.append(("/proc/gpt2-data", "/proc takes no new files or directories (no such file or directory)"))
    for out, reason in cases:
        with pytest.raises(UnwritablePathError, match=f"^{re.escape(f'cannot write into {out}: {reason}')}$"):
            prepare(["-"], out, progress=False)


def test_the_same_file_given_twice_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    a, b = tmp_path / "docs" / "a.txt", tmp_path / "docs" / "b.txt"
    a.write_text("some text to split", encoding="utf-8")
    b.write_text("other text", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(a)
    os.link(a, tmp_path / "hard.txt")
    cases = [
        ([a, b, a], f"'{a}' is given twice"),
        (["docs/a.txt", str(a)], f"'{a}' and 'docs/a.txt' are the same file"),
        ([a, "docs/sub/../a.txt"], f"'docs/sub/../a.txt' and '{a}' are the same file"),
        ([a, tmp_path / "link.txt"], f"'{tmp_path / 'link.txt'}' and '{a}' are the same file"),
        ([tmp_path / "hard.txt", a], f"'{a}' and '{tmp_path / 'hard.txt'}' are the same file"),
        ([tmp_path / "docs", b], f"'{b}' is given twice"),  # once in a directory, once by itself
        ([b, "docs"], f"'docs/b.txt' and '{b}' are the same file"),
    ]
    for inputs, message in cases:
        with pytest.raises(DataError, match=f"^{re.escape(message)}: give each file once"):
            prepare(inputs, tmp_path / "out", "char", progress=False)
        assert not (tmp_path / "out").exists()


def test_several_documents_split_at_the_fraction_with_at_most_one_cut(tmp_path, tiktoken_gpt2):
    # Sizes far apart, as a user's files are; drawn in the order 3, 2, 4, 0, 1 (the split's seed).
    text, sizes = corpus()[1], [9_000, 60, 2_000, 300, 30_000]
    docs = [text[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(5)]
    for i, doc in enumerate(docs):
        (tmp_path / "in" / f"{i}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "in" / f"{i}.txt").write_text(doc, encoding="utf-8", newline="")
    ids = [tiktoken_gpt2.encode_ordinary(doc) + [EOT] for doc in docs]
    n = sum(map(len, ids))
    for fraction in (0.02, 0.1, 0.5):
        meta = prepare([tmp_path / "in"], tmp_path / str(fraction), val_fraction=fraction, progress=False)
        # What the split should be, worked out here: whole documents in the drawn order while they
        # fit in round(F * n) ids, then the tail of the next one; each split keeps the documents' order.
        target, whole, cut = round(fraction * n), [], None
        for d in np.random.default_rng(text_module.SPLIT_SEED).permutation(5).tolist():
            if sum(len(ids[w]) for w in whole) + len(ids[d]) > target:
                cut = (d, target - sum(len(ids[w]) for w in whole))
                break
            whole.append(d)
        val = [
            i
            for d in range(5)
            for i in (ids[d] if d in whole else ids[d][len(ids[d]) - cut[1] :] if d == cut[0] else [])
        ]
        train = [
            i for d in range(5) if d not in whole for i in (ids[d][: len(ids[d]) - cut[1]] if d == cut[0] else ids[d])
        ]
        assert (tmp_path / str(fraction) / "val.bin").read_bytes() == np.array(val, dtype="<u2").tobytes()
        assert (tmp_path / str(fraction) / "train.bin").read_bytes() == np.array(train, dtype="<u2").tobytes()
        assert abs(len(val) - fraction * n) <= 1 and cut is not None and 0 < cut[1] < len(ids[cut[0]])
        assert meta["split"] == {
            "val_fraction": fraction,
            "method": "documents",
            "seed": text_module.SPLIT_SEED,
            "actual_val_fraction": len(val) / n,
            "val_documents": len(whole),
            "cut": {"document": str(tmp_path / "in" / f"{cut[0]}.txt"), "val_tokens": cut[1]},
        }
        assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))


def test_whole_documents_that_make_up_the_fraction_are_not_cut():
    # drawn in the order 2, 0, 1
    assert split_documents([30, 50, 20], 0.2) == Split([(0, 30), (30, 80)], [(80, 100)], "documents", 1, None)
    assert split_documents([30, 50, 20], 0.4) == Split(
        [(0, 10), (30, 80)], [(10, 30), (80, 100)], "documents", 1, (0, 20)
    )
    # one token of validation at least, and of training
    assert split_documents([1, 1, 1], 0.01).val == [(2, 3)] and split_documents([1, 1, 1], 0.99).train == [(1, 2)]


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


def test_batch_offsets_are_the_seeded_draw():
    ids = np.arange(5000, dtype=np.uint16)
    for seed, iteration, micro_step in [(0, 0, 0), (1337, 12, 3), (5, 7, 2**32 + 9)]:
        offsets = np.random.default_rng([seed, iteration, micro_step]).integers(0, 5000 - 32, size=6)
        x, y = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step)
        assert x[:, 0].tolist() == offsets.tolist() and y[:, -1].tolist() == (offsets + 32).tolist()


@pytest.mark.parametrize(
    "args, error, message",
    [
        (dict(block_size=0), InvalidArgumentError, "block_size must be a positive integer, got 0"),
        (dict(batch_size=1.0), InvalidArgumentError, "batch_size must be a positive integer, got 1.0"),
        (dict(seed=-1), InvalidArgumentError, "seed must be a whole number from 0 to"),
        (dict(micro_step=True), InvalidArgumentError, "micro_step must be a whole number from 0 to .*got True"),
        (dict(block_size=10), DataError, "10 ids are too short for block_size 10: a window needs 11"),
        (
            dict(mask=np.ones(9, dtype=np.uint8)),
            InvalidArgumentError,
            "mask holds 9 bytes for 10 ids: it needs one for each id",
        ),
    ],
)
def test_bad_batch_arguments(args, error, message):
    with pytest.raises(error, match=message):
        get_batch(
            np.arange(10, dtype=np.uint16),
            **{"block_size": 4, "batch_size": 2, "seed": 0, "iteration": 0, "micro_step": 0, **args},
        )


# ------------------------------------------------------------------ overwrites, failures, and paths to files


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


def test_bad_arguments_are_refused_before_anything_is_read_or_made(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # reading it would fail otherwise
    for args in [dict(tokenizer="bpe:100"), dict(tokenizer=None), dict(val_fraction=1), dict(num_workers=-1)]:
        with pytest.raises(InvalidArgumentError):
            prepare(["-"], tmp_path / "out", progress=False, **args)
    (tmp_path / "doc.txt").write_text("text", encoding="utf-8")
    with pytest.raises(DataError, match="does not exist"):
        prepare([tmp_path / "doc.txt", tmp_path / "nowhere.txt"], tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt"]


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_batches_on_cuda_equal_those_on_the_cpu():
    ids = np.arange(4096, dtype=np.uint16)
    x, y = get_batch(ids, 64, 8, seed=3, iteration=5, micro_step=1, device="cuda")
    x_cpu, y_cpu = get_batch(ids, 64, 8, seed=3, iteration=5, micro_step=1)
    assert x.is_cuda and y.is_cuda and torch.equal(x.cpu(), x_cpu) and torch.equal(y.cpu(), y_cpu)


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


def _documents_in_val(
    train: list[int], val: list[int], expected: list[list[int]], cut: tuple[int, int] | None
) -> list[int]:
    """Which documents val holds whole, checking that train and val are the documents in order, whole
    but for the one `cut` (document, its ids in val): its head in train, its tail in val."""
    in_val, t, v = [], 0, 0
    for d, ids in enumerate(expected):
        if cut is not None and d == cut[0]:
            head, tail = ids[: len(ids) - cut[1]], ids[len(ids) - cut[1] :]
            assert train[t : t + len(head)] == head and val[v : v + len(tail)] == tail, (
                f"document {d} is not split as said"
            )
            t, v = t + len(head), v + len(tail)
        elif train[t : t + len(ids)] == ids:
            t += len(ids)
        else:
            assert val[v : v + len(ids)] == ids, f"document {d} is in neither split whole"
            in_val.append(d)
            v += len(ids)
    assert (t, v) == (len(train), len(val))
    return in_val


def test_many_documents_through_the_worker_pool(tmp_path, monkeypatch, tiktoken_gpt2):
    import gpt2.tokenizer.pool as tokenizer_pool

    text = corpus()[1]
    docs = [f"document {i}:\n" + text[i * 7919 : i * 7919 + 300 * (i % 7)] + " \n\n " * (i % 3) for i in range(30)]
    for i, doc in enumerate(docs):
        (tmp_path / "in" / f"{i:02d}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "in" / f"{i:02d}.txt").write_text(doc, encoding="utf-8", newline="")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 700)  # batches of several documents, documents over several batches
    monkeypatch.setattr(tokenizer_pool, "_PARALLEL_MIN_CHARS", 0)  # and every batch through the worker processes
    meta = prepare([tmp_path / "in"], tmp_path / "out", val_fraction=0.2, progress=False, num_workers=2)
    expected = [tiktoken_gpt2.encode_ordinary(doc) + [EOT] for doc in docs]
    train, val = read_ids(tmp_path / "out" / "train.bin"), read_ids(tmp_path / "out" / "val.bin")
    cut = meta["split"]["cut"]
    in_val = _documents_in_val(train, val, expected, cut and (int(cut["document"][-6:-4]), cut["val_tokens"]))
    assert (
        0 < len(in_val) < 30
        and len(val) == round(0.2 * (len(train) + len(val)))
        and meta["split"]["val_documents"] == len(in_val)
    )
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))


# ------------------------------------------------------------------ conversations: masks


TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def chat_splits(n_train: int = 600, n_val: int = 200, seed: int = 0) -> tuple[dict, dict]:
    """GPT-2 ids (0 .. n - 1, each its own position) and a mask of random spans by split."""
    rng = np.random.default_rng(seed)
    ids = {"train": np.arange(n_train), "val": np.arange(n_val)}
    masks = {split: np.repeat(rng.integers(0, 2, size=len(v) // 10 + 1), 10)[: len(v)] for split, v in ids.items()}
    return ids, masks


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


def test_batches_with_a_mask_ignore_the_targets_it_does_not_mark():
    ids, masks = chat_splits(5000)
    ids, mask = ids["train"].astype(np.uint16), masks["train"].astype(np.uint8)
    for seed, iteration, micro_step in [(0, 0, 0), (1337, 12, 3)]:
        x, y = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step)
        mx, my = get_batch(ids, 32, 6, seed=seed, iteration=iteration, micro_step=micro_step, mask=mask)
        assert torch.equal(mx, x)  # the same windows
        marked = torch.from_numpy(mask[y.numpy()] == 1)  # an id here is its own position: y's own byte of the mask
        assert torch.equal(my[marked], y[marked]) and (my[~marked] == -100).all()
        assert 0 < int(marked.sum()) < marked.numel()


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


# ------------------------------------------------------------------ conversations (prepare_chat)


QA = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Spain?", "name": "ana"},  # a key the templates do not read: ignored
        {"role": "assistant", "content": "Madrid.", "weight": 1},
        {"role": "user", "content": "And of Japan, 日本?"},
        {"role": "assistant", "content": "Tōkyō 東京 — surely.\n\nYes."},
    ],
    [
        {"role": "user", "content": "  spaces  and\ttabs "},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "Again?"},
    ],
    *[
        [
            {"role": "user", "content": f"What is {i} plus {i + 3}?"},
            {"role": "assistant", "content": f"It is {2 * i + 3}."},
        ]
        for i in range(9)
    ],
]
# A template as many on the Hub are written, over several lines of a file: its own markers, the
# tokenizer's eos_token, {% generation %} around the reply.
CHATML_FILE = """{% for message in messages %}
{{ '<|im_start|>' + message['role'] + '\\n' }}
{% if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}
{% else %}
{{ message['content'] + '<|im_end|>' }}
{% endif %}
{{ '\\n' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""


def hf_chat_tokenizer(directory, tokenizer, template: str):
    """transformers' tokenizer of our vocabulary, read from the files save_pretrained writes, carrying `template`."""
    import transformers

    tokenizer.with_chat_template(template).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


def hf_encodings(hf, conversations) -> list[tuple[list[int], list[int]]]:
    """(ids, assistant mask) of each conversation, as transformers' apply_chat_template gives them."""
    encoded = [hf.apply_chat_template(m, return_dict=True, return_assistant_tokens_mask=True) for m in conversations]
    return [(list(e["input_ids"]), list(e["assistant_masks"])) for e in encoded]


def cut_at_conversations(out, expected: list[tuple[list[int], list[int]]]) -> list[str]:
    """The split each conversation went to, the files read back with numpy and cut where each one's
    expected ids lie; fails unless train.bin and val.bin (and their masks) hold exactly these
    conversations, whole and in order, with these masks."""
    ids = {split: read_ids(out / f"{split}.bin") for split in ("train", "val")}
    masks = {split: np.fromfile(out / f"{split}.mask.bin", dtype=np.uint8).tolist() for split in ("train", "val")}
    at, went = {"train": 0, "val": 0}, []
    for expected_ids, expected_mask in expected:
        found = [
            split for split in ("train", "val") if ids[split][at[split] : at[split] + len(expected_ids)] == expected_ids
        ]
        assert found, f"conversation {len(went)} is neither next in train.bin nor in val.bin"
        split = found[0]
        assert masks[split][at[split] : at[split] + len(expected_ids)] == expected_mask
        at[split] += len(expected_ids)
        went.append(split)
    assert at == {split: len(ids[split]) for split in at} == {split: len(masks[split]) for split in at}
    return went


@pytest.mark.parametrize("template_file", [None, "chatml.jinja"], ids=["default", "file"])
def test_chat_data_equals_transformers_apply_chat_template(tmp_path, template_file):
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "chat.jsonl", QA)
    source = DEFAULT_TEMPLATE
    if template_file:
        (tmp_path / template_file).write_text(source := CHATML_FILE, encoding="utf-8")
    meta = prepare_chat(
        [tmp_path / "chat.jsonl"],
        tmp_path / "out",
        val_fraction=0.25,
        progress=False,
        chat_template=template_file and tmp_path / template_file,
    )
    expected = hf_encodings(hf_chat_tokenizer(tmp_path / "hf", Tokenizer.gpt2(), source), QA)
    went = cut_at_conversations(tmp_path / "out", expected)
    assert went.count("val") == round(0.25 * len(QA)) == 3
    lengths = [len(ids) for ids, _ in expected]
    assert meta["chat"] == {
        "template": source,
        "conversations": {"train": len(QA) - 3, "val": 3},
        "mask_tokens": {
            split: sum(sum(mask) for (_, mask), s in zip(expected, went) if s == split) for split in ("train", "val")
        },
        "longest": max(lengths),
        "longest_at": f"{tmp_path / 'chat.jsonl'}, line {lengths.index(max(lengths)) + 1}",
    }
    assert json.loads((tmp_path / "out" / "meta.json").read_text()) == meta
    assert meta["split"]["method"] == "conversations" and meta["split"]["val_conversations"] == 3
    assert (meta["train_tokens"], meta["val_tokens"]) == tuple(
        sum(n for n, s in zip(lengths, went) if s == split) for split in ("train", "val")
    )
    assert meta["sources"] == {"inputs": [str(tmp_path / "chat.jsonl")], "files": 1}
    data = open_data(tmp_path / "out")  # the ids are ordinary prepared data to what reads them
    assert data.vocab_size == 50257 and len(data.train) == meta["train_tokens"]


def test_chat_data_of_several_files_and_standard_input(tmp_path, monkeypatch):
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "a.jsonl", QA[:5])
    text = "\n".join(json.dumps({"messages": m}) for m in QA[5:]) + "\n\n"  # a blank line: skipped
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    meta = prepare_chat([tmp_path / "a.jsonl", "-"], tmp_path / "out", val_fraction=0.5, progress=False)
    went = cut_at_conversations(
        tmp_path / "out", hf_encodings(hf_chat_tokenizer(tmp_path / "hf", Tokenizer.gpt2(), DEFAULT_TEMPLATE), QA)
    )
    assert went.count("val") == 6 and meta["sources"]["files"] == 2


def test_chat_bpe_keeps_endoftext_a_special_token(tmp_path):
    """A vocabulary trained on conversations learns no merge of <|endoftext|>'s text: it is the
    vocabulary's special token."""
    from gpt2.tokenizer import load_tokenizer
    from gpt2.tokenizer.chat import DEFAULT_TEMPLATE

    write_conversations(tmp_path / "chat.jsonl", QA)
    meta = prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", "bpe:300", progress=False)
    trained = load_tokenizer(tmp_path / "out")
    assert meta["vocab_size"] == trained.n_vocab == 300 and trained.special_tokens == {"<|endoftext|>": 299}
    assert not any(b"endoftext" in trained.token_bytes(i) or b"<|" in trained.token_bytes(i) for i in range(299))
    expected = hf_encodings(hf_chat_tokenizer(tmp_path / "hf", trained, DEFAULT_TEMPLATE), QA)
    cut_at_conversations(tmp_path / "out", expected)
    replies = [sum(m["role"] == "assistant" for m in messages) for messages in QA]
    assert [[mask[k] for k, i in enumerate(ids) if i == 299] for ids, mask in expected] == [[1] * n for n in replies]


def test_split_conversations_is_whole_conversations():
    from gpt2.data.chat import split_conversations

    counts = [3, 4, 5, 2, 7, 1]
    split = split_conversations(counts, 0.34)  # 2 of 6 validate
    assert split.method == "conversations" and split.val_documents == 2 and split.cut is None
    bounds = [(sum(counts[:c]), sum(counts[: c + 1])) for c in range(6)]

    def within(ranges):
        return [c for c, (s, e) in enumerate(bounds) if any(a <= s and e <= b for a, b in ranges)]

    assert len(within(split.val)) == 2 and sorted(within(split.val) + within(split.train)) == list(range(6))
    assert sum(e - s for s, e in split.train + split.val) == sum(counts)  # no id twice, none left out
    assert split_conversations([1, 1], 0.01).val_documents == 1 == split_conversations([1, 1], 0.99).val_documents


GOOD_LINE = json.dumps({"messages": QA[0]})
CHAT_ERRORS = [  # (the third line of chat.jsonl, after a good one and a blank one; the message)
    ("not json", "chat.jsonl, line 3: not a JSON object (Expecting value"),
    ("[1, 2]", 'chat.jsonl, line 3: a conversation is an object {"messages": [...]}, got a JSON list'),
    (
        '{"text": "hi"}',
        'chat.jsonl, line 3: a conversation is an object {"messages": [...]}, got an object with the keys text',
    ),
    ('{"messages": "hi"}', "chat.jsonl, line 3: messages must be a non-empty list of messages, got 'hi'"),
    (
        '{"messages": [{"role": "user", "content": "hi"}]}',
        "chat.jsonl, line 3: the conversation has no assistant message",
    ),
    (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}',
        "chat.jsonl, line 3: messages[1].role must be one of system, user, assistant, got 'robot'",
    ),
    (
        '{"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "yes"}]}',
        "chat.jsonl, line 3: messages[0].content must be a string, got ['hi']",
    ),
    (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no", "weight": 0}]}',
        "chat.jsonl, line 3: messages[1].weight is 0: every reply is learned (weight 1)",
    ),
]


@pytest.mark.parametrize("line, message", CHAT_ERRORS, ids=range(len(CHAT_ERRORS)))
def test_bad_conversations_are_named_by_file_and_line(tmp_path, line, message):
    (tmp_path / "chat.jsonl").write_text("\n".join([GOOD_LINE, "", line, GOOD_LINE]) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare_chat([tmp_path / "chat.jsonl"], tmp_path / "out", progress=False)
    assert message in str(e.value) and str(e.value).startswith(str(tmp_path / "chat.jsonl"))
    assert not (tmp_path / "out").exists()  # made by this prepare, removed by it


NO_SYSTEM = (
    "{% for m in messages %}\n{% if m['role'] == 'system' %}{{ raise_exception('no system messages here') }}{% endif %}"
    "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
)


def chat_error_cases(tmp_path) -> list[tuple[dict, type, str]]:
    """(prepare_chat's arguments, the error, its message) of each error but a line's own, the files made in tmp_path."""
    from gpt2.errors import ChatTemplateError, InputTypeError

    write_conversations(tmp_path / "chat.jsonl", QA[:3])
    write_conversations(tmp_path / "one.jsonl", QA[:1])
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    (tmp_path / "no-system.jinja").write_text(NO_SYSTEM, encoding="utf-8")
    (tmp_path / "no-replies.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8"
    )
    (tmp_path / "broken.jinja").write_text("hello\n{% for %}", encoding="utf-8")
    chat, jinja = str(tmp_path / "chat.jsonl"), lambda name: str(tmp_path / name)
    return [
        (
            dict(inputs=[chat], chat_template=jinja("no-system.jinja")),
            ChatTemplateError,
            f"{chat}, line 2: {jinja('no-system.jinja')} failed to render (line 2): no system messages here",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("broken.jinja")),
            ChatTemplateError,
            f"{jinja('broken.jinja')} is not a valid template: ",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("missing.jinja")),
            ChatTemplateError,
            f"cannot read the chat template {jinja('missing.jinja')}: no such file",
        ),
        (
            dict(inputs=[chat], chat_template=jinja("no-replies.jinja")),
            DataError,
            f"{jinja('no-replies.jinja')} marks no reply in 3 conversations: "
            "the tokens to learn are those inside {% generation %}",
        ),
        (
            dict(inputs=[chat, str(tmp_path / "empty.jsonl")]),
            DataError,
            f"{tmp_path / 'empty.jsonl'} holds no conversations",
        ),
        (
            dict(inputs=[str(tmp_path / "one.jsonl")]),
            DataError,
            "1 conversation cannot be split whole into training and validation: "
            "each split needs one (val_fraction 0.1 of them validates, at least 1); give 2 or more",
        ),
        (dict(inputs=[chat], tokenizer="char"), InvalidArgumentError, "the char tokenizer cannot hold a conversation"),
        (
            dict(inputs=[chat], chat_template=3),
            InputTypeError,
            "chat_template is the path of a Jinja2 file or a ChatTemplate, got 3",
        ),
        (
            dict(inputs=[chat, str(tmp_path / "nowhere.jsonl")]),
            DataError,
            f"input {str(tmp_path / 'nowhere.jsonl')!r} does not exist",
        ),
    ]


def test_chat_errors_say_what_and_where_and_leave_nothing(tmp_path):
    for args, error, message in chat_error_cases(tmp_path):
        with pytest.raises(error) as e:
            prepare_chat(out=tmp_path / "out", progress=False, **args)
        assert message in str(e.value), (message, str(e.value))
        assert not (tmp_path / "out").exists()


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

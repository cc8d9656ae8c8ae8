"""gpt2.data.text: prepare's ids against independent encoders, read in chunks cut where the pre-tokenizer cuts, the
split by documents, and the inputs and arguments it refuses."""

from __future__ import annotations

import io
import json
import os
import re
import sys

import numpy as np
import pytest
from data_helpers import EOT, read_ids
from helpers import VOCAB, corpus, tiktoken_from_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt2 import DataError, InvalidArgumentError, UnwritablePathError
from gpt2.data import text as text_module
from gpt2.data.files import Split, open_data
from gpt2.data.text import prepare, split_documents


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


def test_bad_arguments_are_refused_before_anything_is_read_or_made(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # reading it would fail otherwise
    for args in [dict(tokenizer="bpe:100"), dict(tokenizer=None), dict(val_fraction=1), dict(num_workers=-1)]:
        with pytest.raises(InvalidArgumentError):
            prepare(["-"], tmp_path / "out", progress=False, **args)
    (tmp_path / "doc.txt").write_text("text", encoding="utf-8")
    with pytest.raises(DataError, match="does not exist"):
        prepare([tmp_path / "doc.txt", tmp_path / "nowhere.txt"], tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.txt"]


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


def test_a_record_longer_than_a_chunk_is_cut_where_the_pretokenizer_cuts(tmp_path, monkeypatch, tiktoken_gpt2):
    # A huge record (a book on one JSON Lines line) is encoded a chunk at a time, by several workers,
    # rather than as one text; one without a safe cut stays whole, as a text file's would.
    records = [corpus()[1][:60_000], ADVERSARIAL, "日本語" * 2000, "", "short"]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in records), encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 1000)
    document = text_module.find_documents([tmp_path / "a.jsonl"], tmp_path / "unused")[0]
    got, record = [], []
    for piece in text_module.pieces(document):
        if piece is None:
            got.append(record)
            record = []
        else:
            record.append(piece)
    assert ["".join(r) for r in got] == records
    assert len(got[0]) > 40 and len(got[1]) > 1 and [len(r) for r in got[2:]] == [1, 1, 1]
    assert max(map(len, got[0])) < 3000  # about a chunk each
    for pieces, text in zip(got, records):
        assert sum((tiktoken_gpt2.encode_ordinary(p) for p in pieces), []) == tiktoken_gpt2.encode_ordinary(text)
    prepare([tmp_path / "a.jsonl"], tmp_path / "out", val_fraction=0.5, progress=False, num_workers=2)
    ids = read_ids(tmp_path / "out" / "train.bin") + read_ids(tmp_path / "out" / "val.bin")
    assert ids == [i for r in records for i in tiktoken_gpt2.encode_ordinary(r) + [EOT]]


def test_a_long_stretch_without_a_safe_cut_is_searched_once(tmp_path, monkeypatch, tiktoken_gpt2):
    # Each block read appends to the stretch; searching its whole second half again each time costs
    # a pass per block (quadratic in the stretch's length), searching only the new text one pass.
    class Counting:
        def __init__(self, pattern):
            self.pattern, self.scanned = pattern, 0

        def search(self, text, pos=0):
            self.scanned += len(text) - pos
            return self.pattern.search(text, pos)

    text = "日本語" * 30_000 + "\nand then words, cut as usual. " * 200
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 1000)  # 270 blocks in the stretch
    counting = Counting(text_module._SAFE_CUT)
    monkeypatch.setattr(text_module, "_SAFE_CUT", counting)
    document = text_module.find_documents([tmp_path / "doc.txt"], tmp_path / "unused")[0]
    chunks = list(text_module.read_chunks(document))
    assert "".join(chunks) == text and len(chunks) > 5 and len(chunks[0]) >= 90_000
    assert counting.scanned < 3 * len(text), counting.scanned
    assert sum((tiktoken_gpt2.encode_ordinary(c) for c in chunks), []) == tiktoken_gpt2.encode_ordinary(text)


def test_a_bad_record_deep_in_a_jsonl_file_is_named_by_its_line(tmp_path, monkeypatch):
    # The workers parse the lines they encode; what they find wrong reaches the caller as the reader said it
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 2000)  # a few dozen lines a share: many shares, two workers
    good = [json.dumps({"text": f"record {i}: " + "words " * 30}) for i in range(400)]
    for bad, message in [
        ('{"text": 7}', "line 322: the field 'text' holds int '7', not text"),
        ("{oops", "line 322: not a JSON"),
    ]:
        lines = good[:321] + [bad] + good[321:] + ["", "   "]  # blank lines are no records
        (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        with pytest.raises(DataError, match=f"a.jsonl, {re.escape(message)}"):
            prepare([tmp_path / "a.jsonl"], tmp_path / "out", progress=False, num_workers=2)
        assert not (tmp_path / "out").exists()
    (tmp_path / "a.jsonl").write_text("\n".join(good + ["", "   "]) + "\n", encoding="utf-8")
    meta = prepare([tmp_path / "a.jsonl"], tmp_path / "out", progress=False, num_workers=2, shard_tokens=5000)
    assert meta["shards"]["documents"] == 400


def test_text_without_white_space_is_cut_where_its_class_changes(tmp_path, monkeypatch, tiktoken_gpt2):
    # Japanese has no spaces: the cuts between letters, numbers and punctuation keep its chunks
    # about CHUNK_BYTES (never "'" then a letter, which may start a contraction: "'s")
    text = "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ、2024年12月7日's'5x!" * 300
    (tmp_path / "doc.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 1000)
    document = text_module.find_documents([tmp_path / "doc.txt"], tmp_path / "unused")[0]
    chunks = list(text_module.read_chunks(document))
    assert "".join(chunks) == text and len(chunks) > 20 and max(map(len, chunks)) < 1000  # 333 characters a block
    assert sum((tiktoken_gpt2.encode_ordinary(c) for c in chunks), []) == tiktoken_gpt2.encode_ordinary(text)

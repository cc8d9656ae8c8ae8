"""_files: atomic writes, with the permissions any new file gets, and reading text files."""

from __future__ import annotations

import os
import stat

import pytest

from gpt2 import GPT2, GPT2Config, Tokenizer
from gpt2._files import atomic_path, atomic_write_text, read_text
from gpt2.errors import DataError


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask022", "umask077", "umask002"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_get_the_mode_the_umask_gives_a_new_file(tmp_path, umask):
    expected = 0o666 & ~umask  # 0644 under umask 022, 0600 under 077
    with open(tmp_path / "plain", "w"):  # what open() gives, the reference
        pass
    atomic_write_text(tmp_path / "text", "hello")
    with atomic_path(tmp_path / "written") as tmp:
        tmp.write_bytes(b"data")
    assert mode(tmp_path / "plain") == mode(tmp_path / "text") == mode(tmp_path / "written") == expected


def test_saved_models_and_vocabularies_are_readable_as_the_umask_allows(tmp_path, umask):
    expected = 0o666 & ~umask
    GPT2(GPT2Config(n_vocab=300, n_ctx=16, n_embd=8, n_head=2, n_layer=1)).save_pretrained(tmp_path / "model")
    Tokenizer.train("a small corpus, a small vocabulary", vocab_size=260).save(tmp_path / "vocab")
    files = sorted(p.name for p in (tmp_path / "model").iterdir()) + sorted(p.name for p in (tmp_path / "vocab").iterdir())
    assert files == ["config.json", "model.safetensors", "encoder.json", "vocab.bpe"]
    for path in [*(tmp_path / "model").iterdir(), *(tmp_path / "vocab").iterdir()]:
        assert mode(path) == expected, path


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "file"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_read_text_names_a_missing_file_a_directory_and_a_bad_byte(tmp_path):
    (tmp_path / "ok.txt").write_text("café\n", encoding="utf-8")
    assert read_text(tmp_path / "ok.txt", DataError) == "café\n"
    (tmp_path / "bad.txt").write_bytes(b"ab\xffc")
    for path, message in ((tmp_path / "none.txt", "none.txt does not exist"), (tmp_path, "is not a file"),
                          (tmp_path / "bad.txt", "bad.txt is not UTF-8 text: byte 0xff at offset 2")):  # fmt: skip
        with pytest.raises(DataError, match=message):
            read_text(path, DataError)

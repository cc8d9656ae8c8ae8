"""_files: atomic writes, with the permissions any new file gets; paths that cannot be written; reading text files."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import pytest

from gpt2 import GPT2, GPT2Config, GPT2Error, Tokenizer, UnwritablePathError
from gpt2._files import BackgroundWriter, atomic_path, atomic_write_text, read_text, writable_directory
from gpt2.errors import DataError
from gpt2.tokenizer import CharTokenizer


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
    files = sorted(p.name for p in (tmp_path / "model").iterdir()) + sorted(
        p.name for p in (tmp_path / "vocab").iterdir()
    )
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
    for path, message in (
        (tmp_path / "none.txt", "none.txt does not exist"),
        (tmp_path, "is not a file"),
        (tmp_path / "bad.txt", "bad.txt is not UTF-8 text: byte 0xff at offset 2"),
    ):
        with pytest.raises(DataError, match=message):
            read_text(path, DataError)


# ------------------------------------------------------------------ paths that cannot be written

PROC = os.path.isdir("/proc/self")  # Linux: /proc takes no new files, whoever asks


def writes_anyway(directory) -> bool:
    """Whether this process writes into a directory of mode 0555 all the same (root does)."""
    try:
        os.close(os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except PermissionError:
        return False
    os.unlink(directory / "probe")
    return True


def unwritable_paths(tmp_path) -> list[tuple[str, str]]:
    """(a directory to write into, the reason its error must give), as many as this machine and user allow:
    a read-only directory only where this process is refused it (not root)."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "read-only").mkdir(mode=0o555)
    cases = [
        (tmp_path / "a-file", f"{tmp_path / 'a-file'} is a file, not a directory"),
        (tmp_path / "a-file" / "sub" / "dir", f"{tmp_path / 'a-file'} is a file, not a directory"),
    ]
    if PROC:
        cases.append((Path("/proc/gpt2-out"), "/proc takes no new files or directories (no such file or directory)"))
    if not writes_anyway(tmp_path / "read-only"):
        cases.append((tmp_path / "read-only", "permission denied"))
        cases.append((tmp_path / "read-only" / "out", f"permission denied in {tmp_path / 'read-only'}"))
    return cases


def test_a_directory_to_write_into_is_made_and_proved_writable(tmp_path):
    assert writable_directory(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the file that proved it is gone
    assert writable_directory(str(tmp_path / "a")) == tmp_path / "a"  # an existing one is fine too


def test_an_unwritable_directory_is_named_with_the_reason(tmp_path):
    # As root the read-only directory cannot be tested (root writes into it): the other cases run.
    # Without CAP_DAC_OVERRIDE root is refused too: setpriv --inh-caps=-dac_override --bounding-set=-dac_override ...
    for path, reason in unwritable_paths(tmp_path):
        with pytest.raises(UnwritablePathError) as caught:
            writable_directory(path)
        assert str(caught.value) == f"cannot write into {path}: {reason}"
        assert isinstance(caught.value, GPT2Error) and isinstance(caught.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "read-only"]
    assert list((tmp_path / "read-only").iterdir()) == []


def test_an_atomic_write_that_cannot_be_made_names_the_final_path(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    cases = [
        (tmp_path / "missing" / "f.json", f"the directory {tmp_path / 'missing'} does not exist"),
        (tmp_path / "a-file" / "f.json", f"{tmp_path / 'a-file'} is a file, not a directory"),
        (tmp_path / "a-dir", f"{tmp_path / 'a-dir'} is a directory"),
    ]
    if PROC:
        cases.append((Path("/proc/f.json"), "/proc takes no new files or directories (no such file or directory)"))
    for path, reason in cases:
        with pytest.raises(UnwritablePathError, match=f"^{re.escape(f'cannot write {path}: {reason}')}$"):
            atomic_write_text(path, "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file"]  # no temporary file left
    assert list((tmp_path / "a-dir").iterdir()) == []


def test_models_and_vocabularies_are_not_saved_into_an_unwritable_directory(tmp_path):
    writers = {
        "save_pretrained": GPT2(GPT2Config(n_vocab=300, n_ctx=16, n_embd=8, n_head=2, n_layer=1)).save_pretrained,
        "Tokenizer.save": Tokenizer.train("a small corpus, a small vocabulary", vocab_size=260).save,
        "CharTokenizer.save": CharTokenizer(["a", "b"]).save,
    }
    for path, reason in unwritable_paths(tmp_path):
        for save in writers.values():
            with pytest.raises(UnwritablePathError, match=f"^cannot write into {re.escape(f'{path}: {reason}')}$"):
                save(path)


def test_the_background_writer_writes_one_batch_at_a_time_and_raises_its_errors_in_the_caller(tmp_path):
    writer, go, order = BackgroundWriter(), threading.Event(), []

    def slow():
        assert go.wait(timeout=120)  # a bound for a hang: the caller sets it once it has gone on
        atomic_write_text(tmp_path / "a.txt", "first")
        order.append(("first", threading.current_thread() is threading.main_thread()))

    writer.write(slow)
    assert not (tmp_path / "a.txt").exists()  # the caller went on while the write waits
    go.set()
    writer.write(lambda: order.append(("second", (tmp_path / "a.txt").read_text())))  # after the first, whole
    writer.wait()
    assert order == [("first", False), ("second", "first")]

    def fails():
        raise UnwritablePathError(f"cannot write {tmp_path / 'b'}: no space left on device")

    writer.write(fails)
    with pytest.raises(UnwritablePathError, match="no space left on device"):
        writer.wait()
    writer.wait()  # raised once
    writer.write(fails)
    with pytest.raises(UnwritablePathError):  # by the next write, before it starts
        writer.write(lambda: order.append("never"))
    writer.write(fails)
    writer.finish()  # waits, and drops the error: the caller has one of its own
    writer.wait()
    assert order == [("first", False), ("second", "first")]

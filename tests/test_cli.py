"""The `gpt2` command line, run in-process and once as a real subprocess."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from gpt2.cli import main

HELLO = "Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗"
HELLO_IDS = "15496 3228 314 1101 10948 73 509 5117 10036 13 632 338 33160 13 266 405 83 1058 35 12520 97 245"


def run(capsys, *argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tokenize_prints_ids(capsys):
    assert run(capsys, "tokenize", HELLO) == (0, HELLO_IDS + "\n", "")


def test_tokenize_joins_words_with_spaces(capsys):
    assert run(capsys, "tokenize", "Hello", "world") == (0, "15496 995\n", "")


def test_decode_prints_text(capsys):
    assert run(capsys, "tokenize", "--decode", "15496", "11", "995") == (0, "Hello, world\n", "")


def test_count(capsys):
    assert run(capsys, "tokenize", "--count", HELLO) == (0, "22\n", "")


def test_stdin_keeps_newlines_and_crlf(capsys, monkeypatch):
    code, out, _ = run(capsys, "tokenize", "-", stdin="a\r\nb\n".encode(), monkeypatch=monkeypatch)
    assert code == 0
    from gpt2 import Tokenizer

    assert out.split() == [str(i) for i in Tokenizer.gpt2().encode("a\r\nb\n")]


def test_decode_from_stdin(capsys, monkeypatch):
    assert run(capsys, "tokenize", "--decode", "-", stdin=b"15496 11\n995\n", monkeypatch=monkeypatch) == (0, "Hello, world\n", "")


def test_special_token_only_when_allowed(capsys):
    assert "50256" not in run(capsys, "tokenize", "a<|endoftext|>")[1].split()
    assert run(capsys, "tokenize", "--allow-special", "a<|endoftext|>")[1] == "64 50256\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tokenize", "--decode", "15496", "oops"], "--decode takes integer token ids, got 'oops'"),
        (["tokenize", "--decode", "-5"], "token id -5 at position 0 is out of range"),
        (["tokenize", "--decode", "50257"], "token id 50257 at position 0 is out of range: ids are 0..50256"),
        (["tokenize"], "nothing to tokenize"),
        (["tokenize", "--frobnicate", "x"], "unrecognized arguments: --frobnicate"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("gpt2: error: ")
    assert message in err
    assert "Traceback" not in err


def test_stdin_that_is_not_utf8(capsys, monkeypatch):
    code, _, err = run(capsys, "tokenize", "-", stdin=b"\xff\xfe bad", monkeypatch=monkeypatch)
    assert code == 2 and "standard input is not UTF-8" in err


def test_console_script_runs_as_a_process():
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "tokenize", "--count", "-"],
        input="Hello world".encode(),
        capture_output=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"2\n", b"")
    result = subprocess.run([sys.executable, "-m", "gpt2", "tokenize", "--decode", "x"], capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "gpt2: error: --decode takes integer token ids, got 'x'"


def test_importing_gpt2_and_tokenizing_does_not_import_torch():
    code = "import sys, gpt2.cli; gpt2.cli.main(['tokenize', '--count', 'hi']); assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()

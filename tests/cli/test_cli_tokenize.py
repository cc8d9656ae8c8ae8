"""`gpt2 tokenize` (gpt2.cli.tokenize): ids, text and counts, from the command line and standard input, as tiktoken
gives them."""

from __future__ import annotations

from cli_helpers import run

HELLO = "Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗"
HELLO_IDS = "15496 3228 314 1101 10948 73 509 5117 10036 13 632 338 33160 13 266 405 83 1058 35 12520 97 245"


def test_tokenize_prints_ids(capsys):
    assert run(capsys, "tokenize", HELLO) == (0, HELLO_IDS + "\n", "")


def test_tokenize_joins_words_with_spaces(capsys):
    assert run(capsys, "tokenize", "Hello", "world") == (0, "15496 995\n", "")


def test_decode_prints_text(capsys):
    assert run(capsys, "tokenize", "--decode", "15496", "11", "995") == (0, "Hello, world\n", "")


def test_count(capsys):
    assert run(capsys, "tokenize", "--count", HELLO) == (0, "22\n", "")


def test_stdin_keeps_newlines_and_crlf(capsys, monkeypatch):
    code, out, _ = run(capsys, "tokenize", "-", stdin=b"a\r\nb\n", monkeypatch=monkeypatch)
    assert code == 0
    from gpt2 import Tokenizer

    assert out.split() == [str(i) for i in Tokenizer.gpt2().encode("a\r\nb\n")]


def test_decode_from_stdin(capsys, monkeypatch):
    assert run(capsys, "tokenize", "--decode", "-", stdin=b"15496 11\n995\n", monkeypatch=monkeypatch) == (
        0,
        "Hello, world\n",
        "",
    )


def test_special_token_only_when_allowed(capsys, tiktoken_gpt2):
    """tokenize.md's rule, kept while Tokenizer.encode raises on such text: characters unless --allow-special."""
    text = "a<|endoftext|>b"
    assert run(capsys, "tokenize", text)[1].split() == [
        str(i) for i in tiktoken_gpt2.encode(text, disallowed_special=())
    ]
    assert run(capsys, "tokenize", "--allow-special", text)[1].split() == [
        str(i) for i in tiktoken_gpt2.encode(text, allowed_special="all")
    ]

"""What the commands share (gpt2.cli.common): text from standard input or the command line that is not UTF-8 is one line
of error."""

from __future__ import annotations

import subprocess
import sys

from cli_helpers import run


def test_stdin_that_is_not_utf8(capsys, monkeypatch):
    code, _, err = run(capsys, "tokenize", "-", stdin=b"\xff\xfe bad", monkeypatch=monkeypatch)
    assert code == 2 and "standard input is not UTF-8" in err


def test_a_prompt_that_is_not_utf8_on_the_command_line():
    """Python hands such argv bytes over as lone surrogates: an error, as on standard input."""
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "generate", b"caf\xe9 au lait", "--model", "nowhere"],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == b""
    assert (
        result.stderr.decode()
        == "gpt2: error: the prompt given on the command line is not UTF-8 text: byte 0xe9 at character 3\n"
    )

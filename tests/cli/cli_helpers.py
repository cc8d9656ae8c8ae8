"""The `gpt2` command run in-process, as the tests of the command line (tests/cli/) run it."""

from __future__ import annotations

import io
import sys

from gpt2.cli import main


def run(capsys, *argv: str, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """`gpt2 ARGV...` run by `gpt2.cli.main` in this process: its exit status, stdout and stderr (stdin's bytes, if
    given, read through `monkeypatch`)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err

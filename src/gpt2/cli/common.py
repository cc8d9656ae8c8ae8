"""What every command shares: the usage error, the parser and its help's layout, text read from the command line and
standard input, and token ids written as text.
"""

from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see '{self.prog} --help')")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of descriptions and examples."""


def read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"standard input is not UTF-8 text: {e}") from None


def command_line_text(text: str, what: str) -> str:
    """Text from the command line, which Python hands over with any bytes that are not UTF-8
    smuggled in as lone surrogates; those are an error here, as they are on standard input."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise UsageError(f"{what} is not UTF-8 text: byte 0x{bad.hex()} at character {e.start}") from None
    return text


def without_final_newline(text: str) -> str:
    """`echo "text" | gpt2 generate -` continues "text", not the line after it."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


def token_ids(text: str, what: str) -> list[int]:
    """Token ids written as `gpt2 tokenize` prints them, whole numbers separated by spaces or commas ("464 3290",
    "464,3290"): the input of --ids, for a model that comes with no tokenizer (or a text already tokenized).
    Their range is the model's to check, once it has loaded."""
    words = text.replace(",", " ").split()
    if not words:
        raise UsageError(f"{what} holds no token ids: give whole numbers separated by spaces or commas (e.g. 464,3290)")
    ids = []
    for word in words:
        try:
            ids.append(int(word))
        except ValueError:
            raise UsageError(
                f"{what} must be token ids, whole numbers separated by spaces or commas (e.g. 464,3290), got {word!r}"
            ) from None
    return ids

"""`gpt2 tokenize`: text to GPT-2's token ids, and back with --decode."""

from __future__ import annotations

import argparse
import sys

from gpt2.cli.common import HelpFormatter, UsageError, command_line_text, read_stdin


def cmd(args: argparse.Namespace) -> int:
    from gpt2.tokenizer import Tokenizer

    words = [command_line_text(word, "the text given on the command line") for word in args.input]
    if words == ["-"]:
        words = read_stdin().split() if args.decode else [read_stdin()]
    elif not words:
        raise UsageError("nothing to tokenize: give a text, or - to read standard input")
    tokenizer = Tokenizer.gpt2()
    if args.decode:
        ids = []
        for word in words:
            try:
                ids.append(int(word))
            except ValueError:
                raise UsageError(f"--decode takes integer token ids, got {word!r}") from None
        if args.count:
            print(len(ids))
        else:
            sys.stdout.write(tokenizer.decode(ids) + "\n")
        return 0
    text = " ".join(words)  # its <|endoftext|> is the special token with --allow-special, else characters (tokenize.md)
    ids = tokenizer.encode(text, allowed_special="all") if args.allow_special else tokenizer.encode_ordinary(text)
    print(len(ids) if args.count else " ".join(map(str, ids)))
    return 0


EXAMPLES = """\
examples:
  gpt2 tokenize "Hello world"
  gpt2 tokenize --decode 15496 995
  cat notes.txt | gpt2 tokenize --count -
"""


def add_parser(commands) -> None:
    tokenize = commands.add_parser(
        "tokenize",
        help="text to GPT-2 token ids, or ids to text",
        description="Print the GPT-2 token ids of a text (or, with --decode, the text of ids).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    tokenize.add_argument(
        "input", nargs="*", help="the text (words are joined by spaces), token ids with --decode, or - for stdin"
    )
    tokenize.add_argument("--decode", action="store_true", help="the input is token ids: print their text")
    tokenize.add_argument("--count", action="store_true", help="print only the number of tokens")
    tokenize.add_argument(
        "--allow-special", action="store_true", help="encode the text <|endoftext|> as the special token 50256"
    )
    tokenize.set_defaults(func=cmd)

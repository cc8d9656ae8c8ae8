"""The `gpt2` command: a thin layer over the Python API.

Every expected failure (bad flag, bad value, missing file) prints one line on stderr,
`gpt2: error: ...`, and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpt2.errors import GPT2Error

EXIT_USAGE = 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _UsageError(f"standard input is not UTF-8 text: {e}") from None


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from gpt2.tokenizer import Tokenizer

    words = list(args.input)
    if words == ["-"]:
        words = _read_stdin().split() if args.decode else [_read_stdin()]
    elif not words:
        raise _UsageError("nothing to tokenize: give a text, or - to read standard input")
    tokenizer = Tokenizer.gpt2()
    if args.decode:
        ids = []
        for word in words:
            try:
                ids.append(int(word))
            except ValueError:
                raise _UsageError(f"--decode takes integer token ids, got {word!r}") from None
        if args.count:
            print(len(ids))
        else:
            sys.stdout.write(tokenizer.decode(ids) + "\n")
        return 0
    ids = tokenizer.encode(" ".join(words), allowed_special="all" if args.allow_special else frozenset())
    print(len(ids) if args.count else " ".join(map(str, ids)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpt2", description="GPT-2 from scratch.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    tokenize = commands.add_parser(
        "tokenize",
        help="text to GPT-2 token ids, or ids to text",
        description="Print the GPT-2 token ids of a text (or, with --decode, the text of ids).",
        epilog='examples: gpt2 tokenize "Hello world"  |  gpt2 tokenize --decode 15496 995  |  cat f.txt | gpt2 tokenize --count -',
    )
    tokenize.add_argument("input", nargs="*", help="the text (words are joined by spaces), token ids with --decode, or - for stdin")
    tokenize.add_argument("--decode", action="store_true", help="the input is token ids: print their text")
    tokenize.add_argument("--count", action="store_true", help="print only the number of tokens")
    tokenize.add_argument("--allow-special", action="store_true", help="encode the text <|endoftext|> as the special token 50256")
    tokenize.set_defaults(func=_cmd_tokenize)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except (_UsageError, GPT2Error) as e:
        print(f"gpt2: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `gpt2 tokenize - | head`
        sys.stderr.close()
        return 0

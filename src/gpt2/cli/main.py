"""The `gpt2` command, assembled from a module per command (each its parser and its body).

Every expected failure (bad flag, bad value, missing file) prints one line on stderr,
`gpt2: error: ...`, and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from collections.abc import Sequence

from gpt2 import __version__
from gpt2.cli import chat, export, generate, inspect, prepare, serve, tokenize, train, train_sae
from gpt2.cli import eval as eval_
from gpt2.cli.common import HelpFormatter, Parser, UsageError
from gpt2.cli.flags import parser_flags, with_flags
from gpt2.errors import DistributedError, GPT2Error

EXIT_USAGE = 2
COMMANDS = (tokenize, generate, prepare, train, eval_, serve, chat, inspect, train_sae, export)  # in --help's order


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpt2", description="GPT-2 from scratch.", formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpt2 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    for command in COMMANDS:
        command.add_parser(commands)
    for parser_of_one in commands.choices.values():
        parser_of_one.set_defaults(flags=parser_flags(parser_of_one))  # what each parameter of a message is called here
    _add_references(parser, commands)
    return parser


# Each command's reference, a page in docs/ of gpt2's repository, named at the end of its --help.
REFERENCES = {
    name: f"docs/{name}.md"
    for name in ("tokenize", "generate", "prepare", "train", "eval", "serve", "chat", "inspect", "export")
} | {"train-sae": "docs/inspect.md"}


def _add_references(parser: argparse.ArgumentParser, commands) -> None:
    parser.epilog = "reference: README.md, and a page in docs/ for each command (gpt2's repository)"
    for name, command in commands.choices.items():
        command.epilog = f"{command.epilog or ''}\nreference: {REFERENCES[name]} (in gpt2's repository)\n"


class _WarningLines:
    """Shows each warning raised while a command runs as one line on stderr, `gpt2: warning: ...`,
    once: without Python's source path and line, which mean nothing to a user of the command.
    Under torchrun every process meets the same ones: rank 0 says them."""

    def __init__(self) -> None:
        self.shown: set[str] = set()
        self.flags: dict[str, str] = {}  # the command's, once it is known

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(with_flags(message, self.flags).split())
        if text not in self.shown and os.environ.get("RANK", "0") == "0":
            self.shown.add(text)
            print(f"gpt2: warning: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    with warnings.catch_warnings():
        warnings.showwarning = lines = _WarningLines()
        return _main(parser, argv, lines)


RANK_0_GRACE = 10.0  # seconds a rank that leaves an error to rank 0 waits for torchrun to end it


def _leave_it_to_rank_0() -> None:
    """Under torchrun, a rank that leaves the error to rank 0 exits only once rank 0 has said it:
    torchrun ends every process when one exits, and rank 0 might not have printed yet. It waits
    for the SIGTERM that torchrun sends when rank 0 exits, RANK_0_GRACE seconds at most."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # launched another way: nobody ends the others
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a run's handler would only note it
    time.sleep(RANK_0_GRACE)


def _main(parser: argparse.ArgumentParser, argv: Sequence[str] | None, lines: _WarningLines) -> int:
    try:
        args, unknown = parser.parse_known_args(argv)
        lines.flags = args.flags
        if unknown:  # argparse would point to `gpt2 --help`; the flags are the sub-command's
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see 'gpt2 {args.command} --help')")
        if getattr(args, "threads", None) is not None:
            from gpt2.devices import set_threads

            set_threads(args.threads)
        return args.func(args)
    except (UsageError, GPT2Error) as e:
        # under torchrun every process meets the same bad input: rank 0 says it; each says what it alone saw
        if os.environ.get("RANK", "0") == "0" or isinstance(e, DistributedError):
            print(f"gpt2: error: {with_flags(e, lines.flags)}", file=sys.stderr)
        else:
            _leave_it_to_rank_0()
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what was printed stays printed
        sys.stdout.flush()
        print("gpt2: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `gpt2 tokenize - | head`
        sys.stderr.close()
        return 0

"""A library's message said as the command line says it: each parameter it names written as its flag."""

from __future__ import annotations

import argparse
import re

from gpt2.errors import RecipeError


def parser_flags(command: argparse.ArgumentParser) -> dict[str, str]:
    """The flag that sets each of the library's parameters in one of gpt2's commands (its parser): "max_iters" ->
    "--max-iters" (an option's dest is the parameter's name; a `--no-x` switch sets none). Another
    command's flags are none of its business: a model's config.json is no --n-head of generate."""
    return {
        action.dest: action.option_strings[0]
        for action in command._actions
        if action.option_strings and not action.option_strings[0].startswith("--no-") and action.dest != "help"
    }


def with_flags(said: Exception | Warning, flags: dict[str, str]) -> str:
    """An error's or warning's message as the command line says it: each parameter it concerns (its
    `param`, then its `also`) named by its flag. A name written as code (`max_iters`, `resume=True`,
    `optimizer='muon'`, `lr=0.1`: "--lr 0.1"), or a plain word where a name stands (opening the message, or
    after a flag and "and", "or" or a comma) becomes the flag: "--max-iters must be ...", "pass --resume",
    "--resume and --overwrite contradict"; a plain word within a sentence keeps its sense, the flag after it
    ("no data (--data)");
    a message that names neither ends with the flag. A recipe's errors keep the names, its keys."""
    message = str(said)
    names = [n for n in dict.fromkeys((getattr(said, "param", None), *getattr(said, "also", ()))) if n in flags]
    word = {n: rf"(?<![\w/.-]){re.escape(n)}(?![\w/-])" for n in names}  # the name as a word, not a piece of a path
    if not isinstance(said, RecipeError):
        mentioned = {n: m.start() if (m := re.search(word[n], message)) else len(message) for n in names}
        for n in sorted(names, key=mentioned.get):  # in the order the message names them: "--context and --stride"
            message = re.sub(
                rf"{word[n]}=(?:True\b|'([^']*)'|([-+.\w]+))",
                lambda m, n=n: " ".join(filter(None, (flags[n], m[1], m[2]))),
                message,
            )
            if "_" in n:  # never an English word: every mention
                message = re.sub(word[n], flags[n], message)
            else:
                message = re.sub(
                    rf"(^|--[a-z0-9-]+(?:,| and| or) ){word[n]}", lambda m, n=n: m.group(1) + flags[n], message, count=1
                )
    for n in names:
        if flags[n] not in message:
            named = re.search(word[n], message)
            message = (
                f"{message[: named.end()]} ({flags[n]}){message[named.end() :]}" if named else f"{message} ({flags[n]})"
            )
    return message

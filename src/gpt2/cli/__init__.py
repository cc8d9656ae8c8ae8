"""The `gpt2` command: a thin layer over the Python API, a room per command as vLLM's entrypoints/cli/.

    common    the usage error, the parser and its help's layout, text (and token ids, --ids) from the command line
              and stdin
    options   the flags several commands share (device, threads, sampling, draft model, chat template), and
              the model they load
    flags     a library's message said with the command's flags ("max_iters" -> "--max-iters")
    tokenize, generate, prepare, train, eval, serve, chat, inspect, train_sae (gpt2 train-sae), export
              a command each: its parser (`add_parser`), its examples and its body (`cmd`)
    main      the parser of them all (`build_parser`) and `main`, which runs one: an expected failure is one
              line on stderr, `gpt2: error: ...`, and exit status 2

Imports run one way inside: `options` builds on `common`; each command on both (and `chat` on `flags`);
`main` on all of them. A command imports what it runs (torch, the model) inside its body, so that
`gpt2 --help` and `gpt2 tokenize` start without them.
"""

from gpt2.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

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


def _cmd_generate(args: argparse.Namespace) -> int:
    import time
    import warnings

    from gpt2.generate import TextGeneration
    from gpt2.tokenizer import Tokenizer

    if args.prompt is None:
        raise _UsageError('no prompt: give one (e.g. gpt2 generate "Once upon a time"), or - to read standard input')
    prompt = _read_stdin() if args.prompt == "-" else args.prompt
    tokenizer = Tokenizer.gpt2()
    if args.engine == "numpy":
        from gpt2.reference import ReferenceModel

        model = ReferenceModel.load(args.model)
    else:
        from gpt2.model import GPT2

        model = GPT2.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   stop=args.stop or (), on_overflow=args.on_overflow)  # fmt: skip
    out = sys.stdout
    started = time.perf_counter()
    generated = 0
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_: print(f"gpt2: note: {message}", file=sys.stderr)
        for sample in range(args.num_samples):
            seed = None if args.seed is None else args.seed + sample
            generation = TextGeneration(model, tokenizer, prompt, seed=seed, **options)
            if args.num_samples > 1:
                out.write(f"{'=' * 20} sample {sample + 1} of {args.num_samples} {'=' * 20}\n")
            try:
                if args.stream:
                    out.write(prompt)
                    out.flush()
                    for _, piece in generation:
                        out.write(piece)
                        out.flush()
                else:
                    out.write("".join(piece for _, piece in generation))
                out.write("\n")
            finally:
                generated += generation.tokens_generated
                elapsed = time.perf_counter() - started
                print(f"[gpt2: {generated} tokens in {elapsed:.1f} s, {generated / max(elapsed, 1e-9):.1f} tokens/s]",
                      file=sys.stderr)  # fmt: skip
    return 0


def _whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


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

    generate = commands.add_parser(
        "generate",
        help="continue a prompt with GPT-2, streaming the text",
        description="Continue a prompt with GPT-2. The text streams as it is generated; a summary goes to stderr.",
        epilog='example: gpt2 generate "Alan Turing theorized that" --max-new-tokens 40 --temperature 0',
    )
    generate.add_argument("prompt", nargs="?", help="the prompt, or - to read it from standard input")
    generate.add_argument("--model", default="gpt2", help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (downloaded once), "
                          "or a local directory (Hugging Face's or OpenAI's release) (default: gpt2)")  # fmt: skip
    generate.add_argument("--max-new-tokens", type=_whole_number, default=50, help="tokens to generate (default: 50)")
    generate.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random (default: 0.8)")
    generate.add_argument("--top-k", type=_whole_number, default=200, help="sample among the k most likely tokens (default: 200)")
    generate.add_argument("--top-p", type=float, default=None, help="sample among the most likely tokens that make up p of the probability")
    generate.add_argument("--seed", type=_whole_number, default=None, help="make sampling reproducible")
    generate.add_argument("--num-samples", type=_whole_number, default=1, help="continuations to generate (default: 1)")
    generate.add_argument("--stop", action="append", metavar="TEXT", help="end a continuation before this text (repeatable)")
    generate.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    generate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="(default: float32)")
    generate.add_argument("--engine", default="torch", choices=["torch", "numpy"],
                          help="torch (with a KV cache) or numpy (the reference engine: no cache, slow, for checking)")  # fmt: skip
    generate.add_argument("--on-overflow", default="slide", choices=["slide", "error"],
                          help="past the model's context: keep the last n_ctx tokens, or stop with an error (default: slide)")  # fmt: skip
    generate.add_argument("--no-stream", dest="stream", action="store_false",
                          help="print the continuation, without the prompt, once it is done")  # fmt: skip
    generate.set_defaults(func=_cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except (_UsageError, GPT2Error) as e:
        print(f"gpt2: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what was printed stays printed
        sys.stdout.flush()
        print("\ngpt2: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `gpt2 tokenize - | head`
        sys.stderr.close()
        return 0

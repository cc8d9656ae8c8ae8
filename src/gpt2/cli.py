"""The `gpt2` command: a thin layer over the Python API.

Every expected failure (bad flag, bad value, missing file) prints one line on stderr,
`gpt2: error: ...`, and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from gpt2 import __version__
from gpt2.errors import GPT2Error

EXIT_USAGE = 2
DEFAULT_TOP_K = 200  # clamped to the model's vocabulary: a character model has fewer tokens


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of argparse's usage block
        raise _UsageError(f"{message} (see '{self.prog} --help')")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of descriptions and examples."""


def _read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _UsageError(f"standard input is not UTF-8 text: {e}") from None


def _command_line_text(text: str, what: str) -> str:
    """Text from the command line, which Python hands over with any bytes that are not UTF-8
    smuggled in as lone surrogates; those are an error here, as they are on standard input."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise _UsageError(f"{what} is not UTF-8 text: byte 0x{bad.hex()} at character {e.start}") from None
    return text


def _without_final_newline(text: str) -> str:
    """`echo "text" | gpt2 generate -` continues "text", not the line after it."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from gpt2.tokenizer import Tokenizer

    words = [_command_line_text(word, "the text given on the command line") for word in args.input]
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


def _check_generate_args(args: argparse.Namespace) -> str:
    """What can be checked before a model is loaded; returns the prompt."""
    from gpt2._checks import positive_int
    from gpt2.generate import check_seed

    if args.prompt is None:
        raise _UsageError('no prompt: give one (e.g. gpt2 generate "Once upon a time"), or - to read standard input')
    positive_int("num_samples", args.num_samples)
    if args.seed is not None:
        check_seed(args.seed)
    if args.engine == "numpy" and args.device not in ("auto", "cpu"):
        raise _UsageError(f"--engine numpy runs on the CPU only, not on --device {args.device}: use --engine torch")
    if args.engine == "numpy" and args.dtype != "float32":
        raise _UsageError(f"--engine numpy computes in float32 only, not --dtype {args.dtype}: use --engine torch")
    if args.prompt == "-":
        return _without_final_newline(_read_stdin())
    return _command_line_text(args.prompt, "the prompt given on the command line")


def _load_model(args: argparse.Namespace):
    if args.engine == "numpy":
        from gpt2.reference import ReferenceModel

        return ReferenceModel.load(args.model)
    from gpt2.model import GPT2

    return GPT2.from_pretrained(args.model, device=args.device, dtype=args.dtype)


def _cmd_generate(args: argparse.Namespace) -> int:
    import warnings

    from gpt2.generate import TextGeneration
    from gpt2.tokenizer import Tokenizer

    prompt = _check_generate_args(args)
    tokenizer = Tokenizer.gpt2()
    model = _load_model(args)
    top_k = min(DEFAULT_TOP_K, model.config.n_vocab) if args.top_k is None else args.top_k
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=top_k, top_p=args.top_p,
                   stop=args.stop, on_overflow=args.on_overflow)  # fmt: skip
    out = sys.stdout
    started = time.perf_counter()
    generated = 0
    held: list[str] = []  # the text of the sample under way: printed at its end with --no-stream
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, *_: print(f"gpt2: note: {message}", file=sys.stderr)
            for sample in range(args.num_samples):
                seed = None if args.seed is None else (args.seed + sample) % 2**64
                generation = TextGeneration(model, tokenizer, prompt, seed=seed, **options)
                if args.num_samples > 1:
                    header = f"{'=' * 20} sample {sample + 1} of {args.num_samples} {'=' * 20}\n"
                    _emit(out, held, header, args.stream)
                if args.stream:
                    _emit(out, held, prompt, True)
                try:
                    for _, piece in generation:
                        _emit(out, held, piece, args.stream)
                finally:
                    generated += generation.tokens_generated
                _emit(out, held, "\n", args.stream)
                _release(out, held, args.stream)
    except BaseException as e:
        _release(out, held, args.stream)  # Ctrl-C keeps what was generated, streamed or not
        if isinstance(e, KeyboardInterrupt):
            _summary(generated, started)
        raise
    _summary(generated, started)
    return 0


def _emit(out, held: list[str], piece: str, stream: bool) -> None:
    if stream:
        out.write(piece)
        out.flush()
    held.append(piece)


def _release(out, held: list[str], stream: bool) -> None:
    """Print what --no-stream held back, and end the line, so that what follows starts a line of its own."""
    text = "".join(held)
    if not stream:
        out.write(text)
    if text and not text.endswith("\n"):
        out.write("\n")
    out.flush()
    held.clear()


def _summary(generated: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    tokens = "1 token" if generated == 1 else f"{generated} tokens"
    print(f"[gpt2: {tokens} in {elapsed:.1f} s, {generated / max(elapsed, 1e-9):.1f} tokens/s]", file=sys.stderr)


def _whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


TOKENIZE_EXAMPLES = """\
examples:
  gpt2 tokenize "Hello world"
  gpt2 tokenize --decode 15496 995
  cat notes.txt | gpt2 tokenize --count -
"""

GENERATE_EXAMPLES = """\
examples:
  gpt2 generate "Alan Turing theorized that" --max-new-tokens 40 --temperature 0
  gpt2 generate "Once upon a time" --seed 42 --top-p 0.9 --stop $'\\n\\n'
  echo "The meaning of life is" | gpt2 generate - --num-samples 3 --no-stream
  gpt2 generate "Hello" --model path/to/weights --device cuda --dtype bfloat16

A prompt read from standard input loses one final newline, so that the model continues
its last line.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpt2", description="GPT-2 from scratch.", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpt2 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    tokenize = commands.add_parser(
        "tokenize",
        help="text to GPT-2 token ids, or ids to text",
        description="Print the GPT-2 token ids of a text (or, with --decode, the text of ids).",
        epilog=TOKENIZE_EXAMPLES,
        formatter_class=_HelpFormatter,
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
        epilog=GENERATE_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    generate.add_argument("prompt", nargs="?", help="the prompt, or - to read it from standard input")
    generate.add_argument("--model", default="gpt2", help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (downloaded once), "
                          "or a local directory (Hugging Face's or OpenAI's release) (default: gpt2)")  # fmt: skip
    generate.add_argument("--max-new-tokens", type=_whole_number, default=50, help="tokens to generate (default: 50)")
    generate.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random (default: 0.8)")
    generate.add_argument("--top-k", type=_whole_number, default=None,
                          help=f"sample among the k most likely tokens (default: {DEFAULT_TOP_K}, or the vocabulary size if smaller)")  # fmt: skip
    generate.add_argument("--top-p", type=float, default=None,
                          help="sample among the most likely tokens that make up p of the probability (default: off)")  # fmt: skip
    generate.add_argument("--seed", type=_whole_number, default=None,
                          help="0 to 2**64-1: the same seed gives the same text; sample i uses seed + i (default: random)")  # fmt: skip
    generate.add_argument("--num-samples", type=_whole_number, default=1, help="continuations to generate (default: 1)")
    generate.add_argument("--stop", action="append", metavar="TEXT", help="end a continuation before this text (repeatable)")
    generate.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    generate.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="(default: float32)")
    generate.add_argument("--engine", default="torch", choices=["torch", "numpy"],
                          help="torch (with a KV cache) or numpy (the reference engine: no cache, slow, for checking) (default: torch)")  # fmt: skip
    generate.add_argument("--on-overflow", default="slide", choices=["slide", "error"],
                          help="past the model's context: keep the last n_ctx tokens, or stop with an error (default: slide)")  # fmt: skip
    generate.add_argument("--no-stream", dest="stream", action="store_false",
                          help="print the continuation, without the prompt, once it is done")  # fmt: skip
    generate.set_defaults(func=_cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse would point to `gpt2 --help`; the flags are the sub-command's
            raise _UsageError(f"unrecognized arguments: {' '.join(unknown)} (see 'gpt2 {args.command} --help')")
        return args.func(args)
    except (_UsageError, GPT2Error) as e:
        print(f"gpt2: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: what was printed stays printed
        sys.stdout.flush()
        print("gpt2: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `gpt2 tokenize - | head`
        sys.stderr.close()
        return 0

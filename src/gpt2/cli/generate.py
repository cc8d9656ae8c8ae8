"""`gpt2 generate`: text continued by a model, streamed, with its sampling, structured outputs and speculative
decoding flags; or, with --ids, token ids continued by token ids (a model that comes with no tokenizer).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator

from gpt2.cli.common import (
    HelpFormatter,
    UsageError,
    command_line_text,
    read_stdin,
    token_ids,
    whole_number,
    without_final_newline,
)
from gpt2.cli.options import (
    add_cuda_graphs_flag,
    add_draft_flags,
    add_ids_flag,
    add_inference_device_flags,
    add_model_flag,
    add_no_progress_flag,
    add_sampling_flags,
    add_special_as_text_flag,
    allowed_special,
    check_cuda_graph_flags,
    check_device,
    draft_tokens_need_a_draft,
    draft_tokens_of,
    load_model,
    model_configs,
    read_sampling,
    with_top_k,
)
from gpt2.settings import MAX_NEW_TOKENS


def _check_generate_args(args: argparse.Namespace) -> str | list[int]:
    """What can be checked before a model is loaded (every flag but --top-k's bound, the
    vocabulary; the draft model's configuration, not its weights), `args.sampling` made of the
    sampling flags; returns the prompt (its ids, with --ids)."""
    from gpt2._checks import positive_int
    from gpt2.generation.decoding import check_max_new_tokens
    from gpt2.generation.generate import check_stop

    if args.prompt is None:
        raise UsageError(
            'no prompt: give token ids (e.g. gpt2 generate --ids "464 3290"), or - to read standard input'
            if args.ids
            else 'no prompt: give one (e.g. gpt2 generate "Once upon a time"), or - to read standard input'
        )
    if args.ids:
        _text_flags_refused(args)
    args.sampling = read_sampling(args)
    check_max_new_tokens(args.max_new_tokens)
    positive_int("num_samples", args.num_samples)
    check_stop(args.stop)
    check_device(args)
    check_cuda_graph_flags(args)
    _check_draft_tokens(args)
    if args.draft is not None:
        model_configs(args)
    args.structured = _structured(args)
    args.steer_specs = [_steer_spec(spec) for spec in args.steer or []]
    text = (
        read_stdin() if args.prompt == "-" else command_line_text(args.prompt, "the prompt given on the command line")
    )
    if args.ids:
        return token_ids(text, "the prompt (--ids)")
    return without_final_newline(text) if args.prompt == "-" else text


def _text_flags_refused(args: argparse.Namespace) -> None:
    """--ids: the flags that are text (a stop string, a constraint, <|endoftext|> in the prompt) refused."""
    text = [
        flag
        for flag, given in (
            ("--stop", args.stop),
            ("--json-schema", args.json_schema),
            ("--json-object", args.json_object),
            ("--regex", args.regex),
            ("--choice", args.choice),
            ("--grammar", args.grammar),
            ("--special-as-text", args.special_as_text),
        )
        if given
    ]
    if text:
        raise UsageError(f"{text[0]} is text, which --ids has none of: the prompt and the output are token ids")


def _structured(args: argparse.Namespace) -> dict:
    """The library's keywords of the constraint flags (--json-schema, --json-object, --regex,
    --choice, --grammar: one at most, its file read), the logit bias and penalties, and --speculative
    ngram's, checked before the model loads (a constraint compiles once the tokenizer is there)."""
    from gpt2.generation.lookup import lookup_of
    from gpt2.generation.processors import Constraint, Penalties, one_constraint

    files = {
        kind: None if path is None else Constraint.from_file(kind, path)
        for kind, path in (("json_schema", args.json_schema), ("grammar", args.grammar))
    }
    constraint = one_constraint(**files, json_object=args.json_object, regex=args.regex, choice=args.choice)
    bias = dict(_logit_bias(item) for item in args.logit_bias or [])
    Penalties.make(bias, args.frequency_penalty, args.presence_penalty, args.repetition_penalty)  # checked now
    lookup_of(args.speculative, args.prompt_lookup_max, args.prompt_lookup_min, args.draft)
    return {
        "constraint": constraint,
        "logit_bias": bias or None,
        "frequency_penalty": args.frequency_penalty,
        "presence_penalty": args.presence_penalty,
        "repetition_penalty": args.repetition_penalty,
        "speculative": args.speculative,
        "prompt_lookup_max": args.prompt_lookup_max,
        "prompt_lookup_min": args.prompt_lookup_min,
    }


def _logit_bias(item: str) -> tuple[int, float]:
    """One --logit-bias ID=BIAS."""
    token, _, bias = item.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise UsageError(
            f"--logit-bias takes ID=BIAS, a token id and a number from -100 to 100 (e.g. 50256=-100), got {item!r}"
        ) from None


def _check_draft_tokens(args: argparse.Namespace) -> None:
    if args.draft_tokens is not None:
        from gpt2.generation.decoding import check_draft_tokens

        draft_tokens_need_a_draft(args)
        check_draft_tokens(args.draft_tokens)


def _load_draft(args: argparse.Namespace, model, tokenizer):
    """The draft model of --draft-model (None without one), checked against the model."""
    if args.draft is None:
        return None
    from gpt2.generation.engines import check_draft

    draft, draft_tokenizer = load_model(args, args.draft, needs=_needs_text(args))
    check_draft(model, draft, tokenizer, draft_tokenizer)
    return draft


def _needs_text(args: argparse.Namespace) -> str | None:
    """What of the command needs the model's tokenizer: a prompt of text (None: with --ids, nothing)."""
    return None if args.ids else 'a text prompt needs one; give token ids with --ids (e.g. gpt2 generate --ids "0 1 2")'


def cmd(args: argparse.Namespace) -> int:
    prompt = _check_generate_args(args)
    model, tokenizer = load_model(args, needs=_needs_text(args))
    draft = _load_draft(args, model, tokenizer)
    started = time.perf_counter()
    generation = _generation(args, model, tokenizer, prompt, draft)
    bar = _generation_bar(args, len(generation.rows))
    shown = " ".join(map(str, prompt)) if args.ids else prompt
    samples = _Samples(sys.stdout, shown, generation, args.stream, bar)
    try:
        with bar:  # closed (its last line drawn) before what follows is printed
            for row, piece in generation:
                bar.update(generation.tokens_generated - bar.n)
                samples.add(row, piece)
    except BaseException as e:
        samples.close(interrupted=True)  # Ctrl-C keeps what was generated, streamed or not
        if isinstance(e, KeyboardInterrupt):
            _summary(generation.tokens_generated, started)
        raise
    samples.close()
    _summary(generation.tokens_generated, started)
    return 0


def _steer_spec(spec: str) -> tuple[str, int | None, int, float]:
    """--steer's SPEC read: (directory, layer or None for an SAE, feature, coefficient)."""
    parts = spec.rsplit(":", 3)
    if len(parts) == 4 and not parts[1].lstrip("-").isdigit():  # a directory with ':' in its name, an SAE's spec
        parts = [":".join(parts[:2]), *parts[2:]]
    shape = "SAE_DIR:FEATURE:COEFF or TRANSCODERS_DIR:LAYER:FEATURE:COEFF"
    try:
        if len(parts) == 3:
            return parts[0], None, int(parts[1]), float(parts[2])
        if len(parts) == 4:
            return parts[0], int(parts[1]), int(parts[2]), float(parts[3])
    except ValueError:
        pass
    raise UsageError(f"--steer {spec!r} is not {shape}: whole numbers for LAYER and FEATURE, a number for COEFF")


def _steering(args: argparse.Namespace, model) -> dict | None:
    """--steer's vectors, summed by block (gpt2.inspect.steering_vector of each SAE or transcoder set)."""
    if not args.steer_specs:
        return None
    from gpt2.inspect import load_sae, load_transcoders, steering_vector

    vectors: dict = {}
    for directory, layer, feature, coefficient in args.steer_specs:
        dictionary = load_sae(directory) if layer is None else load_transcoders(directory)
        dictionary.check_fits(model)
        for block, vector in steering_vector(dictionary, feature, coefficient, layer).items():
            vectors[block] = vectors[block] + vector if block in vectors else vector
    return vectors


def _generation(args: argparse.Namespace, model, tokenizer, prompt: str | list[int], draft):
    """The prompt's continuations, as (row, piece) pieces of text: the text API's, or with --ids each new id."""
    from gpt2.generation.generate import TextGeneration

    if args.ids:
        return _id_generation(args, model, tokenizer, prompt, draft)
    return TextGeneration(
        model,
        tokenizer,
        prompt,
        max_new_tokens=args.max_new_tokens,
        sampling=with_top_k(args.sampling, model),
        seed=args.seed,
        num_samples=args.num_samples,
        stop=args.stop,
        on_overflow=args.on_overflow,
        allowed_special=allowed_special(args),
        draft=draft,
        **draft_tokens_of(args),
        **args.structured,
        steer=_steering(args, model),
    )


def _id_generation(args: argparse.Namespace, model, tokenizer, prompt: list[int], draft) -> _IdPieces:
    """gpt2 generate --ids: the library's TokenGeneration of the prompt's ids (a row ends at the model's
    <|endoftext|>, where it has a tokenizer), each new id a piece of text."""
    from gpt2.generation.generate import TokenGeneration

    generation = TokenGeneration(
        model,
        [prompt],
        max_new_tokens=args.max_new_tokens,
        sampling=with_top_k(args.sampling, model),
        seed=args.seed,
        num_samples=args.num_samples,
        eos_token_id=None if tokenizer is None else tokenizer.eot_token,
        on_overflow=args.on_overflow,
        draft=draft,
        **draft_tokens_of(args),
        **{key: value for key, value in args.structured.items() if key != "constraint"},  # --ids refuses one
        steer=_steering(args, model),
    )
    return _IdPieces(generation, spaced=args.stream)


class _IdPieces:
    """A TokenGeneration's ids as (row, piece) pieces of text, as TextGeneration gives a text's: " 464" (a row's
    first without its space unless `spaced`, after the prompt's ids)."""

    def __init__(self, generation, spaced: bool):
        self.generation, self.spaced = generation, spaced
        self.rows = generation.rows
        self.given = [0] * len(self.rows)  # each row's ids given out

    @property
    def finish_reasons(self) -> list[str | None]:
        return self.generation.finish_reasons

    @property
    def tokens_generated(self) -> int:
        return self.generation.tokens_generated

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for b, token in self.generation:
            self.given[b] += 1
            yield b, ("" if self.given[b] == 1 and not self.spaced else " ") + str(token)


def _generation_bar(args: argparse.Namespace, rows: int):
    """A progress bar on stderr of the new tokens and their rate, as prepare, eval and train show
    theirs (--no-progress: none), for a generation not streamed, which shows nothing else until it
    ends; a streamed one shows itself."""
    from tqdm.auto import tqdm

    return tqdm(
        total=rows * args.max_new_tokens,
        unit="tok",
        desc="generating",
        disable=args.stream or not args.progress,
        dynamic_ncols=True,
    )


class _Samples:
    """Prints the samples of one batch one after another: the first streams as it comes, the
    others are held until those before them are printed, then stream on. With stream False,
    each is printed (without the prompt) once it is done."""

    def __init__(self, out, prompt: str, generation, stream: bool, bar=None):
        self.out, self.prompt, self.generation, self.stream, self.bar = out, prompt, generation, stream, bar
        self.n = len(generation.rows)
        self.texts = [""] * self.n
        self.shown = 0  # the sample being printed
        self.begun = False  # its header (and prompt) printed
        self.written = 0  # characters of its text printed so far

    def add(self, row: int, piece: str) -> None:
        self.texts[row] += piece
        while self.shown < self.n and self.generation.finish_reasons[self.shown] is not None:
            self._write_shown(ended=True)
        if self.stream and self.shown < self.n:
            self._write_shown()  # the sample under way, so far

    def close(self, interrupted: bool = False) -> None:
        """Every sample has ended, or generation stopped (`interrupted`): print what is left, in
        order (after an interruption, only the samples begun)."""
        while self.shown < self.n:
            if interrupted and not self.begun and not self.texts[self.shown]:
                self.shown += 1
                continue
            self._write_shown(ended=True)

    def _write_shown(self, ended: bool = False) -> None:
        if self.bar is not None and not self.bar.disable:  # a sample done while the bar is drawn: written above it
            with self.bar.external_write_mode(file=self.out):
                self._write(ended)
        else:
            self._write(ended)

    def _write(self, ended: bool) -> None:
        text = self.texts[self.shown]
        if not self.begun:
            header = f"{'=' * 20} sample {self.shown + 1} of {self.n} {'=' * 20}\n" if self.n > 1 else ""
            self.out.write(header + (self.prompt if self.stream else ""))
            self.begun = True
        if self.stream or ended:
            self.out.write(text[self.written :])
            self.written = len(text)
        if ended:
            self.out.write("\n")
            self.shown, self.begun, self.written = self.shown + 1, False, 0
        self.out.flush()


def _summary(generated: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    tokens = "1 token" if generated == 1 else f"{generated} tokens"
    print(f"[gpt2: {tokens} in {elapsed:.1f} s, {generated / max(elapsed, 1e-9):.1f} tokens/s]", file=sys.stderr)


EXAMPLES = """\
examples:
  gpt2 generate "Alan Turing theorized that" --max-new-tokens 40 --temperature 0
  gpt2 generate "Once upon a time" --seed 42 --top-p 0.9 --stop $'\\n\\n'
  echo "The meaning of life is" | gpt2 generate - --num-samples 3 --no-stream
  gpt2 generate "Hello" --model path/to/weights --device cuda --dtype bfloat16
  gpt2 generate --ids 3,14,15,9 --model out-ids --max-new-tokens 8   # token ids in, token ids out
  gpt2 tokenize "Hello world" | gpt2 generate --ids - --temperature 0

A prompt read from standard input loses one final newline, so that the model continues
its last line. With --ids the prompt is token ids and so is what is printed, a line of ids a
sample (the prompt's first, when streamed): the way in for a model that comes with no tokenizer
(one trained here on a vocabulary of its own); --stop and the structured outputs are text, which
--ids has none of.
"""


def _add_structured_flags(parser: argparse.ArgumentParser) -> None:
    """The constraint flags (one at most), the logit bias and the penalties."""
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument(
        "--json-schema", metavar="FILE", help="structured output: a JSON document valid against this JSON schema"
    )
    constraint.add_argument("--json-object", action="store_true", help="structured output: any JSON object")
    constraint.add_argument(
        "--regex", metavar="R", help="structured output: text that this regular expression matches, whole"
    )
    constraint.add_argument(
        "--choice", action="append", metavar="TEXT", help="structured output: one of these texts (repeatable)"
    )
    constraint.add_argument(
        "--grammar", metavar="FILE", help="structured output: a sentence of this grammar (Lark or llama.cpp's GBNF)"
    )
    parser.add_argument(
        "--logit-bias",
        action="append",
        metavar="ID=BIAS",
        help="add BIAS (-100 to 100: -100 bans the token, 100 forces it) to token ID's logit (repeatable)",
    )
    parser.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        metavar="X",
        help="-2 to 2: lower each token's logit by X times its count in the new text, as OpenAI's (default: 0)",
    )
    parser.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        metavar="X",
        help="-2 to 2: lower the logit of each token already in the new text by X, as OpenAI's (default: 0)",
    )
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="R",
        help="above 0: divide (multiply, where negative) the logits of tokens in the prompt or the new text by R, "
        "as transformers' (default: 1, none)",
    )


def add_parser(commands) -> None:
    generate = commands.add_parser(
        "generate",
        help="continue a prompt with GPT-2, streaming the text",
        description="Continue a prompt with GPT-2. The text streams as it is generated; a summary goes to stderr.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    generate.add_argument("prompt", nargs="?", help="the prompt, or - to read it from standard input")
    add_ids_flag(generate, "the prompt", ", and the output is token ids too")
    add_model_flag(
        generate,
        "gpt2, gpt2-medium, gpt2-large, gpt2-xl (downloaded once), "
        "shakespeare_char (shipped: a small model of Shakespeare's characters, offline), "
        "or a local directory (Hugging Face's or OpenAI's release)",
    )
    generate.add_argument(
        "--max-new-tokens",
        type=whole_number,
        default=MAX_NEW_TOKENS,
        help=f"tokens to generate (default: {MAX_NEW_TOKENS})",
    )
    add_sampling_flags(generate)
    generate.add_argument(
        "--seed",
        type=whole_number,
        default=None,
        help="0 to 2**64-1: the same seed gives the same text; sample i uses seed + i, "
        "as in the Python API and the server (default: random)",
    )
    generate.add_argument("--num-samples", type=whole_number, default=1, help="continuations to generate (default: 1)")
    generate.add_argument(
        "--steer",
        action="append",
        metavar="SPEC",
        help="add a feature's decoder direction times COEFF to the residual stream, at every position: "
        "SAE_DIR:FEATURE:COEFF (an SAE SAELens saved) or TRANSCODERS_DIR:LAYER:FEATURE:COEFF (a transcoder set); "
        "may be given more than once",
    )
    generate.add_argument(
        "--stop", action="append", metavar="TEXT", help="end a continuation before this text (repeatable)"
    )
    add_special_as_text_flag(generate, "the prompt")
    add_inference_device_flags(generate)
    add_cuda_graphs_flag(generate)
    generate.add_argument(
        "--engine",
        default="torch",
        choices=["torch", "numpy"],
        help="torch (with a KV cache) or numpy (the reference engine: no cache, slow, for checking) (default: torch)",
    )
    add_draft_flags(generate)
    _add_structured_flags(generate)
    generate.add_argument(
        "--on-overflow",
        default="slide",
        choices=["slide", "error"],
        help="past the model's context: keep the last n_ctx tokens, or stop with an error (default: slide)",
    )
    generate.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="print the continuation, without the prompt, once it is done (a progress bar shows it under way)",
    )
    add_no_progress_flag(generate)
    generate.set_defaults(func=cmd)

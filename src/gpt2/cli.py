"""The `gpt2` command: a thin layer over the Python API.

Every expected failure (bad flag, bad value, missing file) prints one line on stderr,
`gpt2: error: ...`, and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import math
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Sequence

from gpt2 import __version__
from gpt2.checkpoints.config import ACTIVATIONS, POSITIONS, PRESETS
from gpt2.errors import DistributedError, GPT2Error, RecipeError
from gpt2.settings import (
    CHAT_MAX_NEW_TOKENS,
    COMPILE_MODES,
    DRAFT_TOKENS,
    EVAL_TASKS,
    INFERENCE_DTYPES,
    LOOKUP_MAX,
    LOOKUP_MIN,
    MAX_NEW_TOKENS,
    MUON_LR,
    OPTIMIZERS,
    TEMPERATURE,
    TOP_K,
    TRAINING_DTYPES,
    TrainSettings,
    read_recipe,
)

EXIT_USAGE = 2


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
    text = " ".join(words)  # its <|endoftext|> is the special token with --allow-special, else characters (tokenize.md)
    ids = tokenizer.encode(text, allowed_special="all") if args.allow_special else tokenizer.encode_ordinary(text)
    print(len(ids) if args.count else " ".join(map(str, ids)))
    return 0


def _check_generate_args(args: argparse.Namespace) -> str:
    """What can be checked before a model is loaded (every flag but --top-k's bound, the
    vocabulary; the draft model's configuration, not its weights), `args.sampling` made of the
    sampling flags; returns the prompt."""
    from gpt2._checks import positive_int
    from gpt2.generation.decoding import check_max_new_tokens
    from gpt2.generation.generate import check_stop

    if args.prompt is None:
        raise _UsageError('no prompt: give one (e.g. gpt2 generate "Once upon a time"), or - to read standard input')
    args.sampling = _sampling(args)
    check_max_new_tokens(args.max_new_tokens)
    positive_int("num_samples", args.num_samples)
    check_stop(args.stop)
    _check_device(args)
    _check_cuda_graphs(args)
    _check_draft_tokens(args)
    if args.draft is not None:
        _model_configs(args)
    args.structured = _structured(args)
    if args.prompt == "-":
        return _without_final_newline(_read_stdin())
    return _command_line_text(args.prompt, "the prompt given on the command line")


def _sampling(args: argparse.Namespace):
    """The Sampling of --temperature, --top-k and --top-p, made (and so checked) before the model
    loads, as is --seed: all but --top-k's bound, the model's vocabulary, which the library checks
    once it is there. The commands hand it on as it is (`_with_top_k` fills in --top-k's default)."""
    from gpt2.generation.sampling import Sampling, check_seed

    if getattr(args, "seed", None) is not None:
        check_seed(args.seed)
    return Sampling(args.temperature, args.top_k, args.top_p)


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
        raise _UsageError(
            f"--logit-bias takes ID=BIAS, a token id and a number from -100 to 100 (e.g. 50256=-100), got {item!r}"
        ) from None


def _check_device(args: argparse.Namespace) -> None:
    """--device and --dtype (and --engine's rule), before the model loads."""
    from gpt2.devices import resolve_device, weight_format
    from gpt2.generation.engines import check_numpy_engine

    if args.engine == "numpy":
        check_numpy_engine(args.device, args.dtype, _flag)
    else:
        weight_format(args.dtype, resolve_device(args.device))


def _model_configs(args: argparse.Namespace) -> list:
    """The configurations of --model and --draft-model, read without their weights: a model that is
    not there, or a draft of another vocabulary, fails before anything loads."""
    from gpt2.checkpoints.weights import read_config
    from gpt2.generation.engines import check_draft_config

    configs = [read_config(name) for name in [args.model] + ([] if args.draft is None else [args.draft])]
    if args.draft is not None:
        check_draft_config(*configs)  # its tokenizer once it has loaded
    return configs


def _check_cuda_graphs(args: argparse.Namespace) -> None:
    if args.cuda_graphs:
        from gpt2.generation.engines import check_cuda_graphs

        check_cuda_graphs(args.device, args.engine, _flag)


def _check_draft_tokens(args: argparse.Namespace) -> None:
    if args.draft_tokens is not None:
        from gpt2.generation.decoding import check_draft_tokens

        _draft_tokens_need_a_draft(args)
        check_draft_tokens(args.draft_tokens)


def _draft_tokens_need_a_draft(args: argparse.Namespace) -> None:
    if args.draft_tokens is not None and args.draft is None and args.speculative is None:
        raise _UsageError(
            "--draft-tokens is the number of tokens a draft proposes: give --draft-model or --speculative ngram too"
        )


def _draft_tokens(args: argparse.Namespace) -> dict[str, int]:
    """--draft-tokens as the library's keyword, where it was given (else the library's default)."""
    return {} if args.draft_tokens is None else {"draft_tokens": args.draft_tokens}


def _flag(setting: str) -> str:
    """A setting's flag, for the library's messages: cuda_graphs -> --cuda-graphs."""
    return "--" + setting.replace("_", "-")


def _load_model(args: argparse.Namespace, name: str | None = None):
    """The model (--model, or `name`) and the tokenizer saved with it (GPT-2's for a model of GPT-2's vocabulary)."""
    name = args.model if name is None else name
    if args.engine == "numpy":
        from gpt2.checkpoints.weights import locate
        from gpt2.reference import ReferenceModel

        model, tokenizer = ReferenceModel.load(name), locate(name).load_tokenizer()
    else:
        from gpt2.model.model import GPT2

        model = GPT2.from_pretrained(name, device=args.device, dtype=args.dtype).use_cuda_graphs(args.cuda_graphs)
        tokenizer = model.tokenizer
    if tokenizer is None:
        raise _UsageError(
            f"the model {name} comes with no tokenizer (encoder.json + vocab.bpe, or chars.json), "
            f"and its vocabulary of {model.config.n_vocab} ids is not GPT-2's"
        )
    return model, tokenizer


def _load_draft(args: argparse.Namespace, model, tokenizer):
    """The draft model of --draft-model (None without one), checked against the model."""
    if args.draft is None:
        return None
    from gpt2.generation.engines import check_draft

    draft, draft_tokenizer = _load_model(args, args.draft)
    check_draft(model, draft, tokenizer, draft_tokenizer)
    return draft


def _cmd_generate(args: argparse.Namespace) -> int:
    from gpt2.generation.generate import TextGeneration

    prompt = _check_generate_args(args)
    model, tokenizer = _load_model(args)
    draft = _load_draft(args, model, tokenizer)
    started = time.perf_counter()
    generation = TextGeneration(
        model,
        tokenizer,
        prompt,
        max_new_tokens=args.max_new_tokens,
        sampling=_with_top_k(args.sampling, model),
        seed=args.seed,
        num_samples=args.num_samples,
        stop=args.stop,
        on_overflow=args.on_overflow,
        allowed_special=_allowed_special(args),
        draft=draft,
        **_draft_tokens(args),
        **args.structured,
    )
    bar = _generation_bar(args, len(generation.rows))
    samples = _Samples(sys.stdout, prompt, generation, args.stream, bar)
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


def _allowed_special(args: argparse.Namespace) -> frozenset[str] | str:
    """<|endoftext|> in a prompt: the special token, as OpenAI's API reads it, or with --special-as-text its
    characters."""
    return frozenset() if args.special_as_text else "all"


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


def _cmd_serve(args: argparse.Namespace) -> int:
    from gpt2.devices import resolve_device, weight_format

    try:
        from gpt2.serve import Limits, serve
    except ModuleNotFoundError as e:
        if e.name not in ("fastapi", "pydantic", "starlette", "uvicorn", "prometheus_client"):
            raise
        raise _UsageError(
            f"gpt2 serve needs the serve extra ({e.name} is not installed): pip install 'gpt2[serve]'"
        ) from None

    _draft_tokens_need_a_draft(args)
    from gpt2.generation.lookup import lookup_of

    lookup_of(args.speculative, args.prompt_lookup_max, args.prompt_lookup_min, args.draft)  # not with --draft-model
    chat_template = _chat_template(args)  # a bad file fails now, before the model loads
    inspect_limits = {
        name: getattr(args, name)
        for name in ("max_inspect_cells", "max_patching_tokens")
        if getattr(args, name) is not None
    }
    limits = Limits(
        max_batch_size=args.max_batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_cache_mb=args.prefix_cache_mb,
        max_queue=args.max_queue,
        max_n=args.max_n,
        api_key=args.api_key,
        speculative=args.speculative,
        prompt_lookup_max=args.prompt_lookup_max,
        prompt_lookup_min=args.prompt_lookup_min,
        **inspect_limits,
        **_draft_tokens(args),
    )  # checked as made, --draft-tokens with them
    device = resolve_device(args.device)
    form = weight_format(args.dtype, device)  # bad flags fail now, not once the server listens (--port: when it would)
    _check_cuda_graphs(args)
    for config in _model_configs(args):
        limits.check_memory(config, device, form.compute)

    def listening(url: str) -> None:
        page = "" if args.no_ui else f"; the playground on {url.removesuffix('/v1')}/"
        print(
            f"gpt2: serving {args.model} on {url}{page} (loading the model; GET /health answers 200 once it has)",
            file=sys.stderr,
        )

    load_draft = None if args.draft is None else lambda: _load_model(args, args.draft)
    serve(
        lambda: _load_model(args),
        args.model,
        args.host,
        args.port,
        limits,
        allowed_special=_allowed_special(args),
        on_listen=listening,
        ui=not args.no_ui,
        load_draft=load_draft,
        chat_template=chat_template,
    )
    return 0


def _chat_template(args: argparse.Namespace):
    """The template of --chat-template, read and compiled (None without one: the model's own)."""
    if args.chat_template is None:
        return None
    from gpt2.tokenizer.chat import ChatTemplate

    return ChatTemplate.from_file(args.chat_template)


def _cmd_chat(args: argparse.Namespace) -> int:
    from gpt2.generation.decoding import check_max_new_tokens
    from gpt2.generation.generate import Chat

    chat_template = _chat_template(args)  # what can fail without the model, before it loads
    sampling = _sampling(args)
    if args.max_new_tokens is not None:
        check_max_new_tokens(args.max_new_tokens)
    _check_device(args)
    _check_cuda_graphs(args)
    system = (
        None if args.system is None else _command_line_text(args.system, "the system message given on the command line")
    )
    model, tokenizer = _load_model(args)
    chat = Chat(
        model,
        tokenizer,
        chat_template=chat_template,
        system=system,
        max_new_tokens=args.max_new_tokens,
        sampling=_with_top_k(sampling, model),
        seed=args.seed,
    )
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):  # line editing and history for input(), where the platform has it
            importlib.import_module("readline")
        print(
            f"gpt2: chatting with {args.model}; /reset starts over, Ctrl-C stops a reply, Ctrl-D leaves",
            file=sys.stderr,
        )
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:  # Ctrl-D, or the end of piped input
            if interactive:
                print()
            return 0
        if line.strip() == "/reset":
            chat.reset()
            print("gpt2: the conversation starts over", file=sys.stderr)
        elif line.strip():
            _chat_turn(chat, line, args)


def _chat_turn(chat, text: str, args: argparse.Namespace) -> None:
    """One reply, streamed; a message that cannot be answered is one line on stderr, and the
    conversation goes on. Ctrl-C stops the reply (which is not kept), as llama.cpp's REPL does."""
    try:
        pieces = chat.reply(text)
    except GPT2Error as e:
        print(f"gpt2: error: {with_flags(e, parser_flags(build_parser(), 'chat'))}", file=sys.stderr)
        return
    if chat.dropped:
        print(f"gpt2: the {chat.dropped} oldest messages are left out, to fit the model's context", file=sys.stderr)
    try:
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        print("\ngpt2: reply stopped (not kept in the conversation)", file=sys.stderr)
        return
    sys.stdout.write("\n")
    sys.stdout.flush()


def _cmd_prepare(args: argparse.Namespace) -> int:
    from gpt2.data.tokens import prepare

    if args.chat:
        return _prepare_chat(args)
    if args.chat_template is not None:
        raise _UsageError("--chat-template is the template of conversations: add --chat")
    if not args.inputs and args.dataset is None:
        raise _UsageError("give INPUT files or directories, - for standard input, or --dataset NAME")
    text_field = "text" if args.text_field is None else args.text_field
    meta = prepare(
        args.inputs,
        args.out,
        args.tokenizer,
        args.val_fraction,
        overwrite=args.overwrite,
        progress=args.progress,
        text_field=text_field,
        dataset=args.dataset,
        dataset_config=args.dataset_config,
        dataset_split=args.dataset_split,
        shard_tokens=args.shard_tokens,
    )
    if "shards" in meta:
        shards = meta["shards"]
        said = (
            f"{meta['train_tokens']:,} training tokens in {len(shards['train'])} "
            f"shard{'s' * (len(shards['train']) != 1)} and "
            f"{meta['val_tokens']:,} validation tokens in {shards['val'][0]} ({shards['documents']:,} documents)"
        )
    else:
        said = (
            f"{meta['train_tokens']:,} training and {meta['val_tokens']:,} validation tokens "
            f"({_validation(meta['split'])})"
        )
    print(
        f"gpt2: {said} of a {meta['vocab_size']:,}-token vocabulary ({meta['tokenizer']}) in {args.out}",
        file=sys.stderr,
    )
    return 0


def _prepare_chat(args: argparse.Namespace) -> int:
    from gpt2.data.tokens import prepare_chat

    given = [
        flag
        for flag, value in (
            ("--dataset", args.dataset),
            ("--dataset-config", args.dataset_config),
            ("--text-field", args.text_field),
            ("--shard-tokens", args.shard_tokens),
        )
        if value is not None
    ]
    if args.dataset_split != "train":
        given.append("--split")
    if given:
        raise _UsageError(
            f"--chat reads JSON Lines files of conversations into train.bin and val.bin: {', '.join(given)} "
            f"do{'es' * (len(given) == 1)} not apply"
        )
    if not args.inputs:
        raise _UsageError(
            'give JSON Lines files of conversations ({"messages": [...]} a line), or - for standard input'
        )
    meta = prepare_chat(
        args.inputs,
        args.out,
        args.tokenizer,
        args.val_fraction,
        chat_template=args.chat_template,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    chat, split = meta["chat"], meta["split"]
    print(
        f"gpt2: {chat['conversations']['train']:,} training and {chat['conversations']['val']:,} "
        f"validation conversations ({meta['train_tokens']:,} and {meta['val_tokens']:,} tokens, "
        f"{chat['mask_tokens']['train']:,} and {chat['mask_tokens']['val']:,} of them in replies; "
        f"{split['actual_val_fraction']:.2%} for validation; the longest {chat['longest']:,} tokens) "
        f"of a {meta['vocab_size']:,}-token vocabulary ({meta['tokenizer']}) in {args.out}",
        file=sys.stderr,
    )
    return 0


def _validation(split: dict) -> str:
    """The real share of validation, and, for several documents, what makes it up:
    "10.00% for validation: 3 whole documents and the last 1,234 tokens of b.txt"."""
    said = f"{split['actual_val_fraction']:.2%} for validation"
    if split["method"] != "documents":
        return said
    n, cut = split["val_documents"], split["cut"]
    parts = [f"{n} whole document{'s' * (n != 1)}"] if n else []
    parts += [f"the last {cut['val_tokens']:,} tokens of {cut['document']}"] if cut else []
    return f"{said}: {' and '.join(parts)}"


def _cmd_train(args: argparse.Namespace) -> int:
    from gpt2.training.stopping import ignore_late_signals
    from gpt2.training.train import train

    given = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "func", "recipe", "resume", "overwrite", "progress", "threads")
    }
    options = {**(read_recipe(args.recipe) if "recipe" in args else {}), **given}  # the flags given override the recipe
    if "out" not in options:
        raise _UsageError("the following arguments are required: --out (or out in the recipe)")
    out = options.pop("out")
    result = train(out, resume=args.resume, overwrite=args.overwrite, progress=args.progress, **options)
    if result.interrupted:
        ignore_late_signals()  # under torchrun: the process ends now, whatever signal comes late
    if result.rank != 0:  # under torchrun, rank 0 reports
        return 130 if result.interrupted else 0
    if result.interrupted:
        print(
            f"gpt2: interrupted at iteration {result.iteration}; checkpoint saved. Continue with: "
            f"gpt2 train --out {out} --resume",
            file=sys.stderr,
        )
        return 130
    print(
        f"gpt2: {result.iteration} iterations; best validation loss {result.best_val_loss:.4f}, its model in {out} "
        f"(gpt2 generate --model {out})",
        file=sys.stderr,
    )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    from gpt2.evaluation import evaluate

    if args.task is None and (args.file is None) == (args.data is None):
        raise _UsageError(
            "give one thing to evaluate: a text FILE, --data DIR (a prepared directory's val.bin), or --task NAME"
        )
    if args.task is not None and args.file is not None:
        raise _UsageError(f"give a FILE or --task, not both (a file of {args.task}'s own goes in --data)")
    if args.task is None and args.limit is not None:
        raise _UsageError("--limit counts the examples of a --task; a text is scored whole")
    file = None if args.file is None else _command_line_text(args.file, "FILE")
    data = _check_eval_args(args, file)
    model, tokenizer = _load_model(args)
    options = dict(context=args.context, stride=args.stride, batch_size=args.batch_size, progress=args.progress)
    if args.task is not None:
        result = evaluate.run_task(model, args.task, args.data, limit=args.limit, **options)
    elif file is not None:
        result = evaluate.evaluate_file(model, file, tokenizer, **options).to_dict()
    else:
        result = evaluate.evaluate_data(model, data, **options).to_dict()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:<14} {value:.4f}" if isinstance(value, float) else f"{key:<14} {value}")
    return 0


def _check_eval_args(args: argparse.Namespace, file: str | None):
    """What can be checked before the model loads: all but --context's bound, the model's context.
    Returns the --data directory opened (every id checked, once), where that is what is scored."""
    from pathlib import Path

    from gpt2._checks import check_batch_size
    from gpt2._files import check_file
    from gpt2.data.tokens import open_data
    from gpt2.errors import DataError
    from gpt2.evaluation.evaluate import check_window
    from gpt2.evaluation.tasks import check_limit

    check_limit(args.limit)
    check_batch_size(args.batch_size)
    check_window(None, args.context, args.stride)
    data = None
    if file is not None:
        check_file(Path(file), DataError)
    elif args.task is None:
        data = open_data(args.data)  # a prepared directory that is not one fails now, before the model loads
    _check_device(args)
    return data


def _cmd_inspect(args: argparse.Namespace) -> int:
    import json

    from gpt2._files import writable_directory
    from gpt2.inspect import tracing

    if args.sae is not None:
        return _cmd_inspect_sae(args)
    if args.corrupted is not None:
        return _cmd_inspect_patching(args)
    if args.experiment is not None and (args.heads or args.repeat is not None):
        raise _UsageError("give --heads or --experiment, not both")
    if args.experiment is not None:
        return _cmd_inspect_experiment(args)
    if args.heads or args.repeat is not None:
        return _cmd_inspect_heads(args)
    if args.text is None:
        raise _UsageError('no text: give one (e.g. gpt2 inspect "The dog chased the"), or - to read standard input')
    if args.json and args.walk:
        raise _UsageError("give --json or --walk, not both")
    sampling = _sampling(args)
    _check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    text = _inspect_text(args)
    model, _ = _load_model(args)
    sampling.check_vocab(model.config.n_vocab)  # --top-k: here, not in next_token_report, whose k is no flag
    names = tracing.activation_names(model.config.n_layer, on_request=args.walk)
    trace = tracing.trace(model, text, names=names)
    if png is not None:
        _draw(trace, png, args.position, sampling)
    if args.walk:
        print("\n".join(tracing.walkthrough(trace, args.top_k)))
        return 0
    report = tracing.next_token_report(trace, args.top_k)
    if args.json:
        print(json.dumps({key: report[key] for key in ("tokens", "ids", "logprobs", "ranks", "top")}))
    else:
        color = args.color == "always" or (
            args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        )
        print("\n".join(_token_lines(report, color)))
    return 0


def _inspect_text(args: argparse.Namespace) -> str:
    """gpt2 inspect's text: the argument, or standard input for -; never empty."""
    text = _without_final_newline(_read_stdin()) if args.text == "-" else _command_line_text(args.text, "the text")
    if not text:
        raise _UsageError("the text is empty: give at least one token's worth")
    return text


def _cmd_inspect_experiment(args: argparse.Namespace) -> int:
    """gpt2 inspect --experiment NAME: a standard experiment on its built-in data, its metrics printed
    and, with --png, its patching (or head score) heat map and attribution bar chart drawn."""
    from gpt2._files import writable_directory
    from gpt2.inspect import experiments

    if args.text is not None:
        raise _UsageError("--experiment runs on its own data: give no text")
    _check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    model, _ = _load_model(args)
    result = experiments.run_experiment(model, args.experiment, model_name=args.model)
    print(
        f"{result.name}: {result.prompts} prompt{'s' * (result.prompts != 1)}; " + "; ".join(result.notes)
        if result.notes
        else f"{result.name}:"
    )
    for key, value in result.metrics.items():
        print(f"{key:<20} {value:.4f}")
    n_head = model.config.n_head
    top = result.heads.flatten().abs().argsort(descending=True)[:5].tolist()
    print(
        f"top heads ({result.heads_title}): "
        + ", ".join(f"{i // n_head}.{i % n_head} {float(result.heads.flatten()[i]):.3f}" for i in top)
    )
    if png is not None:
        from gpt2.inspect import figures

        names = [f"{result.name}-heads.png"]
        figures.save(figures.head_grid(result.heads, f"{result.name}: {result.heads_title}"), png / names[0])
        if result.attribution is not None:
            names.append(f"{result.name}-attribution.png")
            figures.save(
                figures.attribution_bars(result.attribution, f"{result.name}: direct logit attribution"), png / names[1]
            )
        print(f"gpt2: wrote {len(names)} pictures in {png}: {', '.join(names)}", file=sys.stderr)
    return 0


def _cmd_inspect_patching(args: argparse.Namespace) -> int:
    """gpt2 inspect --corrupted TEXT CLEAN: activation patching at --site (patching.activation_patching)
    and its first-order estimate (attribution_patching), on the logit difference between --answer
    and --other after the last token: by default the clean run's next token and the corrupted run's."""
    import json

    from gpt2._checks import check_answer_and_other
    from gpt2._files import writable_directory
    from gpt2.inspect import activation_patching, attribution_patching, logit_diff, trace
    from gpt2.inspect.patching import AXES
    from gpt2.inspect.tracing import token_label
    from gpt2.tokenizer import token_text

    _alone(args, "--corrupted", "patches a clean text with a corrupted one")
    if args.text is None:
        raise _UsageError('--corrupted needs the clean text too (e.g. gpt2 inspect --corrupted "... John" "... Mary")')
    _check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    clean, corrupted = (
        _command_line_text(t, what) for t, what in ((args.text, "the text"), (args.corrupted, "--corrupted"))
    )
    model, _ = _load_model(args)
    runs = {name: trace(model, text, names=()) for name, text in (("clean", clean), ("corrupted", corrupted))}
    answer = _one_token(model, args.answer, "answer", runs["clean"])
    other = _one_token(model, args.other, "other", runs["corrupted"])
    defaulted = [
        f"{name}: the {run} text's next token"
        for name, run, given in (("answer", "clean", args.answer), ("other", "corrupted", args.other))
        if given is None
    ]
    shown = None if model.tokenizer is None else token_text(model.tokenizer, answer)
    check_answer_and_other(answer, other, shown, "; ".join(defaulted))  # logit_diff's check, saying which were defaults
    metric = logit_diff(answer, other)
    grids = {
        how: patch(model, clean, corrupted, metric, args.site)
        for how, patch in (("activation patching", activation_patching), ("attribution patching", attribution_patching))
    }
    tokens = [
        token_label(t, i) for t, i in zip(runs["clean"].tokens or [None] * len(runs["clean"].ids), runs["clean"].ids)
    ]
    columns = tokens if AXES[args.site][1] == "position" else [str(h) for h in range(model.config.n_head)]
    diffs = {name: float(metric(run.logits)) for name, run in runs.items()}
    title = f"{args.site}: logit({_label(model, answer)}) - logit({_label(model, other)})"
    if png is not None:
        from gpt2.inspect import figures

        figures.save(figures.patching_grids(grids, columns, AXES[args.site][1], title), png / "patching.png")
        print(f"gpt2: wrote {png / 'patching.png'}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "site": args.site,
                    "answer": answer,
                    "other": other,
                    "logit_diff": diffs,
                    "tokens": runs["clean"].tokens,
                    **{how.split()[0]: grid.tolist() for how, grid in grids.items()},
                }
            )
        )
        return 0
    print(f"{title}: clean {diffs['clean']:.3f}, corrupted {diffs['corrupted']:.3f}")
    for how, grid in grids.items():
        print(f"\n{how} (a row a layer, a column a {AXES[args.site][1]}):")
        print("      " + " ".join(f"{c[:7]:>7}" for c in columns))
        print("\n".join(f"{l:>5} " + " ".join(f"{v:7.3f}" for v in row.tolist()) for l, row in enumerate(grid)))
    return 0


def _alone(args: argparse.Namespace, flag: str, does: str, *also: tuple[str, object]) -> None:
    """Refuse, naming the first, the other forms of gpt2 inspect given with `flag` (--corrupted, --sae)."""
    given = [
        other
        for other, on in (
            ("--heads", args.heads or args.repeat is not None),
            ("--experiment", args.experiment),
            ("--walk", args.walk),
            *also,
        )
        if on
    ]
    if given:
        raise _UsageError(f"{flag} {does}: give it without {given[0]}")


def _one_token(model, token: str | None, flag: str, run) -> int:
    """--answer or --other: one token of the model's vocabulary, or (none given) the run's next token."""
    if token is None:
        return int(run.logits[-1].argmax())
    ids = model.tokenizer.encode(token) if model.tokenizer is not None else []
    if len(ids) != 1:
        raise _UsageError(f"--{flag} must be one token of the model's vocabulary, but {token!r} is {len(ids)}: {ids}")
    return ids[0]


def _label(model, i: int) -> str:
    from gpt2.inspect.tracing import token_label

    return token_label(None if model.tokenizer is None else model.tokenizer.decode([i]), i)


def _cmd_inspect_sae(args: argparse.Namespace) -> int:
    """gpt2 inspect --sae DIR TEXT: each token's most active features of the SAE SAELens saved in
    DIR, at its hook (saes.sae_features); a line a token, or one JSON object."""
    import json

    from gpt2._checks import positive_int
    from gpt2.inspect import saes
    from gpt2.inspect.tracing import token_label, trace

    _alone(args, "--sae", "shows each token's SAE features", ("--png", args.png))
    if args.text is None:
        raise _UsageError(
            '--sae needs a text (e.g. gpt2 inspect --sae DIR "The dog chased the"), or - to read standard input'
        )
    positive_int("top_k", args.top_k)
    _check_device(args)
    text = _inspect_text(args)
    sae = saes.load_sae(args.sae)  # a missing or broken file: one line, before the model loads
    model, _ = _load_model(args)
    sae.check_fits(model)
    t = trace(model, text, names=sae.names())
    top = saes.top_features(saes.sae_features(t, sae), args.top_k)
    tokens = t.tokens or [None] * len(t.ids)
    if args.json:
        print(
            json.dumps(
                {
                    "hook_name": sae.hook_name,
                    "d_sae": sae.d_sae,
                    "tokens": t.tokens,
                    "ids": t.ids,
                    "features": [[{"id": i, "value": v} for i, v in row] for row in top],
                }
            )
        )
        return 0
    width = max(12, *(len(token_label(token, i)) for token, i in zip(tokens, t.ids)))
    print(f"{'token':<{width}}  top {args.top_k} features of {sae.hook_name} (d_sae={sae.d_sae}): id value")
    for token, i, row in zip(tokens, t.ids, top):
        print(f"{token_label(token, i):<{width}}  " + ("  ".join(f"{f} {v:.3f}" for f, v in row) or "(none active)"))
    return 0


def _draw(trace, directory, position: int, sampling) -> None:
    from gpt2.inspect import figures

    pictures = {f"attention-block{i}.png": (figures.attention, i) for i in range(trace.model.config.n_layer)}
    pictures |= {"logit-lens.png": (figures.logit_lens,), "next-token.png": (figures.next_token, position, sampling)}
    for name, (draw, *how) in pictures.items():
        figures.save(draw(trace, *how), directory / name)
    print(f"gpt2: wrote {len(pictures)} pictures in {directory}: {', '.join(pictures)}", file=sys.stderr)


HEADS_SEED = 0  # --repeat's random tokens: torch.Generator().manual_seed(0), the same sequence each run


def _cmd_inspect_heads(args: argparse.Namespace) -> int:
    """gpt2 inspect --heads: every head's three scores (circuits.head_scores), on the text or on
    --repeat N random tokens written twice; a table each, or one JSON object, and a picture."""
    import json

    from gpt2._checks import positive_int
    from gpt2._files import writable_directory
    from gpt2.inspect import HEAD_SCORES, head_scores
    from gpt2.inspect.circuits import score_masks, score_tables

    if not args.heads:
        raise _UsageError("--repeat is the length of --heads' random sequence: add --heads")
    if args.walk:
        raise _UsageError("--walk walks through one forward pass; --heads scores every head: give one of them")
    if (args.text is None) == (args.repeat is None):
        raise _UsageError(
            "give --heads a text, or --repeat N for N random tokens written twice"
            if args.text is None
            else "give --heads a text or --repeat N, not both"
        )
    if args.repeat is not None:
        positive_int("repeat", args.repeat)
    _check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    text = args.text if args.text in (None, "-") else _command_line_text(args.text, "the text")
    text = _without_final_newline(_read_stdin()) if text == "-" else text
    model, tokenizer = _load_model(args)
    ids, what = _heads_input(model, tokenizer, text, args.repeat)
    scores = {kind: head_scores(model, ids, kind) if score_masks(ids, kind)[1].any() else None for kind in HEAD_SCORES}
    if png is not None:
        from gpt2.inspect import figures

        figures.save(figures.head_scores(scores, f"head scores on {what}"), png / "head-scores.png")
        print(f"gpt2: wrote {png / 'head-scores.png'}", file=sys.stderr)
    if args.json:
        print(json.dumps({kind: None if s is None else s.tolist() for kind, s in scores.items()}))
        return 0
    print("\n".join([f"head scores on {what}", ""] + score_tables(scores)))
    return 0


def _heads_input(model, tokenizer, text: str | None, repeat: int | None) -> tuple[list[int], str]:
    """The ids --heads scores, and what they are in words: the text's tokens, or --repeat N random
    tokens of the tokenizer's vocabulary written twice, after <|endoftext|> where it has one."""
    from gpt2.inspect import repeated_tokens, tracing

    if text is not None:
        ids, _ = tracing.token_ids(model, text)  # a text longer than the context: one line, naming both
        if len(ids) < 2:
            raise _UsageError("the text is one token: head scores need two or more")
        return ids, f"the text's {len(ids)} tokens"
    start = tokenizer.eot_token
    length, n_ctx = 2 * repeat + (start is not None), model.config.n_ctx
    if length > n_ctx:
        most = (n_ctx - (start is not None)) // 2
        raise _UsageError(
            f"--repeat {repeat} makes a sequence of {length} tokens "
            f"({'<|endoftext|>, then ' if start is not None else ''}"
            f"{repeat} random tokens twice), longer than the model's context of n_ctx={n_ctx}: "
            f"give --repeat {most} or less"
        )
    ids = repeated_tokens(repeat, tokenizer.n_vocab, seed=HEADS_SEED, start=start)
    return ids, f"{repeat} random tokens written twice (seed {HEADS_SEED}, {length} tokens)"


# Surprise, as the terminal colours it: a probability at least this high, then its colour (256-colour ANSI).
_COLOURS = ((0.3, 34), (0.05, 178), (0.005, 208), (0.0, 196))


def _token_lines(report: dict, color: bool) -> list[str]:
    """Each token, the probability the model gave it and its rank, and what it expected instead."""
    from gpt2.inspect.tracing import alternatives
    from gpt2.inspect.tracing import token_label as shown

    tokens = report["tokens"] or [None] * len(report["ids"])
    width = max(12, *(len(shown(t, i)) for t, i in zip(tokens, report["ids"])))
    lines = [f"{'token':<{width}}  {'p':>7}  {'rank':>6}  expected instead (top {len(report['top'][0])})"]
    for t, (token, i, logprob, rank) in enumerate(zip(tokens, report["ids"], report["logprobs"], report["ranks"])):
        cell = shown(token, i)
        if logprob is None:
            lines.append(f"{cell:<{width}}  {'-':>7}  {'-':>6}")
            continue
        p = math.exp(logprob)
        if color:
            code = next(c for bound, c in _COLOURS if p >= bound)
            cell = f"\x1b[38;5;{code}m{cell}\x1b[0m" + " " * (width - len(cell))
        lines.append(f"{cell:<{width}}  {p:>7.2%}  {rank:>6}  {alternatives(report['top'][t - 1])}")
    lines.append(f"{'(next)':<{width}}  {'':>7}  {'':>6}  {alternatives(report['top'][-1])}")
    return lines


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


PREPARE_EXAMPLES = """\
examples:
  gpt2 prepare shakespeare --out data/shakespeare_char --tokenizer char   # tinyshakespeare, shipped in gpt2
  gpt2 prepare books/ notes.txt --out data/mytext                     # GPT-2's tokenizer
  gpt2 prepare corpus/ --out data/corpus-bpe --tokenizer bpe:8192 --val-fraction 0.05
  cat *.txt | gpt2 prepare - --out data/stdin
  gpt2 prepare pages.jsonl --out data/pages --text-field body --shard-tokens 100000000
  gpt2 prepare --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out data/fineweb10B \\
      --shard-tokens 100000000
  gpt2 prepare --chat conversations.jsonl --out data/chat            # {"messages": [...]} a line

Each text file is one document, and each record of a .jsonl or .parquet file or a dataset; with
gpt2 and bpe:N each ends with <|endoftext|> (in shards each starts with it, as llm.c's). One file
splits at 1 - F of its tokens (as nanoGPT's shakespeare_char); several split by whole files,
drawn with a fixed seed, the last of them cut so that validation holds F of the tokens. With
--shard-tokens the first shard validates, as llm.c's fineweb.py. With --chat, whole
conversations validate, F of them, drawn with a fixed seed.
"""


TRAIN_EXAMPLES = """\
examples:
  gpt2 prepare shakespeare --out data/shakespeare_char --tokenizer char
  gpt2 train --data data/shakespeare_char --out out-char --n-layer 4 --n-head 4 --n-embd 128 \\
      --block-size 64 --batch-size 12 --grad-accum 1 --max-iters 2000 --lr 1e-3 --min-lr 1e-4 \\
      --warmup-iters 100 --beta2 0.99 --eval-interval 250 --eval-iters 20 --log-interval 10
  gpt2 train --out out-char --resume --max-iters 4000
  gpt2 train --data data/mytext --out out-ft --init gpt2 --block-size 256 --batch-size 4 \\
      --grad-accum 8 --max-iters 200 --lr 3e-5 --warmup-iters 0 --dropout 0.1
  torchrun --standalone --nproc_per_node 8 -m gpt2 train --data data/owt --out out-owt \\
      --config gpt2 --batch-size 12 --grad-accum 40      # 8 GPUs: 5 micro-batches each a step
  gpt2 train --data data/mytext --out out-hs --init gpt2 --eval-task hellaswag --eval-task-limit 500

Defaults are nanoGPT's, sized for GPUs (batch 12 x 40 x 1024 tokens, 600,000 iterations,
200-batch evaluations every 2,000): on a CPU, start from the shakespeare_char example. Ctrl-C (or
SIGTERM) stops at the next micro-batch or evaluation batch and saves the checkpoint of the last
completed iteration; --resume continues the run with the losses it would have had.
"""


EVAL_EXAMPLES = """\
examples:
  gpt2 eval notes.txt                                   # loss, perplexity, bits per byte
  gpt2 eval --model gpt2-large wiki.test.raw --context 1024 --stride 512 --json
  gpt2 eval --model out-char --data data/shakespeare_char     # a prepared directory's val.bin
  gpt2 eval --task hellaswag --limit 1000
  gpt2 eval --task lambada --data lambada_test.jsonl

A text is one stream of ids, scored in windows of --context ids moved by --stride: each id
after the first is scored once, from at least context - stride ids before it (the first
window aside). Tasks: lambada (OpenAI's LAMBADA test set, as lm-evaluation-harness's
lambada_openai), hellaswag (validation set, llm.c's completion style), wikitext2 (raw test
split). Each is downloaded once and cached, or read from --data.
"""


def _add_inference_device_flags(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads of the commands that run a model (generate, eval, serve)."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=INFERENCE_DTYPES,
        help="the weights' precision; on the CPU the lower ones are weight-only, the arithmetic float32, "
        "and int8 is the CPU's alone (default: float32)",
    )
    _add_threads_flag(parser)


def _add_threads_flag(parser) -> None:
    parser.add_argument(
        "--threads",
        type=_whole_number,
        metavar="N",
        help="CPU threads for torch (default: one per core, or $OMP_NUM_THREADS); on a busy machine, "
        "fewer than the cores run faster",
    )


def _add_no_progress_flag(parser) -> None:
    # default given: train's parser leaves out the flags not given (argument_default=SUPPRESS)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="no progress bar")


def _add_cuda_graphs_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode by replaying CUDA graphs, one launch a token (a CUDA GPU only; experimental: "
        "not yet measured on a GPU, so off by default)",
    )


def _add_draft_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft-model",
        dest="draft",
        metavar="MODEL",
        help="speculative decoding: a smaller model of the same tokenizer (a name or a directory, as "
        "--model) proposes tokens, which the model verifies several at a time; greedy text is the same, "
        "sampled text follows the same distribution (default: none)",
    )
    parser.add_argument(
        "--draft-tokens",
        type=_whole_number,
        metavar="K",
        help=f"the tokens the draft model (or prompt lookup) proposes per step (default: {DRAFT_TOKENS})",
    )
    parser.add_argument(
        "--speculative",
        choices=["ngram"],
        help="speculative decoding without a draft model: prompt lookup drafts the tokens that followed the "
        "latest earlier occurrence of the last few tokens, which pays where text copies its prompt (default: off)",
    )
    parser.add_argument(
        "--prompt-lookup-max",
        type=_whole_number,
        default=LOOKUP_MAX,
        metavar="N",
        help=f"--speculative ngram: the longest n-gram matched (default: {LOOKUP_MAX})",
    )
    parser.add_argument(
        "--prompt-lookup-min",
        type=_whole_number,
        default=LOOKUP_MIN,
        metavar="N",
        help=f"--speculative ngram: the shortest n-gram matched (default: {LOOKUP_MIN})",
    )


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


def _add_special_as_text_flag(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument(
        "--special-as-text",
        action="store_true",
        help=f"read <|endoftext|> in {where} as ordinary text, not as the end-of-text token 50256 "
        "(the default, as OpenAI's API reads it)",
    )


SERVE_EXAMPLES = """\
examples:
  gpt2 serve                                        # gpt2 on http://127.0.0.1:8000/v1
  gpt2 serve --model out-char --port 8080 --max-batch-size 16
  GPT2_API_KEY=secret gpt2 serve --model gpt2-medium --host 0.0.0.0
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
      -d '{"model": "gpt2", "prompt": "Alan Turing theorized that", "max_tokens": 20, "temperature": 0}'

OpenAI's completions API (/v1/completions, /v1/models) and, for a model with a chat template (its
own or --chat-template), its chat completions API (/v1/chat/completions), /v1/inspect (attention and the logit
lens of a prompt), llama.cpp's /tokenize and /detokenize, /health and Prometheus' /metrics; and
the playground, a page at / (open http://127.0.0.1:8000/ in a browser). Requests share one
batch: each joins it at the next token and leaves it when it ends. Ctrl-C or SIGTERM stops the
server; requests in flight get an error.
"""


def _add_serve_parser(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (needs the serve extra)",
        description=(
            "Serve a model over HTTP with OpenAI's completions and chat completions APIs, batching "
            "the requests in flight."
        ),
        epilog=SERVE_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    serve.add_argument(
        "--model",
        default="gpt2",
        help="a released name or a local directory, as for generate; "
        "also the model's id in the API, less a trailing slash (default: gpt2)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on; 0.0.0.0 for every interface (default: 127.0.0.1)"
    )
    serve.add_argument("--port", type=_whole_number, default=8000, help="(default: 8000)")
    _add_inference_device_flags(serve)
    _add_cuda_graphs_flag(serve)
    _add_special_as_text_flag(serve, "string prompts and /tokenize's text")
    _add_draft_flags(serve)
    serve.add_argument(
        "--max-batch-size",
        type=_whole_number,
        default=8,
        metavar="N",
        help="requests' rows decoded together; each holds a KV cache of the model's context (default: 8)",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=_whole_number,
        default=512,
        metavar="N",
        help="tokens computed in one step, as vLLM's: prompts go in within it, a long one in chunks over "
        "several steps, so that the streams running keep flowing (default: 512)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=_whole_number,
        default=512,
        metavar="MB",
        help="memory for the KV blocks of prompts kept for later prompts that begin the same way (a shared "
        "system prompt, few-shot examples, a context scored with several endings); the least recently "
        "used go first; 0 keeps none (default: 512)",
    )
    serve.add_argument(
        "--max-queue",
        type=_whole_number,
        default=64,
        metavar="N",
        help="rows that may wait for a place in the batch; past it, requests get 429 (default: 64)",
    )
    serve.add_argument(
        "--max-n",
        type=_whole_number,
        default=16,
        metavar="N",
        help="the largest n (choices) of a request (default: 16)",
    )
    serve.add_argument(
        "--max-inspect-cells",
        type=_whole_number,
        metavar="N",
        help="the most attention probabilities (layers x heads x tokens x tokens) one /v1/inspect answer "
        "holds; about 6.5 bytes each in JSON (default: 4194304, 170 tokens of the 124M model)",
    )
    serve.add_argument(
        "--max-patching-tokens",
        type=_whole_number,
        metavar="N",
        help="the most tokens one /v1/circuits/patching request runs through the model, a run of the whole "
        "text per patched activation (default: 16384: the 124M model's resid_pre grid up to 36 tokens)",
    )
    serve.add_argument("--no-ui", action="store_true", help="serve the API alone, without the playground page at /")
    _add_chat_template_flag(serve, "/v1/chat/completions' conversations")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("GPT2_API_KEY"),
        metavar="KEY",
        help="require the header Authorization: Bearer KEY (default: $GPT2_API_KEY, else none)",
    )
    serve.set_defaults(func=_cmd_serve, engine="torch")


def _add_chat_template_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help=f"a Jinja2 chat template that renders {what}, in place of the model's own (its "
        "tokenizer_config.json's chat_template) (default: the model's)",
    )


CHAT_EXAMPLES = """\
examples:
  gpt2 chat --model out-chat                       # a model fine-tuned on conversations
  gpt2 chat --model gpt2 --chat-template src/gpt2/tokenizer/chat_template.jinja --system "You are terse."
  printf 'Hi\\nWhat is 2+2?\\n' | gpt2 chat --model out-chat --temperature 0

Each line is a message; the reply streams as it is generated and joins the conversation.
/reset starts over (the --system message stays). Ctrl-C stops a reply (it is not kept) and
returns to the prompt; at the prompt, Ctrl-D (or the end of piped input) leaves. When the
conversation and a reply of --max-new-tokens no longer fit the model's context, its oldest
messages are left out, saying so on stderr.
"""


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """--temperature, --top-k and --top-p, as generate and chat sample (`_with_top_k` gives --top-k's default)."""
    parser.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help=f"0 is greedy; higher is more random (default: {TEMPERATURE})",
    )
    parser.add_argument(
        "--top-k",
        type=_whole_number,
        default=None,
        help=f"sample among the k most likely tokens (default: {TOP_K}, or the vocabulary size if smaller)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample among the most likely tokens that make up p of the probability (default: off)",
    )


def _with_top_k(sampling, model):
    """`sampling` with --top-k's default where it was not given: TOP_K, clamped to the model's vocabulary."""
    return (
        sampling
        if sampling.top_k is not None
        else dataclasses.replace(sampling, top_k=min(TOP_K, model.config.n_vocab))
    )


def _add_chat_parser(commands) -> None:
    chat = commands.add_parser(
        "chat",
        help="a conversation with a model in the terminal, through its chat template",
        description="Talk with a model: each message and the conversation before it are rendered by the chat "
        "template, and the reply streams as it is generated.",
        epilog=CHAT_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    chat.add_argument(
        "--model", default="gpt2", help="a released name or a local directory, as for generate (default: gpt2)"
    )
    _add_chat_template_flag(chat, "the conversation")
    chat.add_argument("--system", metavar="TEXT", help="a system message that opens the conversation (default: none)")
    chat.add_argument(
        "--max-new-tokens",
        type=_whole_number,
        default=None,
        help=f"the longest reply, in tokens (default: {CHAT_MAX_NEW_TOKENS}, or half the model's context if less)",
    )
    _add_sampling_flags(chat)
    chat.add_argument(
        "--seed",
        type=_whole_number,
        default=None,
        help="0 to 2**64-1: reply k samples from seed + k, so the same seed and messages give the same "
        "conversation (default: random)",
    )
    _add_inference_device_flags(chat)
    _add_cuda_graphs_flag(chat)
    chat.set_defaults(func=_cmd_chat, engine="torch")


def _add_eval_parser(commands) -> None:
    from gpt2.evaluation.tasks import TASKS

    ev = commands.add_parser(
        "eval",
        help="loss and perplexity of a text, or a zero-shot benchmark (lambada, hellaswag, wikitext2)",
        description="How well a model predicts a text (loss, perplexity, bits per byte), or its score on a benchmark.",
        epilog=EVAL_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    ev.add_argument(
        "file", nargs="?", metavar="FILE", help="a UTF-8 text file, tokenized as one stream with the model's tokenizer"
    )
    ev.add_argument("--model", default="gpt2", help="a released name or a model directory (default: gpt2)")
    ev.add_argument(
        "--data",
        metavar="PATH",
        help="without --task: a directory gpt2 prepare wrote (its val.bin or val shards), "
        "or llm.c's token files; "
        "with --task: the task's own file instead of the download",
    )
    ev.add_argument("--task", choices=TASKS, help="a benchmark instead of a text")
    ev.add_argument("--context", type=_whole_number, metavar="N", help="ids in a window (default: the model's context)")
    ev.add_argument(
        "--stride", type=_whole_number, metavar="S", help="ids a window moves by (default: half the context)"
    )
    ev.add_argument(
        "--batch-size", type=_whole_number, default=8, metavar="B", help="windows or examples at a time (default: 8)"
    )
    ev.add_argument(
        "--limit", type=_whole_number, metavar="K", help="only the first K examples of a task (wikitext2: rows)"
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    _add_inference_device_flags(ev)
    _add_no_progress_flag(ev)
    ev.set_defaults(func=_cmd_eval, engine="torch", cuda_graphs=False)


def _add_train_parser(commands) -> None:
    train = commands.add_parser(
        "train",
        help="train or fine-tune a model on data prepared with gpt2 prepare",
        description="Train a GPT-2 from scratch, or fine-tune one (--init), on prepared data. OUT receives the "
        "model of the best validation loss, log.jsonl, loss.png and checkpoint.pt (for --resume).",
        epilog=TRAIN_EXAMPLES,
        formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS,  # only the flags given reach train(): a resume tells them apart
    )
    d = TrainSettings  # the defaults, shown in the help
    train.add_argument(
        "--recipe",
        metavar="FILE|NAME",
        help="settings from a TOML file whose keys are the flags' names (max_iters = 2000), or one of "
        "gpt2's recipes by name (shakespeare_char, ...); flags given override it",
    )
    train.add_argument(
        "--out", help="the run's directory: the best model, log, plot and checkpoint (required, here or in the recipe)"
    )
    train.add_argument(
        "--data", help="a directory gpt2 prepare wrote (or nanoGPT's train.bin/val.bin, or llm.c's .bin files)"
    )
    train.add_argument(
        "--resume", action="store_true", default=False, help="continue the run in OUT, with its settings"
    )
    train.add_argument(
        "--overwrite", action="store_true", default=False, help="start a new run in an OUT that holds one"
    )
    model = train.add_argument_group("model from scratch (the vocabulary comes from the data)")
    model.add_argument("--config", choices=list(PRESETS), help="a released size's shape")
    for name, help_text in (
        ("--n-layer", "blocks (default: 12)"),
        ("--n-head", "attention heads (default: 12)"),
        ("--n-embd", "width (default: 768)"),
        ("--block-size", "context of the training windows (default: 1024)"),
    ):
        model.add_argument(name, type=_whole_number, help=help_text)
    model.add_argument("--dropout", type=float, help="(default: 0.0)")
    model.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        help="biases in linear layers and LayerNorms (default: on with --config, as GPT-2; off otherwise, as nanoGPT)",
    )
    model.add_argument("--positions", choices=POSITIONS, help="(default: learned)")
    model.add_argument(
        "--activation",
        choices=ACTIVATIONS,
        help=(
            "the MLP's GELU: tanh approximation or exact (default: gelu_tanh with --config, as GPT-2; gelu "
            "otherwise, as nanoGPT)"
        ),
    )
    model.add_argument("--init", help="fine-tune this model: a released name or a model directory")
    model.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="recompute activations in backward: less memory, more compute",
    )
    optim = train.add_argument_group("optimisation (AdamW or Muon, linear warm-up then cosine decay)")
    for name, kind in (
        ("--batch-size", _whole_number),
        ("--grad-accum", _whole_number),
        ("--max-iters", _whole_number),
        ("--lr", float),
        ("--min-lr", float),
        ("--warmup-iters", _whole_number),
        ("--lr-decay-iters", _whole_number),
        ("--weight-decay", float),
        ("--beta1", float),
        ("--beta2", float),
        ("--grad-clip", float),
        ("--seed", _whole_number),
    ):
        default = getattr(d, name[2:].replace("-", "_"))
        optim.add_argument(name, type=kind, help=f"(default: {'max-iters' if default is None else default})")
    optim.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        help="adamw, or muon: Muon for the blocks' matrices, AdamW for the rest (default: adamw)",
    )
    optim.add_argument(
        "--muon-lr",
        type=float,
        help=f"with --optimizer muon: the peak learning rate of Muon's matrices (default: {MUON_LR})",
    )
    run = train.add_argument_group("evaluation, devices, output")
    for name in ("--eval-interval", "--eval-iters", "--log-interval"):
        run.add_argument(name, type=_whole_number, help=f"(default: {getattr(d, name[2:].replace('-', '_'))})")
    run.add_argument("--device", help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps (default: auto)")
    run.add_argument(
        "--dtype",
        choices=TRAINING_DTYPES,
        help="compute dtype (default: auto: bfloat16 on CUDA, float16 on older GPUs, float32 elsewhere)",
    )
    run.add_argument("--compile", choices=COMPILE_MODES, help="torch.compile the model (default: auto: on CUDA only)")
    _add_threads_flag(run)
    run.add_argument("--sample-prompt", metavar="TEXT", help="print a continuation of TEXT at each evaluation")
    run.add_argument(
        "--eval-task",
        choices=EVAL_TASKS,
        help="a benchmark scored at each evaluation too (GPT-2's BPE tokens): logged, printed and plotted",
    )
    run.add_argument(
        "--eval-task-limit", type=_whole_number, metavar="N", help="only its first N examples (default: all)"
    )
    run.add_argument(
        "--eval-task-data",
        metavar="PATH",
        help="its file, as gpt2 eval --data takes it (default: the download, cached)",
    )
    _add_no_progress_flag(run)
    logs = train.add_argument_group("logging (each record of OUT/log.jsonl, also to)")
    logs.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="Weights & Biases, in this project (WANDB_MODE=offline: offline); pip install 'gpt2[wandb]'",
    )
    logs.add_argument("--wandb-run-name", metavar="NAME", help="the run's name in W&B (default: one W&B makes up)")
    logs.add_argument(
        "--tensorboard", metavar="DIR", help="TensorBoard's event files, in DIR; pip install 'gpt2[tensorboard]'"
    )
    procs = train.add_argument_group("several processes (start with torchrun --nproc_per_node N -m gpt2 train ...)")
    procs.add_argument(
        "--fsdp", action="store_true", help="shard weights, gradients and optimizer state over the processes (FSDP2)"
    )
    procs.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"how long a process waits for the others before stopping with an error (default: {d.timeout:g})",
    )
    train.set_defaults(func=_cmd_train)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpt2", description="GPT-2 from scratch.", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpt2 {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    _add_tokenize_parser(commands)
    _add_generate_parser(commands)
    _add_prepare_parser(commands)
    _add_train_parser(commands)
    _add_eval_parser(commands)
    _add_serve_parser(commands)
    _add_chat_parser(commands)
    _add_inspect_parser(commands)
    _add_export_parser(commands)
    _add_references(parser, commands)
    return parser


EXPORT_EXAMPLES = """\
examples:
  gpt2 export --format onnx --model out-char --out out-char-onnx     # model.onnx with the KV cache, for ONNX Runtime
  gpt2 export --format onnx --model gpt2 --out gpt2-onnx-int8 --quantize int8
  gpt2 export --format gguf --model gpt2 --out gpt2.gguf --dtype q8_0  # for llama.cpp
"""


def _add_export_parser(commands) -> None:
    export = commands.add_parser(
        "export",
        help="write a model as ONNX (ONNX Runtime, transformers.js) or GGUF (llama.cpp)",
        description=(
            "Write a model where GPT-2 is deployed: ONNX with the KV cache (optimum's names), or GGUF "
            "(llama.cpp's gpt2)."
        ),
        epilog=EXPORT_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    export.add_argument("--format", required=True, choices=["onnx", "gguf"], help="onnx: a directory; gguf: one file")
    export.add_argument("--model", default="gpt2", help="a released name or a model directory (default: gpt2)")
    export.add_argument("--out", required=True, metavar="PATH", help="onnx: a new directory; gguf: a .gguf file")
    export.add_argument(
        "--quantize", choices=["int8"], help="onnx: ONNX Runtime's dynamic int8 quantization (default: none)"
    )
    export.add_argument("--dtype", choices=["f32", "f16", "q8_0"], help="gguf: the weights' type (default: f32)")
    export.set_defaults(func=_cmd_export, engine="torch", device="cpu", cuda_graphs=False)


def _cmd_export(args: argparse.Namespace) -> int:
    if args.format == "onnx" and args.dtype is not None:
        raise _UsageError(
            f"--dtype {args.dtype} is a GGUF type: an ONNX export is float32, or int8 with --quantize int8"
        )
    if args.format == "gguf" and args.quantize is not None:
        raise _UsageError("--quantize is ONNX Runtime's: a GGUF export takes --dtype f32, f16 or q8_0")
    from gpt2.model.model import GPT2

    model = GPT2.from_pretrained(args.model, device="cpu", dtype="float32")
    started = time.perf_counter()
    if args.format == "onnx":
        from gpt2.export.onnx import export_onnx

        out = export_onnx(model, args.out, quantize=args.quantize)
    else:
        from gpt2.export.gguf import export_gguf

        out = export_gguf(model, args.out, dtype=args.dtype or "f32")
    print(f"gpt2: wrote {out} ({args.format}) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _add_tokenize_parser(commands) -> None:
    tokenize = commands.add_parser(
        "tokenize",
        help="text to GPT-2 token ids, or ids to text",
        description="Print the GPT-2 token ids of a text (or, with --decode, the text of ids).",
        epilog=TOKENIZE_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    tokenize.add_argument(
        "input", nargs="*", help="the text (words are joined by spaces), token ids with --decode, or - for stdin"
    )
    tokenize.add_argument("--decode", action="store_true", help="the input is token ids: print their text")
    tokenize.add_argument("--count", action="store_true", help="print only the number of tokens")
    tokenize.add_argument(
        "--allow-special", action="store_true", help="encode the text <|endoftext|> as the special token 50256"
    )
    tokenize.set_defaults(func=_cmd_tokenize)


def _add_generate_parser(commands) -> None:
    generate = commands.add_parser(
        "generate",
        help="continue a prompt with GPT-2, streaming the text",
        description="Continue a prompt with GPT-2. The text streams as it is generated; a summary goes to stderr.",
        epilog=GENERATE_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    generate.add_argument("prompt", nargs="?", help="the prompt, or - to read it from standard input")
    generate.add_argument(
        "--model",
        default="gpt2",
        help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (downloaded once), "
        "shakespeare_char (shipped: a small model of Shakespeare's characters, offline), "
        "or a local directory (Hugging Face's or OpenAI's release) (default: gpt2)",
    )
    generate.add_argument(
        "--max-new-tokens",
        type=_whole_number,
        default=MAX_NEW_TOKENS,
        help=f"tokens to generate (default: {MAX_NEW_TOKENS})",
    )
    _add_sampling_flags(generate)
    generate.add_argument(
        "--seed",
        type=_whole_number,
        default=None,
        help="0 to 2**64-1: the same seed gives the same text; sample i uses seed + i, "
        "as in the Python API and the server (default: random)",
    )
    generate.add_argument("--num-samples", type=_whole_number, default=1, help="continuations to generate (default: 1)")
    generate.add_argument(
        "--stop", action="append", metavar="TEXT", help="end a continuation before this text (repeatable)"
    )
    _add_special_as_text_flag(generate, "the prompt")
    _add_inference_device_flags(generate)
    _add_cuda_graphs_flag(generate)
    generate.add_argument(
        "--engine",
        default="torch",
        choices=["torch", "numpy"],
        help="torch (with a KV cache) or numpy (the reference engine: no cache, slow, for checking) (default: torch)",
    )
    _add_draft_flags(generate)
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
    _add_no_progress_flag(generate)
    generate.set_defaults(func=_cmd_generate)


INSPECT_EXAMPLES = """\
examples:
  gpt2 inspect "The dog chased the cat"               # each token's probability, rank, alternatives
  gpt2 inspect --json "The dog chased the cat"
  gpt2 inspect --png pictures "The dog chased the cat" --temperature 0.7 --top-k 10
  gpt2 inspect --walk "Hello, world"                  # the forward pass, step by step
  gpt2 inspect --heads --repeat 30                    # each head's scores: previous token, duplicate, induction
  gpt2 inspect --experiment ioi --png pictures        # indirect object identification: metrics, pictures
  gpt2 inspect --sae my-sae "The dog chased the cat"  # each token's top features of an SAE saved by SAELens

--png DIR draws, for the text: attention-blockI.png (every head of block I), logit-lens.png (the
token each layer's residual stream predicts at each position) and next-token.png (the
distribution after --position before and after --temperature, --top-k and --top-p); with --heads,
head-scores.png (each head's three scores as layer x head heat maps). The Python
API, gpt2.inspect.trace, records every activation and can patch any of them.
"""


def _add_inspect_parser(commands) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="look inside: each token's probability, the forward pass step by step, pictures",
        description="Run a model on a text and show what it made of each token; or walk through its forward "
        "pass (--walk), or draw its attention, logit lens and next-token distribution (--png).",
        epilog=INSPECT_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    inspect.add_argument("text", nargs="?", help="the text, or - to read it from standard input")
    inspect.add_argument(
        "--model", default="gpt2", help="a released name or a local directory, as for generate (default: gpt2)"
    )
    inspect.add_argument(
        "--top-k",
        type=_whole_number,
        default=5,
        metavar="K",
        help="alternatives shown at each position; in next-token.png, the top-k filter (default: 5)",
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: tokens, ids, logprobs, ranks, top; with --heads, each kind's scores",
    )
    inspect.add_argument(
        "--walk", action="store_true", help="print the forward pass, a line a step: shape, math, values"
    )
    inspect.add_argument(
        "--png",
        metavar="DIR",
        help="draw the pictures into DIR (needs matplotlib: the inspect extra); with --heads, head-scores.png",
    )
    inspect.add_argument(
        "--position",
        type=int,
        default=-1,
        metavar="P",
        help="next-token.png: the position whose next token is drawn, 0-based; -1 the last (default: -1)",
    )
    inspect.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help=f"next-token.png: the temperature applied (default: {TEMPERATURE})",
    )
    inspect.add_argument("--top-p", type=float, default=None, help="next-token.png: the top-p filter (default: off)")
    inspect.add_argument(
        "--heads",
        action="store_true",
        help="score every head: previous-token, duplicate-token and induction, on the text or on --repeat",
    )
    inspect.add_argument(
        "--repeat",
        type=_whole_number,
        metavar="N",
        help="--heads: on N random tokens written twice (seed 0), the standard induction test",
    )
    inspect.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour tokens by surprise: auto does on a terminal without $NO_COLOR (default: auto)",
    )
    _add_inspect_experiment_flag(inspect)
    inspect.add_argument(
        "--corrupted",
        metavar="TEXT",
        help="activation and attribution patching: each activation of --site taken from the text into "
        "this corrupted one (of as many tokens), on the logit difference of --answer and --other",
    )
    inspect.add_argument(
        "--site",
        choices=["resid_pre", "attn_out", "mlp_out", "head"],
        default="resid_pre",
        help="--corrupted: what is patched, a layer and a position at a time, or a head (default: resid_pre)",
    )
    inspect.add_argument(
        "--answer",
        metavar="TOKEN",
        help="--corrupted: the token whose logit counts up (default: the text's next token)",
    )
    inspect.add_argument(
        "--other",
        metavar="TOKEN",
        help="--corrupted: the token whose logit counts down (default: the corrupted text's next token)",
    )
    inspect.add_argument(
        "--sae",
        metavar="DIR",
        help="each token's top --top-k features of the sparse autoencoder SAELens saved in DIR "
        "(cfg.json + sae_weights.safetensors), at its hook: blocks.L.hook_resid_pre and the like",
    )
    _add_inference_device_flags(inspect)
    inspect.set_defaults(func=_cmd_inspect, engine="torch", cuda_graphs=False)


def _add_inspect_experiment_flag(inspect) -> None:
    inspect.add_argument(
        "--experiment",
        choices=["induction", "ioi", "greater-than"],
        help="run a standard experiment on its built-in data instead of a text: induction (head scores "
        "on a repeated random sequence), ioi (Wang et al. 2023's 15 templates), greater-than (Hanna et al. "
        "2023); prints its metrics, and --png draws its patching heat map and attribution bar chart",
    )


def _add_prepare_parser(commands) -> None:
    prepare = commands.add_parser(
        "prepare",
        help="tokenize text files into training data (train.bin, val.bin, meta.json)",
        description=(
            "Tokenize text into DIR: train.bin and val.bin (nanoGPT's format), meta.json and the tokenizer's files."
        ),
        epilog=PREPARE_EXAMPLES,
        formatter_class=_HelpFormatter,
    )
    prepare.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="text files, .jsonl and .parquet files (a document a record), directories (every file beneath), "
        "or - for standard input, or shakespeare (tinyshakespeare, shipped in gpt2); with --chat, JSON Lines "
        "files of conversations",
    )
    prepare.add_argument(
        "--chat",
        action="store_true",
        help='the inputs are conversations, {"messages": [{"role": ..., "content": ...}, ...]} a line: '
        "rendered by a chat template, with train.mask.bin and val.mask.bin marking the replies' tokens",
    )
    prepare.add_argument(
        "--chat-template",
        metavar="FILE",
        help="with --chat: a Jinja2 chat template (transformers' format) (default: gpt2's, User:/Assistant: "
        "turns, each reply ended by <|endoftext|>)",
    )
    prepare.add_argument("--out", required=True, metavar="DIR", help="where to write the prepared data")
    prepare.add_argument(
        "--tokenizer",
        default="gpt2",
        metavar="SPEC",
        help="gpt2 (OpenAI's), char (the corpus's characters) or bpe:N (trained on the corpus) (default: gpt2)",
    )
    prepare.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="share of the tokens (with --chat: of the conversations) kept for validation (default: 0.1)",
    )
    prepare.add_argument(
        "--text-field",
        metavar="NAME",
        help="the field of a .jsonl or .parquet record, or of a dataset's example, that holds its text (default: text)",
    )
    prepare.add_argument(
        "--dataset",
        metavar="NAME",
        help="a Hugging Face dataset (a name on the hub, or a local directory of "
        "data files), streamed: nothing is downloaded whole",
    )
    prepare.add_argument(
        "--dataset-config", metavar="C", help="the dataset's configuration (e.g. sample-10BT for HuggingFaceFW/fineweb)"
    )
    prepare.add_argument(
        "--split", dest="dataset_split", default="train", metavar="S", help="the dataset's split (default: train)"
    )
    prepare.add_argument(
        "--shard-tokens",
        type=_whole_number,
        metavar="N",
        help="write llm.c's shards of N tokens (DIRNAME_val_000000.bin, DIRNAME_train_000001.bin, ...; the "
        "first validates) instead of train.bin and val.bin",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace data already in DIR")
    _add_no_progress_flag(prepare)
    prepare.set_defaults(func=_cmd_prepare)


# Each command's reference, a page in docs/ of gpt2's repository, named at the end of its --help.
REFERENCES = {
    name: f"docs/{name}.md"
    for name in ("tokenize", "generate", "prepare", "train", "eval", "serve", "chat", "inspect", "export")
}


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


def parser_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """The flag that sets each of the library's parameters in one of gpt2's commands: "max_iters" ->
    "--max-iters" (an option's dest is the parameter's name; a `--no-x` switch sets none). Another
    command's flags are none of its business: a model's config.json is no --n-head of generate."""
    chosen = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {
        action.dest: action.option_strings[0]
        for action in chosen._actions
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
        lines.flags = parser_flags(parser, args.command)
        if unknown:  # argparse would point to `gpt2 --help`; the flags are the sub-command's
            raise _UsageError(f"unrecognized arguments: {' '.join(unknown)} (see 'gpt2 {args.command} --help')")
        if getattr(args, "threads", None) is not None:
            from gpt2.devices import set_threads

            set_threads(args.threads)
        return args.func(args)
    except (_UsageError, GPT2Error) as e:
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

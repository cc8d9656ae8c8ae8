"""The flags several commands share, added to their parsers and read from their arguments: the device, the threads,
the sampling, the draft model, the chat template, and the model they load.
"""

from __future__ import annotations

import argparse
import dataclasses

from gpt2.cli.common import UsageError, whole_number
from gpt2.settings import DRAFT_TOKENS, INFERENCE_DTYPES, LOOKUP_MAX, LOOKUP_MIN, TEMPERATURE, TOP_K


def read_sampling(args: argparse.Namespace):
    """The Sampling of --temperature, --top-k and --top-p, made (and so checked) before the model
    loads, as is --seed: all but --top-k's bound, the model's vocabulary, which the library checks
    once it is there. The commands hand it on as it is (`with_top_k` fills in --top-k's default)."""
    from gpt2.generation.sampling import Sampling, check_seed

    if getattr(args, "seed", None) is not None:
        check_seed(args.seed)
    return Sampling(args.temperature, args.top_k, args.top_p)


def check_device(args: argparse.Namespace) -> None:
    """--device and --dtype (and --engine's rule), before the model loads."""
    from gpt2.devices import resolve_device, weight_format
    from gpt2.generation.engines import check_numpy_engine

    if args.engine == "numpy":
        check_numpy_engine(args.device, args.dtype, _flag)
    else:
        weight_format(args.dtype, resolve_device(args.device))


def model_configs(args: argparse.Namespace) -> list:
    """The configurations of --model and --draft-model, read without their weights: a model that is
    not there, or a draft of another vocabulary, fails before anything loads."""
    from gpt2.checkpoints.weights import read_config
    from gpt2.generation.engines import check_draft_config

    configs = [read_config(name) for name in [args.model] + ([] if args.draft is None else [args.draft])]
    if args.draft is not None:
        check_draft_config(*configs)  # its tokenizer once it has loaded
    return configs


def check_cuda_graph_flags(args: argparse.Namespace) -> None:
    if args.cuda_graphs:
        from gpt2.generation.engines import check_cuda_graphs

        check_cuda_graphs(args.device, args.engine, _flag)


def draft_tokens_need_a_draft(args: argparse.Namespace) -> None:
    if args.draft_tokens is not None and args.draft is None and args.speculative is None:
        raise UsageError(
            "--draft-tokens is the number of tokens a draft proposes: give --draft-model or --speculative ngram too"
        )


def draft_tokens_of(args: argparse.Namespace) -> dict[str, int]:
    """--draft-tokens as the library's keyword, where it was given (else the library's default)."""
    return {} if args.draft_tokens is None else {"draft_tokens": args.draft_tokens}


def _flag(setting: str) -> str:
    """A setting's flag, for the library's messages: cuda_graphs -> --cuda-graphs."""
    return "--" + setting.replace("_", "-")


def load_model(args: argparse.Namespace, name: str | None = None, *, needs: str | None):
    """The model (--model, or `name`) and the tokenizer saved with it (GPT-2's for a model of GPT-2's vocabulary).
    A model that comes with no tokenizer (one trained here on a vocabulary of its own) is refused where the command
    reads or writes text, `needs` saying what of it needs one and how to give ids instead; with `needs` None the
    command works on ids, and the tokenizer is None."""
    name = args.model if name is None else name
    if args.engine == "numpy":
        from gpt2.checkpoints.weights import locate
        from gpt2.reference import ReferenceModel

        model, tokenizer = ReferenceModel.load(name), locate(name).load_tokenizer()
    else:
        from gpt2.model.model import GPT2

        model = GPT2.from_pretrained(name, device=args.device, dtype=args.dtype).use_cuda_graphs(args.cuda_graphs)
        tokenizer = model.tokenizer
    if tokenizer is None and needs is not None:
        raise UsageError(
            f"the model {name} comes with no tokenizer (encoder.json + vocab.bpe, or chars.json), "
            f"and its vocabulary of {model.config.n_vocab} ids is not GPT-2's: {needs}"
        )
    return model, tokenizer


def add_ids_flag(parser: argparse.ArgumentParser, what: str, also: str = "") -> None:
    """--ids: the command's text given as token ids, for a model that comes with no tokenizer (or a text tokenized
    already), as `gpt2 tokenize` prints them."""
    parser.add_argument(
        "--ids",
        action="store_true",
        help=f"{what} is token ids, whole numbers separated by spaces or commas, as gpt2 tokenize prints them "
        f'(464,3290 or "464 3290"; - reads them from standard input){also}: for a model that comes with no '
        "tokenizer",
    )


def allowed_special(args: argparse.Namespace) -> frozenset[str] | str:
    """<|endoftext|> in a prompt: the special token, as OpenAI's API reads it, or with --special-as-text its
    characters."""
    return frozenset() if args.special_as_text else "all"


def read_chat_template(args: argparse.Namespace):
    """The template of --chat-template, read and compiled (None without one: the model's own)."""
    if args.chat_template is None:
        return None
    from gpt2.tokenizer.chat import ChatTemplate

    return ChatTemplate.from_file(args.chat_template)


def add_inference_device_flags(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads of the commands that run a model (generate, eval, serve)."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=INFERENCE_DTYPES,
        help="the weights' precision; on the CPU the lower ones are weight-only, the arithmetic float32, "
        "and int8 is the CPU's alone (default: float32)",
    )
    add_threads_flag(parser)


def add_threads_flag(parser) -> None:
    parser.add_argument(
        "--threads",
        type=whole_number,
        metavar="N",
        help="CPU threads for torch (default: one per core, or $OMP_NUM_THREADS); on a busy machine, "
        "fewer than the cores run faster",
    )


def add_no_progress_flag(parser) -> None:
    # default given: train's parser leaves out the flags not given (argument_default=SUPPRESS)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=True, help="no progress bar")


def add_cuda_graphs_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode by replaying CUDA graphs, one launch a token (a CUDA GPU only; experimental: "
        "not yet measured on a GPU, so off by default)",
    )


def add_draft_flags(parser: argparse.ArgumentParser) -> None:
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
        type=whole_number,
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
        type=whole_number,
        default=LOOKUP_MAX,
        metavar="N",
        help=f"--speculative ngram: the longest n-gram matched (default: {LOOKUP_MAX})",
    )
    parser.add_argument(
        "--prompt-lookup-min",
        type=whole_number,
        default=LOOKUP_MIN,
        metavar="N",
        help=f"--speculative ngram: the shortest n-gram matched (default: {LOOKUP_MIN})",
    )


def add_special_as_text_flag(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument(
        "--special-as-text",
        action="store_true",
        help=f"read <|endoftext|> in {where} as ordinary text, not as the end-of-text token 50256 "
        "(the default, as OpenAI's API reads it)",
    )


def add_chat_template_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help=f"a Jinja2 chat template that renders {what}, in place of the model's own (its "
        "tokenizer_config.json's chat_template) (default: the model's)",
    )


def add_model_flag(
    parser: argparse.ArgumentParser, help: str = "a released name or a local directory, as for generate"
) -> None:
    """--model, as every command that runs a model takes it: a released name or a directory (default: gpt2)."""
    parser.add_argument("--model", default="gpt2", help=f"{help} (default: gpt2)")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """--temperature, --top-k and --top-p, as generate and chat sample (`with_top_k` gives --top-k's default)."""
    parser.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help=f"0 is greedy; higher is more random (default: {TEMPERATURE})",
    )
    parser.add_argument(
        "--top-k",
        type=whole_number,
        default=None,
        help=f"sample among the k most likely tokens (default: {TOP_K}, or the vocabulary size if smaller)",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample among the most likely tokens that make up p of the probability (default: off)",
    )


def with_top_k(sampling, model):
    """`sampling` with --top-k's default where it was not given: TOP_K, clamped to the model's vocabulary."""
    return (
        sampling
        if sampling.top_k is not None
        else dataclasses.replace(sampling, top_k=min(TOP_K, model.config.n_vocab))
    )

"""`gpt2 prepare`: text (or conversations, with --chat) tokenized into training data, or synthetic data drawn
(--synthetic)."""

from __future__ import annotations

import argparse
import sys

from gpt2.cli.common import HelpFormatter, UsageError, whole_number
from gpt2.cli.options import add_no_progress_flag


def cmd(args: argparse.Namespace) -> int:
    from gpt2.data.text import prepare

    if args.kind is not None:
        return _prepare_synthetic(args)
    synthetic_only = [flag for flag, value in (("--rows", args.rows), ("--seed", args.seed)) if value is not None]
    if synthetic_only:
        raise UsageError(
            f"{' and '.join(synthetic_only)} appl{'ies' if len(synthetic_only) == 1 else 'y'} to synthetic data "
            f"only: add --synthetic induction"
        )
    args.tokenizer = "gpt2" if args.tokenizer is None else args.tokenizer
    if args.chat:
        return _prepare_chat(args)
    if args.chat_template is not None:
        raise UsageError("--chat-template is the template of conversations: add --chat")
    if not args.inputs and args.dataset is None:
        raise UsageError("give INPUT files or directories, - for standard input, or --dataset NAME")
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
        num_workers=args.num_workers,
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


def _refuse_flags(args: argparse.Namespace, what: str, *flags: tuple[str, object]) -> None:
    """One line naming the flags given (of `flags`, and --split) that do not apply to `what`."""
    given = [flag for flag, value in flags if value is not None]
    if args.dataset_split != "train":
        given.append("--split")
    if given:
        raise UsageError(f"{what}: {', '.join(given)} do{'es' * (len(given) == 1)} not apply")


def _prepare_chat(args: argparse.Namespace) -> int:
    from gpt2.data.chat import prepare_chat

    _refuse_flags(
        args,
        "--chat reads JSON Lines files of conversations into train.bin and val.bin",
        ("--dataset", args.dataset),
        ("--dataset-config", args.dataset_config),
        ("--text-field", args.text_field),
        ("--shard-tokens", args.shard_tokens),
        ("--workers", args.num_workers),
    )
    if not args.inputs:
        raise UsageError('give JSON Lines files of conversations ({"messages": [...]} a line), or - for standard input')
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


def _prepare_synthetic(args: argparse.Namespace) -> int:
    from gpt2.data.synthetic import DEFAULT_ROWS, prepare_synthetic

    _refuse_flags(
        args,
        "--synthetic draws its own rows of token ids (no text, no tokenizer)",
        ("INPUT", args.inputs or None),
        ("--chat", args.chat or None),
        ("--chat-template", args.chat_template),
        ("--tokenizer", args.tokenizer),
        ("--text-field", args.text_field),
        ("--dataset", args.dataset),
        ("--dataset-config", args.dataset_config),
        ("--shard-tokens", args.shard_tokens),
        ("--workers", args.num_workers),
    )
    meta = prepare_synthetic(
        args.out,
        args.kind,
        DEFAULT_ROWS if args.rows is None else args.rows,
        args.val_fraction,
        seed=0 if args.seed is None else args.seed,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    rows, scored = meta["synthetic"]["rows"], meta["mask"]["tokens"]
    print(
        f"gpt2: {rows['train']:,} training and {rows['val']:,} validation rows of {meta['synthetic']['kind']} data "
        f"({meta['train_tokens']:,} and {meta['val_tokens']:,} ids, {scored['train']:,} and "
        f"{scored['val']:,} of them scored; seed {meta['synthetic']['seed']}) of a "
        f"{meta['vocab_size']}-token vocabulary in {args.out}",
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


EXAMPLES = """\
examples:
  gpt2 prepare shakespeare --out data/shakespeare_char --tokenizer char   # tinyshakespeare, shipped in gpt2
  gpt2 prepare books/ notes.txt --out data/mytext                     # GPT-2's tokenizer
  gpt2 prepare corpus/ --out data/corpus-bpe --tokenizer bpe:8192 --val-fraction 0.05
  cat *.txt | gpt2 prepare - --out data/stdin
  gpt2 prepare pages.jsonl --out data/pages --text-field body --shard-tokens 100000000
  gpt2 prepare --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out data/fineweb10B \\
      --shard-tokens 100000000
  gpt2 prepare --chat conversations.jsonl --out data/chat            # {"messages": [...]} a line
  gpt2 prepare --out data/induction_2l --synthetic induction         # for gpt2 train --recipe induction_2l

Each text file is one document, and each record of a .jsonl or .parquet file or a dataset; with
gpt2 and bpe:N each ends with <|endoftext|> (in shards each starts with it, as llm.c's). One file
splits at 1 - F of its tokens (as nanoGPT's shakespeare_char); several split by whole files,
drawn with a fixed seed, the last of them cut so that validation holds F of the tokens. With
--shard-tokens the first shard validates, as llm.c's fineweb.py. With --chat, whole
conversations validate, F of them, drawn with a fixed seed. With --synthetic, the last F of the
rows validate.
"""


def add_parser(commands) -> None:
    prepare = commands.add_parser(
        "prepare",
        help="tokenize text files into training data (train.bin, val.bin, meta.json)",
        description=(
            "Tokenize text into DIR: train.bin and val.bin (nanoGPT's format), meta.json and the tokenizer's files; "
            "or draw synthetic data there (--synthetic)."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
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
    prepare.add_argument(
        "--synthetic",
        dest="kind",
        metavar="KIND",
        help="draw synthetic data instead of reading inputs: induction (random tokens with a stretch written twice, "
        "and runs of tokens, a row of 65 ids each, with train.mask.bin and val.mask.bin marking the ids "
        "copying predicts: the data of recipes/induction_2l.toml)",
    )
    prepare.add_argument(
        "--rows",
        type=whole_number,
        metavar="N",
        help="with --synthetic: how many rows to draw (default: 144000)",
    )
    prepare.add_argument(
        "--seed",
        type=whole_number,
        metavar="N",
        help="with --synthetic: the seed the rows are drawn with; the same seed, the same data (default: 0)",
    )
    prepare.add_argument("--out", required=True, metavar="DIR", help="where to write the prepared data")
    prepare.add_argument(
        "--tokenizer",
        metavar="SPEC",
        help="gpt2 (OpenAI's), char (the corpus's characters) or bpe:N (trained on the corpus) (default: gpt2)",
    )
    prepare.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="share of the tokens (with --chat: of the conversations; with --synthetic: of the rows) kept for "
        "validation (default: 0.1)",
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
        type=whole_number,
        metavar="N",
        help="write llm.c's shards of N tokens (DIRNAME_val_000000.bin, DIRNAME_train_000001.bin, ...; the "
        "first validates) instead of train.bin and val.bin",
    )
    prepare.add_argument(
        "--workers",
        dest="num_workers",
        type=whole_number,
        metavar="N",
        help="processes that encode the text, this one reading and writing while they do "
        "(default: one per core; 1: encode here, no other process)",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace data already in DIR")
    add_no_progress_flag(prepare)
    prepare.set_defaults(func=cmd)

"""`gpt2 eval`: a text's loss and perplexity, or a benchmark's score."""

from __future__ import annotations

import argparse

from gpt2.cli.common import HelpFormatter, UsageError, command_line_text, whole_number
from gpt2.cli.options import add_inference_device_flags, add_model_flag, add_no_progress_flag, check_device, load_model


def cmd(args: argparse.Namespace) -> int:
    import json

    from gpt2.evaluation import evaluate

    if args.task is None and (args.file is None) == (args.data is None):
        raise UsageError(
            "give one thing to evaluate: a text FILE, --data DIR (a prepared directory's val.bin), or --task NAME"
        )
    if args.task is not None and args.file is not None:
        raise UsageError(f"give a FILE or --task, not both (a file of {args.task}'s own goes in --data)")
    if args.task is None and args.limit is not None:
        raise UsageError("--limit counts the examples of a --task; a text is scored whole")
    file = None if args.file is None else command_line_text(args.file, "FILE")
    data = _check_eval_args(args, file)
    model, tokenizer = load_model(args, needs=_needs_text(args))
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


def _needs_text(args: argparse.Namespace) -> str | None:
    """What of the evaluation needs the model's tokenizer: a text FILE and a task's texts; a prepared directory is
    ids (None: nothing)."""
    if args.task is not None:
        return f"--task {args.task}'s texts need one"
    if args.file is not None:
        return (
            "a text FILE needs one; give its ids instead, a directory prepared with the model's vocabulary (--data DIR)"
        )
    return None


def _check_eval_args(args: argparse.Namespace, file: str | None):
    """What can be checked before the model loads: all but --context's bound, the model's context.
    Returns the --data directory opened (every id checked, once), where that is what is scored."""
    from pathlib import Path

    from gpt2._checks import check_batch_size
    from gpt2._files import check_file
    from gpt2.data.files import open_data
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
    check_device(args)
    return data


EXAMPLES = """\
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


def add_parser(commands) -> None:
    from gpt2.evaluation.tasks import TASKS

    ev = commands.add_parser(
        "eval",
        help="loss and perplexity of a text, or a zero-shot benchmark (lambada, hellaswag, wikitext2)",
        description="How well a model predicts a text (loss, perplexity, bits per byte), or its score on a benchmark.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    ev.add_argument(
        "file", nargs="?", metavar="FILE", help="a UTF-8 text file, tokenized as one stream with the model's tokenizer"
    )
    add_model_flag(ev, "a released name or a model directory")
    ev.add_argument(
        "--data",
        metavar="PATH",
        help="without --task: a directory gpt2 prepare wrote (its val.bin or val shards), "
        "or llm.c's token files; "
        "with --task: the task's own file instead of the download",
    )
    ev.add_argument("--task", choices=TASKS, help="a benchmark instead of a text")
    ev.add_argument("--context", type=whole_number, metavar="N", help="ids in a window (default: the model's context)")
    ev.add_argument(
        "--stride", type=whole_number, metavar="S", help="ids a window moves by (default: half the context)"
    )
    ev.add_argument(
        "--batch-size", type=whole_number, default=8, metavar="B", help="windows or examples at a time (default: 8)"
    )
    ev.add_argument(
        "--limit", type=whole_number, metavar="K", help="only the first K examples of a task (wikitext2: rows)"
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    add_inference_device_flags(ev)
    add_no_progress_flag(ev)
    ev.set_defaults(func=cmd, engine="torch", cuda_graphs=False)

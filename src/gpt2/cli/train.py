"""`gpt2 train`: a training run, from flags or a recipe, on one process or under torchrun."""

from __future__ import annotations

import argparse
import sys

from gpt2.checkpoints.config import ACTIVATIONS, POSITIONS, PRESETS
from gpt2.cli.common import HelpFormatter, UsageError, whole_number
from gpt2.cli.options import add_no_progress_flag, add_threads_flag
from gpt2.settings import COMPILE_MODES, EVAL_TASKS, MUON_LR, OPTIMIZERS, TRAINING_DTYPES, TrainSettings, read_recipe


def cmd(args: argparse.Namespace) -> int:
    from gpt2.training.stopping import ignore_late_signals
    from gpt2.training.train import train

    given = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "func", "flags", "recipe", "resume", "overwrite", "auto_resume", "progress", "threads")
    }
    options = {**(read_recipe(args.recipe) if "recipe" in args else {}), **given}  # the flags given override the recipe
    if "out" not in options:
        raise UsageError("the following arguments are required: --out (or out in the recipe)")
    out = options.pop("out")
    result = train(
        out,
        resume=args.resume,
        overwrite=args.overwrite,
        auto_resume=args.auto_resume,
        progress=args.progress,
        **options,
    )
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


EXAMPLES = """\
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


def add_parser(commands) -> None:
    train = commands.add_parser(
        "train",
        help="train or fine-tune a model on data prepared with gpt2 prepare",
        description="Train a GPT-2 from scratch, or fine-tune one (--init), on prepared data. OUT receives the "
        "model of the best validation loss, log.jsonl, loss.png and checkpoint.pt (for --resume).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
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
        model.add_argument(name, type=whole_number, help=help_text)
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
        ("--batch-size", whole_number),
        ("--grad-accum", whole_number),
        ("--max-iters", whole_number),
        ("--lr", float),
        ("--min-lr", float),
        ("--warmup-iters", whole_number),
        ("--lr-decay-iters", whole_number),
        ("--weight-decay", float),
        ("--beta1", float),
        ("--beta2", float),
        ("--grad-clip", float),
        ("--seed", whole_number),
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
        run.add_argument(name, type=whole_number, help=f"(default: {getattr(d, name[2:].replace('-', '_'))})")
    run.add_argument("--device", help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps (default: auto)")
    run.add_argument(
        "--dtype",
        choices=TRAINING_DTYPES,
        help="compute dtype (default: auto: bfloat16 on CUDA, float16 on older GPUs, float32 elsewhere)",
    )
    run.add_argument("--compile", choices=COMPILE_MODES, help="torch.compile the model (default: auto: on CUDA only)")
    add_threads_flag(run)
    run.add_argument("--sample-prompt", metavar="TEXT", help="print a continuation of TEXT at each evaluation")
    run.add_argument(
        "--probe",
        metavar="TEXT",
        help="at each evaluation, record what the model does with TEXT (attention, head scores, logit lens, a sample) "
        "in OUT/probes.jsonl, for gpt2 serve --runs (default: --probe-repeat's random tokens)",
    )
    run.add_argument(
        "--probe-repeat",
        type=whole_number,
        metavar="N",
        help="without --probe, probe with N random tokens written twice (the induction test); 0: no probes "
        "(default: 16)",
    )
    run.add_argument(
        "--probe-interval",
        type=whole_number,
        metavar="N",
        help="probe every N iterations (default: at each evaluation)",
    )
    run.add_argument(
        "--eval-task",
        choices=EVAL_TASKS,
        help="a benchmark scored at each evaluation too (GPT-2's BPE tokens): logged, printed and plotted",
    )
    run.add_argument(
        "--eval-task-limit", type=whole_number, metavar="N", help="only its first N examples (default: all)"
    )
    run.add_argument(
        "--eval-task-data",
        metavar="PATH",
        help="its file, as gpt2 eval --data takes it (default: the download, cached)",
    )
    add_no_progress_flag(run)
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
        "--auto-resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="continue the run in OUT if this torchrun job (its --rdzv-id) started it: what workers torchrun "
        "restarts (--max-restarts) do after a node is lost, with the command that started them; another job's "
        "run is refused as ever (default: on under torchrun)",
    )
    procs.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"how long a process waits for the others before stopping with an error (default: {d.timeout:g})",
    )
    train.set_defaults(func=cmd)

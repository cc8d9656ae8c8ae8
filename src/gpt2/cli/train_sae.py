"""`gpt2 train-sae`: an SAE on a site of a model, or a transcoder for each of its blocks' MLPs, trained on the
model's activations over a prepared dataset (gpt2.inspect.dictionary_training), saved in SAELens's format (and
circuit-tracer's, for transcoders)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt2.cli.common import HelpFormatter, UsageError, whole_number
from gpt2.cli.options import add_model_flag, check_device, load_model

EXAMPLES = """\
examples:
  gpt2 train-sae --model out --data data/shakespeare --site blocks.1.hook_resid_mid --out sae-1
  gpt2 train-sae --model out --data data/shakespeare --site h.1 --architecture topk --k 32 --out sae-topk
  gpt2 train-sae --model induction --data data/induction --transcoders --architecture jumprelu --out tc
      # a transcoder per block (ln_2's output -> the MLP's output), for gpt2 inspect --graph

Each evaluation (--eval-interval) prints, per dictionary: L0 (features firing a position), explained
variance, the cross-entropy recovered with it spliced into the model, and dead features; DIR/training.json
keeps them all. DIR/saelens/ loads in SAELens (SAE.load_from_disk) and gpt2 inspect --sae;
DIR/circuit-tracer/ (relu or JumpReLU transcoders) in circuit-tracer and gpt2 inspect --graph.
"""


def add_parser(commands) -> None:
    train = commands.add_parser(
        "train-sae",
        help="train an SAE, or a transcoder per block, on a model's activations",
        description="Train a sparse autoencoder on one site of a model, or a transcoder for each block's MLP, on "
        "the model's activations as it reads a prepared dataset (streamed: nothing is cached on disk), with "
        "SAELens's losses; saved in SAELens's format and, for transcoders, circuit-tracer's.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_model_flag(train, "the model whose activations are read")
    train.add_argument("--data", required=True, metavar="DIR", help="a dataset gpt2 prepare wrote, in the model's ids")
    what = train.add_mutually_exclusive_group(required=True)
    what.add_argument("--site", help="an SAE on this step: gpt2's name (h.1.resid_mid) or TransformerLens's")
    what.add_argument("--transcoders", action="store_true", help="a transcoder per block, its MLP's input to output")
    train.add_argument("--out", required=True, metavar="DIR", help="a new directory for the dictionaries")
    train.add_argument(
        "--architecture",
        choices=["standard", "jumprelu", "topk"],
        default="standard",
        help="relu with an L1 penalty, JumpReLU with an L0 penalty, or the k largest (default: standard)",
    )
    train.add_argument("--expansion", type=whole_number, default=8, help="features per channel (default: 8)")
    train.add_argument("--k", type=whole_number, default=32, help="topk: features a position (default: 32)")
    train.add_argument("--l1", type=float, default=5.0, help="standard: the L1 coefficient (default: 5.0)")
    train.add_argument("--l0", type=float, default=1.0, help="jumprelu: the L0 coefficient (default: 1.0)")
    train.add_argument("--skip", action="store_true", help="--transcoders: with a skip connection (x @ W_skip.T)")
    train.add_argument("--steps", type=whole_number, default=2000, help="training steps (default: 2000)")
    train.add_argument("--batch-size", type=whole_number, default=4096, help="positions a step (default: 4096)")
    train.add_argument("--lr", type=float, default=3e-4, help="Adam's learning rate (default: 3e-4)")
    train.add_argument("--context", type=whole_number, default=128, help="positions a window (default: 128)")
    train.add_argument("--eval-interval", type=whole_number, default=500, help="steps between evaluations")
    train.add_argument("--seed", type=whole_number, default=0, help="the windows' and weights' seed (default: 0)")
    train.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: auto)")
    train.add_argument("--threads", type=whole_number, default=None, help="torch's CPU threads (default: torch's)")
    train.set_defaults(func=cmd, engine="torch", dtype="float32", cuda_graphs=False)


def cmd(args: argparse.Namespace) -> int:
    from gpt2._files import writable_directory
    from gpt2.inspect.dictionaries import DictionaryConfig
    from gpt2.inspect.dictionary_training import TrainingSettings, train_dictionaries, transcoder_sites

    if args.skip and not args.transcoders:
        raise UsageError("--skip is a transcoder's: give --transcoders")
    settings = TrainingSettings(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        context=args.context,
        eval_interval=min(args.eval_interval, args.steps),
        seed=args.seed,
    )
    check_device(args)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):  # found now, not after the training
        raise UsageError(f"--out {out} already exists: give a new directory")
    writable_directory(out.absolute().parent)
    model, _ = load_model(args, needs=None)
    C = model.config.n_embd
    config = DictionaryConfig(
        args.architecture,
        d_in=C,
        d_dict=args.expansion * C,
        k=args.k,
        l1_coefficient=args.l1,
        l0_coefficient=args.l0,
        skip=args.skip,
        d_out=C if args.transcoders else None,
    )
    sites = transcoder_sites(model.config.n_layer) if args.transcoders else [(args.site, args.site)]
    run = train_dictionaries(model, args.data, sites, config, settings, progress=sys.stderr.isatty(), report=_report)
    out = run.save(out)
    print(f"gpt2: wrote {out} in {run.seconds:.1f} s of training", file=sys.stderr)
    return 0


def _report(metrics: dict) -> None:
    """An evaluation's lines, one per dictionary, as it comes."""
    for d in metrics["dictionaries"]:
        print(
            f"step {metrics['step']:>6}  {d['sites'][0]} -> {d['sites'][1]}: L0 {d['l0']:.1f}, explained variance "
            f"{d['explained_variance']:.3f}, CE recovered {d['ce_recovered']:.3f} ({d['ce_clean']:.3f} clean, "
            f"{d['ce_spliced']:.3f} spliced, {d['ce_zero']:.3f} zeroed), dead {d['dead']}/{d['d_dict']}",
            flush=True,
        )

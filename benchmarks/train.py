"""Training speed and quality against nanoGPT, run from ../shared/anchors/nanoGPT in the same run.

    .venv/bin/python benchmarks/train.py [--only shakespeare,124m,ddp,gpu,muon] [--iters N] [--quick]

1. nanoGPT's CPU recipe for shakespeare_char (its README): 4 layers, 4 heads, 128 wide, block
   64, batch 12, 2000 iterations, lr 1e-3 to 1e-4, warm-up 100, beta2 0.99, dropout 0, an
   evaluation every 250 iterations over 20 batches. Both prepare tinyshakespeare their own way
   (nanoGPT's prepare.py, `gpt2 prepare --tokenizer char`) and run as their users run them:
   nanoGPT's train.py, `gpt2 train`. Reported: wall time of the whole run, median ms per
   iteration, and the final validation loss (each its own 20-batch estimate).
2. The 124M shape on the CPU, batch 4 x 256, AdamW, random ids: tokens/s (median over the
   timed iterations) and the process's peak memory, each trainer in a process of its own.
   nanoGPT uses its default vocabulary for GPT-2 data (50304, padded), gpt2 GPT-2's own (50257).
3. DDP on the CPU (gloo): `torchrun --nproc_per_node 2 -m gpt2 train` against `gpt2 train` in
   one process, the same global batch (grad_accum 2: one micro-batch a process), for the
   shakespeare_char shape and the 124M one. On a 2-core machine the one process has 2 threads
   and each of the two 1, so this measures what the split and the gradient all-reduce cost.
   (nanoGPT's train.py runs DDP on CUDA only: it puts each process on cuda:LOCAL_RANK.)
4. One GPU (run where CUDA is; skipped elsewhere): the 124M shape, batch 16 x 1024, bfloat16
   autocast, fused AdamW, eager and compiled, as section 2 runs it, plus MFU against the GPU's
   dense bfloat16 peak and the peak GPU memory of each.

5. Muon against AdamW (`--optimizer muon`): section 1's recipe trained by `gpt2 train` with each,
   evaluated every 50 iterations: the validation loss of each at equal iterations, and the
   iterations and training time (the steps' summed ms) each needs to reach nanoGPT's final
   validation loss of section 1 (run in the same invocation; with `--only muon`, AdamW's own
   final loss). Muon at its default lr, MUON_LR, tuned on this recipe (docs/train.md). Also section 2's 124M
   shape: ms per iteration with each optimizer.

`--quick`: a smoke run of every section (a few iterations), to check that the script works.

nanoGPT is run in place from a scratch directory that links to its files (its train.py reads
configurator.py and data/ from the working directory); nothing of it is copied into the project.
Needs ../shared (the anchors and tinyshakespeare). Run it on a quiet machine: both share the
same 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import print_table

from gpt2.checkpoints.config import GPT2Config
from gpt2.devices import peak_flops
from gpt2.examples import corpus_text
from gpt2.model.model import GPT2
from gpt2.settings import MUON_LR
from gpt2.training.loggers import read_log
from gpt2.training.plan import flops_per_token

REPO = Path(__file__).resolve().parents[1]
ANCHOR = REPO.parent / "shared" / "anchors" / "nanoGPT"

RECIPE = dict(
    n_layer=4,
    n_head=4,
    n_embd=128,
    block_size=64,
    batch_size=12,
    max_iters=2000,
    lr_decay_iters=2000,
    min_lr=1e-4,
    warmup_iters=100,
    beta2=0.99,
    dropout=0.0,
    eval_interval=250,
    eval_iters=20,
    log_interval=1,
)
NANOGPT_NAMES = {"lr": "learning_rate", "grad_accum": "gradient_accumulation_steps"}
GPT2_CPU_124M = dict(n_layer=12, n_head=12, n_embd=768, block_size=256, batch_size=4, grad_accum=1, dropout=0.0)


def nanogpt_workdir(root: Path) -> Path:
    """A directory from which nanoGPT's train.py runs unchanged: links to its files, our data."""
    work = root / "nanogpt"
    (work / "data").mkdir(parents=True)
    for name in ("train.py", "model.py", "configurator.py", "config"):
        (work / name).symlink_to(ANCHOR / name)
    return work


def run_timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed:\n{result.stderr[-3000:]}")
    return elapsed, result.stdout + result.stderr


def shakespeare(root: Path, iters: int) -> list[list[str]]:
    recipe = dict(RECIPE, max_iters=iters, lr_decay_iters=iters)
    # nanoGPT: its prepare.py, run from a linked copy so that its outputs land in the scratch directory
    work = nanogpt_workdir(root)
    data = work / "data" / "shakespeare_char"
    data.mkdir()
    (data / "prepare.py").symlink_to(ANCHOR / "data" / "shakespeare_char" / "prepare.py")
    (data / "input.txt").write_text(corpus_text("shakespeare"), encoding="utf-8")  # the corpus gpt2 ships
    run_timed([sys.executable, str(data / "prepare.py")], cwd=work)
    flags = [f"--{NANOGPT_NAMES.get(k, k)}={v}" for k, v in recipe.items()]
    theirs_s, theirs_log = run_timed(
        [
            sys.executable,
            "train.py",
            "config/train_shakespeare_char.py",
            "--device=cpu",
            "--compile=False",
            "--learning_rate=1e-3",
            *flags,
        ],
        cwd=work,
    )
    theirs_val = float(re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", theirs_log)[-1])
    theirs_ms = statistics.median(
        float(ms) for ms in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", theirs_log)[1:]
    )
    # gpt2: the command line, as its users run it
    gpt2 = [sys.executable, "-m", "gpt2"]
    run_timed(
        [*gpt2, "prepare", "shakespeare", "--out", str(root / "ours-data"), "--tokenizer", "char", "--no-progress"],
        cwd=root,
    )
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in recipe.items()]
    ours_s, _ = run_timed(
        [
            *gpt2,
            "train",
            "--data",
            str(root / "ours-data"),
            "--out",
            str(root / "ours-out"),
            "--device=cpu",
            "--compile=off",
            "--lr=1e-3",
            "--grad-accum=1",
            "--no-progress",
            *flags,
        ],
        cwd=root,
    )
    records = read_log(root / "ours-out" / "log.jsonl")
    ours_val = [r["val_loss"] for r in records if "val_loss" in r][-1]
    ours_ms = statistics.median(r["ms"] for r in records if "ms" in r and r["iter"] > 0)
    # gpt2's Muon recipe, as shipped: its own iterations (fewer), to nanoGPT's loss or below
    muon_s, _ = run_timed(
        [
            *gpt2,
            "train",
            "--recipe",
            "shakespeare_char_muon",
            "--data",
            str(root / "ours-data"),
            "--out",
            str(root / "muon-out"),
            "--no-progress",
        ],
        cwd=root,
    )
    muon_records = read_log(root / "muon-out" / "log.jsonl")
    muon_evals = [r for r in muon_records if "val_loss" in r]
    return [
        ["wall time of the run", f"{ours_s:.1f} s", f"{theirs_s:.1f} s", f"{theirs_s / ours_s:.2f}x faster"],
        ["median time per iteration", f"{ours_ms:.1f} ms", f"{theirs_ms:.1f} ms", f"{theirs_ms / ours_ms:.2f}x faster"],
        [
            f"validation loss at iteration {iters}",
            f"{ours_val:.4f}",
            f"{theirs_val:.4f}",
            f"{ours_val - theirs_val:+.4f}",
        ],
        [
            f"gpt2's recipe shakespeare_char_muon ({muon_evals[-1]['iter']} iterations): wall time of the run",
            f"{muon_s:.1f} s",
            f"{theirs_s:.1f} s",
            f"{theirs_s / muon_s:.2f}x faster",
        ],
        [
            "  its validation loss at the end",
            f"{muon_evals[-1]['val_loss']:.4f}",
            f"{theirs_val:.4f}",
            f"{muon_evals[-1]['val_loss'] - theirs_val:+.4f}",
        ],
    ]


CHILD_124M = """
import json, os, resource, runpy, statistics, sys, time
which, work, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.chdir(work)
if which == "nanogpt":
    sys.argv = ["train.py", *sys.argv[4:]]
    sys.path.insert(0, work)
    import io, contextlib
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        runpy.run_path("train.py", run_name="__main__")
    import re
    ms = [float(m) for m in re.findall(r"iter \\d+: loss [\\d.]+, time ([\\d.]+)ms", log.getvalue())]
else:
    from gpt2.training.loggers import read_log
    from gpt2.training.train import train
    settings = json.loads(sys.argv[4])
    train("ours-out", progress=False, **settings)
    ms = [r["ms"] for r in read_log(__import__("pathlib").Path("ours-out/log.jsonl")) if "ms" in r]
import torch
peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() \
else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"ms": statistics.median(ms[2:]), "peak_bytes": peak}))
"""


def random_ids(data: Path) -> None:
    """GPT-2 ids drawn uniformly: speed does not depend on what the model learns."""
    data.mkdir(parents=True)
    ids = np.random.default_rng(0).integers(0, 50257, size=2_000_000, dtype=np.uint16)
    ids.tofile(data / "train.bin")
    ids[:200_000].tofile(data / "val.bin")


def gpt2_124m(
    root: Path,
    iters: int,
    device: str = "cpu",
    shape: dict = GPT2_CPU_124M,
    dtype: str = "float32",
    compiled: bool = False,
) -> dict[str, dict[str, float]]:
    """Each trainer's median ms per iteration and peak memory (the process's on the CPU, the GPU's on CUDA)."""
    work = nanogpt_workdir(root / f"m-{device}-{compiled}")
    random_ids(work / "data" / "random")
    common = dict(shape, max_iters=iters, eval_interval=10**6, eval_iters=1, log_interval=1, warmup_iters=0)
    nano_flags = [f"--{NANOGPT_NAMES.get(k, k)}={v}" for k, v in common.items()]
    ours = dict(
        common, data=str(work / "data" / "random"), device=device, compile="on" if compiled else "off", dtype=dtype
    )
    results = {}
    for which, args in (
        (
            "nanogpt",
            [
                "--dataset=random",
                f"--device={device}",
                f"--compile={compiled}",
                f"--dtype={dtype}",
                "--out_dir=nano-out",
                *nano_flags,
            ],
        ),
        ("gpt2", [json.dumps(ours)]),
    ):
        out = subprocess.run(
            [sys.executable, "-c", CHILD_124M, which, str(work), str(iters), *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        if out.returncode != 0:
            sys.exit(f"{which} failed:\n{out.stderr[-3000:]}")
        results[which] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def cpu_124m(root: Path, iters: int) -> list[list[str]]:
    results = gpt2_124m(root, iters)
    ours, theirs = results["gpt2"], results["nanogpt"]
    tokens = GPT2_CPU_124M["batch_size"] * GPT2_CPU_124M["block_size"]
    return [
        [
            "124M, batch 4 x 256: tokens/s",
            f"{tokens / ours['ms'] * 1000:.0f}",
            f"{tokens / theirs['ms'] * 1000:.0f}",
            f"{theirs['ms'] / ours['ms']:.2f}x",
        ],
        [
            "124M, batch 4 x 256: peak memory of the process",
            f"{ours['peak_bytes'] / 2**30:.2f} GiB",
            f"{theirs['peak_bytes'] / 2**30:.2f} GiB",
            f"{ours['peak_bytes'] / theirs['peak_bytes']:.2f}x the memory",
        ],
    ]


GPU_124M = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=16, grad_accum=1, dropout=0.0)


def gpu(root: Path, iters: int) -> list[list[str]]:
    """nanoGPT and gpt2 on one GPU: tokens/s, MFU (PaLM's FLOP count, as nanoGPT's estimate_mfu) and peak GPU memory."""
    with torch.device("meta"):
        per_token = flops_per_token(GPT2(GPT2Config(n_vocab=50257, n_ctx=1024, n_layer=12, n_head=12, n_embd=768)))
    name = torch.cuda.get_device_name()
    peak = peak_flops(torch.device("cuda"), torch.bfloat16) or math.nan  # the data sheet's (989 TFLOP/s for an H100)
    tokens = GPU_124M["batch_size"] * GPU_124M["block_size"]
    rows = []
    for compiled in (False, True):
        results = gpt2_124m(root, iters, "cuda", GPU_124M, "bfloat16", compiled)
        ours, theirs = results["gpt2"], results["nanogpt"]
        rate = {k: tokens / r["ms"] * 1000 for k, r in results.items()}
        label = f"{name}, 124M, 16 x 1024, bfloat16, {'compiled' if compiled else 'eager'}"
        rows += [
            [
                f"{label}: tokens/s",
                f"{rate['gpt2']:,.0f}",
                f"{rate['nanogpt']:,.0f}",
                f"{rate['gpt2'] / rate['nanogpt']:.2f}x",
            ],
            [
                f"{label}: MFU",
                f"{rate['gpt2'] * per_token / peak:.1%}",
                f"{rate['nanogpt'] * per_token / peak:.1%}",
                "",
            ],
            [
                f"{label}: peak GPU memory",
                f"{ours['peak_bytes'] / 2**30:.2f} GiB",
                f"{theirs['peak_bytes'] / 2**30:.2f} GiB",
                f"{ours['peak_bytes'] / theirs['peak_bytes']:.2f}x the memory",
            ],
        ]
    return rows


def ddp(root: Path, iters: int) -> list[list[str]]:
    """`gpt2 train` in one process against torchrun's two, the same global batch: median ms per iteration."""
    gpt2 = [sys.executable, "-m", "gpt2"]
    run_timed(
        [*gpt2, "prepare", "shakespeare", "--out", str(root / "char"), "--tokenizer", "char", "--no-progress"], cwd=root
    )
    random_ids(root / "random")
    shapes = [  # the 124M shape takes about 15 s an iteration here: 6 of them
        (
            "shakespeare_char shape, batch 12 x 64",
            root / "char",
            dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12),
            iters,
        ),
        ("124M, batch 2 x 256", root / "random", dict(GPT2_CPU_124M, batch_size=2), 6),
    ]
    rows = []
    for label, data, shape, max_iters in shapes:
        settings = dict(
            shape,
            grad_accum=2,
            max_iters=max_iters,
            eval_interval=10**6,
            eval_iters=1,
            warmup_iters=0,
            device="cpu",
            compile="off",
        )
        ms = {}
        for procs in (1, 2):
            out = root / f"ddp-{data.name}-{procs}"
            launch = (
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gpt2"]
                if procs == 2
                else gpt2
            )
            run_timed(
                [
                    *launch,
                    "train",
                    "--data",
                    str(data),
                    "--out",
                    str(out),
                    "--no-progress",
                    *(f"--{k.replace('_', '-')}={v}" for k, v in settings.items()),
                ],
                cwd=root,
            )
            ms[procs] = statistics.median(r["ms"] for r in read_log(out / "log.jsonl") if "ms" in r and r["iter"] >= 2)
        tokens = shape["batch_size"] * shape["block_size"] * 2
        rows.append(
            [
                f"{label}, grad_accum 2: tokens/s",
                f"{tokens / ms[1] * 1000:,.0f}",
                f"{tokens / ms[2] * 1000:,.0f}",
                f"{ms[1] / ms[2]:.2f}x",
            ]
        )
    return rows


def gpt2_run(root: Path, name: str, data: Path, recipe: dict, *extra: str) -> tuple[float, list[dict]]:
    """`gpt2 train` on the recipe, as its users run it: wall time and log records."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in recipe.items()]
    seconds, _ = run_timed(
        [
            sys.executable,
            "-m",
            "gpt2",
            "train",
            "--data",
            str(data),
            "--out",
            str(root / name),
            "--device=cpu",
            "--compile=off",
            "--lr=1e-3",
            "--grad-accum=1",
            "--no-progress",
            *flags,
            *extra,
        ],
        cwd=root,
    )
    return seconds, read_log(root / name / "log.jsonl")


def reached(records: list[dict], target: float) -> tuple[int, float] | None:
    """The first evaluation at or below `target`: its iteration, and the training steps' seconds to get there."""
    for r in records:
        if "val_loss" in r and r["val_loss"] <= target:
            return r["iter"], sum(x["ms"] for x in records if "ms" in x and x["iter"] < r["iter"]) / 1000
    return None


def muon(root: Path, iters: int, iters_124m: int, target: float | None) -> list[list[str]]:
    """AdamW and Muon on the shakespeare_char recipe (and their 124M step time)."""
    root.mkdir(parents=True)
    run_timed(
        [
            sys.executable,
            "-m",
            "gpt2",
            "prepare",
            "shakespeare",
            "--out",
            str(root / "char"),
            "--tokenizer",
            "char",
            "--no-progress",
        ],
        cwd=root,
    )
    recipe = dict(RECIPE, max_iters=iters, lr_decay_iters=iters, eval_interval=max(iters // 40, 10), log_interval=1)
    runs = {
        "adamw": gpt2_run(root, "adamw", root / "char", recipe),
        "muon": gpt2_run(root, "muon", root / "char", recipe, "--optimizer=muon", f"--muon-lr={MUON_LR}"),
    }
    evals = {k: {r["iter"]: r["val_loss"] for r in log if "val_loss" in r} for k, (_, log) in runs.items()}
    whose = "nanoGPT's" if target is not None else "AdamW's"
    target = evals["adamw"][iters] if target is None else target
    rows = [
        [
            f"validation loss at iteration {it}",
            f"{evals['adamw'][it]:.4f}",
            f"{evals['muon'][it]:.4f}",
            f"{evals['muon'][it] - evals['adamw'][it]:+.4f}",
        ]
        for it in sorted(evals["adamw"])
        if it % max(iters // 8, 1) == 0
    ]
    at = {k: reached(log, target) for k, (_, log) in runs.items()}
    show = {k: "not reached" if v is None else f"iteration {v[0]} ({v[1]:.1f} s of steps)" for k, v in at.items()}
    ratio = (
        f"{at['muon'][0] / at['adamw'][0]:.0%} of AdamW's iterations"
        if None not in at.values() and at["adamw"][0]
        else ""
    )
    rows.append([f"reaches {whose} final validation loss {target:.4f}", show["adamw"], show["muon"], ratio])
    ms = {k: statistics.median(r["ms"] for r in log if "ms" in r and r["iter"] > 0) for k, (_, log) in runs.items()}
    rows.append(
        [
            "median ms per iteration",
            f"{ms['adamw']:.1f}",
            f"{ms['muon']:.1f}",
            f"{ms['muon'] / ms['adamw']:.2f}x the time",
        ]
    )
    rows.append(
        [
            "wall time of the run (evaluations every " + f"{recipe['eval_interval']} iterations)",
            f"{runs['adamw'][0]:.1f} s",
            f"{runs['muon'][0]:.1f} s",
            "",
        ]
    )
    step = {}
    for name, extra in (("adamw", {}), ("muon", {"optimizer": "muon"})):
        work = root / f"m124-{name}"
        random_ids(work / "data")
        settings = dict(
            GPT2_CPU_124M,
            max_iters=iters_124m,
            eval_interval=10**6,
            eval_iters=1,
            log_interval=1,
            warmup_iters=0,
            data=str(work / "data"),
            device="cpu",
            compile="off",
            **extra,
        )
        out = subprocess.run(
            [sys.executable, "-c", CHILD_124M, "gpt2", str(work), str(iters_124m), json.dumps(settings)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        if out.returncode != 0:
            sys.exit(f"124M with {name} failed:\n{out.stderr[-3000:]}")
        step[name] = json.loads(out.stdout.strip().splitlines()[-1])["ms"]
    rows.append(
        [
            "124M, batch 4 x 256: ms per iteration",
            f"{step['adamw']:.0f}",
            f"{step['muon']:.0f}",
            f"{step['muon'] / step['adamw']:.2f}x the time",
        ]
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        metavar="SECTIONS",
        help="sections to run, comma-separated, of: shakespeare, 124m, ddp, gpu, muon (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few iterations of each section")
    parser.add_argument("--iters", type=int, default=2000, help="iterations of the shakespeare recipe (default: 2000)")
    parser.add_argument(
        "--iters-124m", type=int, default=8, help="iterations of the 124M run (default: 8; the first 2 are warm-up)"
    )
    parser.add_argument(
        "--iters-gpu", type=int, default=50, help="iterations of each GPU run (default: 50; the first 2 are warm-up)"
    )
    parser.add_argument(
        "--iters-ddp", type=int, default=30, help="iterations of each DDP run (default: 30; the first 2 are warm-up)"
    )
    args = parser.parse_args()
    if args.quick:
        args.iters, args.iters_124m, args.iters_gpu, args.iters_ddp = 40, 3, 5, 4
    if not ANCHOR.is_dir():
        sys.exit(f"this benchmark needs nanoGPT in {ANCHOR} (../shared beside the clone)")
    sections = {"shakespeare", "124m", "ddp", "gpu", "muon"}
    if args.only is not None and not args.only <= sections:
        sys.exit(
            f"--only takes sections of {', '.join(sorted(sections))}, not {', '.join(sorted(args.only - sections))}"
        )
    args.only = args.only or sections
    if args.only == {"gpu"} and not torch.cuda.is_available():
        sys.exit("--only gpu needs a CUDA GPU: this machine has none")
    rows, ddp_rows, muon_rows, nanogpt_loss = [], [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        if "shakespeare" in args.only:
            rows += shakespeare(Path(tmp) / "s", args.iters)
            nanogpt_loss = float(rows[-1][2])
        if "124m" in args.only:
            rows += cpu_124m(Path(tmp), args.iters_124m)
        if "gpu" in args.only and torch.cuda.is_available():
            rows += gpu(Path(tmp), args.iters_gpu)
        if "ddp" in args.only:
            (Path(tmp) / "d").mkdir()
            ddp_rows = ddp(Path(tmp) / "d", args.iters_ddp)
        if "muon" in args.only:
            muon_rows = muon(Path(tmp) / "muon", args.iters, args.iters_124m, nanogpt_loss)
    if rows:
        print_table(["measure", "gpt2", "nanoGPT", "gpt2 vs nanoGPT"], rows)
    if ddp_rows:
        print_table(["DDP on the CPU (gloo)", "1 process, 2 threads", "2 processes, 1 thread each", "2 vs 1"], ddp_rows)
    if muon_rows:
        print_table(
            ["shakespeare_char recipe, gpt2 train", "AdamW", f"Muon (--muon-lr {MUON_LR})", "Muon vs AdamW"], muon_rows
        )


if __name__ == "__main__":
    main()

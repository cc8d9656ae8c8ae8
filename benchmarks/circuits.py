"""gpt2.inspect against TransformerLens on the same 124M weights: a cached forward pass and a
full resid_pre activation-patching grid, time and peak memory side by side (issue 38, item 9;
benchmarks/inspection.py is the /v1/inspect answer against transformers).

TransformerLens is no dependency of the package: give it a virtual environment of its own.

    python3 -m venv /work/tl-venv
    /work/tl-venv/bin/pip install torch==2.13.0 transformer-lens      # 4.3.0 beside torch 2.13.0
    /work/tl-venv/bin/pip install --no-deps -e .                      # this checkout, as is
    /work/tl-venv/bin/pip install "jinja2>=3.1.6" "tqdm>=4.60" regex safetensors numpy huggingface_hub
    /work/tl-venv/bin/python benchmarks/circuits.py [--tokens 32 128] [--repeat 5] [--patch-repeat 3] [--threads 1]

The weights: transformers' GPT2LMHeadModel(GPT2Config()) (the 124M shape), random with seed 0,
saved with a GPT-2 tokenizer built from this package's vocabulary files; gpt2 loads them with
GPT2.from_pretrained(dir), TransformerLens with TransformerBridge.boot_transformers("gpt2",
hf_model=..., tokenizer=...) over the same directory (its default mode: transformers' own
weights, no folding). Nothing reaches the network (HF_HUB_OFFLINE=1).

    cached pass   gpt2.inspect.trace(model, ids) (its default names, and every name incl. the
                  per-head q, k, v, scores, z) against bridge.run_with_cache(ids) (every hook)
    patching      gpt2.inspect.activation_patching(model, clean, corrupted, logit_diff, "resid_pre")
                  against bridge.run_with_cache(clean) + patching.get_act_patch_resid_pre(bridge,
                  corrupted, cache, metric): the whole experiment each side, clean run included

First the two are checked equal (logits and resid_pre of every layer within 1e-4; the patching
grids within 1e-4), else the script stops. Times: torch's threads fixed (--threads, default 1:
on a 2-core machine that other processes share, 2 threads wait on each other and run about 10x
slower than 1, on either side), one warm-up call each (the patching grids: the equality
check's), then the best of --repeat calls, the two sides alternating. TransformerLens
runs under torch.no_grad() as its demos do (gpt2.inspect computes no gradients either).
Peak memory: each measurement in a fresh process of this script (`--memory-of`), which loads
its model, warms up on 4 tokens, then reports the peak resident size (Linux VmHWM, reset
through /proc/self/clear_refs) above the resident size just before the call, with the call's
result still held: the call's own working memory, the model's weights excluded.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing is downloaded
os.environ["TQDM_DISABLE"] = "1"  # TransformerLens's patching draws a progress bar

import torch  # noqa: E402

TOLERANCE = 1e-4
CHANGED = (0.25, 0.5)  # the corrupted input: the clean one with the tokens at these fractions of T replaced
ANSWER, OTHER = 11, 22  # the metric: logits[-1, ANSWER] - logits[-1, OTHER]


def make_weights(directory: Path) -> None:
    """The 124M shape with random weights (seed 0) and a GPT-2 tokenizer, saved by transformers."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast
    from transformers.utils import logging as hf_logging

    import gpt2

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
    vocab = Path(gpt2.__file__).parent / "tokenizer" / "vocab"
    GPT2TokenizerFast(vocab_file=str(vocab / "encoder.json"), merges_file=str(vocab / "vocab.bpe")).save_pretrained(
        directory
    )


def load(side: str, directory: Path):
    """gpt2's model, or TransformerLens's bridge over transformers' model, from the directory."""
    if side == "gpt2":
        from gpt2.model.model import GPT2

        return GPT2.from_pretrained(directory, device="cpu")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    # TransformerLens reloads the tokenizer by its name_or_path: give it one loaded from the directory.
    bridge = TransformerBridge.boot_transformers(
        "gpt2", hf_model=hf, tokenizer=GPT2TokenizerFast.from_pretrained(directory), device="cpu"
    )
    return bridge.eval()


def inputs(T: int) -> tuple[list[int], list[int]]:
    """Clean ids (random, seeded by T) and corrupted ids: the same with two tokens replaced."""
    clean = torch.randint(0, 50257, (T,), generator=torch.Generator().manual_seed(T)).tolist()
    corrupted = list(clean)
    for fraction in CHANGED:
        corrupted[int(fraction * T)] = (clean[int(fraction * T)] + 1000) % 50257
    return clean, corrupted


def task(side: str, model, name: str, T: int) -> Callable[[], object]:
    """A call that runs one measurement (name: trace, trace-all, patching, patching:B for gpt2's
    batch_size B, 16 by default) on T tokens."""
    clean, corrupted = inputs(T)
    if side == "gpt2":
        import gpt2.inspect as gi

        if name.startswith("patching"):
            batch_size = int(name.partition(":")[2] or 16)
            return lambda: gi.activation_patching(
                model, clean, corrupted, gi.logit_diff(ANSWER, OTHER), "resid_pre", batch_size=batch_size
            )
        names = gi.activation_names(model.config.n_layer) if name == "trace-all" else None
        return lambda: gi.trace(model, clean, names=names)
    from transformer_lens import patching

    clean_t, corrupted_t = torch.tensor([clean]), torch.tensor([corrupted])

    @torch.no_grad()
    def run():
        logits, cache = model.run_with_cache(clean_t)
        if not name.startswith("patching"):
            return logits, cache
        metric = lambda logits: logits[0, -1, ANSWER] - logits[0, -1, OTHER]  # noqa: E731
        return patching.get_act_patch_resid_pre(model, corrupted_t, cache, metric)

    return run


# ------------------------------------------------------------------ equality first


def check_equal(ours, bridge, tokens: list[int], patch_T: int) -> list[str]:
    """The largest differences between the two, each checked against TOLERANCE."""
    lines = []
    for T in tokens:
        trace = task("gpt2", ours, "trace", T)()
        logits, cache = task("tl", bridge, "trace", T)()
        diffs = {"logits": (trace.logits - logits[0]).abs().max().item()}
        diffs["resid_pre"] = max(
            (trace.residual(l) - cache[f"blocks.{l}.hook_resid_pre"][0]).abs().max().item()
            for l in range(ours.config.n_layer)
        )
        lines += [
            f"T = {T}: {what} of every layer agree within {d:.2e}"
            if what == "resid_pre"
            else f"T = {T}: {what} agree within {d:.2e}"
            for what, d in diffs.items()
        ]
        if max(diffs.values()) > TOLERANCE:
            sys.exit(f"gpt2 and TransformerLens disagree at T = {T}: {diffs}; the timing would be meaningless")
    grid, grid_tl = task("gpt2", ours, "patching", patch_T)(), task("tl", bridge, "patching", patch_T)()
    d = (grid - grid_tl).abs().max().item()
    lines.append(
        f"T = {patch_T}: resid_pre patching grids {list(grid.shape)} agree within {d:.2e} "
        f"(entries from {grid.min().item():.4f} to {grid.max().item():.4f})"
    )
    if grid.shape != grid_tl.shape or d > TOLERANCE:
        sys.exit(f"the patching grids disagree ({d}); the timing would be meaningless")
    return lines


def held_mb(result) -> float:
    """MB held by a cached pass's tensors, each storage counted once (aliases share storage)."""
    tensors = result.activations.values() if hasattr(result, "activations") else result[1].values()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values()) / 1e6


# ------------------------------------------------------------------ time and memory


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A Markdown table (as _common's, which needs the tests' dev dependencies this environment lacks)."""
    for row in (header, ["---"] * len(header), *rows):
        print("| " + " | ".join(row) + " |")


def best_times(calls: dict[str, Callable[[], object]], repeat: int, warm_up: bool = True) -> dict[str, float]:
    """Best of `repeat` seconds per call after one warm-up each, the calls alternating."""
    for call in calls.values() if warm_up else ():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def status(field: str) -> int:
    """A /proc/self/status size, in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(side: str, directory: Path, name: str, T: int) -> None:
    """In a fresh process: print the peak resident bytes one call adds above the loaded, warmed-up model."""
    model = load(side, directory)
    task(side, model, name, 4)()  # thread pools, kernels, first-use allocations
    call = task(side, model, name, T)
    gc.collect()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    result = call()  # noqa: F841  held while the peak is read
    print(status("VmHWM") - before)


def peak_mb(side: str, directory: Path, name: str, T: int, threads: int) -> float:
    argv = [sys.executable, __file__, "--memory-of", side, name, str(T), str(directory), "--threads", str(threads)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128], help="cached-pass lengths")
    parser.add_argument("--patch-tokens", type=int, default=32)
    parser.add_argument(
        "--patch-batch-sizes", type=int, nargs="*", default=[4], help="gpt2's grid again, batching fewer runs"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed calls of each cached pass (best taken)")
    parser.add_argument("--patch-repeat", type=int, default=3, help="timed calls of each patching grid (best taken)")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (1: see the docstring)")
    parser.add_argument("--no-memory", action="store_true", help="times only")
    parser.add_argument("--memory-of", nargs=4, metavar=("SIDE", "TASK", "T", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        side, name, T, directory = args.memory_of
        return memory_child(side, Path(directory), name, int(T))

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        make_weights(directory)
        ours, bridge = load("gpt2", directory), load("tl", directory)
        print(
            f"124M shape, random weights (seed 0); torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; transformer-lens "
            f"{importlib.metadata.version('transformer-lens')} ({type(bridge).__name__}), transformers "
            f"{importlib.metadata.version('transformers')}\n"
        )
        print("\n".join(check_equal(ours, bridge, args.tokens, args.patch_tokens)) + "\n")

        measures = [(f"cached pass, T = {T}, gpt2 default names", "trace", T, args.repeat) for T in args.tokens]
        measures += [(f"cached pass, T = {T}, gpt2 every name", "trace-all", T, args.repeat) for T in args.tokens]
        measures.append(
            (f"resid_pre patching grid, T = {args.patch_tokens}", "patching", args.patch_tokens, args.patch_repeat)
        )
        # gpt2 batching fewer patched runs, against the same TransformerLens figures (its runs are one at a time)
        measures += [
            (f"  the same, gpt2 batch_size={b}", f"patching:{b}", args.patch_tokens, args.patch_repeat)
            for b in args.patch_batch_sizes
        ]
        rows, t, m = [], {}, {}
        for label, name, T, repeat in measures:
            sides = ("gpt2",) if ":" in name else ("gpt2", "tl")
            calls = {
                side: task(side, model, name, T) for side, model in (("gpt2", ours), ("tl", bridge)) if side in sides
            }
            t |= best_times(calls, repeat, warm_up=name != "patching")  # check_equal ran the grids once already
            row = [label, f"{t['gpt2']:.3f}", f"{t['tl']:.3f}", f"{t['tl'] / t['gpt2']:.2f}x"]
            if not name.startswith("patching"):
                row[0] += f" (held: {held_mb(calls['gpt2']()):.1f} MB vs {held_mb(calls['tl']()):.1f} MB)"
            if not args.no_memory:
                m |= {side: peak_mb(side, directory, name, T, args.threads) for side in sides}
                row += [f"{m['gpt2']:.0f}", f"{m['tl']:.0f}", f"{m['gpt2'] / m['tl']:.2f}x"]
            rows.append(row)
            print(f"  {label}: done", file=sys.stderr)
        header = ["measure", "gpt2 s", "TransformerLens s", "speed: TL s / gpt2 s"]
        if not args.no_memory:
            header += ["gpt2 peak MB", "TransformerLens peak MB", "memory: gpt2 / TL"]
        print(f"best of {args.repeat} (cached passes) and {args.patch_repeat} (patching) after a warm-up each\n")
        print_table(header, rows)


if __name__ == "__main__":
    main()

"""gpt2.inspect's activation patching against TransformerLens's patching functions (issue 53): each
site issue 53 added, timed against TransformerLens's function of the same name on the same 124M
weights, after checking the two equal.

    .venv/bin/python benchmarks/patching.py [--tokens 8] [--repeat 3] [--sample 10] [--threads 1]
                                            [--batch 1] [--full resid_mid] [--sites head_q ...]

TransformerLens 3.9 (HookedTransformer) is in the dev extra beside gpt2's pins: this runs in
.venv. The weights: transformers' GPT2LMHeadModel(GPT2Config()) (the 124M shape), random with
seed 0 (`_common.random_124m`); gpt2 loads them with GPT2.from_pretrained(dir), TransformerLens
gets them as tests/helpers.py's transformer_lens_from_hf builds its HookedTransformer (no
folding, so the activations are transformers' own). Nothing reaches the network.

Each side runs the whole experiment: gpt2 `activation_patching(model, clean, corrupted,
logit_diff(11, 22), site)` (its defaults: left padding, batch_size by the metric); TransformerLens
`run_with_cache(clean)` and `get_act_patch_{name}(model, corrupted, cache, metric)` under
torch.no_grad(), metric = (logits[:, -1, 11] - logits[:, -1, 22]).mean() written out. clean: --batch
rows of --tokens random ids; corrupted: clean with the tokens at a quarter and a half of T replaced.

TransformerLens runs the model once per entry, whatever the entry (`generic_activation_patch`'s
loop: run_with_hooks of the whole input), about 0.35 s a run of 8 tokens here: the by-position
head grids (n_layer x n_head x T runs each; head_pos_every five of them) would take 7 to 35
minutes a call. So its time is measured on --sample entries of each grid, spread evenly over it,
through the same `generic_activation_patch` with the function's own patch setter and activation
name (`index_df=`, its documented way to patch some entries), and scaled: run_with_cache's time +
the sampled entries' time x entries / sampled. An "every" function is the sum of the functions it
calls (block_every: resid_pre, attn_out, mlp_out; attn_head_all_pos_every: the five head ones),
each sampled alike. --full SITE runs TransformerLens's whole function once as well, to check the
scaling against a real call.

Equal first: gpt2's grid at every sampled entry against TransformerLens's value (within 1e-4),
else the script stops. Times: torch's threads fixed (--threads, default 1: on a 2-core machine
other processes share, 2 threads wait on each other), the best of --repeat rounds, the two sides
alternating which goes first; the first round is also the equality check. Load averages are
printed before and after: other processes share this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing is downloaded
os.environ["TQDM_DISABLE"] = "1"  # TransformerLens's patching draws a progress bar

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, random_124m  # noqa: E402  (puts tests/ on the path too)

TOLERANCE = 1e-4
ANSWER, OTHER = 11, 22
HEAD_KINDS = ("out", "q", "k", "v", "pattern")  # TransformerLens's "every" head order: z, q, k, v, pattern
# Each gpt2 site: TransformerLens's function of the same name, and the functions that compute it.
SITES = {
    "resid_mid": ("resid_mid", ["resid_mid"]),
    "head_q": ("attn_head_q_all_pos", ["attn_head_q_all_pos"]),
    "head_k": ("attn_head_k_all_pos", ["attn_head_k_all_pos"]),
    "head_v": ("attn_head_v_all_pos", ["attn_head_v_all_pos"]),
    "head_pattern": ("attn_head_pattern_all_pos", ["attn_head_pattern_all_pos"]),
    "head_q_pos": ("attn_head_q_by_pos", ["attn_head_q_by_pos"]),
    "head_k_pos": ("attn_head_k_by_pos", ["attn_head_k_by_pos"]),
    "head_v_pos": ("attn_head_v_by_pos", ["attn_head_v_by_pos"]),
    "head_pattern_pos": ("attn_head_pattern_by_pos", ["attn_head_pattern_by_pos"]),
    "block_every": ("block_every", ["resid_pre", "attn_out", "mlp_out"]),
    "head_every": ("attn_head_all_pos_every", [f"attn_head_{k}_all_pos" for k in HEAD_KINDS]),
    "head_pos_every": ("attn_head_by_pos_every", [f"attn_head_{k}_by_pos" for k in HEAD_KINDS]),
}


def sampled(tl, function: str, T: int, k: int):
    """TransformerLens's function's patch setter, activation name, its whole index (a DataFrame,
    a row an entry, its own axis names) and k rows of it spread evenly."""
    from transformer_lens import patching

    keywords = dict(getattr(patching, f"get_act_patch_{function}").keywords)
    axes = keywords.pop("index_axis_names")
    sizes = {"layer": tl.cfg.n_layers, "pos": T, "dest_pos": T, "head": tl.cfg.n_heads, "head_index": tl.cfg.n_heads}
    index = patching.make_df_from_ranges([sizes[a] for a in axes], list(axes))
    rows = sorted({round(i * (len(index) - 1) / max(k - 1, 1)) for i in range(min(k, len(index)))})
    return keywords, index, index.iloc[rows].reset_index(drop=True)


def ours_index(row, part: int | None) -> tuple[int, ...]:
    """A TransformerLens index row -> the entry in gpt2's grid: (part,) layer, head, position."""
    head = [row[a] for a in ("head", "head_index") if a in row]
    position = [row[a] for a in ("pos", "dest_pos") if a in row]
    return tuple(([] if part is None else [part]) + [row["layer"]] + head + position)


def tl_side(tl, site: str, clean, corrupted, T: int, k: int) -> tuple[float, list[tuple[tuple, float]]]:
    """TransformerLens's time for the whole grid (run_with_cache + each function's sampled entries,
    scaled), and its values at the sampled entries, by gpt2's index."""
    from transformer_lens import patching

    def metric(logits):
        return (logits[:, -1, ANSWER] - logits[:, -1, OTHER]).mean()

    functions = SITES[site][1]
    with torch.no_grad():
        start = time.perf_counter()
        _, cache = tl.run_with_cache(clean)
        total = time.perf_counter() - start
        values = []
        for part, function in enumerate(functions):
            keywords, index, rows = sampled(tl, function, T, k)
            start = time.perf_counter()
            out = patching.generic_activation_patch(tl, corrupted, cache, metric, index_df=rows, **keywords)
            total += (time.perf_counter() - start) * len(index) / len(rows)
            whole = None if len(functions) == 1 else part
            values += [(ours_index(row, whole), float(v)) for (_, row), v in zip(rows.iterrows(), out.cpu())]
    return total, values


def ours_side(model, site: str, clean, corrupted) -> tuple[float, torch.Tensor]:
    from gpt2.inspect.patching import activation_patching, logit_diff

    start = time.perf_counter()
    grid = activation_patching(model, clean, corrupted, logit_diff(ANSWER, OTHER), site)
    return time.perf_counter() - start, grid


def tl_full(tl, function: str, clean, corrupted) -> float:
    """One whole call of TransformerLens's function (run_with_cache included), timed."""
    from transformer_lens import patching

    start = time.perf_counter()
    with torch.no_grad():
        _, cache = tl.run_with_cache(clean)
        getattr(patching, f"get_act_patch_{function}")(
            tl, corrupted, cache, lambda lg: (lg[:, -1, ANSWER] - lg[:, -1, OTHER]).mean()
        )
    return time.perf_counter() - start


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def inputs(T: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """clean (batch, T) random ids, corrupted: the tokens at a quarter and a half of T replaced (seed 0)."""
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 50257, (batch, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, [T // 4, T // 2]] = torch.randint(0, 50257, (batch, 2), generator=g)
    return clean, corrupted


def memory_child(side: str, site: str, T: int, batch: int, directory: str, k: int) -> None:
    """In a fresh process: the peak resident size (VmHWM, reset through /proc/self/clear_refs) above the
    resident size just before one whole patching experiment of `site`, its result held; printed in MiB.
    TransformerLens's: run_with_cache + generic_activation_patch on k sampled entries of each function (one
    patched run at a time: its memory does not grow with the entries)."""
    clean, corrupted = inputs(T, batch)
    if side == "gpt2":
        from gpt2.model.model import GPT2

        model = GPT2.from_pretrained(directory, device="cpu")
        ours = (clean[0], corrupted[0]) if batch == 1 else (clean, corrupted)
        ours_side(model, site, ours[0][..., :2], ours[1][..., :2])  # warm-up
        run = lambda: ours_side(model, site, *ours)  # noqa: E731
    else:
        from helpers import transformer_lens_from_hf
        from transformers import GPT2LMHeadModel

        tl = transformer_lens_from_hf(GPT2LMHeadModel.from_pretrained(directory).eval())
        tl_side(tl, site, clean[:, :2], corrupted[:, :2], 2, 1)  # warm-up
        run = lambda: tl_side(tl, site, clean, corrupted, T, k)  # noqa: E731
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status_kib("VmRSS")
    result = run()
    print((status_kib("VmHWM") - before) / 1024)
    del result


def memory_table(args, directory: str) -> None:
    """Each site's peak memory, gpt2's and TransformerLens's, each in a process of its own."""
    rows = []
    for site in args.sites:
        mib = {}
        for side in ("gpt2", "tl"):
            argv = [sys.executable, __file__, "--memory-of", side, site, directory, "--tokens", str(args.tokens)]
            argv += ["--batch", str(args.batch), "--sample", str(args.sample), "--threads", str(args.threads)]
            runs = [subprocess.run(argv, capture_output=True, text=True, check=True).stdout for _ in range(args.memory)]
            mib[side] = min(float(out.strip().splitlines()[-1]) for out in runs)  # the allocator's noise only adds
        rows.append(
            [f"`{site}`", f"{mib['gpt2']:.1f}", f"{mib['tl']:.1f}", f"{mib['gpt2'] / max(mib['tl'], 0.1):.2f}x"]
        )
        print(f"{site}: gpt2 {mib['gpt2']:.1f} MiB, TL {mib['tl']:.1f} MiB", file=sys.stderr)
    print(
        f"peak memory above the resident size before the call, the least of {args.memory} processes a cell; "
        f"T = {args.tokens}, batch {args.batch}"
    )
    print_table(["site", "gpt2 MiB", "TransformerLens MiB", "gpt2 / TL"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8, help="T, each prompt's tokens (default: 8)")
    parser.add_argument("--batch", type=int, default=1, help="prompts in clean and corrupted (default: 1)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of them is kept (default: 3)")
    parser.add_argument("--sample", type=int, default=10, help="TransformerLens's entries timed per function")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default: 1)")
    parser.add_argument("--full", default="resid_mid", help="a site TransformerLens also runs whole, once ('': none)")
    parser.add_argument("--sites", nargs="+", default=list(SITES), choices=list(SITES))
    parser.add_argument(
        "--memory",
        type=int,
        default=0,
        metavar="N",
        help="peak memory instead of time: the least of N processes a cell",
    )
    parser.add_argument("--memory-of", nargs=3, metavar=("SIDE", "SITE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", DeprecationWarning)
    if args.memory_of:
        side, site, directory = args.memory_of
        memory_child(side, site, args.tokens, args.batch, directory, args.sample)
        return 0
    if args.memory:
        memory_table(args, random_124m()[1])
        return 0
    from helpers import transformer_lens_from_hf

    from gpt2.model.model import GPT2

    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    hf, directory = random_124m()
    model, tl = GPT2.from_pretrained(directory, device="cpu"), transformer_lens_from_hf(hf)
    del hf
    g = torch.Generator().manual_seed(0)
    T = args.tokens
    clean = torch.randint(0, 50257, (args.batch, T), generator=g)
    corrupted = clean.clone()
    corrupted[:, [T // 4, T // 2]] = torch.randint(0, 50257, (args.batch, 2), generator=g)
    ours_in = (clean[0], corrupted[0]) if args.batch == 1 else (clean, corrupted)
    ours_side(model, "resid_mid", clean[:, :2][0], corrupted[:, :2][0])  # warm-up, each side
    tl_side(tl, "resid_mid", clean[:, :2], corrupted[:, :2], 2, 1)
    best: dict[str, dict[str, float]] = {site: {"gpt2": float("inf"), "tl": float("inf")} for site in args.sites}
    worst = {}
    for round_ in range(args.repeat):
        for site in args.sites:
            results, seconds_of = {}, {}
            for side in ("gpt2", "tl") if round_ % 2 == 0 else ("tl", "gpt2"):  # alternating which goes first
                if side == "gpt2":
                    seconds, results[side] = ours_side(model, site, *ours_in)
                else:
                    seconds, results[side] = tl_side(tl, site, clean, corrupted, T, args.sample)
                best[site][side], seconds_of[side] = min(best[site][side], seconds), seconds
            if round_ == 0:  # equal first
                worst[site] = max(abs(float(results["gpt2"][index]) - value) for index, value in results["tl"])
                print(f"{site}: equal within {worst[site]:.2g} at {len(results['tl'])} entries", file=sys.stderr)
                if worst[site] > TOLERANCE:
                    print(f"{site}: gpt2's grid differs from TransformerLens's by {worst[site]:.3g}", file=sys.stderr)
                    return 1
            print(
                f"round {round_ + 1} {site}: gpt2 {seconds_of['gpt2']:.2f} s, TL {seconds_of['tl']:.1f} s",
                file=sys.stderr,
            )
    from gpt2.inspect.patching import grid_shape

    rows = []
    for site in args.sites:
        entries = 1
        for n in grid_shape(site, model.config.n_layer, model.config.n_head, T):
            entries *= n
        times = best[site]
        rows.append(
            [
                f"`{site}`",
                f"`get_act_patch_{SITES[site][0]}`",
                f"{entries:,}",
                f"{times['gpt2']:.2f}",
                f"{times['tl']:.1f}",
                f"{times['tl'] / times['gpt2']:.1f}x",
                f"{worst[site]:.1g}",
            ]
        )
    print(
        f"torch {torch.__version__}, transformer-lens {version('transformer-lens')}, transformers "
        f"{version('transformers')}, Python {platform.python_version()}; T = {T}, batch {args.batch}, "
        f"threads {args.threads}, best of {args.repeat}, TransformerLens sampled at {args.sample} entries a function"
    )
    print_table(["site", "TransformerLens", "entries", "gpt2 s", "TL s (scaled)", "TL / gpt2", "max diff"], rows)
    if args.full:
        function = SITES[args.full][0] if args.full in SITES else args.full
        whole = tl_full(tl, function, clean, corrupted)
        scaled = tl_side(tl, args.full, clean, corrupted, T, args.sample)[0]
        print(
            f"\nTransformerLens's whole get_act_patch_{function}: {whole:.1f} s; scaled from its sample: {scaled:.1f} s"
        )
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

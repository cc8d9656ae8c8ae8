"""Perplexity speed against Hugging Face's guide loop, on the same random 124M weights, in one run.

    .venv/bin/python benchmarks/evaluate.py [--tokens N] [--context 1024] [--stride 512] [--batch-size 8] [--rounds R]

The text is the first N GPT-2 ids of tinyshakespeare (WikiText-2's test split is about 287k
ids; the first N suffice for a rate). The peer is the loop of Hugging Face's guide "Perplexity
of fixed-length models": `GPT2LMHeadModel(input_ids, labels=target_ids)` one window at a time,
which computes logits for every position. `gpt2.evaluation.evaluate.perplexity` batches the windows and
computes logits only where ids are scored. Both run fp32 on the CPU with torch's default
threads, alternating for R rounds (medians), and both perplexities are printed: they must agree.
Run it on a quiet machine.

    .venv/bin/python benchmarks/evaluate.py --hellaswag [--examples 40] [--rounds 3]

With --hellaswag: `gpt2.evaluation.evaluate.score_continuations` on HellaSwag's shape (a context of 60-100
ids, four endings of 15-30; random ids, the 124M shape's random weights), with each context's
blocks kept and reused (the default) and without (prefix_cache_mb=0), alternating: examples
per second, and the largest difference between the two's scores.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import torch
from _common import corpus, print_table


def guide_loop(model, ids: torch.Tensor, max_length: int, stride: int) -> tuple[float, int]:
    """Hugging Face's guide, as its readers run it (the count of scored ids made exact: the guide
    subtracts one per window for the label shift, which is right only for the first window)."""
    seq_len = ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss
        scored = int((target_ids[:, 1:] != -100).sum())
        nll_sum += float(loss) * scored
        n_tokens += scored
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return nll_sum / n_tokens, n_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--stride", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hellaswag", action="store_true", help="continuation scoring with and without the prefix cache"
    )
    parser.add_argument("--examples", type=int, default=40)
    args = parser.parse_args()
    if args.hellaswag:
        return hellaswag_shaped(args.examples, args.batch_size, args.rounds)

    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from gpt2 import Tokenizer
    from gpt2.evaluation.evaluate import perplexity
    from gpt2.model.model import GPT2

    hf_logging.set_verbosity_error()
    name, text = corpus()
    ids = Tokenizer.gpt2().encode(text[: args.tokens * 8])[: args.tokens]
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig()).eval()  # the 124M shape, random weights
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = GPT2.from_pretrained(d, device="cpu")

    times: dict[str, list[float]] = {"gpt2": [], "transformers": []}
    results = {}
    for _ in range(args.rounds):
        start = time.perf_counter()
        r = perplexity(ours, ids, context=args.context, stride=args.stride, batch_size=args.batch_size)
        times["gpt2"].append(time.perf_counter() - start)
        results["gpt2"] = (r.loss, r.tokens)
        start = time.perf_counter()
        results["transformers"] = guide_loop(hf, torch.tensor([ids]), args.context, args.stride)
        times["transformers"].append(time.perf_counter() - start)

    print(
        f"{len(ids):,} ids of {name}, context {args.context}, stride {args.stride}, gpt2 batch {args.batch_size}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}; "
        f"median of {args.rounds} rounds\n"
    )
    rows = []
    base = statistics.median(times["transformers"])
    for who in ("gpt2", "transformers"):
        seconds = statistics.median(times[who])
        loss, scored = results[who]
        rows.append([who, f"{scored / seconds:,.0f}", f"{seconds:.1f}", f"{loss:.6f}", f"{base / seconds:.2f}x"])
    print_table(["", "scored ids/s", "seconds", "loss (nats)", "vs transformers"], rows)
    assert results["gpt2"][1] == results["transformers"][1], "the two scored different ids"
    print(f"\nloss difference: {abs(results['gpt2'][0] - results['transformers'][0]):.2e}")


def hellaswag_shaped(examples: int, batch_size: int, rounds: int) -> None:
    from _common import random_124m

    from gpt2.evaluation.evaluate import score_continuations
    from gpt2.model.model import GPT2

    _, directory = random_124m()
    model = GPT2.from_pretrained(directory, device="cpu")
    g = torch.Generator().manual_seed(0)

    def ids(lo, hi):
        return torch.randint(0, 50256, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()

    pairs = [(context, ids(15, 30)) for context in (ids(60, 100) for _ in range(examples)) for _ in range(4)]
    times: dict[int, list[float]] = {256: [], 0: []}
    scores = {}
    for _ in range(rounds):
        for mb in times:
            start = time.perf_counter()
            scores[mb] = score_continuations(model, pairs, batch_size=batch_size, prefix_cache_mb=mb)
            times[mb].append(time.perf_counter() - start)
    worst = max(abs(a.log_prob - b.log_prob) for a, b in zip(scores[256], scores[0]))
    print(
        f"{examples} HellaSwag-shaped examples (4 endings each), batch {batch_size}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.machine()}; median of {rounds} rounds\n"
    )
    base = statistics.median(times[0])
    print_table(
        ["score_continuations", "examples/s", "seconds", "vs without"],
        [
            [
                name,
                f"{examples / statistics.median(times[mb]):.1f}",
                f"{statistics.median(times[mb]):.2f}",
                f"{base / statistics.median(times[mb]):.2f}x",
            ]
            for name, mb in (("with the prefix cache (256 MB)", 256), ("without (prefix_cache_mb=0)", 0))
        ],
    )
    print(f"\nlargest difference between the two's summed log-probabilities: {worst:.1e}")


if __name__ == "__main__":
    main()

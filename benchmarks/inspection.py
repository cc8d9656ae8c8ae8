"""What one /v1/inspect answer costs, against transformers computing the same in the same run.

    .venv/bin/python benchmarks/inspection.py [--tokens 32 64 128 170] [--rounds R]

On the same random 124M weights: `gpt2.serve.inspection.inspection_json` (a trace recording
the attention and the residual stream, the top-5 next tokens, the logit lens at every layer,
and the answer as JSON) against transformers' `GPT2LMHeadModel(ids, output_attentions=True,
output_hidden_states=True)` with eager attention, its hidden states read out through ln_f and
lm_head, and the same JSON (attention rounded to 4 decimals). Both run fp32 on the CPU with
torch's default threads, alternating for R rounds (medians). The answer's size shows why
`--max-inspect-cells` bounds it. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import torch
from _common import print_table


def transformers_answer(hf, ids: list[int], top_k: int = 5) -> bytes:
    """The same answer from transformers: attention, log-probabilities, top tokens, logit lens."""
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        logprobs = torch.log_softmax(out.logits[0], dim=-1)
        given = logprobs[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        top = logprobs.topk(top_k, dim=-1)
        lens = []
        for layer, stream in enumerate(out.hidden_states):  # the last is after ln_f already
            read = hf.lm_head(stream if layer == len(out.hidden_states) - 1 else hf.transformer.ln_f(stream))[0]
            best = torch.softmax(read, dim=-1).max(dim=-1)
            lens.append([{"id": i, "prob": p} for i, p in zip(best.indices.tolist(), best.values.tolist())])
    attention = torch.cat(out.attentions).double().round(decimals=4).tolist()
    answer = {
        "ids": ids,
        "logprobs": [None, *given.tolist()],
        "top": [top.indices.tolist(), top.values.tolist()],
        "attention": attention,
        "logit_lens": lens,
    }
    return json.dumps(answer).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 128, 170])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from gpt2 import Tokenizer
    from gpt2.model.model import GPT2
    from gpt2.serve.inspection import InspectRequest, inspection_json

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(HFConfig(attn_implementation="eager")).eval()  # the 124M shape, random weights
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = GPT2.from_pretrained(d, device="cpu")
    tokenizer = Tokenizer.gpt2()

    print(
        f"124M shape, random weights; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.machine()}; median of {args.rounds} rounds\n"
    )
    rows = []
    for T in args.tokens:
        ids = torch.randint(0, 50257, (T,), generator=torch.Generator().manual_seed(T)).tolist()
        times: dict[str, list[float]] = {"gpt2": [], "transformers": []}
        for _ in range(args.rounds):
            start = time.perf_counter()
            size = len(inspection_json(ours, tokenizer, InspectRequest(ids, 5)))
            times["gpt2"].append(time.perf_counter() - start)
            start = time.perf_counter()
            transformers_answer(hf, ids)
            times["transformers"].append(time.perf_counter() - start)
        ours_s, theirs_s = statistics.median(times["gpt2"]), statistics.median(times["transformers"])
        rows.append(
            [
                str(T),
                f"{12 * 12 * T * T:,}",
                f"{size / 1e6:.1f} MB",
                f"{ours_s:.2f}",
                f"{theirs_s:.2f}",
                f"{theirs_s / ours_s:.2f}x",
            ]
        )
    print_table(["tokens", "attention cells", "answer", "gpt2 s", "transformers s", "gpt2 vs transformers"], rows)


if __name__ == "__main__":
    main()

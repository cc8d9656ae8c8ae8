"""The attribution graph of an induction head, end to end on a CPU (docs/inspect.md, "An attribution graph of
induction"): the induction recipe's model, transcoders trained here, the graph of a repeated sequence, and an
intervention that tests it.

    python scripts/induction_graph.py [--model tests/fixtures/induction_2l] [--work DIR] [--steps 1500]

It runs the commands docs/inspect.md gives, through `gpt2`'s own entry point:

    gpt2 prepare --out WORK/data --synthetic induction
    gpt2 train-sae --model MODEL --data WORK/data --transcoders --architecture jumprelu --l0 0.3 --expansion 4
                   --steps 1500 --batch-size 1024 --context 64 --out WORK/transcoders
    gpt2 inspect --model MODEL --ids "IDS" --graph WORK/graphs --transcoders WORK/transcoders/circuit-tracer
                 --png WORK/graphs --slug induction

then, in Python, reads the graph's strongest inputs to the predicted logit and sets the features among them to
-2 times their activations (`gpt2.inspect.feature_intervention`, attention frozen), comparing the logit's change
with the one the graph's edges predict, and showing the prediction it leaves. MODEL is the recipe's output
(tests/fixtures/induction_2l is made by `gpt2 train --recipe induction_2l`: tests/fixtures/make_induction_2l.py).
IDS: 10 random tokens of the model's 64, then their first 6 again: the next token is the 7th.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from gpt2 import GPT2
from gpt2.cli import main as gpt2
from gpt2.inspect import attribution_graph, feature_intervention, load_transcoders

REPO = Path(__file__).resolve().parents[1]
FACTOR = -2.0  # the features on the path set to this times their activation


def prompt(seed: int = 0) -> list[int]:
    """10 random tokens, then their first 6 again."""
    sequence = torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:10].tolist()
    return sequence + sequence[:6]


def run(argv: list[str]) -> None:
    print("$ gpt2 " + " ".join(argv), flush=True)
    if gpt2(argv) != 0:
        raise SystemExit(2)


def intervene(model: GPT2, ids: list[int], transcoders, k: int = 6) -> dict:
    """The k strongest features into the top logit set to FACTOR x their activation: what the graph's edges
    predict for (logit - mean logit), what the run gives, and the top tokens after."""
    graph = attribution_graph(model, ids, transcoders)
    row = graph.adjacency[len(graph.adjacency) - graph.n_logits]  # the top logit's inputs
    top = row[: graph.n_features].topk(min(k, graph.n_features)).indices.tolist()
    nodes = [graph.node(i) for i in top]
    changes = [(n["layer"], n["position"], n["feature"], FACTOR * n["activation"]) for n in nodes]
    result = feature_intervention(model, ids, transcoders, changes)
    token = int(graph.logit_tokens[0])

    def lifted(logits: torch.Tensor) -> float:
        return (logits[-1, token] - logits[-1].mean()).item()

    strongest = row.abs().argmax().item()
    return {
        "token": token,
        "strongest_input": graph.node(strongest),
        "features": [(n["layer"], n["position"], n["feature"]) for n in nodes],
        "predicted": sum((FACTOR - 1) * row[i].item() for i in top),
        "actual": lifted(result.logits) - lifted(result.clean_logits),
        "top": result.top_changes(3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "tests" / "fixtures" / "induction_2l"))
    parser.add_argument("--work", type=Path, default=None, help="a new directory for the data, transcoders and graph")
    parser.add_argument("--steps", default="1500", help="the transcoders' training steps (default: 1500)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="induction-graph-"))
    ids = prompt()
    run(["prepare", "--out", str(work / "data"), "--synthetic", "induction"])
    run(
        [
            "train-sae",
            "--model",
            args.model,
            "--data",
            str(work / "data"),
            "--transcoders",
            "--architecture",
            "jumprelu",
            "--l0",
            "0.3",
            "--expansion",
            "4",
            "--steps",
            args.steps,
            "--batch-size",
            "1024",
            "--context",
            "64",
            "--out",
            str(work / "transcoders"),
        ]
    )
    run(
        [
            "inspect",
            "--model",
            args.model,
            "--ids",
            " ".join(map(str, ids)),
            "--graph",
            str(work / "graphs"),
            "--transcoders",
            str(work / "transcoders" / "circuit-tracer"),
            "--png",
            str(work / "graphs"),
            "--slug",
            "induction",
        ]
    )
    model = GPT2.from_pretrained(args.model, device="cpu")
    found = intervene(model, ids, load_transcoders(work / "transcoders" / "circuit-tracer"))
    print(json.dumps(found))
    strongest = found["strongest_input"]
    print(
        f"the next token is {found['token']} (the one after the earlier copy of {ids[-1]}, at position "
        f"{ids.index(found['token'])}); the strongest edge into its logit is from the {strongest['kind']} at "
        f"position {strongest['position']}. Setting {len(found['features'])} features on the path to {FACTOR:g}x "
        f"their activation: the graph's edges predict its logit (less the mean) moves by {found['predicted']:+.2f}, "
        f"it moves by {found['actual']:+.2f}; the top tokens now: "
        + ", ".join(f"{t['token']} {t['before']:.3f} -> {t['after']:.3f}" for t in found["top"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

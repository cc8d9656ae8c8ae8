"""gpt2.inspect.attribution_graph against circuit-tracer itself (issue 54): the same graph, then
its time and memory, on the same weights and transcoders.

    .venv/bin/python benchmarks/attribution_graph.py --circuit-tracer /tmp/ctvenv/bin/python
        [--shape tiny|124m] [--tokens 64] [--d-transcoder 4096] [--active 12] [--batch-size 64]
        [--jumprelu] [--skip] [--max-feature-nodes N] [--threads 2] [--keep DIR]

circuit-tracer pins transformers<=4.57.3 and its own TransformerLens (2.x): it runs in a virtual
environment of its own, made once with

    python3 -m venv /tmp/ctvenv && /tmp/ctvenv/bin/pip install torch==2.13.0 \\
        circuit-tracer==0.5.0 "transformer-lens<3"

This script (in .venv) writes transformers' GPT2LMHeadModel with random weights (seed 0; --shape
tiny: 2 layers of 32, 124m: GPT-2 small's shape) and a random transcoder set in circuit-tracer's
layout (config.yaml + layer_{i}.safetensors; W_enc's columns of unit norm, b_enc set so that about
--active features a position fire), then runs each side in a process of its own, in turn:

  gpt2: GPT2.from_pretrained(dir), load_transcoders(set), attribution_graph(model, ids, tcs, ...),
        graph.save(out, "graph") (circuit-tracer's graph files);
  circuit-tracer: ReplacementModel.from_config(HookedTransformerConfig of the same shape, its own
        load_transcoder_set(...), backend="transformerlens") with transformers' weights converted by
        TransformerLens's convert_gpt2_weights (its MLP and unembedding renamed .mlp.old_mlp. and
        unembed.old_unembed., as the replacement model holds them), attribute(ids, model, ...),
        create_graph_files(graph, "graph", out).

ids: <|endoftext|> and --tokens - 1 random ids (circuit-tracer puts <|endoftext|> first; both
leave position 0 out). Both take the same max_n_logits=10, desired_logit_prob=0.95, batch size
and max_feature_nodes. Equal: the same active features and logit tokens, every edge within 1e-4
of the largest edge, and the graph files' nodes and links the same (weights within 1e-4 of the
largest). Time: attribution alone (the model and transcoders loaded before the clock starts);
memory: the peak resident set during it less the resident set before, sampled every 5 ms. Then
each side's feature intervention (gpt2's feature_intervention, circuit-tracer's
ReplacementModel.feature_intervention) zeroes the three features with the largest edges into the top
logit, and sets the largest to 3 times its activation, attention frozen and free: the logits and the
activations within 1e-4 of the largest.

--trained DIR MODEL instead checks that circuit-tracer's own loader (`load_transcoder_set`) reads a
set `gpt2 train-sae` wrote (DIR: its circuit-tracer/) and encodes and decodes MODEL's MLP inputs as
gpt2 does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")

TOLERANCE = 1e-4
HERE = Path(__file__).resolve()
VOCAB = HERE.parents[1] / "src" / "gpt2" / "tokenizer" / "vocab"
SHAPES = {
    "tiny": dict(n_layer=2, n_embd=32, n_head=4, n_positions=128),
    "124m": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
}


class PeakMemory:
    """The peak resident set (MiB) above the one at entry, sampled every 5 ms by a thread."""

    def __enter__(self):
        self.start = self.peak = self._rss()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    @property
    def mib(self) -> float:
        return (self.peak - self.start) / 2**20


# ------------------------------------------------------------------ the inputs


def write_inputs(work: Path, args) -> dict:
    """transformers' random GPT-2 in work/model, circuit-tracer's transcoder set in work/set, the ids."""
    import torch
    import yaml
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(**SHAPES[args.shape])).eval()
    hf.save_pretrained(work / "model")
    C, L = hf.config.n_embd, hf.config.n_layer
    ids = [50256] + torch.randint(0, 50256, (args.tokens - 1,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():  # each block's MLP input, to set b_enc: about --active features a position
        out = hf(torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states
        inputs = [hf.transformer.h[i].ln_2(hidden[i] + attention(hf, i, hidden[i])) for i in range(L)]
    (work / "set").mkdir()
    g = torch.Generator().manual_seed(2)
    for i in range(L):
        W_enc = torch.randn(args.d_transcoder, C, generator=g)
        W_enc /= W_enc.norm(dim=1, keepdim=True)
        pre = inputs[i][0, 1:] @ W_enc.T  # (T - 1, d_transcoder)
        cut = pre.flatten().kthvalue(pre.numel() - args.active * (args.tokens - 1)).values
        w = {
            "W_enc": W_enc,
            "W_dec": torch.randn(args.d_transcoder, C, generator=g) / C**0.5,
            "b_enc": torch.full((args.d_transcoder,), -float(cut)) + torch.randn(args.d_transcoder, generator=g) * 0.01,
            "b_dec": torch.randn(C, generator=g) * 0.01,
        }
        if args.jumprelu:
            w["activation_function.threshold"] = torch.rand(args.d_transcoder, generator=g) * 0.1
        if args.skip:
            w["W_skip"] = torch.randn(C, C, generator=g) / C
        save_file(w, str(work / "set" / f"layer_{i}.safetensors"))
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": "mlp.hook_out",
        "scan": "gpt2-random",
        "transcoders": [f"layer_{i}.safetensors" for i in range(L)],
    }
    (work / "set" / "config.yaml").write_text(yaml.safe_dump(config))
    return {"ids": ids}


def attention(hf, i, x):
    """Block i's attention output on its input x (transformers' modules)."""
    block = hf.transformer.h[i]
    return block.attn(block.ln_1(x))[0]


# ------------------------------------------------------------------ the two sides


def run_gpt2(work: Path, args) -> dict:
    import torch

    from gpt2 import GPT2
    from gpt2.inspect import attribution_graph, feature_intervention, load_transcoders

    torch.set_num_threads(args.threads)
    ids = json.loads((work / "inputs.json").read_text())["ids"]
    model = GPT2.from_pretrained(work / "model", device="cpu")
    tcs = load_transcoders(work / "set")
    start = time.perf_counter()
    with PeakMemory() as memory:
        graph = attribution_graph(model, ids, tcs, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes)
    seconds = time.perf_counter() - start
    graph.save(work / "gpt2-files", "graph", scan="gpt2-random")
    changed = {}
    chosen = (graph.active_features, graph.selected_features, graph.activation_values, graph.n_logits)
    for name, changes, freeze in interventions(graph.adjacency, *chosen):
        result = feature_intervention(model, ids, tcs, changes, freeze_attention=freeze)
        changed[name] = (result.logits, result.activations, result.clean_logits)
    torch.save(changed, work / "gpt2-interventions.pt")
    torch.save(
        {
            "adjacency": graph.adjacency,
            "active_features": graph.active_features,
            "selected_features": graph.selected_features,
            "logit_tokens": graph.logit_tokens,
            "logit_probabilities": graph.logit_probabilities,
        },
        work / "gpt2.pt",
    )
    return {"seconds": seconds, "mib": memory.mib}


def run_circuit_tracer(work: Path, args) -> dict:
    import torch
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.transcoder import load_transcoder_set
    from circuit_tracer.utils.create_graph_files import create_graph_files
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

    torch.set_num_threads(args.threads)
    ids = json.loads((work / "inputs.json").read_text())["ids"]
    tokenizer_dir = work / "tokenizer"
    GPT2TokenizerFast(str(VOCAB / "encoder.json"), str(VOCAB / "vocab.bpe")).save_pretrained(tokenizer_dir)
    hf = GPT2LMHeadModel.from_pretrained(work / "model").eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel",
        tokenizer_name=str(tokenizer_dir),
        model_name="gpt2-random",
        device="cpu",
    )
    config = __import__("yaml").safe_load((work / "set" / "config.yaml").read_text())
    paths = {i: str(work / "set" / p) for i, p in enumerate(config["transcoders"])}
    transcoders = load_transcoder_set(
        paths,
        config["scan"],
        config["feature_input_hook"],
        config["feature_output_hook"],
        device="cpu",
        lazy_encoder=False,
        lazy_decoder=False,
    )
    model = ReplacementModel.from_config(cfg, transcoders, backend="transformerlens")
    state = convert_gpt2_weights(hf, cfg)
    renamed = {}
    for key, value in state.items():
        key = key.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed.")
        renamed[key] = value
    renamed.setdefault("unembed.old_unembed.b_U", torch.zeros(c.vocab_size))  # GPT-2 has none
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    assert not unexpected and all(k.startswith("transcoders.") or k.endswith(("mask", "IGNORE")) for k in missing), (
        missing,
        unexpected,
    )
    start = time.perf_counter()
    with PeakMemory() as memory:
        graph = attribute(
            torch.tensor(ids), model, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes
        )
    seconds = time.perf_counter() - start
    create_graph_files(graph, "graph", str(work / "circuit-tracer-files"))
    changed = {}
    chosen = (graph.active_features, graph.selected_features, graph.activation_values, len(graph.logit_targets))
    for name, changes, freeze in interventions(graph.adjacency_matrix, *chosen):
        logits, acts = model.feature_intervention(torch.tensor(ids), changes, freeze_attention=freeze)
        changed[name] = (logits[0], acts)
    torch.save(changed, work / "circuit-tracer-interventions.pt")
    torch.save(
        {
            "adjacency": graph.adjacency_matrix,
            "active_features": graph.active_features,
            "selected_features": graph.selected_features,
            "logit_tokens": graph.logit_token_ids,
            "logit_probabilities": graph.logit_probabilities,
        },
        work / "circuit-tracer.pt",
    )
    return {"seconds": seconds, "mib": memory.mib}


def check_trained(args) -> int:
    """--trained DIR MODEL: circuit-tracer's own loader reads a transcoder set `gpt2 train-sae` wrote (DIR,
    its circuit-tracer/ directory) and encodes and decodes the MODEL's MLP inputs as gpt2 does."""
    import torch

    from gpt2 import GPT2
    from gpt2.inspect import load_transcoders, trace

    directory, model_dir = args.trained
    model = GPT2.from_pretrained(model_dir, device="cpu")
    tcs = load_transcoders(directory)
    ids = torch.randint(0, model.config.n_vocab, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    t = trace(model, ids, names=tcs.names())
    work = Path(tempfile.mkdtemp(prefix="graph-trained-"))
    torch.save(torch.stack([t.activations[f"h.{i}.{tcs.input_step}"] for i in range(len(tcs))]), work / "x.pt")
    command = [args.circuit_tracer, str(HERE), "--role", "ct-load", "--work", str(work), "--trained", directory, "-"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-4000:], file=sys.stderr)
        return 1
    theirs, x = torch.load(work / "out.pt"), torch.load(work / "x.pt")
    worst = max(
        max((a - tcs[i].encode(x[i])).abs().max().item(), (o - tcs[i](x[i])).abs().max().item())
        for i, (a, o) in theirs.items()
    )
    print(
        f"circuit-tracer read {len(theirs)} transcoders of {directory}: encode and decode within {worst:.2g} of gpt2's"
    )
    return 0 if worst <= 1e-5 else 1


def ct_load(work: Path, directory: str) -> None:
    """In circuit-tracer's venv: its load_transcoder_set on DIR's config.yaml, each layer's encode and decode."""
    import torch
    import yaml
    from circuit_tracer.transcoder import load_transcoder_set

    config = yaml.safe_load((Path(directory) / "config.yaml").read_text())
    paths = {i: str(Path(directory) / p) for i, p in enumerate(config["transcoders"])}
    ts = load_transcoder_set(
        paths,
        config["scan"],
        config["feature_input_hook"],
        config["feature_output_hook"],
        device="cpu",
        lazy_encoder=False,
        lazy_decoder=False,
    )
    x = torch.load(work / "x.pt")
    torch.save({i: (t.encode(x[i]), t.decode(t.encode(x[i]), x[i])) for i, t in enumerate(ts)}, work / "out.pt")


def interventions(adjacency, active_features, selected, activations, n_logits) -> list:
    """The changes both sides make: the three features with the largest edges into the top logit
    zeroed, and the largest made 3 times its activation, each with attention frozen and free."""
    row = adjacency[len(adjacency) - n_logits, : len(selected)].abs()
    best = [selected[i] for i in row.topk(3).indices.tolist()]
    zero = [(*active_features[i].tolist(), 0.0) for i in best]
    scale = [(*active_features[best[0]].tolist(), 3 * activations[best[0]].item())]
    return [
        (f"{name} {freeze}", changes, freeze)
        for name, changes in (("zero", zero), ("scale", scale))
        for freeze in (True, False)
    ]


# ------------------------------------------------------------------ comparing


def compare(work: Path) -> list[str]:
    """What differs between the two graphs and their files (nothing: an empty list)."""
    import torch

    ours, theirs = torch.load(work / "gpt2.pt"), torch.load(work / "circuit-tracer.pt")
    problems = []
    for key in ("active_features", "selected_features", "logit_tokens"):
        if not torch.equal(ours[key].long().cpu(), theirs[key].long().cpu()):
            problems.append(f"{key} differ")
    if problems:
        return problems
    largest = theirs["adjacency"].abs().max().item()
    diff = (ours["adjacency"] - theirs["adjacency"]).abs().max().item()
    print(
        f"adjacency {tuple(ours['adjacency'].shape)}: largest edge {largest:.4g}, max difference {diff:.3g} "
        f"({diff / largest:.2e} of the largest)"
    )
    if diff > TOLERANCE * largest:
        problems.append(f"edges differ by {diff:.3g} > {TOLERANCE} x {largest:.4g}")
    p = (ours["logit_probabilities"] - theirs["logit_probabilities"]).abs().max().item()
    if p > 1e-5:
        problems.append(f"logit probabilities differ by {p:.3g}")
    a = json.loads((work / "gpt2-files" / "graph.json").read_text())
    b = json.loads((work / "circuit-tracer-files" / "graph.json").read_text())
    ids_a, ids_b = [n["node_id"] for n in a["nodes"]], [n["node_id"] for n in b["nodes"]]
    links_a = {(x["source"], x["target"]): x["weight"] for x in a["links"]}
    links_b = {(x["source"], x["target"]): x["weight"] for x in b["links"]}
    print(f"graph files: {len(ids_a)} / {len(ids_b)} nodes, {len(links_a)} / {len(links_b)} links", end=" ")
    print("(gpt2 / circuit-tracer)")
    if ids_a != ids_b:
        problems.append(f"graph files' nodes differ: {sorted(set(ids_a) ^ set(ids_b))[:8]}")
    elif set(links_a) != set(links_b):
        problems.append(f"graph files' links differ: {sorted(set(links_a) ^ set(links_b))[:8]}")
    else:
        worst = max((abs(links_a[k] - links_b[k]) for k in links_a), default=0.0)
        if worst > TOLERANCE * largest:
            problems.append(f"graph files' link weights differ by {worst:.3g}")
        for x, y in zip(a["nodes"], b["nodes"]):
            for field in x:
                if field not in y:
                    problems.append(f"field {field} not in circuit-tracer's nodes")
                elif isinstance(x[field], float) and y[field] is not None:
                    if abs(x[field] - y[field]) > 1e-4 * max(1.0, abs(y[field])):
                        problems.append(f"node {x['node_id']} {field}: {x[field]} vs {y[field]}")
                elif x[field] != y[field] and field != "influence":
                    problems.append(f"node {x['node_id']} {field}: {x[field]!r} vs {y[field]!r}")
        problems += [
            f"metadata {k}: {a['metadata'][k]!r} vs {b['metadata'][k]!r}"
            for k in b["metadata"]
            if a["metadata"].get(k) != b["metadata"][k] and k != "prompt"
        ]
    return problems[:20]


def compare_interventions(work: Path) -> list[str]:
    """The changed runs' logits and activations, within 1e-4 of the largest."""
    import torch

    ours, theirs = torch.load(work / "gpt2-interventions.pt"), torch.load(work / "circuit-tracer-interventions.pt")
    problems = []
    for name, (logits, acts) in theirs.items():
        mine = ours[name]
        moved = (mine[0] - mine[2]).abs().max().item()
        print(f"intervention {name}: moves the logits by up to {moved:.3g}")
        if moved < 1e-3:
            problems.append(f"intervention {name} changes nothing: it tests nothing")
        for what, a, b in (("logits", mine[0], logits), ("activations", mine[1], acts)):
            diff, largest = (a - b).abs().max().item(), b.abs().max().item()
            print(f"intervention {name}: {what} within {diff:.2g} ({diff / largest:.1e} of the largest)")
            if diff > TOLERANCE * largest:
                problems.append(f"intervention {name}: {what} differ by {diff:.3g}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--circuit-tracer", default="/tmp/ctvenv/bin/python", help="circuit-tracer's venv's Python")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--d-transcoder", type=int, default=256)
    parser.add_argument("--active", type=int, default=8, help="about this many features fire a position and layer")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--jumprelu", action="store_true")
    parser.add_argument("--skip", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="work (and keep) here")
    parser.add_argument(
        "--trained", nargs=2, metavar=("DIR", "MODEL"), help="check circuit-tracer reads a set trained here"
    )
    parser.add_argument("--role", choices=["gpt2", "circuit-tracer", "ct-load"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.role == "ct-load":
        ct_load(args.work, args.trained[0])
        return 0
    if args.trained and not args.role:
        return check_trained(args)
    if args.role:
        run = run_gpt2 if args.role == "gpt2" else run_circuit_tracer
        print(json.dumps(run(args.work, args)))
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="graph-bench-"))  # no "t5" in it: TransformerLens reads names
    work.mkdir(parents=True, exist_ok=True)
    (work / "inputs.json").write_text(json.dumps(write_inputs(work, args)))
    results = {}
    passthrough = ["--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    passthrough += [] if args.max_feature_nodes is None else ["--max-feature-nodes", str(args.max_feature_nodes)]
    for role, python in (("gpt2", sys.executable), ("circuit-tracer", args.circuit_tracer)):
        command = [python, str(HERE), "--role", role, "--work", str(work), *passthrough]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout, done.stderr[-4000:], file=sys.stderr)
            return 1
        results[role] = json.loads(done.stdout.strip().splitlines()[-1])
    problems = compare(work) + compare_interventions(work)
    for p in problems:
        print("DIFFERS:", p)
    g, c = results["gpt2"], results["circuit-tracer"]
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}; "
        f"shape {args.shape}, {args.tokens} tokens, d_transcoder {args.d_transcoder}, "
        f"batch {args.batch_size}"
    )
    print(f"gpt2:           {g['seconds']:8.2f} s  {g['mib']:8.1f} MiB")
    print(f"circuit-tracer: {c['seconds']:8.2f} s  {c['mib']:8.1f} MiB")
    speed, memory = c["seconds"] / g["seconds"], g["mib"] / max(c["mib"], 1e-9)
    print(f"gpt2 is {speed:.2f}x circuit-tracer's speed, {memory:.2f}x its memory")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

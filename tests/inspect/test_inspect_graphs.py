"""Attribution graphs (gpt2.inspect.graphs) against circuit-tracer's definitions, computed by a
reference written here with TransformerLens 3.9 and autograd, as circuit-tracer's own
TransformerLens backend computes them (replacement_model_transformerlens.py, attribution/
context_transformerlens.py): attention patterns and LayerNorm scales detached, each MLP's output
detached but for its skip path, a gradient injected per target (a feature's encoder row at the
MLP's input, a logit's demeaned unembedding column at ln_final's output), each source's edge the
gradient where it writes times what it writes. gpt2 computes the same numbers with no autograd
(the transpose written out). circuit-tracer itself runs in a venv of its own: benchmarks/
attribution_graph.py compares the two (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import (
    circuit_tracer_forward,
    circuit_tracer_layer,
    hf_and_ours,
    transformer_lens_from_hf,
    write_circuit_tracer,
)

from gpt2 import GPT2Error
from gpt2.inspect import AttributionGraph, attribution_graph, load_transcoders

CONFIG = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4)
IDS = [50256, 464, 3290, 26172, 262, 3797, 13, 383, 3797, 4966]
L, T, C = 2, len(IDS), 32
ERROR = "mlp reconstruction error"  # circuit-tracer's feature_type of an error node


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    hf, ours = hf_and_ours(tmp_path_factory.mktemp("graphs-model"), seed=7, **CONFIG)
    tl = transformer_lens_from_hf(hf)
    for p in tl.parameters():
        p.requires_grad_(False)
    return hf, ours, tl


def transcoder_set(directory, jumprelu=False, skip=False, seed=1):
    """A random set in circuit-tracer's layout (about a fifth of the features fire): (its weights by layer, loaded)."""
    layers = {i: circuit_tracer_layer(seed + 10 * i, jumprelu, skip, b_enc=-0.8) for i in range(L)}
    write_circuit_tracer(directory, layers)
    return layers, load_transcoders(directory)


def reference(tl, layers, ids, logit_ids, skip):
    """circuit-tracer's graph written with TransformerLens and autograd: (active features (layer,
    position, feature) with their activations, adjacency (N, N)), all targets in one batched backward."""
    _, cache = tl.run_with_cache(torch.tensor([ids]))
    ln2 = [tl.blocks[i].ln2 for i in range(L)]
    mlp_in = [cache[f"blocks.{i}.ln2.hook_normalized"][0] * ln2[i].w + ln2[i].b for i in range(L)]  # the MLP's input
    features, errors = [], []
    for i in range(L):
        acts, _ = circuit_tracer_forward(mlp_in[i], layers[i])
        acts[0] = 0  # position 0 is left out
        features += [(i, p, f, acts[p, f].item()) for p, f in acts.nonzero().tolist()]
        out = acts @ layers[i]["W_dec"] + layers[i]["b_dec"] + (mlp_in[i] @ layers[i]["W_skip"].T if skip else 0)
        error = cache[f"blocks.{i}.hook_mlp_out"][0] - out
        error[0] = 0
        errors.append(error)
    W_U = tl.W_U
    targets = [(i, p, layers[i]["W_enc"][f]) for i, p, f, _ in features]
    targets += [(L, len(ids) - 1, W_U[:, t] - W_U.mean(1)) for t in logit_ids]
    B, n_f, K = len(targets), len(features), len(logit_ids)
    delta = [torch.zeros(B, len(ids), C, requires_grad=True) for _ in range(L + 1)]  # MLP outputs', then embed's
    reads = {}

    def read_mlp_in(x, hook):
        reads[hook.layer()] = x * ln2[hook.layer()].w + ln2[hook.layer()].b
        return x

    def mlp_out(x, hook):
        i = hook.layer()
        s = reads[i] @ layers[i]["W_skip"].T if skip else reads[i] * 0
        return x.detach() - s.detach() + s + delta[i]

    def read_final(x, hook):
        reads[L] = x * tl.ln_final.w + tl.ln_final.b
        return x

    def detach(x, hook):
        return x.detach()

    hooks = [("hook_embed", lambda x, hook: x + delta[L]), ("ln_final.hook_scale", detach)]
    hooks += [("ln_final.hook_normalized", read_final)]
    for i in range(L):
        hooks += [(f"blocks.{i}.attn.hook_pattern", detach), (f"blocks.{i}.ln1.hook_scale", detach)]
        hooks += [(f"blocks.{i}.ln2.hook_scale", detach), (f"blocks.{i}.ln2.hook_normalized", read_mlp_in)]
        hooks += [(f"blocks.{i}.hook_mlp_out", mlp_out)]
    with torch.enable_grad():
        tl.run_with_hooks(torch.tensor([ids] * B), fwd_hooks=hooks)
        sum(reads[i][b, p] @ v for b, (i, p, v) in enumerate(targets)).backward()
    n = n_f + (L + 1) * len(ids) + K
    A = torch.zeros(n, n)
    rows = list(range(n_f)) + list(range(n - K, n))
    W_dec = torch.stack([a * layers[i]["W_dec"][f] for i, _, f, a in features])  # (n_f, C)
    where = [(i, p) for i, p, _, _ in features]
    for b, r in enumerate(rows):
        A[r, :n_f] = torch.stack([delta[i].grad[b, p] for i, p in where]).mul(W_dec).sum(-1)
        for i in range(L):
            A[r, n_f + i * len(ids) : n_f + (i + 1) * len(ids)] = (delta[i].grad[b] * errors[i]).sum(-1)
        A[r, n_f + L * len(ids) : n_f + (L + 1) * len(ids)] = (delta[L].grad[b] * tl.W_E[ids]).sum(-1)
    return features, A


@pytest.mark.parametrize("jumprelu", [False, True])
@pytest.mark.parametrize("skip", [False, True])
def test_graph_equals_circuit_tracers_definitions(models, tmp_path, jumprelu, skip):
    hf, model, tl = models
    layers, tcs = transcoder_set(tmp_path / "set", jumprelu, skip)
    graph = attribution_graph(model, IDS, tcs, max_n_logits=5, desired_logit_prob=0.9, batch_size=7)
    features, A = reference(tl, layers, IDS, graph.logit_tokens.tolist(), skip)
    assert graph.active_features.tolist() == [[i, p, f] for i, p, f, _ in features]
    assert 40 < len(features) < 2 * 9 * 48 / 2  # sparse, but with paths through both layers
    torch.testing.assert_close(graph.activation_values, torch.tensor([a for *_, a in features]), atol=1e-5, rtol=0)
    assert graph.selected_features.tolist() == list(range(len(features)))
    largest = A.abs().max()
    assert graph.adjacency.shape == A.shape and (graph.adjacency - A).abs().max() <= 1e-5 * largest
    n_f = len(features)
    assert graph.adjacency[n_f : -graph.n_logits].abs().sum() == 0  # errors and tokens have no inputs
    assert A[:, n_f : n_f + L * T].abs().max() > 0.01 * largest  # the error nodes carry weight: they are tested


def test_logit_nodes(models, tmp_path):
    hf, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set")
    with torch.no_grad():
        probs = hf(torch.tensor([IDS])).logits[0, -1].softmax(-1)
    top = probs.topk(20)
    for max_n, desired in [(20, 0.5), (3, 0.99), (20, 0.0), (1, 0.95)]:
        graph = attribution_graph(model, IDS, tcs, max_n_logits=max_n, desired_logit_prob=desired)
        reaching = int((top.values.cumsum(0) < desired).sum()) + 1  # the fewest reaching `desired`
        assert graph.logit_tokens.tolist() == top.indices[: min(max_n, reaching)].tolist()
        torch.testing.assert_close(graph.logit_probabilities, top.values[: graph.n_logits], atol=1e-6, rtol=0)
        assert graph.logit_texts == [model.tokenizer.decode([t]) for t in graph.logit_tokens.tolist()]


def test_max_feature_nodes_keeps_the_rows_of_the_chosen(models, tmp_path):
    _, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set", skip=True)
    full = attribution_graph(model, IDS, tcs, max_n_logits=4)
    part = attribution_graph(model, IDS, tcs, max_n_logits=4, max_feature_nodes=25, batch_size=5, update_interval=2)
    chosen = part.selected_features
    assert len(chosen) == 25 and chosen.tolist() == sorted(set(chosen.tolist()))
    assert torch.equal(part.active_features, full.active_features)
    rest = torch.arange(full.n_features, len(full.adjacency))  # errors, tokens, logits
    keep = torch.cat([chosen, rest])
    torch.testing.assert_close(part.adjacency[:25], full.adjacency[chosen][:, keep], atol=1e-5, rtol=0)
    torch.testing.assert_close(part.adjacency[-4:], full.adjacency[-4:][:, keep], atol=1e-5, rtol=0)
    influence = full.node_influence()[: full.n_features]  # the chosen are among the most influential
    assert influence[chosen].mean() > 2 * influence.mean()


def test_influence_is_the_sum_over_paths(models, tmp_path):
    _, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set")
    graph = attribution_graph(model, IDS, tcs, max_n_logits=3)
    A = graph.adjacency.abs().double()
    A = A / A.sum(1, keepdim=True).clamp(min=1e-10)
    paths = torch.linalg.inv(torch.eye(len(A), dtype=torch.float64) - A) - torch.eye(len(A), dtype=torch.float64)
    expected = graph.logit_weights().double() @ paths  # w (A + A^2 + ...) = w ((I - A)^-1 - I)
    torch.testing.assert_close(graph.node_influence().double(), expected, atol=1e-6, rtol=1e-4)


def test_prune(models, tmp_path):
    _, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set")
    graph = attribution_graph(model, IDS, tcs, max_n_logits=3)
    n_f, n_end = graph.n_features, graph.n_pos + graph.n_logits
    nodes, edges, cumulative = graph.prune(0.5, 0.9)
    assert nodes[-n_end:].all() and 0 < nodes[:n_f].sum() < n_f
    assert not edges[~nodes].any() and not edges[:, ~nodes].any()
    kept = nodes.nonzero().flatten()
    for i in kept[kept < len(nodes) - n_end].tolist():  # a kept feature or error: an edge out; a feature: one in
        assert edges[:, i].any() and (i >= n_f or edges[i].any())
    influence = graph.node_influence()
    order = influence.argsort(descending=True)
    assert torch.all(cumulative[order].diff() >= -1e-6) and abs(cumulative.max().item() - 1) < 1e-5
    everything, _, _ = graph.prune(1.0, 1.0)
    assert everything.sum() >= nodes.sum()
    with pytest.raises(GPT2Error, match="node_threshold"):
        graph.prune(1.5)


def test_graph_files_for_circuit_tracers_viewer(models, tmp_path):
    _, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set")
    graph = attribution_graph(model, "The cat sat on the", tcs, max_n_logits=3)
    assert graph.ids[0] == 50256 and graph.tokens[0] == "<|endoftext|>"  # put first, as circuit-tracer does
    path = graph.save(tmp_path / "graphs", "cat", scan="tiny")
    data = json.loads(path.read_text())
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    meta = data["metadata"]
    assert meta["slug"] == "cat" and meta["scan"] == "tiny" and meta["prompt_tokens"] == graph.tokens
    assert meta["prompt"] == "<|endoftext|>The cat sat on the"
    ids = {n["node_id"] for n in data["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in data["links"])
    nodes, edges, _ = graph.prune()
    assert len(data["links"]) == edges.sum()
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert {"embedding", "logit"} <= kinds <= {"embedding", "logit", "cross layer transcoder", ERROR}
    tokens = [n for n in data["nodes"] if n["feature_type"] == "embedding"]
    assert [n["node_id"] for n in tokens] == [f"E_{t}_{p}" for p, t in enumerate(graph.ids)]
    logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    top = graph.logit_tokens[0].item()
    assert logits[0]["node_id"] == f"3_{top}_{graph.n_pos - 1}" and logits[0]["is_target_logit"]
    assert logits[0]["clerp"] == f'Output "{graph.logit_texts[0]}" (p={graph.logit_probabilities[0].item():.3f})'
    for n in data["nodes"]:
        if n["feature_type"] == "cross layer transcoder":
            layer, feature, position = map(int, n["node_id"].split("_"))
            i = graph.active_features.tolist().index([layer, position, feature])
            assert abs(n["activation"] - graph.activation_values[i].item()) < 1e-6
            assert n["feature"] == (layer + feature) * (layer + feature + 1) // 2 + feature
    graph.save(tmp_path / "graphs", "other")
    graph.save(tmp_path / "graphs", "cat")  # the same slug again: replaced in the index, not added
    index = json.loads((tmp_path / "graphs" / "graph-metadata.json").read_text())
    assert [g["slug"] for g in index["graphs"]] == ["other", "cat"]


def test_a_model_without_tokenizer(tmp_path):
    from pathlib import Path

    from gpt2 import GPT2

    model = GPT2.from_pretrained(Path(__file__).parents[1] / "fixtures" / "induction_2l", device="cpu")
    assert model.tokenizer is None
    C_ = model.config.n_embd
    layers = {i: circuit_tracer_layer(i, False, False, d_model=C_, b_enc=-0.5) for i in range(model.config.n_layer)}
    write_circuit_tracer(tmp_path / "set", layers)
    ids = [5, 9, 14, 3, 5, 9, 14]
    graph = attribution_graph(model, ids, load_transcoders(tmp_path / "set"))
    assert isinstance(graph, AttributionGraph) and graph.ids == ids and graph.tokens is None  # nothing put first
    assert graph.logit_texts == [str(t) for t in graph.logit_tokens.tolist()]
    assert graph.to_json("g")["metadata"]["prompt_tokens"] == [str(i) for i in ids]
    with pytest.raises(GPT2Error, match="prepend_bos"):
        attribution_graph(model, ids, load_transcoders(tmp_path / "set"), prepend_bos=True)


def test_bad_input(models, tmp_path):
    _, model, _ = models
    _, tcs = transcoder_set(tmp_path / "set")
    cases = [
        (dict(transcoders="set"), "TranscoderSet"),
        (dict(max_n_logits=0), "max_n_logits"),
        (dict(desired_logit_prob=1.5), "desired_logit_prob"),
        (dict(max_feature_nodes=0), "max_feature_nodes"),
        (dict(batch_size=0), "batch_size"),
        (dict(ids=[]), "empty"),
        (dict(ids=[50257]), "50257"),
    ]
    for change, match in cases:
        kwargs = dict(ids=IDS, transcoders=tcs) | change
        with pytest.raises(GPT2Error, match=match):
            attribution_graph(model, kwargs.pop("ids"), kwargs.pop("transcoders"), **kwargs)
    layers = {i: circuit_tracer_layer(i, False, False) for i in range(L)}
    write_circuit_tracer(tmp_path / "resid", layers, feature_input_hook="hook_resid_pre")
    with pytest.raises(GPT2Error, match=r"read h\.L\.resid_pre"):
        attribution_graph(model, IDS, load_transcoders(tmp_path / "resid"))
    write_circuit_tracer(tmp_path / "one", {0: layers[0]})
    with pytest.raises(GPT2Error, match="no transcoder for layers 1"):
        attribution_graph(model, IDS, load_transcoders(tmp_path / "one"))
    graph = attribution_graph(model, IDS, tcs, max_n_logits=2)
    for slug in ("", "a/b", 3):
        with pytest.raises(GPT2Error, match="slug"):
            graph.to_json(slug)
    with pytest.raises(GPT2Error, match="node"):
        graph.node(len(graph.adjacency))


def test_a_graph_without_active_features(models, tmp_path):
    _, model, _ = models
    layers = {i: circuit_tracer_layer(i, False, False, b_enc=-50.0) for i in range(L)}  # nothing fires
    write_circuit_tracer(tmp_path / "quiet", layers)
    graph = attribution_graph(model, IDS, load_transcoders(tmp_path / "quiet"), max_n_logits=2)
    assert graph.n_features == 0 and graph.adjacency.shape == ((L + 1) * T + 2,) * 2
    assert graph.adjacency[-2:, : L * T].abs().sum() > 0  # the errors carry everything
    assert {n["feature_type"] for n in graph.to_json("q")["nodes"]} <= {"embedding", "logit", ERROR}

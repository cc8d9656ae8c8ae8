"""Attribution graphs: which transcoder features, through which paths, made a prediction.

    tcs = gpt2.inspect.load_transcoders("gpt2-transcoders")
    graph = gpt2.inspect.attribution_graph(model, "The capital of France is", tcs)
    graph.adjacency            # (N, N) [target, source]: each edge's direct effect
    pruned = graph.prune()     # the nodes and edges that carry most of the influence on the logits
    graph.save("graphs", "capital")   # circuit-tracer's graph files, for its viewer

The method is circuit-tracer's ("Circuit Tracing", Ameisen et al. 2025), on gpt2's own pass. The
local replacement model of one prompt: each block's MLP is replaced by its transcoder's features
plus an error node (what the transcoder misses at that block and position), and the attention
patterns and every LayerNorm's scale are frozen at their values on the prompt. What remains is
linear in the residual stream, so the effect of a source node s on a target node t is

    A[t, s] = (d t / d r_s) . v_s

r_s where s writes into the residual stream and v_s what it writes: a feature's activation times
its decoder row (a_s W_dec[f]), an error node's vector, a token's embedding (wte[id]; the position
embedding and the biases are constants, not nodes). A feature target is its pre-activation
(W_enc[:, f] . x at its transcoder's input, the bias left out), a logit target is that logit minus
the mean logit (W_U[:, id] - mean over the vocabulary of W_U, at ln_f's output).

The derivatives are computed here by writing out the transpose of that linear map, block by block
from the top (`_Replacement.rows`): a batch of targets at once, no autograd graph kept.

Nodes in circuit-tracer's order: the active features sorted by (layer, position, feature), the
error nodes layer by layer, position by position, a token node per position, the logit nodes,
most probable first. Position 0 has no features and no error (circuit-tracer's: the first
position, <|endoftext|>, is a sink with outsized activations); its MLP output is a constant.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from gpt2._checks import boolean, int_between, positive_int, real_between
from gpt2._files import atomic_write_text, read_json_object, writable_directory
from gpt2.errors import InvalidArgumentError
from gpt2.inspect.tracing import token_ids, trace
from gpt2.inspect.transcoders import TranscoderSet, check_transcoder_set
from gpt2.inspect.weights import Weights
from gpt2.model.model import GPT2

INPUT_STEPS = ("ln_2", "resid_mid")  # where a transcoder may read: the MLP's input, or before its LayerNorm
OUTPUT_STEP = "mlp.c_proj"  # what it stands in for: the MLP's output


# ------------------------------------------------------------------ the graph


class PruneResult(NamedTuple):
    """What `AttributionGraph.prune` keeps: node_mask (N,), edge_mask (N, N) [target, source],
    and each node's cumulative influence (the share of all influence held by the nodes at least as
    influential as it: small for the most influential)."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative_scores: torch.Tensor


@dataclass
class AttributionGraph:
    """A prompt's attribution graph (the module's docstring): `adjacency[target, source]`.

    ids, tokens: the prompt as run (its tokens' text, None without a tokenizer)
    active_features (n, 3): every active feature's (layer, position, feature), sorted
    activation_values (n,): their activations
    selected_features (m,): the ones that are nodes (all of them unless max_feature_nodes chose)
    logit_tokens (K,), logit_probabilities (K,), logit_texts: the logit nodes' ids, probabilities
    and tokens' text (their ids written out without a tokenizer)
    """

    ids: list[int]
    tokens: list[str] | None
    active_features: torch.Tensor
    activation_values: torch.Tensor
    selected_features: torch.Tensor
    adjacency: torch.Tensor
    logit_tokens: torch.Tensor
    logit_probabilities: torch.Tensor
    logit_texts: list[str]
    n_layer: int

    @property
    def n_pos(self) -> int:
        return len(self.ids)

    @property
    def n_features(self) -> int:
        """How many feature nodes the graph has (its first rows and columns)."""
        return len(self.selected_features)

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    def node(self, i: int) -> dict:
        """Node i described: {"kind": feature, error, token or logit, and where it is}."""
        n_features, n_pos = self.n_features, self.n_pos
        errors_end = n_features + self.n_layer * n_pos
        i = int_between("node", i, 0, len(self.adjacency) - 1, "a node index")
        if i < n_features:
            layer, position, feature = self.active_features[self.selected_features[i]].tolist()
            value = self.activation_values[self.selected_features[i]].item()
            return {"kind": "feature", "layer": layer, "position": position, "feature": feature, "activation": value}
        if i < errors_end:
            layer, position = divmod(i - n_features, n_pos)
            return {"kind": "error", "layer": layer, "position": position}
        if i < errors_end + n_pos:
            position = i - errors_end
            return {"kind": "token", "position": position, "id": self.ids[position]}
        k = i - errors_end - n_pos
        return {
            "kind": "logit",
            "id": int(self.logit_tokens[k]),
            "probability": self.logit_probabilities[k].item(),
            "position": n_pos - 1,
        }

    def logit_weights(self) -> torch.Tensor:
        """(N,): each logit node's probability, 0 for the other nodes: where influence starts."""
        weights = torch.zeros(len(self.adjacency))
        weights[-self.n_logits :] = self.logit_probabilities
        return weights

    def node_influence(self) -> torch.Tensor:
        """(N,): each node's total influence on the logits, through every path, in the graph with
        each row normalised to its edges' absolute values (circuit-tracer's)."""
        return influence(normalized(self.adjacency), self.logit_weights())

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PruneResult:
        """Keep the most influential nodes that hold `node_threshold` of all influence (tokens and
        logits always), then the edges holding `edge_threshold` of the influence among them, then
        drop feature and error nodes left without an edge out (and features without one in), until
        none is: circuit-tracer's `prune_graph`."""
        node_threshold, edge_threshold = check_thresholds(node_threshold, edge_threshold)
        n_kept = self.n_logits + self.n_pos  # tokens and logits: the last nodes
        weights = self.logit_weights()
        node_influence = self.node_influence()
        node_mask = node_influence >= threshold_keeping(node_influence, node_threshold)
        node_mask[-n_kept:] = True
        pruned = self.adjacency.clone()
        pruned[~node_mask] = 0
        pruned[:, ~node_mask] = 0
        edge_scores = edge_influence(pruned, weights)
        edge_mask = edge_scores >= threshold_keeping(edge_scores.flatten(), edge_threshold)
        while True:
            before = node_mask.clone()
            node_mask[:-n_kept] &= edge_mask[:, :-n_kept].any(0)  # feature and error nodes: an edge out
            node_mask[: self.n_features] &= edge_mask[: self.n_features].any(1)  # features: an edge in
            edge_mask[~node_mask] = False
            edge_mask[:, ~node_mask] = False
            if torch.equal(node_mask, before):
                break
        ordered, order = torch.sort(node_influence, descending=True)
        cumulative = torch.zeros_like(node_influence)
        cumulative[order] = torch.cumsum(ordered, 0) / ordered.sum()
        return PruneResult(node_mask, edge_mask, cumulative)

    def scores(self) -> tuple[float, float]:
        """(replacement, completeness), circuit-tracer's: the share of the tokens' and errors'
        influence on the logits that comes from the tokens (through features alone), and the
        influence-weighted share of every node's inputs that is not an error node's."""
        errors = slice(self.n_features, self.n_features + self.n_layer * self.n_pos)
        tokens = slice(errors.stop, errors.stop + self.n_pos)
        weights = self.logit_weights()
        matrix = normalized(self.adjacency)
        node_influence = influence(matrix, weights)
        from_tokens, from_errors = node_influence[tokens].sum(), node_influence[errors].sum()
        replacement = from_tokens / (from_tokens + from_errors)
        not_error = 1 - matrix[:, errors].sum(-1)
        output = node_influence + weights
        return replacement.item(), ((not_error * output).sum() / output.sum()).item()

    def to_json(
        self,
        slug: str,
        scan: str = "gpt2",
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        prompt: str | None = None,
    ) -> dict:
        """The pruned graph as circuit-tracer's `create_graph_files` writes it (its viewer's format):
        {"metadata", "qParams", "nodes", "links"}."""
        return graph_json(self, slug, scan, node_threshold, edge_threshold, prompt)

    def save(
        self,
        directory: str | Path,
        slug: str,
        scan: str = "gpt2",
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        prompt: str | None = None,
    ) -> Path:
        """Write `directory`/`slug`.json and add the graph to `directory`/graph-metadata.json (replacing
        one of the same slug), as circuit-tracer's `create_graph_files`: its viewer (`circuit_tracer
        start-server --graph_file_dir directory`) opens them. Returns the graph's file."""
        data = self.to_json(slug, scan, node_threshold, edge_threshold, prompt)
        directory = writable_directory(directory)
        path = directory / f"{slug}.json"
        atomic_write_text(path, json.dumps(data, indent=2))
        index_path = directory / "graph-metadata.json"
        index = {"graphs": []}
        if index_path.is_file():
            index = read_json_object(index_path, InvalidArgumentError, "circuit-tracer's graph-metadata.json")
        graphs = [g for g in index.get("graphs", []) if g.get("slug") != slug] + [data["metadata"]]
        atomic_write_text(index_path, json.dumps({**index, "graphs": graphs}, indent=2))
        return path


def check_thresholds(node_threshold: float, edge_threshold: float) -> tuple[float, float]:
    """Pruning's thresholds, each a share of the influence: in [0, 1]."""
    return real_between("node_threshold", node_threshold, 0.0, 1.0), real_between(
        "edge_threshold", edge_threshold, 0.0, 1.0
    )


def normalized(matrix: torch.Tensor, floor: float = 1e-10) -> torch.Tensor:
    """|A| with each row scaled to sum to 1 (a row of zeros stays zeros): each target's share from each
    source. `floor`: the least row sum divided by (circuit-tracer's: 1e-10, 1e-8 in its partial ranking)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(1, keepdim=True).clamp(min=floor)


def influence(matrix: torch.Tensor, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """weights @ (A + A^2 + A^3 + ...): each node's influence on the weighted targets through every
    path. The graph has no cycles (each edge goes up the layers or along the positions), so the
    series ends: A^n = 0 once n is longer than the longest path."""
    step = weights @ matrix
    total = step.clone()
    for _ in range(max_iter):
        if not step.any():
            return total
        step = step @ matrix
        total += step
    raise RuntimeError(f"influence: the series did not end after {max_iter} steps (the graph has a cycle)")


def edge_influence(matrix: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N, N): each edge's share of its target's inputs times the target's influence (logits: their weight)."""
    shares = normalized(matrix)
    return shares * (influence(shares, weights) + weights)[:, None]


def threshold_keeping(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """The score above which the highest scores hold `fraction` of their sum."""
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, 0) / ordered.sum()
    return ordered[min(int(torch.searchsorted(cumulative, fraction)), len(ordered) - 1)]


# ------------------------------------------------------------------ the graph's files, circuit-tracer's


def graph_json(
    graph: AttributionGraph, slug: str, scan: str, node_threshold: float, edge_threshold: float, prompt: str | None
) -> dict:
    """circuit-tracer's graph file (frontend/graph_models.Model) of `graph` pruned at the thresholds."""
    if not isinstance(slug, str) or not slug or "/" in slug:
        raise InvalidArgumentError(f"slug must be a file name without '/', got {slug!r}", "slug")
    node_mask, edge_mask, cumulative = graph.prune(node_threshold, edge_threshold)
    nodes = {i: _node_json(graph, i, cumulative[i].item()) for i in node_mask.nonzero().flatten().tolist()}
    targets, sources = edge_mask.nonzero(as_tuple=True)
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": graph.adjacency[t, s].item()}
        for t, s in zip(targets.tolist(), sources.tolist())
        if s in nodes and t in nodes
    ]
    linked = {end for link in links for end in (link["source"], link["target"])}
    kept = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    tokens = graph.tokens if graph.tokens is not None else [str(i) for i in graph.ids]
    metadata = {
        "slug": slug,
        "scan": scan,
        "transcoder_list": [],
        "prompt_tokens": tokens,
        "prompt": "".join(tokens) if prompt is None else prompt,
        "node_threshold": node_threshold,
        "schema_version": 1,
    }
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": kept, "links": links}


def _node_json(graph: AttributionGraph, i: int, cumulative: float) -> dict:
    """Node i as circuit-tracer's frontend Node: its ids, layer ("E" tokens, n_layer + 1 logits), position."""
    node = graph.node(i)
    kind, position = node["kind"], node["position"]
    fields = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0}
    if kind == "feature":
        layer, feature = node["layer"], node["feature"]
        cantor = (layer + feature) * (layer + feature + 1) // 2 + feature  # one integer for (layer, feature)
        ids = (f"{layer}_{feature}_{position}", cantor, str(layer), "cross layer transcoder", f"{layer}_{feature}-0")
        extra = {"clerp": "", "influence": cumulative, "activation": node["activation"]}
    elif kind == "error":
        layer = node["layer"]
        ids = (f"0_{layer}_{position}", -1, str(layer), "mlp reconstruction error", f"{layer}_{position}-0")
        extra = {"clerp": "", "influence": cumulative, "activation": None}
    elif kind == "token":
        ids = (f"E_{node['id']}_{position}", position, "E", "embedding", f"E_{node['id']}-{position}")
        extra = {"clerp": "", "influence": cumulative, "activation": None}
    else:
        token = graph.logit_texts[i - (len(graph.adjacency) - graph.n_logits)]
        layer = str(graph.n_layer + 1)
        ids = (f"{layer}_{node['id']}_{position}", node["id"], layer, "logit", f"L_{node['id']}-{position}")
        fields |= {"token_prob": node["probability"], "is_target_logit": i == len(graph.adjacency) - graph.n_logits}
        extra = {"clerp": f'Output "{token}" (p={node["probability"]:.3f})', "influence": None, "activation": None}
    node_id, feature, layer, feature_type, js_id = ids
    return {
        "node_id": node_id,
        "feature": feature,
        "layer": layer,
        "ctx_idx": position,
        "feature_type": feature_type,
        **fields,
        "jsNodeId": js_id,
        **extra,
    }


# ------------------------------------------------------------------ computing it


class _Replacement:
    """A prompt's local replacement model, frozen (the module's docstring): what the transpose of its
    linear map needs, block by block, and its nodes' vectors.

    The map, block by block, is r_mid = r + attn(ln_1(r)), r_next = r_mid + mlp_out, where
      ln(x) = (x - mean(x)) / s * g              s frozen: (T, 1), each position's
      attn(a)_t = sum_h sum_u P_h[t, u] (a_u W_V,h) W_O,h    P frozen: (H, T, T)
      mlp_out = the MLP's output (a constant) + x W_skip^T   x the transcoder's input (skip transcoders)
    and its transpose, from a gradient g at r_next: g_mid = g + ln_2^T(g W_skip + injected), then
    g_r = g_mid + ln_1^T(attn^T(g_mid)), ln^T(u) = center(u * g / s), attn^T(g)_u = sum_h sum_t
    P_h[t, u] (g_t W_O,h^T) W_V,h^T."""

    def __init__(self, model: GPT2, ids: list[int], transcoders: TranscoderSet):
        self.n_layer, self.T = model.config.n_layer, len(ids)
        self.input_step = transcoders.input_step
        layers = range(self.n_layer)
        steps = ("ln_1.scale", "attn.pattern", "ln_2.scale", self.input_step, OUTPUT_STEP)
        names = [f"h.{i}.{step}" for i in layers for step in steps] + ["ln_f.scale", "wte"]
        t = trace(model, ids, names=names)
        act = {name: value.float() for name, value in t.activations.items()}
        self.logits = t.logits[-1].float()  # (V,): the last position's
        weights, blocks = Weights(model), model.transformer.h
        self.ln_1 = [(_gain(blocks[i].ln_1), act[f"h.{i}.ln_1.scale"]) for i in layers]  # (C,), (T, 1)
        self.ln_2 = [(_gain(blocks[i].ln_2), act[f"h.{i}.ln_2.scale"]) for i in layers]
        self.ln_f = (_gain(model.transformer.ln_f), act["ln_f.scale"])
        self.pattern = [act[f"h.{i}.attn.pattern"] for i in layers]  # (H, T, T)
        self.W_V, self.W_O = [], []
        for i in layers:
            a = weights.attention(i)
            H, C, d = a["W_V"].shape
            self.W_V.append(a["W_V"].permute(1, 0, 2).reshape(C, H * d).float())  # (C, H*d): the heads' v side by side
            self.W_O.append(a["W_O"].reshape(H * d, C).float())  # (H*d, C)
        self.W_skip = [None if tc.W_skip is None else tc.W_skip.float() for tc in transcoders]  # (C, C)
        self.token_vectors = act["wte"]  # (T, C): the token nodes' vectors, the embeddings the pass read
        self.W_U = weights.W_U.float()  # (C, V)
        self._features(transcoders, [act[f"h.{i}.{self.input_step}"] for i in layers], act)

    def _features(self, transcoders: TranscoderSet, inputs: list[torch.Tensor], act: dict) -> None:
        """Each block's active features (none at position 0), their encoder and decoder vectors, and
        its error: the MLP's output less the transcoder's reconstruction from them."""
        found, values, encoders, decoders, errors = [], [], [], [], []
        for layer, (tc, x) in enumerate(zip(transcoders, inputs)):
            acts = tc.encode(x).float()  # (T, F)
            acts[0] = 0
            position, feature = acts.nonzero(as_tuple=True)  # sorted by position, then feature
            value = acts[position, feature]
            decoder = value[:, None] * tc.W_dec[feature].float()  # (n, C): a_s W_dec[f]
            reconstruction = torch.zeros_like(x).index_add_(0, position, decoder) + tc.b_dec + tc.skip(x)
            error = act[f"h.{layer}.{OUTPUT_STEP}"] - reconstruction  # (T, C)
            error[0] = 0
            found.append(torch.stack([torch.full_like(position, layer), position, feature], 1))
            values.append(value)
            encoders.append(tc.W_enc[:, feature].T.float())  # (n, C)
            decoders.append(decoder)
            errors.append(error)
        self.active_features = torch.cat(found)  # (n, 3): layer, position, feature
        self.activation_values = torch.cat(values)
        self.encoders, self.decoders = torch.cat(encoders), torch.cat(decoders)
        self.errors = errors
        counts = [len(v) for v in values]
        self.first = [sum(counts[:i]) for i in range(len(counts) + 1)]  # layer i's features: first[i]..first[i+1]

    @property
    def n_features(self) -> int:
        return len(self.active_features)

    @property
    def row_size(self) -> int:
        """Sources: the features, then an error per block and position, then a token per position."""
        return self.n_features + (self.n_layer + 1) * self.T

    def rows(self, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """Targets (B,) layer, position and vector (B, C): each the dot of `vector` with the residual
        stream at its position, read at block `layer`'s transcoder input (n_layer: at ln_f's output)
        -> (B, row_size): the target's edge from every source.

        Attention is causal, so a target at position p reaches positions 0..p alone: the pass runs
        over the first max(positions) + 1 positions (the features' order keeps a batch's close)."""
        B, L, T = len(layers), self.n_layer, int(positions.max()) + 1
        out = vectors.new_zeros(B, self.row_size)
        g = vectors.new_zeros(B, T, vectors.size(1))  # d target / d residual stream, (B, T, C)
        rows = torch.arange(B)
        top = layers == L
        if top.any():
            g[rows[top], positions[top]] = layer_norm_t(vectors[top], *self.ln_f, positions[top])
        for layer in range(min(int(layers.max()), L - 1), -1, -1):
            self._read(out, g, layer)
            u = g @ self.W_skip[layer] if self.W_skip[layer] is not None else torch.zeros_like(g)
            here = layers == layer
            u[rows[here], positions[here]] += vectors[here]
            g = g + (layer_norm_t(u, *self.ln_2[layer]) if self.input_step == "ln_2" else u)
            g = g + layer_norm_t(self._attention_t(g, layer), *self.ln_1[layer])
        tokens = self.n_features + L * self.T
        out[:, tokens : tokens + T] = torch.einsum("btc,tc->bt", g, self.token_vectors[:T])
        return out

    def _read(self, out: torch.Tensor, g: torch.Tensor, layer: int) -> None:
        """Block `layer`'s sources' edges, from g (B, T', C) at its MLP's output: its features' (g at
        their position . a_s W_dec[f]) and its error nodes' (g . error, position by position)."""
        T = g.size(1)
        first, last = self.first[layer], self.first[layer + 1]
        positions = self.active_features[first:last, 1]
        for p in positions[positions < T].unique().tolist():
            at = first + (positions == p).nonzero().flatten()
            out[:, at] = g[:, p] @ self.decoders[at].T
        errors = self.n_features + layer * self.T
        out[:, errors : errors + T] = torch.einsum("btc,tc->bt", g, self.errors[layer][:T])

    def _attention_t(self, g: torch.Tensor, layer: int) -> torch.Tensor:
        """attn^T (the class's docstring): (B, T, C) gradient at the attention's output -> at its input."""
        B, T, _ = g.shape
        P = self.pattern[layer][:, :T, :T]  # (H, T, T)
        H = P.size(0)
        gz = (g @ self.W_O[layer].T).view(B, T, H, -1).transpose(1, 2)  # (B, H, T, d)
        gv = P.transpose(-1, -2) @ gz  # (B, H, T, d): to each key's value, from the queries that read it
        return gv.transpose(1, 2).reshape(B, T, -1) @ self.W_V[layer].T  # (B, T, C)


def _gain(ln: torch.nn.LayerNorm) -> torch.Tensor:
    """A LayerNorm's gain g (C,) (gpt2's LayerNorms all have one)."""
    return ln.weight.detach().float()


def layer_norm_t(u: torch.Tensor, gain: torch.Tensor, scale: torch.Tensor, positions=None) -> torch.Tensor:
    """The transpose of a LayerNorm with its scale frozen, ln(x) = (x - mean(x)) / s * g: u -> center(u * g / s).
    u (B, T, C) with scale (T, 1); or u (B, C) at `positions` (B,)."""
    s = scale[: u.size(1)] if positions is None else scale[positions]
    v = u * gain / s
    return v - v.mean(-1, keepdim=True)


def attribution_graph(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor,
    transcoders: TranscoderSet,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    max_feature_nodes: int | None = None,
    batch_size: int = 256,
    update_interval: int = 4,
    prepend_bos: bool | None = None,
    progress: bool = False,
) -> AttributionGraph:
    """The attribution graph of `model`'s prediction after `ids` (a text or 1-D ids), through
    `transcoders` (one per block, reading its MLP's input and standing in for its output), as
    circuit-tracer's `attribute` computes it (the module's docstring).

    max_n_logits, desired_logit_prob: the logit nodes, the most probable tokens until their
        probabilities sum to desired_logit_prob, at most max_n_logits of them
    max_feature_nodes: at most this many feature nodes, the most influential on the logits found
        as circuit-tracer does (their influence through the rows computed so far, `update_interval`
        batches at a time); all active features by default
    batch_size: how many targets' rows one pass of the transpose computes
    prepend_bos: put <|endoftext|> first unless it is (circuit-tracer's: position 0 is left out of
        the graph); by default, where the model's tokenizer has one
    """
    check_transcoder_set(transcoders, model)
    if transcoders.input_step not in INPUT_STEPS or transcoders.output_step != OUTPUT_STEP:
        raise InvalidArgumentError(
            f"transcoders read h.L.{transcoders.input_step} and write h.L.{transcoders.output_step}: an attribution "
            f"graph replaces each MLP, so they must read its input (h.L.ln_2, or h.L.resid_mid before ln_2) and "
            f"write its output (h.L.{OUTPUT_STEP})",
            "transcoders",
        )
    max_n_logits = positive_int("max_n_logits", max_n_logits)
    desired_logit_prob = real_between("desired_logit_prob", desired_logit_prob, 0.0, 1.0)
    batch_size = positive_int("batch_size", batch_size)
    update_interval = positive_int("update_interval", update_interval)
    ids, tokens = graph_input(model, ids, prepend_bos)
    with torch.no_grad():
        frozen = _Replacement(model, ids, transcoders)
        return _assemble(
            model,
            ids,
            tokens,
            frozen,
            max_n_logits,
            desired_logit_prob,
            max_feature_nodes,
            batch_size,
            update_interval,
            boolean("progress", progress),
        )


def graph_input(model: GPT2, ids: object, prepend_bos: bool | None) -> tuple[list[int], list[str] | None]:
    """A graph's prompt: (ids, tokens), <|endoftext|> first where `prepend_bos` (None: where the
    model's tokenizer has it) and the prompt does not already start with it."""
    ids, _ = token_ids(model, ids)
    eot = None if model.tokenizer is None else model.tokenizer.eot_token
    if prepend_bos is None:
        prepend_bos = eot is not None
    elif boolean("prepend_bos", prepend_bos) and eot is None:
        raise InvalidArgumentError(
            "prepend_bos: this model has no tokenizer with <|endoftext|> to put first", "prepend_bos"
        )
    if prepend_bos and ids[0] != eot:
        ids = [eot, *ids]
    return token_ids(model, ids)


def logit_targets(frozen: _Replacement, max_n_logits: int, desired_logit_prob: float):
    """The logit nodes: the most probable next tokens until their probabilities reach
    desired_logit_prob (at most max_n_logits) -> (ids, probabilities, vectors (K, C): each token's
    unembedding column less the mean column, so that the target is the logit less the mean logit)."""
    probs = torch.softmax(frozen.logits, -1)
    top_p, top_ids = torch.topk(probs, min(max_n_logits, len(probs)))
    k = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
    ids = top_ids[:k]
    vectors = frozen.W_U[:, ids].T - frozen.W_U.mean(1)
    return ids, probs[ids], vectors


def _assemble(
    model,
    ids,
    tokens,
    frozen,
    max_n_logits,
    desired_logit_prob,
    max_feature_nodes,
    batch_size,
    update_interval,
    progress,
) -> AttributionGraph:
    """The adjacency matrix [target, source]: the logit nodes' rows and the features' (all, or the
    most influential `max_feature_nodes` found as circuit-tracer does), errors and tokens having none."""
    logit_ids, logit_p, logit_vectors = logit_targets(frozen, max_n_logits, desired_logit_prob)
    n_active, K, L, T = frozen.n_features, len(logit_ids), frozen.n_layer, frozen.T
    n_selected = n_active
    if max_feature_nodes is not None:
        n_selected = min(positive_int("max_feature_nodes", max_feature_nodes), n_active)
    logit_rows = torch.cat(
        [
            frozen.rows(torch.full((len(v),), L), torch.full((len(v),), T - 1), v)
            for v in logit_vectors.split(batch_size)
        ]
    ).cpu()  # (K, row_size)
    layers, positions = frozen.active_features[:, 0], frozen.active_features[:, 1]

    def feature_rows(batch: torch.Tensor) -> torch.Tensor:
        bar.update(len(batch))
        return frozen.rows(layers[batch], positions[batch], frozen.encoders[batch]).cpu()

    with tqdm(total=n_selected, desc="attribution graph", unit="feature", disable=not progress) as bar:
        if n_selected == n_active:  # every row in its place at once: no copy of the matrix
            selected = torch.arange(n_active)
            adjacency = torch.zeros(frozen.row_size + K, frozen.row_size + K)
            adjacency[-K:, : frozen.row_size] = logit_rows
            for batch in selected.split(batch_size) if n_active else ():  # no active feature: no rows
                adjacency[batch, : frozen.row_size] = feature_rows(batch)
        else:
            selected, adjacency = _most_influential(
                logit_rows, logit_p.cpu(), n_active, n_selected, feature_rows, batch_size, update_interval
            )
    texts = [str(i) if model.tokenizer is None else model.tokenizer.decode([i]) for i in logit_ids.tolist()]
    return AttributionGraph(
        ids,
        tokens,
        frozen.active_features.cpu(),
        frozen.activation_values.cpu(),
        selected,
        adjacency,
        logit_ids.cpu(),
        logit_p.cpu(),
        texts,
        L,
    )


def _most_influential(logit_rows, logit_p, n_active, n_selected, feature_rows, batch_size, update_interval):
    """circuit-tracer's choice of `n_selected` of the `n_active` features: rank the features not yet
    visited by their influence through the rows computed so far, compute the rows of the first
    update_interval batches, again until enough -> (the chosen, sorted; the adjacency over them)."""
    K, row_size = logit_rows.shape
    n_nodes = row_size + K
    edges = torch.zeros(n_selected + K, n_nodes)  # rows as computed: the logits', then the features' as chosen
    row_node = torch.zeros(n_selected + K, dtype=torch.long)  # each row's node
    edges[:K, :row_size] = logit_rows
    row_node[:K] = torch.arange(row_size, n_nodes)
    visited = torch.zeros(n_active, dtype=torch.bool)
    done = K
    while done - K < n_selected:
        ranked = partial_influence(edges[:done], logit_p, row_node[:done])[:n_active].argsort(descending=True)
        pending = ranked[~visited[ranked]][: min(update_interval * batch_size, n_selected - (done - K))]
        for batch in pending.split(batch_size):
            edges[done : done + len(batch), :row_size] = feature_rows(batch)
            row_node[done : done + len(batch)] = batch
            visited[batch] = True
            done += len(batch)
    selected = visited.nonzero().flatten()
    edges = edges[:, torch.cat([selected, torch.arange(n_active, n_nodes)])]  # the columns of those left out go
    edges = edges[row_node.argsort()]  # the features' rows in node order, then the logits'
    adjacency = torch.zeros(edges.size(1), edges.size(1))
    adjacency[:n_selected] = edges[:n_selected]
    adjacency[-K:] = edges[n_selected:]
    return selected, adjacency


def partial_influence(rows: torch.Tensor, logit_p: torch.Tensor, row_node: torch.Tensor, max_iter: int = 128):
    """Each node's influence on the logits through the rows computed so far (rows[i] is node
    row_node[i]'s; the logits' rows first): circuit-tracer's ranking of the features to visit next."""
    shares = normalized(rows, floor=1e-8)
    step = torch.zeros(rows.size(1))
    step[-len(logit_p) :] = logit_p
    total = torch.zeros(rows.size(1))
    for _ in range(max_iter):
        step = step[row_node] @ shares
        if not step.any():
            return total
        total += step
    raise RuntimeError(f"partial_influence: the series did not end after {max_iter} steps")

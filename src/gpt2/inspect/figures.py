"""Pictures of a trace, drawn with matplotlib (the inspect extra): the attention patterns of a
layer's heads, the logit lens, and the next-token distribution before and after temperature and
top-k/top-p, the seeds' own figure; and the heads' scores (circuits.head_scores) as heat maps.
Each function returns the figure; `save` writes one.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gpt2._files import atomic_path
from gpt2.errors import InvalidArgumentError
from gpt2.generation.sampling import Sampling, filter_logits
from gpt2.inspect.tracing import Trace, check_position, logit_lens_top

LABELLED = 48  # up to this many tokens, the axes name each one


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no window, no display needed)."""
    try:
        import matplotlib
    except ImportError:
        raise InvalidArgumentError("pictures need matplotlib: pip install 'gpt2[inspect]'", "png") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shown(trace: Trace, i: int) -> str:
    """Token id i as the pictures show it: its text, whitespace made visible, else its id."""
    tokenizer = trace.model.tokenizer
    return repr(tokenizer.decode([i]))[1:-1].replace(" ", "␣") if tokenizer is not None else str(i)


def labels(trace: Trace) -> list[str]:
    """The input's tokens as the axes show them."""
    return [shown(trace, i) for i in trace.ids]


def attention(trace: Trace, layer: int) -> Any:
    """One panel per head of block `layer`: row t is where position t looks (its probabilities
    over positions 0..t), tokens on both axes."""
    name = f"h.{layer}.attn.pattern"
    if name not in trace.activations:
        raise InvalidArgumentError(f"the trace did not record {name}: trace with names including it", "layer")
    pattern = trace.activations[name].float().cpu().numpy()  # (H, T, T)
    H, T = pattern.shape[0], pattern.shape[1]
    columns = min(H, 4)
    rows = -(-H // columns)
    plt = pyplot()
    size = 2.2 + 0.22 * min(T, LABELLED)
    fig, axes = plt.subplots(rows, columns, figsize=(columns * size, rows * size), squeeze=False)
    names = labels(trace)
    for head, ax in enumerate(axes.flat):
        if head >= H:
            ax.axis("off")
            continue
        ax.imshow(pattern[head], cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"head {head}", fontsize=10)
        if T <= LABELLED:
            ax.set_xticks(range(T), names, rotation=90, fontsize=7)
            ax.set_yticks(range(T), names, fontsize=7)
        ax.set_xlabel("attends to", fontsize=8)
        ax.set_ylabel("position", fontsize=8)
    fig.suptitle(f"block {layer}: attention probabilities of each head")
    fig.tight_layout()
    return fig


def logit_lens(trace: Trace) -> Any:
    """Layers (the residual stream entering each block, then the output) by positions: each
    cell the token the stream would predict there, read out through ln_f and the unembedding,
    coloured by its probability."""
    n_layer = trace.model.config.n_layer
    best_p, best_ids = logit_lens_top(trace)  # (L + 1, T) each
    T = best_p.shape[1]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2 + 0.9 * min(T, LABELLED), 1.5 + 0.45 * (n_layer + 1)))
    ax.imshow(best_p.numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto", origin="lower")
    if T <= LABELLED:
        for layer in range(n_layer + 1):
            for t in range(T):
                text, p = shown(trace, int(best_ids[layer, t])), float(best_p[layer, t])
                ax.text(
                    t,
                    layer,
                    f"{text[:8]}\n{p:.0%}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="black" if p > 0.5 else "white",
                )
        ax.set_xticks(range(T), labels(trace), rotation=90, fontsize=7)
    ax.set_yticks(range(n_layer + 1), [f"block {i} in" for i in range(n_layer)] + ["output"], fontsize=7)
    ax.set_xlabel("position (the token read there)")
    ax.set_title("logit lens: the next token each layer's residual stream predicts, and its probability")
    fig.tight_layout()
    return fig


def next_token(trace: Trace, position: int, sampling: Sampling, bars: int = 12) -> Any:
    """The distribution of the token after `position`: as the model gives it (temperature 1), and
    as sampling draws from it after temperature, then top-k and top-p (`gpt2.generation.sampling`'s own
    filters). The `bars` most likely tokens; the bars of the second sum to 1 over the kept ones."""
    T = len(trace.ids)
    check_position(position, T)
    sampling.check_vocab(trace.logits.size(-1))
    logits = trace.logits[position].float().cpu()
    before = torch.softmax(logits, dim=-1)
    temperature = max(sampling.temperature, 1e-6)  # 0 is greedy: all the mass on the top token
    after = torch.softmax(filter_logits((logits / temperature)[None], sampling.top_k, sampling.top_p)[0], dim=-1)
    top = before.topk(min(bars, logits.numel())).indices.tolist()
    names = [shown(trace, i) for i in top]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    settings = ", ".join(
        f"{k}={v}"
        for k, v in (("temperature", sampling.temperature), ("top_k", sampling.top_k), ("top_p", sampling.top_p))
        if v is not None
    )
    for ax, probs, title in ((axes[0], before, "the model's distribution (temperature 1)"), (axes[1], after, settings)):
        ax.bar(range(len(top)), probs[top].numpy(), color="tab:blue")
        ax.set_xticks(range(len(top)), names, rotation=60, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("probability")
    after_what = labels(trace)[position]
    fig.suptitle(f"the next token after position {position % T} ({after_what})")
    fig.tight_layout()
    return fig


def head_grids(
    grids: dict[str, torch.Tensor | None],
    title: str,
    *,
    signed: bool = False,
    label: str = "share of attention",
    empty: str = "no token repeats:\nnothing to score",
) -> Any:
    """Layer x head heat maps side by side, one per entry (each kind of head score, an experiment's
    per-head effect), layers down and heads across, on one scale: 0 to 1 (a share of a head's
    attention, circuits.head_scores) or, `signed`, symmetric about 0 (a logit difference); each
    cell's value written in it where the grid is small. None: an entry the input gave nothing to
    draw (`empty` says why: a text whose tokens never repeat)."""
    shapes = [g.shape for g in grids.values() if g is not None]
    if not shapes:
        raise InvalidArgumentError("no kind has scores to draw: the input has no position any score looks at", "scores")
    n_layer, n_head = shapes[0]
    values = {name: None if g is None else g.float().cpu() for name, g in grids.items()}  # each (n_layer, n_head)
    bound = max(max(float(v.abs().max()) for v in values.values() if v is not None), 1e-9) if signed else 1
    plt = pyplot()
    size = (1.2 + 0.5 * n_head, 1.0 + 0.45 * n_layer)
    fig, axes = plt.subplots(
        1, len(grids), figsize=(len(grids) * size[0] + 1.2, size[1] + 0.8), squeeze=False, layout="constrained"
    )
    image = None
    for ax, (name, v) in zip(axes.flat, values.items()):
        ax.set_title(name, fontsize=10)
        if v is None:
            ax.axis("off")
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
            continue
        cmap, low = ("RdBu", -bound) if signed else ("viridis", 0)
        image = ax.imshow(v.numpy(), cmap=cmap, vmin=low, vmax=bound, aspect="auto")
        if n_layer * n_head <= 256:  # small enough to print each cell's value
            for layer, row in enumerate(v.tolist()):
                for head, x in enumerate(row):
                    color = "black" if signed or x > 0.6 else "white"  # readable on either map
                    ax.text(head, layer, f"{x:.2f}", ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(n_head))
        ax.set_yticks(range(n_layer))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), fraction=0.03, label=label)
    fig.suptitle(title)
    return fig


def save(fig: Any, path: str | os.PathLike) -> None:
    """Write a figure as a PNG, atomically, and free it."""
    plt = pyplot()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def patching_grids(grids: dict[str, torch.Tensor], columns: list[str], xlabel: str, title: str) -> Any:
    """Patching grids one above the other (activation patching and its estimate, attribution
    patching), each layer x `columns` (positions, labelled by their tokens, or heads), on one colour scale."""
    values = {name: grid.float().cpu().numpy() for name, grid in grids.items()}  # each (n_layer, len(columns))
    n_layer = next(iter(values.values())).shape[0]
    bound = max(max(float(abs(v).max()) for v in values.values()), 1e-9)
    plt = pyplot()
    fig, axes = plt.subplots(
        len(values), 1, figsize=(2.5 + 0.3 * len(columns), 1.2 + (1.2 + 0.35 * n_layer) * len(values)), squeeze=False
    )
    for ax, (name, v) in zip(axes[:, 0], values.items()):
        image = ax.imshow(v, cmap="RdBu", vmin=-bound, vmax=bound, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        ax.set_yticks(range(n_layer))
        ax.set_ylabel("layer")
        ax.set_title(name, fontsize=10)
    axes[-1, 0].set_xlabel(xlabel)
    fig.colorbar(image, ax=list(axes[:, 0]), label="logit difference")
    fig.suptitle(title, fontsize=10)
    return fig


def attribution_bars(parts: Any, title: str, bars: int = 20) -> Any:
    """Direct logit attribution (`circuits.LogitAttribution`) as bars: the `bars` parts of
    largest effect among the heads ("L.H"), the MLPs, the embeddings and the biases together."""
    effects = {
        f"{l}.{h}": float(parts.heads[l, h]) for l in range(parts.heads.shape[0]) for h in range(parts.heads.shape[1])
    }
    effects |= {f"mlp {l}": float(v) for l, v in enumerate(parts.mlps)}
    effects |= {"embed": float(parts.embed), "biases": float(parts.biases.sum())}
    shown_ = sorted(effects, key=lambda k: -abs(effects[k]))[:bars]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2 + 0.4 * len(shown_), 4))
    ax.bar(
        range(len(shown_)),
        [effects[k] for k in shown_],
        color=["tab:blue" if effects[k] >= 0 else "tab:red" for k in shown_],
    )
    ax.set_xticks(range(len(shown_)), shown_, rotation=60, fontsize=8)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("direct effect on the logit difference")
    ax.set_title(f"{title} (total {parts.total:.3f})", fontsize=10)
    fig.tight_layout()
    return fig


def attribution_graph(data: dict, title: str | None = None) -> Any:
    """A pruned attribution graph as circuit-tracer's graph file holds it (`AttributionGraph.to_json`):
    a column per position, a row per layer (the tokens at the bottom, the logits on top), features as
    circles and error nodes as squares (several in a cell side by side), edges as lines whose width
    follows |weight| (blue positive, red negative), the prompt's tokens along the bottom."""
    plt = pyplot()
    nodes, links = data["nodes"], data["links"]
    n_layer = int(max((int(n["layer"]) for n in nodes if n["layer"] != "E"), default=1)) - 1
    tokens = data["metadata"]["prompt_tokens"]
    row = {"E": 0, **{str(layer): layer + 1 for layer in range(n_layer)}, str(n_layer + 1): n_layer + 1}
    cells: dict[tuple[int, int], list[dict]] = {}
    for n in nodes:
        cells.setdefault((row[n["layer"]], n["ctx_idx"]), []).append(n)
    where = {}
    for (y, x), members in cells.items():
        for k, n in enumerate(members):
            where[n["node_id"]] = (x + (k - (len(members) - 1) / 2) * 0.8 / max(len(members), 1), y)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(tokens) + 2), 1.3 * (n_layer + 2) + 1))
    largest = max((abs(link["weight"]) for link in links), default=1.0) or 1.0
    for link in sorted(links, key=lambda link: abs(link["weight"])):
        (x0, y0), (x1, y1) = where[link["source"]], where[link["target"]]
        share = abs(link["weight"]) / largest
        color = "#2166ac" if link["weight"] > 0 else "#b2182b"
        ax.plot([x0, x1], [y0, y1], color=color, linewidth=0.3 + 4 * share, alpha=0.25 + 0.7 * share, zorder=1)
    styles = {
        "cross layer transcoder": ("o", "#7b3294"),
        "mlp reconstruction error": ("s", "#999999"),
        "embedding": ("s", "#f4a582"),
        "logit": ("o", "#1b7837"),
    }
    for n in nodes:
        marker, color = styles[n["feature_type"]]
        ax.scatter(*where[n["node_id"]], marker=marker, s=60, color=color, edgecolor="black", linewidth=0.5, zorder=2)
        if n["feature_type"] == "logit":
            ax.annotate(n["clerp"], where[n["node_id"]], xytext=(6, 4), textcoords="offset points", fontsize=8)
    ax.set_xticks(range(len(tokens)), [repr(t)[1:-1] for t in tokens], rotation=90, fontsize=8)
    ax.set_yticks(range(n_layer + 2), ["tokens", *[f"layer {i}" for i in range(n_layer)], "logits"])
    ax.set_xlim(-0.8, len(tokens) - 0.2)
    ax.set_ylim(-0.6, n_layer + 1.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"attribution graph: {len(nodes)} nodes, {len(links)} edges")
    fig.tight_layout()
    return fig

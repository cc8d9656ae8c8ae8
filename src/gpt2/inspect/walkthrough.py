"""The seeds' walkthrough: one input followed through GPT-2's forward pass step by step, as text
(`walkthrough`: what `gpt2 inspect --walk` prints, a line a step) and as data (`walk`: what
`gpt2 inspect --walk --json` prints and the server's /v1/walk answers its page with).

    walk(model, "Hello, world")  ->  {"model", "tokenizer", "ids", "tokens",
                                      "steps": [{"name", "shape", "math", "about", "values"}, ...],
                                      "bpe", "next", "positions"}

The steps are `activation_names(n_layer, on_request=False)`, in the pass's order, then "logits";
each step's values are those of the last position (an attention pattern's: the last query's row
of every head), which is the position whose next token the walk ends on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gpt2.inspect.names import activation_names, step_of
from gpt2.inspect.tracing import Trace, alternatives, next_token_report, one_sequence, token_label, trace
from gpt2.model.model import GPT2
from gpt2.tokenizer import Tokenizer

# What each step computes, as the seeds write it: the walkthrough's middle column.
STEP_MATH = {
    "wte": "wte[ids]: each token's embedding",
    "wpe": "wpe[0..T-1]: each position's embedding",
    "resid_pre": "x: the residual stream entering the block",
    "ln_1.scale": "sqrt(var(x) + eps): LayerNorm's divisor",
    "ln_1.normalized": "(x - mean) / scale: before g and b",
    "ln_1": "LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b",
    "attn.c_attn": "ln_1 @ W_attn + b: q, k, v side by side",
    "attn.q": "q split into heads: (T, C) -> (H, T, C/H)",
    "attn.k": "k split into heads",
    "attn.v": "v split into heads",
    "attn.scores": "q @ k^T / sqrt(C/H), -inf where a key is in the future",
    "attn.pattern": "softmax(scores): where each position looks",
    "attn.z": "pattern @ v: each head's output",
    "attn.result": "z_h @ W_proj[h]: each head's output in the residual stream",
    "attn.c_proj": "heads merged @ W_proj + b: attention's output, added to x",
    "resid_mid": "x + attn: the stream between attention and the MLP",
    "ln_2.scale": "sqrt(var(x) + eps)",
    "ln_2.normalized": "(x - mean) / scale",
    "ln_2": "LayerNorm(x)",
    "mlp.c_fc": "ln_2 @ W_fc + b: up to 4C",
    "mlp.gelu": "GELU(c_fc), GPT-2's tanh approximation",
    "mlp.c_proj": "gelu @ W_proj + b: the MLP's output, added to x",
    "": "x + attn + mlp: the residual stream leaving the block",
    "ln_f.scale": "sqrt(var(x) + eps) of the last block's output",
    "ln_f.normalized": "(x - mean) / scale",
    "ln_f": "LayerNorm(x) of the last block's output",
    "logits": "ln_f @ wte^T: a score for every token of the vocabulary",
}


def walkthrough(trace: Trace, k: int = 5) -> list[str]:
    """The seeds' forward pass for this input, a line a step: the step, the tensor's shape, what
    it computes, and its first values at the last position (of the first head, for per-head
    steps); then the logits and the distribution of the next token."""
    one_sequence(trace, "walkthrough")
    T = len(trace.ids)
    shown = " ".join(repr(t) for t in trace.tokens) if trace.tokens is not None else ""
    lines = [
        f"{'tokens':<18} ids = {trace.ids}  {shown}",
        f"{'':<18} (T = {T}; values are of the last position, head 0 for per-head steps)",
    ]
    for name in activation_names(trace.model.config.n_layer):
        if name not in trace.activations:
            continue
        step = step_of(name)
        value = trace.activations[name]
        last = value[0, -1] if value.dim() == 3 else value[-1]  # (H, T, ...) per head, else (T, ...)
        if step == "wpe":
            lines.append(_walk_line("wpe", value, STEP_MATH["wpe"], last))
            x = trace.activations["wte"] + value
            lines.append(_walk_line("x", x, "wte[ids] + wpe[pos]: the residual stream entering block 0", x[-1]))
        else:
            lines.append(_walk_line(name, value, step_math(step, trace.model.config.activation), last))
    lines.append(_walk_line("logits", trace.logits, STEP_MATH["logits"], trace.logits[-1]))
    report = next_token_report(trace, k)
    after = token_label(trace.tokens[-1] if trace.tokens is not None else None, trace.ids[-1])
    lines.append(f"{'softmax':<18} the next token after {after}: {alternatives(report['top'][-1])}")
    return lines


def _walk_line(name: str, value: torch.Tensor, math_: str, last: torch.Tensor) -> str:
    shape = "(" + ", ".join(map(str, value.shape)) + ")"
    values = ", ".join(f"{float(v):.4f}" for v in last[:4].float().cpu())
    return f"{name:<18} {shape:<16} {math_:<58} [{values}, ...]"


# What each step is for, a sentence a step: what the page says when a step is clicked.
STEP_ABOUT = {
    "wte": "Each token id picks its row of the token embedding wte: the token as a vector of C numbers, learned in "
    "training, the same wherever the token stands.",
    "wpe": "Each position picks its row of the position embedding: attention by itself does not know the order of "
    "the tokens, so where a token stands is added to what it is.",
    "ln_1": "LayerNorm takes each position's vector to mean 0 and spread 1, then scales and shifts it by learned g and "
    "b, so that attention reads numbers of the same size at every depth.",
    "attn.c_attn": "One matrix multiply makes each position's query, key and value side by side (3C numbers): what it "
    "looks for, what it offers, and what it passes on.",
    "attn.pattern": "Each head scores every earlier position by query · key / sqrt(d), sets the future to -inf (the "
    "causal mask: a token may not see the ones after it) and takes the softmax: where each position looks.",
    "attn.c_proj": "The heads' outputs (their patterns times their values) are put side by side and projected back to "
    "C numbers: what attention adds to the residual stream.",
    "ln_2": "The second LayerNorm, of the stream after attention's addition: the MLP's input, normalised as ln_1's.",
    "mlp.c_fc": "The MLP widens each position to 4C numbers, one matrix multiply: the pre-activations the GELU bends.",
    "mlp.gelu": "GELU lets positive pre-activations through and squashes negative ones towards 0, smoothly: the one "
    "non-linearity of the block, applied to each number alone.",
    "mlp.c_proj": "The MLP's second matrix multiply takes the 4C numbers back to C: what the MLP adds to the stream. "
    "It works on each position alone; only attention mixes positions.",
    "": "The block's output: its input plus attention's output plus the MLP's (the residual connections), the stream "
    "the next block reads.",
    "ln_f": "The last LayerNorm, of the last block's output: what is compared with every token's embedding.",
    "logits": "The unembedding is the token embedding again (tied): each token's score is the dot product of ln_f "
    "with its row of wte. Softmax of the scores over a temperature gives the next token's probabilities.",
}


def step_math(step: str, activation: str) -> str:
    """A step's formula, as the seeds' middle column writes it (the model's GELU named)."""
    return STEP_MATH[step] if step != "mlp.gelu" or activation == "gelu_tanh" else "GELU(c_fc), exact: u Phi(u)"


def walk(model: GPT2, ids: str | Sequence[int] | torch.Tensor, top_k: int = 10) -> dict[str, Any]:
    """The walkthrough as one JSON-ready dict: the input's tokens, every step of the pass (its name,
    shape less the batch, formula, a sentence on what it is for, and its values at the last
    position), how BPE merged each piece of a text (None for ids, or a tokenizer other than BPE),
    the top_k next tokens by logit, and the position embedding (`position_table`)."""
    config = model.config
    looked = trace(model, ids, names=activation_names(config.n_layer, on_request=False))
    report = next_token_report(looked, top_k)  # checks top_k
    steps = [_step(name, looked.activations[name], config.activation) for name in looked.activations]
    steps.append(
        {
            "name": "logits",
            "shape": list(looked.logits.shape),
            "math": STEP_MATH["logits"],
            "about": STEP_ABOUT["logits"],
            "values": _rounded(looked.logits[-1]),
        }
    )
    tokenizer = model.tokenizer
    logits = looked.logits[-1].float()
    return {
        "model": {
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "n_embd": config.n_embd,
            "n_ctx": config.n_ctx,
            "n_vocab": config.n_vocab,
            "activation": config.activation,
            "positions": config.positions,
        },
        "tokenizer": None if tokenizer is None else "bpe" if isinstance(tokenizer, Tokenizer) else "char",
        "ids": looked.ids,
        "tokens": looked.tokens,
        "steps": steps,
        "bpe": tokenizer.merge_steps(ids) if isinstance(ids, str) and isinstance(tokenizer, Tokenizer) else None,
        "next": [{"token": e["token"], "id": e["id"], "logit": float(logits[e["id"]])} for e in report["top"][-1]],
        "positions": position_table(model),
    }


def _step(name: str, value: torch.Tensor, activation: str) -> dict[str, Any]:
    step = step_of(name)
    last = value[:, -1] if value.dim() == 3 else value[-1]  # (H, T, T) -> (H, T): the last query's row; (T, X) -> (X,)
    return {
        "name": name,
        "shape": list(value.shape),
        "math": step_math(step, activation),
        "about": STEP_ABOUT[step],
        "values": _rounded(last),
    }


def _rounded(x: torch.Tensor) -> list:
    """Values for JSON: 6 decimals (the contract is 1e-4), which also keeps float32's digits short."""
    return torch.round(x.detach().double().cpu(), decimals=6).tolist()


MOST_SHOWN = 256  # rows and columns of the position table's heat map: a 1,024 x 768 table is sampled evenly


def position_table(model: GPT2) -> dict[str, Any]:
    """The position embedding as the page draws it: a heat map of the table (positions x
    dimensions, sampled evenly to at most MOST_SHOWN each) and a few dimensions over every
    position, the curves the seeds plot (for sinusoidal positions: sines of falling frequency)."""
    table = model.transformer.wpe.weight.detach().float().cpu()  # (n_ctx, C)
    n_ctx, C = table.shape
    rows, dims = (torch.linspace(0, n - 1, min(n, MOST_SHOWN)).round().long().unique() for n in (n_ctx, C))
    curves = sorted({0, 1, 2 * (C // 8), 2 * (C // 4)} & set(range(C)))
    return {
        "kind": model.config.positions,
        "n_ctx": n_ctx,
        "n_embd": C,
        "rows": rows.tolist(),
        "dims": dims.tolist(),
        "heat": _rounded(table[rows][:, dims]),
        "curves": {"dims": curves, "values": _rounded(table[:, curves].T)},
    }

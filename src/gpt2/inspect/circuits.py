"""Circuits: what the heads attend to, and what each part of the model adds to a logit.

    scores = head_scores(model, ids, "induction")        # (n_layer, n_head)
    parts = logit_attribution(model, "When Mary and John went to the store, John gave a drink to",
                              answer=" Mary", other=" John")
    parts.heads                                          # (n_layer, n_head): each head's direct effect

Both read one `trace` of the model (tracing.py): the attention patterns, and the pieces the
residual stream is the sum of. The stream leaving the last block is

    x = (wte + wpe) + sum over blocks l of [ sum over heads h of z_h W_O,h + b_O,l  +  mlp_l ]

where z_h W_O,h is head h's output through its rows of the block's c_proj, and b_O,l that c_proj's
bias; the logits are ln_f(x) @ wte.T. ln_f is linear once its scale is fixed, so with the scale of
the real run each piece's direct effect on a logit is (piece - its mean) / scale * g, unembedded
(TransformerLens's `apply_ln_to_stack`); ln_f's bias adds its own term, and the effects sum to
the logit itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpt2._checks import check_answer_and_other, int_between, one_token, positive_int
from gpt2.errors import InvalidArgumentError
from gpt2.inspect.tracing import check_position, token_ids, trace
from gpt2.model.model import GPT2
from gpt2.tokenizer import token_text

HEAD_SCORES = ("previous_token", "duplicate_token", "induction")
Tokens = int | str | Sequence[int | str]  # a token (an id, or a string of one token), or a list of them


# ------------------------------------------------------------------ head scores


def score_masks(ids: Sequence[int], kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, T) weights on the attention pattern A[q, p], and the (T,) query positions the score
    averages over, for `kind`:

        previous_token   A[q, q-1], for q >= 1
        duplicate_token  the attention to earlier occurrences of q's token, for q whose token occurred before
        induction        the attention to the positions just after them (p + 1, p < q - 1), for the same q
    """
    if kind not in HEAD_SCORES:
        raise InvalidArgumentError(f"kind must be one of {', '.join(HEAD_SCORES)}, got {kind!r}", "kind")
    x = torch.tensor(list(ids))
    T = len(x)
    earlier = (x[:, None] == x[None, :]) & torch.ones(T, T, dtype=torch.bool).tril(-1)  # [q, p]: p < q, same token
    if kind == "previous_token":
        return torch.ones(T, T).tril(-1).triu(-1), torch.arange(T) >= 1
    if kind == "duplicate_token":
        return earlier.float(), earlier.any(-1)
    after = torch.zeros(T, T)
    after[:, 1:] = earlier[:, :-1].float()  # [q, p + 1] for each earlier occurrence p
    after.masked_fill_(torch.ones(T, T, dtype=torch.bool).tril(-1).logical_not(), 0)  # p + 1 < q
    return after, earlier.any(-1)


@torch.no_grad()
def head_scores(model: GPT2, ids: str | Sequence[int] | torch.Tensor, kind: str) -> torch.Tensor:
    """(n_layer, n_head): how much each head does `kind` (see `score_masks`) on `ids`: the mean,
    over the query positions the kind looks at, of the attention its weights pick out."""
    ids, _ = token_ids(model, ids)
    weights, queries = score_masks(ids, kind)
    if not queries.any():
        raise InvalidArgumentError(
            f"the text has no position a {kind} score looks at: give one whose tokens repeat "
            "(e.g. a random sequence written twice)",
            "ids",
        )
    n_layer = model.config.n_layer
    t = trace(model, ids, names=[f"h.{i}.attn.pattern" for i in range(n_layer)])
    patterns = torch.stack([t.activations[f"h.{i}.attn.pattern"].float().cpu() for i in range(n_layer)])  # (L, H, T, T)
    per_query = (patterns * weights).sum(-1)  # (L, H, T)
    return per_query[..., queries].mean(-1)


def score_tables(scores: dict[str, torch.Tensor | None]) -> list[str]:
    """Each kind's (n_layer, n_head) scores as lines of text: a row a layer, a column a head, two
    decimals, a blank line between kinds; None for a kind the input gave nothing to score."""
    shapes = [s.shape for s in scores.values() if s is not None]
    n_layer, n_head = shapes[0] if shapes else (1, 1)
    first = max(*map(len, scores), len(f"layer {n_layer - 1}"))
    width = max(6, len(f"head {n_head - 1}"))
    lines = []
    for kind, values in scores.items():
        lines += [""] if lines else []
        if values is None:
            lines.append(f"{kind}: none (no token of the input occurs twice)")
            continue
        lines.append(f"{kind:<{first}}" + "".join(f"  {f'head {h}':>{width}}" for h in range(n_head)))
        for layer, row in enumerate(values.tolist()):
            lines.append(f"{f'layer {layer}':<{first}}" + "".join(f"  {v:>{width}.2f}" for v in row))
    return lines


def repeated_tokens(n: int, n_vocab: int, seed: int = 0, start: int | None = None) -> list[int]:
    """The standard induction test's input: n random tokens of a vocabulary of n_vocab, then the
    same n again, after `start` (GPT-2's <|endoftext|>, 50256) where given, which must be one of
    the vocabulary's ids too: checked here, where a model would refuse it only later."""
    n, n_vocab = positive_int("n", n), positive_int("n_vocab", n_vocab)
    if start is not None:
        int_between("start", start, 0, n_vocab - 1, "a token id")
    generator = torch.Generator().manual_seed(seed)
    half = torch.randint(0, n_vocab, (n,), generator=generator).tolist()
    return ([] if start is None else [start]) + half + half


# ------------------------------------------------------------------ direct logit attribution


@dataclass
class LogitAttribution:
    """Each piece's direct effect on logit(answer) - logit(other) (or logit(answer)) at one
    position: `heads` (n_layer, n_head), `mlps` (n_layer,), `embed` (wte + wpe), `biases`
    (n_layer + 1,): each block's attention c_proj bias, then ln_f's bias; `total`, their sum,
    the real run's logit difference."""

    heads: torch.Tensor
    mlps: torch.Tensor
    embed: float
    biases: torch.Tensor
    total: float


@torch.no_grad()
def logit_attribution(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor,
    answer: Tokens,
    other: Tokens | None = None,
    position: int = -1,
) -> LogitAttribution:
    """The direct logit attribution of the prediction after `position` (see the module's docstring).
    `answer` and `other` are each a token, or a list of tokens standing for their mean logit
    (greater-than's years after YY against the others)."""
    ids, _ = token_ids(model, ids)
    T, n_layer = len(ids), model.config.n_layer
    check_position(position, T)
    a = _tokens(model, answer, "answer")
    o = None if other is None else _tokens(model, other, "other")
    check_answer_and_other(
        a, o, token_text(model.tokenizer, a[0]) if model.tokenizer is not None and len(set(a)) == 1 else None
    )
    names = ["wte", "wpe", f"h.{n_layer - 1}"] + [
        f"h.{i}.{step}" for i in range(n_layer) for step in ("attn.z", "mlp.c_proj")
    ]
    t = trace(model, ids, names=names)
    act = {
        name: value[:, position] if name.endswith(".attn.z") else value[position]  # z: (H, T, d), the rest (T, C)
        for name, value in t.activations.items()
    }
    blocks = model.transformer.h
    heads = torch.stack(
        [_head_outputs(block.attn, act[f"h.{i}.attn.z"]) for i, block in enumerate(blocks)]
    )  # (L, H, C)
    zero = torch.zeros_like(act["wte"])
    biases = [zero if b.attn.c_proj.bias is None else b.attn.c_proj.bias.to(zero.dtype) for b in blocks]
    mlps = [act[f"h.{i}.mlp.c_proj"] for i in range(n_layer)]
    pieces = torch.cat(
        [heads.flatten(0, 1), torch.stack(mlps), (act["wte"] + act["wpe"])[None], torch.stack(biases)]
    )  # (N, C)
    ln_f = model.transformer.ln_f
    x = act[f"h.{n_layer - 1}"]  # (C,): the sum of the pieces
    scale = (x.var(unbiased=False) + ln_f.eps).sqrt()
    normed = (pieces - pieces.mean(-1, keepdim=True)) / scale * ln_f.weight
    effects = _logit_effect(model, torch.cat([normed, (zero if ln_f.bias is None else ln_f.bias)[None]]), a, o).double()
    H = model.config.n_head
    n_heads = n_layer * H
    return LogitAttribution(
        heads=effects[:n_heads].view(n_layer, H),
        mlps=effects[n_heads : n_heads + n_layer],
        embed=float(effects[n_heads + n_layer]),
        biases=effects[n_heads + n_layer + 1 :],
        total=float(effects.sum()),
    )


def _head_outputs(attn: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """(H, d) heads' outputs at one position -> (H, C): each through its own rows of c_proj, without the bias."""
    H, d = z.shape
    alone = torch.zeros(H, H, d, dtype=z.dtype, device=z.device)
    alone[torch.arange(H), torch.arange(H)] = z  # row h: head h's output, the other heads' zero
    out = attn.c_proj(alone.view(H, H * d))
    return out if attn.c_proj.bias is None else out - attn.c_proj.bias


def _tokens(model: GPT2, tokens: Tokens, param: str) -> list[int]:
    """One token, or a non-empty list of them, as vocabulary ids."""
    if isinstance(tokens, (list, tuple)):
        if not tokens:
            raise InvalidArgumentError(
                f"{param} must be a token or a non-empty list of tokens, got an empty list", param
            )
        return [one_token(t, model.tokenizer, model.config.n_vocab, param) for t in tokens]
    return [one_token(tokens, model.tokenizer, model.config.n_vocab, param)]


def _logit_effect(model: GPT2, x: torch.Tensor, answer: list[int], other: list[int] | None) -> torch.Tensor:
    """(N, C) -> (N,): x unembedded, the mean at answer's tokens less the mean at other's."""
    logits = model.unembed(x).float()
    return logits[:, answer].mean(-1) - (0 if other is None else logits[:, other].mean(-1))

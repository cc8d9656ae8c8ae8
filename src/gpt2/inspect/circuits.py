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
from gpt2.inspect.tracing import check_position, head_results, trace
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


CONVENTIONS = ("gpt2", "transformer_lens")


def transformer_lens_weights(ids: Sequence[int], kind: str) -> torch.Tensor:
    """(T, T): TransformerLens's detection pattern for `kind` (head_detector's): previous_token
    [q, q-1]; duplicate_token [q, p] for each earlier p of q's token; induction [q, p + 1] for
    those p, p + 1 <= q (the diagonal included, where ours leaves it out)."""
    x = torch.tensor(list(ids))
    T = len(x)
    earlier = ((x[:, None] == x[None, :]) & torch.ones(T, T, dtype=torch.bool).tril(-1)).float()
    if kind == "previous_token":
        return torch.ones(T, T).tril(-1).triu(-1)
    if kind == "duplicate_token":
        return earlier
    after = torch.zeros(T, T)
    after[:, 1:] = earlier[:, :-1]
    return after.tril()


@torch.no_grad()
def head_scores(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor | Sequence[str] | Sequence[Sequence[int]],
    kind: str,
    *,
    convention: str = "gpt2",
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    per_prompt: bool = False,
    prepend_bos: bool = False,
) -> torch.Tensor:
    """(n_layer, n_head): how much each head does `kind` on `ids` (one sequence, or a batch:
    the mean over its prompts, or (B, n_layer, n_head) with per_prompt).

    convention "gpt2" (the default): the mean, over the query positions the kind looks at
    (`score_masks`), of the attention its weights pick out: a head that does it perfectly
    scores 1, however few positions of the text have anything to find.
    convention "transformer_lens": its head_detector's "mul" score, the attention its detection
    pattern picks out (`transformer_lens_weights`) over all the attention of every query, with
    column 0 (exclude_bos) and the diagonal (exclude_current_token) left out of both where
    asked; on n random tokens written twice a perfect induction head scores about 1/2 there."""
    if convention not in CONVENTIONS:
        raise InvalidArgumentError(f"convention must be gpt2 or transformer_lens, got {convention!r}", "convention")
    if convention == "gpt2" and (exclude_bos or exclude_current_token):
        raise InvalidArgumentError(
            "exclude_bos and exclude_current_token are TransformerLens's: give convention='transformer_lens'",
            "convention",
        )
    if kind not in HEAD_SCORES:
        raise InvalidArgumentError(f"kind must be one of {', '.join(HEAD_SCORES)}, got {kind!r}", "kind")
    n_layer = model.config.n_layer
    t = trace(model, ids, names=[f"h.{i}.attn.pattern" for i in range(n_layer)], prepend_bos=prepend_bos)
    rows = [t.prompt(b) for b in range(len(t.ids))] if t.batched else [t]
    scores = []
    for row in rows:
        patterns = torch.stack([row.activations[f"h.{i}.attn.pattern"].float().cpu() for i in range(n_layer)])
        scores.append(_score(patterns, row.ids, kind, convention, exclude_bos, exclude_current_token))
    scores = torch.stack(scores)  # (B, L, H)
    return scores if t.batched and per_prompt else scores.mean(0)


def pattern_scores(patterns: torch.Tensor, ids: Sequence[int], kind: str) -> torch.Tensor:
    """`head_scores` (its default convention) of patterns already traced: (L, H, T, T) one prompt's
    patterns of `ids` -> (L, H)."""
    if kind not in HEAD_SCORES:
        raise InvalidArgumentError(f"kind must be one of {', '.join(HEAD_SCORES)}, got {kind!r}", "kind")
    return _score(patterns, list(ids), kind, "gpt2", False, False)


def _score(
    patterns: torch.Tensor, ids: list[int], kind: str, convention: str, exclude_bos: bool, exclude_current: bool
) -> torch.Tensor:
    """(L, H, T, T) one prompt's patterns -> (L, H), by `convention` (see `head_scores`)."""
    if convention == "transformer_lens":
        if len(ids) < 2:
            raise InvalidArgumentError("the text is one token: head scores need two or more", "ids")
        kept = patterns.clone()
        if exclude_bos:
            kept[..., 0] = 0
        if exclude_current:
            kept.diagonal(dim1=-2, dim2=-1).zero_()
        return (kept * transformer_lens_weights(ids, kind)).sum((-2, -1)) / kept.sum((-2, -1))
    weights, queries = score_masks(ids, kind)
    if not queries.any():
        raise InvalidArgumentError(
            f"the text has no position a {kind} score looks at: give one whose tokens repeat "
            "(e.g. a random sequence written twice)",
            "ids",
        )
    return (patterns * weights).sum(-1)[..., queries].mean(-1)


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
    the real run's logit difference. Of a batch per prompt: each with B first (embed and
    total (B,) tensors)."""

    heads: torch.Tensor
    mlps: torch.Tensor
    embed: float | torch.Tensor
    biases: torch.Tensor
    total: float | torch.Tensor


@torch.no_grad()
def logit_attribution(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor | Sequence[str] | Sequence[Sequence[int]],
    answer: Tokens | Sequence[Tokens],
    other: Tokens | Sequence[Tokens] | None = None,
    position: int = -1,
    *,
    per_prompt: bool = False,
    prepend_bos: bool = False,
) -> LogitAttribution:
    """The direct logit attribution of the prediction after `position` (see the module's docstring).
    `answer` and `other` are each a token, or a list of tokens standing for their mean logit
    (greater-than's years after YY against the others).

    A batch (a (B, T) tensor, a list of texts or of id lists; padded): `position` counts in each
    prompt's own tokens; `answer` and `other` are one for all prompts, or a list of B, one per
    prompt (each a token or a list of tokens); the result is the mean over the prompts, or
    each prompt's with per_prompt."""
    n_layer = model.config.n_layer
    names = ["wte", "wpe", f"h.{n_layer - 1}"] + [
        f"h.{i}.{step}" for i in range(n_layer) for step in ("attn.z", "mlp.c_proj")
    ]
    t = trace(model, ids, names=names, prepend_bos=prepend_bos)
    rows = [t.prompt(b) for b in range(len(t.ids))] if t.batched else [t]
    answers, others = _per_prompt(answer, len(rows), t.batched), _per_prompt(other, len(rows), t.batched)
    parts = []
    for row, a, o in zip(rows, answers, others):
        check_position(position, len(row.ids))
        a = _tokens(model, a, "answer")
        o = None if o is None else _tokens(model, o, "other")
        check_answer_and_other(
            a, o, token_text(model.tokenizer, a[0]) if model.tokenizer is not None and len(set(a)) == 1 else None
        )
        parts.append(_attribution(model, row.activations, position, a, o))
    if not t.batched:
        return parts[0]
    stacked = LogitAttribution(*(torch.stack([torch.as_tensor(getattr(p, f)) for p in parts]) for f in FIELDS))
    if per_prompt:
        return stacked
    mean = [getattr(stacked, f).mean(0) for f in FIELDS]
    return LogitAttribution(mean[0], mean[1], float(mean[2]), mean[3], float(mean[4]))


FIELDS = ("heads", "mlps", "embed", "biases", "total")


def _per_prompt(tokens: Tokens | Sequence[Tokens] | None, B: int, batched: bool) -> list:
    """answer or other, one per prompt: a list of B in a batch, or the same for every prompt."""
    if not batched or not isinstance(tokens, (list, tuple)):
        return [tokens] * B
    if len(tokens) != B:
        raise InvalidArgumentError(
            f"a batch of {B} prompts takes one answer for all, or a list of {B}, one per prompt; got a list of "
            f"{len(tokens)}",
            "answer",
        )
    return list(tokens)


def _attribution(
    model: GPT2, activations: dict[str, torch.Tensor], position: int, a: list[int], o: list[int] | None
) -> LogitAttribution:
    """One prompt's direct logit attribution, from its trace's activations."""
    n_layer = model.config.n_layer
    act = {
        name: value[:, position] if name.endswith(".attn.z") else value[position]  # z: (H, T, d), the rest (T, C)
        for name, value in activations.items()
    }
    blocks = model.transformer.h
    heads = torch.stack(
        [
            head_results(block.attn.c_proj, act[f"h.{i}.attn.z"][None, :, None])[0, :, 0]
            for i, block in enumerate(blocks)
        ]
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
    """(N, C) -> (N,): x unembedded, the mean at answer's tokens less the mean at other's. An
    unembedding with a bias (a model whose ln_f was folded into it: `weights.process_weights`)
    adds it to the last row alone, ln_f's bias, whence it came: each piece's effect is linear."""
    bias = model.unembed(torch.zeros_like(x[:1]))  # (1, V): 0 for GPT-2's tied unembedding
    logits = (model.unembed(x) - bias).float()
    logits[-1] += bias[0].float()
    return logits[:, answer].mean(-1) - (0 if other is None else logits[:, other].mean(-1))

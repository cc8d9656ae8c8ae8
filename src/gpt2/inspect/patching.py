"""Activation patching: which activations carry the difference between two inputs.

    metric = gpt2.inspect.logit_diff(answer, other)          # logits[-1, answer] - logits[-1, other]
    grid = gpt2.inspect.activation_patching(model, clean, corrupted, metric, "resid_pre")   # (n_layer, T)

Each entry is the metric of the corrupted run with one activation replaced by the clean run's
(`clean` and `corrupted`: texts, or token ids, of the same length). The sites, by
`gpt2.inspect.trace`'s names:

    resid_pre   (n_layer, T)          the stream entering block l at position t (h.{l-1}; wte at l = 0,
                                      whose wpe is the same in both runs)
    attn_out    (n_layer, T)          h.{l}.attn.c_proj at position t: attention's output
    mlp_out     (n_layer, T)          h.{l}.mlp.c_proj at position t: the MLP's output
    head        (n_layer, n_head)     h.{l}.attn.z of head h at every position (before c_proj)
    head_pos    (n_layer, n_head, T)  h.{l}.attn.z of head h at position t

The clean run keeps only the activations of the site asked for; the patched runs go through
the model `batch_size` at a time: the corrupted input repeated, each row with its own patch.

Attribution patching (`attribution_patching`, same arguments, sites and shapes) estimates the
same grid to first order from three passes in all: the clean run, and the corrupted run forward
and backward. It needs a metric that returns a tensor computed from the logits (as
`logit_diff`'s and `normalised_logit_diff`'s do), to differentiate it.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Sequence

import torch

from gpt2._checks import check_answer_and_other, is_integer, positive_int
from gpt2.errors import GPT2Error, InputTypeError, InvalidArgumentError
from gpt2.inspect.tracing import Tap, forward_steps, token_ids, trace
from gpt2.model.model import GPT2

SITES = ("resid_pre", "attn_out", "mlp_out", "head", "head_pos")
AXES = {
    "resid_pre": ("layer", "position"),
    "attn_out": ("layer", "position"),
    "mlp_out": ("layer", "position"),
    "head": ("layer", "head"),
    "head_pos": ("layer", "head", "position"),
}  # each site's grid, dimension by dimension

Metric = Callable[[torch.Tensor], float | torch.Tensor]  # logits (T, V) -> a number, or a tensor of one element
Ids = str | Sequence[int] | torch.Tensor
Entry = tuple[str, tuple[int, ...]]  # an activation's name, and the index patched in it (batch dimension dropped)


@torch.no_grad()
def activation_patching(
    model: GPT2, clean: Ids, corrupted: Ids, metric: Metric, site: str, batch_size: int = 16
) -> torch.Tensor:
    """The metric of the corrupted run with each activation of `site` taken from the clean
    run, one at a time: a float32 tensor shaped as the site's grid (see the module's docstring)."""
    clean_ids, corrupted_ids = _checked("activation_patching", model, clean, corrupted, metric, site)
    batch_size = positive_int("batch_size", batch_size)
    shape, entries = _grid(site, model.config.n_layer, model.config.n_head, len(clean_ids))
    kept = trace(model, clean_ids, names={name for name, _ in entries}).activations  # only the site's
    idx = torch.tensor([corrupted_ids], device=model.transformer.wte.weight.device)  # (1, T)
    values = []
    for start in range(0, len(entries), batch_size):
        rows = entries[start : start + batch_size]
        logits = forward_steps(model, idx.expand(len(rows), -1), _patches(kept, rows))  # (B, T, V)
        values += [_number(metric(row)) for row in logits]
    return torch.tensor(values, dtype=torch.float32).view(shape)


def attribution_patching(model: GPT2, clean: Ids, corrupted: Ids, metric: Metric, site: str) -> torch.Tensor:
    """activation_patching's grid estimated to first order (attribution patching, as Nanda's
    "Attribution Patching" and TransformerLens's demo of it compute it): each entry is

        metric(corrupted run) + sum over the activation's features of
            (clean activation - corrupted activation) * d metric / d activation at the corrupted run,

    a float32 tensor shaped as activation_patching's. Entries estimate activation_patching's
    entries themselves; minus metric(corrupted run) they are the estimated change of the metric
    that Nanda and TransformerLens report (the two agree where the metric is 0 on the corrupted
    run, as normalised_logit_diff is). `head` sums over every position of the head's output.

    One clean run (keeping only the site's activations), and the corrupted run forward and
    backward: `metric` must return a tensor computed from the logits (T, V), with its gradient."""
    clean_ids, corrupted_ids = _checked("attribution_patching", model, clean, corrupted, metric, site)
    shape, entries = _grid(site, model.config.n_layer, model.config.n_head, len(clean_ids))
    names = list(dict.fromkeys(name for name, _ in entries))  # the site's activations, a layer each, in order
    kept = trace(model, clean_ids, names=names).activations
    seen: dict[str, torch.Tensor] = {}

    def tap(name: str, x: torch.Tensor) -> torch.Tensor:  # keeps the corrupted run's activations, in the graph
        if name in kept:
            x = x if x.requires_grad else x.detach().requires_grad_()  # weights frozen: a leaf to differentiate by
            seen[name] = x
        return x

    idx = torch.tensor([corrupted_ids], device=model.transformer.wte.weight.device)  # (1, T)
    with torch.enable_grad():
        value = _differentiable(metric(forward_steps(model, idx, tap)[0]))
        grads = torch.autograd.grad(value, [seen[name] for name in names], allow_unused=True)
    features = (-2, -1) if site == "head" else (-1,)  # head: z (H, T, d) summed over positions too
    estimates = []
    for name, grad in zip(names, grads):  # a layer each
        delta = (kept[name] - seen[name][0].detach()).float()
        grad = torch.zeros_like(delta) if grad is None else grad[0].float()  # None: the metric does not depend on it
        estimates.append((delta * grad).sum(features))  # (T,); head (H,); head_pos (H, T)
    return (float(value.detach()) + torch.stack(estimates)).detach().cpu().view(shape)


def _checked(
    function: str, model: GPT2, clean: Ids, corrupted: Ids, metric: Metric, site: str
) -> tuple[list[int], list[int]]:
    """The patchings' common checks: the model, the site, the metric and the two inputs' ids."""
    if not isinstance(model, GPT2):
        raise InputTypeError(f"{function} takes a GPT2 model, got {type(model).__name__}", "model")
    if site not in SITES:
        raise InvalidArgumentError(f"unknown site {site!r}: the sites are {', '.join(SITES)}", "site")
    if not callable(metric):
        raise InputTypeError(f"metric must be a function of the logits (T, V), got {type(metric).__name__}", "metric")
    clean_ids, corrupted_ids = _ids(model, clean, "clean"), _ids(model, corrupted, "corrupted")
    if len(clean_ids) != len(corrupted_ids):
        raise InvalidArgumentError(
            f"clean and corrupted must have the same length: clean has {len(clean_ids)} tokens, "
            f"corrupted {len(corrupted_ids)}",
            "corrupted",
            also=("clean",),
        )
    return clean_ids, corrupted_ids


def _ids(model: GPT2, ids: Ids, param: str) -> list[int]:
    """tracing's own reading of an input, its errors naming `param` (clean or corrupted)."""
    try:
        return token_ids(model, ids)[0]
    except GPT2Error as e:
        raise type(e)(f"{param}: {e}", param) from None


def _grid(site: str, n_layer: int, n_head: int, T: int) -> tuple[tuple[int, ...], list[Entry]]:
    """The site's result shape, and for each of its entries (row-major) what one patched run replaces."""
    if site == "resid_pre":  # the stream entering block l: wte (+ wpe, the same in both runs) at l = 0
        return (n_layer, T), [
            ("wte" if l == 0 else f"h.{l - 1}", (t,)) for l, t in itertools.product(range(n_layer), range(T))
        ]
    if site in ("attn_out", "mlp_out"):
        step = "attn.c_proj" if site == "attn_out" else "mlp.c_proj"
        return (n_layer, T), [(f"h.{l}.{step}", (t,)) for l, t in itertools.product(range(n_layer), range(T))]
    if site == "head":  # z: (H, T, d)
        return (n_layer, n_head), [(f"h.{l}.attn.z", (h,)) for l, h in itertools.product(range(n_layer), range(n_head))]
    return (n_layer, n_head, T), [
        (f"h.{l}.attn.z", (h, t)) for l, h, t in itertools.product(range(n_layer), range(n_head), range(T))
    ]


def _patches(kept: dict[str, torch.Tensor], rows: list[Entry]) -> Tap:
    """The tap of one batch: row b's activation `name` takes the clean run's value at its index."""
    by_name: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for b, (name, index) in enumerate(rows):
        by_name.setdefault(name, []).append((b, index))

    def tap(name: str, x: torch.Tensor) -> torch.Tensor:  # x: (B, ...)
        if name not in by_name:
            return x
        x = x.clone()
        for b, index in by_name[name]:
            x[(b, *index)] = kept[name][index]
        return x

    return tap


def _number(value: object) -> float:
    """A metric's value as a float: a real number, or a tensor of one element."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    got = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise InputTypeError(f"metric must return a number (a float, or a tensor of one element), got {got}", "metric")


def _differentiable(value: object) -> torch.Tensor:
    """A metric's value as a 0-d tensor with a gradient, for attribution patching."""
    _number(value)  # a number of one element, or the error activation_patching gives
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        got = "a tensor with no gradient" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
        raise InputTypeError(
            f"metric must return a tensor computed from the logits, to differentiate (as logit_diff's), got {got}",
            "metric",
        )
    return value.reshape(())


# ------------------------------------------------------------------ ready metrics


def logit_diff(answer: int, other: int) -> Metric:
    """A metric: logits[-1, answer] - logits[-1, other] (a 0-d tensor), how much the model
    prefers `answer` to `other` as the next token after the last."""
    for name, value in (("answer", answer), ("other", other)):
        if not is_integer(value) or value < 0:
            raise InvalidArgumentError(f"{name} must be a token id (a whole number from 0), got {value!r}", name)
    check_answer_and_other(answer, other)

    def metric(logits: torch.Tensor) -> torch.Tensor:  # a 0-d tensor: attribution patching differentiates it
        n_vocab = logits.size(-1)
        for name, value in (("answer", answer), ("other", other)):
            if value >= n_vocab:
                raise InvalidArgumentError(f"{name} must be a token id below the model's {n_vocab}, got {value}", name)
        return logits[-1, answer] - logits[-1, other]

    return metric


@torch.no_grad()
def normalised_logit_diff(model: GPT2, clean: Ids, corrupted: Ids, answer: int, other: int) -> Metric:
    """A metric: logit_diff(answer, other) rescaled so that the corrupted run gives 0 and the
    clean run 1 (the fraction of the clean run's logit difference a patch brings back; a 0-d tensor)."""
    diff = logit_diff(answer, other)
    if not isinstance(model, GPT2):
        raise InputTypeError(f"normalised_logit_diff takes a GPT2 model, got {type(model).__name__}", "model")
    low = float(diff(trace(model, _ids(model, corrupted, "corrupted"), names=()).logits))
    high = float(diff(trace(model, _ids(model, clean, "clean"), names=()).logits))
    if high == low:
        raise InvalidArgumentError(
            f"clean and corrupted give the same logit difference ({high:.6g}): there is nothing to normalise by",
            "corrupted",
            also=("clean",),
        )
    return lambda logits: (diff(logits) - low) / (high - low)

"""Activation patching: which activations carry the difference between two inputs.

    metric = gpt2.inspect.logit_diff(answer, other)          # logits[-1, answer] - logits[-1, other]
    grid = gpt2.inspect.activation_patching(model, clean, corrupted, metric, "resid_pre")   # (n_layer, T)

Each entry is the metric of the corrupted run with one activation replaced by the clean run's
(`clean` and `corrupted`: texts, or token ids, of the same length). The sites, by
`gpt2.inspect.trace`'s names (TransformerLens's `patching.get_act_patch_*` function of each in
brackets; its name, with or without `get_act_patch_`, is read as the site's):

    resid_pre         (n_layer, T)             h.{l}.resid_pre at position t: the stream entering block l
                                               [resid_pre]
    resid_mid         (n_layer, T)             h.{l}.resid_mid at t: the stream between attention and
                                               the MLP [resid_mid]
    attn_out          (n_layer, T)             h.{l}.attn.c_proj at t: attention's output [attn_out]
    mlp_out           (n_layer, T)             h.{l}.mlp.c_proj at t: the MLP's output [mlp_out]
    head              (n_layer, n_head)        h.{l}.attn.z of head h at every position (before c_proj)
                                               [attn_head_out_all_pos]
    head_pos          (n_layer, n_head, T)     h.{l}.attn.z of head h at position t [attn_head_out_by_pos]
    head_q, head_k, head_v                     h.{l}.attn.q / .k / .v of head h at every position
                      (n_layer, n_head)        [attn_head_q_all_pos, ...]
    head_q_pos, head_k_pos, head_v_pos         the same at position t [attn_head_q_by_pos, ...]
                      (n_layer, n_head, T)
    head_pattern      (n_layer, n_head)        h.{l}.attn.pattern of head h, every row [attn_head_pattern_all_pos]
    head_pattern_pos  (n_layer, n_head, T)     its row t: where destination position t looks
                                               [attn_head_pattern_by_pos]
    block_every       (3, n_layer, T)          resid_pre, attn_out, mlp_out side by side [block_every]
    head_every        (5, n_layer, n_head)     head (z), head_q, head_k, head_v, head_pattern
                                               [attn_head_all_pos_every]
    head_pos_every    (5, n_layer, n_head, T)  their by-position grids [attn_head_by_pos_every]

The axes keep gpt2's order, (kind,) layer, head, position (`AXES`; kind: an "every" grid's
parts, in the order above), where TransformerLens's by-position head grids put the position
before the head.

A batch of prompts (`clean` and `corrupted` each a (B, T) tensor, a list of texts or of id
lists, the same shape after padding, each prompt as long in both) is patched as TransformerLens
patches one: each entry's activation is taken from the clean batch into every prompt of the
corrupted batch at once, and the metric reads the patched batch's logits (B, T, V) (one
sequence: (T, V)). It returns a number (the grid: the site's shape) or one per prompt, a (B,)
tensor (the grid: (B, *the site's shape), each prompt's own, as that prompt patched alone).
Texts are padded on the left by default (`padding_side`): position -1 is then every prompt's
last token, where a metric such as logit_diff reads the next token; padding on the right would
put pads there for every prompt but the longest. Pads change nothing: no position attends to
one, so patching one changes no prompt's tokens. `prepend_bos=True` puts <|endoftext|> before
each text, as TransformerLens's to_tokens does by default (gpt2's default runs texts as given).

How it runs: the clean run keeps only the site's activations; the corrupted run its keys and
values. The patched runs go through the model a pass at a time, each pass up to `batch_size`
rows (entries x B: max(1, batch_size // B) entries a pass; by default as many as keep the pass
within 256 positions, rows x its window, up to 64, and for a metric given every position's
logits within 64 positions' logits: `pass_rows`), each row with its own patch. An
entry at block l and position t changes nothing before either, so a pass holds entries of one
position t: it runs positions t.. only, attending to the corrupted run's keys before t; and its
rows branch off an unpatched run of the corrupted batch at the block they patch, so the blocks
before it run once for the pass. A metric that reads the last position only says so
(`metric.reads_last_position = True`, as `logit_diff`'s and `normalised_logit_diff`'s do): it is
given that position's logits alone, (B, 1, V) or (1, V), and the passes unembed it alone.

Attribution patching (`attribution_patching`, same arguments, sites and shapes) estimates the
same grid to first order from three passes in all: the clean run, and the corrupted run forward
and backward. It needs a metric that returns a tensor computed from the logits (as
`logit_diff`'s and `normalised_logit_diff`'s do), to differentiate it.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpt2._checks import boolean, check_answer_and_other, is_integer, positive_int
from gpt2.errors import GPT2Error, InputTypeError, InvalidArgumentError
from gpt2.inspect.tracing import Input, forward_steps, padded, read_input, recorder, weights_frozen
from gpt2.model.model import GPT2

HEAD_STEPS = ("attn.z", "attn.q", "attn.k", "attn.v", "attn.pattern")  # head_every's kinds, in TransformerLens's order


@dataclass(frozen=True)
class Site:
    """What a site patches: the block steps (several: an "every" grid, one part per step), and
    whether its entries go by head, by position, or both."""

    steps: tuple[str, ...]
    by_head: bool
    by_position: bool


# fmt: off
SITE_KINDS = {
    "resid_pre": Site(("resid_pre",), False, True),
    "attn_out": Site(("attn.c_proj",), False, True),
    "mlp_out": Site(("mlp.c_proj",), False, True),
    "head": Site(("attn.z",), True, False),
    "head_pos": Site(("attn.z",), True, True),
    "resid_mid": Site(("resid_mid",), False, True),
    "head_q": Site(("attn.q",), True, False),
    "head_k": Site(("attn.k",), True, False),
    "head_v": Site(("attn.v",), True, False),
    "head_pattern": Site(("attn.pattern",), True, False),
    "head_q_pos": Site(("attn.q",), True, True),
    "head_k_pos": Site(("attn.k",), True, True),
    "head_v_pos": Site(("attn.v",), True, True),
    "head_pattern_pos": Site(("attn.pattern",), True, True),
    "block_every": Site(("resid_pre", "attn.c_proj", "mlp.c_proj"), False, True),
    "head_every": Site(HEAD_STEPS, True, False),
    "head_pos_every": Site(HEAD_STEPS, True, True),
}
# fmt: on
SITES = tuple(SITE_KINDS)
AXES = {
    site: ("kind",) * (len(kind.steps) > 1) + ("layer",) + ("head",) * kind.by_head + ("position",) * kind.by_position
    for site, kind in SITE_KINDS.items()
}  # each site's grid, dimension by dimension ("kind": the parts of an "every" grid, in its steps' order)
# TransformerLens's patching functions, get_act_patch_{name}, by the site each computes.
TL_SITES = {
    "resid_pre": "resid_pre",
    "resid_mid": "resid_mid",
    "attn_out": "attn_out",
    "mlp_out": "mlp_out",
    "attn_head_out_all_pos": "head",
    "attn_head_out_by_pos": "head_pos",
    **{f"attn_head_{kind}_all_pos": f"head_{kind}" for kind in ("q", "k", "v", "pattern")},
    **{f"attn_head_{kind}_by_pos": f"head_{kind}_pos" for kind in ("q", "k", "v", "pattern")},
    "block_every": "block_every",
    "attn_head_all_pos_every": "head_every",
    "attn_head_by_pos_every": "head_pos_every",
}

Metric = Callable[[torch.Tensor], float | torch.Tensor]  # logits (B, T, V) or (T, V) -> a number, or (B,)
Ids = str | Sequence[int] | torch.Tensor | Sequence[str] | Sequence[Sequence[int]]


@dataclass(frozen=True)
class Entry:
    """One entry of a grid: its place (row-major), and the activation one patched run replaces:
    block `layer`'s `step`, at head `head` and position `position` (None: all of them)."""

    flat: int
    layer: int
    step: str
    head: int | None
    position: int | None

    @property
    def start(self) -> int:
        """The first position the patch changes: nothing before it differs from the corrupted run."""
        return 0 if self.position is None else self.position

    def index(self, start: int = 0) -> tuple[int, ...]:
        """Where the entry sits in its activation, the batch dimension dropped: (t,) in a (T, C)
        step, (h,) or (h, t) in a per-head (H, T, ...) one; positions counted from `start`."""
        head = () if self.head is None else (self.head,)
        return head + (() if self.position is None else (self.position - start,))


def canonical_site(site: str) -> str:
    """gpt2's name of a patching site: its own, or TransformerLens's function's name (attn_head_q_by_pos,
    get_act_patch_attn_head_q_by_pos)."""
    if isinstance(site, str):
        name = site.removeprefix("get_act_patch_")
        if site in SITE_KINDS:
            return site
        if name in TL_SITES:
            return TL_SITES[name]
    raise InvalidArgumentError(
        f"unknown site {site!r}: the sites are {', '.join(SITES)} (or TransformerLens's function names: "
        "attn_head_q_by_pos, get_act_patch_block_every, ...)",
        "site",
    )


def grid_shape(site: str, n_layer: int, n_head: int, T: int) -> tuple[int, ...]:
    """A site's grid, dimension by dimension as AXES names them: one patched run per entry."""
    kind = SITE_KINDS[canonical_site(site)]
    sizes = {"kind": len(kind.steps), "layer": n_layer, "head": n_head, "position": T}
    return tuple(sizes[axis] for axis in AXES[canonical_site(site)])


def entries(site: str, n_layer: int, n_head: int, T: int) -> list[Entry]:
    """Every entry of a site's grid, row-major."""
    kind = SITE_KINDS[site]
    heads = range(n_head) if kind.by_head else [None]
    positions = range(T) if kind.by_position else [None]
    product = itertools.product(kind.steps, range(n_layer), heads, positions)
    return [Entry(flat, layer, step, h, t) for flat, (step, layer, h, t) in enumerate(product)]


# ------------------------------------------------------------------ activation patching


@torch.no_grad()
def activation_patching(
    model: GPT2,
    clean: Ids,
    corrupted: Ids,
    metric: Metric,
    site: str,
    batch_size: int | None = None,
    *,
    padding_side: str = "left",
    prepend_bos: bool = False,
) -> torch.Tensor:
    """The metric of the corrupted run with each activation of `site` taken from the clean
    run, one at a time: a float32 tensor shaped as the site's grid (see the module's docstring),
    or (B, *that shape) where the metric returns one value per prompt.

    batch_size: the rows of a patched pass, entries x prompts (at least one entry a pass); by
    default as many as keep a pass within 256 positions (rows x its window), up to 64, and for a
    metric given every position's logits, within 64 positions' logits (`pass_rows`)."""
    site, clean, corrupted = _checked(
        "activation_patching", model, clean, corrupted, metric, site, padding_side, prepend_bos
    )
    last = bool(getattr(metric, "reads_last_position", False))
    batch_size = None if batch_size is None else positive_int("batch_size", batch_size)
    B, T = len(corrupted.ids), len(corrupted.ids[0])
    config = model.config
    grid = entries(site, config.n_layer, config.n_head, T)
    device = model.transformer.wte.weight.device
    idx = torch.tensor(corrupted.ids, device=device)  # (B, T)
    mask = None if corrupted.mask is None else corrupted.mask.to(device)  # clean's too: each prompt as long in both
    names = {f"h.{e.layer}.{e.step}" for e in grid}
    kept = _run(model, torch.tensor(clean.ids, device=device), mask, names)[1]  # the site's clean activations
    keys = {f"h.{i}.attn.{kv}" for i in range(config.n_layer) for kv in "kv"} if SITE_KINDS[site].by_position else ()
    logits, past = _run(model, idx, mask, keys)  # the corrupted run: its logits and keys before each window
    values: list[float | torch.Tensor | None] = [None] * len(grid)
    for start, group in itertools.groupby(sorted(grid, key=lambda e: (e.start, e.layer)), key=lambda e: e.start):
        group = list(group)
        per_pass = max(1, pass_rows(batch_size, last, T, start) // B)
        for i in range(0, len(group), per_pass):
            rows = group[i : i + per_pass]
            window = _patched_pass(model, idx, mask, past, kept, rows, start, last)  # (len(rows) * B, T', V)
            for j, e in enumerate(rows):
                out = window[j * B : (j + 1) * B]
                out = out if last or start == 0 else torch.cat([logits[:, :start], out], dim=1)  # (B, T, V)
                values[e.flat] = _value(metric(out if corrupted.batched else out[0]), B, corrupted.batched)
    return _grid(values, grid_shape(site, config.n_layer, config.n_head, T), B)


PASS_TOKENS = 256  # positions a patched pass runs (rows x its window): its activations' memory
PASS_LOGITS = 64  # logits rows a pass keeps where the metric reads every position: rows x T x V floats


def pass_rows(batch_size: int | None, last: bool, T: int, start: int) -> int:
    """The rows of a patched pass over positions start..T-1: `batch_size` where given; by default as
    many as keep it within PASS_TOKENS positions (up to 64), and, for a metric given every position's
    logits, PASS_LOGITS positions' logits (each row holds T x V floats)."""
    if batch_size is not None:
        return batch_size
    rows = min(64, max(1, PASS_TOKENS // (T - start)))
    return rows if last else min(rows, max(1, PASS_LOGITS // T))


def _run(model: GPT2, idx: torch.Tensor, mask: torch.Tensor | None, names) -> tuple[torch.Tensor, dict]:
    """A plain pass of a batch: its logits (B, T, V) and the activations `names` (B, ...)."""
    tap = recorder(model, None, names, "activation_patching")
    tap.batched = True
    return forward_steps(model, idx, tap, mask=mask), tap.activations


def _patched_pass(
    model: GPT2,
    idx: torch.Tensor,
    mask: torch.Tensor | None,
    past: dict[str, torch.Tensor],
    kept: dict[str, torch.Tensor],
    rows: list[Entry],
    start: int,
    last: bool,
) -> torch.Tensor:
    """The patched runs of `rows` (entries of one `start`, by layer) in one pass over positions
    start..T-1: logits (len(rows) * B, T - start, V) (last: (.., 1, V)), entry j's rows j*B..(j+1)*B.

    The pass begins as the corrupted batch itself (B rows); at block l's input the entries of
    block l branch off it, B rows each, and the unpatched rows stop after the last branch."""
    B = idx.size(0)
    layers = sorted({e.layer for e in rows})
    branch = {f"h.{l}.resid_pre": (sum(e.layer == l for e in rows), l == layers[-1]) for l in layers}
    writes: dict[str, list[tuple[slice, tuple, torch.Tensor]]] = {}
    for j, e in enumerate(rows):
        offset = B * (j + (e.layer != layers[-1]))  # behind the unpatched rows, until they stop
        name = f"h.{e.layer}.{e.step}"
        clean = kept[name][(slice(None), *e.index())]
        writes.setdefault(name, []).append(((slice(offset, offset + B), *e.index(start)), clean))

    def tap(name: str, x: torch.Tensor) -> torch.Tensor:  # x: (rows, ...)
        if name in branch:
            n, final = branch[name]
            x = torch.cat([x[B:] if final else x, x[:B].repeat(n, 1, 1)])  # n entries, B rows each
        if name in writes:
            x = x.clone()
            for at, value in writes[name]:
                x[at] = value
        return x[:, -1:] if last and name == "ln_f" else x  # the metric reads the last position alone

    k, v = ([past.get(f"h.{i}.attn.{kv}") for i in range(model.config.n_layer)] for kv in "kv")  # (B, H, T, d) each
    cache = CorruptedPrefix(k, v, mask, start, idx.shape, idx.device)
    return forward_steps(model, idx[:, start:], tap, cache=cache)


class CorruptedPrefix:
    """The corrupted run's keys and values before a pass's window, as forward_steps takes a KV
    cache (`gpt2.model.model.Cache`): the window's positions start..T-1 attend to them and to
    each other, as in the whole run. The pass's rows come in groups of the batch's B prompts (row
    r is prompt r % B), their number growing as entries branch off: each layer's keys and mask
    are the prompts' repeated to the rows it is given."""

    def __init__(self, k: list, v: list, mask: torch.Tensor | None, start: int, shape: torch.Size, device):
        (self.B, T), self.k, self.v, self.start = shape, k, v, start
        self.mask = self.attend = self.key_counts = None  # attend None: causal, query i sees keys 0..start + i
        self.positions = torch.arange(start, T, device=device)  # (T')
        if mask is not None:
            positions, attend = padded(mask)  # as the whole run's
            self.positions = positions[:, start:]  # (B, T'): from each first token
            self.attend = attend[:, :, start:]  # (B, 1, T', T): a pad sees itself alone, no token sees a pad

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The window's keys and values (rows, H, T', d) after the prefix's: (rows, H, T, d)."""
        n = k.size(0) // self.B  # the rows, B prompts each
        self.mask = None if self.attend is None else self.attend.repeat(n, 1, 1, 1)  # (rows, 1, T', T)
        if self.start == 0:
            return k, v
        past_k, past_v = (p[layer][:, :, : self.start].repeat(n, 1, 1, 1) for p in (self.k, self.v))
        return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)


# ------------------------------------------------------------------ checks


def _checked(
    function: str,
    model: GPT2,
    clean: Ids,
    corrupted: Ids,
    metric: Metric,
    site: str,
    padding_side: str,
    prepend_bos: bool = False,
) -> tuple[str, Input, Input]:
    """The patchings' common checks: the model, the site (gpt2's name of it), the metric and the two inputs."""
    _check_model(function, model)
    site = canonical_site(site)
    if not callable(metric):
        raise InputTypeError(
            f"metric must be a function of the logits ((B, T, V), or (T, V) for one sequence), got "
            f"{type(metric).__name__}",
            "metric",
        )
    return (site, *_pair(model, clean, corrupted, padding_side, prepend_bos))


def _check_model(function: str, model: object) -> None:
    if not isinstance(model, GPT2):
        raise InputTypeError(f"{function} takes a GPT2 model, got {type(model).__name__}", "model")


def _pair(model: GPT2, clean: Ids, corrupted: Ids, padding_side: str, prepend_bos: bool = False) -> tuple[Input, Input]:
    """The clean and corrupted inputs, read as trace reads them (padded on `padding_side`, after
    <|endoftext|> where prepend_bos): of the same shape, each prompt as long in both."""
    clean, corrupted = (
        _read(model, ids, param, padding_side, prepend_bos)
        for ids, param in ((clean, "clean"), (corrupted, "corrupted"))
    )
    if clean.batched != corrupted.batched:
        batch, one = ("clean", "corrupted") if clean.batched else ("corrupted", "clean")
        raise InvalidArgumentError(
            f"{batch} is a batch of prompts and {one} one sequence: give both as batches of the same shape",
            "corrupted",
            also=("clean",),
        )
    lengths = [_lengths(x) for x in (clean, corrupted)]
    if not clean.batched and lengths[0] != lengths[1]:
        raise InvalidArgumentError(
            f"clean and corrupted must have the same length: clean has {lengths[0][0]} tokens, "
            f"corrupted {lengths[1][0]}",
            "corrupted",
            also=("clean",),
        )
    if len(lengths[0]) != len(lengths[1]):
        raise InvalidArgumentError(
            f"clean and corrupted must be batches of as many prompts: clean has {len(lengths[0])}, "
            f"corrupted {len(lengths[1])}",
            "corrupted",
            also=("clean",),
        )
    for b, (n, m) in enumerate(zip(*lengths)):
        if n != m:
            raise InvalidArgumentError(
                f"clean and corrupted must have the same length, prompt by prompt: prompt {b} has {n} tokens "
                f"in clean, {m} in corrupted",
                "corrupted",
                also=("clean",),
            )
    return clean, corrupted


def _read(model: GPT2, ids: Ids, param: str, padding_side: str, prepend_bos: bool = False) -> Input:
    """tracing's own reading of an input, its errors naming `param` (clean or corrupted)."""
    try:
        return read_input(model, ids, padding_side, prepend_bos)
    except GPT2Error as e:
        if e.param not in (None, "ids"):  # padding_side's, prepend_bos's
            raise
        raise type(e)(f"{param}: {e}", param) from None


def _lengths(read: Input) -> list[int]:
    """Each prompt's tokens, its padding left out."""
    if read.mask is None:
        return [len(row) for row in read.ids]
    return read.mask.sum(-1).tolist()


def _value(value: object, B: int, batched: bool) -> float | torch.Tensor:
    """A metric's value: a float, or a (B,) float32 tensor of one per prompt (a batch only)."""
    if isinstance(value, torch.Tensor) and batched and tuple(value.shape) == (B,) and value.dtype != torch.bool:
        return value.detach().float().cpu()
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    got = f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    per_prompt = f" or one per prompt (a tensor of shape [{B}])" if batched else ""
    raise InputTypeError(
        f"metric must return a number (a float, or a tensor of one element){per_prompt}, got {got}", "metric"
    )


def _grid(values: list[float | torch.Tensor], shape: tuple[int, ...], B: int) -> torch.Tensor:
    """The entries' values as the site's grid (float32), or (B, *grid) where they are one per prompt."""
    per_prompt = {isinstance(v, torch.Tensor) for v in values}
    if len(per_prompt) > 1:
        raise InputTypeError(
            "metric returned a number for some patches and one per prompt for others: return one kind", "metric"
        )
    if per_prompt == {True}:
        return torch.stack(values, dim=1).view(B, *shape)
    return torch.tensor(values, dtype=torch.float32).view(shape)


def _differentiable(value: object, B: int, batched: bool) -> torch.Tensor:
    """A metric's value as a tensor with a gradient, for attribution patching: 0-d, or (B,) one per prompt."""
    kind = _value(value, B, batched)  # a number or one per prompt, or the error activation_patching gives
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        got = "a tensor with no gradient" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
        raise InputTypeError(
            f"metric must return a tensor computed from the logits, to differentiate (as logit_diff's), got {got}",
            "metric",
        )
    return value if isinstance(kind, torch.Tensor) else value.reshape(())


# ------------------------------------------------------------------ attribution patching


def attribution_patching(
    model: GPT2,
    clean: Ids,
    corrupted: Ids,
    metric: Metric,
    site: str,
    *,
    padding_side: str = "left",
    prepend_bos: bool = False,
) -> torch.Tensor:
    """activation_patching's grid estimated to first order (attribution patching, as Nanda's
    "Attribution Patching" and TransformerLens's demo of it compute it): each entry is

        metric(corrupted run) + sum over the activation's features of
            (clean activation - corrupted activation) * d metric / d activation at the corrupted run,

    a float32 tensor shaped as activation_patching's. Entries estimate activation_patching's
    entries themselves; minus metric(corrupted run) they are the estimated change of the metric
    that Nanda and TransformerLens report (the two agree where the metric is 0 on the corrupted
    run, as normalised_logit_diff is). Sites at every position (head, head_q, ...) sum over the
    positions too; a batch's, over its prompts, unless the metric returns one value per prompt:
    then each prompt's own estimate, (B, *grid), from the gradient of their sum (the prompts'
    rows are independent, so each value's gradient reaches its own prompt's activations alone).

    One clean run (keeping only the site's activations), and the corrupted run forward and
    backward: `metric` must return a tensor computed from the logits, with its gradient."""
    site, clean, corrupted = _checked(
        "attribution_patching", model, clean, corrupted, metric, site, padding_side, prepend_bos
    )
    kind, config = SITE_KINDS[site], model.config
    B, T = len(corrupted.ids), len(corrupted.ids[0])
    names = [f"h.{l}.{step}" for step in kind.steps for l in range(config.n_layer)]  # the grid's (kind, layer) order
    device = model.transformer.wte.weight.device
    mask = None if corrupted.mask is None else corrupted.mask.to(device)
    with torch.no_grad():
        kept = _run(model, torch.tensor(clean.ids, device=device), mask, set(names))[1]
    seen: dict[str, torch.Tensor] = {}

    def tap(name: str, x: torch.Tensor) -> torch.Tensor:  # keeps the corrupted run's activations, in the graph
        if name in kept:
            x = x if x.requires_grad else x.detach().requires_grad_()  # weights frozen: a leaf to differentiate by
            seen[name] = x
        return x

    with torch.enable_grad(), weights_frozen(model):
        logits = forward_steps(model, torch.tensor(corrupted.ids, device=device), tap, mask=mask)  # (B, T, V)
        value = _differentiable(metric(logits if corrupted.batched else logits[0]), B, corrupted.batched)
        grads = torch.autograd.grad(value.sum(), [seen[name] for name in names], allow_unused=True)
    features = (-1,) if kind.by_position else (-2, -1)  # sites at every position sum over the positions too
    per_prompt = value.dim() == 1
    estimates = []
    for name, grad in zip(names, grads):
        delta = (kept[name] - seen[name].detach()).float()  # (B, ...)
        grad = torch.zeros_like(delta) if grad is None else grad.float()  # None: the metric does not depend on it
        product = (delta * grad).sum(features)  # (B, T); (B, H); (B, H, T)
        estimates.append(product if per_prompt else product.sum(0))
    shape = grid_shape(site, config.n_layer, config.n_head, T)
    if per_prompt:
        return (value.detach()[:, None].float() + torch.stack(estimates, dim=1).flatten(1)).cpu().view(B, *shape)
    return (float(value.detach()) + torch.stack(estimates)).detach().cpu().view(shape)


# ------------------------------------------------------------------ ready metrics


def logit_diff(answer: int | Sequence[int], other: int | Sequence[int], per_prompt: bool = False) -> Metric:
    """A metric: logits[-1, answer] - logits[-1, other] (a 0-d tensor), how much the model
    prefers `answer` to `other` as the next token after the last.

    On a batch's logits (B, T, V): each prompt's, answer and other each a token id or a list of
    one per prompt; their mean (a 0-d tensor), or the (B,) values themselves where per_prompt
    (TransformerLens's demos' `per_prompt`). It reads the last position only
    (`reads_last_position`): give a batch of texts padded on the left."""
    answers, others = _answer_ids("answer", answer), _answer_ids("other", other)
    per_prompt = boolean("per_prompt", per_prompt)
    if len(answers) > 1 and len(others) > 1 and len(answers) != len(others):
        raise InvalidArgumentError(
            f"answer and other must give as many token ids, one per prompt: answer has {len(answers)}, "
            f"other {len(others)}",
            "other",
            also=("answer",),
        )
    n = max(len(answers), len(others))  # one side's single token stands for every prompt's
    for b in range(n):
        try:
            check_answer_and_other(answers[b % len(answers)], others[b % len(others)])
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"prompt {b}: {e}" if n > 1 else str(e), e.param, also=e.also) from None

    def metric(logits: torch.Tensor) -> torch.Tensor:  # a tensor: attribution patching differentiates it
        if not isinstance(logits, torch.Tensor) or logits.dim() not in (2, 3):
            got = f"shape {list(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise InputTypeError(f"logit_diff reads logits (T, V) or (B, T, V), got {got}", "logits")
        last = logits[..., -1, :].reshape(-1, logits.size(-1))  # (B, V); one sequence: (1, V)
        a, o = (_for_prompts(name, ids, last) for name, ids in (("answer", answers), ("other", others)))
        diff = last.gather(1, a[:, None])[:, 0] - last.gather(1, o[:, None])[:, 0]  # (B,)
        if logits.dim() == 2:
            return diff[0]
        return diff if per_prompt else diff.mean()

    metric.reads_last_position = True
    return metric


def _answer_ids(name: str, value: object) -> list[int]:
    """A logit difference's side: a token id, or a list of one per prompt."""
    ids = list(value) if isinstance(value, (list, tuple)) and value else [value]
    for i in ids:
        if not is_integer(i) or i < 0:
            raise InvalidArgumentError(
                f"{name} must be a token id (a whole number from 0), or a list of one per prompt, got {value!r}", name
            )
    return [int(i) for i in ids]


def _for_prompts(name: str, ids: list[int], last: torch.Tensor) -> torch.Tensor:
    """(B,): a side's token id for each prompt of the logits `last` (B, V), checked against them."""
    B, n_vocab = last.shape
    if len(ids) not in (1, B):
        raise InvalidArgumentError(
            f"{name} gives {len(ids)} token ids, one per prompt, but the logits are of {B} prompt{'s' * (B > 1)}", name
        )
    for i in ids:
        if i >= n_vocab:
            raise InvalidArgumentError(f"{name} must be a token id below the model's {n_vocab}, got {i}", name)
    return torch.tensor(ids, device=last.device).expand(B)


@torch.no_grad()
def normalised_logit_diff(
    model: GPT2,
    clean: Ids,
    corrupted: Ids,
    answer: int | Sequence[int],
    other: int | Sequence[int],
    per_prompt: bool = False,
    *,
    padding_side: str = "left",
    prepend_bos: bool = False,
) -> Metric:
    """A metric: logit_diff(answer, other) rescaled so that the corrupted run gives 0 and the
    clean run 1 (the fraction of the clean run's logit difference a patch brings back; a 0-d tensor).

    On a batch: (mean logit difference - the corrupted run's) / (the clean run's - the corrupted
    run's), the means over the prompts, as TransformerLens's demos normalise; per_prompt: (B,),
    each prompt by its own runs."""
    diff = logit_diff(answer, other, per_prompt=True)
    per_prompt = boolean("per_prompt", per_prompt)
    _check_model("normalised_logit_diff", model)
    clean, corrupted = _pair(model, clean, corrupted, padding_side, prepend_bos)
    device = model.transformer.wte.weight.device
    mask = None if corrupted.mask is None else corrupted.mask.to(device)
    low, high = (
        diff(_run(model, torch.tensor(x.ids, device=device), mask, ())[0]).float()  # (B,)
        for x in (corrupted, clean)
    )
    if not per_prompt:
        low, high = low.mean(0, keepdim=True), high.mean(0, keepdim=True)
    for b, (h, l) in enumerate(zip(high.tolist(), low.tolist())):
        if h == l:
            prompt = f"prompt {b}: " if per_prompt and len(clean.ids) > 1 else ""
            raise InvalidArgumentError(
                f"{prompt}clean and corrupted give the same logit difference ({h:.6g}): there is nothing to "
                "normalise by",
                "corrupted",
                also=("clean",),
            )

    def metric(logits: torch.Tensor) -> torch.Tensor:
        d = diff(logits)  # (B,); one sequence: 0-d
        if logits.dim() == 3 and not per_prompt:
            d = d.mean()
        return (d - low.to(d.device).view(d.shape)) / (high - low).to(d.device).view(d.shape)

    metric.reads_last_position = True
    return metric

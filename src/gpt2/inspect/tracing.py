"""Look inside: one forward pass that records, and may replace, every step of the seeds' pass.

    trace = gpt2.inspect.trace(model, "The dog chased the")
    trace.activations["h.3.attn.pattern"]     # (n_head, T, T): block 3's attention probabilities
    trace["pattern", 3]                        # the same, by TransformerLens's short name
    trace.logit_lens(6)                        # (T, V): the stream entering block 6, read out
    gpt2.inspect.trace(model, ids, patch={"h.1.mlp.c_proj": torch.zeros_like})   # block 1's MLP ablated
    batch = gpt2.inspect.trace(model, ["When Mary and John", "The war lasted"])   # padded, B first

Each step is named after the checkpoint's weights, as transformers and the seeds name them
(TransformerLens's hook names are read as aliases: `names.py` has the table):

    wte, wpe                 (T, C)       the input's token and position embeddings
    h.{i}.resid_pre          (T, C)       the residual stream entering block i     [names= only]
    h.{i}.ln_1.scale         (T, 1)       sqrt(var(x) + eps): LayerNorm's divisor   [names= only]
    h.{i}.ln_1.normalized    (T, C)       (x - mean) / scale, before g and b       [names= only]
    h.{i}.ln_1               (T, C)       block i's first LayerNorm
    h.{i}.attn.c_attn        (T, 3C)      q, k, v in one projection, before the split
    h.{i}.attn.q / .k / .v   (H, T, d)    each head's slice (d = C/H)              [names= only]
    h.{i}.attn.scores        (H, T, T)    q k^T / sqrt(d), -inf above the diagonal [names= only]
    h.{i}.attn.pattern       (H, T, T)    softmax of the scores: the attention probabilities
    h.{i}.attn.z             (H, T, d)    each head's output, pattern @ v          [names= only]
    h.{i}.attn.result        (H, T, C)    each head's output through its rows of c_proj, no bias
                                          (their sum plus the bias is attn.c_proj) [names= only]
    h.{i}.attn.c_proj        (T, C)       the heads merged and projected: attention's output
    h.{i}.resid_mid          (T, C)       the stream after attention is added       [names= only]
    h.{i}.ln_2.scale, .normalized, h.{i}.ln_2    as ln_1's
    h.{i}.mlp.c_fc           (T, 4C)      before GELU
    h.{i}.mlp.gelu           (T, 4C)
    h.{i}.mlp.c_proj         (T, C)       the MLP's output
    h.{i}                    (T, C)       the residual stream leaving block i
    ln_f.scale, ln_f.normalized, ln_f     the last LayerNorm's, before the unembedding

A batch (a (B, T) tensor, or a list of texts or of id lists, padded with an attention mask on
the side asked for) gives every step with B first. Padding is invisible to the prompts: each
row's positions count from its first token, and no position attends to a pad (a pad attends
to itself only, so its row stays finite); each prompt's numbers are those of a trace of it alone.

The pass here is the model's own modules (its weights, narrow or not, its LayerNorms and
projections) called one step at a time, with attention written out (softmax(q k^T / sqrt(d))
v, as `model.attention`) where the model's own pass calls a fused kernel that keeps no
probabilities, and GELU apart from c_fc. So the model's ordinary pass, generation and
training carry no hook at all and run as fast as before. A trace never drops out (dropout is
for training) and computes no gradients unless asked (grad=True).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from gpt2._checks import boolean
from gpt2.errors import GPT2Error, InputTypeError, InvalidArgumentError
from gpt2.inspect.names import activation_names, canonical, check_names, short_name, step_of
from gpt2.model.model import GPT2, Cache, attention_scores, merge_heads

Patch = Callable[..., torch.Tensor]  # fn(x) or fn(x, name) -> the value the pass goes on with
Tap = Callable[[str, torch.Tensor], torch.Tensor]  # (name, a step's value) -> the value the pass goes on with
PADDING_SIDES = ("right", "left")
SPLICE_STEPS = ("hook_sae_acts_post", "hook_sae_recons", "hook_sae_error")  # SAELens's names, after the site's
PER_HEAD = frozenset({"attn.q", "attn.k", "attn.v", "attn.z", "attn.result"})  # (H, T, ...): positions at dim 1
SQUARE = frozenset({"attn.scores", "attn.pattern"})  # (H, T, T): positions at dims 1 and 2


@dataclass
class Trace:
    """One forward pass, looked inside. `ids` the input's token ids; `tokens` their text, one
    string per id (None without a tokenizer); `logits` (T, V); `activations` each recorded step,
    by name (see the module's docstring), the batch dimension dropped.

    A batch: `ids` and `tokens` a list per row (padded), `logits` (B, T, V), every activation
    (B, ...), and `attention_mask` (B, T), True at the prompts' tokens and False at padding."""

    ids: list[int] | list[list[int]]
    tokens: list[str] | list[list[str]] | None
    logits: torch.Tensor
    activations: dict[str, torch.Tensor]
    model: GPT2 = field(repr=False)
    attention_mask: torch.Tensor | None = None

    @property
    def batched(self) -> bool:
        return self.logits.dim() == 3

    def __getitem__(self, key: str | tuple) -> torch.Tensor:
        """An activation by gpt2's name, TransformerLens's (blocks.3.attn.hook_pattern), or
        TransformerLens's short form: trace["pattern", 3], trace["scale", 3, "ln1"], trace["embed"]."""
        n_layer = self.model.config.n_layer
        name = short_name(*key) if isinstance(key, tuple) else key
        if canonical(name, n_layer) is None:
            check_names("name", n_layer, [name])  # its error: the names there are (a block the model lacks too)
        name = canonical(name, n_layer)
        if name not in self.activations:
            raise InvalidArgumentError(
                f"this trace did not record {name!r}: trace with names including it "
                f"(recorded: {', '.join(self.activations) or 'none'})",
                "name",
            )
        return self.activations[name]

    def residual(self, layer: int) -> torch.Tensor:
        """(T, C): the residual stream entering block `layer` (0..n_layer; n_layer: leaving the last)."""
        n_layer = self.model.config.n_layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layer:
            raise InvalidArgumentError(
                f"layer must be a whole number in 0..{n_layer} (the blocks' inputs, then the last "
                f"block's output), got {layer!r}",
                "layer",
            )
        if layer < n_layer and f"h.{layer}.resid_pre" in self.activations:
            return self.activations[f"h.{layer}.resid_pre"]
        needed = ["wte", "wpe"] if layer == 0 else [f"h.{layer - 1}"]
        missing = [name for name in needed if name not in self.activations]
        if missing:
            raise InvalidArgumentError(
                f"the residual stream entering block {layer} needs {' and '.join(missing)}, which "
                f"this trace did not record: trace with names including it",
                "layer",
            )
        return self.activations["wte"] + self.activations["wpe"] if layer == 0 else self.activations[f"h.{layer - 1}"]

    @torch.no_grad()
    def logit_lens(self, layer: int) -> torch.Tensor:
        """(T, V): the residual stream entering block `layer` read out as the model reads its
        last one, through ln_f and the unembedding (the logit lens). logit_lens(n_layer) is
        the logits."""
        return self.model.unembed(self.model.transformer.ln_f(self.residual(layer)))

    def positions(self, position: int = -1) -> torch.Tensor:
        """(B,): where each prompt's `position` (counted in its own tokens; from its end where
        negative) sits in the padded batch; (1,) for one sequence."""
        mask = self.attention_mask if self.batched else torch.ones(1, len(self.ids), dtype=torch.bool)
        mask = mask.cpu()
        lengths = mask.sum(-1)
        check_position(position, int(lengths.min()))
        first = (mask.cumsum(-1) == 0).sum(-1)  # each row's first token: after the left padding
        return first + (position if position >= 0 else lengths + position)

    def prompt(self, b: int) -> Trace:
        """Row b of a batch as a trace of its prompt alone: its padding dropped."""
        if not self.batched:
            raise InvalidArgumentError("prompt(b) takes a row of a batched trace; this trace is one sequence", "b")
        B = self.logits.size(0)
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < B:
            raise InvalidArgumentError(f"b must be a row of the batch, 0..{B - 1}, got {b!r}", "b")
        keep = self.attention_mask[b].nonzero()[:, 0].to(self.logits.device)  # (T_b,)
        activations = {}
        for name, value in self.activations.items():
            step, value = step_of(name), value[b]
            if step in SQUARE:
                value = value[:, keep][:, :, keep]
            elif step in PER_HEAD:
                value = value[:, keep]
            else:
                value = value[keep]
            activations[name] = value
        kept = keep.tolist()
        tokens = None if self.tokens is None else [self.tokens[b][t] for t in kept]
        return Trace([self.ids[b][t] for t in kept], tokens, self.logits[b, keep], activations, self.model)


@dataclass
class Splice:
    """A dictionary spliced into a traced pass: its features of `input_site`'s vectors decode into
    what the pass goes on with at `output_site` (the same site for an SAE; a block's MLP input and
    output for a transcoder). encode (..., d_in) -> (..., d); decode (features, input) -> (..., d_out),
    a skip transcoder's skip path included. SAE, Transcoder and TranscoderSet give theirs (`.splices()`)."""

    input_site: str
    output_site: str
    encode: Callable[[torch.Tensor], torch.Tensor]
    decode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def trace(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor | Sequence[str] | Sequence[Sequence[int]],
    patch: Mapping[str, Patch] | None = None,
    names: Iterable[str] | Callable[[str], bool] | None = None,
    *,
    padding_side: str = "right",
    prepend_bos: bool = False,
    grad: bool = False,
    saes: Sequence | None = None,
    error_term: bool = False,
) -> Trace:
    """Run `model` on one sequence, or a batch, and record its steps.

    ids: a 1-D sequence of token ids, or a string the model's tokenizer encodes; or a batch: a
    (B, T) tensor, a list of strings, or a list of id lists (rows of different lengths padded
    on `padding_side`, "right" or "left", with an attention mask).
    patch: {name: fn}. fn(activation) or fn(activation, name) gives the value the pass goes on
    with (same shape as recorded): every later step follows from it.
    names: the steps to record (default: all but the ON_REQUEST ones), or a function of a
    step's name (gpt2's, or TransformerLens's) that picks them. Recording fewer keeps memory
    small on long inputs: each block's pattern alone is n_head x T x T.
    prepend_bos: put <|endoftext|> before each text, as TransformerLens's to_tokens does by
    default; off by default (gpt2 runs the text as given, as transformers does). Ids are run as given.
    grad: keep the graph, so that `trace.logits[...].backward()` fills each recorded
    activation's `.grad` (the model's weights get none); off by default.
    saes: SAEs (gpt2.inspect.load_sae), transcoders or transcoder sets spliced into the pass: at
    each one's output site the pass goes on with its reconstruction (a transcoder's: from its
    input site's vectors), and three more steps are recorded and patchable, SAELens's names after
    the site's: SITE.hook_sae_acts_post (the features), SITE.hook_sae_recons (their decoding) and
    SITE.hook_sae_error (the site's own value less the reconstruction, with error_term). With
    error_term the error is added back: the pass is the model's own until a feature is patched.
    """
    splices, error_term = check_splices(model, saes), boolean("error_term", error_term)
    extra = splice_names(splices, error_term)
    tap = recorder(model, patch, names, "trace", grad=boolean("grad", grad), extra=extra)
    if splices:
        tap = SplicingTap(tap, splices, error_term)
    read = read_input(model, ids, padding_side, prepend_bos)
    tap.batched = read.batched
    device = model.transformer.wte.weight.device
    idx = torch.tensor(read.ids, device=device)  # (B, T)
    mask = None if read.mask is None else read.mask.to(device)
    with torch.enable_grad() if grad else torch.no_grad(), weights_frozen(model, grad):
        logits = forward_steps(model, idx, tap, mask=mask)  # (B, T, V)
    if not read.batched:
        return Trace(read.ids[0], None if read.tokens is None else read.tokens[0], logits[0], tap.activations, model)
    attention_mask = read.mask if read.mask is not None else torch.ones(idx.shape, dtype=torch.bool)
    return Trace(read.ids, read.tokens, logits, tap.activations, model, attention_mask)


@contextmanager
def weights_frozen(model: GPT2, frozen: bool = True) -> Iterator[None]:
    """The model's weights out of the graph while a pass records one: gradients flow to the
    activations only, and no weight's .grad is touched."""
    flags = [(p, p.requires_grad) for p in model.parameters()] if frozen else []
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def recorder(
    model: GPT2,
    patch: Mapping[str, Patch] | None = None,
    names: Iterable[str] | Callable[[str], bool] | None = None,
    caller: str = "trace",
    grad: bool = False,
    extra: Sequence[str] = (),
) -> Recorder:
    """The tap of a traced pass of `model`, its `patch` and `names` checked as `trace` takes them;
    `extra`: the steps of spliced dictionaries, recorded by default and patchable too."""
    if not isinstance(model, GPT2):
        raise InputTypeError(f"{caller} takes a GPT2 model, got {type(model).__name__}", "model")
    n_layer = model.config.n_layer
    default = activation_names(n_layer, on_request=False) + list(extra)
    record = set(_known("names", n_layer, default if names is None else names, extra))
    if patch is not None and not isinstance(patch, Mapping):
        raise InputTypeError(f"patch must be a mapping {{name: function}}, got {type(patch).__name__}", "patch")
    patch = dict(patch or {})
    ours = _known("patch", n_layer, list(patch), extra)
    for name, fn in patch.items():
        if not callable(fn):
            raise InputTypeError(
                f"patch[{name!r}] must be a function of the activation, got {type(fn).__name__}", "patch"
            )
    if len(ours) != len(patch):
        raise InvalidArgumentError("patch names one step twice (by gpt2's name and TransformerLens's)", "patch")
    return Recorder(record, dict(zip(ours, patch.values())), grad)


def _known(param: str, n_layer: int, names, extra: Sequence[str]) -> list[str]:
    """check_names, the spliced dictionaries' steps (`extra`) known too."""
    if callable(names):
        return check_names(param, n_layer, names) + [name for name in extra if names(name)]
    if isinstance(names, str):
        return check_names(param, n_layer, names)  # its error
    names = list(names)
    ours = check_names(param, n_layer, [n for n in names if n not in extra])
    return list(dict.fromkeys(ours + [n for n in names if n in extra]))


def takes_name(fn: Callable) -> bool:
    """Whether a patch function takes the step's name too: fn(x, name), TransformerLens's fn(x, hook) habit."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature (torch.zeros_like): fn(x)
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len([p for p in positional if p.default is p.empty]) >= 2 or any(
        p.kind == p.VAR_POSITIONAL for p in parameters
    )


def check_position(position: int, T: int) -> None:
    """Raise unless `position` picks one of T positions (from the end where negative)."""
    if isinstance(position, bool) or not isinstance(position, int) or not -T <= position < T:
        raise InvalidArgumentError(
            f"position must be a whole number in 0..{T - 1} (or -{T}..-1 from the end), got {position!r}", "position"
        )


def token_ids(
    model: GPT2, ids: str | Sequence[int] | torch.Tensor, prepend_bos: bool = False
) -> tuple[list[int], list[str] | None]:
    """A trace's input, checked: (its ids, their text, None without a tokenizer) of a string the
    model's tokenizer encodes (after <|endoftext|> where prepend_bos), or of 1-D token ids that fit
    the model."""
    tokenizer = model.tokenizer
    if isinstance(ids, str):
        if tokenizer is None:
            raise InvalidArgumentError("this model has no tokenizer to encode text with: give token ids", "ids")
        bos = []
        if prepend_bos:
            if tokenizer.eot_token is None:
                raise InvalidArgumentError(
                    "prepend_bos: this model's tokenizer has no <|endoftext|> to put before the text", "prepend_bos"
                )
            bos = [tokenizer.eot_token]
        ids = bos + tokenizer.encode_ordinary(ids)  # <|endoftext|> in the text is its characters
    elif isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise InvalidArgumentError(
                f"ids must be 1-D token ids (or a (B, T) batch), got a {ids.dtype} tensor of shape {list(ids.shape)}",
                "ids",
            )
        ids = ids.tolist()
    elif not isinstance(ids, Sequence) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputTypeError(
            f"ids must be a string or a 1-D sequence of token ids (or a batch of them), got {type(ids).__name__}",
            "ids",
        )
    ids = list(ids)
    if not ids:
        raise InvalidArgumentError("the text is empty: give at least one token", "ids")
    model.config.check_sequence(len(ids), min(ids), max(ids))
    tokens = None if tokenizer is None else [tokenizer.decode([i]) for i in ids]
    return ids, tokens


@dataclass
class Input:
    """A trace's input, read: `ids` (B, T) rows, padded; their `tokens`; `mask` (B, T), True at
    the prompts' tokens (None where no row is padded); `batched`: whether it came as a batch."""

    ids: list[list[int]]
    tokens: list[list[str]] | None
    mask: torch.Tensor | None
    batched: bool


def is_batch(ids: object) -> bool:
    """Whether a trace's input is a batch: a 2-D tensor, or a list of texts or of id sequences."""
    if isinstance(ids, torch.Tensor):
        return ids.dim() == 2
    return (
        isinstance(ids, Sequence)
        and not isinstance(ids, str)
        and len(ids) > 0
        and all(isinstance(row, (str, Sequence, torch.Tensor)) for row in ids)
    )


def read_input(model: GPT2, ids: object, padding_side: str = "right", prepend_bos: bool = False) -> Input:
    """One sequence or a batch (see `trace`), checked and padded on `padding_side`."""
    if padding_side not in PADDING_SIDES:
        raise InvalidArgumentError(f"padding_side must be right or left, got {padding_side!r}", "padding_side")
    prepend_bos = boolean("prepend_bos", prepend_bos)
    if not is_batch(ids):
        row, tokens = token_ids(model, ids, prepend_bos)
        return Input([row], None if tokens is None else [tokens], None, False)
    rows = []
    for b, row in enumerate(ids):
        try:
            rows.append(token_ids(model, row, prepend_bos))
        except GPT2Error as e:
            raise type(e)(f"ids[{b}]: {e}", e.param or "ids") from None
    T = max(len(row) for row, _ in rows)
    tokenizer = model.tokenizer
    pad = tokenizer.eot_token if tokenizer is not None and tokenizer.eot_token is not None else 0
    pad_text = None if tokenizer is None else tokenizer.decode([pad])
    left = padding_side == "left"
    padded, tokens, mask = [], [], torch.zeros(len(rows), T, dtype=torch.bool)
    for b, (row, text) in enumerate(rows):
        n = T - len(row)  # pads
        padded.append([pad] * n + row if left else row + [pad] * n)
        if text is not None:
            tokens.append([pad_text] * n + text if left else text + [pad_text] * n)
        mask[b, slice(n, T) if left else slice(0, len(row))] = True
    return Input(padded, tokens if tokenizer is not None else None, None if mask.all() else mask, True)


class Recorder:
    """What the traced pass calls at each step (a `Tap`): records the step if asked, and hands
    back the patched value where a patch is given. One sequence's steps are seen, patched and
    kept with the batch dimension dropped; a batch's (`batched`) with it."""

    def __init__(self, record: set[str], patch: dict[str, Patch], grad: bool = False):
        self.record, self.patch, self.grad = record, patch, grad
        self.with_name = {name: takes_name(fn) for name, fn in patch.items()}
        self.batched = False
        self.activations: dict[str, torch.Tensor] = {}

    def wants(self, name: str) -> bool:
        """Whether a step the pass computes only on demand (a head's result, a LayerNorm's scale) is needed."""
        return name in self.record or name in self.patch

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:  # x: (B, ...)
        if self.grad and name in ("wte", "wpe"):
            x = x.detach().requires_grad_()  # the graph starts at the embeddings: the weights are frozen
        value = x if self.batched else x[0]  # the pass goes on from this very tensor: its .grad is the step's
        if name in self.patch:
            value = self._patched(name, value)
        if name in self.record:
            if self.grad and value.requires_grad:
                value.retain_grad()
            self.activations[name] = value
        return value if self.batched else value[None]

    def _patched(self, name: str, value: torch.Tensor) -> torch.Tensor:
        fn = self.patch[name]
        copy = value.clone()  # a copy: a patch that edits in place edits only its own
        new = fn(copy, name) if self.with_name[name] else fn(copy)
        if not isinstance(new, torch.Tensor) or new.shape != value.shape:
            got = list(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise InvalidArgumentError(
                f"patch[{name!r}] must return a tensor of shape {list(value.shape)}, got {got}", "patch"
            )
        return new.to(value.device, value.dtype)


def check_splices(model: GPT2, saes: object) -> list[Splice]:
    """`trace`'s saes, as splices: each fitting the model, no two writing the same site."""
    if saes is None:
        return []
    if not isinstance(saes, Sequence) or isinstance(saes, str) or hasattr(saes, "splices"):
        saes = [saes]
    splices = []
    for sae in saes:
        if not callable(getattr(sae, "splices", None)):
            raise InputTypeError(
                "saes must hold SAEs (gpt2.inspect.load_sae), transcoders or transcoder sets, "
                f"got {type(sae).__name__}",
                "saes",
            )
        if callable(getattr(sae, "check_fits", None)):
            sae.check_fits(model)
        splices += sae.splices()
    n_layer = model.config.n_layer
    outputs = [s.output_site for s in splices]
    for s in splices:
        for site in (s.input_site, s.output_site):
            if canonical(site, n_layer) != site:
                raise InvalidArgumentError(f"saes: site {site!r} is not a step of this {n_layer}-block model", "saes")
        if outputs.count(s.output_site) > 1:
            raise InvalidArgumentError(f"saes: two dictionaries write {s.output_site}: splice one at a site", "saes")
    return splices


def splice_names(splices: Sequence[Splice], error_term: bool) -> list[str]:
    """The steps splicing adds: each site's features and reconstruction, and its error with error_term."""
    steps = SPLICE_STEPS if error_term else SPLICE_STEPS[:2]
    return [f"{s.output_site}.{step}" for s in splices for step in steps]


class SplicingTap:
    """A Recorder with dictionaries spliced in (`trace`'s saes): the pass goes on with each one's
    reconstruction at its output site, the error added back where `error_term`; its features,
    reconstruction and error are steps of their own, recorded and patched by the recorder."""

    def __init__(self, recorder: Recorder, splices: Sequence[Splice], error_term: bool):
        self.recorder, self.error_term = recorder, error_term
        self.by_output = {s.output_site: s for s in splices}
        self.inputs = {s.input_site for s in splices}
        self.seen: dict[str, torch.Tensor] = {}

    batched = property(lambda self: self.recorder.batched, lambda self, v: setattr(self.recorder, "batched", v))
    activations = property(lambda self: self.recorder.activations)

    def wants(self, name: str) -> bool:
        return self.recorder.wants(name)

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:  # x: (B, ...)
        x = self.recorder(name, x)
        if name in self.inputs:
            self.seen[name] = x
        splice = self.by_output.get(name)
        if splice is None:
            return x
        source = self.seen[splice.input_site]
        f = self.recorder(f"{name}.hook_sae_acts_post", splice.encode(source))
        out = self.recorder(f"{name}.hook_sae_recons", splice.decode(f, source))
        if not self.error_term:
            return out.to(x.dtype)
        error = self.recorder(f"{name}.hook_sae_error", x - splice.decode(splice.encode(source), source))
        return (out + error).to(x.dtype)


def wants(tap: Tap, name: str) -> bool:
    """Whether `tap` needs a step computed only on demand (a plain function needs none)."""
    return getattr(tap, "wants", None) is not None and tap.wants(name)


def forward_steps(
    model: GPT2, idx: torch.Tensor, tap: Tap, cache: Cache | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The seeds' forward pass, step by step: idx (B, T) -> logits (B, T, V). tap(name, x) is
    given each step (x: (B, ...)) and returns the value the pass goes on with.

    mask (B, T): True at tokens, False at padding: each row's positions count from its first
    token, and no position attends to a pad (a pad, to itself alone).

    With a KV cache whose step has begun (`gpt2.generation.caches.KVCache.begin_prefill` or
    `begin_decode`), as `GPT2.trunk` takes one: idx holds the new positions only; their
    positions come from the cache, their keys and values join it, and each attends to the
    keys of the positions before it there. The taps see the new positions only (scores and
    pattern: (B, H, T, S), S the keys seen)."""
    t = model.transformer
    B, T = idx.shape
    attend = None  # causal over these T positions
    if cache is not None:
        positions = cache.positions if cache.positions.dim() == 2 else cache.positions[None]  # (B, 1) or (1, T)
    elif mask is not None:
        positions, attend = padded(mask)
    else:
        positions = torch.arange(T, device=idx.device)[None].expand(B, T)  # (B, T)
    x = tap("wte", model.embed(idx)) + tap("wpe", t.wpe(positions).to(model.compute_dtype))  # (B, T, C)
    for i, block in enumerate(t.h):
        x = tap(f"h.{i}.resid_pre", x)
        ln_1 = _layer_norm(block.ln_1, x, tap, f"h.{i}.ln_1")
        x = tap(
            f"h.{i}.resid_mid",
            x + tap(f"h.{i}.attn.c_proj", _attention(block.attn, ln_1, tap, f"h.{i}.attn", cache, i, attend)),
        )
        ln_2 = _layer_norm(block.ln_2, x, tap, f"h.{i}.ln_2")
        x = x + tap(f"h.{i}.mlp.c_proj", _mlp(block.mlp, ln_2, tap, f"h.{i}.mlp"))
        x = tap(f"h.{i}", x)
    return model.unembed(_layer_norm(t.ln_f, x, tap, "ln_f"))


def padded(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch's mask (B, T), True at tokens -> each row's positions (B, T), counted from its
    first token, and what each query may attend (B, 1, T, T): the keys before it that are tokens, and
    itself (a pad sees itself alone, so its row stays finite)."""
    T = mask.size(1)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
    return positions, (causal & mask[:, None, None, :]) | torch.eye(T, dtype=torch.bool, device=mask.device)


def _layer_norm(ln: torch.nn.LayerNorm, x: torch.Tensor, tap: Tap, name: str) -> torch.Tensor:
    """(B, T, C) -> (B, T, C): the model's LayerNorm; written out where its parts are asked for:
    scale = sqrt(var(x) + eps) (B, T, 1), normalized = (x - mean) / scale, then * g + b."""
    if not (wants(tap, f"{name}.scale") or wants(tap, f"{name}.normalized")):
        return tap(name, ln(x))
    x32 = x.float()
    centered = x32 - x32.mean(-1, keepdim=True)
    scale = tap(f"{name}.scale", (centered.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt().to(x.dtype))  # (B, T, 1)
    y = tap(f"{name}.normalized", (centered / scale.float()).to(x.dtype)).float()
    y = y if ln.weight is None else y * ln.weight.float()
    y = y if ln.bias is None else y + ln.bias.float()
    return tap(name, y.to(x.dtype))


def _attention(
    attn: torch.nn.Module,
    x: torch.Tensor,
    tap: Tap,
    name: str,
    cache: Cache | None = None,
    layer: int = 0,
    attend: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, T, C) -> (B, T, C), with softmax(q k^T / sqrt(d)) v written out to keep the pattern."""
    q, k, v = attn.heads(tap(f"{name}.c_attn", attn.c_attn(x)))  # 3 x (B, H, T, d)
    q, k, v = tap(f"{name}.q", q), tap(f"{name}.k", k), tap(f"{name}.v", v)
    if cache is not None:
        k, v = cache.update(layer, k, v)  # (B, H, S, d): the cached positions' and these
        attend = cache.mask
    pattern = tap(
        f"{name}.pattern", torch.softmax(tap(f"{name}.scores", attention_scores(q, k, attend)), dim=-1)
    )  # (B, H, T, S)
    z = tap(f"{name}.z", pattern @ v)  # (B, H, T, d)
    if not wants(tap, f"{name}.result"):
        return attn.c_proj(merge_heads(z))
    result = tap(f"{name}.result", head_results(attn.c_proj, z))  # (B, H, T, C)
    bias = attn.c_proj.bias
    return result.sum(1) if bias is None else result.sum(1) + bias.to(result.dtype)


def head_results(c_proj: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """(B, H, T, d) heads' outputs -> (B, H, T, C): each through its own rows of c_proj (z_h W_O,h),
    without the bias. The projection is the model's own module (its weights, narrow or not),
    given each head's output alone in the merged input, the other heads' zero."""
    B, H, T, d = z.shape
    alone = z.new_zeros(B, H, T, H, d)
    heads = torch.arange(H, device=z.device)
    alone[:, heads, :, heads] = z.transpose(0, 1)  # [b, h, t, h]: head h's own slot
    out = c_proj(alone.view(B, H, T, H * d))
    return out if c_proj.bias is None else out - c_proj.bias.to(out.dtype)


def _mlp(mlp: torch.nn.Module, x: torch.Tensor, tap: Tap, name: str) -> torch.Tensor:
    """(B, T, C) -> (B, T, C): c_fc, GELU, c_proj, one step each."""
    h = tap(f"{name}.c_fc", mlp.c_fc(x))  # (B, T, 4C)
    return mlp.c_proj(tap(f"{name}.gelu", F.gelu(h, approximate=mlp.approximate)))


# ------------------------------------------------------------------ reading a trace


@torch.no_grad()
def logit_lens_top(trace: Trace) -> tuple[torch.Tensor, torch.Tensor]:
    """The logit lens's top token at every layer and position: (probabilities, ids), each
    (n_layer + 1, T), row `layer` read from the stream entering block `layer` (the last row: the
    output). One layer's (T, V) distribution at a time, and the trace's own logits for the last."""
    n_layer = trace.model.config.n_layer
    best = [
        torch.softmax((trace.logits if layer == n_layer else trace.logit_lens(layer)).float(), dim=-1).max(dim=-1)
        for layer in range(n_layer + 1)
    ]
    return torch.stack([b.values for b in best]).cpu(), torch.stack([b.indices for b in best]).cpu()


def next_token_report(trace: Trace, k: int = 5) -> dict:
    """What the model made of each token: `tokens`, `ids`, `logprobs` (None for the first, then
    each token's log-probability given those before it), `ranks` (1 = the model's top choice),
    and `top`: per position, the k most likely next tokens, [{"token", "id", "logprob"}, ...]."""
    one_sequence(trace, "next_token_report")
    n_vocab = trace.logits.size(-1)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_vocab:
        raise InvalidArgumentError(f"k must be a whole number in 1..{n_vocab}, got {k!r}", "k")
    logprobs = torch.log_softmax(trace.logits.float(), dim=-1).cpu()  # (T, V)
    actual = torch.tensor(trace.ids[1:])
    given = logprobs[:-1].gather(-1, actual[:, None])[:, 0]  # (T-1,): each token given those before
    ranks = 1 + (logprobs[:-1] > given[:, None]).sum(-1)
    best = logprobs.topk(k, dim=-1)
    decode = (lambda i: trace.model.tokenizer.decode([i])) if trace.model.tokenizer is not None else (lambda i: None)
    top = [
        [{"token": decode(i), "id": i, "logprob": lp} for i, lp in zip(ids, lps)]
        for ids, lps in zip(best.indices.tolist(), best.values.tolist())
    ]
    return {
        "tokens": trace.tokens,
        "ids": trace.ids,
        "logprobs": [None, *given.tolist()],
        "ranks": [None, *ranks.tolist()],
        "top": top,
    }


def one_sequence(trace: Trace, what: str) -> None:
    """Raise unless `trace` is of one sequence: `what` reads one; a batch's rows are trace.prompt(b)."""
    if trace.batched:
        raise InvalidArgumentError(f"{what} reads one sequence's trace: give one row, trace.prompt(b)", "trace")


def token_label(token: str | None, i: int) -> str:
    """A token as the terminal shows it: its text quoted, or its id where there is no tokenizer."""
    return repr(token) if token is not None else f"id {i}"


def alternatives(top: list[dict]) -> str:
    """A report's top tokens at one position, each with its probability: "',' 17.8%, '.' 10.2%"."""
    return ", ".join(f"{token_label(e['token'], e['id'])} {math.exp(e['logprob']):.1%}" for e in top)

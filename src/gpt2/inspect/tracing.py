"""Look inside: one forward pass that records, and may replace, every step of the seeds' pass.

    trace = gpt2.inspect.trace(model, "The dog chased the")
    trace.activations["h.3.attn.pattern"]     # (n_head, T, T): block 3's attention probabilities
    trace.logit_lens(6)                        # (T, V): the stream entering block 6, read out
    gpt2.inspect.trace(model, ids, patch={"h.1.mlp.c_proj": torch.zeros_like})   # block 1's MLP ablated

Each step is named after the checkpoint's weights, as transformers and the seeds name them:

    wte, wpe                 (T, C)       the input's token and position embeddings
    h.{i}.ln_1               (T, C)       block i's first LayerNorm
    h.{i}.attn.c_attn        (T, 3C)      q, k, v in one projection, before the split
    h.{i}.attn.q / .k / .v   (H, T, d)    each head's slice (d = C/H)              [names= only]
    h.{i}.attn.scores        (H, T, T)    q k^T / sqrt(d), -inf above the diagonal [names= only]
    h.{i}.attn.pattern       (H, T, T)    softmax of the scores: the attention probabilities
    h.{i}.attn.z             (H, T, d)    each head's output, pattern @ v          [names= only]
    h.{i}.attn.c_proj        (T, C)       the heads merged and projected: attention's output
    h.{i}.ln_2               (T, C)
    h.{i}.mlp.c_fc           (T, 4C)      before GELU
    h.{i}.mlp.gelu           (T, 4C)
    h.{i}.mlp.c_proj         (T, C)       the MLP's output
    h.{i}                    (T, C)       the residual stream leaving block i
    ln_f                     (T, C)       the last LayerNorm, before the unembedding

The pass here is the model's own modules (its weights, narrow or not, its LayerNorms and
projections) called one step at a time, with attention written out (softmax(q k^T / sqrt(d))
v, as `model.attention`) where the model's own pass calls a fused kernel that keeps no
probabilities, and GELU apart from c_fc. So the model's ordinary pass, generation and
training carry no hook at all and run as fast as before. A trace never drops out (dropout is
for training) and computes no gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from gpt2.errors import InputTypeError, InvalidArgumentError
from gpt2.model.model import GPT2, Cache, attention_scores, merge_heads

# Each block's steps, in the order the pass takes them ("" is the block's output, h.{i}).
BLOCK_STEPS = (
    "ln_1",
    "attn.c_attn",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.scores",
    "attn.pattern",
    "attn.z",
    "attn.c_proj",
    "ln_2",
    "mlp.c_fc",
    "mlp.gelu",
    "mlp.c_proj",
    "",
)
# Steps recorded only when `names` asks for them: per head, they are large or redundant.
ON_REQUEST = frozenset({"attn.q", "attn.k", "attn.v", "attn.scores", "attn.z"})

Patch = Callable[[torch.Tensor], torch.Tensor]
Tap = Callable[[str, torch.Tensor], torch.Tensor]  # (name, a step's value) -> the value the pass goes on with


def activation_names(n_layer: int, *, on_request: bool = True) -> list[str]:
    """The names of a model's steps, in the order of its forward pass; on_request=False leaves
    out those recorded only when asked for (q, k, v, scores, z)."""
    names = ["wte", "wpe"]
    for i in range(n_layer):
        names += [f"h.{i}.{step}" if step else f"h.{i}" for step in BLOCK_STEPS if on_request or step not in ON_REQUEST]
    return names + ["ln_f"]


@dataclass
class Trace:
    """One forward pass, looked inside. `ids` the input's token ids; `tokens` their text, one
    string per id (None without a tokenizer); `logits` (T, V); `activations` each recorded step,
    by name (see the module's docstring), the batch dimension dropped."""

    ids: list[int]
    tokens: list[str] | None
    logits: torch.Tensor
    activations: dict[str, torch.Tensor]
    model: GPT2 = field(repr=False)

    def residual(self, layer: int) -> torch.Tensor:
        """(T, C): the residual stream entering block `layer` (0..n_layer; n_layer: leaving the last)."""
        n_layer = self.model.config.n_layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layer:
            raise InvalidArgumentError(
                f"layer must be a whole number in 0..{n_layer} (the blocks' inputs, then the last "
                f"block's output), got {layer!r}",
                "layer",
            )
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


@torch.no_grad()
def trace(
    model: GPT2,
    ids: str | Sequence[int] | torch.Tensor,
    patch: Mapping[str, Patch] | None = None,
    names: Iterable[str] | None = None,
) -> Trace:
    """Run `model` on one sequence and record its steps.

    ids: a 1-D sequence of token ids, or a string the model's tokenizer encodes.
    patch: {name: fn}. fn(activation) gives the value the pass goes on with (same shape, the
    batch dimension dropped, as recorded): every later step follows from it.
    names: the steps to record (default: all but q, k, v, scores and z). Recording fewer keeps
    memory small on long inputs: each block's pattern alone is n_head x T x T.
    """
    tap = recorder(model, patch, names, "trace")
    ids, tokens = token_ids(model, ids)
    idx = torch.tensor([ids], device=model.transformer.wte.weight.device)  # (1, T)
    logits = forward_steps(model, idx, tap)[0]  # (T, V)
    return Trace(ids, tokens, logits, tap.activations, model)


def recorder(
    model: GPT2, patch: Mapping[str, Patch] | None = None, names: Iterable[str] | None = None, caller: str = "trace"
) -> Recorder:
    """The tap of a traced pass of `model`, its `patch` and `names` checked as `trace` takes them."""
    if not isinstance(model, GPT2):
        raise InputTypeError(f"{caller} takes a GPT2 model, got {type(model).__name__}", "model")
    n_layer = model.config.n_layer
    record = _check_names("names", n_layer, activation_names(n_layer, on_request=False) if names is None else names)
    patch = dict(patch or {})
    _check_names("patch", n_layer, patch)
    for name, fn in patch.items():
        if not callable(fn):
            raise InputTypeError(
                f"patch[{name!r}] must be a function of the activation, got {type(fn).__name__}", "patch"
            )
    return Recorder(record, patch)


def _check_names(param: str, n_layer: int, names: Iterable[str]) -> set[str]:
    if isinstance(names, str):
        raise InputTypeError(f"{param} must be a collection of activation names, got the string {names!r}", param)
    names = set(names)
    unknown = sorted(names - set(activation_names(n_layer)))
    if unknown:
        blocks = ", ".join(f"h.{{i}}.{step}" if step else "h.{i}" for step in BLOCK_STEPS)
        raise InvalidArgumentError(
            f"{param}: unknown activation {unknown[0]!r}; the names are wte, wpe, {blocks} "
            f"(i in 0..{n_layer - 1}), ln_f",
            param,
        )
    return names


def check_position(position: int, T: int) -> None:
    """Raise unless `position` picks one of T positions (from the end where negative)."""
    if isinstance(position, bool) or not isinstance(position, int) or not -T <= position < T:
        raise InvalidArgumentError(
            f"position must be a whole number in 0..{T - 1} (or -{T}..-1 from the end), got {position!r}", "position"
        )


def token_ids(model: GPT2, ids: str | Sequence[int] | torch.Tensor) -> tuple[list[int], list[str] | None]:
    """A trace's input, checked: (its ids, their text, None without a tokenizer) of a string the
    model's tokenizer encodes, or of 1-D token ids that fit the model."""
    tokenizer = model.tokenizer
    if isinstance(ids, str):
        if tokenizer is None:
            raise InvalidArgumentError("this model has no tokenizer to encode text with: give token ids", "ids")
        ids = tokenizer.encode_ordinary(ids)  # <|endoftext|> in the text is its characters
    elif isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise InvalidArgumentError(
                f"ids must be 1-D token ids, got a {ids.dtype} tensor of shape {list(ids.shape)}", "ids"
            )
        ids = ids.tolist()
    elif not isinstance(ids, Sequence) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputTypeError(f"ids must be a string or a 1-D sequence of token ids, got {type(ids).__name__}", "ids")
    ids = list(ids)
    if not ids:
        raise InvalidArgumentError("the text is empty: give at least one token", "ids")
    model.config.check_sequence(len(ids), min(ids), max(ids))
    tokens = None if tokenizer is None else [tokenizer.decode([i]) for i in ids]
    return ids, tokens


class Recorder:
    """What the traced pass calls at each step (a `Tap`): records the step if asked, and hands
    back the patched value where a patch is given."""

    def __init__(self, record: set[str], patch: dict[str, Patch]):
        self.record, self.patch = record, patch
        self.activations: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:  # x: (1, ...)
        if name in self.patch:
            new = self.patch[name](x[0].clone())  # a copy: a patch that edits in place edits only its own
            if not isinstance(new, torch.Tensor) or new.shape != x.shape[1:]:
                got = list(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise InvalidArgumentError(
                    f"patch[{name!r}] must return a tensor of shape {list(x.shape[1:])}, got {got}", "patch"
                )
            x = new.to(x.device, x.dtype)[None]
        if name in self.record:
            self.activations[name] = x[0]
        return x


def forward_steps(model: GPT2, idx: torch.Tensor, tap: Tap, cache: Cache | None = None) -> torch.Tensor:
    """The seeds' forward pass, step by step: idx (B, T) -> logits (B, T, V). tap(name, x) is
    given each step (x: (B, ...)) and returns the value the pass goes on with.

    With a KV cache whose step has begun (`gpt2.generation.caches.KVCache.begin_prefill` or
    `begin_decode`), as `GPT2.trunk` takes one: idx holds the new positions only; their
    positions come from the cache, their keys and values join it, and each attends to the
    keys of the positions before it there. The taps see the new positions only (scores and
    pattern: (B, H, T, S), S the keys seen)."""
    t = model.transformer
    positions = torch.arange(idx.size(1), device=idx.device) if cache is None else cache.positions  # (T,) or (B, 1)
    positions = positions if positions.dim() == 2 else positions[None]  # (1, T): wpe's step has a batch dimension
    x = tap("wte", model.embed(idx)) + tap("wpe", t.wpe(positions).to(model.compute_dtype))  # (B, T, C)
    for i, block in enumerate(t.h):
        attn = _attention(block.attn, tap(f"h.{i}.ln_1", block.ln_1(x)), tap, f"h.{i}.attn", cache, i)
        x = x + tap(f"h.{i}.attn.c_proj", attn)
        x = x + tap(f"h.{i}.mlp.c_proj", _mlp(block.mlp, tap(f"h.{i}.ln_2", block.ln_2(x)), tap, f"h.{i}.mlp"))
        x = tap(f"h.{i}", x)
    return model.unembed(tap("ln_f", t.ln_f(x)))


def _attention(
    attn: torch.nn.Module, x: torch.Tensor, tap: Tap, name: str, cache: Cache | None = None, layer: int = 0
) -> torch.Tensor:
    """(B, T, C) -> (B, T, C), with softmax(q k^T / sqrt(d)) v written out to keep the pattern."""
    q, k, v = attn.heads(tap(f"{name}.c_attn", attn.c_attn(x)))  # 3 x (B, H, T, d)
    q, k, v = tap(f"{name}.q", q), tap(f"{name}.k", k), tap(f"{name}.v", v)
    mask = None  # causal over these T positions
    if cache is not None:
        k, v = cache.update(layer, k, v)  # (B, H, S, d): the cached positions' and these
        mask = cache.mask
    pattern = tap(
        f"{name}.pattern", torch.softmax(tap(f"{name}.scores", attention_scores(q, k, mask)), dim=-1)
    )  # (B, H, T, S)
    z = tap(f"{name}.z", pattern @ v)  # (B, H, T, d)
    return attn.c_proj(merge_heads(z))


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


# What each step computes, as the seeds write it: the walkthrough's middle column.
STEP_MATH = {
    "wte": "wte[ids]: each token's embedding",
    "wpe": "wpe[0..T-1]: each position's embedding",
    "ln_1": "LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b",
    "attn.c_attn": "ln_1 @ W_attn + b: q, k, v side by side",
    "attn.q": "q split into heads: (T, C) -> (H, T, C/H)",
    "attn.k": "k split into heads",
    "attn.v": "v split into heads",
    "attn.scores": "q @ k^T / sqrt(C/H), -inf where a key is in the future",
    "attn.pattern": "softmax(scores): where each position looks",
    "attn.z": "pattern @ v: each head's output",
    "attn.c_proj": "heads merged @ W_proj + b: attention's output, added to x",
    "ln_2": "LayerNorm(x)",
    "mlp.c_fc": "ln_2 @ W_fc + b: up to 4C",
    "mlp.gelu": "GELU(c_fc), GPT-2's tanh approximation",
    "mlp.c_proj": "gelu @ W_proj + b: the MLP's output, added to x",
    "": "x + attn + mlp: the residual stream leaving the block",
    "ln_f": "LayerNorm(x) of the last block's output",
}


def walkthrough(trace: Trace, k: int = 5) -> list[str]:
    """The seeds' forward pass for this input, a line a step: the step, the tensor's shape, what
    it computes, and its first values at the last position (of the first head, for per-head
    steps); then the logits and the distribution of the next token."""
    T = len(trace.ids)
    shown = " ".join(repr(t) for t in trace.tokens) if trace.tokens is not None else ""
    lines = [
        f"{'tokens':<18} ids = {trace.ids}  {shown}",
        f"{'':<18} (T = {T}; values are of the last position, head 0 for per-head steps)",
    ]
    for name in activation_names(trace.model.config.n_layer):
        if name not in trace.activations:
            continue
        step = name if name in ("wte", "wpe", "ln_f") else name.split(".", 2)[2] if name.count(".") > 1 else ""
        value = trace.activations[name]
        last = value[0, -1] if value.dim() == 3 else value[-1]  # (H, T, ...) per head, else (T, ...)
        if step == "wpe":
            lines.append(_walk_line("wpe", value, STEP_MATH["wpe"], last))
            x = trace.activations["wte"] + value
            lines.append(_walk_line("x", x, "wte[ids] + wpe[pos]: the residual stream entering block 0", x[-1]))
        else:
            math_ = (
                STEP_MATH[step]
                if step != "mlp.gelu" or trace.model.config.activation == "gelu_tanh"
                else "GELU(c_fc), exact: u Phi(u)"
            )
            lines.append(_walk_line(name, value, math_, last))
    lines.append(
        _walk_line("logits", trace.logits, "ln_f @ wte^T: a score for every token of the vocabulary", trace.logits[-1])
    )
    report = next_token_report(trace, k)
    after = token_label(trace.tokens[-1] if trace.tokens is not None else None, trace.ids[-1])
    lines.append(f"{'softmax':<18} the next token after {after}: {alternatives(report['top'][-1])}")
    return lines


def token_label(token: str | None, i: int) -> str:
    """A token as the terminal shows it: its text quoted, or its id where there is no tokenizer."""
    return repr(token) if token is not None else f"id {i}"


def alternatives(top: list[dict]) -> str:
    """A report's top tokens at one position, each with its probability: "',' 17.8%, '.' 10.2%"."""
    return ", ".join(f"{token_label(e['token'], e['id'])} {math.exp(e['logprob']):.1%}" for e in top)


def _walk_line(name: str, value: torch.Tensor, math_: str, last: torch.Tensor) -> str:
    shape = "(" + ", ".join(map(str, value.shape)) + ")"
    values = ", ".join(f"{float(v):.4f}" for v in last[:4].float().cpu())
    return f"{name:<18} {shape:<16} {math_:<58} [{values}, ...]"

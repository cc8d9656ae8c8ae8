"""The GPT-2 model in PyTorch, following the seeds' forward pass.

    x = wte[idx] + wpe[pos]                      # (B, T, C) token + position embeddings
    for each of n_layer blocks:
        x = x + attn(ln_1(x))                    # causal multi-head self-attention
        x = x + mlp(ln_2(x))                     # C -> 4C -> GELU -> C
    logits = ln_f(x) @ wte.T                     # (B, T, V), unembedding tied to wte

B is the batch size, T the sequence length, C = n_embd, V = n_vocab, H = n_head.
Parameter names match OpenAI's and Hugging Face's, so checkpoints map name for name.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from gpt2._checks import check_token_ids
from gpt2._files import atomic_path, atomic_write_text, writable_directory
from gpt2._gemv import attend, gemv
from gpt2.config import GPT2Config
from gpt2.decoding import Request, run
from gpt2.devices import check_fits, resolve_device, weight_format
from gpt2.errors import ContextLengthError, GPT2Warning, InputTypeError, InvalidArgumentError
from gpt2.sampling import Sampling
from gpt2.tokenizer import assumed_tokenizer
from gpt2.weights import iter_tensors, locate, transformers_only_shapes


def softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Probabilities from logits, along `dim` (the seeds' last step), computed in float32.

    Subtracting the row's max before exp (done inside torch.softmax) avoids overflow.
    """
    return torch.softmax(logits.float(), dim=dim)


def sinusoidal_positions(n_ctx: int, n_embd: int) -> torch.Tensor:
    """(n_ctx, n_embd): PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C))."""
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]  # (n_ctx, 1)
    frequency = torch.exp(-math.log(10000.0) * torch.arange(0, n_embd, 2, dtype=torch.float64) / n_embd)
    table = torch.zeros(n_ctx, n_embd, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: n_embd // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """A fixed position table with an Embedding's interface; not a parameter, not saved."""

    def __init__(self, n_ctx: int, n_embd: int):
        super().__init__()
        self.register_buffer("weight", sinusoidal_positions(n_ctx, n_embd), persistent=False)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.weight[pos]


# Decoding on the CPU reads every weight once per token, so its speed is the rate at which the
# weights stream from memory. At one to a few rows, the matrix-vector product behind `x @ w` runs
# on one thread; our kernel (gpt2/_gemv.py, compiled on first use) streams at the machine's
# bandwidth. oneDNN's linear (in every x86 CPU build of torch) is its fallback where it cannot be
# built, and the path for many rows (a prompt, evaluation's windows), where it runs about 20%
# faster than addmm on this machine (benchmarks/RESULTS.md). Neither computes gradients, so only
# inference takes these paths; training runs addmm.
_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_FEW_ROWS = 16  # up to this many rows, the decode kernel


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gelu: str | None = None,
           scale: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """x @ weight + bias, with weight (in, out), then GELU if `gelu` names its form
    ("tanh" or "none", as F.gelu's `approximate`). (..., in) -> (..., out).

    A weight narrower than x (weight-only bfloat16, float16, or int8 times `scale`, one per
    output) is read as is by the decode kernel at few rows; for many it is widened first.
    """
    cpu_inference = x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
    if cpu_inference and x.numel() <= _FEW_ROWS * x.size(-1):
        y = gemv(x, weight, bias, gelu, scale)  # None where the kernel cannot serve
        if y is not None:
            return y
    if weight.dtype != x.dtype:
        weight = widen(weight, scale, x.dtype)
    if cpu_inference and _onednn_linear is not None:
        # takes weight as (out, in): a view, no copy; applies the GELU in the same pass
        return _onednn_linear(x, weight.t(), bias, "none" if gelu is None else "gelu", [], gelu or "")
    if bias is None:
        y = x @ weight
    else:  # the bias added inside the matrix product, not in a second pass over the output
        y = torch.addmm(bias, x.reshape(-1, x.size(-1)), weight).view(*x.shape[:-1], weight.size(-1))
    return y if gelu is None else F.gelu(y, approximate=gelu)


def widen(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A narrow weight in `dtype`: int8 times its scale per output (the last dimension)."""
    return weight.to(dtype) if scale is None else weight.to(dtype) * scale.to(dtype)


def quantize_int8(weight: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per output channel, the slices along `dim` (0 for
    a Dense's (in, out) weight, 1 for wte's (V, C) rows): weight ~ q * scale, |q| <= 127."""
    scale = weight.float().abs().amax(dim) / 127  # (out,)
    shape = (1, -1) if dim == 0 else (-1, 1)
    q = torch.round(weight.float() / scale.clamp(min=torch.finfo(torch.float32).tiny).view(shape)).clamp(-127, 127)
    return q.to(torch.int8), scale


class Dense(nn.Module):
    """A linear layer y = x @ weight + bias, with weight stored (in, out).

    That is the seeds' layout (W_1 is C x 3C) and the one OpenAI's and Hugging Face's
    checkpoints store, so weights load and save without a transpose. (nn.Linear stores
    the transpose, (out, in).)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("scale", None, persistent=False)  # (out,) for int8 weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, scale=self.scale)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position sees only itself and earlier ones."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = Dense(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = Dense(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        # PyTorch's fused kernel where it exists; the explicit masked softmax otherwise.
        self.use_sdpa = hasattr(F, "scaled_dot_product_attention")

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, C/H): each head attends over its own slice of the channels
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        mask = counts = None  # None: plain causal attention over exactly these T positions
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, S, C/H): the past and these T positions
            mask, counts = cache.mask, cache.key_counts  # counts: the keys each row sees, where lengths differ
        y = None
        one_query = T == 1 and (mask is None or counts is not None) and x.device.type == "cpu"
        if self.use_sdpa and one_query and not (self.training and self.dropout):
            y = attend(q, k, v, counts)  # decoding: our kernel, ~2x torch's attention here (None where it can't serve)
        if y is None and self.use_sdpa:
            dropout = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None and T > 1)
        elif y is None:
            y = attention(q, k, v, mask, self.attn_dropout)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, dropout: nn.Module | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, written out. q: (B, H, T, d); k, v: (B, H, S, d).

    mask: True where a query may see a key, broadcastable to (B, H, T, S); None is causal.
    """
    T, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v  # (B, H, T, d)


class KVCache:
    """Keys and values of the positions seen so far, for each layer, so that a new token costs
    one position's work instead of the whole sequence's.

    Preallocated: k and v hold one (slots, H, max_len, C/H) tensor per layer, and slot s holds
    lengths[s] positions. A prompt is prefilled into one slot; then each decoding step adds one
    position to each of the first B slots, whose lengths may differ (rows that joined a running
    batch at different times, as in llama.cpp's server slots): each new position attends to
    its own slot's positions only.
    """

    def __init__(self, config: GPT2Config, slots: int, max_len: int, device: torch.device, dtype: torch.dtype):
        shape = (slots, config.n_head, max_len, config.head_size)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.max_len = max_len
        self.lengths = [0] * slots  # positions filled in each slot
        # the step under way, shared by all layers: the new positions' ids, (T,) or (B, 1), and
        # the mask of what they see (None: plain causal attention)
        self.positions: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None
        self.key_counts: torch.Tensor | None = None  # (B,) keys each row sees, where the mask is by length
        self._slot: int | None = None  # the slot a prompt is prefilled into; None while decoding
        self._rows = self._columns = None  # (B,) each: where decoding writes its new keys
        self._seen = 0  # key positions a decoding step attends to: the longest row's, and the new one

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    @staticmethod
    def bytes_needed(config: GPT2Config, slots: int, max_len: int, dtype: torch.dtype) -> int:
        """The memory of a cache of `slots` rows of max_len positions (keys and values of every
        layer), with what a decoding step adds for each row (its logits, probabilities, a sort)."""
        return slots * (2 * config.n_layer * max_len * config.n_embd * dtype.itemsize + 3 * config.n_vocab * 4)

    @staticmethod
    def check_fits(config: GPT2Config, slots: int, max_len: int, device: torch.device, dtype: torch.dtype, hint: str) -> None:
        """Refuse, before any of it is allocated, a cache the device cannot hold (`devices.check_fits`;
        `hint` says which setting to lower)."""
        needed = KVCache.bytes_needed(config, slots, max_len, dtype)
        check_fits(needed, device, f"a KV cache of {slots:,} rows of {max_len:,} positions", hint)

    def begin_prefill(self, slot: int, T: int) -> None:
        """Prepare to fill `slot` with a prompt of T positions (what it held is dropped)."""
        if T > self.max_len:
            raise ContextLengthError(f"the KV cache holds {self.max_len} positions; a prompt of {T} does not fit")
        self._slot, self.lengths[slot] = slot, T
        self.positions, self.mask, self.key_counts = torch.arange(T, device=self.device), None, None

    def advance(self, B: int) -> list[int]:
        """Count one position more in each of slots 0..B-1; returns the new positions (their lengths before)."""
        lengths = self.lengths[:B]
        if max(lengths) >= self.max_len:
            raise ContextLengthError(f"the KV cache holds {self.max_len} positions; slot {lengths.index(max(lengths))} is full")
        for b in range(B):
            self.lengths[b] += 1
        return lengths

    def begin_decode(self, B: int) -> None:
        """Prepare to add one position to each of slots 0..B-1."""
        lengths = self.advance(B)
        self._slot = None
        self._rows = torch.arange(B, device=self.device)
        self._columns = torch.tensor(lengths, device=self.device)  # (B,): each row's new position
        self.positions = self._columns[:, None]  # (B, 1)
        self._seen = max(lengths) + 1
        # rows of one length see all the keys; otherwise each sees its own positions only
        same = min(lengths) == max(lengths)
        key = torch.arange(self._seen, device=self.device)
        self.key_counts = None if same else self._columns + 1  # (B,): each row's keys, itself included
        self.mask = None if same else (key[None, :] < self.key_counts[:, None])[:, None, None, :]  # (B, 1, 1, S)

    def begin_fixed_decode(self, positions: torch.Tensor) -> None:
        """Prepare a decoding step whose shapes never change (for CUDA graphs): slot b adds the
        position positions[b, 0], read from that (B, 1) device tensor when the step runs, and
        every row attends over the whole cache through a mask built from it. The caller counts
        the positions (`advance`)."""
        self._slot, self.positions, self._seen = None, positions, self.max_len
        self._rows, self._columns = torch.arange(positions.size(0), device=self.device), positions[:, 0]
        key = torch.arange(self.max_len, device=self.device)
        self.mask, self.key_counts = (key[None, :] <= positions)[:, None, None, :], None  # (B, 1, 1, max_len)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys and values (B, H, T, C/H); return those to attend to."""
        keys, values = self.k[layer], self.v[layer]
        if self._slot is not None:  # a prompt attends causally among its own positions
            keys[self._slot, :, : k.size(2)].copy_(k[0])
            values[self._slot, :, : v.size(2)].copy_(v[0])
            return k, v
        B = k.size(0)
        if self.mask is None:  # every row at one position: a slice, cheaper than indexing
            s = self._seen - 1
            keys[:B, :, s : s + 1].copy_(k)
            values[:B, :, s : s + 1].copy_(v)
        else:
            keys[self._rows, :, self._columns] = k[:, :, 0]  # (B, H, C/H) into each row's own position
            values[self._rows, :, self._columns] = v[:, :, 0]
        return keys[:B, :, : self._seen], values[:B, :, : self._seen]  # (B, H, S, C/H)

    def move(self, src: int, dst: int) -> None:
        """Copy slot src's positions into slot dst (a row moving to a slot freed below it)."""
        n = self.lengths[src]
        for tensor in self.k + self.v:
            tensor[dst, :, :n].copy_(tensor[src, :, :n])
        self.lengths[dst] = n


class MLP(nn.Module):
    """The position-wise feed-forward network: C -> 4C -> GELU -> C."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = Dense(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = Dense(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        # GPT-2's GELU is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = linear(x, self.c_fc.weight, self.c_fc.bias, gelu=self.approximate, scale=self.c_fc.scale)  # c_fc, GELU: one pass
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """One transformer block, pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """GPT-2: `model(idx)` gives logits (B, T, n_vocab); `model(idx, targets)` gives (logits, loss)."""

    def __init__(self, config: GPT2Config):
        if not isinstance(config, GPT2Config):
            hint = f"; to load weights, use GPT2.from_pretrained({config!r})" if isinstance(config, (str, os.PathLike)) else ""
            raise InputTypeError(f"GPT2() takes a GPT2Config, got {type(config).__name__}{hint}")
        super().__init__()
        self.config = config
        self.checkpoint_activations = False  # trade compute for memory in training (see trunk)
        self.cuda_graphs = False  # decode by replaying CUDA graphs (see use_cuda_graphs)
        self._graphed_engine: TorchEngine | None = None  # kept across calls, with its graphs
        self.tokenizer = None  # from_pretrained sets the tokenizer saved with the weights
        positions = (
            nn.Embedding(config.n_ctx, config.n_embd)
            if config.positions == "learned"
            else SinusoidalPositions(config.n_ctx, config.n_embd)
        )
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.n_vocab, config.n_embd),
                wpe=positions,
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias),
            )
        )
        self.transformer.wte.register_buffer("scale", None, persistent=False)  # (V,) for int8 weights
        self.apply(self._init_weights)
        # GPT-2's scaled init: residual projections shrink with depth so the sum stays O(1).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, Dense):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ---------------------------------------------------------------- forward

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, ignore_index: int = -100, check_ids: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx: (B, T) token ids. targets: (B, T) ids of the next tokens, `ignore_index` where none.

        Returns logits (B, T, n_vocab) or, with targets, (logits, mean cross-entropy).
        The ids are checked against the vocabulary unless `check_ids` is False: the trainer's
        batches were checked where they were made, and reading idx.min() inside a compiled
        step would break its graph (so a compiled call never reads them either).
        """
        self._check_input(idx, check_ids and not torch.compiler.is_compiling())
        logits = self.unembed(self.trunk(idx))  # (B, T, V)
        if targets is None:
            return logits
        if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
            shape = list(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise InvalidArgumentError(f"targets must be a tensor shaped like idx {list(idx.shape)}, got {shape}")
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets.reshape(-1).to(logits.device), ignore_index=ignore_index
        )
        return logits, loss

    def trunk(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The forward pass up to the unembedding: idx (B, T) -> final hidden states (B, T, C).

        Training, evaluation and generation all run this one pass. With a cache, the step it
        has begun (`KVCache.begin_prefill` or `begin_decode`) gives the positions, and their
        keys and values are added to it.
        """
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device) if cache is None else cache.positions  # (T,) or (B, 1)
        x = self.transformer.drop(self.embed(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for layer, block in enumerate(self.transformer.h):
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                # keep only each block's input; recompute its inside during backward (same dropout masks)
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, cache, layer)
        return self.transformer.ln_f(x)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token embeddings: (B, T) ids -> (B, T, C) rows of wte, widened where they are stored narrow."""
        wte = self.transformer.wte
        x = wte(idx)
        if x.dtype == self.compute_dtype:
            return x
        return widen(x, None if wte.scale is None else wte.scale[idx, None], self.compute_dtype)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states: (..., C) -> (..., V), x @ wte.T (the unembedding tied to wte)."""
        wte = self.transformer.wte
        return linear(x, wte.weight.t(), scale=wte.scale)

    @torch.inference_mode()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        on_overflow: str = "slide",
    ) -> torch.Tensor:
        """Continue each sequence of idx (B, T) by max_new_tokens tokens: returns (B, T + new).

        temperature 0 is greedy; top_k and top_p filter before sampling; a seed makes sampling
        reproducible (row b samples from seed + b, so a row's tokens do not depend on the rows
        beside it). With eos_token_id, a row that produced it is filled with it from then on,
        and generation stops early once every row has. Past n_ctx tokens the context slides
        (on_overflow="slide", with a warning) or raises (on_overflow="error"). Call model.eval()
        first, as with any inference: in training mode dropout stays on.
        """
        if not isinstance(idx, torch.Tensor) or idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.dim() != 2:
            what = f"{idx.dtype} tensor of shape {list(idx.shape)}" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise InputTypeError(f"idx must be an integer tensor of token ids shaped (B, T), got a {what}")
        request = Request.build(idx.tolist(), max_new_tokens, n_vocab=self.config.n_vocab, n_ctx=self.config.n_ctx,
                                sampling=Sampling(temperature, top_k, top_p), seed=seed, eos_token_id=eos_token_id,
                                on_overflow=on_overflow)  # fmt: skip
        B, T = idx.shape
        rows = request.rows()
        run(self.engine(B, T + max_new_tokens, use_cache, hint="fewer rows in idx at once"), rows)
        steps = max(len(row.tokens) for row in rows)  # all rows stop once every one has ended
        new = [row.tokens + [eos_token_id] * (steps - len(row.tokens)) for row in rows]  # an ended row: eos from then on
        return torch.cat([idx, torch.tensor(new, dtype=idx.dtype).view(B, steps).to(idx.device)], dim=1)

    def new_cache(self, slots: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache of `slots` sequences of up to `max_len` (default n_ctx) positions each."""
        max_len = self.config.n_ctx if max_len is None else min(max_len, self.config.n_ctx)
        return KVCache(self.config, slots, max_len, self.device, self.compute_dtype)

    def _check_input(self, idx: torch.Tensor, check_ids: bool = True) -> None:
        if not isinstance(idx, torch.Tensor) or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            what = f"a {idx.dtype} tensor" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise InputTypeError(f"idx must be an integer tensor of token ids (B, T), got {what}")
        if idx.dim() != 2:
            raise InvalidArgumentError(f"idx must have shape (B, T), got {list(idx.shape)}; for one sequence use idx[None]")
        B, T = idx.shape
        if B == 0 or T == 0:
            raise InvalidArgumentError(f"idx is empty (shape {list(idx.shape)}): give at least one token in each of at least one sequence")
        self.config.check_length(T)
        if check_ids:  # reads two values back from the device
            check_token_ids(int(idx.min()), int(idx.max()), self.config.n_vocab, whose="this model's ")

    # ------------------------------------------------------------- utilities

    def num_parameters(self) -> int:
        """Number of parameters, each counted once (the tied wte/unembedding included once)."""
        return sum(p.numel() for p in self.parameters())

    def set_attention(self, implementation: str) -> GPT2:
        """"sdpa" (PyTorch's fused attention) or "math" (the explicit masked softmax)."""
        if implementation not in ("sdpa", "math"):
            raise InvalidArgumentError(f"attention implementation must be 'sdpa' or 'math', got {implementation!r}")
        for block in self.transformer.h:
            block.attn.use_sdpa = implementation == "sdpa"
        return self

    def use_cuda_graphs(self, enabled: bool = True) -> GPT2:
        """Decode by replaying CUDA graphs (`DecodeGraphs`): off by default, as it has not yet
        been measured on a GPU; on a CUDA device only."""
        if enabled and self.device.type != "cuda":
            raise InvalidArgumentError(f"CUDA graphs replay decoding on a CUDA GPU; this model is on {self.device}")
        self.cuda_graphs, self._graphed_engine = bool(enabled), None
        return self

    def engine(self, slots: int, max_len: int, use_cache: bool = True, hint: str = "fewer rows at once") -> TorchEngine:
        """An engine to decode up to `slots` rows of up to max_len positions. With CUDA graphs,
        one engine over the whole context is kept and reused (replaced by a larger one when more
        slots are asked for), so each batch-size bucket is captured once, not at every call.
        A KV cache the device cannot hold is refused first, `hint` saying what to lower."""
        graphed = self.cuda_graphs and use_cache
        if graphed and self._graphed_engine is not None and self._graphed_engine.slots >= slots:
            return self._graphed_engine  # its cache is held already: nothing new to fit
        if graphed:
            self._graphed_engine = None  # its cache and graphs freed before the new ones are made
        KVCache.check_fits(self.config, slots, self.config.n_ctx if graphed else min(max_len, self.config.n_ctx), self.device,
                           self.compute_dtype, hint)  # fmt: skip
        if not graphed:
            return TorchEngine(self, slots, max_len, use_cache)
        self._graphed_engine = TorchEngine(self, slots)
        return self._graphed_engine

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (of the matrices, where they are stored narrower than the rest)."""
        return self.transformer.wte.weight.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The activations' dtype: float32 where the weights are stored narrow on the CPU."""
        return self.transformer.ln_f.weight.dtype

    # ------------------------------------------------------- loading, saving

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "float32",
        dropout: float | None = None,
    ) -> GPT2:
        """Load OpenAI's weights: a released name (gpt2, gpt2-medium, gpt2-large, gpt2-xl),
        a Hugging Face directory, or a directory of OpenAI's original TensorFlow release.
        `dropout` replaces the checkpoint's (for fine-tuning; inference never drops).

        The model is built without memory for its weights (on the meta device), then each
        tensor read from the checkpoint becomes its parameter, one at a time, so loading needs
        little more memory than the model itself. Returns the model in eval mode, with
        `model.tokenizer` the tokenizer saved with the weights (GPT-2's where none is and the
        vocabulary is GPT-2's, else None).

        `dtype` is float32, bfloat16, float16, or int8 (the CPU only). On a GPU the whole model
        takes it; on the CPU, which has no fast 16-bit arithmetic, the lower ones are weight-only:
        the matrices (each layer's and wte) are stored narrow, quantised at load time for int8
        (symmetric, one float32 scale per output channel), and everything else, activations
        included, stays float32 (see `gpt2.devices.weight_format`).
        """

        device = resolve_device(device)
        form = weight_format(dtype, device)
        checkpoint = locate(name_or_path)
        config = checkpoint.config if dropout is None else checkpoint.config.replace(dropout=dropout)
        with torch.device("meta"):
            model = cls(config)
        for name, tensor in iter_tensors(checkpoint, framework="pt"):
            module_name, _, attr = name.rpartition(".")
            module = model.get_submodule(module_name)
            matrix = attr == "weight" and (isinstance(module, Dense) or module is model.transformer.wte)
            if matrix and form.storage == torch.int8:
                tensor, scale = quantize_int8(tensor.to(device), dim=0 if isinstance(module, Dense) else 1)
                module.scale = scale
            # copies only when the device, dtype or layout must change
            tensor = tensor.to(device=device, dtype=form.storage if matrix else form.compute)
            if matrix and form.weight_only and isinstance(module, Dense):
                # stored (out, in) and seen (in, out): the decode kernel reads narrow weights fastest
                # as one contiguous row per output, as wte's rows already are for the unembedding
                tensor = tensor.t().contiguous().t()
            else:
                tensor = tensor.contiguous()
            setattr(module, attr, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
        model._reset_buffers(device, form.compute)
        model.tokenizer = checkpoint.load_tokenizer()
        return model.eval()

    def crop_context(self, n_ctx: int) -> GPT2:
        """Shrink the context to `n_ctx` positions (nanoGPT's crop_block_size): fine-tuning on
        shorter blocks keeps the first n_ctx rows of the position table."""
        if not 1 <= n_ctx <= self.config.n_ctx:
            raise ContextLengthError(f"block size {n_ctx} must be from 1 to the model's context of n_ctx={self.config.n_ctx}")
        wpe = self.transformer.wpe
        if isinstance(wpe, SinusoidalPositions):
            wpe.weight = wpe.weight[:n_ctx]
        else:
            wpe.weight = nn.Parameter(wpe.weight.detach()[:n_ctx].clone())
            wpe.num_embeddings = n_ctx
        self.config = self.config.replace(n_ctx=n_ctx)
        return self

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face's names, which are ours, and in its layout, which is ours."""
        return {name: p.detach() for name, p in self.named_parameters()}

    def _reset_buffers(self, device: torch.device, dtype: torch.dtype) -> None:
        """Compute the buffers no checkpoint holds, for a model built on the meta device."""
        wpe = self.transformer.wpe
        if isinstance(wpe, SinusoidalPositions):
            wpe.weight = sinusoidal_positions(self.config.n_ctx, self.config.n_embd).to(device=device, dtype=dtype)

    def save_pretrained(self, directory: str | os.PathLike, tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Write `config.json` + `model.safetensors` in Hugging Face's GPT-2 layout, and the tokenizer.

        transformers loads the result: `AutoModelForCausalLM.from_pretrained(directory)` with nothing
        missing or newly initialised (a model without biases gets zero biases, one with sinusoidal
        positions the fixed table as wpe: what transformers' GPT-2 needs to compute the same), and
        `AutoTokenizer.from_pretrained(directory)` (see `Tokenizer.save_pretrained`). So does
        `GPT2.from_pretrained`. Each file is written to a temporary name and renamed into place.
        The tokenizer is `model.tokenizer`, or GPT-2's for a model of GPT-2's vocabulary that has
        none; its <|endoftext|> is config.json's eos id (none for a character vocabulary). `tensors`
        replaces the model's own weights: those of a model sharded over processes, gathered on one.
        """
        if self.dtype == torch.int8:
            raise InvalidArgumentError("an int8 model is not saved: its weights were quantised when it was loaded; load the "
                                       "checkpoint with dtype float32 (or bfloat16) to save it")  # fmt: skip
        directory = writable_directory(directory)
        tensors = {name: t.contiguous().cpu() for name, t in (tensors or self.hf_state_dict()).items()}
        dtype = tensors["transformer.ln_f.weight"].dtype  # of the vectors (a narrow CPU model keeps them in float32)
        for name, shape in transformers_only_shapes(self.config).items():
            positions = name == "transformer.wpe.weight"
            tensors[name] = sinusoidal_positions(*shape).to(dtype) if positions else torch.zeros(shape, dtype=dtype)
        tokenizer = self.tokenizer if self.tokenizer is not None else assumed_tokenizer(self.config.n_vocab)
        eot_token = None if tokenizer is None else tokenizer.eot_token
        with atomic_path(directory / "model.safetensors") as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        atomic_write_text(directory / "config.json", json.dumps(self.config.to_hf_dict(eot_token), indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(directory, model_max_length=self.config.n_ctx)


class TorchEngine:
    """Next-token logits from the torch model for `slots` rows (a `gpt2.decoding.Engine`),
    each in a slot of the KV cache of up to `max_len` positions (default n_ctx).

    Past max_len the context slides, as nanoGPT crops: a full slot is refilled with its last
    max_len - 1 tokens before the new one (so give max_len = n_ctx where that can happen).
    Without `use_cache`, every step recomputes each row's whole context (a check of the cache).
    """

    def __init__(self, model: GPT2, slots: int, max_len: int | None = None, use_cache: bool = True, graphs: bool | None = None):
        self.model, self.slots = model, slots
        self.cache = model.new_cache(slots, max_len)
        self.max_len = self.cache.max_len
        self.use_cache = use_cache
        self.history: list[list[int]] = [[] for _ in range(slots)]  # each slot's tokens: to slide, or recompute
        # fixed-shape steps, replayed as CUDA graphs on a GPU (graphs=None: as model.use_cuda_graphs set)
        graphs = model.cuda_graphs if graphs is None else graphs
        self.graphs = DecodeGraphs(model, self.cache) if graphs and use_cache else None

    def prefill(self, slot: int, tokens: Sequence[int], every_position: bool = False) -> torch.Tensor:
        self.history[slot] = list(tokens)
        return self._fill(slot, self.history[slot][-self.max_len :], every_position)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        B, new = tokens.size(0), tokens.tolist()
        for b, token in enumerate(new):
            self.history[b].append(token)
        if not self.use_cache:
            return torch.stack([self._fill(b, self.history[b][-self.max_len :]) for b in range(B)])
        for b in range(B):
            if self.cache.lengths[b] == self.max_len:  # the context slides: recompute the window before the new token
                self._fill(b, self.history[b][-self.max_len : -1])
        if self.graphs is not None:
            return self.graphs.decode(new, self.cache.advance(B))
        self.cache.begin_decode(B)
        return self.model.unembed(self.model.trunk(tokens[:, None].to(self.model.device), self.cache)[:, -1])  # (B, V)

    def move(self, src: int, dst: int) -> None:
        self.history[dst] = list(self.history[src])
        self.cache.move(src, dst)

    def _fill(self, slot: int, window: list[int], every_position: bool = False) -> torch.Tensor:
        """Logits after `window`, which fills the slot: (V,), or (T, V) for every position."""
        self.cache.begin_prefill(slot, len(window))
        x = self.model.trunk(torch.tensor([window], device=self.model.device), self.cache)[0]  # (T, C)
        return self.model.unembed(x if every_position else x[-1])


@dataclass
class FixedStep:
    """One batch-size bucket's decoding step: the device tensors it reads and writes, and its graph."""

    tokens: torch.Tensor  # (B,) each row's newest token
    positions: torch.Tensor  # (B, 1) where each row's token goes
    logits: torch.Tensor | None = None  # (B, V) what the step computed
    graph: torch.cuda.CUDAGraph | None = None


class CUDAGraphWarning(GPT2Warning, RuntimeWarning):
    """Capturing decoding as CUDA graphs failed: decoding goes on without them."""


class DecodeGraphs:
    """Decoding steps replayed as CUDA graphs: a step's few hundred kernel launches, recorded
    once per batch-size bucket, cost one launch from Python (issue 12: at batch 1 on an H100,
    launches, not memory, set the speed).

    A graph replays fixed shapes over fixed memory, so a step reads its tokens and positions
    from device tensors filled before each replay, writes each row's key and value at its own
    position, and attends over the whole preallocated cache through a mask built from those
    positions (`KVCache.begin_fixed_decode`). B rows run in the bucket of the next power of
    two (at most the cache's slots); padding rows decode token 0 into position 0 of slots past
    B, which the decoder keeps free. A bucket is captured at its first step, after two warm-up
    runs of that very step (writing the same keys and values again changes nothing); where
    capture fails, decoding goes on without graphs, with a warning. Off the GPU the same
    fixed steps run without capture: slower than plain decoding, a check of this path.
    """

    def __init__(self, model: GPT2, cache: KVCache):
        self.model, self.cache = model, cache
        self.capture = cache.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None  # one memory pool for every bucket
        self.steps: dict[int, FixedStep] = {}

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits (B, V) after each row's newest token, at its position."""
        B, slots = len(tokens), len(self.cache.lengths)
        size = min(1 << (B - 1).bit_length(), slots)
        step = self.steps.get(size)
        if step is None:
            device = self.cache.device
            step = self.steps[size] = FixedStep(torch.zeros(size, dtype=torch.long, device=device),
                                                torch.zeros(size, 1, dtype=torch.long, device=device))  # fmt: skip
        padding = [0] * (size - B)
        step.tokens.copy_(torch.tensor(tokens + padding))
        step.positions.copy_(torch.tensor(positions + padding)[:, None])
        if step.graph is None and self.capture:
            self._capture(step)
        if step.graph is not None:
            step.graph.replay()
        else:
            step.logits = self._run(step)
        return step.logits[:B].clone()  # the graph's output is overwritten by the next replay

    def _run(self, step: FixedStep) -> torch.Tensor:
        self.cache.begin_fixed_decode(step.positions)
        return self.model.unembed(self.model.trunk(step.tokens[:, None], self.cache)[:, -1])  # (B, V)

    def _capture(self, step: FixedStep) -> None:
        try:
            side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graphs asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(step)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                step.logits = self._run(step)
            step.graph = graph
        except RuntimeError as e:
            warnings.warn(f"CUDA graph capture failed, decoding without graphs: {e}", CUDAGraphWarning, stacklevel=2)
            self.capture = False

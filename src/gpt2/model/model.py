"""The GPT-2 model in PyTorch, following the seeds' forward pass.

    x = wte[idx] + wpe[pos]                      # (B, T, C) token + position embeddings
    for each of n_layer blocks:
        x = x + attn(ln_1(x))                    # causal multi-head self-attention
        x = x + mlp(ln_2(x))                     # C -> 4C -> GELU -> C
    logits = ln_f(x) @ wte.T                     # (B, T, V), unembedding tied to wte

B is the batch size, T the sequence length, C = n_embd, V = n_vocab, H = n_head.
Parameter names match OpenAI's and Hugging Face's, so checkpoints map name for name.

The kernels: every matmul is `gpt2.generation.kernels.linear` (our decode kernel for a few rows on the CPU,
narrow and int8 weights read as stored; torch's matmul otherwise): in `Dense`, in `MLP` (c_fc
and GELU in one pass) and in the unembedding. Attention is `CausalSelfAttention.attend`: our
one-query kernel while decoding on the CPU, PyTorch's fused attention, or the softmax written
out. The rest lives beside the model: its files in `gpt2.model.pretrained`; the KV cache, the engines
and generation in `gpt2.generation.engines`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from gpt2._checks import check_token_ids
from gpt2.checkpoints.config import GPT2Config, sinusoidal_positions
from gpt2.errors import ContextLengthError, InputTypeError, InvalidArgumentError
from gpt2.generation.caches import PrefixCache
from gpt2.generation.engines import (
    TorchEngine,
    check_cuda_graphs,
    cuda_graphs,
    generate_ids,
    model_engine,
    set_cuda_graphs,
)
from gpt2.generation.kernels import attend, linear, tracing, widen
from gpt2.model.pretrained import hf_state_dict, open_pretrained, save_pretrained
from gpt2.settings import DRAFT_TOKENS


class Cache(Protocol):
    """What the forward pass asks of a KV cache (`gpt2.generation.caches.KVCache` is one), for the step
    it has begun: the new positions, which keys each query sees, and a place for the new keys."""

    positions: torch.Tensor  # (T,) or (B, 1): the new positions' ids
    mask: torch.Tensor | None  # True where a query sees a key, broadcastable to (B, H, T, S); None: causal
    key_counts: torch.Tensor | None  # (B,): the keys each row sees, where the mask is by length

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the new positions' keys and values (B, H, T, C/H); return those to attend to (B, H, S, C/H)."""
        ...


class SinusoidalPositions(nn.Module):
    """A fixed position table with an Embedding's interface; not a parameter, not saved."""

    def __init__(self, n_ctx: int, n_embd: int):
        super().__init__()
        self.register_buffer("weight", torch.from_numpy(sinusoidal_positions(n_ctx, n_embd)), persistent=False)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        return self.weight[pos]


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

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        q, k, v = self.heads(self.c_attn(x))  # 3 x (B, H, T, C/H)
        mask = counts = None  # None: plain causal attention over exactly these T positions
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, S, C/H): the past and these T positions
            mask, counts = cache.mask, cache.key_counts  # counts: the keys each row sees, where lengths differ
        y = self.attend(q, k, v, mask, counts)  # (B, H, T, C/H)
        return self.resid_dropout(self.c_proj(merge_heads(y)))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, counts: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + mask) v, by the kernel that serves here: q (B, H, T, d), k and v (B, H, S, d)."""
        if tracing():  # a tracer records plain ops: the softmax written out, no kernel, no size read as a bool
            return attention(q, k, v, mask, self.attn_dropout)
        T = q.size(2)
        y = None
        one_query = T == 1 and (mask is None or counts is not None) and q.device.type == "cpu"
        if self.use_sdpa and one_query and not (self.training and self.dropout):
            y = attend(q, k, v, counts)  # decoding: our kernel, ~2x torch's attention here (None where it can't serve)
        if y is None and self.use_sdpa:
            dropout = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None and T > 1
            )
        elif y is None:
            y = attention(q, k, v, mask, self.attn_dropout)
        return y

    def heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """c_attn's output (B, T, 3C) -> q, k, v, each (B, H, T, C/H): each head attends over its
        own slice of the channels."""
        B, T, C3 = qkv.shape
        q, k, v = qkv.split(C3 // 3, dim=2)  # 3 x (B, T, C)
        shape = (B, T, self.n_head, C3 // (3 * self.n_head))
        return q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, H, T, C/H) -> (B, T, C): the heads' outputs side by side again."""
    B, H, T, d = y.shape
    return y.transpose(1, 2).contiguous().view(B, T, H * d)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, written out. q: (B, H, T, d); k, v: (B, H, S, d).

    mask: True where a query may see a key, broadcastable to (B, H, T, S); None is causal.
    """
    weights = torch.softmax(attention_scores(q, k, mask), dim=-1)  # (B, H, T, S): each row sums to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v  # (B, H, T, d)


def attention_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """q k^T / sqrt(d), -inf where a query may not see a key: (B, H, T, S), the softmax's input."""
    T, S = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    return scores.masked_fill(~mask, float("-inf"))


def softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Probabilities from logits, along `dim` (the seeds' last step), computed in float32.

    Subtracting the row's max before exp (done inside torch.softmax) avoids overflow.
    """
    return torch.softmax(logits.float(), dim=dim)


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
        h = linear(
            x, self.c_fc.weight, self.c_fc.bias, gelu=self.approximate, scale=self.c_fc.scale
        )  # c_fc, GELU: one pass
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """One transformer block, pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        x = x + self.mlp(self.ln_2(x))
        return x


def embedding(n: int, n_embd: int, init: bool) -> nn.Embedding:
    """An (n, n_embd) table; uninitialised unless `init` (its weights come from a checkpoint)."""
    return nn.Embedding(n, n_embd) if init else nn.Embedding(n, n_embd, _weight=torch.empty(n, n_embd))


def check_idx(idx: torch.Tensor) -> None:
    """The model's input: an integer tensor of token ids (B, T)."""
    if not isinstance(idx, torch.Tensor) or idx.dtype.is_floating_point or idx.dtype == torch.bool:
        what = f"a {idx.dtype} tensor" if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise InputTypeError(f"idx must be an integer tensor of token ids shaped (B, T), got {what}")
    if idx.dim() != 2:
        raise InvalidArgumentError(f"idx must have shape (B, T), got {list(idx.shape)}; for one sequence use idx[None]")


class GPT2(nn.Module):
    """GPT-2: `model(idx)` gives logits (B, T, n_vocab); `model(idx, targets)` gives (logits, loss)."""

    def __init__(self, config: GPT2Config):
        if not isinstance(config, GPT2Config):
            hint = (
                f"; to load weights, use GPT2.from_pretrained({config!r})"
                if isinstance(config, (str, os.PathLike))
                else ""
            )
            raise InputTypeError(f"GPT2() takes a GPT2Config, got {type(config).__name__}{hint}")
        super().__init__()
        self.config = config
        self.checkpoint_activations = False  # trade compute for memory in training (see trunk)
        self.tokenizer = None  # from_pretrained sets the tokenizer saved with the weights
        self.steering: dict[int, torch.Tensor] = {}  # block -> (C,) added to its output at every position (`steered`)
        learned = config.positions == "learned"
        # Built on the meta device (from_pretrained), the weights are left uninitialised: torch
        # initialises a meta tensor through its Python reference ops, importing torch._dynamo (1.4 s).
        init = torch.get_default_device().type != "meta"
        self.transformer = nn.ModuleDict(
            dict(
                wte=embedding(config.n_vocab, config.n_embd, init),
                wpe=embedding(config.n_ctx, config.n_embd, init)
                if learned
                else SinusoidalPositions(config.n_ctx, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias),
            )
        )
        self.transformer.wte.register_buffer("scale", None, persistent=False)  # (V,) for int8 weights
        if init:
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
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, ignore_index: int = -100, check_ids: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx: (B, T) token ids. targets: (B, T) ids of the next tokens, `ignore_index` where none.

        Returns logits (B, T, n_vocab) or, with targets, (logits, the mean cross-entropy of the
        targets that are not `ignore_index`: 0, not NaN, where all are, so that a batch of
        conversations that holds no reply adds nothing to a step).
        The ids are checked against the vocabulary unless `check_ids` is False: the trainer's
        batches were checked where they were made, and reading idx.min() inside a compiled
        step would break its graph (so a compiled call never reads them either). Every argument
        may be given by position, as torch.onnx.export's TorchScript exporter passes them; under
        any tracer the pass takes plain torch ops (`kernels.tracing`), which is what it records.
        """
        self._check_input(idx, check_ids and not torch.compiler.is_compiling())
        logits = self.unembed(self.trunk(idx))  # (B, T, V)
        if targets is None:
            return logits
        if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
            shape = list(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
            raise InvalidArgumentError(f"targets must be a tensor shaped like idx {list(idx.shape)}, got {shape}")
        targets = targets.reshape(-1).to(logits.device)
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), targets, ignore_index=ignore_index, reduction="sum"
        )
        return logits, loss / (targets != ignore_index).sum().clamp(min=1)

    def trunk(self, idx: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
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
            if self.steering and layer in self.steering:
                x = x + self.steering[layer]  # a steering vector: the stream leaving the block, moved
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
        draft: GPT2 | None = None,
        draft_tokens: int = DRAFT_TOKENS,
    ) -> torch.Tensor:
        """Continue each sequence of idx (B, T) by max_new_tokens tokens: returns (B, T + new).

        temperature 0 is greedy; top_k and top_p filter before sampling; a seed makes sampling
        reproducible (row b samples from seed + b, so a row's tokens do not depend on the rows
        beside it). With eos_token_id, a row that produced it is filled with it from then on,
        and generation stops early once every row has. Past n_ctx tokens the context slides
        (on_overflow="slide", with a warning) or raises (on_overflow="error"). Call model.eval()
        first, as with any inference: in training mode dropout stays on.

        With a `draft` model (a smaller one of the same tokenizer, on the same device), decoding
        is speculative: the draft proposes `draft_tokens` tokens, this model verifies them in one
        pass (`gpt2.generation.decoding.Decoder`). Greedy tokens are the same as without it; sampled ones
        follow this model's distribution, as without it, though not the same random draws.
        """
        check_idx(idx)
        return generate_ids(
            self,
            idx,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            eos_token_id=eos_token_id,
            use_cache=use_cache,
            on_overflow=on_overflow,
            draft=draft,
            draft_tokens=draft_tokens,
        )

    def _check_input(self, idx: torch.Tensor, check_ids: bool = True) -> None:
        check_idx(idx)
        B, T = idx.shape
        if B == 0 or T == 0:
            raise InvalidArgumentError(
                f"idx is empty (shape {list(idx.shape)}): give at least one token in each of at least one sequence"
            )
        self.config.check_length(T)
        if check_ids:  # reads two values back from the device
            check_token_ids(int(idx.min()), int(idx.max()), self.config.n_vocab, whose="this model's ")

    # ------------------------------------------------------------- utilities

    def num_parameters(self) -> int:
        """Number of parameters, each counted once (the tied wte/unembedding included once)."""
        return sum(p.numel() for p in self.parameters())

    def set_attention(self, implementation: str) -> GPT2:
        """ "sdpa" (PyTorch's fused attention) or "math" (the explicit masked softmax)."""
        if implementation not in ("sdpa", "math"):
            raise InvalidArgumentError(f"attention implementation must be 'sdpa' or 'math', got {implementation!r}")
        for block in self.transformer.h:
            block.attn.use_sdpa = implementation == "sdpa"
        return self

    @contextmanager
    def steered(self, vectors: Mapping[int, torch.Tensor] | None) -> Iterator[GPT2]:
        """Within the block, every pass of the model (generation's included) adds vectors[L] (C,) to
        the residual stream leaving block L, at every position: steering (activation addition; a
        feature's decoder row times a coefficient, `gpt2.inspect.steering_vector`). None or {}: none."""
        vectors = self.check_steering(vectors)
        before, self.steering = self.steering, vectors
        try:
            yield self
        finally:
            self.steering = before

    def check_steering(self, vectors: Mapping[int, torch.Tensor] | None) -> dict[int, torch.Tensor]:
        """Steering vectors checked: {block: (C,) finite tensor}, on the model's device and dtype."""
        if vectors is None:
            return {}
        if not isinstance(vectors, Mapping):
            raise InputTypeError(f"steer must be a mapping {{block: vector}}, got {type(vectors).__name__}", "steer")
        if vectors and cuda_graphs(self):
            raise InvalidArgumentError("steering is not captured in CUDA graphs: turn them off to steer", "steer")
        out = {}
        for layer, vector in vectors.items():
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.config.n_layer:
                raise InvalidArgumentError(
                    f"steer: block {layer!r} is not one of the model's 0..{self.config.n_layer - 1}", "steer"
                )
            if not isinstance(vector, torch.Tensor) or vector.shape != (self.config.n_embd,):
                shape = list(vector.shape) if isinstance(vector, torch.Tensor) else type(vector).__name__
                raise InvalidArgumentError(
                    f"steer: block {layer}'s vector must be a tensor of shape [{self.config.n_embd}] (n_embd), "
                    f"got {shape}",
                    "steer",
                )
            if not torch.isfinite(vector).all():
                raise InvalidArgumentError(f"steer: block {layer}'s vector holds a NaN or an infinity", "steer")
            out[layer] = vector.detach().to(self.device, self.compute_dtype)
        return out

    def use_cuda_graphs(self, enabled: bool = True) -> GPT2:
        """Decode by replaying CUDA graphs (`gpt2.generation.graphs.DecodeGraphs`): off by default, as it
        has not yet been measured on a GPU; on a CUDA device only."""
        if enabled:
            check_cuda_graphs(self.device)
        set_cuda_graphs(self, bool(enabled))
        return self

    def engine(
        self,
        slots: int,
        max_len: int,
        use_cache: bool = True,
        hint: str = "fewer rows at once",
        param: str | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> TorchEngine:
        """An engine to decode up to `slots` rows of up to max_len positions. With CUDA graphs,
        one engine over the whole context is kept and reused (replaced by a larger one when more
        slots are asked for), so each batch-size bucket is captured once, not at every call.
        A KV cache the device cannot hold is refused first, `hint` saying what to lower (`param`).
        With a `prefix_cache`, prompts' blocks are kept and reused (`gpt2.generation.caches.PrefixCache`)."""
        return model_engine(self, slots, max_len, use_cache, hint, param, prefix_cache)

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
        a Hugging Face directory, a directory of OpenAI's original TensorFlow release, or a
        GGUF file of llama.cpp's gpt2 architecture (f32, f16, q8_0: `checkpoints.gguf`).
        `dropout` replaces the checkpoint's (for fine-tuning; inference never drops).

        The model is built without memory for its weights (on the meta device), then each
        tensor read from the checkpoint becomes its parameter, one at a time, so loading needs
        little more memory than the model itself. Returns the model in eval mode, with
        `model.tokenizer` the tokenizer saved with the weights (GPT-2's where none is and the
        vocabulary is GPT-2's, else None).

        `dtype` is float32, bfloat16, float16, or int8 (the CPU only). On a GPU the whole model
        takes it; on the CPU, which has no fast 16-bit arithmetic, the lower ones are weight-only:
        the matrices (each layer's and wte) are stored narrow (`gpt2.generation.kernels.stored_matrix`), and
        everything else, activations included, stays float32 (`gpt2.devices.weight_format`).
        """
        pretrained = open_pretrained(name_or_path, device=device, dtype=dtype, dropout=dropout)
        with torch.device("meta"):
            model = cls(pretrained.config)
        for name, tensor, scale in pretrained.tensors():  # each tensor becomes its parameter, one at a time
            module_name, _, attr = name.rpartition(".")
            module = model.get_submodule(module_name)
            setattr(module, attr, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
            if scale is not None:  # int8: a float32 scale per output
                module.scale = scale
        if isinstance(model.transformer.wpe, SinusoidalPositions):  # a buffer no checkpoint holds
            table = torch.from_numpy(sinusoidal_positions(model.config.n_ctx, model.config.n_embd))
            model.transformer.wpe.weight = table.to(device=pretrained.device, dtype=pretrained.dtype)
        model.tokenizer = pretrained.tokenizer()
        return model.eval()

    def crop_context(self, n_ctx: int) -> GPT2:
        """Shrink the context to `n_ctx` positions (nanoGPT's crop_block_size): fine-tuning on
        shorter blocks keeps the first n_ctx rows of the position table."""
        if not 1 <= n_ctx <= self.config.n_ctx:
            raise ContextLengthError(
                f"block size {n_ctx} must be from 1 to the model's context of n_ctx={self.config.n_ctx}"
            )
        wpe = self.transformer.wpe
        if isinstance(wpe, SinusoidalPositions):
            wpe.weight = wpe.weight[:n_ctx]
        else:
            wpe.weight = nn.Parameter(wpe.weight.detach()[:n_ctx].clone())
            wpe.num_embeddings = n_ctx
        self.config = self.config.replace(n_ctx=n_ctx)
        return self

    def save_pretrained(
        self,
        directory: str | os.PathLike,
        tensors: dict[str, torch.Tensor] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Write `config.json` + `model.safetensors` in Hugging Face's GPT-2 layout, and the tokenizer.

        transformers loads the result: `AutoModelForCausalLM.from_pretrained(directory)` with nothing
        missing or newly initialised (a model without biases gets zero biases, one with sinusoidal
        positions the fixed table as wpe: what transformers' GPT-2 needs to compute the same), and
        `AutoTokenizer.from_pretrained(directory)` (see `Tokenizer.save_pretrained`). So does
        `GPT2.from_pretrained`. Each file is written to a temporary name and renamed into place.
        The tokenizer is `model.tokenizer`, or GPT-2's for a model of GPT-2's vocabulary that has
        none; its <|endoftext|> is config.json's eos id (none for a character vocabulary). `tensors`
        replaces the model's own weights: those of a model sharded over processes, gathered on one;
        `metadata` goes into the safetensors header beside its "format" (gpt2 train's: the iteration).
        """
        save_pretrained(directory, self.config, tensors or hf_state_dict(self), self.tokenizer, metadata)

"""Engines: what turns a model into next-token logits for the token loop (`decoding.Engine`).

    engine.extend(slots, starts, chunks) -> [(V,)]   chunks of prompts into slots of the KV cache, together
    engine.decode(tokens (B,))    ->  (B, V)         one token more in each of slots 0..B-1
    engine.move(src, dst)                            a row moving to a slot freed below it
    engine.reuse(slot, tokens), remember(...)        a prompt's blocks kept and reused (`PrefixCache`)

`TorchEngine` runs the torch model over its `KVCache` (with `DecodeGraphs`, its decoding
steps replayed as CUDA graphs); `NumpyEngine` runs the NumPy reference engine, recomputing
every context (slow; it checks the other). An engine drives a model through its methods
(`trunk`, `unembed`, `config`, `device`, `compute_dtype`: the `Model` protocol of `caches`) and
never imports it, as transformers' cache and generation modules do not import its modeling;
the model's own doors (`GPT2.engine`, `GPT2.use_cuda_graphs`, `GPT2.generate`) call in here
(`model_engine`, `set_cuda_graphs`, `generate_ids`). Which models decode with CUDA graphs, and
the engine each keeps across calls, is held here, not on the model. The rules of which engine
runs where (`check_cuda_graphs`, `check_numpy_engine`, and `check_draft` for a draft model's
engine beside the model's) live here too, for the library and the command line alike.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gpt2.checkpoints.config import GPT2Config
from gpt2.devices import resolve_device
from gpt2.errors import InvalidArgumentError
from gpt2.generation.caches import Block, KVCache, Model, PrefixCache
from gpt2.generation.decoding import Request, check_draft_tokens, run
from gpt2.generation.graphs import DecodeGraphs
from gpt2.generation.sampling import Sampling
from gpt2.reference import ReferenceModel
from gpt2.tokenizer import same_vocabulary


class TorchEngine:
    """Next-token logits from the torch model for `slots` rows (a `gpt2.generation.decoding.Engine`),
    each in a slot of the KV cache of up to `max_len` positions (default n_ctx).

    Past max_len the context slides, as nanoGPT crops: a full slot is refilled with its last
    max_len - 1 tokens before the new one (so give max_len = n_ctx where that can happen).
    Without `use_cache`, every step recomputes each row's whole context (a check of the cache).
    With a `prefix_cache`, prompts' blocks are kept and reused (`reuse`, `remember`): each
    slot's final hidden states are kept too, for the log-probabilities of a reused prompt.
    """

    def __init__(
        self,
        model: Model,
        slots: int,
        max_len: int | None = None,
        use_cache: bool = True,
        graphs: bool | None = None,
        prefix_cache: PrefixCache | None = None,
    ):
        self.model, self.slots = model, slots
        self.cache = KVCache.for_model(model, slots, max_len)
        self.max_len = self.cache.max_len
        self.use_cache = use_cache
        self.history: list[list[int]] = [[] for _ in range(slots)]  # each slot's tokens: to slide, or recompute
        # fixed-shape steps, replayed as CUDA graphs on a GPU (graphs=None: as set_cuda_graphs set)
        graphs = cuda_graphs(model) if graphs is None else graphs
        self.graphs = DecodeGraphs(model, self.cache) if graphs and use_cache else None
        self.prefix_cache = prefix_cache if use_cache else None
        self.states = None  # (slots, max_len, C): each slot's final hidden states, where prompts' blocks are kept
        if self.prefix_cache is not None:
            self.states = torch.zeros(
                slots, self.max_len, model.config.n_embd, device=model.device, dtype=model.compute_dtype
            )

    def prefill(self, slot: int, tokens: Sequence[int], every_position: bool = False) -> torch.Tensor:
        """Logits after `tokens`, which fill `slot` (the last max_len of them): (V,), or (T, V)."""
        return self.extend([slot], [0], [list(tokens)[-self.max_len :]], [every_position])[0]

    def extend(
        self,
        slots: Sequence[int],
        starts: Sequence[int],
        chunks: Sequence[Sequence[int]],
        every_position: Sequence[bool] | None = None,
    ) -> list[torch.Tensor]:
        """Logits after each chunk of tokens, which continues slot slots[b] from position
        starts[b] (what the slot held from there on is dropped): (V,) for each chunk, or
        (T_b, V) for its every position where every_position[b]. The chunks run as few padded
        batches as keep the padding small (`padded_groups`)."""
        every = list(every_position or [False] * len(slots))
        if not self.use_cache:  # each slot's whole window recomputed; its chunk's positions kept
            for slot, start, chunk in zip(slots, starts, chunks):
                self.history[slot] = self.history[slot][:start] + list(chunk)
            full = [self._fill(slot, self.history[slot][-self.max_len :], True) for slot in slots]
            return [f[-len(c) :] if e else f[-1] for f, c, e in zip(full, chunks, every)]
        hidden = self.hidden(slots, starts, chunks)
        # every chunk's positions in one matmul: the unembedding read once, not once a chunk
        states = [h if e else h[-1:] for h, e in zip(hidden, every)]  # each chunk's last, or all its positions
        out = self.model.unembed(torch.cat(states)).split([len(h) for h in states])
        return [o if e else o[0] for o, e in zip(out, every)]

    def hidden(
        self, slots: Sequence[int], starts: Sequence[int], chunks: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """The final hidden states (T_b, C) of each chunk, which continues slot slots[b] from
        position starts[b], as `extend` computes them (for a caller that unembeds them itself)."""
        hidden: list[torch.Tensor | None] = [None] * len(slots)
        for slot, start, chunk in zip(slots, starts, chunks):
            self.history[slot] = self.history[slot][:start] + list(chunk)
        for group in padded_groups([len(c) for c in chunks]):
            states = self._hidden([slots[b] for b in group], [starts[b] for b in group], [chunks[b] for b in group])
            for b, h in zip(group, states):
                hidden[b] = h
        return hidden

    @property
    def block_size(self) -> int | None:
        return None if self.prefix_cache is None else self.prefix_cache.block_size

    def reuse(self, slot: int, tokens: Sequence[int]) -> int:
        """Fill `slot` with the kept blocks that begin `tokens` (at most all of them but the last
        token); returns the positions filled (0 without a prefix cache)."""
        blocks = [] if self.prefix_cache is None else self.prefix_cache.match(tokens)
        n = len(blocks) * (self.prefix_cache.block_size if blocks else 0)
        size = self.block_size
        for i, block in enumerate(blocks):  # copied in place: no gathered copy of them all
            for layer, (k, v) in enumerate(zip(self.cache.k, self.cache.v)):
                k[slot, :, i * size : (i + 1) * size].copy_(block.k[layer])
                v[slot, :, i * size : (i + 1) * size].copy_(block.v[layer])
            self.states[slot, i * size : (i + 1) * size].copy_(block.hidden)
        self.cache.lengths[slot], self.history[slot] = n, list(tokens[:n])
        return n

    def remember(self, slot: int, tokens: Sequence[int]) -> None:
        """Keep the blocks of `tokens`, the first positions of `slot`, for later prompts (with a prefix cache)."""
        if self.prefix_cache is None:
            return

        def write(i: int, j: int, block: Block) -> None:
            for layer, (k, v) in enumerate(zip(self.cache.k, self.cache.v)):
                block.k[layer].copy_(k[slot, :, i:j])
                block.v[layer].copy_(v[slot, :, i:j])
            block.hidden.copy_(self.states[slot, i:j])

        self.prefix_cache.add(tokens, write)

    def cached_logits(self, slot: int, n: int) -> torch.Tensor:
        """The logits (n, V) of the first n positions of `slot`, from their kept hidden states."""
        return self.model.unembed(self.states[slot, :n])

    def _hidden(self, slots: list[int], starts: list[int], chunks: list[Sequence[int]]) -> list[torch.Tensor]:
        """The final hidden states (T_b, C) of each chunk, run as one batch padded to the longest."""
        T = max(map(len, chunks))
        idx = torch.tensor([list(chunk) + [0] * (T - len(chunk)) for chunk in chunks])  # (B, T), one tensor made, not B
        if len(slots) == 1 and starts[0] == 0:  # a whole prompt alone: plain causal attention over it
            self.cache.begin_prefill(slots[0], T)
        else:
            self.cache.begin_extend(slots, starts, [len(c) for c in chunks])
        x = self.model.trunk(idx.to(self.model.device), self.cache)  # (B, T, C)
        if self.states is not None:
            for slot, start, chunk, h in zip(slots, starts, chunks, x):
                self.states[slot, start : start + len(chunk)] = h[: len(chunk)]
        return [x[b, : len(chunk)] for b, chunk in enumerate(chunks)]

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
        if self.states is not None:
            self.states[dst, : self.cache.lengths[dst]] = self.states[src, : self.cache.lengths[dst]]

    def _fill(self, slot: int, window: list[int], every_position: bool = False) -> torch.Tensor:
        """Logits after `window`, which fills the slot: (V,), or (T, V) for every position."""
        self.cache.begin_prefill(slot, len(window))
        x = self.model.trunk(torch.tensor([window], device=self.model.device), self.cache)[0]  # (T, C)
        return self.model.unembed(x if every_position else x[-1])


PADDING_SLACK = 1.25  # a batch of chunks may compute up to this many times their tokens, padding included


def padded_groups(counts: Sequence[int]) -> list[list[int]]:
    """Chunks of `counts` tokens grouped into batches, longest first, each padded to its longest:
    a chunk joins the batch while the padded batch stays within PADDING_SLACK of its real tokens
    (8 prompts of 16 tokens run as one batch; one of 400 and one of 16 as two)."""
    groups: list[list[int]] = []
    real = 0
    for b in sorted(range(len(counts)), key=lambda b: -counts[b]):
        if groups and counts[groups[-1][0]] * (len(groups[-1]) + 1) <= PADDING_SLACK * (real + counts[b]):
            groups[-1].append(b)
            real += counts[b]
        else:
            groups.append([b])
            real = counts[b]
    return groups


# The models that decode by replaying CUDA graphs (`set_cuda_graphs`), each with the engine kept
# across its calls (None before the first): held here, not on the model. Keyed weakly, and a kept
# engine reaches its model through a weak proxy, so that a model dropped is freed with its
# engine's cache and graphs (a strong reference from the value would keep its key alive forever).
_GRAPHED: weakref.WeakKeyDictionary[Model, TorchEngine | None] = weakref.WeakKeyDictionary()


def set_cuda_graphs(model: Model, enabled: bool = True) -> None:
    """Decode `model` by replaying CUDA graphs from now on, or no longer (`GPT2.use_cuda_graphs`);
    the engine kept for it, with its cache and graphs, is dropped either way. The device rule is
    the caller's to check first (`check_cuda_graphs`): off the GPU the fixed steps run uncaptured."""
    _GRAPHED.pop(model, None)
    if enabled:
        _GRAPHED[model] = None


def cuda_graphs(model: Model) -> bool:
    """Whether `model` decodes by replaying CUDA graphs (`set_cuda_graphs`; off by default)."""
    return model in _GRAPHED


def kept_engine(model: Model) -> TorchEngine | None:
    """The engine kept across `model`'s calls while it decodes with CUDA graphs (`model_engine`)."""
    return _GRAPHED.get(model)


def model_engine(
    model: Model,
    slots: int,
    max_len: int,
    use_cache: bool = True,
    hint: str = "fewer rows at once",
    param: str | None = None,
    prefix_cache: PrefixCache | None = None,
) -> TorchEngine:
    """An engine to decode up to `slots` rows of up to max_len positions with `model` (`GPT2.engine`).

    With CUDA graphs, one engine over the whole context is kept for the model (`kept_engine`) and
    reused (replaced by a larger one when more slots are asked for), so each batch-size bucket
    is captured once, not at every call. A KV cache the device cannot hold is refused first,
    `hint` saying what to lower (the parameter `param`)."""
    graphed = cuda_graphs(model) and use_cache
    kept = kept_engine(model)
    if graphed and kept is not None and kept.slots >= slots and kept.prefix_cache is prefix_cache:
        return kept  # its cache is held already: nothing new to fit
    if graphed:
        _GRAPHED[model] = None  # its cache and graphs freed before the new ones are made
    n_ctx = model.config.n_ctx
    KVCache.check_fits(
        model.config, slots, n_ctx if graphed else min(max_len, n_ctx), model.device, model.compute_dtype, hint, param
    )
    if not graphed:
        return TorchEngine(model, slots, max_len, use_cache, prefix_cache=prefix_cache)
    engine = _GRAPHED[model] = TorchEngine(weakref.proxy(model), slots, graphs=True, prefix_cache=prefix_cache)
    return engine


def generate_ids(
    model: Model,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    *,
    eos_token_id: int | None,
    use_cache: bool,
    on_overflow: str,
    draft: Model | None,
    draft_tokens: int,
) -> torch.Tensor:
    """`GPT2.generate`, whose arguments these are: each row of idx (B, T), an integer tensor of
    token ids (the model checks it), continued by max_new_tokens tokens in the model's engine,
    speculatively with a `draft` model's beside it. Returns (B, T + new): a row that ended
    early is filled with eos_token_id from then on."""
    request = Request.build(
        idx.tolist(),
        max_new_tokens,
        n_vocab=model.config.n_vocab,
        n_ctx=model.config.n_ctx,
        sampling=Sampling(temperature, top_k, top_p),
        seed=seed,
        eos_token_id=eos_token_id,
        on_overflow=on_overflow,
    )
    if draft is not None:
        check_draft(model, draft)
    check_draft_tokens(draft_tokens)
    B, T = idx.shape
    rows = request.rows()

    def engine(m: Model) -> TorchEngine:
        return model_engine(m, B, T + max_new_tokens, use_cache, hint="fewer rows in idx at once", param="idx")

    run(engine(model), rows, None if draft is None else engine(draft), draft_tokens)
    steps = max(len(row.tokens) for row in rows)  # all rows stop once every one has ended
    new = [row.tokens + [eos_token_id] * (steps - len(row.tokens)) for row in rows]  # an ended row: eos from then on
    return torch.cat([idx, torch.tensor(new, dtype=idx.dtype).view(B, steps).to(idx.device)], dim=1)


class NumpyEngine:
    """Next-token logits from the NumPy reference engine (a `gpt2.generation.decoding.Engine`): every
    step recomputes the whole context of each row. Slow; it exists to check the torch engine."""

    def __init__(self, reference: ReferenceModel, slots: int):
        self.reference, self.slots = reference, slots
        self.max_len = reference.config.n_ctx
        self.history: list[list[int]] = [[] for _ in range(slots)]

    def prefill(self, slot: int, tokens: Sequence[int], every_position: bool = False) -> torch.Tensor:
        return self.extend([slot], [0], [list(tokens)[-self.max_len :]], [every_position])[0]

    def extend(
        self,
        slots: Sequence[int],
        starts: Sequence[int],
        chunks: Sequence[Sequence[int]],
        every_position: Sequence[bool] | None = None,
    ) -> list[torch.Tensor]:
        every, out = every_position or [False] * len(slots), []
        for slot, start, chunk, e in zip(slots, starts, chunks, every):
            self.history[slot] = self.history[slot][:start] + list(chunk)
            logits = self.reference(self.history[slot][-self.max_len :])  # (T, V): the whole window again
            out.append(torch.from_numpy(logits[-len(chunk) :] if e else logits[-1]))
        return out

    block_size = None  # no prefix cache: every prompt is computed whole

    def reuse(self, slot: int, tokens: Sequence[int]) -> int:
        return 0

    def remember(self, slot: int, tokens: Sequence[int]) -> None:
        pass

    def cached_logits(self, slot: int, n: int) -> torch.Tensor:
        raise NotImplementedError("the NumPy engine keeps no blocks (reuse always gives 0)")

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        for b, token in enumerate(tokens.tolist()):
            self.history[b].append(token)
        return torch.from_numpy(
            np.stack([self.reference(self.history[b][-self.max_len :])[-1] for b in range(tokens.size(0))])
        )

    def move(self, src: int, dst: int) -> None:
        self.history[dst] = list(self.history[src])


def check_cuda_graphs(device: str | torch.device, engine: str = "torch", name: Callable[[str], str] = str) -> None:
    """The CUDA-graph rule: the torch engine replays decoding as CUDA graphs on a CUDA GPU only.

    `device` is the model's, or a device as asked for ("auto", "cpu", ...), which is resolved.
    `name` gives each setting (cuda_graphs, engine, device) as the caller's user knows it: the
    command line passes its flags."""
    if engine != "torch":
        raise InvalidArgumentError(
            f"{name('cuda_graphs')} is for {name('engine')} torch on a CUDA GPU, not {name('engine')} {engine}"
        )
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        asked = f"{name('device')} is" if isinstance(device, torch.device) else f"{name('device')} {device} is"
        raise InvalidArgumentError(f"{name('cuda_graphs')} replays decoding on a CUDA GPU; {asked} {resolved}")


def check_numpy_engine(device: str | torch.device, dtype: str | torch.dtype, name: Callable[[str], str] = str) -> None:
    """The NumPy-engine rule: the reference engine computes in float32 on the CPU ("auto" is
    the CPU for it). `name` as for `check_cuda_graphs`."""
    if str(device) not in ("auto", "cpu"):
        raise InvalidArgumentError(
            f"{name('engine')} numpy runs on the CPU only, not on {name('device')} {device}: use {name('engine')} torch"
        )
    if dtype not in ("float32", torch.float32):
        dtype = str(dtype).removeprefix("torch.")
        raise InvalidArgumentError(
            f"{name('engine')} numpy computes in float32 only, not {name('dtype')} {dtype}: use {name('engine')} torch"
        )


def check_draft_config(config: GPT2Config, draft_config: GPT2Config) -> None:
    """What a draft model's configuration must meet, before either is loaded: the model's n_vocab."""
    if draft_config.n_vocab != config.n_vocab:
        raise InvalidArgumentError(
            f"draft has a vocabulary of {draft_config.n_vocab:,} tokens, the model {config.n_vocab:,}: "
            "a draft model must share the model's tokenizer",
            "draft",
        )


def check_draft(
    model: Model | ReferenceModel,
    draft: Model | ReferenceModel,
    tokenizer: object = None,
    draft_tokenizer: object = None,
) -> None:
    """The speculative-decoding rule: a draft model proposes the model's own tokens, so it has the
    model's vocabulary (its n_vocab, and its tokenizer where both are known: by default each
    model's `tokenizer`), and it runs on the model's device (a NumPy model: the CPU)."""
    check_draft_config(model.config, draft.config)
    n_vocab = model.config.n_vocab
    tokenizer = getattr(model, "tokenizer", None) if tokenizer is None else tokenizer
    draft_tokenizer = getattr(draft, "tokenizer", None) if draft_tokenizer is None else draft_tokenizer
    if tokenizer is not None and draft_tokenizer is not None and not same_vocabulary(tokenizer, draft_tokenizer):
        raise InvalidArgumentError(
            f"draft has another tokenizer than the model's (of {n_vocab:,} tokens too, but other "
            "tokens or merges): a draft model must share the model's tokenizer",
            "draft",
        )
    device, draft_device = (getattr(m, "device", torch.device("cpu")) for m in (model, draft))
    if draft_device != device:
        raise InvalidArgumentError(
            f"draft is on {draft_device}, the model on {device}: load both on one device", "draft"
        )

"""Engines: what turns a model into next-token logits for the token loop (`decoding.Engine`).

    engine.extend(slots, starts, chunks) -> [(V,)]   chunks of prompts into slots of the KV cache, together
    engine.decode(tokens (B,))    ->  (B, V)         one token more in each of slots 0..B-1
    engine.move(src, dst)                            a row moving to a slot freed below it
    engine.reuse(slot, tokens), remember(...)        a prompt's blocks kept and reused (`PrefixCache`)

`TorchEngine` runs the torch model over its `KVCache` (with `DecodeGraphs`, its decoding
steps replayed as CUDA graphs); `NumpyEngine` runs the NumPy reference engine, recomputing
every context (slow; it checks the other). An engine drives a model through its methods
(`trunk`, `unembed`, `config`, `device`, `compute_dtype`: the `Model` protocol below) and
never imports it, as transformers' cache and generation modules do not import its modeling;
the model's own doors (`GPT2.engine`, `GPT2.use_cuda_graphs`, `GPT2.generate`) call in here
(`model_engine`, `set_cuda_graphs`, `generate_ids`). Which models decode with CUDA graphs, and
the engine each keeps across calls, is held here, not on the model. The rules of which engine
runs where (`check_cuda_graphs`, `check_numpy_engine`, and `check_draft` for a draft model's
engine beside the model's) live here too, for the library and the command line alike.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from gpt2._checks import is_integer
from gpt2.checkpoints.config import GPT2Config
from gpt2.devices import check_fits, resolve_device
from gpt2.errors import ContextLengthError, GPT2Warning, InvalidArgumentError
from gpt2.generation.decoding import Request, check_draft_tokens, run
from gpt2.generation.sampling import Sampling
from gpt2.reference import ReferenceModel
from gpt2.tokenizer import same_vocabulary


class Model(Protocol):
    """What an engine asks of a torch model (`gpt2.model.model.GPT2` is one)."""

    config: GPT2Config

    @property
    def device(self) -> torch.device: ...

    @property
    def compute_dtype(self) -> torch.dtype: ...

    def trunk(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """idx (B, T) -> final hidden states (B, T, C), the positions and keys from `cache`."""
        ...

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., C) -> logits (..., V)."""
        ...


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
        self._extend: tuple | None = None  # the slots an extending step reads, and where it writes (begin_extend)
        self._seen = 0  # key positions a decoding step attends to: the longest row's, and the new one

    @classmethod
    def for_model(cls, model: Model, slots: int, max_len: int | None = None) -> KVCache:
        """An empty cache of `slots` sequences of up to `max_len` (default n_ctx) positions each,
        on the model's device, in its activations' dtype."""
        max_len = model.config.n_ctx if max_len is None else min(max_len, model.config.n_ctx)
        return cls(model.config, slots, max_len, model.device, model.compute_dtype)

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    @staticmethod
    def bytes_needed(config: GPT2Config, slots: int, max_len: int, dtype: torch.dtype) -> int:
        """The memory of a cache of `slots` rows of max_len positions (keys and values of every
        layer), with what a decoding step adds for each row (its logits, probabilities, a sort)."""
        return slots * (2 * config.n_layer * max_len * config.n_embd * dtype.itemsize + 3 * config.n_vocab * 4)

    @staticmethod
    def check_fits(
        config: GPT2Config,
        slots: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        hint: str,
        param: str | None = None,
    ) -> None:
        """Refuse, before any of it is allocated, a cache the device cannot hold (`devices.check_fits`;
        `hint` says which setting to lower, `param` names it)."""
        needed = KVCache.bytes_needed(config, slots, max_len, dtype)
        check_fits(needed, device, f"a KV cache of {slots:,} rows of {max_len:,} positions", hint, param)

    def begin_prefill(self, slot: int, T: int) -> None:
        """Prepare to fill `slot` with a prompt of T positions (what it held is dropped)."""
        if T > self.max_len:
            raise ContextLengthError(f"the KV cache holds {self.max_len} positions; a prompt of {T} does not fit")
        self._slot, self.lengths[slot], self._extend = slot, T, None
        self.positions, self.mask, self.key_counts = torch.arange(T, device=self.device), None, None

    def begin_extend(self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int]) -> None:
        """Prepare to add counts[b] positions to slot slots[b] from position starts[b] (what it
        held from there on is dropped), for B rows at once, padded to the longest: (B, T).

        Row b's t-th new position sees its slot's positions up to starts[b] + t: its cached
        past and its own earlier new positions. Padding positions (t >= counts[b]) are computed
        and thrown away: they write no keys."""
        if max(s + n for s, n in zip(starts, counts)) > self.max_len:
            raise ContextLengthError(
                f"the KV cache holds {self.max_len} positions; {max(s + n for s, n in zip(starts, counts))} do not fit"
            )
        for slot, start in zip(
            slots, starts
        ):  # a chunk continues what its slot holds: past it, it would see stale keys
            if start > self.lengths[slot]:
                raise InvalidArgumentError(
                    f"slot {slot} holds {self.lengths[slot]} positions: a chunk cannot start at {start}"
                )
        B, T, device = len(slots), max(counts), self.device
        for slot, start, n in zip(slots, starts, counts):
            self.lengths[slot] = start + n
        starts_t, counts_t = torch.tensor(starts, device=device), torch.tensor(counts, device=device)
        t = torch.arange(T, device=device)
        valid = t[None, :] < counts_t[:, None]  # (B, T)
        absolute = starts_t[:, None] + t[None, :]  # (B, T): each new position's place in its slot
        self.positions = torch.where(valid, absolute, 0)
        self._seen = max(s + n for s, n in zip(starts, counts))
        key = torch.arange(self._seen, device=device)
        sees = torch.where(valid, absolute, 0)[:, :, None]  # (B, T, 1): the last key each query sees
        self.mask, self.key_counts = (key[None, None, :] <= sees)[:, None], None  # (B, 1, T, S)
        if max(starts) == 0:  # fresh prompts: plain causal attention (padding sees padding, and is thrown away)
            self.mask = None
        b, t_new = valid.nonzero(as_tuple=True)
        slots_t = torch.tensor(slots, device=device)
        contiguous = list(slots) == list(range(slots[0], slots[0] + B))  # then a slice: a view, not a gathered copy
        self._slot = None
        self._extend = (
            slice(slots[0], slots[0] + B) if contiguous else slots_t,
            b,
            t_new,
            slots_t[b],
            absolute[b, t_new],
        )

    def advance(self, B: int) -> list[int]:
        """Count one position more in each of slots 0..B-1; returns the new positions (their lengths before)."""
        lengths = self.lengths[:B]
        if max(lengths) >= self.max_len:
            raise ContextLengthError(
                f"the KV cache holds {self.max_len} positions; slot {lengths.index(max(lengths))} is full"
            )
        for b in range(B):
            self.lengths[b] += 1
        return lengths

    def begin_decode(self, B: int) -> None:
        """Prepare to add one position to each of slots 0..B-1."""
        lengths = self.advance(B)
        self._slot = self._extend = None
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
        self._slot, self._extend, self.positions, self._seen = None, None, positions, self.max_len
        self._rows, self._columns = torch.arange(positions.size(0), device=self.device), positions[:, 0]
        key = torch.arange(self.max_len, device=self.device)
        self.mask, self.key_counts = (key[None, :] <= positions)[:, None, None, :], None  # (B, 1, 1, max_len)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys and values (B, H, T, C/H); return those to attend to."""
        keys, values = self.k[layer], self.v[layer]
        if self._extend is not None:  # rows of their own slots and lengths: (B, H, S, C/H) gathered
            slots, b, t, slot_of, column = self._extend
            keys[slot_of, :, column] = k.transpose(1, 2)[b, t]  # (N, H, C/H): each new position into its place
            values[slot_of, :, column] = v.transpose(1, 2)[b, t]
            return keys[slots, :, : self._seen], values[slots, :, : self._seen]
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


# ------------------------------------------------------------------ the prefix cache


@dataclass(eq=False)
class Block:
    """The keys, values and final hidden states of `block_size` positions of some prompt: views
    of a place in its cache's pool."""

    id: int
    k: torch.Tensor  # (n_layer, H, block_size, C/H)
    v: torch.Tensor
    hidden: torch.Tensor  # (block_size, C): the logits of these positions, for a prompt's log-probabilities


# the pool grows by slabs of this many bytes (or one block): a few large allocations, made once
SLAB_BYTES = 32 << 20


class PrefixCache:
    """The KV entries of prompts' blocks, kept after their requests end and reused by later
    prompts that begin the same way (vLLM's automatic prefix caching, llama.cpp's cache_prompt).

    A prompt is cut into blocks of `block_size` tokens; a block is keyed by its tokens and the
    block before it (so by every token up to its end, exactly: no hash to collide), and holds
    its positions' keys and values for every layer and their final hidden states. What a
    position holds depends only on the tokens up to it, so a later prompt sharing the first
    blocks copies them into its slot and computes only the rest. At most `max_bytes` are kept:
    past it, the least recently used blocks go first (a prompt's blocks are touched last to
    first, so a block outlives the blocks that continue it). `queries` and `hits` count
    prompt tokens looked up and found (vLLM's prefix_cache_queries and prefix_cache_hits).

    Blocks live in a pool of places, as vLLM's block pool: allocated in slabs as the cache
    fills, never freed, and an evicted block's place is the next block's. Blocks allocated and
    freed one by one fragmented the heap: a server's memory grew past the cache's bound
    (benchmarks/load.py). `reserved_bytes` is what the pool holds, `bytes` what its blocks use.
    """

    def __init__(
        self,
        config: GPT2Config,
        max_bytes: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        self.block_size, self.max_bytes = block_size, max_bytes
        self.block_bytes = block_size * config.n_embd * (2 * config.n_layer + 1) * dtype.itemsize
        self.capacity = max_bytes // self.block_bytes  # blocks
        self.blocks: OrderedDict[tuple[int, tuple[int, ...]], Block] = OrderedDict()  # least recently used first
        self.queries = self.hits = 0
        self._ids = itertools.count(1)  # 0 is the start of every prompt
        head = config.n_embd // config.n_head
        self._shapes = ((config.n_layer, config.n_head, block_size, head),) * 2 + ((block_size, config.n_embd),)
        self._dtype, self._device = dtype, device
        self._free: list[tuple[torch.Tensor, ...]] = []  # places of the pool no block holds: (k, v, hidden) views
        self._reserved = 0  # places allocated

    @property
    def bytes(self) -> int:
        return len(self.blocks) * self.block_bytes

    @property
    def reserved_bytes(self) -> int:
        return self._reserved * self.block_bytes

    def match(self, tokens: Sequence[int]) -> list[Block]:
        """The cached blocks that begin `tokens`, at most up to its last token but one (whose
        logits the caller computes), counted as a query; the blocks become the most recent."""
        found, parent, size = [], 0, self.block_size
        for i in range(0, len(tokens) - 1 - size + 1, size):
            block = self.blocks.get((parent, tuple(tokens[i : i + size])))
            if block is None:
                break
            found.append(block)
            parent = block.id
        keys = self._keys(tokens, len(found))
        for key in reversed(keys):  # the first block most recent: evicted after those that continue it
            self.blocks.move_to_end(key)
        self.queries += len(tokens)
        self.hits += len(found) * size
        return found

    def add(self, tokens: Sequence[int], write: Callable[[int, int, Block], None]) -> None:
        """Keep the blocks of `tokens` not kept yet; `write(start, stop, block)` copies the keys,
        values and hidden states of those positions into the block's place. Past the bound, the
        least recently used block's place is taken (never one of this prompt's: of a prompt of
        more blocks than the bound, the first ones are kept)."""
        parent, size, keys = 0, self.block_size, []
        if self.capacity == 0:
            return
        for i in range(
            0, min(len(tokens) // size, self.capacity) * size, size
        ):  # its first blocks, where all do not fit
            key = (parent, tuple(tokens[i : i + size]))
            block = self.blocks.get(key)
            if block is None:
                block = Block(next(self._ids), *self._place())
                write(i, i + size, block)
                self.blocks[key] = block
            self.blocks.move_to_end(key)  # this prompt's blocks go after the others
            keys.append(key)
            parent = block.id
        for key in reversed(keys):
            self.blocks.move_to_end(key)

    def _place(self) -> tuple[torch.Tensor, ...]:
        """A free place of the pool: a new slab's where none is free and the bound allows, else
        the least recently used block's."""
        if not self._free and self._reserved < self.capacity:
            n = min(max(1, SLAB_BYTES // self.block_bytes), self.capacity - self._reserved)
            slab = [torch.empty((n, *shape), dtype=self._dtype, device=self._device) for shape in self._shapes]
            self._free = [tuple(t[i] for t in slab) for i in reversed(range(n))]
            self._reserved += n
        if not self._free:
            evicted = self.blocks.popitem(last=False)[1]
            return evicted.k, evicted.v, evicted.hidden
        return self._free.pop()

    def _keys(self, tokens: Sequence[int], n: int) -> list[tuple[int, tuple[int, ...]]]:
        """The keys of the first n blocks of tokens (all of them cached)."""
        keys, parent, size = [], 0, self.block_size
        for i in range(n):
            key = (parent, tuple(tokens[i * size : (i + 1) * size]))
            keys.append(key)
            parent = self.blocks[key].id
        return keys


def check_prefix_cache_mb(mb: object) -> int:
    """The memory a prefix cache may take: a whole number of MB, 0 for none."""
    if not is_integer(mb) or mb < 0:
        raise InvalidArgumentError(
            f"prefix_cache_mb must be a whole number of MB, 0 for none, got {mb!r}", "prefix_cache_mb"
        )
    return int(mb)


# ------------------------------------------------------------------ the torch engine


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


# ------------------------------------------------------------------ a model's engine

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


# ------------------------------------------------------------------ CUDA graphs


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
    two (at most the cache's slots); padding rows decode token 0 into the first free position
    of the slots past B (where rows may be filling: what they hold stays). A bucket is captured at its
    first step, after two warm-up runs of that very step (writing the same keys and values again changes nothing); where
    capture fails, decoding goes on without graphs, with a warning. Off the GPU the same
    fixed steps run without capture: slower than plain decoding, a check of this path.
    """

    def __init__(self, model: Model, cache: KVCache):
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
            step = self.steps[size] = FixedStep(
                torch.zeros(size, dtype=torch.long, device=device),
                torch.zeros(size, 1, dtype=torch.long, device=device),
            )
        # padding rows write past what their slots hold (a row filling there keeps its keys)
        spare = [min(self.cache.lengths[b], self.cache.max_len - 1) for b in range(B, size)]
        step.tokens.copy_(torch.tensor(tokens + [0] * (size - B)))
        step.positions.copy_(torch.tensor(positions + spare)[:, None])
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


# ------------------------------------------------------------------ the NumPy engine


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


# ------------------------------------------------------------------ which engine runs where


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

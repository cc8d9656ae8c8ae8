"""What an engine keeps of the rows it runs: the `Model` an engine drives (the methods it calls), the `KVCache`
(each layer's keys and values in slots, one a row) and the `PrefixCache` (prompts' blocks of keys and values, kept and
reused by later prompts that start the same).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from gpt2._checks import is_integer
from gpt2.checkpoints.config import GPT2Config
from gpt2.devices import check_fits
from gpt2.errors import ContextLengthError, InvalidArgumentError


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

"""The worker processes of `Tokenizer.encode_batch`, and of `encode_stream`, which `prepare` encodes a
corpus larger than memory with.

encode_batch: a large batch is cut into runs of about equal length, one per process, this process
encoding the first run while the workers encode the others. The workers are kept for later
batches, so their piece caches stay warm.

encode_stream: a stream of shares (a MB of text each, say), each encoded by whichever worker is
free, up to two a worker in flight, while this process reads the next shares and writes the ids
of the last ones, handed back in order. No worker waits for another (no batch's slowest share
holds the rest), this process encodes nothing (it keeps the workers fed), and each share's ids
come back packed in one array, ready to write, never as lists of ints to pickle and unpack.

Encoding holds the GIL (Python, and the C kernel called from it), so threads would wait on each
other; processes do not. Workers are forked where the system can (they start with the tokenizer
and its warm cache, nothing pickled). This module knows no tokenizer: it is handed the function
that encodes one text.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import chain, islice
from typing import Any, TypeVar

Encode = Callable[[str, frozenset[str]], list[int]]  # (text, allowed special tokens) -> ids
K = TypeVar("K")  # what the caller keys a share with: handed back with its ids

# Below this many characters in total, encode_batch does not start worker processes.
_PARALLEL_MIN_CHARS = 1_000_000


def worth_workers(texts: list[str], num_workers: int) -> bool:
    """Whether `texts` are worth sharing among `num_workers` processes (else: encode them here)."""
    return min(num_workers, len(texts)) > 1 and sum(map(len, texts)) >= _PARALLEL_MIN_CHARS


class WorkerPool:
    """Worker processes kept for later batches, so their piece caches stay warm."""

    def __init__(self, encode: Encode):
        self._encode = encode
        self._executor: ProcessPoolExecutor | None = None
        self._size = 0

    def encode_batch(self, texts: list[str], allowed: frozenset[str], num_workers: int) -> list[list[int]]:
        """The ids of each text, in order, encoded by this process and `num_workers` - 1 workers."""
        shares = _split_by_length(texts, min(num_workers, len(texts)))
        executor = self._workers(len(shares) - 1)
        futures = [executor.submit(_encode_share, share, allowed) for share in shares[1:]]
        results = [self._encode(text, allowed) for text in shares[0]]  # this process works too
        for future in futures:
            results += _unpack_ids(*future.result())
        return results

    def _workers(self, size: int) -> ProcessPoolExecutor:
        if self._executor is None or self._size != size:
            self.close()
            self._executor = ProcessPoolExecutor(
                size, _context(), initializer=_init_worker, initargs=(self._encode, self)
            )
            self._size = size
        return self._executor

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop at exit)."""
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __getstate__(self) -> dict:
        return {"encode": self._encode}  # a copy starts with no workers: they belong to this process

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["encode"])


def _context() -> Any:
    # fork hands the workers the tokenizer (and its warm cache) without pickling it.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


_worker_encode: Encode | None = None


def _init_worker(encode: Encode, pool: WorkerPool) -> None:
    global _worker_encode
    _worker_encode = encode
    pool._executor = None  # a worker's copy (forked) owns no workers of its own


def _encode_share(texts: list[str], allowed: frozenset[str]) -> tuple[array, array]:
    """Encode texts in a worker; ids travel back packed, as pickling lists of ints is slow."""
    assert _worker_encode is not None
    return _pack([_worker_encode(text, allowed) for text in texts])


def _pack(encoded: list[list[int]]) -> tuple[array, array]:
    """(the number of ids of each text, all the ids one after another as uint32)."""
    flat = array("I")
    for ids in encoded:  # 4 ns an id; array("I", chain(...)) takes 25, array("H", ...) 11 (each checks its range)
        flat.fromlist(ids)
    return array("q", map(len, encoded)), flat


def _unpack_ids(lengths: array, flat: array) -> list[list[int]]:
    # Making thousands of lists would trigger full garbage collections over the whole heap
    # (the piece cache included), which cost more than the unpacking; none is needed here.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ids, out, start = flat.tolist(), [], 0
        for n in lengths:
            out.append(ids[start : start + n])
            start += n
        return out
    finally:
        if gc_was_enabled:
            gc.enable()


def _split_by_length(texts: list[str], n: int) -> list[list[str]]:
    """`n` contiguous runs of `texts` holding about equal numbers of characters."""
    total = sum(map(len, texts))
    shares: list[list[str]] = [[] for _ in range(n)]
    seen = 0
    for text in texts:
        shares[min(n - 1, seen * n // max(total, 1))].append(text)
        seen += len(text)
    return shares


# ------------------------------------------------------------------ encode_stream

SHARES_PER_WORKER = 2  # in flight: one encoding, the next waiting, so that a worker never waits for this process


def encode_stream(
    encode: Callable[[Any], list[int]], shares: Iterable[tuple[K, list]], num_workers: int
) -> Iterator[tuple[K, array, array]]:
    """For each (key, items) of `shares`, in order: its key, the number of ids of each item, and
    all their ids one after another (an array of uint32, "I"), each item encoded by `encode`.
    Encoded on `num_workers` worker processes (see the module's docstring), or as many as there
    are shares if fewer; with one worker, or a single share, in this process. `shares` is read
    only as far as the shares in flight: memory holds those, whatever the stream's length."""
    shares = iter(shares)
    started = list(islice(shares, num_workers))  # a small corpus starts no more workers than it has shares
    if len(started) < 2:  # one share, or one worker: not worth another process
        for key, items in chain(started, shares):
            yield key, *_pack([encode(item) for item in items])
        return
    executor = ProcessPoolExecutor(len(started), _context(), initializer=_init_stream_worker, initargs=(encode,))
    in_flight: deque[tuple[K, Future]] = deque()
    try:
        for key, items in chain(started, shares):
            in_flight.append((key, executor.submit(_encode_packed, items)))
            if len(in_flight) >= SHARES_PER_WORKER * len(started):
                key, future = in_flight.popleft()
                yield key, *future.result()
        while in_flight:
            key, future = in_flight.popleft()
            yield key, *future.result()
    finally:  # an error here or in the caller's writing: the shares not started are dropped
        executor.shutdown(wait=True, cancel_futures=True)


_stream_encode: Callable[[Any], list[int]] | None = None


def _init_stream_worker(encode: Callable[[Any], list[int]]) -> None:
    global _stream_encode
    _stream_encode = encode
    # Ctrl-C is the parent's to handle: it stops the stream, and the workers with it, not a traceback from each
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What the worker started with (the tokenizer, its cache, whatever the parent held) stays put:
    # the collector never walks it again, nor touches its pages (which fork shares until written).
    gc.freeze()


def _encode_packed(items: list) -> tuple[array, array]:
    assert _stream_encode is not None
    return _pack([_stream_encode(item) for item in items])

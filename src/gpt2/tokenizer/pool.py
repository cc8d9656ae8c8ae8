"""The worker processes of `Tokenizer.encode_batch`: a large batch is cut into runs of about equal
length, one per process, this process encoding the first run while the workers encode the others.

Encoding is pure Python, so threads would wait on each other (the GIL); processes do not. The
workers are kept for later batches, so their piece caches stay warm, and are forked where the
system can (they start with the tokenizer and its warm cache, nothing pickled). This module knows
no tokenizer: it is handed the function that encodes one text with the special tokens allowed.
"""

from __future__ import annotations

import gc
import multiprocessing
from array import array
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from itertools import chain

Encode = Callable[[str, frozenset[str]], list[int]]  # (text, allowed special tokens) -> ids

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
            # fork hands the workers the tokenizer (and its warm cache) without pickling it.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(method)
            self._executor = ProcessPoolExecutor(size, context, initializer=_init_worker, initargs=(self._encode, self))
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


_worker_encode: Encode | None = None


def _init_worker(encode: Encode, pool: WorkerPool) -> None:
    global _worker_encode
    _worker_encode = encode
    pool._executor = None  # a worker's copy (forked) owns no workers of its own


def _encode_share(texts: list[str], allowed: frozenset[str]) -> tuple[array, array]:
    """Encode texts in a worker; ids travel back packed, as pickling lists of ints is slow."""
    assert _worker_encode is not None
    encoded = [_worker_encode(text, allowed) for text in texts]
    return array("q", map(len, encoded)), array("I", chain.from_iterable(encoded))


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

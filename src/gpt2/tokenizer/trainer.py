"""Byte-pair encoding (BPE) training: the merges a corpus teaches, most frequent adjacent pair first.

Kept apart from the tokenizer that applies the merges, as tiktoken keeps its trainer apart from its
encoder. `Tokenizer.train` is the entry: it pre-tokenizes the corpus with GPT-2's pattern
(`count_pieces` counts the pieces), lays the learned merges out as GPT-2's ids, and adds
<|endoftext|>. This module learns the merges over the pieces' bytes and knows no vocabulary layout.

Each step merges the most frequent adjacent pair (ties: the smaller bytes first). Pair counts are
updated only in the words that hold the merged pair, and a max-heap of counts is updated lazily,
so a step costs about the occurrences of the pair it merges rather than a pass over the corpus.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from gpt2.errors import InputTypeError, InvalidArgumentError

Pair = tuple[int, int]  # two symbol ids: 0..255 the raw bytes, 256.. the merged tokens in order


def count_pieces(corpus: str | Iterable[str], pretokenize: Callable[[str], Iterable[str]]) -> Counter[str]:
    """How often each piece of `corpus` (a text or texts) occurs, as `pretokenize` cuts the texts."""
    texts = [corpus] if isinstance(corpus, str) else corpus
    counts: Counter[str] = Counter()
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputTypeError(f"train() takes str texts, got {type(text).__name__} at index {i}")
        counts.update(pretokenize(text))
    if not counts:
        raise InvalidArgumentError("cannot train a tokenizer on an empty corpus")
    return counts


def learn_merges(
    words: Iterable[tuple[bytes, int]], n_merges: int, progress: bool = False
) -> list[tuple[bytes, bytes]]:
    """Up to `n_merges` merges, in the order learned, from (word's bytes, frequency) pairs; fewer
    if the words run out of pairs first. No merge crosses from one word into the next."""
    from tqdm.auto import tqdm

    symbols = [bytes([b]) for b in range(256)]  # symbol id -> its bytes
    pairs = _PairCounts(words, symbols)
    merges: list[tuple[bytes, bytes]] = []
    with tqdm(total=n_merges, desc="training BPE", unit="merge", disable=not progress) as bar:
        while len(merges) < n_merges and (best := pairs.pop_most_frequent()) is not None:
            a, b = best
            symbols.append(symbols[a] + symbols[b])
            merges.append((symbols[a], symbols[b]))
            pairs.merge(a, b, len(symbols) - 1)
            bar.update()
    return merges


class _PairCounts:
    """The words as lists of symbol ids, each adjacent pair's count over the corpus (a word's
    pairs count as often as the word occurs), the words each pair occurs in, and a max-heap of
    the counts in which an entry whose count is out of date is skipped when it comes up."""

    def __init__(self, words: Iterable[tuple[bytes, int]], symbols: list[bytes]):
        self._symbols = symbols
        self._words: list[list[int]] = []
        self._freqs: list[int] = []
        self._counts: defaultdict[Pair, int] = defaultdict(int)
        self._where: defaultdict[Pair, set[int]] = defaultdict(set)
        for w, (word, freq) in enumerate(words):
            self._words.append(list(word))
            self._freqs.append(freq)
            for pair in zip(word, word[1:]):
                self._counts[pair] += freq
                self._where[pair].add(w)
        # Equal counts: the smaller bytes first, then (for equal bytes) the smaller symbol ids.
        self._heap = [(-count, symbols[a], symbols[b], a, b) for (a, b), count in self._counts.items()]
        heapq.heapify(self._heap)

    def pop_most_frequent(self) -> Pair | None:
        """The most frequent pair (None when no pair is left)."""
        while self._heap:
            negative_count, _, _, a, b = heapq.heappop(self._heap)
            if self._counts.get((a, b)) == -negative_count:
                return a, b
        return None

    def merge(self, a: int, b: int, new: int) -> None:
        """Replace (a, b) by the symbol `new` in every word that holds it, and update the counts."""
        changed: set[Pair] = set()
        for w in self._where.pop((a, b)):
            old = self._words[w]
            merged = merge_pair(old, a, b, new)
            if len(merged) == len(old):
                continue  # the pair left this word in an earlier merge
            for pair in zip(old, old[1:]):
                self._counts[pair] -= self._freqs[w]
                changed.add(pair)
            for pair in zip(merged, merged[1:]):
                self._counts[pair] += self._freqs[w]
                self._where[pair].add(w)
                changed.add(pair)
            self._words[w] = merged
        for pair in changed:
            count = self._counts[pair]
            if count > 0:
                heapq.heappush(self._heap, (-count, self._symbols[pair[0]], self._symbols[pair[1]], *pair))
            else:
                del self._counts[pair]
                self._where.pop(pair, None)


def merge_pair(word: list[int], a: int, b: int, new: int) -> list[int]:
    """`word` with each non-overlapping (a, b), scanned left to right, replaced by `new`."""
    out = []
    i, n = 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out

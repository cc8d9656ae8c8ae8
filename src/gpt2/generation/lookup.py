"""Prompt-lookup speculation: drafts without a draft model, copied from the row's own tokens.

    tokens: ... A B C D E ... A B C            # the row so far: its prompt, then its new tokens
    the last n tokens (A B C) occurred before  # n from lookup_max down to lookup_min, the latest occurrence
    draft: D E ...                             # what followed them there, k tokens
                                               # (where that reaches the present: the loop it is in, again)

Text that copies its prompt (a summary quoting its passage, code edited in place, a table filled
from a list) gets several tokens per pass of the model; elsewhere no n-gram recurs and a step
decodes one token, as without speculation. This is vLLM's "ngram" method and transformers'
prompt_lookup_num_tokens (Saxena, 2023). The decoding loop verifies the drafts as it verifies a
draft model's (`decoding.Decoder`): each is a certain proposal (q = 1 on it), which speculative
sampling's rule keeps with the model's probability of it, so the tokens follow the model's
distribution exactly, and greedy rows get the tokens they get without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpt2._checks import int_between
from gpt2.errors import InvalidArgumentError
from gpt2.settings import LOOKUP_MAX, LOOKUP_MIN


@dataclass(frozen=True)
class PromptLookup:
    """Drafts from earlier occurrences of a row's last n tokens, n from `lookup_max` down to `lookup_min`."""

    lookup_max: int = LOOKUP_MAX
    lookup_min: int = LOOKUP_MIN

    def __post_init__(self) -> None:
        int_between("prompt_lookup_max", self.lookup_max, 1, None)
        int_between("prompt_lookup_min", self.lookup_min, 1, None)
        if self.lookup_min > self.lookup_max:
            raise InvalidArgumentError(
                f"prompt_lookup_min ({self.lookup_min}) must not exceed prompt_lookup_max ({self.lookup_max})",
                "prompt_lookup_min",
                ("prompt_lookup_max",),
            )

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence of the longest n-gram ending
        `tokens` (n from lookup_max down to lookup_min); none where no such n-gram recurs. Where
        they run into the present (the occurrence lies p tokens back, p < k + 1), the text is a
        loop of period p so far, and the draft goes on round it: "a b a b" drafts "a b a b"."""
        if k <= 0 or len(tokens) <= self.lookup_min:
            return []
        ids = np.asarray(tokens)
        last = len(ids) - 1
        ends = np.flatnonzero(ids[:last] == ids[last])[::-1]  # where the last token occurred before, latest first
        found = None  # the latest end of the longest n-gram so far
        for n in range(1, min(self.lookup_max, last) + 1):  # the n-grams ending at `ends` that match grow shorter lists
            if n > 1:
                ends = ends[(ends >= n - 1) & (ids[np.maximum(ends - n + 1, 0)] == ids[last - n + 1])]
            if len(ends) == 0:
                break
            if n >= self.lookup_min:
                found = int(ends[0])
        if found is None:
            return []
        period = last - found
        return [int(ids[found + 1 + j % period]) for j in range(k)]


SPECULATIVE = ("ngram",)  # speculation without a draft model: vLLM's method names


def lookup_of(
    speculative: str | None, lookup_max: int = LOOKUP_MAX, lookup_min: int = LOOKUP_MIN, draft: object = None
) -> PromptLookup | None:
    """The prompt lookup of speculative="ngram" (None: no speculation, or a draft model's); checked."""
    if speculative is None:
        if (lookup_max, lookup_min) != (LOOKUP_MAX, LOOKUP_MIN):
            raise InvalidArgumentError(
                "prompt_lookup_max and prompt_lookup_min set speculative='ngram': give it too",
                "prompt_lookup_max",
                ("prompt_lookup_min", "speculative"),
            )
        return None
    if speculative not in SPECULATIVE:
        raise InvalidArgumentError(
            f"unknown speculative method {speculative!r}: the one without a draft model is 'ngram' "
            f"(for a draft model, give the model as draft)",
            "speculative",
            ("draft",),
        )
    if draft is not None:
        raise InvalidArgumentError(
            "draft and speculative='ngram' contradict: speculate with a draft model or by prompt lookup, not both",
            "draft",
            ("speculative",),
        )
    return PromptLookup(lookup_max, lookup_min)

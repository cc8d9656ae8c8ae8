"""The token loop: rows of generation in the slots of an engine, joining and leaving a running batch.

    each step:
        rows that ended leave their slots             # the last row moves into a freed slot
        the others' newest tokens are decoded         # (B,) -> (B, V), one batch
        rows waiting take the free slots
        their prompts go in, within a token budget    # every chunk in one call: prefilled together
        rows whose prompt is in join the batch
        every row chooses its next token              # its own sampling settings and seed

This is continuous batching, as llama.cpp's server slots and vLLM do it: a request joins the
running batch at the next step and leaves it when it ends, so a short request never waits for
a long one; with chunked prefill, as vLLM's, a long prompt goes in a chunk at a time, so the
rows decoding are not stalled for all of its length. A row's tokens depend on nothing beside
it: its prompt attends only to itself, and it samples from its own random stream (row i of a
call seeded s draws from seed s + i), so a request gets the same tokens served among others
as served alone. The tensor API (`GPT2.generate`), the text API (`gpt2.generation.generate`), `gpt2
generate` and `gpt2 serve` all run this one loop, and each makes its rows with a
`Request`: `Request.build` checks the request first (its prompts, its max_new_tokens, its
sampling and seed, and the context it needs); the server, whose request bodies are checked
as they arrive (`gpt2.serve.protocol`), holds its checked values in one directly. An engine computes logits
(`engines.TorchEngine`, with the KV cache, or `engines.NumpyEngine`); this module
knows nothing of models.

With a draft engine (a smaller model of the same tokenizer), decoding is speculative, as in
Leviathan et al. (2023) and Chen et al. (2023): each step the draft proposes k tokens for every
active row, one batched pass each, and the engine verifies all of them in one pass; each row
keeps the drafts that speculative sampling's rule keeps (`sampling.speculative_accept`),
and one token more. Its tokens follow the engine's distribution exactly: greedy rows get the
tokens they get without a draft.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gpt2._checks import check_token_ids, is_integer, positive_int
from gpt2.errors import ContextLengthError, GPT2Warning, InvalidArgumentError, NonFiniteError, warn
from gpt2.generation.lookup import PromptLookup
from gpt2.generation.processors import Processing
from gpt2.generation.sampling import (
    SEED_MAX,
    Sampling,
    check_seed,
    draw,
    row_probabilities,
    sample_next,
    seeded_generator,
    speculative_accept,
)
from gpt2.settings import DRAFT_TOKENS

STOP, LENGTH = "stop", "length"  # why a row ended, in OpenAI's words


class ContextOverflowWarning(GPT2Warning):
    """The prompt and the new tokens do not fit the context: the oldest tokens are dropped."""


class Engine(Protocol):
    """What the loop asks of a model: `slots` rows at most, each in a slot of its cache."""

    slots: int
    max_len: int  # positions a slot holds
    block_size: int | None  # tokens in a block of its prefix cache (None: it keeps none)

    def extend(
        self,
        slots: Sequence[int],
        starts: Sequence[int],
        chunks: Sequence[Sequence[int]],
        every_position: Sequence[bool] | None = None,
    ) -> list[torch.Tensor]:
        """Logits after each chunk of tokens, which continues slot slots[b] from position
        starts[b]: (V,) for each, or (T_b, V) for every position where every_position[b]."""
        ...

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) after one token more (B,) in each of slots 0..B-1."""
        ...

    def reuse(self, slot: int, tokens: Sequence[int]) -> int:
        """Put the kept blocks that begin `tokens` into `slot` (a prefix cache); returns the positions filled."""
        ...

    def remember(self, slot: int, tokens: Sequence[int]) -> None:
        """Keep the blocks of `tokens`, the first positions of `slot`, for later prompts."""
        ...

    def cached_logits(self, slot: int, n: int) -> torch.Tensor:
        """Logits (n, V) of the first n positions of `slot`, where `reuse` filled them."""
        ...

    def move(self, src: int, dst: int) -> None:
        """Copy slot src into slot dst."""
        ...


@dataclass(eq=False)
class Row:
    """One sequence being continued: a prompt, how to choose tokens, and what came of it.

    It ends at `eos_token_id` ("stop"), after max_new_tokens ("length"), or when its owner
    calls `end` (a stop string found in its text, a client gone). With `logprobs` = k, each
    chosen token's log-probability is recorded with the k most likely tokens' (from the
    model's distribution, before temperature and filters, as OpenAI's API reports them);
    with `echo_logprobs` too, those of the prompt's tokens (the first has none). With `processing`
    (a constraint, penalties: `processors`), it chooses from its scores as they bend, not from the
    model's logits, and a constraint that is complete ends it ("stop").
    """

    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    seed: int | None = None
    eos_token_id: int | None = None
    logprobs: int | None = None
    echo_logprobs: bool = False
    processing: Processing | None = None
    tokens: list[int] = field(default_factory=list, init=False)  # the new tokens
    token_logprobs: list[float] = field(default_factory=list, init=False)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list, init=False)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]] | None] = field(default_factory=list, init=False)
    finish_reason: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.generator = None if self.seed is None else seeded_generator(self.seed)
        self.process = None if self.processing is None else self.processing.start(self.prompt)  # its own state

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def end(self, reason: str = STOP) -> None:
        """End the row (it leaves its slot at the next step); a row already ended keeps its reason."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def _record(self, logits: torch.Tensor, token: int) -> tuple[float, list[tuple[int, float]]]:
        """token's log-probability under logits (V,), and the `logprobs` most likely tokens'."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(logp, self.logprobs) if self.logprobs else None
        alternatives = [] if top is None else list(zip(top.indices.tolist(), top.values.tolist()))
        return float(logp[token]), alternatives

    def _record_prompt(self, logits: torch.Tensor, window: list[int], start: int) -> None:
        """The prompt's log-probabilities from the logits (T, V) at window positions start..start+T-1,
        each the distribution of the token after it (the first token has none)."""
        if start == 0:
            self.prompt_logprobs = [None]
        targets = window[start + 1 : start + len(logits) + 1]
        if not targets:
            return
        logp = torch.log_softmax(logits[: len(targets)].float(), dim=-1)  # (n, V)
        chosen = logp.gather(1, torch.tensor(targets)[:, None])[:, 0].tolist()
        top = torch.topk(logp, self.logprobs) if self.logprobs else None
        for i, value in enumerate(chosen):
            alternatives = [] if top is None else list(zip(top.indices[i].tolist(), top.values[i].tolist()))
            self.prompt_logprobs.append((value, alternatives))


def row_seed(seed: int | None, row: int) -> int | None:
    """The seed of row `row` of a call seeded `seed` (checked where it came in: `Request.build`,
    `gpt2.generation.generate.Chat`): seed + row, modulo 2**64 (None: unseeded)."""
    return None if seed is None else (seed + row) % (SEED_MAX + 1)


# ------------------------------------------------------------------ requests: every front door's rows


@dataclass(frozen=True)
class Request:
    """A checked generation request: prompts, how to continue them, and n rows for each.

    `GPT2.generate` and `gpt2.generation.generate.TextGeneration` each build one with `Request.build`
    (`gpt2 serve` makes one of a body it has checked), make an engine of `slots` rows (whose memory is checked
    then), and then the rows, prompt-major: row i samples from seed + i.
    """

    prompts: list[list[int]]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    seed: int | None = None
    n: int = 1
    eos_token_id: int | None = None
    logprobs: int | None = None
    echo_logprobs: bool = False
    processing: Processing | None = None  # a constraint, penalties: each row starts its own state

    @classmethod
    def build(
        cls,
        prompts: Sequence[list[int]],
        max_new_tokens: int,
        *,
        n_vocab: int,
        n_ctx: int,
        sampling: Sampling = Sampling(),
        seed: int | None = None,
        n: int = 1,
        eos_token_id: int | None = None,
        logprobs: int | None = None,
        echo_logprobs: bool = False,
        on_overflow: str = "slide",
        allow_zero: bool = False,
        n_param: str = "n",
        processing: Processing | None = None,
    ) -> Request:
        """Check every part of a request, then hold it: each value once, here, on its way in from
        the front door (`n_param`: n's name there, num_samples in the text API). `allow_zero` lets
        max_new_tokens be 0 (the prompt only scored, as OpenAI's echo with max_tokens 0); past n_ctx
        the context slides, with a warning, or it is an error (`on_overflow`)."""
        max_new_tokens = check_max_new_tokens(max_new_tokens, allow_zero)
        sampling.check_vocab(n_vocab)  # the rest was checked as it was made
        if processing is not None:
            processing.penalties.check_vocab(n_vocab)
        seed = None if seed is None else check_seed(seed)  # an int, as the rows' seeds are made from it
        n = positive_int(n_param, n)
        check_prompts(prompts, n_vocab)
        check_context([len(p) for p in prompts], max_new_tokens, n_ctx, on_overflow)
        return cls(list(prompts), max_new_tokens, sampling, seed, n, eos_token_id, logprobs, echo_logprobs, processing)

    @property
    def slots(self) -> int:
        """The rows: n for each prompt."""
        return len(self.prompts) * self.n

    @property
    def longest(self) -> int:
        return max(map(len, self.prompts))

    def rows(self) -> list[Row]:
        """The request's rows, prompt-major (n each); row i samples from seed + i."""
        return [
            Row(
                ids,
                self.max_new_tokens,
                self.sampling,
                row_seed(self.seed, i * self.n + j),
                self.eos_token_id,
                self.logprobs,
                self.echo_logprobs,
                self.processing,
            )
            for i, ids in enumerate(self.prompts)
            for j in range(self.n)
        ]


def check_max_new_tokens(max_new_tokens: int, allow_zero: bool = False) -> int:
    if allow_zero and is_integer(max_new_tokens) and max_new_tokens == 0:
        return 0
    return positive_int("max_new_tokens", max_new_tokens)


def check_draft_tokens(draft_tokens: int) -> int:
    """The tokens a draft model proposes per step: a positive whole number."""
    return positive_int("draft_tokens", draft_tokens)


def check_prompts(prompts: Sequence[Sequence[int]], n_vocab: int) -> None:
    if len(prompts) == 0:
        raise InvalidArgumentError("no prompts: give at least one sequence of token ids", "prompt")
    for b, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise InvalidArgumentError(f"prompt {b} is empty: give at least one token (e.g. <|endoftext|>)", "prompt")
        check_token_ids(min(prompt), max(prompt), n_vocab, f" in prompt {b}", param="prompt")


def start_of_text(ids: list[int], eot_token: int | None) -> list[int]:
    """A prompt of text as the loop starts it: an empty one from <|endoftext|>, as GPT-2's
    unconditional samples are, where the vocabulary has it (a character vocabulary has not)."""
    if ids:
        return ids
    if eot_token is None:
        raise InvalidArgumentError(
            "empty prompt: this model's vocabulary has no <|endoftext|> to start from; give a prompt", "prompt"
        )
    return [eot_token]


def check_on_overflow(on_overflow: str) -> None:
    if on_overflow not in ("slide", "error"):
        raise InvalidArgumentError(f"on_overflow must be 'slide' or 'error', got {on_overflow!r}", "on_overflow")


def check_context(prompt_lengths: Sequence[int], max_new_tokens: int, n_ctx: int, on_overflow: str) -> None:
    """Past n_ctx the context slides (a warning, at the caller's line) or it is an error, as `on_overflow` says."""
    check_on_overflow(on_overflow)
    longest = max(prompt_lengths)
    if longest + max_new_tokens > n_ctx:
        message = f"the prompt ({longest} tokens) and {max_new_tokens} new tokens exceed the context of n_ctx={n_ctx}"
        if on_overflow == "error":
            raise ContextLengthError(message + ": shorten the prompt or ask for fewer new tokens", "prompt")
        warn(message + f"; the model sees only the last {n_ctx} tokens", ContextOverflowWarning)


# ------------------------------------------------------------------ the loop


@dataclass(eq=False)
class Filling:
    """A row whose prompt is going into its slot, a chunk at a time (chunked prefill)."""

    row: Row
    window: list[int]  # the prompt as the engine holds it: its last max_len tokens
    slot: int
    filled: int = 0  # the window's tokens in the slot so far
    drafted: int = 0  # those in the draft's slot (fewer where the slot's first blocks were reused)
    twin: Filling | None = None  # a row of the same prompt ahead of it: its slot is copied, not computed
    after: Filling | None = None  # a row ahead that begins with the same block: its blocks are reused once kept
    logits: torch.Tensor | None = None  # (V,) after the whole window

    @property
    def complete(self) -> bool:
        return self.filled == len(self.window)


@dataclass
class DraftStats:
    """How speculative decoding went: draft tokens proposed and kept, and the target's verifying
    passes over each row (after its prompt's) and the tokens they gave."""

    proposed: int = 0
    accepted: int = 0
    passes: int = 0  # rows times steps
    tokens: int = 0

    @property
    def acceptance(self) -> float:
        """The share of the draft's tokens that were kept."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """The tokens a row gets from one pass of the target."""
        return self.tokens / self.passes if self.passes else 0.0


class Decoder:
    """The running batch: rows waiting; rows active in slots 0..A-1 of the engine (row i in
    slot i); and rows filling, whose prompts go in a chunk at a time, in the slots after those.

    Each step decodes the active rows, then spends what is left of `max_batched_tokens` (vLLM's
    max_num_batched_tokens; None: no limit) on the prompts of the rows filling, oldest first,
    all of them in one call of the engine (`Engine.extend`): rows that arrive together are
    prefilled together, and a long prompt goes in over several steps instead of stalling the
    rows decoding for all of its length. A row whose prompt is in joins the active rows. Where
    the engine keeps prompts' blocks (a prefix cache), a row starts from those that begin its
    prompt, and a row that begins as a row still filling ahead of it waits for that row's blocks.

    With a `draft` engine (a smaller model of the same vocabulary, with as many slots), decoding
    is speculative: each step the draft proposes up to `draft_tokens` tokens for each active row,
    and the engine verifies them all in one pass (`Decoder._speculate`), so a row gets from 1 to
    draft_tokens + 1 tokens a step, which follow the engine's distribution exactly: greedy rows
    get the tokens they get without a draft. The draft mirrors the engine's slots (each row's
    prompt goes into both, and a row that moves moves in both), and catches up on the tokens it
    has not seen when it next proposes. `stats` counts what was proposed and kept. With a `lookup`
    instead (`lookup.PromptLookup`), the drafts are copied from each row's own earlier tokens, and
    verified the same way.
    """

    def __init__(
        self,
        engine: Engine,
        max_batched_tokens: int | None = None,
        draft: Engine | None = None,
        draft_tokens: int = DRAFT_TOKENS,
        lookup: PromptLookup | None = None,
    ):
        self.engine = engine
        self.max_batched_tokens = (
            None if max_batched_tokens is None else positive_int("max_batched_tokens", max_batched_tokens)
        )
        self.draft, self.draft_tokens, self.lookup = draft, check_draft_tokens(draft_tokens), lookup
        if draft is not None and draft.slots < engine.slots:
            raise InvalidArgumentError(
                f"the draft's engine has {draft.slots} slots, fewer than the model's {engine.slots}", "draft"
            )
        if draft is not None and lookup is not None:
            raise InvalidArgumentError(
                "speculate with a draft model or by prompt lookup, not both", "speculative", ("draft",)
            )
        self.waiting: deque[Row] = deque()
        self.filling: list[Filling] = []
        self.active: list[Row] = []
        self.logits: list[torch.Tensor] = []  # (V,) next-token logits of each active row
        self.drafted: dict[Row, int] = {}  # each active row's tokens (its window's, then new ones) the draft holds
        self.stale: set[Row] = set()  # active rows whose slot holds positions past their tokens: drafts refused
        self.stats = DraftStats()

    def add(self, row: Row) -> None:
        """Queue a row: it starts filling at the next step with a free slot."""
        self.waiting.append(row)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.filling or self.active)

    def step(self) -> list[tuple[Row, int | None]]:
        """One token more for every active row (with a draft, one or more). Returns (row, token)
        for each token a row got, in order, and (row, None) for each row that ended without one
        (max_new_tokens 0); `finish_reasons` says which ended their rows. A row that ended
        (row.done) leaves at the next step."""
        self._leave()
        events: list[tuple[Row, int | None]] = []
        chosen, computed = 0, len(self.active)  # rows from `chosen` on choose from self.logits; the engine's tokens
        speculating = self.draft is not None or self.lookup is not None
        if (
            speculating and self.active
        ):  # `_speculate` verifies from each row's length: its slot may hold refused drafts
            counts = self._draft_counts()
            events, chosen, computed = self._speculate(counts), len(self.active), len(self.active) + sum(counts)
        elif self.active:
            fed = self.engine.decode(torch.tensor([row.tokens[-1] for row in self.active]))  # (B, V)
            self.logits = list(fed)
        budget = None if self.max_batched_tokens is None else max(self.max_batched_tokens - computed, 1)
        scored: list[Row] = []
        while True:  # again while rows only scored free their slots for rows waiting
            self._admit()
            ended, budget = self._fill(budget)
            scored += ended
            if not (ended and self.waiting and budget != 0):
                break
        return events + self._choose(chosen) + [(row, None) for row in scored]

    def _leave(self) -> None:
        """Drop the rows that ended; the last active row moves into each freed slot, so active
        slots stay 0..A-1, and the rows filling move down to the slots just after them. Rows
        that ended while they waited (their clients left) leave the queue now, not once they
        would have had a slot: a server counts the rows waiting against its max_queue."""
        if any(row.done for row in self.waiting):
            self.waiting = deque(row for row in self.waiting if not row.done)
        active, i = self.active, 0
        while i < len(active):
            while active and active[-1].done:
                active.pop()
                self.logits.pop()
            if i < len(active) and active[i].done:
                self._move(len(active) - 1, i)
                active[i], self.logits[i] = active.pop(), self.logits.pop()
            i += 1
        self.filling = [fill for fill in self.filling if not fill.row.done]
        self.drafted = {row: self.drafted[row] for row in active if row in self.drafted}
        self.stale &= set(active)
        self._place()

    def _move(self, src: int, dst: int) -> None:
        """A row moves from slot src to slot dst, in the engine and in the draft's."""
        self.engine.move(src, dst)
        if self.draft is not None:
            self.draft.move(src, dst)

    def _place(self) -> None:
        """Put the k-th row filling in slot A + k (moving down only: no row is overwritten)."""
        for k, fill in enumerate(self.filling):
            if fill.slot != len(self.active) + k:
                self._move(fill.slot, len(self.active) + k)
                fill.slot = len(self.active) + k
            if fill.twin is not None and fill.twin not in self.filling:  # the row it copies left: compute its own
                fill.twin = None
                self._reuse(fill)

    def _admit(self) -> None:
        """Waiting rows take the free slots, in order of arrival."""
        max_len = self.engine.max_len
        while self.waiting and len(self.active) + len(self.filling) < self.engine.slots:
            row = self.waiting.popleft()
            if row.done:  # ended while it waited (its client left)
                continue
            fill = Filling(row, row.prompt[-max_len:], len(self.active) + len(self.filling))
            last = self.filling[-1] if self.filling else None
            if last is not None and last.row.prompt == row.prompt and not (row.echo_logprobs or last.row.echo_logprobs):
                fill.twin = last.twin or last  # rows of one prompt (n > 1): prefilled once
            else:
                size = self.engine.block_size
                fill.after = next(
                    (
                        f
                        for f in self.filling
                        if size and f.window[:size] == fill.window[:size] and not f.after and len(fill.window) > size
                    ),
                    None,
                )
                if fill.after is None:
                    self._reuse(fill)
            self.filling.append(fill)

    def _reuse(self, fill: Filling) -> None:
        """Start a row filling from the kept blocks that begin its prompt (a prefix cache's)."""
        fill.after, fill.filled = None, self.engine.reuse(fill.slot, fill.window)
        if fill.filled and fill.row.echo_logprobs:
            fill.row._record_prompt(self.engine.cached_logits(fill.slot, fill.filled), fill.window, 0)

    def _fill(self, budget: int | None) -> tuple[list[Row], int | None]:
        """Prefill the next chunks of the rows filling, up to `budget` tokens (None: no limit), in
        one call; rows whose prompt is in join the active rows. Returns the rows that end at once
        (max_new_tokens 0: only scored), and the budget left."""
        work: list[tuple[Filling, int]] = []
        for fill in self.filling:
            if fill.after is not None and fill.after not in self.filling:  # the row it shares a beginning with is in
                self._reuse(fill)
            if fill.twin is not None or fill.after is not None:
                continue
            take = len(fill.window) - fill.filled if budget is None else min(len(fill.window) - fill.filled, budget)
            if take <= 0:
                break
            work.append((fill, take))
            budget = None if budget is None else budget - take
        if work:
            chunks = [fill.window[fill.filled : fill.filled + take] for fill, take in work]
            outs = self.engine.extend(
                [f.slot for f, _ in work], [f.filled for f, _ in work], chunks, [f.row.echo_logprobs for f, _ in work]
            )
            self._mirror_fill(work)
            for (fill, take), out in zip(work, outs):
                if fill.row.echo_logprobs:
                    fill.row._record_prompt(out, fill.window, fill.filled)
                    out = out[-1]
                fill.filled += take
                fill.logits = out
        return self._join(), budget

    def _mirror_fill(self, work: list[tuple[Filling, int]]) -> None:
        """The same prompts, as far as the chunks go, into the draft's slots (from where each
        holds it: the draft reuses no blocks), where its context holds the whole window (a row
        it cannot hold is decoded without a draft)."""
        if self.draft is None:
            return
        fits = [fill for fill, _ in work if len(fill.window) <= self.draft.max_len]
        if fits:
            ends = [fill.filled + take for fill, take in work if len(fill.window) <= self.draft.max_len]
            self.draft.extend(
                [f.slot for f in fits],
                [f.drafted for f in fits],
                [f.window[f.drafted : end] for f, end in zip(fits, ends)],
            )
            for fill, end in zip(fits, ends):
                fill.drafted = end

    def _join(self) -> list[Row]:
        """The rows filling whose prompts are in (the first ones: the budget goes oldest first)
        join the active rows, in the slots just after them."""
        scored = []
        while self.filling and (self.filling[0].complete or self.filling[0].twin is not None):
            fill = self.filling.pop(0)
            slot = len(self.active)
            if fill.twin is not None:  # ahead of it, so in already
                self._move(fill.twin.slot, slot)
                fill.filled, fill.logits = fill.twin.filled, fill.twin.logits
            else:
                if fill.slot != slot:  # a row before it was only scored and left its slot
                    self._move(fill.slot, slot)
                self.engine.remember(slot, fill.window)
            fill.slot = slot
            if fill.row.max_new_tokens == 0:  # only scored: the slot stays free
                fill.row.end(LENGTH)
                scored.append(fill.row)
                continue
            self.active.append(fill.row)
            self.logits.append(fill.logits)
            if self.draft is not None and len(fill.window) <= self.draft.max_len:
                self.drafted[fill.row] = len(fill.window)
        return scored

    def _choose(self, first: int = 0) -> list[tuple[Row, int]]:
        """Each active row from `first` on chooses its next token from its logits."""
        rows = self.active[first:]
        if not rows:
            return []
        logits = torch.stack(self.logits[first:]).float().cpu()  # (B, V): sampled on the CPU, same seed, same text
        check_finite(logits, rows)
        events = []
        for row, row_logits in zip(rows, logits):
            scores = row_logits if row.process is None else row.process.scores(row_logits, row.tokens)
            token = int(sample_next(scores[None], row.sampling, row.generator)[0])
            self._take(row, row_logits, token)
            events.append((row, token))
        return events

    @staticmethod
    def _take(row: Row, logits: torch.Tensor, token: int) -> None:
        """The row's next token, chosen from logits (V,), the model's; it ends at eos, where its
        constraint is complete, or after max_new_tokens."""
        row.tokens.append(token)
        if row.process is not None:
            row.process.advance(token)
        if row.logprobs is not None:
            chosen, alternatives = row._record(logits, token)
            row.token_logprobs.append(chosen)
            row.top_logprobs.append(alternatives)
        if token == row.eos_token_id or (row.process is not None and row.process.finished):
            row.end(STOP)
        elif len(row.tokens) == row.max_new_tokens:
            row.end(LENGTH)

    # ---------------------------------------------------------------- speculative decoding

    def _window(self, row: Row) -> list[int]:
        """An active row's tokens as the engine sees them: its prompt's window, then its new tokens."""
        return row.prompt[-self.engine.max_len :] + row.tokens

    def _draft_counts(self) -> list[int]:
        """The tokens the draft proposes for each active row this step: draft_tokens at most, one
        fewer than the row may still make (the pass after them gives one more), no more than the
        engine's context and the draft's hold (the window and the drafts, bar the last, in the
        draft), and, rows first come first served, within max_batched_tokens (the engine verifies
        each row's drafts and its newest token). 0 where the draft does not hold the row. (Prompt
        lookup proposes these at most, and fewer where the row's tokens have no more to copy.)"""
        counts, spare = [], None if self.max_batched_tokens is None else self.max_batched_tokens - len(self.active)
        for row in self.active:
            n = min(len(row.prompt), self.engine.max_len) + len(row.tokens)  # len(self._window(row))
            room = min(self.draft_tokens, self.engine.max_len - n, row.max_new_tokens - len(row.tokens) - 1)
            if self.draft is not None:
                room = min(room, self.draft.max_len - n + 1) if row in self.drafted else 0
            k = max(0, room if spare is None else min(room, spare))
            counts.append(k)
            spare = None if spare is None else spare - k
        return counts

    def _speculate(self, counts: list[int]) -> list[tuple[Row, int]]:
        """The draft proposes counts[i] tokens for active row i; the engine verifies them in one
        pass over [newest, drafts...] of every row (a row of no drafts decodes its newest token);
        each row keeps the drafts `speculative_accept` keeps, and one token more."""
        rows, max_len = self.active, self.engine.max_len
        windows = [self._window(row) for row in rows]
        drafts, proposals = self._propose(windows, counts)
        if self.draft is None and not any(drafts) and not self.stale:  # prompt lookup found nothing: decode's fast step
            logits = self.engine.decode(torch.tensor([row.tokens[-1] for row in rows])).float().cpu()  # (B, V)
        else:
            # the newest token is the window's last; past max_len the context slides, as
            # TorchEngine.decode does it: the last max_len tokens again (no drafts there)
            slides = [len(w) > max_len for w in windows]
            starts = [0 if slide else len(w) - 1 for w, slide in zip(windows, slides)]
            chunks = [w[-max_len:] if slide else w[-1:] + d for w, d, slide in zip(windows, drafts, slides)]
            outs = self.engine.extend(list(range(len(rows))), starts, chunks, [bool(d) for d in drafts])
            logits = (
                torch.cat([out if d else out[None] for out, d in zip(outs, drafts)]).float().cpu()
            )  # (sum of k + 1, V)
        owners = [row for row, d in zip(rows, drafts) for _ in range(len(d) + 1)]
        check_finite(logits, owners)
        sizes = [len(d) + 1 for d in drafts]
        scores = torch.cat(
            [self._scores(row, row_logits, d) for row, row_logits, d in zip(rows, logits.split(sizes), drafts)]
        )
        p = row_probabilities(scores, [row.sampling for row in owners]).split(sizes)  # the engine's distributions
        events = []
        for i, (row_logits, row_p) in enumerate(zip(logits.split(sizes), p)):
            events += self._verify(i, row_logits, row_p, drafts[i], proposals[i], len(windows[i]))
        return events

    @staticmethod
    def _scores(row: Row, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        """A row's scores (k + 1, V) at its newest token and after each of its k drafts, from the
        engine's logits there: its processing's, at the state each draft leads to (the model's
        logits where it has none). Past a draft its constraint refuses, the scores are the logits:
        that draft's score is -inf, so the rule refuses it and reads none after it."""
        process = row.process
        if process is None:
            return logits
        scores, generated, advanced = logits.clone(), list(row.tokens), 0
        for t in range(len(drafts) + 1):
            scores[t] = process.scores(logits[t], generated)
            if t == len(drafts) or process.try_advance(drafts[t : t + 1]) == 0:
                break
            generated.append(drafts[t])
            advanced += 1
        process.rollback(advanced)  # `_take` advances through the tokens kept
        return scores

    def _propose(self, windows: list[list[int]], counts: list[int]) -> tuple[list[list[int]], list[torch.Tensor]]:
        """The draft's tokens for each active row, counts[i] of them, each drawn from the draft's
        distribution under the row's sampling, processing and generator; and those distributions,
        (counts[i], V). Its first pass over a row feeds what the draft has not seen of its window.
        By prompt lookup, the tokens copied from the row's own, each proposed for certain."""
        rows = self.active
        if self.lookup is not None:
            drafts = [self.lookup.propose(row.prompt + row.tokens, k) for row, k in zip(rows, counts)]
            V = len(self.logits[0]) if self.logits else 0
            return drafts, [torch.nn.functional.one_hot(torch.tensor(d, dtype=torch.long), V).float() for d in drafts]
        drafts: list[list[int]] = [[] for _ in rows]
        proposals: list[list[torch.Tensor]] = [[] for _ in rows]
        advanced = [0] * len(rows)  # drafts each row's constraint has advanced through
        for j in range(max(counts, default=0)):
            live = [i for i, k in enumerate(counts) if k > j]
            starts = [self.drafted[rows[i]] for i in live]
            chunks = [windows[i][start:] if j == 0 else drafts[i][-1:] for i, start in zip(live, starts)]
            if j and live == list(
                range(len(live))
            ):  # one token after the last pass's in slots 0..B-1: decode's fast step
                logits = self.draft.decode(torch.tensor([chunk[0] for chunk in chunks])).float().cpu()  # (B, V)
            else:
                logits = torch.stack(self.draft.extend(live, starts, chunks)).float().cpu()
            check_finite(logits, [rows[i] for i in live], "the draft model")
            scores = torch.stack(
                [
                    logits[b]
                    if rows[i].process is None
                    else rows[i].process.scores(logits[b], rows[i].tokens + drafts[i])
                    for b, i in enumerate(live)
                ]
            )
            q = row_probabilities(scores, [rows[i].sampling for i in live])
            for i, start, chunk, row_q in zip(live, starts, chunks, q):
                self.drafted[rows[i]] = start + len(chunk)
                drafts[i].append(draw(row_q, rows[i].generator))
                proposals[i].append(row_q)
                if rows[i].process is not None:
                    advanced[i] += rows[i].process.try_advance(drafts[i][-1:])  # the next draft's state; undone below
        for row, n in zip(rows, advanced):
            if row.process is not None:
                row.process.rollback(n)
        return drafts, [torch.stack(q) if q else torch.zeros(0) for q in proposals]

    def _verify(
        self, i: int, logits: torch.Tensor, p: torch.Tensor, drafts: list[int], q: torch.Tensor, n: int
    ) -> list[tuple[Row, int]]:
        """Active row i takes the drafts the rule keeps and the token after them, up to its end.
        logits and p (k + 1, V): the engine's logits and distributions at its newest token and at
        each draft; q (k, V): the draft's; n: the length of its window before them."""
        row, k = self.active[i], len(drafts)
        kept, after = speculative_accept(p, q, drafts, row.generator)
        if (
            kept < k
        ):  # its slot holds the drafts refused, past its tokens: only `extend` (from the row's length) may follow
            self.stale.add(row)
        else:
            self.stale.discard(row)
        if (
            k and self.draft is not None
        ):  # the draft holds the window and drafts[:k - 1]: those past the first refused are not the row's
            self.drafted[row] = n + min(kept, k - 1)
        events = []
        for t, token in enumerate(drafts[:kept] + [after]):
            self._take(row, logits[t], token)
            events.append((row, token))
            if row.done:  # at eos or max_new_tokens: the rest are dropped
                break
        self.logits[i] = logits[len(events) - 1]
        stats = self.stats
        stats.proposed, stats.accepted = stats.proposed + k, stats.accepted + kept
        stats.passes, stats.tokens = stats.passes + 1, stats.tokens + len(events)
        return events


def check_finite(logits: torch.Tensor, rows: Sequence[Row], whose: str = "the model") -> None:
    """Refuse NaN or infinite logits (B, ..., V), row b's in logits[b]: they come of broken weights
    or an overflowing dtype, and no token can be chosen from them."""
    if all(map(math.isfinite, torch.aminmax(logits))):  # NaN and inf reach min or max; one pass, not isfinite's four
        return
    bad = next(b for b in range(len(logits)) if not bool(torch.isfinite(logits[b]).all()))
    raise NonFiniteError(
        f"{whose} produced NaN or infinite logits at new token {len(rows[bad].tokens) + 1}: its weights hold "
        f"NaN or inf, or its dtype overflowed (try float32)"
    )


def finish_reasons(events: Sequence[tuple[Row, int | None]]) -> list[str | None]:
    """Why each event's row ended, as of that event: its finish reason at its last event of the
    step, None at those before it (with a draft, a row gets several tokens in one step)."""
    last = {id(row): e for e, (row, _) in enumerate(events)}
    return [row.finish_reason if last[id(row)] == e else None for e, (row, _) in enumerate(events)]


def run(
    engine: Engine,
    rows: Sequence[Row],
    draft: Engine | None = None,
    draft_tokens: int = DRAFT_TOKENS,
    lookup: PromptLookup | None = None,
) -> Decoder:
    """Continue every row to its end, `engine.slots` at a time (speculatively with a `draft`
    engine or a prompt `lookup`: see Decoder). Returns the decoder, whose `stats` say how the drafts did."""
    decoder = Decoder(engine, draft=draft, draft_tokens=draft_tokens, lookup=lookup)
    for row in rows:
        decoder.add(row)
    with torch.inference_mode():
        while decoder.busy:
            decoder.step()
    return decoder

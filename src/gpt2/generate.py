"""Text generation: decoding (greedy, temperature, top-k, top-p), the token loop, and text.

One token loop serves the tensor API (`GPT2.generate`), the text API (`generate_text`,
`stream_text`) and the `gpt2 generate` command:

    logits = engine.start()                    # (B, V): prefill the prompts
    repeat max_new_tokens times:
        token = sample_next(logits, ...)       # (B,): greedy or sampled
        logits = engine.step(token)            # (B, V): one position more

An engine computes next-token logits: the torch model with its KV cache (each step costs
one position), the torch model recomputing the whole context each step, or the NumPy
reference engine (no cache). Prompts of different lengths are left-padded into one batch.
Past n_ctx tokens, the context slides: each step sees the last n_ctx tokens, as nanoGPT crops.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gpt2._checks import int_between, is_real, positive_int
from gpt2.errors import ContextLengthError, InputTypeError, InvalidArgumentError, NonFiniteError, TokenIdError
from gpt2.tokenizer import IncrementalDecoder, Tokenizer


class ContextOverflowWarning(UserWarning):
    """The prompt and the new tokens do not fit the context: the oldest tokens are dropped."""


class EmptyPromptWarning(UserWarning):
    """An empty prompt: generation starts from <|endoftext|>, as GPT-2's unconditional samples do."""


# ------------------------------------------------------------------ decoding


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. temperature 0 is greedy (the most likely token);
    top_k keeps the k most likely tokens; top_p keeps the smallest set whose probability
    reaches p. Filters apply in that order, to the distribution after temperature."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def check(self, n_vocab: int) -> None:
        if not is_real(self.temperature) or self.temperature < 0:
            raise InvalidArgumentError(f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature!r}")
        if self.top_k is not None:
            int_between("top_k", self.top_k, 1, n_vocab)  # n_vocab: keep every token
        if self.top_p is not None and (not is_real(self.top_p) or not 0 < self.top_p <= 1):
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p!r}")


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf the logits of tokens that top-k, then top-p, leave out. logits: (B, V).

    Ties are broken by token id: among equal logits, the lower id ranks first, so top-k keeps
    exactly k tokens and the result never depends on the sort's whims.
    """
    if top_k is None and top_p is None:
        return logits
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices  # (B, V), ties: lower id first
    ranked = logits.gather(-1, order)
    drop = torch.zeros_like(ranked, dtype=torch.bool)
    if top_k is not None:
        drop[:, top_k:] = True
    if top_p is not None:
        probs = torch.softmax(ranked.masked_fill(drop, float("-inf")).float(), dim=-1)
        before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
        drop |= before >= top_p  # keep tokens until the kept mass reaches p; the first always stays
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row: (B, V) logits -> (B,) ids."""
    if sampling.temperature == 0:
        return logits.argmax(-1)  # the first of equal maxima: the lowest id
    logits = filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ------------------------------------------------------------------ engines


class TorchEngine:
    """Next-token logits from the torch model; with `use_cache`, from its KV cache."""

    def __init__(self, model, prompts: Sequence[Sequence[int]], max_new_tokens: int, use_cache: bool = True):
        self.model, self.use_cache = model, use_cache
        self.n_ctx = model.config.n_ctx
        longest = max(map(len, prompts))
        device = model.device
        # (B, L): each prompt left-padded to the longest; pad[b] counts row b's padding
        self.tokens = torch.tensor([[0] * (longest - len(p)) + list(p) for p in prompts], device=device)
        self.pad = torch.tensor([longest - len(p) for p in prompts], device=device)
        self.max_len = min(self.n_ctx, longest + max_new_tokens)
        self.cache = None

    def start(self) -> torch.Tensor:
        return self._prefill()

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        if not self.use_cache or self.cache.length == self.cache.max_len:
            return self._prefill()  # the context slides (or there is no cache): recompute
        return self.model.forward_cached(token[:, None], self.cache)

    def _prefill(self) -> torch.Tensor:
        """Logits after the last n_ctx tokens, from an empty cache."""
        dropped = max(0, self.tokens.size(1) - self.n_ctx)
        window, pad = self.tokens[:, dropped:], (self.pad - dropped).clamp(min=0)
        if not self.use_cache and not bool(pad.any()):
            return self.model._logits(window)[:, -1]  # the plain forward pass
        if self.cache is None:
            self.cache = self.model.new_cache(window.size(0), self.max_len, pad)
        else:
            self.cache.reset(pad)  # the context slid: the same memory, refilled
        return self.model.forward_cached(window, self.cache)


class NumpyEngine:
    """Next-token logits from the NumPy reference engine: every step recomputes the whole
    context of each row. Slow; it exists to check the torch engine."""

    def __init__(self, reference, prompts: Sequence[Sequence[int]]):
        self.reference = reference
        self.rows = [list(p) for p in prompts]

    def start(self) -> torch.Tensor:
        n_ctx = self.reference.config.n_ctx
        return torch.from_numpy(np.stack([self.reference(row[-n_ctx:])[-1] for row in self.rows]))

    def step(self, token: torch.Tensor) -> torch.Tensor:
        for row, t in zip(self.rows, token.tolist()):
            row.append(t)
        return self.start()


# ------------------------------------------------------------------ the token loop


def generate_tokens(
    engine: TorchEngine | NumpyEngine,
    prompt_lengths: Sequence[int],
    n_ctx: int,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    seed: int | None = None,
    on_overflow: str = "slide",
) -> Iterator[torch.Tensor]:
    """An iterator over the next token of every row, (B,) on the CPU, max_new_tokens times.

    Arguments are checked (and an overflowing context reported) now, before any token is
    generated; the caller stops early by leaving the loop (e.g. once every row has ended).
    """
    check_on_overflow(on_overflow)
    longest = max(prompt_lengths)
    if longest + max_new_tokens > n_ctx:
        message = f"the prompt ({longest} tokens) and {max_new_tokens} new tokens exceed the context of n_ctx={n_ctx}"
        if on_overflow == "error":
            raise ContextLengthError(message + ": shorten the prompt or ask for fewer new tokens")
        warnings.warn(message + f"; the model sees only the last {n_ctx} tokens", ContextOverflowWarning, stacklevel=3)
    generator = None if seed is None else seeded_generator(seed)
    return _token_loop(engine, max_new_tokens, sampling, generator)


def _token_loop(engine, max_new_tokens: int, sampling: Sampling, generator: torch.Generator | None) -> Iterator[torch.Tensor]:
    out = engine.start()  # (B, V) on the model's device
    for i in range(max_new_tokens):
        logits = out.float().cpu()  # sampled on the CPU: same seed, same text
        if not bool(torch.isfinite(logits).all()):  # greedy would print garbage, sampling fail inside torch
            raise NonFiniteError(
                f"the model produced NaN or infinite logits at new token {i + 1}: its weights hold NaN or inf, "
                f"or its dtype overflowed (try float32)"
            )
        token = sample_next(logits, sampling, generator)
        yield token
        if i + 1 < max_new_tokens:
            out = engine.step(token.to(out.device))


# ------------------------------------------------------------------ seeds

SEED_MAX = 2**64 - 1
_MT_N = 624  # the Mersenne Twister's state: 624 words of 32 bits
_TORCH_STATE_BYTES = 5056  # torch's CPU generator state, as get_state() gives it


def check_seed(seed: int) -> int:
    return int_between("seed", seed, 0, SEED_MAX, "a whole number")


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator whose random stream depends on all 64 bits of `seed` (0 .. 2**64 - 1).

    torch seeds its CPU generator, a Mersenne Twister, from the low 32 bits alone, so seeds 0,
    2**32 and 2**63 would sample the same text. Below 2**32 this is torch's own seeding (the same
    stream as torch.manual_seed); from 2**32 up, the twister's state comes from both 32-bit
    halves through the reference `init_by_array`, as NumPy's and Python's twisters seed.
    """
    seed = check_seed(seed)
    generator = torch.Generator()
    if seed < 2**32:
        return generator.manual_seed(seed)
    state = bytearray(generator.get_state().numpy().tobytes())
    if len(state) != _TORCH_STATE_BYTES:
        raise InvalidArgumentError(f"seeds from 2**32 up need torch's CPU generator state of {_TORCH_STATE_BYTES} bytes; "
                                   f"this torch's has {len(state)}: use a seed below 2**32")  # fmt: skip
    words = np.array(mt19937_init_by_array([seed & 0xFFFFFFFF, seed >> 32]), dtype="<u8").tobytes()
    # the state: seed (u64), left (i32), seeded (i32), next (u64), then the twister's 624 words,
    # each stored as a u64; left = 1 makes the first draw twist, as it does after seeding
    state[:24] = struct.pack("<QiiQ", seed, 1, 1, 0)
    state[24 : 24 + len(words)] = words
    generator.set_state(torch.frombuffer(state, dtype=torch.uint8))
    return generator


def mt19937_init_by_array(key: Sequence[int]) -> list[int]:
    """The Mersenne Twister's 624-word state from 32-bit key words (Matsumoto and Nishimura's init_by_array)."""
    mt = [19650218]
    for i in range(1, _MT_N):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    i, j = 1, 0
    for _ in range(max(_MT_N, len(key))):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525)) + key[j] + j) & 0xFFFFFFFF
        i, j = i + 1, (j + 1) % len(key)
        if i == _MT_N:
            mt[0], i = mt[-1], 1
    for _ in range(_MT_N - 1):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941)) - i) & 0xFFFFFFFF
        i += 1
        if i == _MT_N:
            mt[0], i = mt[-1], 1
    mt[0] = 0x80000000  # the most significant bit set: the state is never all zeros
    return mt


# ------------------------------------------------------------------ argument checks


def check_on_overflow(on_overflow: str) -> None:
    if on_overflow not in ("slide", "error"):
        raise InvalidArgumentError(f"on_overflow must be 'slide' or 'error', got {on_overflow!r}")


def check_prompts(prompts: Sequence[Sequence[int]], n_vocab: int) -> None:
    if len(prompts) == 0:
        raise InvalidArgumentError("no prompts: give at least one sequence of token ids")
    for b, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise InvalidArgumentError(f"prompt {b} is empty: give at least one token (e.g. <|endoftext|>)")
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= n_vocab:
            raise TokenIdError(f"token id {low if low < 0 else high} in prompt {b} is out of range: ids are 0..{n_vocab - 1}")


def check_max_new_tokens(max_new_tokens: int) -> None:
    positive_int("max_new_tokens", max_new_tokens)


def check_stop(stop: str | Sequence[str] | None) -> list[str]:
    """Stop strings as a list: None (or an empty list) for none, one str, or several."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    try:
        stop = list(stop)
    except TypeError:
        raise InputTypeError(f"stop must be a str, a list of str, or None, got {type(stop).__name__}") from None
    for s in stop:
        if not isinstance(s, str) or s == "":
            raise InvalidArgumentError(f"stop strings must be non-empty text, got {s!r}")
    return stop


# ------------------------------------------------------------------ text


class TextGeneration:
    """Continuations of prompts, as text: iterate for (row, piece) as tokens arrive.

    Rows are prompt-major, num_samples each. A row ends at <|endoftext|>, just before the
    first stop string, or after max_new_tokens. `model` is a `GPT2`, or a
    `gpt2.reference.ReferenceModel` (the NumPy engine: no cache, slow). An empty prompt
    starts from <|endoftext|>, as GPT-2's unconditional samples do (with a warning).
    """

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        prompts: str | Sequence[str],
        *,
        max_new_tokens: int = 50,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        num_samples: int = 1,
        stop: str | Sequence[str] | None = None,
        on_overflow: str = "slide",
    ):
        from gpt2.reference import ReferenceModel

        check_max_new_tokens(max_new_tokens)
        self.sampling = Sampling(temperature, top_k, top_p)
        self.sampling.check(model.config.n_vocab)
        positive_int("num_samples", num_samples)
        self.stop = check_stop(stop)
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompt_list:
            raise InvalidArgumentError("no prompts: give at least one")
        self.prompt_ids: list[list[int]] = []
        for prompt in prompt_list:
            if not isinstance(prompt, str):
                raise InputTypeError(f"prompts must be str, got {type(prompt).__name__}")
            ids = tokenizer.encode(prompt)
            if not ids:
                warnings.warn("empty prompt: generating from <|endoftext|>, as GPT-2's unconditional samples do",
                              EmptyPromptWarning, stacklevel=2)  # fmt: skip
                ids = [tokenizer.eot_token]
            self.prompt_ids += [ids] * num_samples
        check_prompts(self.prompt_ids, model.config.n_vocab)
        ids = self.prompt_ids
        engine = NumpyEngine(model, ids) if isinstance(model, ReferenceModel) else TorchEngine(model, ids, max_new_tokens)
        # checks the seed and the context now, so that errors come before any output
        self.steps = generate_tokens(engine, [len(p) for p in ids], model.config.n_ctx, max_new_tokens,
                                     self.sampling, seed, on_overflow)  # fmt: skip
        self.tokenizer = tokenizer
        self.tokens_generated = 0  # sampling steps taken, counted per row

    def __iter__(self) -> Iterator[tuple[int, str]]:
        rows = [_TextRow(self.tokenizer, self.stop) for _ in self.prompt_ids]
        steps = self.steps
        with torch.inference_mode():
            for tokens in steps:
                for b, token in enumerate(tokens.tolist()):
                    if rows[b].done:
                        continue
                    self.tokens_generated += 1
                    if piece := rows[b].add(token):
                        yield b, piece
                if all(row.done for row in rows):
                    break
        for b, row in enumerate(rows):
            if piece := row.finish():
                yield b, piece


def generate_text(model, tokenizer: Tokenizer, prompts: str | Sequence[str], **options) -> list[str]:
    """The continuations of `prompts`, without the prompts: one string per row (see TextGeneration)."""
    generation = TextGeneration(model, tokenizer, prompts, **options)
    texts = [""] * len(generation.prompt_ids)
    for row, piece in generation:
        texts[row] += piece
    return texts


def stream_text(model, tokenizer: Tokenizer, prompt: str, **options) -> Iterator[str]:
    """Yield the continuation of one prompt piece by piece as tokens arrive.

    No piece ends in half a UTF-8 character, and text that could be the start of a stop
    string is held back until it is known not to be one. Options: see TextGeneration (one
    sample only: TextGeneration itself streams several, as (row, piece)).
    """
    if not isinstance(prompt, str):
        raise InputTypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if options.get("num_samples", 1) != 1:
        raise InvalidArgumentError(
            "stream_text streams one continuation (num_samples=1); for several, iterate "
            "TextGeneration(..., num_samples=N), which yields (row, piece), or call generate_text"
        )
    for _, piece in TextGeneration(model, tokenizer, prompt, **options):
        yield piece


class _TextRow:
    """One continuation's text: decodes incrementally and watches for the end."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.decoder = IncrementalDecoder(tokenizer)
        self.held = ""  # decoded text not yet given out: it may begin a stop string
        self.done = False

    def add(self, token: int) -> str:
        """Text that token completes and that is safe to give out ("" once the row has ended)."""
        if self.done:
            return ""
        if token == self.tokenizer.eot_token:
            return self.finish()
        self.held += self.decoder.add([token])
        return self._release()

    def finish(self) -> str:
        """The text still held back; the row ends."""
        if self.done:  # ended at a stop string: nothing more to give
            return ""
        self.done = True
        text, self.held = self._cut_at_stop(self.held + self.decoder.flush()), ""
        return text

    def _cut_at_stop(self, text: str) -> str:
        cut = min((i for s in self.stop if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.done = True
            return text[:cut]
        return text

    def _release(self) -> str:
        text = self._cut_at_stop(self.held)
        if self.done:
            self.held = ""
            return text
        # keep back the longest tail that is the beginning of some stop string
        keep = max((k for s in self.stop for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

"""Choosing tokens: decoding (greedy, temperature, top-k, top-p), speculative decoding's
acceptance rule, and seeds.

The token loop that calls these, one row at a time with its own settings, is `decoding`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gpt2._checks import check_top_k, int_between, is_real
from gpt2.errors import InputTypeError, InvalidArgumentError

# ------------------------------------------------------------------ decoding


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. temperature 0 is greedy (the most likely token);
    top_k keeps the k most likely tokens; top_p keeps the smallest set whose probability
    reaches p. Filters apply in that order, to the distribution after temperature.

    Each setting is checked as the Sampling is made, at whichever door it came in by (a call,
    a flag, a request's body), and travels inward checked: only top_k's bound, the model's
    vocabulary, waits for a model (`check_vocab`)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not is_real(self.temperature) or self.temperature < 0:
            raise InvalidArgumentError(
                f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature!r}", "temperature"
            )
        if self.top_k is not None:
            check_top_k(self.top_k, None)
        if self.top_p is not None and (not is_real(self.top_p) or not 0 < self.top_p <= 1):
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")

    def check_vocab(self, n_vocab: int) -> None:
        """Raise unless top_k is at most `n_vocab`, the tokens of the model that samples (all of them: no filter)."""
        if self.top_k is not None:
            check_top_k(self.top_k, n_vocab)


def sampling_of(
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, sampling: Sampling | None = None
) -> Sampling:
    """The Sampling of a call that takes either the three settings or a `sampling` made already
    (by a caller that checked them before a model loaded, as `gpt2 generate` does), not both."""
    if sampling is None:
        return Sampling(temperature, top_k, top_p)
    if not isinstance(sampling, Sampling):
        raise InputTypeError(
            f"sampling must be a gpt2.generation.sampling.Sampling, got {type(sampling).__name__}", "sampling"
        )
    if (temperature, top_k, top_p) != (1.0, None, None):
        raise InvalidArgumentError("give sampling, or temperature, top_k and top_p, not both", "sampling")
    return sampling


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


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution `sample_next` draws from: (B, V) logits -> (B, V) probabilities, after
    temperature, top-k and top-p. Temperature 0 puts all of it on the most likely token (the
    lowest id among equal maxima, as torch's argmax picks)."""
    if sampling.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
    return torch.softmax(filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p), dim=-1)


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row: (B, V) logits -> (B,) ids."""
    if sampling.temperature == 0:  # the first of equal maxima: the lowest id
        if (
            logits.device.type == "cpu" and logits.dtype == torch.float32
        ):  # NumPy's is vectorised: 5 us to torch's 45 here
            return torch.from_numpy(logits.detach().numpy().argmax(-1))
        return logits.argmax(-1)
    return torch.multinomial(probabilities(logits, sampling), 1, generator=generator).squeeze(-1)


def row_probabilities(logits: torch.Tensor, samplings: Sequence[Sampling]) -> torch.Tensor:
    """`probabilities` of each row of logits (N, V) under its own settings, samplings[n]: one
    call for each distinct setting, not one a row."""
    groups: dict[Sampling, list[int]] = {}
    for n, sampling in enumerate(samplings):
        groups.setdefault(sampling, []).append(n)
    if len(groups) == 1:
        return probabilities(logits, samplings[0])
    probs = torch.empty(logits.shape, dtype=torch.float32)
    for sampling, rows in groups.items():
        probs[rows] = probabilities(logits[rows], sampling)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token from probabilities (V,); a certain one (greedy, top_k 1) without a random draw."""
    values = probs.numpy()  # a view: NumPy reads a value for 0.1 us, torch for 5
    top = int(values.argmax())
    return top if values[top] >= 1 else int(torch.multinomial(probs, 1, generator=generator))


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Speculative sampling's rule (Leviathan et al. 2023; Chen et al. 2023): which of k draft
    tokens to keep, and the token after them, so that the tokens follow the target's distribution
    exactly, whatever the draft's.

    p (k+1, V): the target's distributions at each draft token and after the last; q (k, V): the
    draft's, from which drafts[i] was drawn. Draft i is kept with probability min(1, p_i/q_i) of
    its token; at the first refused, the token comes from the residual max(0, p_i - q_i),
    normalised; if all k are kept, from p_k. Returns (drafts kept, the token after them). Where
    p and q are one-hot (greedy), this keeps the drafts that are the target's argmax and gives
    its argmax after them, with no random draw.
    """
    p_values, q_values = p.numpy(), q.numpy()  # views, read a value at a time
    for i, token in enumerate(drafts):
        target, proposed = p_values[i, token], q_values[i, token]
        if target >= proposed:  # kept for certain: no draw
            continue
        if target > 0 and float(torch.rand((), generator=generator)) * proposed < target:  # u < p/q
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = float(residual.sum())
        return i, draw(residual / total if total > 0 else p[i], generator)  # total 0 only by rounding
    return len(drafts), draw(p[len(drafts)], generator)


# ------------------------------------------------------------------ seeds

SEED_MAX = 2**64 - 1
_MT_N = 624  # the Mersenne Twister's state: 624 words of 32 bits
_TORCH_STATE_BYTES = 5056  # torch's CPU generator state, as get_state() gives it


def check_seed(seed: int) -> int:
    """A seed as a caller gives it: a whole number from 0 to SEED_MAX."""
    return int_between("seed", seed, 0, SEED_MAX, "a whole number")


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator whose random stream depends on all 64 bits of `seed` (0 .. 2**64 - 1).

    torch seeds its CPU generator, a Mersenne Twister, from the low 32 bits alone, so seeds 0,
    2**32 and 2**63 would sample the same text. Below 2**32 this is torch's own seeding (the same
    stream as torch.manual_seed); from 2**32 up, the twister's state comes from both 32-bit
    halves through the reference `init_by_array`, as NumPy's and Python's twisters seed.
    The seed is checked (`check_seed`) where it came in, as a request's (`gpt2.generation.decoding.Request.build`).
    """
    generator = torch.Generator()
    if seed < 2**32:
        return generator.manual_seed(seed)
    state = bytearray(generator.get_state().numpy().tobytes())
    if len(state) != _TORCH_STATE_BYTES:
        raise InvalidArgumentError(
            f"seeds from 2**32 up need torch's CPU generator state of {_TORCH_STATE_BYTES} bytes; "
            f"this torch's has {len(state)}: use a seed below 2**32",
            "seed",
        )
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

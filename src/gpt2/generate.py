"""Text generation: prompts in, text out, streamed as tokens arrive.

The text API (`generate_text`, `stream_text`, `TextGeneration`) and the `gpt2 generate`
command encode the prompts, run the token loop of `gpt2.sampling` on an engine (the torch
model with its KV cache, `gpt2.model.TorchEngine`, or the NumPy reference engine here),
and decode the tokens as they come, holding back half characters and possible stop strings.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from gpt2._checks import positive_int
from gpt2.errors import InputTypeError, InvalidArgumentError
from gpt2.model import TorchEngine
from gpt2.reference import ReferenceModel
from gpt2.sampling import Sampling, check_max_new_tokens, check_prompts, generate_tokens
from gpt2.tokenizer import IncrementalDecoder, Tokenizer


class EmptyPromptWarning(UserWarning):
    """An empty prompt: generation starts from <|endoftext|>, as GPT-2's unconditional samples do."""


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
            if not ids and tokenizer.eot_token is None:  # a character vocabulary has no <|endoftext|>
                raise InvalidArgumentError("empty prompt: this model's vocabulary has no <|endoftext|> to start from; give a prompt")
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

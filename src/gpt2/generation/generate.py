"""Text generation: prompts in, text out, streamed as tokens arrive.

The text API (`generate_text`, `stream_text`, `TextGeneration`; `Chat`, a conversation through
a chat template) and the `gpt2 generate` and `gpt2 chat` commands encode the prompts, run the
token loop of `decoding` on an engine (the torch model with its KV cache,
`engines.TorchEngine`, or `engines.NumpyEngine`), and decode the tokens as they
come, holding back half characters and possible stop strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import AbstractSet, Literal

import torch

from gpt2._checks import int_between, positive_int
from gpt2.errors import ContextLengthError, GPT2Warning, InputTypeError, InvalidArgumentError, warn
from gpt2.generation.decoding import (
    STOP,
    Decoder,
    Request,
    Row,
    check_draft_tokens,
    finish_reasons,
    row_seed,
    start_of_text,
)
from gpt2.generation.engines import NumpyEngine, check_draft
from gpt2.generation.lookup import lookup_of
from gpt2.generation.processors import Constraint, processing_of
from gpt2.generation.sampling import Sampling, check_seed, sampling_of
from gpt2.reference import ReferenceModel
from gpt2.settings import CHAT_MAX_NEW_TOKENS, DRAFT_TOKENS, LOOKUP_MAX, LOOKUP_MIN, MAX_NEW_TOKENS
from gpt2.tokenizer import IncrementalDecoder, Tokenizer
from gpt2.tokenizer.chat import HOW_TO_ADD, ChatTemplate, ReplyText, special_token_names


class EmptyPromptWarning(GPT2Warning):
    """An empty prompt: generation starts from <|endoftext|>, as GPT-2's unconditional samples do."""


def check_stop(stop: str | Sequence[str] | None) -> list[str]:
    """Stop strings as a list: None (or an empty list) for none, one str, or several."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    try:
        stop = list(stop)
    except TypeError:
        raise InputTypeError(f"stop must be a str, a list of str, or None, got {type(stop).__name__}", "stop") from None
    for s in stop:
        if not isinstance(s, str) or s == "":
            raise InvalidArgumentError(f"stop strings must be non-empty text, got {s!r}", "stop")
    return stop


# ------------------------------------------------------------------ text


class TextGeneration:
    """Continuations of prompts, as text: iterate for (row, piece) as tokens arrive.

    Rows are prompt-major, num_samples each. A row ends at <|endoftext|>, just before the
    first stop string, or after max_new_tokens. `model` is a `GPT2`, or a
    `gpt2.reference.ReferenceModel` (the NumPy engine: no cache, slow). An empty prompt
    starts from <|endoftext|>, as GPT-2's unconditional samples do (with a warning).
    Sampling is temperature, top_k and top_p, or a `sampling` made already in their place.
    With a `draft` model (of the same tokenizer: see `GPT2.generate`), decoding is speculative:
    it proposes `draft_tokens` tokens a step, which `model` verifies in one pass; speculative="ngram"
    drafts as many from each row's own earlier tokens instead (prompt lookup: `lookup`), the
    last prompt_lookup_max down to prompt_lookup_min tokens matched.
    A `constraint` (`processors.Constraint`: a JSON schema, any JSON object, a regex, a
    choice, a grammar) holds every row's text to it; logit_bias (token id -> bias from -100 to
    100), frequency_penalty and presence_penalty (OpenAI's, from -2 to 2) and repetition_penalty
    (transformers') bend each row's scores before it samples (`processors`).
    `allowed_special` is the tokenizer's: "all" (the default) reads <|endoftext|> written in a
    prompt as the special token, as OpenAI's API, `gpt2 generate` and `gpt2 serve` do;
    frozenset() reads it as its characters (any token not allowed is text here, never the
    error `Tokenizer.encode` raises by default).
    `steer` ({block: vector (C,)}) adds each vector to the residual stream leaving its block, at every
    position of the prompt and of the text generated (`GPT2.steered`; a feature's decoder direction:
    `gpt2.inspect.steering_vector`).
    """

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        prompts: str | Sequence[str],
        *,
        max_new_tokens: int = MAX_NEW_TOKENS,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        sampling: Sampling | None = None,
        seed: int | None = None,
        num_samples: int = 1,
        stop: str | Sequence[str] | None = None,
        on_overflow: str = "slide",
        allowed_special: AbstractSet[str] | Literal["all"] = "all",
        draft=None,
        draft_tokens: int = DRAFT_TOKENS,
        speculative: str | None = None,
        prompt_lookup_max: int = LOOKUP_MAX,
        prompt_lookup_min: int = LOOKUP_MIN,
        constraint: Constraint | None = None,
        logit_bias: dict[int, float] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        steer: Mapping[int, torch.Tensor] | None = None,
    ):
        self.stop = check_stop(stop)
        self.model, self.steer = model, steering_of(model, steer)
        if draft is not None:
            check_draft(model, draft, tokenizer)
        self.draft_tokens = check_draft_tokens(draft_tokens)
        self.lookup = lookup_of(speculative, prompt_lookup_max, prompt_lookup_min, draft)
        processing = processing_of(
            tokenizer, constraint, logit_bias, frequency_penalty, presence_penalty, repetition_penalty
        )
        prompt_list = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompt_list:
            raise InvalidArgumentError("no prompts: give at least one", "prompt")
        self.sampling = sampling_of(temperature, top_k, top_p, sampling)
        request = Request.build(
            [self._encode(tokenizer, prompt, allowed_special) for prompt in prompt_list],
            max_new_tokens,
            n_vocab=model.config.n_vocab,
            n_ctx=model.config.n_ctx,
            sampling=self.sampling,
            seed=seed,
            n=num_samples,
            n_param="num_samples",
            eos_token_id=tokenizer.eot_token,
            on_overflow=on_overflow,
            processing=processing,
        )
        # the engines (and the memory they need) before the rows, so that errors come before any row is made
        self.engine = engine_for(model, request)
        self.draft = None if draft is None else engine_for(draft, request)
        self.stats = None  # the decoder's DraftStats, once it runs
        self.rows = request.rows()
        self.prompt_ids = [row.prompt for row in self.rows]  # prompt-major
        self.texts = [TextRow(tokenizer, self.stop) for _ in self.rows]
        self.tokens_generated = 0  # tokens chosen, counted per row until its text ends

    @staticmethod
    def _encode(tokenizer: Tokenizer, prompt: str, allowed_special: AbstractSet[str] | Literal["all"]) -> list[int]:
        """A prompt's ids; an empty one is <|endoftext|>, where the vocabulary has it."""
        if not isinstance(prompt, str):
            raise InputTypeError(f"prompts must be str, got {type(prompt).__name__}", "prompt")
        ids = tokenizer.encode(prompt, allowed_special=allowed_special, disallowed_special=())  # the rest is text
        if not ids and tokenizer.eot_token is not None:
            warn("empty prompt: generating from <|endoftext|>, as GPT-2's unconditional samples do", EmptyPromptWarning)
        return start_of_text(ids, tokenizer.eot_token)

    @property
    def finish_reasons(self) -> list[str | None]:
        """Why each row ended: "stop" (<|endoftext|> or a stop string) or "length"; None while
        its text is not all given out."""
        return [row.finish_reason if text.done else None for row, text in zip(self.rows, self.texts)]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        texts = self.texts
        decoder = Decoder(self.engine, draft=self.draft, draft_tokens=self.draft_tokens, lookup=self.lookup)
        self.stats = decoder.stats
        for b, row, token, reason in row_events(decoder, self.rows, self.model, self.steer):
            if token is not None and not texts[b].done:
                self.tokens_generated += 1
            piece = texts[b].follow(token, reason is not None)
            if texts[b].stopped:  # "stop", even if this was its last token
                row.finish_reason = STOP
            if piece:
                yield b, piece


def row_events(
    decoder: Decoder, rows: list[Row], model=None, steer: dict[int, torch.Tensor] | None = None
) -> Iterator[tuple[int, Row, int | None, str | None]]:
    """`rows` through the token loop of `decoder`, an event at a time: (the row's index in `rows`, the
    row, its new token or None, why it ended or None). TextGeneration's and TokenGeneration's one loop;
    with `steer`, `model` steered throughout (`GPT2.steered`)."""
    index = {row: b for b, row in enumerate(rows)}
    for row in rows:
        decoder.add(row)
    with torch.inference_mode(), model.steered(steer) if steer else nullcontext():
        while decoder.busy:
            events = decoder.step()
            for (row, token), reason in zip(events, finish_reasons(events)):
                yield index[row], row, token, reason


def steering_of(model, steer: Mapping[int, torch.Tensor] | None) -> dict[int, torch.Tensor]:
    """A generation's steering vectors, checked by the model (`GPT2.check_steering`); none on the NumPy engine."""
    if not steer:
        return {}
    if isinstance(model, ReferenceModel):
        raise InvalidArgumentError("steer: the NumPy engine runs no steering; use the torch engine", "steer")
    return model.check_steering(steer)


def engine_for(model, request: Request):
    """The engine a request's rows run on: the model's own (its KV cache for the request's slots, made
    now, so that a lack of memory is said before any row is made), or the NumPy engine's."""
    if isinstance(model, ReferenceModel):
        return NumpyEngine(model, request.slots)
    return model.engine(
        request.slots,
        request.longest + request.max_new_tokens,
        hint="generate fewer samples at once: a smaller num_samples",
        param="num_samples",
    )


class TokenGeneration:
    """Continuations of prompts of token ids, as token ids: iterate for (row, id) as they arrive.

    The token loop's door for ids, as `TextGeneration` is its door for text (and `GPT2.generate`
    gives ids once all are made): for a model that comes with no tokenizer, and `gpt2 generate
    --ids`. Rows are prompt-major, num_samples each; a row ends at eos_token_id (its id given out
    too; None: only after max_new_tokens). Sampling, seeds, the draft model or prompt lookup,
    logit_bias and the penalties as TextGeneration takes them; no constraint (that is text)."""

    def __init__(
        self,
        model,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = MAX_NEW_TOKENS,
        sampling: Sampling | None = None,
        seed: int | None = None,
        num_samples: int = 1,
        eos_token_id: int | None = None,
        on_overflow: str = "slide",
        draft=None,
        draft_tokens: int = DRAFT_TOKENS,
        speculative: str | None = None,
        prompt_lookup_max: int = LOOKUP_MAX,
        prompt_lookup_min: int = LOOKUP_MIN,
        logit_bias: dict[int, float] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        steer: Mapping[int, torch.Tensor] | None = None,
    ):
        self.model, self.steer = model, steering_of(model, steer)
        if draft is not None:
            check_draft(model, draft)
        self.draft_tokens = check_draft_tokens(draft_tokens)
        self.lookup = lookup_of(speculative, prompt_lookup_max, prompt_lookup_min, draft)
        processing = processing_of(None, None, logit_bias, frequency_penalty, presence_penalty, repetition_penalty)
        request = Request.build(
            [list(prompt) for prompt in prompts],
            max_new_tokens,
            n_vocab=model.config.n_vocab,
            n_ctx=model.config.n_ctx,
            sampling=sampling_of(1.0, None, None, sampling),
            seed=seed,
            n=num_samples,
            n_param="num_samples",
            eos_token_id=eos_token_id,
            on_overflow=on_overflow,
            processing=processing,
        )
        self.engine = engine_for(model, request)  # before the rows, as TextGeneration's
        self.draft = None if draft is None else engine_for(draft, request)
        self.rows = request.rows()
        self.ended = [False] * len(self.rows)
        self.tokens_generated = 0

    @property
    def finish_reasons(self) -> list[str | None]:
        """Why each row ended: "stop" (eos_token_id) or "length"; None while it goes on."""
        return [row.finish_reason if ended else None for row, ended in zip(self.rows, self.ended)]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        decoder = Decoder(self.engine, draft=self.draft, draft_tokens=self.draft_tokens, lookup=self.lookup)
        for b, _, token, reason in row_events(decoder, self.rows, self.model, self.steer):
            self.ended[b] = self.ended[b] or reason is not None
            if token is not None:
                self.tokens_generated += 1
                yield b, token


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
        raise InputTypeError(f"prompt must be a str, got {type(prompt).__name__}", "prompt")
    if options.get("num_samples", 1) != 1:
        raise InvalidArgumentError(
            "stream_text streams one continuation (num_samples=1); for several, iterate "
            "TextGeneration(..., num_samples=N), which yields (row, piece), or call generate_text"
        )
    for _, piece in TextGeneration(model, tokenizer, prompt, **options):
        yield piece


class TextRow:
    """One continuation's text: decodes incrementally and watches for the end."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.decoder = IncrementalDecoder(tokenizer)
        self.held = ""  # decoded text not yet given out: it may begin a stop string
        self.done = False
        self.stopped = False  # ended at a stop string

    def follow(self, token: int | None, ended: bool) -> str:
        """The text that a row's new token (None: none) releases; once the row has `ended`, all
        the rest. (After a stop string, `stopped` tells its owner to end the row.)"""
        piece = "" if token is None else self.add(token)
        if ended and not self.done:
            piece += self.finish()
        return piece

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
            self.done = self.stopped = True
            return text[:cut]
        return text

    def _release(self) -> str:
        text = self._cut_at_stop(self.held)
        if self.done:
            self.held = ""
            return text
        # keep back the longest tail that is the beginning of some stop string
        keep = max(
            (k for s in self.stop for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])), default=0
        )
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


# ------------------------------------------------------------------ conversations


def chat_max_new_tokens(max_new_tokens: int | None, n_ctx: int) -> int:
    """A chat reply's longest length: as given, below the context (the conversation needs a token at
    least); None: CHAT_MAX_NEW_TOKENS, or half the context where that is less."""
    if max_new_tokens is None:
        return max(1, min(CHAT_MAX_NEW_TOKENS, n_ctx // 2))
    positive_int("max_new_tokens", max_new_tokens)
    return int_between(
        "max_new_tokens", max_new_tokens, 1, n_ctx - 1, f"a number of tokens below the model's context ({n_ctx}), i.e."
    )


class Chat:
    """A conversation with a model: its history (`messages`), each reply streamed as it is
    generated (`reply`), then kept in the history as the assistant's message.

    The prompt is the history rendered by the chat template (`chat_template`: a `ChatTemplate`
    or its Jinja2 source; None, the tokenizer's own) with the generation prompt, as
    /v1/chat/completions renders it. A reply ends at <|endoftext|> or after max_new_tokens;
    its text is what follows the template's own prefix (`ChatTemplate.reply_prefix`). Where the
    history and a reply of max_new_tokens no longer fit the context, the oldest turns are left
    out (the system message kept; `dropped` says how many messages); a message that does not fit
    alone is a ContextLengthError. max_new_tokens defaults to CHAT_MAX_NEW_TOKENS, or half the
    model's context where that is less (the other half holds the conversation); one that leaves
    no room for a conversation, or a system message that does not fit with a reply, is refused
    here. Reply k (from 0) samples from seed + k, so a seeded conversation can be had again.
    Sampling is temperature, top_k and top_p, or a `sampling` made already in their place.
    """

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        *,
        chat_template: ChatTemplate | str | None = None,
        system: str | None = None,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        sampling: Sampling | None = None,
        seed: int | None = None,
    ):
        source = tokenizer.chat_template if chat_template is None else chat_template
        if source is None:
            raise InvalidArgumentError(
                f"the model's tokenizer has no chat template, so it cannot hold a conversation: {HOW_TO_ADD}",
                "chat_template",
            )
        self.template = (
            source if isinstance(source, ChatTemplate) else ChatTemplate(source, "the model's chat template")
        )
        if system is not None and not isinstance(system, str):
            raise InputTypeError(f"system must be a str or None, got {type(system).__name__}", "system")
        sampling = sampling_of(temperature, top_k, top_p, sampling)
        sampling.check_vocab(model.config.n_vocab)  # here, not at the first reply
        self.options = {"max_new_tokens": chat_max_new_tokens(max_new_tokens, model.config.n_ctx), "sampling": sampling}
        self.seed = None if seed is None else check_seed(seed)
        self.model, self.tokenizer, self.system = model, tokenizer, system
        self._check_system()
        self.prefix = self.template.reply_prefix(tokenizer)
        self.replies = 0  # replies begun: the next samples from seed + replies
        self.dropped = 0  # messages left out of the last reply's prompt, the oldest, to fit the context
        self.finish_reason: str | None = None  # the last reply's: "stop" (<|endoftext|>) or "length"
        self.reset()

    def _check_system(self) -> None:
        """The system message, with an empty message and a reply, must fit the context: else no message would."""
        if self.system is None:
            return
        n_ctx, room = self.model.config.n_ctx, self.options["max_new_tokens"]
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": ""}]
        length = len(self.tokenizer.encode(self._prompt(messages), allowed_special="all"))
        if length + room > n_ctx:
            raise ContextLengthError(
                f"system does not fit: with it and an empty message the conversation is {length:,} tokens, "
                f"and a reply of up to {room:,} tokens makes {length + room - n_ctx:,} more than the model's "
                f"context of {n_ctx:,}: give a shorter system message, or a lower max_new_tokens",
                "system",
                ("max_new_tokens",),
            )

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages: list[dict[str, str]] = (
            [] if self.system is None else [{"role": "system", "content": self.system}]
        )

    def reply(self, text: str) -> Iterator[str]:
        """The reply to the user's `text`, piece by piece (the context is fitted now: errors come
        before the first piece). Once the reply has ended, it and `text` join the history; a reply
        stopped before (the iterator closed, Ctrl-C) leaves the history as it was."""
        if not isinstance(text, str):
            raise InputTypeError(f"a message must be a str, got {type(text).__name__}", "text")
        messages = self._fit([*self.messages, {"role": "user", "content": text}])
        seed = row_seed(self.seed, self.replies)
        self.replies += 1
        return self._stream(messages, seed)

    def _prompt(self, messages: list[dict[str, str]]) -> str:
        """The history as the model reads it; encoded with special tokens, these are ChatTemplate.encode's ids."""
        return self.template.render(messages, add_generation_prompt=True, **special_token_names(self.tokenizer))

    def _fit(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The history less its oldest turns, until it and a reply of max_new_tokens fit the context."""
        first = int(messages[0]["role"] == "system")
        n_ctx, room, kept = self.model.config.n_ctx, self.options["max_new_tokens"], list(messages)
        while (length := len(self.tokenizer.encode(self._prompt(kept), allowed_special="all"))) + room > n_ctx:
            if len(kept) - first == 1:
                raise ContextLengthError(
                    f"the message does not fit: the conversation is {length:,} tokens with it alone, and a reply "
                    f"of up to {room:,} tokens makes {length + room - n_ctx:,} more than the model's context of "
                    f"{n_ctx:,}: send a shorter message, or give a lower max_new_tokens",
                    "max_new_tokens",
                )
            del kept[first]  # the oldest turn: a message, and the replies that answered it
            while kept[first]["role"] == "assistant":
                del kept[first]
        self.dropped = len(messages) - len(kept)
        return kept

    def _stream(self, messages: list[dict[str, str]], seed: int | None) -> Iterator[str]:
        generation = TextGeneration(
            self.model, self.tokenizer, self._prompt(messages), seed=seed, on_overflow="error", **self.options
        )
        reply, said = ReplyText(self.prefix), ""
        for _, piece in generation:
            piece = reply.add(piece)
            said += piece
            if piece:
                yield piece
        rest = reply.add("", ended=True)
        if rest:
            said += rest
            yield rest
        self.finish_reason = generation.finish_reasons[0]
        self.messages = [*messages, {"role": "assistant", "content": said}]

"""What a row may say, and how its next token's scores are bent before it chooses: structured
outputs (a JSON schema, any JSON object, a regular expression, a choice among strings, a
grammar), OpenAI's logit_bias, frequency and presence penalties, and transformers' repetition
penalty. Each row carries its own state (`RowProcess`), so rows of different constraints,
biases and penalties decode side by side in one batch.

    for a row, before it chooses:                          # logits (V,), the model's
        scores = logits + logit_bias                       # OpenAI's: -100 bans, +100 forces
        scores[seen] = scores / r where > 0, else * r      # transformers' repetition_penalty r, prompt and new tokens
        scores -= count * frequency_penalty + (count > 0) * presence_penalty  # new tokens' counts (OpenAI's, vLLM's)
        scores[not allowed] = -inf                         # the constraint's mask at the row's state
        then temperature, top-k, top-p (`sampling`)

Constraints are compiled by llguidance (the `structured` extra), the engine behind vLLM's
"guidance" backend and llama.cpp's: it reads each token's bytes, so it sees the byte-level
GPT-2 vocabulary, and a character vocabulary, exactly. A grammar is Lark (llguidance's
dialect) or llama.cpp's GBNF. JSON is written without free whitespace: ", " between items and
": " after keys, as `json.dumps` writes it, so a schema whose strings, numbers and arrays are
bounded has a longest document, and no row spends its tokens on spaces. A compiled constraint
is kept per tokenizer and constraint (`compile_constraint`), and each row starts from a copy.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gpt2._checks import check_token_ids, is_integer, is_real, require_package
from gpt2._files import read_text
from gpt2.errors import GPT2Error, InputTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from gpt2.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The structured outputs a row can be held to, by their names in OpenAI's and vLLM's APIs.
CONSTRAINTS = ("json_schema", "json_object", "regex", "choice", "grammar")
# JSON as json.dumps writes it: no whitespace but these separators (vLLM's disable_any_whitespace, with json.dumps'
# separators)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
BIAS_LIMIT = 100.0  # OpenAI's logit_bias: from -100 to 100
PENALTY_LIMIT = 2.0  # OpenAI's frequency and presence penalties: from -2 to 2


@dataclass(frozen=True)
class Penalties:
    """OpenAI's logit_bias (token id -> a bias from -100 to 100, added to its logit),
    frequency_penalty and presence_penalty (from -2 to 2, over the tokens generated so far), and
    transformers' repetition_penalty (above 0; 1 is none). Checked as made; the ids against a
    model's vocabulary by `check_vocab`."""

    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not is_real(value) or not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise InvalidArgumentError(f"{name} must be a number from -2 to 2, got {value!r}", name)
        if not is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InvalidArgumentError(
                f"repetition_penalty must be a number above 0 (1 is none), got {self.repetition_penalty!r}",
                "repetition_penalty",
            )

    @classmethod
    def make(
        cls,
        logit_bias: Mapping[int, float] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
    ) -> Penalties:
        """Penalties from a dict of biases (OpenAI's logit_bias, its keys ids or their text)."""
        return cls(check_logit_bias(logit_bias), frequency_penalty, presence_penalty, repetition_penalty)

    @property
    def any(self) -> bool:
        return (
            bool(self.logit_bias)
            or self.frequency_penalty != 0
            or self.presence_penalty != 0
            or self.repetition_penalty != 1
        )

    def check_vocab(self, n_vocab: int) -> None:
        if self.logit_bias:
            ids = [token for token, _ in self.logit_bias]
            check_token_ids(min(ids), max(ids), n_vocab, " in logit_bias", param="logit_bias")


def check_logit_bias(logit_bias: Mapping[int, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias as (id, bias) pairs in order of id: keys are ids (or their decimal
    text, as JSON gives them), values numbers from -100 to 100."""
    if logit_bias is None:
        return ()
    if not isinstance(logit_bias, Mapping):
        raise InputTypeError(f"logit_bias must map token ids to biases, got {type(logit_bias).__name__}", "logit_bias")
    pairs = {}
    for key, bias in logit_bias.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if not is_integer(token) or token < 0:
            raise InvalidArgumentError(
                f"logit_bias keys must be token ids (whole numbers from 0), got {key!r}", "logit_bias"
            )
        if not is_real(bias) or not -BIAS_LIMIT <= bias <= BIAS_LIMIT:
            raise InvalidArgumentError(
                f"logit_bias values must be numbers from -100 to 100, got {bias!r} for token {token}", "logit_bias"
            )
        pairs[int(token)] = float(bias)
    return tuple(sorted(pairs.items()))


# ------------------------------------------------------------------ constraints


@dataclass(frozen=True)
class Constraint:
    """What a row's text must be: a JSON document of a schema ("json_schema", `value` the schema
    as JSON text), any JSON object ("json_object"), a match of a regular expression ("regex"),
    one of some strings ("choice", `value` a tuple), or a sentence of a grammar, Lark or GBNF
    ("grammar"). Make one with the class methods; its kind and value are checked as it is made,
    the constraint itself when compiled for a tokenizer (`compile_constraint`)."""

    kind: str
    value: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINTS:
            raise InvalidArgumentError(
                f"unknown constraint {self.kind!r}: the constraints are {', '.join(CONSTRAINTS)}", "constraint"
            )
        if self.kind == "json_object":
            return
        if self.kind == "choice":
            if not isinstance(self.value, tuple) or not self.value:
                raise InvalidArgumentError("choice needs at least one string to choose from", "choice")
            if not all(isinstance(s, str) and s for s in self.value):
                raise InvalidArgumentError(f"each choice must be non-empty text, got {self.value!r:.80}", "choice")
        elif not isinstance(self.value, str) or not self.value.strip():
            raise InvalidArgumentError(f"{self.kind} must be non-empty text, got {self.value!r:.80}", self.kind)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | bool) -> Constraint:
        """A JSON document valid against `schema` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(f"json_schema is not JSON: {e}", "json_schema") from None
        if not isinstance(schema, (Mapping, bool)):
            raise InvalidArgumentError(
                f"json_schema must be a JSON object (a schema), got {type(schema).__name__}", "json_schema"
            )
        return cls("json_schema", json.dumps(schema))  # its keys in order: properties come out in the order given

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Text that the regular expression matches, whole (Rust's regex syntax, as llguidance reads it)."""
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        """Exactly one of `options`."""
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise InvalidArgumentError(f"choice must be a list of strings, got {options!r:.80}", "choice")
        return cls("choice", tuple(options))

    @classmethod
    def grammar(cls, text: str) -> Constraint:
        """A sentence of a grammar: Lark (llguidance's dialect, `start:` its first rule) or llama.cpp's GBNF
        (`root ::=`)."""
        return cls("grammar", text)

    @classmethod
    def from_file(cls, kind: str, path: str | os.PathLike) -> Constraint:
        """A JSON schema ("json_schema") or a grammar ("grammar") read from a UTF-8 file."""
        text = read_text(Path(path), lambda message: InvalidArgumentError(f"{kind}: {message}", kind))
        return cls.json_schema(text) if kind == "json_schema" else cls(kind, text)

    def definition(self) -> str:
        """llguidance's grammar for this constraint (a compiler's error as an InvalidArgumentError naming the
        constraint)."""
        from llguidance import LLMatcher, grammar_from

        try:
            if self.kind in ("json_schema", "json_object"):
                schema = json.loads(self.value) if self.kind == "json_schema" else {"type": "object"}
                return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            if self.kind == "regex":
                return LLMatcher.grammar_from_regex(self.value)
            if self.kind == "choice":
                return grammar_from("choice", json.dumps(list(self.value)))
            return grammar_from("grammar", self.value)
        except (ValueError, TypeError) as e:
            raise InvalidArgumentError(f"{self.kind}: {one_line(str(e))}", self.kind) from None


def matcher_error(matcher) -> str:
    """llguidance's error, the line a person can act on; its whole report (the parser's state,
    the grammar) goes to the log ("gpt2.generation.processors", at DEBUG)."""
    report = matcher.get_error() or "unknown error"
    log.debug("llguidance: %s", report)
    return report.strip().splitlines()[0]


def one_line(message: str) -> str:
    """A compiler's message on one line, without the source lines and carets it points with."""
    return " ".join(
        line.strip() for line in message.splitlines() if line.strip() and not re.match(r"\s*(\^|\d+ \|)", line)
    )


def one_constraint(**given: object) -> Constraint | None:
    """The constraint among those given by kind (json_schema=..., regex=..., choice=..., grammar=...;
    json_object=True), where one is: two at once are an error naming both."""
    kinds = [kind for kind, value in given.items() if value not in (None, False)]
    if len(kinds) > 1:
        raise InvalidArgumentError(
            f"one constraint at a time: {kinds[0]} and {kinds[1]} were both given", kinds[0], (kinds[1],)
        )
    if not kinds:
        return None
    kind, value = kinds[0], given[kinds[0]]
    if isinstance(value, Constraint):
        return value
    makers = {
        "json_schema": Constraint.json_schema,
        "regex": Constraint.regex,
        "choice": Constraint.choice,
        "grammar": Constraint.grammar,
    }
    return Constraint.json_object() if kind == "json_object" else makers[kind](value)


def structured_package() -> None:
    """Raise MissingPackageError where llguidance, which compiles constraints, is not installed."""
    require_package("llguidance", "structured", "structured outputs need", "constraint")


class Compiled:
    """A constraint compiled for a tokenizer: a matcher at the start, which each row copies.
    A constraint whose text no token of the tokenizer can begin is refused here (`_refuse_unwritable`)."""

    def __init__(self, constraint: Constraint, tokenizer: Tokenizer):
        from llguidance import LLMatcher

        definition = constraint.definition()
        failed, messages = LLMatcher.validate_grammar_with_warnings(definition, ll_tokenizer(tokenizer))
        if failed:
            raise InvalidArgumentError(f"{constraint.kind}: {one_line(messages[0])}", constraint.kind)
        self.start = LLMatcher(ll_tokenizer(tokenizer), definition, log_level=0)
        if self.start.is_error():
            raise InvalidArgumentError(f"{constraint.kind}: {matcher_error(self.start)}", constraint.kind)
        self.n_tokens = tokenizer.n_vocab  # the tokenizer's ids: 0..n_tokens-1
        probe = self.matcher()
        probe.compute_bitmask()  # finds the dead end, if the text can begin with no token
        forced = b"" if probe.is_error() else probe.compute_ff_bytes()
        if probe.is_error() or not all(encodable(tokenizer, c) for c in forced.decode("utf-8", errors="ignore")):
            _refuse_unwritable(constraint, definition, tokenizer)

    def matcher(self):
        return self.start.deep_copy()


def _refuse_unwritable(constraint: Constraint, definition: str, tokenizer: Tokenizer) -> None:
    """Refuse, before any row starts, a constraint whose text no token of `tokenizer` can begin
    (a character vocabulary without "{" and any JSON), naming a character it lacks. The bytes
    the constraint's text must begin with (or, where it may begin several ways, its possible
    first bytes) are read off llguidance's matcher over single bytes, which every text has."""
    from llguidance import LLMatcher

    by_byte = LLMatcher(byte_tokenizer(), definition, log_level=0)
    forced = by_byte.compute_ff_bytes().decode("utf-8", errors="ignore")
    if forced:
        lacking = [c for c in forced if not encodable(tokenizer, c)]
        begins = f"must begin {forced!r}"
    else:  # several ways to begin: the first bytes allowed, each a character of its own
        bits = np.unpackbits(np.frombuffer(by_byte.compute_bitmask(), dtype=np.uint8), bitorder="little")[:128]
        lacking = [chr(b) for b in np.flatnonzero(bits) if not encodable(tokenizer, chr(b))]
        begins = "must begin with " + " or ".join(map(repr, lacking)) if lacking else "cannot begin"
    has = f"no {lacking[0]!r}" if len(lacking) == 1 or forced else "none of them" if lacking else "no token for it"
    raise InvalidArgumentError(
        f"{constraint.kind}: its text {begins}, and the model's vocabulary ({tokenizer.n_vocab} tokens) has {has}",
        constraint.kind,
    )


_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ll_tokenizer(tokenizer: Tokenizer):
    """llguidance's view of `tokenizer` (made once per tokenizer, 0.1 s for GPT-2's): every
    token's bytes; where the vocabulary has no <|endoftext|> (a character model's), a token past
    its last to end on, which no row ever chooses."""
    if tokenizer not in _ll_tokenizers:
        import llguidance

        _ll_tokenizers[tokenizer] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer)))
    return _ll_tokenizers[tokenizer]


def encodable(tokenizer: Tokenizer, text: str) -> bool:
    """Whether `tokenizer` has tokens for `text` (a character vocabulary may not)."""
    try:
        tokenizer.encode(text, disallowed_special=())
    except GPT2Error:
        return False
    return True


@functools.cache
def byte_tokenizer():
    """llguidance's tokenizer of the 256 bytes (and an end): what any text can be written in."""
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


class _Bytes:
    """A vocabulary of one token a byte, as llguidance's TokenizerWrapper reads one."""

    tokens = [bytes([b]) for b in range(256)] + [b"<|end|>"]
    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


class _Vocabulary:
    """A tokenizer as llguidance's TokenizerWrapper reads one."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokens = [tokenizer.decode_bytes([i]) for i in range(tokenizer.n_vocab)]
        end = tokenizer.eot_token
        if end is None:  # a token only to end on
            end = len(self.tokens)
            self.tokens.append(b"<|end of constraint|>")
        self.eos_token_id, self.bos_token_id, self.special_token_ids = end, None, [end]

    def __call__(self, text: bytes) -> list[int]:
        try:
            return self.tokenizer.encode(text.decode("utf-8", errors="replace"), disallowed_special=())
        except GPT2Error:  # a character the vocabulary lacks: llguidance then finds the tokens itself
            return []


_compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {constraint: Compiled}, oldest first
KEPT_CONSTRAINTS = 64  # compiled constraints kept per tokenizer


def compile_constraint(constraint: Constraint, tokenizer: Tokenizer) -> Compiled:
    """`constraint` compiled for `tokenizer`, kept for the next request of the same constraint
    (the 64 most recent): a schema is compiled once, however many rows and requests hold to it."""
    if not isinstance(constraint, Constraint):
        raise InputTypeError(
            f"constraint must be a gpt2.generation.processors.Constraint, got {type(constraint).__name__}", "constraint"
        )
    structured_package()
    kept = _compiled.setdefault(tokenizer, {})
    if constraint in kept:
        kept[constraint] = kept.pop(constraint)  # the most recent, last
    else:
        if len(kept) >= KEPT_CONSTRAINTS:
            del kept[next(iter(kept))]
        kept[constraint] = Compiled(constraint, tokenizer)
    return kept[constraint]


# ------------------------------------------------------------------ a row's state


@dataclass(frozen=True)
class Processing:
    """What bends a request's rows' scores: penalties, a compiled constraint, or both. Each row
    starts its own state (`start`)."""

    penalties: Penalties = Penalties()
    compiled: Compiled | None = None

    @property
    def any(self) -> bool:
        return self.penalties.any or self.compiled is not None

    def start(self, prompt: Sequence[int]) -> RowProcess | None:
        return RowProcess(self, prompt) if self.any else None


class RowProcess:
    """One row's scores at its state: its constraint's matcher (advanced token by token, rolled
    back where speculative decoding's drafts were refused), and the tokens its penalties count."""

    def __init__(self, processing: Processing, prompt: Sequence[int]):
        self.penalties = processing.penalties
        self.compiled = processing.compiled
        self.matcher = None if self.compiled is None else self.compiled.matcher()
        self.prompt_seen = torch.tensor(sorted(set(prompt)), dtype=torch.long)
        self._allowed: torch.Tensor | None = None  # the mask at the matcher's state, once computed

    def scores(self, logits: torch.Tensor, generated: Sequence[int]) -> torch.Tensor:
        """The scores (V,) the row chooses from, given the model's logits (V,) after `generated`,
        its new tokens (the matcher is at their end)."""
        penalties, scores = self.penalties, logits.float().clone()
        if penalties.logit_bias:
            ids, biases = zip(*penalties.logit_bias)
            scores[list(ids)] += torch.tensor(biases)
        new = torch.tensor(generated, dtype=torch.long)
        if penalties.repetition_penalty != 1:  # transformers' RepetitionPenaltyLogitsProcessor
            seen = torch.cat([self.prompt_seen, new]).unique()
            s = scores[seen]
            scores[seen] = torch.where(s < 0, s * penalties.repetition_penalty, s / penalties.repetition_penalty)
        if (penalties.frequency_penalty or penalties.presence_penalty) and len(new):
            counts = torch.bincount(new, minlength=len(scores))[: len(scores)].float()
            scores -= counts * penalties.frequency_penalty + (counts > 0).float() * penalties.presence_penalty
        if self.matcher is not None:
            allowed = self.allowed()
            scores[: len(allowed)].masked_fill_(~allowed, -math.inf)
            scores[len(allowed) :] = -math.inf  # ids past the tokenizer's (a padded vocabulary): never text
        return scores

    def allowed(self) -> torch.Tensor:
        """The tokens (bool, the tokenizer's ids) the constraint allows next."""
        if self._allowed is None:
            bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
            self._allowed = torch.from_numpy(
                np.unpackbits(bits, bitorder="little")[: self.compiled.n_tokens].astype(bool)
            )
        return self._allowed

    @property
    def finished(self) -> bool:
        """The constraint's text is complete: nothing may follow but its end (or no token at all)."""
        return self.matcher is not None and (self.matcher.is_stopped() or not bool(self.allowed().any()))

    def advance(self, token: int) -> None:
        """The row chose `token` (one the scores allowed)."""
        if self.matcher is not None:
            if not self.matcher.consume_token(token):
                raise InvalidArgumentError(
                    f"token {token} broke the constraint: {matcher_error(self.matcher)}", "constraint"
                )
            self._allowed = None

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Advance through as many of `tokens` as the constraint allows; returns how many (undo with `rollback`)."""
        if self.matcher is None:
            return len(tokens)
        n = self.matcher.try_consume_tokens(list(tokens))
        if n:
            self._allowed = None
        return n

    def rollback(self, n: int) -> None:
        if self.matcher is not None and n:
            self.matcher.rollback(n)
            self._allowed = None


def processing_of(
    tokenizer: Tokenizer,
    constraint: Constraint | None = None,
    logit_bias: Mapping[int, float] | None = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
) -> Processing | None:
    """A request's processing, checked (the constraint compiled for `tokenizer`); None where it has none."""
    penalties = Penalties.make(logit_bias, frequency_penalty, presence_penalty, repetition_penalty)
    compiled = None if constraint is None else compile_constraint(constraint, tokenizer)
    processing = Processing(penalties, compiled)
    return processing if processing.any else None

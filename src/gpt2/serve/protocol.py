"""The server's side of OpenAI's API: what a client may ask, declared once, and its errors.

Each route's JSON body is a pydantic model, as vLLM's protocol.py declares them: `CompletionBody`
(/v1/completions), `ChatBody` (/v1/chat/completions), `InspectBody` (/v1/inspect),
the circuits' `ScoresBody`, `HeadBody`, `PatchingBody`, `AttributionBody`, `GraphBody` and `FeatureBody`
(/v1/circuits/...), `TokenizeBody` and `DetokenizeBody`. Each field's type, default and bounds are
written once, in its declaration: FastAPI checks a body against them, and /openapi.json (and /docs) describe
them. A bound that is the server's, not the API's (the model's context, its vocabulary,
--max-n), is named by `UpTo` and checked by `Body.within` once the model is there. A refusal is
a `RequestError`, an HTTP status with OpenAI's error body naming the field, in the words each
field's `Says` gives; the parse functions turn a checked body into a `CompletionRequest`, the
rows of `gpt2.generation.decoding.Request` and how to answer.

A model that comes with no tokenizer (one trained on a vocabulary of its own) is served on token ids:
its tokenizer is None, a prompt of ids is read as any other, and what is text (a text prompt, stop
strings, a structured output, a conversation) is refused with a 400 saying that it needs one
(`needs_tokenizer`); a token is written "token_id:N" where its text would be (`token_name`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import AbstractSet, Annotated, ClassVar, Literal

import annotated_types
import torch
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gpt2._checks import check_token_ids, check_top_k, is_integer, positive_int
from gpt2.checkpoints.config import GPT2Config
from gpt2.errors import GPT2Error, InvalidArgumentError
from gpt2.generation.caches import KVCache, check_prefix_cache_mb
from gpt2.generation.decoding import Request, Row, check_draft_tokens, start_of_text
from gpt2.generation.generate import check_stop
from gpt2.generation.lookup import PromptLookup, lookup_of
from gpt2.generation.processors import (
    Constraint,
    Penalties,
    Processing,
    check_logit_bias,
    compile_constraint,
    one_constraint,
)
from gpt2.generation.sampling import SEED_MAX, Sampling
from gpt2.inspect.patching import AXES, SITES
from gpt2.settings import DRAFT_TOKENS, LOOKUP_MAX, LOOKUP_MIN
from gpt2.tokenizer import Tokenizer, token_text
from gpt2.tokenizer.chat import ROLES, check_messages

SERVED_SITES = tuple(site for site in SITES if AXES[site][0] == "layer")  # a grid a layer a row: the page draws them


@dataclass(frozen=True)
class Limits:
    """What one client may ask of a server, so that none can take it down (checked when made)."""

    max_batch_size: int = 8  # rows decoded together
    # tokens computed in one step, the rows decoding included (vLLM's max_num_batched_tokens):
    # prompts go in within it, a long one over several steps, so that streams keep flowing
    max_num_batched_tokens: int = 512
    # prompts' KV blocks kept for later prompts that begin the same way (0: none), least recently used out first
    prefix_cache_mb: int = 512
    max_queue: int = 64  # rows waiting for a slot; past it, 429
    max_n: int = 16  # choices of one request
    max_body_bytes: int = 1 << 20
    # attention probabilities in one /v1/inspect answer (n_layer x n_head x T x T): 2^22 are 170
    # tokens of the 124M model (59 of gpt2-xl), an answer of 27 MB made in 2.3 s on 2 CPU cores
    max_inspect_cells: int = 1 << 22
    # tokens that one /v1/circuits/patching request runs through the model (a run per patched
    # activation, each of the whole text): 2^14 is the 124M model's resid_pre grid up to 36 tokens
    max_patching_tokens: int = 1 << 14
    # tokens of one /v1/circuits/graph prompt, <|endoftext|> first included: the graph's matrix grows
    # with the square of its features, about n_layer x (features active a position) x tokens
    max_graph_tokens: int = 64
    # feature nodes of one graph (its most influential, found as circuit-tracer finds them): the matrix is
    # (features + (n_layer + 1) x tokens)^2 floats, 4096 features of the 124M model's 64 tokens 100 MB
    max_graph_features: int = 4096
    api_key: str | None = None
    draft_tokens: int = (
        DRAFT_TOKENS  # tokens a draft model (or prompt lookup) proposes per step, where the server speculates
    )
    speculative: str | None = (
        None  # "ngram": prompt lookup drafts, from each row's own tokens (`gpt2.generation.lookup`)
    )
    prompt_lookup_max: int = LOOKUP_MAX
    prompt_lookup_min: int = LOOKUP_MIN

    def __post_init__(self) -> None:
        self.check()

    @property
    def lookup(self) -> PromptLookup | None:
        return lookup_of(self.speculative, self.prompt_lookup_max, self.prompt_lookup_min)

    def check(self) -> None:
        for name in (
            "max_batch_size",
            "max_num_batched_tokens",
            "max_queue",
            "max_n",
            "max_body_bytes",
            "max_inspect_cells",
            "max_patching_tokens",
            "max_graph_tokens",
            "max_graph_features",
        ):
            positive_int(name, getattr(self, name))
        check_prefix_cache_mb(self.prefix_cache_mb)
        check_draft_tokens(self.draft_tokens)
        lookup_of(self.speculative, self.prompt_lookup_max, self.prompt_lookup_min)
        if self.max_num_batched_tokens < self.max_batch_size:
            raise InvalidArgumentError(
                f"max_num_batched_tokens must be at least max_batch_size ({self.max_batch_size}), as each "
                f"step decodes a token of every row; got {self.max_num_batched_tokens}",
                "max_num_batched_tokens",
                ("max_batch_size",),
            )
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InvalidArgumentError("api_key must be non-empty text", "api_key")

    def check_memory(self, config: GPT2Config, device: torch.device, dtype: torch.dtype) -> None:
        """Refuse a batch whose KV cache the device cannot hold: each row keeps one of the whole context."""
        KVCache.check_fits(config, self.max_batch_size, config.n_ctx, device, dtype, BATCH_HINT, "max_batch_size")


BATCH_HINT = "a smaller max_batch_size"


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error body naming the field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    @classmethod
    def invalid(cls, error: GPT2Error, where: str = "") -> RequestError:
        """A library error about a request as a 400 naming its field (`where` goes before the message)."""
        return cls(400, f"{where}{error}", error.param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def needs_tokenizer(needs: str, param: str | None, where: str = "") -> RequestError:
    """The 400 of a request that is text, to a model that comes with no tokenizer: `needs` says what of it needs
    one, and how to ask on token ids instead where there is a way ("stop strings need one: ...")."""
    return RequestError(400, f"{where}this model comes with no tokenizer, and {needs}", param, "tokenizer_required")


def token_name(tokenizer: Tokenizer | None, token: int) -> str:
    """A token as the API writes it where a text goes: its text (`token_text`: "bytes:\\xNN" for part of a
    character), or, for a model that comes with no tokenizer, "token_id:N", as vLLM's return_tokens_as_token_ids
    writes it."""
    return f"token_id:{token}" if tokenizer is None else token_text(tokenizer, token)


# ------------------------------------------------------------------ fields: their bounds and their words


@dataclass(frozen=True)
class Bounds:
    """The server's numbers that bound some fields (`UpTo`), known once the model has loaded."""

    n_ctx: int  # the model's context
    n_vocab: int  # its vocabulary
    max_n: int  # the server's --max-n
    last_layer: int = 0  # n_layer - 1: a block's number (/v1/circuits/head)
    last_head: int = 0  # n_head - 1


@dataclass(frozen=True)
class UpTo:
    """A field's upper bound that is the server's, not the API's: one of `Bounds` (which
    /openapi.json names as the field's "x-maximum")."""

    name: str

    def __get_pydantic_json_schema__(self, core_schema, handler) -> dict:
        schema = handler(core_schema)
        schema["x-maximum"] = self.name
        return schema


@dataclass(frozen=True)
class Says:
    """How a field's refusal reads: a message formatted with the field's name, the value given and
    its bounds (low, high), or a function of (value, bounds) that gives one, or raises a GPT2Error
    that does; `param`: the field the error names, where another."""

    message: str | Callable[[object, Bounds], str]
    param: str | None = None

    def say(self, name: str, value: object, bounds: Bounds, low: int | None = None, high: int | None = None) -> str:
        try:
            if callable(self.message):
                return self.message(value, bounds)
            return self.message.format(name=name, value=value, low=low, high=high)
        except GPT2Error as e:
            return str(e)


INTEGER = Says("{name} must be an integer from {low} to {high}, got {value!r}")
FLAG = Says("{name} must be true or false, got {value!r}")
UNSUPPORTED = Says("{name} is not supported by this server")


def _metadata(field, kind: type) -> object | None:
    return next((m for m in field.metadata if isinstance(m, kind)), None)


class Body(BaseModel):
    """A route's JSON body: these fields and no other (an unknown one is refused, as OpenAI's API
    refuses it); bool is never a number, nor a number a bool (strict); null is the default."""

    model_config = ConfigDict(extra="forbid", strict=True)
    not_an_object: ClassVar[Says] = Says("the request body must be a JSON object")

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: object, info: ValidationInfo) -> object:
        field = cls.model_fields[info.field_name]
        return field.get_default() if value is None and not field.is_required() else value

    @classmethod
    def refusal(cls, errors: list[dict], body: object, bounds: Bounds) -> RequestError:
        """The first of pydantic's errors about a body (FastAPI's, locations from "body"), in the server's words."""
        if not isinstance(body, dict):
            return RequestError(400, cls.not_an_object.say("body", body, bounds), cls.not_an_object.param)
        unknown = [e["loc"][1] for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 2]
        if unknown:
            return RequestError(400, f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
        name = errors[0]["loc"][1]  # pydantic reports the fields in their order
        return cls.refuse(name, body.get(name), bounds)

    @classmethod
    def refuse(cls, name: str, value: object, bounds: Bounds) -> RequestError:
        """A 400 for the field `name`, given `value`, in its words (its `Says`)."""
        field = cls.model_fields[name]
        says, low, high, up_to = (
            _metadata(field, Says),
            _metadata(field, annotated_types.Ge),
            _metadata(field, annotated_types.Le),
            _metadata(field, UpTo),
        )
        low = None if low is None else low.ge
        high = getattr(bounds, up_to.name) if up_to is not None else None if high is None else high.le
        return RequestError(400, says.say(name, value, bounds, low, high), says.param or name)

    def within(self, bounds: Bounds) -> Body:
        """This body, once each field the server bounds (`UpTo`) is within its bound."""
        for name, field in type(self).model_fields.items():
            up_to, value = _metadata(field, UpTo), getattr(self, name)
            if up_to is not None and value is not None and value > getattr(bounds, up_to.name):
                raise type(self).refuse(name, value, bounds)
        return self


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]  # each below the model's n_vocab
Prompt = str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]  # OpenAI's: text or ids, one or several
StopString = Annotated[str, Field(min_length=1)]


def _prompt_refused(prompt: object, bounds: Bounds) -> str:
    """Why a prompt is refused, in the words the server has always used."""
    if prompt is None:
        return "you must provide a prompt"
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_integer(t) for t in prompt)):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt:
        for item in prompt:
            if isinstance(item, list) and item and all(is_integer(t) for t in item):
                check_token_ids(
                    min(item), max(item), bounds.n_vocab, " in prompt", param="prompt"
                )  # raises for a negative id
            elif not isinstance(item, str):
                return f"each prompt must be a string or a non-empty list of token ids, got {item!r:.40}"
    return "prompt must be a string, a list of strings, a list of token ids or a list of lists of ids"


def _top_k_refused(top_k: object, bounds: Bounds) -> str:
    check_top_k(top_k, bounds.n_vocab)  # raises, in the words of every other door
    return f"top_k must be an integer from 1 to {bounds.n_vocab}, got {top_k!r}"


def _stop_refused(stop: object, bounds: Bounds) -> str:
    return f"stop: up to 4 stop strings, got {len(check_stop(stop))}"  # check_stop raises for a string that is not one


def _messages_refused(messages: object, bounds: Bounds) -> str:
    """Why a conversation is refused: a part of a content that is not text, or `check_messages`' words."""
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                return (
                    f"messages[{i}].content: this model reads text only, as a string or "
                    f'[{{"type": "text", "text": "..."}}] parts; got the part {part!r:.60}'
                )
    if isinstance(messages, list):  # content given as parts is text once joined
        messages = [
            {**m, "content": ""} if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in messages
        ]
    check_messages(messages)  # raises
    return "messages must be a non-empty list of messages"


def _bias_refused(bias: object, bounds: Bounds) -> str:
    """Why a logit_bias is refused, in `check_logit_bias`' words."""
    check_logit_bias(bias)  # raises for a key that is not an id, or a bias out of range
    return 'logit_bias must map token ids to biases from -100 to 100, like {"50256": -100}'


def checked_by(owner: Callable[..., object], name: str) -> Says:
    """A field whose value the library's object that uses it checks (Sampling, Penalties): the body
    takes any number there, and a refusal, of a value or of its type, is that object's, in the words of
    every other door. (The bounds a field's schema shows are its documentation, not a second check.)"""

    def refused(value: object, bounds: Bounds) -> str:
        owner(**{name: value})  # raises
        return f"{name} must be a number, got {value!r}"

    return Says(refused)


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format json_schema: a name, the schema, strict (always enforced here), a description."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = "response"
    schema_: dict | bool = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: {"type": "text"}, {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {...}}."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def constraint(self) -> Constraint | None:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise RequestError(
                    400,
                    'response_format of type json_schema needs "json_schema": {"name": ..., "schema": {...}}',
                    "response_format",
                )
            return _made("response_format", Constraint.json_schema, self.json_schema.schema_)
        return Constraint.json_object() if self.type == "json_object" else None


def _format_refused(value: object, bounds: Bounds) -> str:
    return (
        'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
        f'{{"name": ..., "schema": {{...}}, "strict": true}}}}, got {value!r:.80}'
    )


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: one of json (a schema), regex, choice, grammar (Lark or GBNF), json_object."""

    model_config = ConfigDict(extra="forbid", strict=True)
    json_: dict | bool | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def constraints(self) -> list[tuple[str, Constraint | None]]:
        given = {
            "json_schema": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object,
        }
        if sum(value not in (None, False) for value in given.values()) > 1:
            raise RequestError(
                400,
                "structured_outputs: one of json, regex, choice, grammar, json_object at a time",
                "structured_outputs",
            )
        return [("structured_outputs", _made("structured_outputs", one_constraint, **given))]


def _structured_refused(value: object, bounds: Bounds) -> str:
    return (
        'structured_outputs must be an object of one of "json" (a schema), "regex", "choice" (a list of strings), '
        f'"grammar" (Lark or GBNF) or "json_object": true, got {value!r:.80}'
    )


def _made(field: str, make: Callable[..., Constraint | None], *args: object, **kwargs: object) -> Constraint | None:
    """A constraint made of a field's value: its error a 400 naming the field."""
    try:
        return make(*args, **kwargs)
    except GPT2Error as e:
        raise RequestError(400, f"{field}: {e}", field) from None


class StreamOptions(Body):
    include_usage: Annotated[bool | None, FLAG] = False


class TextPart(BaseModel):
    """OpenAI's content part of text, {"type": "text", "text": ...} (other keys ignored)."""

    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One message of a conversation; its content a string, or parts of text to join (other keys, a name, ignored)."""

    model_config = ConfigDict(strict=True)
    role: Literal[ROLES]
    content: str | list[TextPart]

    def as_dict(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": self.role, "content": content}


class Sampled(Body):
    """What a completion and a chat completion share: the model, how to choose tokens, how many
    choices, where to stop, how to answer; and OpenAI's fields this server does not support."""

    model: str | None = None
    n: Annotated[int | None, UpTo("max_n"), INTEGER] = Field(1, ge=1)
    stop: Annotated[StopString | Annotated[list[StopString], Field(max_length=4)] | None, Says(_stop_refused)] = None
    temperature: Annotated[float | None, checked_by(Sampling, "temperature")] = Field(
        1.0, json_schema_extra={"minimum": 0}
    )
    top_p: Annotated[float | None, checked_by(Sampling, "top_p")] = Field(
        1.0, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1}
    )
    top_k: Annotated[int | None, UpTo("n_vocab"), Says(_top_k_refused)] = Field(None, ge=1)  # ours, not OpenAI's
    seed: Annotated[int | None, Says("{name} must be a whole number from {low} to {high}, got {value!r}")] = Field(
        None, ge=0, le=SEED_MAX
    )  # choice i samples from seed + i
    stream: Annotated[bool | None, FLAG] = False
    stream_options: Annotated[
        StreamOptions | None, Says('stream_options must be an object like {{"include_usage": true}}')
    ] = None
    user: Annotated[str | None, Says("{name} must be a string, got {value!r}")] = None
    presence_penalty: Annotated[float | None, checked_by(Penalties, "presence_penalty")] = Field(
        0.0, json_schema_extra={"minimum": -2, "maximum": 2}
    )
    frequency_penalty: Annotated[float | None, checked_by(Penalties, "frequency_penalty")] = Field(
        0.0, json_schema_extra={"minimum": -2, "maximum": 2}
    )
    logit_bias: Annotated[dict[str, float] | None, Says(_bias_refused)] = None  # OpenAI's: {"50256": -100}
    repetition_penalty: Annotated[float | None, checked_by(Penalties, "repetition_penalty")] = Field(
        1.0, json_schema_extra={"exclusiveMinimum": 0}
    )  # vLLM's and transformers': multiplicative
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields (one at
    # most)
    response_format: Annotated[ResponseFormat | None, Says(_format_refused)] = None
    structured_outputs: Annotated[StructuredOutputs | None, Says(_structured_refused)] = None
    guided_json: Annotated[dict | str | None, Says("{name} must be a JSON schema (an object or its text)")] = None
    guided_regex: Annotated[str | None, Says("{name} must be a regular expression (a string)")] = None
    guided_choice: Annotated[list[str] | None, Says("{name} must be a list of strings")] = None
    guided_grammar: Annotated[str | None, Says("{name} must be a grammar (a string: Lark or GBNF)")] = None

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, None if self.top_p == 1 else self.top_p)  # top_p 1 keeps all

    def processing(self, tokenizer: Tokenizer | None, n_vocab: int) -> Processing | None:
        """The body's constraint, compiled for `tokenizer` (a 400 without one: a constraint is on text), with its
        logit bias and penalties (None: none)."""
        field, constraint = self.constraint()
        if constraint is not None and tokenizer is None:
            raise needs_tokenizer(f"{field} needs one: it constrains the text", field)
        penalties = Penalties.make(
            self.logit_bias, self.frequency_penalty, self.presence_penalty, self.repetition_penalty
        )
        penalties.check_vocab(n_vocab)
        try:
            compiled = None if constraint is None else compile_constraint(constraint, tokenizer)
        except GPT2Error as e:
            raise RequestError(400, f"{field}: {str(e).removeprefix(constraint.kind + ': ')}", field) from None
        processing = Processing(penalties, compiled)
        return processing if processing.any else None

    def constraint(self) -> tuple[str | None, Constraint | None]:
        """The body's constraint and the field that gave it; two at once are a 400 naming the second."""
        given = [
            (name, c)
            for name, c in [
                ("response_format", self.response_format and self.response_format.constraint()),
                *(self.structured_outputs.constraints() if self.structured_outputs else []),
                *self._guided(),
            ]
            if c is not None
        ]
        if len(given) > 1:
            raise RequestError(
                400, f"one structured output at a time: {given[0][0]} and {given[1][0]} were both given", given[1][0]
            )
        return given[0] if given else (None, None)

    def _guided(self) -> list[tuple[str, Constraint | None]]:
        """vLLM's older guided_* fields."""
        try:
            return [
                ("guided_json", None if self.guided_json is None else Constraint.json_schema(self.guided_json)),
                ("guided_regex", None if self.guided_regex is None else Constraint.regex(self.guided_regex)),
                ("guided_choice", None if self.guided_choice is None else Constraint.choice(self.guided_choice)),
                ("guided_grammar", None if self.guided_grammar is None else Constraint.grammar(self.guided_grammar)),
            ]
        except GPT2Error as e:
            raise RequestError(400, str(e), "guided_" + {"json_schema": "json"}.get(e.param, e.param)) from None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(Sampled):
    """POST /v1/completions: OpenAI's completions request, and vLLM's return_token_ids."""

    prompt: Annotated[Prompt, Says(_prompt_refused)]
    max_tokens: Annotated[int | None, UpTo("n_ctx"), INTEGER] = Field(16, ge=0)  # 0: the prompt only scored (echo)
    logprobs: Annotated[int | None, INTEGER] = Field(None, ge=0, le=5)
    echo: Annotated[bool | None, FLAG] = False
    return_token_ids: Annotated[bool | None, FLAG] = False  # vLLM's: each choice's token_ids and prompt_token_ids
    best_of: Annotated[int | None, Says("best_of is not supported by this server (other than equal to n)")] = Field(
        None, ge=1
    )
    suffix: Annotated[str | None, UNSUPPORTED] = Field(None, max_length=0)


class ChatBody(Sampled):
    """POST /v1/chat/completions: OpenAI's chat completions request; without max_completion_tokens
    (or max_tokens) a reply may fill the context."""

    messages: Annotated[list[Message], Field(min_length=1), Says(_messages_refused)]
    max_completion_tokens: Annotated[int | None, UpTo("n_ctx"), INTEGER] = Field(None, ge=1)
    max_tokens: Annotated[int | None, UpTo("n_ctx"), INTEGER] = Field(
        None, ge=1
    )  # OpenAI's older name of the one above
    logprobs: Annotated[bool | None, FLAG] = False
    top_logprobs: Annotated[int | None, INTEGER] = Field(None, ge=0, le=20)  # alternatives per token, with logprobs


class InspectBody(Body):
    """POST /v1/inspect: one prompt, and how many next tokens to give at each position."""

    model: str | None = None
    prompt: Annotated[Prompt, Says(_prompt_refused)]
    top_k: Annotated[int | None, INTEGER] = Field(5, ge=1, le=20)


class WalkBody(InspectBody):
    """POST /v1/walk: one prompt walked through the pass, and how many next tokens to name."""

    top_k: Annotated[int | None, INTEGER] = Field(10, ge=1, le=100)


OneText = str | TokenIds  # one prompt: text, or its ids
TEXT = Says("{name} must be a string or a non-empty list of token ids, got {value!r:.40}")
# a token of the answer: its text (one token, " Mary") or its id; null: the circuits route's default
Token = Annotated[
    str | Annotated[int, Field(ge=0)] | None,
    Says("{name} must be a token's text (one token) or its id, got {value!r:.40}"),
]


class ScoresBody(Body):
    """POST /v1/circuits/scores: every head's scores on one text."""

    model: str | None = None
    prompt: Annotated[OneText, TEXT]


class HeadBody(Body):
    """POST /v1/circuits/head: one head on one text: its scores, and the next token's top_k
    probabilities before and after the head's output is zeroed."""

    model: str | None = None
    prompt: Annotated[OneText, TEXT]
    layer: Annotated[int, UpTo("last_layer"), INTEGER] = Field(ge=0)
    head: Annotated[int, UpTo("last_head"), INTEGER] = Field(ge=0)
    top_k: Annotated[int | None, INTEGER] = Field(5, ge=1, le=20)


class PatchingBody(Body):
    """POST /v1/circuits/patching: activation patching of `site`, from the clean text into the
    corrupted one (of the same length), measured by the logit difference of answer and other
    at the last position (null: the clean run's top token, and the corrupted run's)."""

    model: str | None = None
    clean: Annotated[OneText, TEXT]
    corrupted: Annotated[OneText, TEXT]
    site: Annotated[
        Literal[SERVED_SITES] | None,
        Says(lambda value, bounds: f"unknown site {value!r:.40}: the sites are {', '.join(SERVED_SITES)}"),
    ] = "resid_pre"
    answer: Token = None
    other: Token = None


class AttributionBody(Body):
    """POST /v1/circuits/attribution: each part's direct effect on the next token's logit of
    answer (null: the top token), less other's where given."""

    model: str | None = None
    prompt: Annotated[OneText, TEXT]
    answer: Token = None
    other: Token = None


SHARE = Says("{name} must be a number from {low} to {high} (a share of the influence), got {value!r}")


class GraphBody(Body):
    """POST /v1/circuits/graph: the attribution graph of the next token after `prompt`, through the
    server's transcoders, pruned to the nodes holding node_threshold of the influence on the logits
    and the edges holding edge_threshold; at most max_feature_nodes features, the most influential
    (null: up to the server's max_graph_features)."""

    model: str | None = None
    prompt: Annotated[OneText, TEXT]
    node_threshold: Annotated[float | None, SHARE] = Field(0.8, ge=0, le=1)
    edge_threshold: Annotated[float | None, SHARE] = Field(0.98, ge=0, le=1)
    max_feature_nodes: Annotated[int | None, Says("{name} must be a positive integer or null, got {value!r}")] = Field(
        None, ge=1
    )


class FeatureBody(Body):
    """POST /v1/circuits/feature: the top_k contexts of one transcoder feature over the server's feature data."""

    model: str | None = None
    layer: Annotated[int, UpTo("last_layer"), INTEGER] = Field(ge=0)
    feature: Annotated[int, Says("{name} must be a feature's index, an integer from 0 up, got {value!r}")] = Field(ge=0)
    top_k: Annotated[int | None, INTEGER] = Field(10, ge=1, le=100)


GIVE_TEXT = Says('give the text as {{"content": "..."}} (or {{"prompt": "..."}})', "content")


class TokenizeBody(Body):
    """POST /tokenize: llama.cpp's {"content": text} or vLLM's {"prompt": text} (other fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    not_an_object: ClassVar[Says] = GIVE_TEXT
    content: Annotated[str | None, GIVE_TEXT] = None
    prompt: Annotated[str | None, GIVE_TEXT] = None


GIVE_IDS = Says('give the ids as {{"tokens": [15496, 995]}}', "tokens")


def _ids_refused(tokens: object, bounds: Bounds) -> str:
    if isinstance(tokens, list) and tokens and all(is_integer(t) for t in tokens):
        check_token_ids(min(tokens), max(tokens), bounds.n_vocab, param="tokens")  # raises for a negative id
    return GIVE_IDS.say("tokens", tokens, bounds)


class DetokenizeBody(Body):
    """POST /detokenize: {"tokens": ids} (other fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    not_an_object: ClassVar[Says] = GIVE_IDS
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Says(_ids_refused)]


# ------------------------------------------------------------------ requests: a checked body's rows


@dataclass
class CompletionRequest:
    """A checked completion request: its rows (prompt-major, n each) and how to answer."""

    prompts: list[list[int]]
    rows: list[Row]
    stop: list[str]
    stream: bool = False
    echo: bool = False
    logprobs: int | None = None
    include_usage: bool = False
    return_token_ids: bool = False  # vLLM's: each choice's token_ids and prompt_token_ids


AllowedSpecial = AbstractSet[str] | Literal["all"]  # Tokenizer.encode's: special tokens read as such in text


def parse_completion(
    body: CompletionBody, tokenizer: Tokenizer | None, bounds: Bounds, allowed_special: AllowedSpecial = "all"
) -> CompletionRequest:
    """The rows of a /v1/completions body that FastAPI has checked against `CompletionBody`, once
    its prompts are read and within the model's bounds. A refusal is a RequestError, or a
    GPT2Error whose `param` names the field (`RequestError.invalid`). A model that comes with no
    tokenizer (None) reads prompts of ids, and answers each choice with its token_ids (there is no text)."""
    prompts = parse_prompts(body.prompt, tokenizer, bounds.n_vocab, allowed_special)
    if tokenizer is None and body.stops():
        raise needs_tokenizer("stop strings need one: they end the text (max_tokens ends the ids)", "stop")
    within_context(
        prompts, body.max_tokens, bounds.n_ctx
    )  # before max_tokens' bound, n_ctx: this names the prompt's room
    body = body.within(bounds)
    if body.best_of is not None and body.best_of != body.n:
        raise RequestError(400, "best_of is not supported by this server (other than equal to n)", "best_of")
    # every part is checked above: Request.build would check them again
    request = Request(
        prompts,
        body.max_tokens,
        body.sampling(),
        body.seed,
        body.n,
        None if tokenizer is None else tokenizer.eot_token,
        body.logprobs,
        body.echo and body.logprobs is not None,
        body.processing(tokenizer, bounds.n_vocab),
    )
    return CompletionRequest(
        request.prompts,
        request.rows(),
        body.stops(),
        body.stream,
        body.echo,
        body.logprobs,
        body.include_usage,
        body.return_token_ids or tokenizer is None,  # without a tokenizer, the ids are the answer
    )


def within_context(prompts: list[list[int]], max_tokens: int, n_ctx: int, param: str = "prompt") -> None:
    """Refuse a request past the context in OpenAI's words (which clients look for), saying by how
    much and how many tokens the prompt leaves for the completion; `param` "messages": a chat's conversation."""
    longest = max(map(len, prompts))
    asked = longest + max_tokens
    if asked <= n_ctx:
        return
    where, what = ("the messages", "messages") if param == "messages" else ("your prompt", "prompt")
    room = n_ctx - longest
    left = f"{where} leave{'' if param == 'messages' else 's'} " + (
        f"room for {room:,} token{'s' * (room != 1)} of completion" if room > 0 else "no room"
    )
    raise RequestError(
        400,
        f"This model's maximum context length is {n_ctx:,} tokens, however you requested {asked:,} tokens "
        f"({longest:,} in {where}; {max_tokens:,} for the completion), {asked - n_ctx:,} more than it holds: "
        f"{left}. Please reduce your {what} or completion length.",
        param,
        "context_length_exceeded",
    )


def parse_prompts(
    prompt: str | list, tokenizer: Tokenizer | None, n_vocab: int, allowed_special: AllowedSpecial = "all"
) -> list[list[int]]:
    """The ids of a checked prompt (`Prompt`: a string, a list of strings, a list of ids, or a
    list of lists of ids), each id within the vocabulary; a string, of a model that comes with no
    tokenizer (None), a 400 saying so."""
    if isinstance(prompt, str) or all(is_integer(t) for t in prompt):
        prompt = [prompt]
    prompts = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            where = f"prompt {i}: " if len(prompt) > 1 else ""
            ids = encode_text(tokenizer, item, allowed_special, "prompt", where)
        else:
            ids = item
            check_token_ids(min(ids), max(ids), n_vocab, " in prompt", param="prompt")
        prompts.append(start_of_text(ids, None if tokenizer is None else tokenizer.eot_token))
    return prompts


def encode_text(
    tokenizer: Tokenizer | None, text: str, allowed_special: AllowedSpecial, param: str, where: str = ""
) -> list[int]:
    """The ids of a request's text; a character the vocabulary lacks (a character model's) is a 400 naming it,
    and so is any text of a model that comes with no tokenizer (None)."""
    if tokenizer is None:
        raise needs_tokenizer(
            f"a text in {param} needs one: give token ids instead, a list of ints (such as [0, 1, 2])", param, where
        )
    try:
        return tokenizer.encode(text, allowed_special=allowed_special, disallowed_special=())  # the rest is text
    except GPT2Error as e:
        raise RequestError(400, f"{where}{e}", param) from None

"""The server's side of OpenAI's completions API: what a client may ask, and its errors.

A /v1/completions body is checked field by field, as OpenAI's API does, and becomes a
`CompletionRequest`: the rows of `gpt2.decoding.Request` (the one builder every front door
uses, with its checks) and how to answer. A refusal is a `RequestError`, an HTTP status with
OpenAI's error body; a library error (`GPT2Error`) names its field through its `param`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Literal

import torch
from fastapi.responses import JSONResponse

from gpt2._checks import check_token_ids, int_between, is_integer, is_real, positive_int
from gpt2.config import GPT2Config
from gpt2.decoding import Request, Row, check_draft_tokens, start_of_text
from gpt2.errors import ContextLengthError, GPT2Error, InvalidArgumentError
from gpt2.generate import check_stop
from gpt2.engines import KVCache, check_prefix_cache_mb
from gpt2.sampling import Sampling
from gpt2.settings import DRAFT_TOKENS
from gpt2.tokenizer import Tokenizer


@dataclass(frozen=True)
class Limits:
    """What one client may ask of a server, so that none can take it down."""

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
    api_key: str | None = None
    draft_tokens: int = DRAFT_TOKENS  # tokens a draft model proposes per step, where the server has one

    def check(self) -> None:
        for name in ("max_batch_size", "max_num_batched_tokens", "max_queue", "max_n", "max_body_bytes", "max_inspect_cells"):
            positive_int(name, getattr(self, name))
        check_prefix_cache_mb(self.prefix_cache_mb)
        check_draft_tokens(self.draft_tokens)
        if self.max_num_batched_tokens < self.max_batch_size:
            raise InvalidArgumentError(f"max_num_batched_tokens must be at least max_batch_size ({self.max_batch_size}), as each "
                                       f"step decodes a token of every row; got {self.max_num_batched_tokens}", "max_num_batched_tokens",
                                       ("max_batch_size",))  # fmt: skip
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InvalidArgumentError("api_key must be non-empty text", "api_key")

    def check_memory(self, config: GPT2Config, device: torch.device, dtype: torch.dtype) -> None:
        """Refuse a batch whose KV cache the device cannot hold: each row keeps one of the whole context."""
        KVCache.check_fits(config, self.max_batch_size, config.n_ctx, device, dtype, BATCH_HINT, "max_batch_size")


BATCH_HINT = "a smaller max_batch_size"


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error body naming the field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    @classmethod
    def invalid(cls, error: GPT2Error, where: str = "") -> RequestError:
        """A library error about a request as a 400 naming its field (`where` goes before the message)."""
        return cls(400, f"{where}{error}", FIELDS.get(error.param, error.param))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


FIELDS = {"max_new_tokens": "max_tokens"}  # the library's names that OpenAI's API spells otherwise


# ------------------------------------------------------------------ requests


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


COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
                     "seed", "logprobs", "echo", "user", "presence_penalty", "frequency_penalty", "logit_bias", "best_of",
                     "suffix", "return_token_ids"}  # fmt: skip
UNSUPPORTED = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "suffix": ("",)}

AllowedSpecial = AbstractSet[str] | Literal["all"]  # Tokenizer.encode's: special tokens read as such in text


def parse_completion(body: object, tokenizer: Tokenizer, n_vocab: int, n_ctx: int, limits: Limits,
                     allowed_special: AllowedSpecial = "all") -> CompletionRequest:  # fmt: skip
    """Check a /v1/completions body field by field, as OpenAI's API does, and make its rows. A
    refusal is a RequestError, or a GPT2Error whose `param` names the field (`RequestError.invalid`)."""
    body = check_fields(body)
    max_tokens = int_between("max_tokens", 16 if body.get("max_tokens") is None else body["max_tokens"], 0, n_ctx)
    n, stop, sampling = parse_sampling(body, limits)
    if body.get("best_of") is not None and body["best_of"] != n:
        raise RequestError(400, "best_of is not supported by this server (other than equal to n)", "best_of")
    logprobs = None if body.get("logprobs") is None else int_between("logprobs", body["logprobs"], 0, 5)
    stream, echo, include_usage, return_token_ids = parse_streaming(body)
    prompts = parse_prompts(body.get("prompt"), tokenizer, n_vocab, allowed_special)
    try:
        request = Request.build(prompts, max_tokens, n_vocab=n_vocab, n_ctx=n_ctx, sampling=sampling, seed=body.get("seed"), n=n,
                                eos_token_id=tokenizer.eot_token, logprobs=logprobs, echo_logprobs=echo and logprobs is not None,
                                on_overflow="error", allow_zero=True)  # fmt: skip
    except ContextLengthError:
        raise context_exceeded(prompts, max_tokens, n_ctx) from None
    return CompletionRequest(request.prompts, request.rows(), stop, stream, echo, logprobs, include_usage, return_token_ids)


def parse_sampling(body: dict, limits: Limits) -> tuple[int, list[str], Sampling]:
    """A completion's (or a chat completion's) n, stop strings and sampling; null is the default."""
    get = lambda key, default: default if body.get(key) is None else body[key]  # noqa: E731
    n = int_between("n", get("n", 1), 1, limits.max_n)
    stop = check_stop(body.get("stop"))
    if len(stop) > 4:
        raise RequestError(400, f"stop: up to 4 stop strings, got {len(stop)}", "stop")
    top_p = get("top_p", 1.0)
    sampling = Sampling(get("temperature", 1.0), get("top_k", None), None if is_real(top_p) and top_p == 1 else top_p)  # 1 keeps all
    return n, stop, sampling


def check_fields(body: object, known: AbstractSet[str] = COMPLETION_FIELDS) -> dict:
    """The body: a JSON object of fields this endpoint knows, and supports as given."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for key in body:
        if key not in known:
            raise RequestError(400, f"Unrecognized request argument supplied: {key}", key)
    for key, allowed in UNSUPPORTED.items():
        if body.get(key) is not None and body[key] not in allowed:
            raise RequestError(400, f"{key} is not supported by this server", key)
    return body


def parse_streaming(body: dict) -> tuple[bool, bool, bool, bool]:
    """stream, echo, stream_options' include_usage and return_token_ids (null, or absent, is false)."""
    flags = {key: False if body.get(key) is None else body[key] for key in ("stream", "echo", "return_token_ids")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(400, f"{key} must be true or false, got {value!r}", key)
    options = {} if body.get("stream_options") is None else body["stream_options"]
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError(400, 'stream_options must be an object like {"include_usage": true}', "stream_options")
    return flags["stream"], flags["echo"], bool(options.get("include_usage")), flags["return_token_ids"]


def context_exceeded(prompts: list[list[int]], max_tokens: int, n_ctx: int, param: str = "prompt") -> RequestError:
    """The library's refusal of a request past the context, in OpenAI's words (which clients look
    for), saying by how much; `param` "messages": a chat's conversation."""
    longest = max(map(len, prompts))
    asked = longest + max_tokens
    where, what = ("the messages", "messages") if param == "messages" else ("your prompt", "prompt")
    return RequestError(400, f"This model's maximum context length is {n_ctx:,} tokens, however you requested {asked:,} tokens "
                        f"({longest:,} in {where}; {max_tokens:,} for the completion), {asked - n_ctx:,} more than it holds. "
                        f"Please reduce your {what} or completion length.", param, "context_length_exceeded")  # fmt: skip


def parse_prompts(prompt: object, tokenizer: Tokenizer, n_vocab: int, allowed_special: AllowedSpecial = "all") -> list[list[int]]:
    """OpenAI's prompt: a string, a list of strings, a list of ids, or a list of lists of ids."""
    if prompt is None:
        raise RequestError(400, "you must provide a prompt", "prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_integer(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(400, "prompt must be a string, a list of strings, a list of token ids or a list of lists of ids", "prompt")
    prompts = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            where = f"prompt {i}: " if len(prompt) > 1 else ""
            ids = encode_text(tokenizer, item, allowed_special, "prompt", where)
        elif isinstance(item, list) and item and all(is_integer(t) for t in item):
            ids = [int(t) for t in item]
            check_token_ids(min(ids), max(ids), n_vocab, " in prompt", param="prompt")
        else:
            raise RequestError(400, f"each prompt must be a string or a non-empty list of token ids, got {item!r:.40}", "prompt")
        prompts.append(start_of_text(ids, tokenizer.eot_token))
    return prompts


def encode_text(tokenizer: Tokenizer, text: str, allowed_special: AllowedSpecial, param: str, where: str = "") -> list[int]:
    """The ids of a request's text; a character the vocabulary lacks (a character model's) is a 400 naming it."""
    try:
        return tokenizer.encode(text, allowed_special=allowed_special, disallowed_special=())  # the rest is text
    except GPT2Error as e:
        raise RequestError(400, f"{where}{e}", param) from None

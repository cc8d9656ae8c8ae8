"""`gpt2 serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) with continuous batching.

    client requests ──> routes (the event loop) ──rows──> Scheduler (one thread) ──> Decoder
                    <── text, SSE chunks        <──(row, token)──┘

The routes parse and check requests, tokenize, and turn tokens into OpenAI's responses; one
thread steps a `gpt2.decoding.Decoder` over all rows in flight, so a request joins the running
batch at the next step and leaves it when it ends. Endpoints: /health, /v1/models,
/v1/completions, /tokenize, /detokenize, /tokenizer_info, /metrics.

`<|endoftext|>` written in a string prompt (and in /tokenize's text) is the special token, as
OpenAI's API, vLLM and llama.cpp's server read it, unless the server was told otherwise
(`allowed_special`, the tokenizer's meaning: frozenset() reads it as text).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AbstractSet, Literal

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException

from gpt2._checks import check_token_ids, int_between, is_integer, positive_int
from gpt2.config import GPT2Config
from gpt2.decoding import STOP, Decoder, Row, row_seed
from gpt2.engines import KVCache
from gpt2.errors import GPT2Error, InvalidArgumentError
from gpt2.generate import TextRow, check_stop
from gpt2.model import GPT2
from gpt2.sampling import Sampling, check_seed
from gpt2.tokenizer import IncrementalDecoder, Tokenizer

CANCELLED = "cancelled"  # a row whose client left, or whose server stops: never reported


@dataclass(frozen=True)
class Limits:
    """What one client may ask of a server, so that none can take it down."""

    max_batch_size: int = 8  # rows decoded together
    max_queue: int = 64  # rows waiting for a slot; past it, 429
    max_n: int = 16  # choices of one request
    max_body_bytes: int = 1 << 20
    api_key: str | None = None

    def check(self) -> None:
        for name in ("max_batch_size", "max_queue", "max_n", "max_body_bytes"):
            positive_int(name, getattr(self, name))
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise InvalidArgumentError("api_key must be non-empty text")

    def check_memory(self, config: GPT2Config, device: torch.device, dtype: torch.dtype) -> None:
        """Refuse a batch whose KV cache the device cannot hold: each row keeps one of the whole context."""
        KVCache.check_fits(config, self.max_batch_size, config.n_ctx, device, dtype, BATCH_HINT)


BATCH_HINT = "a smaller max_batch_size (--max-batch-size)"


class RequestError(Exception):
    """A request the server refuses: an HTTP status and OpenAI's error body naming the field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# ------------------------------------------------------------------ requests


@dataclass
class Completion:
    """A checked completion request: its rows (prompt-major, n each) and how to answer."""

    prompts: list[list[int]]
    rows: list[Row]
    stop: list[str]
    stream: bool = False
    echo: bool = False
    logprobs: int | None = None
    include_usage: bool = False


COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
                     "seed", "logprobs", "echo", "user", "presence_penalty", "frequency_penalty", "logit_bias", "best_of",
                     "suffix"}  # fmt: skip
UNSUPPORTED = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "suffix": ("",)}


def checked(param: str, check: Callable, *args):
    """Run one of the package's argument checks (whose messages name the argument); its error becomes a 400."""
    try:
        return check(*args)
    except GPT2Error as e:
        raise RequestError(400, str(e), param) from None


AllowedSpecial = AbstractSet[str] | Literal["all"]  # Tokenizer.encode's: special tokens read as such in text


def parse_completion(body: object, tokenizer: Tokenizer, n_vocab: int, n_ctx: int, limits: Limits,
                     allowed_special: AllowedSpecial = "all") -> Completion:  # fmt: skip
    """Check a /v1/completions body field by field, as OpenAI's API does."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for key in body:
        if key not in COMPLETION_FIELDS:
            raise RequestError(400, f"Unrecognized request argument supplied: {key}", key)
    for key, allowed in UNSUPPORTED.items():
        if body.get(key) is not None and body[key] not in allowed:
            raise RequestError(400, f"{key} is not supported by this server", key)
    get = lambda key, default: default if body.get(key) is None else body[key]  # noqa: E731  (null is the default)
    max_tokens = checked("max_tokens", int_between, "max_tokens", get("max_tokens", 16), 0, n_ctx)
    n = checked("n", int_between, "n", get("n", 1), 1, limits.max_n)
    if body.get("best_of") is not None and body["best_of"] != n:
        raise RequestError(400, "best_of is not supported by this server (other than equal to n)", "best_of")
    temperature, top_k, top_p = get("temperature", 1.0), get("top_k", None), get("top_p", 1.0)
    checked("temperature", Sampling(temperature=temperature).check, n_vocab)
    checked("top_k", Sampling(top_k=top_k).check, n_vocab)
    checked("top_p", Sampling(top_p=top_p).check, n_vocab)
    sampling = Sampling(temperature, top_k, None if top_p == 1 else top_p)  # top_p 1 keeps every token
    seed = body.get("seed")
    if seed is not None:
        checked("seed", check_seed, seed)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        checked("logprobs", int_between, "logprobs", logprobs, 0, 5)
    flags = {key: get(key, False) for key in ("stream", "echo")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(400, f"{key} must be true or false, got {value!r}", key)
    options = get("stream_options", {})
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError(400, 'stream_options must be an object like {"include_usage": true}', "stream_options")
    stop = checked("stop", check_stop, body.get("stop"))
    if len(stop) > 4:
        raise RequestError(400, f"stop: up to 4 stop strings, got {len(stop)}", "stop")
    prompts = parse_prompts(body.get("prompt"), tokenizer, n_vocab, allowed_special)
    for ids in prompts:
        if len(ids) + max_tokens > n_ctx:
            raise RequestError(400, f"This model's maximum context length is {n_ctx} tokens, however you requested "
                               f"{len(ids) + max_tokens} tokens ({len(ids)} in your prompt; {max_tokens} for the completion). "
                               f"Please reduce your prompt or completion length.", "prompt", "context_length_exceeded")  # fmt: skip
    echo_logprobs = flags["echo"] and logprobs is not None
    rows = [Row(ids, max_tokens, sampling, row_seed(seed, i * n + j), tokenizer.eot_token, logprobs, echo_logprobs)
            for i, ids in enumerate(prompts) for j in range(n)]  # fmt: skip
    return Completion(prompts, rows, stop, flags["stream"], flags["echo"], logprobs, bool(options.get("include_usage")))


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
            checked("prompt", check_token_ids, min(ids), max(ids), n_vocab, " in prompt")
        else:
            raise RequestError(400, f"each prompt must be a string or a non-empty list of token ids, got {item!r:.40}", "prompt")
        if not ids:  # as GPT-2's unconditional samples, from <|endoftext|>
            if tokenizer.eot_token is None:
                raise RequestError(400, "empty prompt: this model's vocabulary has no <|endoftext|> to start from", "prompt")
            ids = [tokenizer.eot_token]
        prompts.append(ids)
    return prompts


def encode_text(tokenizer: Tokenizer, text: str, allowed_special: AllowedSpecial, param: str, where: str = "") -> list[int]:
    """The ids of a request's text; a character the vocabulary lacks (a character model's) is a 400 naming it."""
    try:
        return tokenizer.encode(text, allowed_special)
    except GPT2Error as e:
        raise RequestError(400, f"{where}{e}", param) from None


# ------------------------------------------------------------------ the generation loop


class Metrics:
    """Prometheus metrics of one server (its own registry, so that servers in one process do not mix)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpt2_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("gpt2_prompt_tokens", "prompt tokens of completion requests", registry=r)
        self.generated_tokens = Counter("gpt2_generated_tokens", "tokens generated", registry=r)
        self.queue = Gauge("gpt2_queue_length", "rows waiting for a slot in the batch", registry=r)
        self.batch = Gauge("gpt2_batch_size", "rows decoded at the last step", registry=r)
        self.ttft = Histogram("gpt2_time_to_first_token_seconds", "from a completion request to its first token", registry=r,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))  # fmt: skip


# (row, token, finish reason, error) from the loop's thread: the reason as the row had it then, for
# the row itself may have moved on by the time its route reads the event
Listener = Callable[[Row, "int | None", "str | None", "str | None"], None]


class Scheduler:
    """The server's one generation loop: a thread stepping a Decoder over every row in flight."""

    def __init__(self, model: GPT2, limits: Limits, metrics: Metrics):
        self.decoder = Decoder(model.engine(limits.max_batch_size, model.config.n_ctx, hint=BATCH_HINT))
        self.limits, self.metrics = limits, metrics
        self.incoming: list[tuple[Row, Listener]] = []
        self.listeners: dict[Row, Listener] = {}
        self.wake = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="gpt2-decoder", daemon=True)
        self.thread.start()

    def submit(self, rows: Sequence[Row], listener: Listener) -> None:
        with self.wake:
            if self.closed:
                raise RequestError(503, "the server is shutting down", kind="server_error")
            if len(rows) > self.limits.max_queue:
                raise RequestError(400, f"the request asks for {len(rows)} rows (prompts times n), over the {self.limits.max_queue} "
                                   f"that may wait at once (--max-queue)", "n")  # fmt: skip
            if len(self.incoming) + len(self.decoder.waiting) + len(rows) > self.limits.max_queue:
                raise RequestError(429, f"the server is busy: {self.limits.max_queue} rows wait already; retry shortly",
                                   kind="server_error", headers={"Retry-After": "1"})  # fmt: skip
            self.incoming += [(row, listener) for row in rows]
            self.wake.notify()

    def close(self) -> None:
        """Stop the loop: the rows in flight end with an error, new requests get a 503."""
        with self.wake:
            self.closed = True
            self.wake.notify()
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        with torch.inference_mode():
            while self._take():
                try:
                    events = self.decoder.step()
                except Exception as e:  # noqa: BLE001  (a model that fails fails its rows, not the server)
                    self._fail(f"generation failed: {e}")
                    continue
                for row, token in events:
                    self.listeners[row](row, token, row.finish_reason, None)
                    self.metrics.generated_tokens.inc(token is not None)
                self.metrics.batch.set(len(self.decoder.active))
                self.metrics.queue.set(len(self.decoder.waiting))
                for row in [row for row in self.listeners if row.done]:
                    del self.listeners[row]
        self._fail("the server is shutting down")

    def _take(self) -> bool:
        """Move new rows into the decoder; wait while there is nothing to do. False: closed."""
        with self.wake:
            while not self.closed and not self.incoming and not self.decoder.busy:
                self.wake.wait()
            for row, listener in self.incoming:
                self.decoder.add(row)
                self.listeners[row] = listener
            self.incoming.clear()
            self.metrics.queue.set(len(self.decoder.waiting))
            return not self.closed

    def _fail(self, message: str) -> None:
        """Every row in flight ends with an error (its route ends the row, after the tokens before it)."""
        for row, listener in list(self.listeners.items()):
            listener(row, None, None, message)
        self.listeners.clear()
        self.decoder = Decoder(self.decoder.engine)  # the rows that were in it are gone


# ------------------------------------------------------------------ responses


class Choice:
    """One choice of a completion: the text its row's tokens release, and their log-probabilities."""

    def __init__(self, index: int, row: Row, tokenizer: Tokenizer, request: Completion):
        self.index, self.row, self.tokenizer = index, row, tokenizer
        self.text_row = TextRow(tokenizer, request.stop)
        self.echo = tokenizer.decode(row.prompt) if request.echo else None  # given out with the first piece
        self.text = ""  # given out so far
        self.offsets, self.offset = IncrementalDecoder(tokenizer), 0  # each token's place in the text, for text_offset
        self.logprobs: dict | None = None if request.logprobs is None else {
            "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}  # fmt: skip
        self.sent = 0  # logprob entries already streamed
        self.done = False
        self.finish_reason: str | None = None
        self.tokens = 0  # generated tokens this choice took (the row may have made one more)

    def add(self, token: int | None, reason: str | None) -> str:
        """The text the row's new token (None: none) releases, `reason` saying whether the row
        ended with it; the row ends at a stop string."""
        piece = ""
        if self.echo is not None:  # the prompt comes first; its log-probabilities exist once the row has joined
            piece, self.echo = self.echo, None
            if self.row.echo_logprobs:
                for prompt_token, entry in zip(self.row.prompt, self.row.prompt_logprobs):
                    self._log(prompt_token, entry)
            self.offsets, self.offset = IncrementalDecoder(self.tokenizer), len(piece)
        taken = token is not None and not self.text_row.done
        self.tokens += taken
        piece += self.text_row.follow(token, reason is not None)
        if taken and token != self.tokenizer.eot_token and self.logprobs is not None:
            k = len(self.logprobs["tokens"]) - (len(self.row.prompt) if self.row.echo_logprobs else 0)
            self._log(token, (self.row.token_logprobs[k], self.row.top_logprobs[k]))
        self.text += piece
        self.done = self.text_row.done
        if self.done:
            self.finish_reason = STOP if self.text_row.stopped else reason
        if self.text_row.stopped:
            self.row.end(STOP)  # it leaves the batch at the next step
        if self.text_row.stopped and self.logprobs is not None:  # the stop string's tokens are not the text's
            echoed = len(self.row.prompt) if self.row.echo_logprobs else 0
            while len(self.logprobs["tokens"]) > echoed and self.logprobs["text_offset"][-1] >= len(self.text):
                for values in self.logprobs.values():
                    values.pop()
        return piece

    def _log(self, token: int, entry: tuple[float, list[tuple[int, float]]] | None) -> None:
        log = self.logprobs
        log["tokens"].append(self.token_text(token))
        log["text_offset"].append(self.offset)
        self.offset += len(self.offsets.add([token]))
        if entry is None:  # the first token of an echoed prompt
            log["token_logprobs"].append(None)
            log["top_logprobs"].append(None)
            return
        chosen, alternatives = entry
        log["token_logprobs"].append(chosen)
        top = {self.token_text(t): lp for t, lp in alternatives}
        top.setdefault(self.token_text(token), chosen)  # the chosen token always among them, as vLLM does
        log["top_logprobs"].append(top)

    def token_text(self, token: int) -> str:
        """A token as OpenAI's API shows it: its text, or "bytes:\\xNN" where it is part of a character."""
        raw = self.tokenizer.decode_bytes([token])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def unsent_logprobs(self) -> dict | None:
        if self.logprobs is None:
            return None
        new = {key: values[self.sent :] for key, values in self.logprobs.items()}
        self.sent = len(self.logprobs["tokens"])
        return new

    def to_dict(self) -> dict:
        return {"index": self.index, "text": self.text, "logprobs": self.logprobs, "finish_reason": self.finish_reason}


@dataclass
class Answer:
    """What a completion's response shares: its id, time, model and usage."""

    model_id: str
    request: Completion
    choices: list[Choice]
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self) -> dict:
        prompt = sum(map(len, self.request.prompts))
        completion = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def body(self, choices: list[dict], usage: bool = True) -> dict:
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id, "choices": choices}
        if usage:
            body["usage"] = self.usage()
        return body


# ------------------------------------------------------------------ the app


class Server:
    """The state behind the routes: the model (loading while the routes answer), its scheduler, metrics."""

    def __init__(self, load: Callable[[], tuple[GPT2, Tokenizer]], model_id: str, limits: Limits,
                 allowed_special: AllowedSpecial = "all"):  # fmt: skip
        limits.check()
        # a directory's id is its path as given, less the trailing slash that tab completion adds
        self.model_id = model_id.rstrip("/" + os.sep) or model_id
        self.load, self.limits, self.allowed_special = load, limits, allowed_special
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.load_error: Exception | None = None
        self.scheduler: Scheduler | None = None
        self.created = int(time.time())

    def start(self) -> None:
        """Load the model in a thread of its own."""
        threading.Thread(target=self._load_quietly, name="gpt2-load", daemon=True).start()

    def _load_quietly(self) -> None:
        with contextlib.suppress(Exception):  # reported by /health
            self.load_model()

    def load_model(self) -> None:
        """Load the model in this thread; until it has, requests to it get 503 (and after a
        failure, which is also raised, naming the error)."""
        try:
            self.model, self.tokenizer = self.load()
            self.tokenizer.encode("", self.allowed_special)  # a bad allowed_special fails now, not every request
            self.scheduler = Scheduler(self.model, self.limits, self.metrics)
        except Exception as e:
            self.load_error = e
            raise
        self.ready.set()

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    def check_ready(self) -> None:
        if self.load_error is not None:
            raise RequestError(503, f"the model failed to load: {self.load_error}", kind="server_error")
        if not self.ready.is_set():
            raise RequestError(503, "the model is still loading", kind="server_error", headers={"Retry-After": "1"})

    async def body(self, request: Request) -> object:
        """The JSON body of a request to the model: after the API key and the model's readiness are checked."""
        self.check_key(request)
        self.check_ready()
        return await self.read_json(request)

    def check_model(self, name: object) -> None:
        if name is not None and name != self.model_id:
            raise RequestError(404, f"The model `{name}` does not exist; this server serves `{self.model_id}`", "model",
                               "model_not_found")  # fmt: skip

    def check_key(self, request: Request) -> None:
        key = self.limits.api_key
        if key is not None and not hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {key}"):
            raise RequestError(401, "Incorrect or missing API key: send the header Authorization: Bearer KEY",
                               code="invalid_api_key")  # fmt: skip

    async def read_json(self, request: Request) -> object:
        """The request body as JSON, read up to the size limit."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"the request body of {int(declared)} bytes is over the limit of {limit} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"the request body is over the limit of {limit} bytes")
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(400, f"the request body is not valid JSON: {e}") from None


def create_app(load: Callable[[], tuple[GPT2, Tokenizer]], model_id: str, limits: Limits = Limits(), *,
               allowed_special: AllowedSpecial = "all", load_in_background: bool = True) -> FastAPI:  # fmt: skip
    """The server's ASGI app; `load` returns the model and its tokenizer, in a thread of its own
    once the app starts (/health answers 503 until it has), or, with `load_in_background`
    False, when the caller runs `app.state.server.load_model()`: `serve` does, in the main
    thread, for a process that exits while a thread is inside torch aborts (see `serve`).
    `allowed_special` (the tokenizer's meaning) says which special tokens written in a string
    prompt, or in /tokenize's text, are read as such: "all" (as OpenAI's API), or frozenset() for text."""
    server = Server(load, model_id, limits, allowed_special)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            server.start()
        yield
        server.stop()

    app = FastAPI(title="gpt2", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    app.add_middleware(_CountRequests, metrics=server.metrics)

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return RequestError(e.status_code, f"{request.method} {request.url.path}: {e.detail}").response()

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:  # a bug of ours: the server keeps serving
        return RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error").response()

    _add_routes(app, server)
    return app


ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/tokenize", "/detokenize", "/tokenizer_info")


class _CountRequests:
    """ASGI middleware counting responses by endpoint and status (a pure one: FastAPI's
    @middleware would stand between a streamed response and its client)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_noting_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            path = scope["path"]
            endpoint = next((e for e in ENDPOINTS if path == e or path.startswith(e + "/")), "other")
            self.metrics.requests.labels(endpoint, str(status)).inc()


def _add_routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        server.check_ready()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "gpt2"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        server.check_key(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> JSONResponse:
        server.check_key(request)
        server.check_model(model)
        return JSONResponse(model_card())

    # /tokenize and /detokenize speak both llama.cpp's fields ("content") and vLLM's ("prompt"),
    # which lm-evaluation-harness's remote tokenizer uses, with /tokenizer_info
    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> JSONResponse:
        server.check_key(request)
        server.check_ready()
        eot = server.tokenizer.eot_token
        special = None if eot is None else server.tokenizer.decode([eot])
        return JSONResponse({"tokenizer_class": type(server.tokenizer).__name__, "eos_token": special, "bos_token": special,
                             "pad_token": None, "model_max_length": server.model.config.n_ctx})  # fmt: skip

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await server.body(request)
        text = body.get("content", body.get("prompt")) if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise RequestError(400, 'give the text as {"content": "..."} (or {"prompt": "..."})', "content")
        param = "content" if "content" in body else "prompt"
        tokens = encode_text(server.tokenizer, text, server.allowed_special, param)  # as a completion's prompt reads it
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": server.model.config.n_ctx})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await server.body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(is_integer(t) for t in tokens):
            raise RequestError(400, 'give the ids as {"tokens": [15496, 995]}', "tokens")
        if tokens:
            checked("tokens", check_token_ids, min(tokens), max(tokens), server.model.config.n_vocab)
        text = server.tokenizer.decode(tokens)
        return JSONResponse({"content": text, "prompt": text})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await server.body(request)
        server.check_model(body.get("model") if isinstance(body, dict) else None)
        config = server.model.config
        completion = parse_completion(body, server.tokenizer, config.n_vocab, config.n_ctx, server.limits, server.allowed_special)
        return await _answer(server, request, completion)

    @app.post("/v1/chat/completions")  # a client that speaks chat learns what to send instead (a later issue adds chat)
    async def chat() -> JSONResponse:
        raise RequestError(404, "POST /v1/chat/completions: this server speaks OpenAI's completions API, not chat: "
                           "send POST /v1/completions with a prompt to continue", code="unknown_url")  # fmt: skip


async def _answer(server: Server, request: Request, completion: Completion) -> Response:
    started, loop, events = time.perf_counter(), asyncio.get_running_loop(), asyncio.Queue()
    server.scheduler.submit(completion.rows, lambda *event: loop.call_soon_threadsafe(events.put_nowait, event))
    server.metrics.prompt_tokens.inc(sum(map(len, completion.prompts)))
    answer = Answer(server.model_id, completion, [Choice(i, row, server.tokenizer, completion) for i, row in enumerate(completion.rows)])
    stream = _events(server, request, answer, events, started, poll=not completion.stream)
    if completion.stream:
        return StreamingResponse(_sse(answer, stream), media_type="text/event-stream")
    try:
        async for _ in stream:
            pass
    except RequestError as e:
        return e.response()
    return JSONResponse(answer.body([choice.to_dict() for choice in answer.choices]))


async def _events(server: Server, request: Request, answer: Answer, events: asyncio.Queue, started: float, poll: bool):
    """Yield (choice, piece) as tokens arrive, until every choice has ended. The rows end when
    the client leaves, so that they free their slots: a stream finds out when a chunk cannot
    be sent; otherwise (`poll`) the connection is checked every 0.5 s."""
    by_row = {choice.row: choice for choice in answer.choices}
    first, checked_at = True, time.monotonic()
    try:
        while not all(choice.done for choice in answer.choices):
            if poll and time.monotonic() - checked_at > 0.5:
                if await request.is_disconnected():
                    return
                checked_at = time.monotonic()
            try:
                row, token, reason, error = await asyncio.wait_for(events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            if error is not None:
                raise RequestError(503, error, kind="server_error")
            if first and token is not None:
                server.metrics.ttft.observe(time.perf_counter() - started)
                first = False
            choice = by_row[row]
            if not choice.done:
                yield choice, choice.add(token, reason)
    finally:
        for choice in answer.choices:
            choice.row.end(CANCELLED)  # a no-op for rows that ended; frees the slots of the others


async def _sse(answer: Answer, stream) -> AsyncIterator[str]:
    """Server-Sent Events: a chunk per piece of text, one with each choice's finish_reason, then [DONE]."""
    def chunk(choice: Choice, text: str, finish: str | None) -> str:
        body = answer.body([{"index": choice.index, "text": text, "logprobs": choice.unsent_logprobs(), "finish_reason": finish}],
                           usage=False)  # fmt: skip
        return f"data: {json.dumps(body)}\n\n"

    try:
        async for choice, piece in stream:
            if piece or choice.done:
                yield chunk(choice, piece, choice.finish_reason)
        if answer.request.include_usage:
            yield f"data: {json.dumps(answer.body([]))}\n\n"
    except RequestError as e:
        yield f"data: {json.dumps(e.body())}\n\n"
    finally:  # the client gone, or the stream done: free the slots now, not when the generators are collected
        await stream.aclose()
    yield "data: [DONE]\n\n"


# ------------------------------------------------------------------ running it


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, which first ends the requests in flight when told to stop (Ctrl-C,
    SIGTERM): otherwise it would wait for them to finish."""

    def __init__(self, config: uvicorn.Config, server: Server):
        super().__init__(config)
        self.gpt2 = server

    def handle_exit(self, sig, frame) -> None:
        threading.Thread(target=self.gpt2.stop, daemon=True).start()
        super().handle_exit(sig, frame)


def check_port(port: object) -> int:
    return int_between("port", port, 0, 65535)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or a GPT2Error naming them."""
    check_port(port)
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as e:
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(load: Callable[[], tuple[GPT2, Tokenizer]], model_id: str, host: str = "127.0.0.1", port: int = 8000,
          limits: Limits = Limits(), log_level: str = "info", *, allowed_special: AllowedSpecial = "all",
          on_listen: Callable[[str], None] | None = None) -> None:  # fmt: skip
    """Serve until Ctrl-C or SIGTERM: the app of `create_app` on uvicorn, one log line per request.

    Once the port listens, `on_listen` gets the API's URL (http://host:port/v1) and the model
    loads, in this thread, the main one, while uvicorn answers in another (503 until then).
    So Ctrl-C (KeyboardInterrupt) stops a load as it stops any Python code, and SIGTERM, whose
    default ends the process, too; whereas a thread still loading when the interpreter exits is
    ended by unwinding its stack (pthread_exit) through torch's C++ code, which aborts the
    process ("terminate called without an active exception"). Once the model has loaded, both
    end the requests in flight and stop uvicorn, then take their usual course, as they do in
    uvicorn's own `run`. A load that fails stops the server and raises its error."""
    app = create_app(load, model_id, limits, allowed_special=allowed_special, load_in_background=False)  # checks the limits
    sock = listen(host, port)
    if on_listen is not None:
        on_listen(f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}/v1")
    server = app.state.server
    runner = _Uvicorn(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5), server)
    http = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, name="gpt2-http", daemon=True)
    http.start()
    try:
        server.load_model()
        with runner.capture_signals():  # uvicorn's handlers, which only the main thread may install
            http.join()
    finally:  # the end, or a load that failed or was interrupted: uvicorn stops first
        runner.should_exit = True
        http.join()

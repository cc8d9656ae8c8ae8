"""The state behind the server's routes: the model, loading while the routes answer (503
until it has), its scheduler and metrics, and the checks every request to it passes first
(`ModelRoute`): the API key, the model's readiness, the body's size and JSON, the model it names.
A model that comes with no tokenizer is served on token ids: its tokenizer is None. The transcoders
and the feature data of /v1/circuits/graph and /feature, where given, load after the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import torch
from fastapi import Request, Response
from fastapi.routing import APIRoute

from gpt2.errors import ChatTemplateError
from gpt2.generation.engines import check_draft
from gpt2.inspect.dashboards import read_windows
from gpt2.inspect.dictionary_training import trained_on
from gpt2.inspect.transcoders import TranscoderSet, load_transcoders
from gpt2.model.model import GPT2
from gpt2.serve.protocol import AllowedSpecial, Body, Bounds, Limits, RequestError, needs_tokenizer
from gpt2.serve.scheduler import Metrics, Scheduler
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.chat import ChatTemplate, how_to_add

FEATURE_WINDOWS, FEATURE_WINDOW = 64, 64  # the feature data read for /v1/circuits/feature: windows, ids each


class Server:
    """The state behind the routes: the model (loading while the routes answer), its scheduler, metrics."""

    def __init__(
        self,
        load: Callable[[], tuple[GPT2, Tokenizer | None]],
        model_id: str,
        limits: Limits,
        allowed_special: AllowedSpecial = "all",
        load_draft: Callable[[], tuple[GPT2, Tokenizer | None]] | None = None,
        chat_template: ChatTemplate | None = None,
        transcoders: str | os.PathLike | None = None,
        feature_data: str | os.PathLike | None = None,
    ):
        # the server's template: the one given, else the model's own once it has loaded (None: none)
        self.chat_template, self.template_given = chat_template, chat_template is not None
        self.template_error: ChatTemplateError | None = None  # the model's own, where it does not compile
        self.reply_prefix = ""  # what the template writes before a reply's content (ChatTemplate.reply_prefix)
        # a directory's id is its path as given, less the trailing slash that tab completion adds
        self.model_id = model_id.rstrip("/" + os.sep) or model_id
        self.load, self.limits, self.allowed_special, self.load_draft = load, limits, allowed_special, load_draft
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.load_error: Exception | None = None
        self.scheduler: Scheduler | None = None
        self.created = int(time.time())
        self.inspecting = asyncio.Lock()  # /v1/inspect's: one inspection at a time
        # /v1/circuits/graph's and /feature's: the transcoder set's directory and the data of the features'
        # contexts, read once the model has loaded (into `transcoders` and `feature_windows`)
        self.transcoders_dir, self.feature_data = transcoders, feature_data
        self.transcoders: TranscoderSet | None = None
        self.feature_windows: torch.Tensor | None = None  # (N, T) ids: the first windows of feature_data

    def start(self) -> None:
        """Load the model in a thread of its own."""
        threading.Thread(target=self._load_quietly, name="gpt2-load", daemon=True).start()

    def _load_quietly(self) -> None:
        with contextlib.suppress(Exception):  # reported by /health
            self.load_model()

    def load_model(self) -> None:
        """Load the model (and the draft model, the transcoders and the feature data, if any) in this
        thread; until it has, requests to it get 503 (and after a failure, which is also raised, naming
        the error)."""
        try:
            self.model, self.tokenizer = self.load()
            if self.tokenizer is not None:  # a bad allowed_special fails now, not every request
                self.tokenizer.encode("", allowed_special=self.allowed_special)
                self._take_models_template()
            draft = None
            if self.load_draft is not None:
                draft, draft_tokenizer = self.load_draft()
                check_draft(self.model, draft, self.tokenizer, draft_tokenizer)
            self._load_features()
            self.scheduler = Scheduler(self.model, self.limits, self.metrics, draft)
        except Exception as e:
            self.load_error = e
            raise
        self.ready.set()

    def _load_features(self) -> None:
        """The transcoders, on the model's device, checked against it; the first FEATURE_WINDOWS windows
        of the feature data, of up to FEATURE_WINDOW ids (the model's context, if shorter): by default
        the data they were trained on, where `gpt2 train-sae` made them and it is still there."""
        if self.transcoders_dir is not None:
            self.transcoders = load_transcoders(self.transcoders_dir, self.model.transformer.wte.weight.device)
            self.transcoders.check_fits(self.model)
            if self.feature_data is None:
                self.feature_data = trained_on(self.transcoders_dir)
        if self.feature_data is not None:
            T = min(FEATURE_WINDOW, self.model.config.n_ctx)
            self.feature_windows = read_windows(self.feature_data, FEATURE_WINDOWS, T, model=self.model)

    def _take_models_template(self) -> None:
        """The model's own chat template, where none was given (one that does not compile fails
        the chat requests, saying why, not the server); then what the template writes before a
        reply's content, found once here rather than by two renders at each request."""
        source = self.tokenizer.chat_template
        if not self.template_given and source is not None:
            try:
                self.chat_template = ChatTemplate(source, f"the chat template of {self.model_id}")
            except ChatTemplateError as e:
                self.template_error = e
        self.reply_prefix = "" if self.chat_template is None else self.chat_template.reply_prefix(self.tokenizer)

    def template(self) -> ChatTemplate:
        """The template of the chat requests, or a 400 saying there is none and how to add one (or, for a model
        that comes with no tokenizer, that a conversation needs one)."""
        if self.tokenizer is None:
            raise needs_tokenizer(
                "a conversation is text, which needs one: /v1/completions continues a prompt of token ids", "messages"
            )
        if self.template_error is not None:
            raise RequestError(400, str(self.template_error), "messages")
        if self.chat_template is None:
            # for whoever started the server, by its flag (create_app's chat_template, in Python)
            give = "start the server with gpt2 serve --chat-template FILE"
            raise RequestError(
                400,
                f"the model {self.model_id} has no chat template, so it cannot answer a conversation "
                f"(/v1/completions continues a text): {how_to_add(give)}",
                "messages",
            )
        return self.chat_template

    def text_tokenizer(self, route: str) -> Tokenizer:
        """The tokenizer of a route that is text alone (/tokenize, /detokenize, /tokenizer_info), or a 400 for a
        model that comes with none."""
        if self.tokenizer is None:
            raise needs_tokenizer(f"{route} needs one: this server reads and writes token ids only", None)
        return self.tokenizer

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    def check_ready(self) -> None:
        if self.load_error is not None:
            raise RequestError(503, f"the model failed to load: {self.load_error}", kind="server_error")
        if not self.ready.is_set():
            raise RequestError(503, "the model is still loading", kind="server_error", headers={"Retry-After": "1"})

    def bounds(self) -> Bounds:
        """The numbers that bound some fields of a request (`gpt2.serve.protocol.UpTo`), once the model has loaded."""
        config = self.model.config
        return Bounds(config.n_ctx, config.n_vocab, self.limits.max_n, config.n_layer - 1, config.n_head - 1)

    def check_model(self, name: object) -> None:
        if name is not None and name != self.model_id:
            raise RequestError(
                404,
                f"The model `{name}` does not exist; this server serves `{self.model_id}`",
                "model",
                "model_not_found",
            )

    def check_key(self, request: Request) -> None:
        key = self.limits.api_key
        if key is not None and not hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {key}"):
            raise RequestError(
                401, "Incorrect or missing API key: send the header Authorization: Bearer KEY", code="invalid_api_key"
            )

    async def read_json(self, request: Request) -> tuple[bytes, object]:
        """The request body, read up to the size limit, and its JSON."""
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
            return bytes(body), json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestError(400, f"the request body is not valid JSON: {e}") from None


class ModelRoute(APIRoute):
    """A route to the model, whose endpoint takes its JSON body as a `Body` (`body_model`). Before
    FastAPI reads the body into it, the API key, the model's readiness, the body's size and JSON
    (whatever its content-type says) and the model it names are checked; FastAPI's refusal of
    the body is then answered in the server's words (`Body.refusal`, by create_app's handler)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any):
        hints = [p.annotation for p in inspect.signature(endpoint, eval_str=True).parameters.values()]
        self.body_model: type[Body] = next(h for h in hints if isinstance(h, type) and issubclass(h, Body))
        super().__init__(path, endpoint, **options)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def checked_first(request: Request) -> Response:
            server: Server = request.app.state.server
            server.check_key(request)
            server.check_ready()
            raw, body = await server.read_json(request)
            if "model" in self.body_model.model_fields:
                server.check_model(body.get("model") if isinstance(body, dict) else None)
            return await handle(_as_json(request, raw))

        return checked_first


def _as_json(request: Request, raw: bytes) -> Request:
    """The request again, its body (read already) given once more and labelled JSON, which
    FastAPI then reads into the route's model; the rest of the connection (a client that
    leaves) as it was."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"] + [
        (b"content-type", b"application/json")
    ]
    given = False

    async def receive() -> dict:
        nonlocal given
        if given:
            return await request.receive()
        given = True
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request({**request.scope, "headers": headers}, receive)

"""The server's ASGI app: its routes, the middleware counting responses, and the errors as
OpenAI's error bodies.

Endpoints: /health, /metrics, /v1/models, /v1/completions, /v1/chat/completions, /v1/inspect,
/tokenize, /detokenize and /tokenizer_info; and the playground, a page at / with its files under /ui.
A route checks the request (`gpt2.serve.protocol`), and a completion is served by
`gpt2.serve.completions` over the scheduler's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from gpt2._checks import check_token_ids, is_integer
from gpt2.errors import GPT2Error
from gpt2.model import GPT2
from gpt2.serve.chat import ChatResponse, parse_chat
from gpt2.serve.completions import answer
from gpt2.serve.inspection import inspection_json, parse_inspect
from gpt2.serve.protocol import AllowedSpecial, Limits, RequestError, encode_text, parse_completion
from gpt2.serve.scheduler import Metrics
from gpt2.serve.server import Server
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.chat import ChatTemplate


def create_app(load: Callable[[], tuple[GPT2, Tokenizer]], model_id: str, limits: Limits = Limits(), *,
               allowed_special: AllowedSpecial = "all", load_in_background: bool = True, ui: bool = True,
               load_draft: Callable[[], tuple[GPT2, Tokenizer]] | None = None,
               chat_template: ChatTemplate | str | None = None) -> FastAPI:  # fmt: skip
    """The server's ASGI app; `load` returns the model and its tokenizer, in a thread of its own
    once the app starts (/health answers 503 until it has), or, with `load_in_background`
    False, when the caller runs `app.state.server.load_model()`: `serve` does, in the main
    thread, for a process that exits while a thread is inside torch aborts (see `serve`).
    `allowed_special` (the tokenizer's meaning) says which special tokens written in a string
    prompt, or in /tokenize's text, are read as such: "all" (as OpenAI's API), or frozenset() for text.
    `ui` serves the playground at /. `load_draft`, loaded after the model, returns a draft model
    and its tokenizer: decoding is then speculative (`gpt2.decoding.Decoder`), limits.draft_tokens a step.
    `chat_template` (a `ChatTemplate`, or its Jinja2 source) renders /v1/chat/completions'
    conversations; None: the model's own (its tokenizer's `chat_template`), if it has one."""
    if isinstance(chat_template, str):
        chat_template = ChatTemplate(chat_template)  # a template that does not compile fails now
    server = Server(load, model_id, limits, allowed_special, load_draft, chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            server.start()
        yield
        server.stop()

    app = FastAPI(title="gpt2", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(_CountRequests, metrics=server.metrics)
    _add_error_handlers(app)
    _add_routes(app, server)
    if ui:
        _add_playground(app)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: a refusal, a library error naming its field, or a bug."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return e.response()

    @app.exception_handler(GPT2Error)
    async def invalid(request: Request, e: GPT2Error) -> JSONResponse:
        return RequestError.invalid(e).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return RequestError(e.status_code, f"{request.method} {request.url.path}: {e.detail}").response()

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:  # a bug of ours: the server keeps serving
        return RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error").response()


ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/inspect", "/tokenize",
             "/detokenize", "/tokenizer_info", "/ui", "/")  # fmt: skip


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
    _add_model_routes(app, server)
    _add_tokenizer_routes(app, server)
    _add_completion_routes(app, server)


def _add_model_routes(app: FastAPI, server: Server) -> None:
    """/health, /metrics and /v1/models: the server and what it serves."""

    @app.get("/health")
    async def health() -> JSONResponse:
        server.check_ready()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        card = {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "gpt2"}
        if server.ready.is_set():  # and vLLM's context size, and the parameter count, once they are known
            card.update(max_model_len=server.model.config.n_ctx, num_parameters=server.model.num_parameters())
        return card

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        server.check_key(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> JSONResponse:
        server.check_key(request)
        server.check_model(model)
        return JSONResponse(model_card())


def _add_tokenizer_routes(app: FastAPI, server: Server) -> None:
    """/tokenize and /detokenize speak both llama.cpp's fields ("content") and vLLM's ("prompt"),
    which lm-evaluation-harness's remote tokenizer uses, with /tokenizer_info."""

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
            check_token_ids(min(tokens), max(tokens), server.model.config.n_vocab, param="tokens")
        text = server.tokenizer.decode(tokens)
        return JSONResponse({"content": text, "prompt": text})


def _add_completion_routes(app: FastAPI, server: Server) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await server.body(request)
        server.check_model(body.get("model") if isinstance(body, dict) else None)
        config = server.model.config
        completion = parse_completion(body, server.tokenizer, config.n_vocab, config.n_ctx, server.limits, server.allowed_special)
        return await answer(server, request, completion)

    @app.post("/v1/inspect")
    async def inspect(request: Request) -> Response:
        body = await server.body(request)
        server.check_model(body.get("model") if isinstance(body, dict) else None)
        asked = parse_inspect(body, server.tokenizer, server.model, server.limits, server.allowed_special)
        async with server.inspecting:  # one at a time, beside the decoding thread: each holds T x T per head
            content = await asyncio.to_thread(inspection_json, server.model, server.tokenizer, asked)
        return Response(content, media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await server.body(request)
        server.check_model(body.get("model") if isinstance(body, dict) else None)
        template, config = server.template(), server.model.config
        completion = parse_chat(body, template, server.tokenizer, config.n_vocab, config.n_ctx, server.limits)
        return await answer(server, request, completion, partial(ChatResponse, reply_prefix=server.reply_prefix))


# The page may load only its own files and talk only to its own server: nothing from elsewhere.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


def _add_playground(app: FastAPI) -> None:
    """The playground: its page at / and its script and style under /ui, files of this package,
    open as /health is (they hold no data: the page sends the API key to the API, as any client)."""
    page = files("gpt2.serve") / "ui" / "index.html"

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(str(page), media_type="text/html", headers={"Content-Security-Policy": PAGE_POLICY})

    app.mount("/ui", StaticFiles(packages=[("gpt2.serve", "ui")]), name="ui")

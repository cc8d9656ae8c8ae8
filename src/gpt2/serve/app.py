"""The server's ASGI app: its routes, the middleware counting responses, and the errors as
OpenAI's error bodies.

Endpoints: /health, /metrics, /v1/models, /v1/completions, /v1/chat/completions, /v1/inspect,
/v1/circuits/{scores,head,patching,attribution,graph,feature}, /tokenize, /detokenize and /tokenizer_info; with
runs, /v1/runs (training runs' records: a server of runs alone, no model, has /health, /v1/models listing none,
/v1/runs and the page); and the
playground, a page at / with its files under /ui;
/openapi.json and /docs describe them. A route's body is declared by its model in
`gpt2.serve.protocol` and checked by FastAPI; /v1/completions, /v1/chat/completions,
/v1/inspect and /v1/circuits/... have their modules' routers, and a completion is served by
`gpt2.serve.completions` over the scheduler's loop.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from gpt2._checks import check_token_ids
from gpt2.errors import GPT2Error, InvalidArgumentError
from gpt2.model.model import GPT2
from gpt2.serve import chat, circuits, completions, graphs, inspection
from gpt2.serve.protocol import AllowedSpecial, DetokenizeBody, Limits, RequestError, TokenizeBody, encode_text
from gpt2.serve.runs import RunsDirectory
from gpt2.serve.runs import router as runs_router
from gpt2.serve.scheduler import Metrics
from gpt2.serve.server import ModelRoute, Server
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.chat import ChatTemplate


def create_app(
    load: Callable[[], tuple[GPT2, Tokenizer | None]] | None,
    model_id: str | None,
    limits: Limits = Limits(),
    *,
    allowed_special: AllowedSpecial = "all",
    load_in_background: bool = True,
    ui: bool = True,
    load_draft: Callable[[], tuple[GPT2, Tokenizer | None]] | None = None,
    chat_template: ChatTemplate | str | None = None,
    transcoders: str | os.PathLike | None = None,
    feature_data: str | os.PathLike | None = None,
    runs: str | os.PathLike | None = None,
) -> FastAPI:
    """The server's ASGI app; `load` returns the model and its tokenizer (None: a model that comes with none,
    served on token ids, its requests of text refused with a 400 saying so), in a thread of its own
    once the app starts (/health answers 503 until it has), or, with `load_in_background`
    False, when the caller runs `app.state.server.load_model()`: `serve` does, in the main
    thread, for a process that exits while a thread is inside torch aborts (see `serve`).
    `allowed_special` (the tokenizer's meaning) says which special tokens written in a string
    prompt, or in /tokenize's text, are read as such: "all" (as OpenAI's API), or frozenset() for text.
    `ui` serves the playground at /. `load_draft`, loaded after the model, returns a draft model
    and its tokenizer: decoding is then speculative (`gpt2.generation.decoding.Decoder`), limits.draft_tokens a step.
    `chat_template` (a `ChatTemplate`, or its Jinja2 source) renders /v1/chat/completions'
    conversations; None: the model's own (its tokenizer's `chat_template`), if it has one.
    `transcoders`, a transcoder set's directory (`gpt2.inspect.load_transcoders`), and `feature_data`,
    a prepared data set's (`gpt2.inspect.read_windows`), load after the model: /v1/circuits/graph
    needs the first, /v1/circuits/feature both. `runs`, a training run's directory or a directory of runs, is
    served read-only at /v1/runs (`gpt2.serve.runs`); with it, `load` and `model_id` None serve no model: /health,
    /v1/runs and the playground (its Training view) alone."""
    if isinstance(chat_template, str):
        chat_template = ChatTemplate(chat_template)  # a template that does not compile fails now
    if load is None and runs is None:
        raise InvalidArgumentError("a server needs a model to load or runs to serve", "load", ("runs",))
    runs_directory = None if runs is None else RunsDirectory(runs)  # one not there fails now
    server = Server(load, model_id or "", limits, allowed_special, load_draft, chat_template, transcoders, feature_data)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background and load is not None:
            server.start()
        yield
        server.stop()

    app = FastAPI(title="gpt2", lifespan=lifespan, redoc_url=None)  # /openapi.json and /docs describe the API
    app.state.server = server
    app.add_middleware(_CountRequests, metrics=server.metrics)
    _add_error_handlers(app)
    _add_routes(app, server if load is not None else None, runs_directory)
    if ui:
        _add_playground(app)
    return app


def _add_routes(app: FastAPI, server: Server | None, runs: RunsDirectory | None) -> None:
    """The model's routes (server None: no model, a server of runs alone, ready as soon as it answers, its
    /v1/models an empty list), and /v1/runs: the runs' records, if any."""
    if server is not None:
        _add_model_routes(app, server)
        routers = (tokenizer_router, completions.router, chat.router, inspection.router, circuits.router, graphs.router)
        for router in routers:
            app.include_router(router)
    else:

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({"status": "ok"})

        @app.get("/v1/models")
        async def models(request: Request) -> JSONResponse:  # none: the page opens on its Training view
            request.app.state.server.check_key(request)
            return JSONResponse({"object": "list", "data": []})

    app.state.runs = runs
    app.include_router(runs_router)  # without runs, /v1/runs lists none


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: a refusal, a library error naming its field, or a bug."""

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def refused_body(
        request: Request, e: RequestValidationError
    ) -> JSONResponse:  # a body its route's model refuses
        body_model = request.scope["route"].body_model  # the route's (a ModelRoute's)
        return body_model.refusal(e.errors(), e.body, request.app.state.server.bounds()).response()

    @app.exception_handler(GPT2Error)
    async def invalid(request: Request, e: GPT2Error) -> JSONResponse:
        return RequestError.invalid(e).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return RequestError(e.status_code, f"{request.method} {request.url.path}: {e.detail}").response()

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:  # a bug of ours: the server keeps serving
        return RequestError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error").response()


ENDPOINTS = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/inspect",
    "/v1/circuits",
    "/v1/runs",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/ui",
    "/",
)


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


def _add_model_routes(app: FastAPI, server: Server) -> None:
    """/health, /metrics, /v1/models and /tokenizer_info: the server and what it serves."""

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

    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> JSONResponse:
        server.check_key(request)
        server.check_ready()
        tokenizer = server.text_tokenizer("/tokenizer_info")
        eot = tokenizer.eot_token
        special = None if eot is None else tokenizer.decode([eot])
        return JSONResponse(
            {
                "tokenizer_class": type(tokenizer).__name__,
                "eos_token": special,
                "bos_token": special,
                "pad_token": None,
                "model_max_length": server.model.config.n_ctx,
            }
        )


# /tokenize and /detokenize speak both llama.cpp's fields ("content") and vLLM's ("prompt"),
# which lm-evaluation-harness's remote tokenizer uses, with /tokenizer_info
tokenizer_router = APIRouter(route_class=ModelRoute)


@tokenizer_router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> JSONResponse:
    server: Server = request.app.state.server
    param = "content" if "content" in body.model_fields_set else "prompt"
    text = body.content if param == "content" else body.prompt
    if text is None:
        raise TokenizeBody.refuse(param, text, server.bounds())
    tokenizer = server.text_tokenizer("/tokenize")
    tokens = encode_text(tokenizer, text, server.allowed_special, param)  # as a completion's prompt reads it
    return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": server.model.config.n_ctx})


@tokenizer_router.post("/detokenize")
async def detokenize(body: DetokenizeBody, request: Request) -> JSONResponse:
    server: Server = request.app.state.server
    tokenizer = server.text_tokenizer("/detokenize")
    if body.tokens:
        check_token_ids(min(body.tokens), max(body.tokens), server.model.config.n_vocab, param="tokens")
    text = tokenizer.decode(body.tokens)
    return JSONResponse({"content": text, "prompt": text})


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

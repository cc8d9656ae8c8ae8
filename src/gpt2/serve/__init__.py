"""`gpt2 serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) with continuous batching.

    client requests ──> routes (the event loop) ──rows──> Scheduler (one thread) ──> Decoder
                    <── text, SSE chunks        <──(row, token)──┘

The routes' bodies are pydantic models, checked by FastAPI and described by /openapi.json and
/docs; the routes tokenize and turn tokens into OpenAI's responses; one
thread steps a `gpt2.generation.decoding.Decoder` over all rows in flight, so a request joins the running
batch at the next step and leaves it when it ends. Endpoints: /health, /v1/models,
/v1/completions, /v1/chat/completions (a conversation, through the chat template), /v1/inspect,
/v1/circuits/{scores,head,patching,attribution,graph,feature}, /tokenize, /detokenize, /tokenizer_info,
/metrics; /v1/runs (training runs followed as they are written; with runs alone, no model); and the
playground, a page at / (its files in ui/) made from /v1/completions, /v1/inspect, /v1/circuits and /v1/runs.

`<|endoftext|>` written in a string prompt (and in /tokenize's text) is the special token, as
OpenAI's API, vLLM and llama.cpp's server read it, unless the server was told otherwise
(`allowed_special`: the special tokens read as such; every other is text, never an error).

The rooms, as vLLM's `entrypoints/openai` keeps them:

    protocol     what a client may ask: each route's body declared once (pydantic), Limits, RequestError
    scheduler    the generation loop's thread over the decoder, and the metrics
    server       the state behind the routes: the model loading, readiness, API key, bodies (ModelRoute)
    completions  /v1/completions, and serving any completion: choices' text and logprobs, JSON or SSE
    chat         /v1/chat/completions: a conversation through the chat template, answered as chat
    inspection   /v1/inspect: one prompt's attention, log-probabilities and logit lens
    circuits     /v1/circuits/...: every head's scores, a head's ablation, activation patching, direct logit attribution
    graphs       /v1/circuits/graph and /feature: attribution graphs over --transcoders, a feature's contexts in
                 --feature-data
    runs         /v1/runs: training runs' log.jsonl and probes.jsonl (--runs), read as gpt2 train writes them
    app          create_app: the routers, middleware, error handlers, /tokenize, the playground's files
    launch       serve: the app on uvicorn, the model loading in the main thread
    cluster      serve_replicas: the app as N Ray Serve replicas behind Ray's HTTP proxy (--replicas, the cluster extra)
"""

from gpt2.serve.app import create_app
from gpt2.serve.chat import ChatResponse, parse_chat
from gpt2.serve.completions import ChoiceStream, CompletionResponse
from gpt2.serve.launch import check_port, listen, serve
from gpt2.serve.protocol import CompletionRequest, Limits, RequestError, parse_completion

__all__ = [
    "ChatResponse",
    "ChoiceStream",
    "CompletionRequest",
    "CompletionResponse",
    "Limits",
    "RequestError",
    "check_port",
    "create_app",
    "listen",
    "parse_chat",
    "parse_completion",
    "serve",
]

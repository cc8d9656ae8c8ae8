"""POST /v1/inspect: one prompt looked inside, from `gpt2.inspect`, for the playground's views
and for any client; POST /v1/walk: one prompt walked through the forward pass step by step (the
page's Walkthrough, `gpt2.inspect.walk`).

    {"prompt": "The dog chased the", "top_k": 5}
      -> {"tokens", "ids", "logprobs", "top_logprobs", "attention", "logit_lens"}

The answer holds every head's attention, n_layer x n_head x T x T numbers: Limits'
max_inspect_cells bounds it, so that one request cannot make the server build and send an
answer of gigabytes (the 124M model's 144 heads over its 1,024 positions would be 151 million).
Attention probabilities are rounded to 4 decimals, finer than a picture shows (the exact
tensors are `gpt2.inspect.trace`'s); log-probabilities are given as computed. A model that comes
with no tokenizer is inspected on a prompt of ids, each token written "token_id:N" (`protocol.token_name`).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpt2.inspect.tracing import logit_lens_top, next_token_report, trace
from gpt2.inspect.walkthrough import walk
from gpt2.model.model import GPT2
from gpt2.serve.protocol import AllowedSpecial, InspectBody, Limits, RequestError, WalkBody, parse_prompts, token_name
from gpt2.serve.server import ModelRoute, Server
from gpt2.tokenizer import Tokenizer

DECIMALS = 4  # of the attention probabilities


@dataclass(frozen=True)
class InspectRequest:
    ids: list[int]
    top_k: int = 5


router = APIRouter(route_class=ModelRoute)


@router.post("/v1/inspect")
async def inspect(body: InspectBody, request: Request) -> Response:
    server: Server = request.app.state.server
    asked = parse_inspect(body, server.tokenizer, server.model, server.limits, server.allowed_special)
    async with server.inspecting:  # one at a time, beside the decoding thread: each holds T x T per head
        content = await asyncio.to_thread(inspection_json, server.model, server.tokenizer, asked)
    return Response(content, media_type="application/json")


@router.post("/v1/walk")
async def walk_route(body: WalkBody, request: Request) -> Response:
    server: Server = request.app.state.server
    asked = parse_inspect(body, server.tokenizer, server.model, server.limits, server.allowed_special, "/v1/walk")
    text = body.prompt if isinstance(body.prompt, str) else None
    async with server.inspecting:
        # the top_k next tokens, fewer where the vocabulary is smaller (a client need not know its size)
        answer = await asyncio.to_thread(walk, server.model, asked.ids, min(asked.top_k, server.model.config.n_vocab))
    return Response(
        json.dumps(walked(answer, server.tokenizer, text, server.allowed_special)), media_type="application/json"
    )


def walked(answer: dict, tokenizer: Tokenizer | None, text: str | None, allowed_special: AllowedSpecial) -> dict:
    """`walk`'s answer in the API's words: tokens written as the completions API writes them, and
    the BPE merges of the prompt's text (the walk itself ran on the ids the server read from it)."""
    answer["tokens"] = [token_name(tokenizer, i) for i in answer["ids"]]
    for entry in answer["next"]:
        entry["token"] = token_name(tokenizer, entry["id"])
    if text is not None and isinstance(tokenizer, Tokenizer):
        answer["bpe"] = tokenizer.merge_steps(text, allowed_special=allowed_special)
    return answer


def parse_inspect(
    body: InspectBody,
    tokenizer: Tokenizer | None,
    model: GPT2,
    limits: Limits,
    allowed_special: AllowedSpecial = "all",
    route: str = "/v1/inspect",
) -> InspectRequest:
    """The request of a /v1/inspect body that FastAPI has checked against `InspectBody`: one
    prompt (text or ids) within the context, and an answer within the limit."""
    prompts = parse_prompts(body.prompt, tokenizer, model.config.n_vocab, allowed_special)
    if len(prompts) > 1:
        raise RequestError(400, f"{route} looks at one prompt at a time, got {len(prompts)}", "prompt")
    ids = prompts[0]
    check_context(ids, model.config.n_ctx)
    check_cells(len(ids), model, limits)
    return InspectRequest(ids, body.top_k)


def check_context(ids: list[int], n_ctx: int, param: str = "prompt") -> None:
    """Refuse a text past the model's context, in OpenAI's words (`param`: the field that holds it)."""
    if len(ids) > n_ctx:
        raise RequestError(
            400,
            f"This model's maximum context length is {n_ctx} tokens, however your {param} has "
            f"{len(ids)} tokens. Please reduce your {param}.",
            param,
            "context_length_exceeded",
        )


def check_cells(T: int, model: GPT2, limits: Limits) -> None:
    """Refuse T tokens whose attention probabilities, every head's T x T, are over max_inspect_cells."""
    config = model.config
    heads = config.n_layer * config.n_head
    cells, limit = heads * T**2, limits.max_inspect_cells
    if cells > limit:
        most = math.isqrt(limit // heads)
        raise RequestError(
            400,
            f"inspecting {T} tokens gives {config.n_layer} layers x {config.n_head} heads x "
            f"{T} x {T} = {cells:,} attention probabilities, over this server's limit of "
            f"{limit:,} (max_inspect_cells): at most {most} tokens for this model",
            "prompt",
            "inspection_too_large",
        )


def inspection(model: GPT2, tokenizer: Tokenizer | None, request: InspectRequest) -> dict:
    """The answer to /v1/inspect, tokens written as the completions API's logprobs write them.

    tokens, ids       the prompt
    logprobs          each token's log-probability given those before it (null for the first)
    top_logprobs      per position, the top_k next tokens: [{"token", "id", "logprob"}, ...]
    attention         [layer][head][query][key] probabilities (0 above the diagonal)
    logit_lens        [layer][position] {"token", "id", "prob"}: the top token read from the
                      residual stream entering block `layer` (layer n_layer: the output)
    """
    n_layer = model.config.n_layer
    patterns = [f"h.{i}.attn.pattern" for i in range(n_layer)]
    looked = trace(model, request.ids, names=["wte", "wpe", *(f"h.{i}" for i in range(n_layer)), *patterns])
    text = lambda i: token_name(tokenizer, i)  # noqa: E731
    report = next_token_report(looked, request.top_k)
    top = [
        [{"token": text(e["id"]), "id": e["id"], "logprob": e["logprob"]} for e in position]
        for position in report["top"]
    ]
    attention = torch.stack(
        [looked.activations[name] for name in patterns]
    ).double()  # (L, H, T, T); in float64, 4 decimals print as 4
    probs, ids = logit_lens_top(looked)  # (L + 1, T) each
    lens = [
        [{"token": text(i), "id": i, "prob": p} for i, p in zip(row_ids, row_probs)]
        for row_ids, row_probs in zip(ids.tolist(), probs.tolist())
    ]
    return {
        "tokens": [text(i) for i in request.ids],
        "ids": request.ids,
        "logprobs": report["logprobs"],
        "top_logprobs": top,
        "attention": attention.round(decimals=DECIMALS).cpu().tolist(),
        "logit_lens": lens,
    }


def inspection_json(model: GPT2, tokenizer: Tokenizer | None, request: InspectRequest) -> bytes:
    """The answer, encoded: run in a worker thread, for a long prompt's takes a second."""
    return json.dumps(inspection(model, tokenizer, request)).encode()

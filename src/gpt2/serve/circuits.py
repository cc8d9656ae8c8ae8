"""POST /v1/circuits/scores, /v1/circuits/head, /v1/circuits/patching, /v1/circuits/attribution:
the circuits experiments of `gpt2.inspect` on the served model, for the playground's views and any client.

    /v1/circuits/scores       {"prompt"}
      -> {"tokens", "ids", "scores": {kind: [layer][head] scores, or null}}
    /v1/circuits/head         {"prompt", "layer", "head", "top_k"}
      -> {"tokens", "ids", "layer", "head", "scores": {kind: score or null},
          "next": [{"token", "id", "before", "after"}]}
    /v1/circuits/patching     {"clean", "corrupted", "site", "answer", "other"}
      -> {"site", "axes", "clean", "corrupted", "answer", "other", "grid"}
    /v1/circuits/attribution  {"prompt", "answer", "other"}
      -> {"tokens", "ids", "answer", "other", "heads", "mlps", "embed", "biases", "total"}

scores: every head's three scores (`head_scores`; null for a kind the text gives no position to,
duplicate_token and induction on a text whose tokens never repeat). head: one head's, and the next token's
probabilities before and after the head's output (h.{layer}.attn.z) is zeroed. patching:
`activation_patching` with the metric `logit_diff(answer, other)`; a patched run per entry of the
site's grid, each of the whole text, so limits.max_patching_tokens bounds entries x tokens.
attribution: `logit_attribution` at the last position. A token is written as in /v1/inspect:
{"token": text, "id": id} ("token_id:N" for a model that comes with no tokenizer, whose texts are
given as ids). Answer and other must be two tokens, given or defaulted: one token's
logit less its own is 0 whatever the model does (a grid of zeros, bars of zeros).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpt2._checks import check_answer_and_other, check_token_ids, one_token
from gpt2.generation.decoding import start_of_text
from gpt2.inspect.circuits import HEAD_SCORES, head_scores, logit_attribution, score_masks
from gpt2.inspect.patching import AXES, activation_patching, grid_shape, logit_diff
from gpt2.inspect.tracing import trace
from gpt2.model.model import GPT2
from gpt2.serve.inspection import check_cells, check_context
from gpt2.serve.protocol import (
    AttributionBody,
    HeadBody,
    Limits,
    PatchingBody,
    RequestError,
    ScoresBody,
    encode_text,
    token_name,
)
from gpt2.serve.server import ModelRoute, Server
from gpt2.tokenizer import Tokenizer, token_text

router = APIRouter(prefix="/v1/circuits", route_class=ModelRoute)


async def respond(server: Server, work: Callable[[], dict]) -> Response:
    async with server.inspecting:  # one inspection or experiment at a time, beside the decoding thread
        content = await asyncio.to_thread(lambda: json.dumps(work()).encode())
    return Response(content, media_type="application/json")


@router.post("/scores")
async def scores(body: ScoresBody, request: Request) -> Response:
    server: Server = request.app.state.server
    ids = read_text(server, body.prompt, "prompt")
    check_cells(len(ids), server.model, server.limits)  # the scores read every head's pattern
    return await respond(server, lambda: scores_report(server.model, server.tokenizer, ids))


@router.post("/head")
async def head(body: HeadBody, request: Request) -> Response:
    server: Server = request.app.state.server
    body.within(server.bounds())
    ids = read_text(server, body.prompt, "prompt")
    check_cells(len(ids), server.model, server.limits)  # the scores read every head's pattern
    return await respond(
        server, lambda: head_report(server.model, server.tokenizer, ids, body.layer, body.head, body.top_k)
    )


@router.post("/patching")
async def patching(body: PatchingBody, request: Request) -> Response:
    server: Server = request.app.state.server
    clean, corrupted = read_text(server, body.clean, "clean"), read_text(server, body.corrupted, "corrupted")
    if len(clean) != len(corrupted):
        raise RequestError(
            400,
            f"clean and corrupted must have the same length: clean has {len(clean)} tokens, corrupted {len(corrupted)}",
            "corrupted",
        )
    check_patching_work(body.site, len(clean), server.model, server.limits)
    answer, other = read_answers(server, body.answer, body.other)
    return await respond(
        server, lambda: patching_report(server.model, server.tokenizer, clean, corrupted, body.site, answer, other)
    )


@router.post("/attribution")
async def attribution(body: AttributionBody, request: Request) -> Response:
    server: Server = request.app.state.server
    ids = read_text(server, body.prompt, "prompt")
    answer, other = read_answers(server, body.answer, body.other)
    return await respond(server, lambda: attribution_report(server.model, server.tokenizer, ids, answer, other))


# ------------------------------------------------------------------ reading a request


def read_text(server: Server, text: str | list[int], param: str) -> list[int]:
    """The ids of one text (a string, or ids within the vocabulary) within the context."""
    if isinstance(text, str):
        ids = encode_text(server.tokenizer, text, server.allowed_special, param)
    else:
        ids = text
        check_token_ids(min(ids), max(ids), server.model.config.n_vocab, f" in {param}", param=param)
    ids = start_of_text(ids, None if server.tokenizer is None else server.tokenizer.eot_token)
    check_context(ids, server.model.config.n_ctx, param)
    return ids


def read_answers(server: Server, answer: str | int | None, other: str | int | None) -> tuple[int | None, int | None]:
    """The ids of a request's answer and other (None: the route's default), two different tokens where both are
    given."""
    n_vocab, allowed = server.model.config.n_vocab, server.allowed_special
    answer, other = (
        None if t is None else one_token(t, server.tokenizer, n_vocab, name, allowed)
        for t, name in ((answer, "answer"), (other, "other"))
    )  # a GPT2Error is a 400 naming its param (the app's handler)
    if answer is not None:
        check_two_tokens(server.tokenizer, answer, other)
    return answer, other


def check_two_tokens(tokenizer: Tokenizer | None, answer: int, other: int | None, defaulted: str = "") -> None:
    """Refuse an other that is the answer's token (`check_answer_and_other`), a 400 naming other;
    `defaulted`: which of them the route chose, and how."""
    check_answer_and_other(answer, other, None if tokenizer is None else token_text(tokenizer, answer), defaulted)


def check_patching_work(site: str, T: int, model: GPT2, limits: Limits) -> None:
    """Refuse a patching grid whose runs (one per entry, T tokens each) are over max_patching_tokens."""
    config = model.config

    def tokens(T: int) -> int:  # the grid's entries, a run of T tokens each
        return math.prod(grid_shape(site, config.n_layer, config.n_head, T)) * T

    limit = limits.max_patching_tokens
    if tokens(T) > limit:
        most = next(t for t in range(T - 1, 0, -1) if tokens(t) <= limit) if tokens(1) <= limit else 0
        raise RequestError(
            400,
            f"patching {site} over {T} tokens runs the model {tokens(T) // T:,} times over {T} tokens = "
            f"{tokens(T):,} tokens, over this server's limit of {limit:,} (max_patching_tokens): at most "
            f"{most} tokens for this site and model",
            "clean",
            "patching_too_large",
        )


# ------------------------------------------------------------------ the experiments


def _token(tokenizer: Tokenizer | None, i: int) -> dict:
    return {"token": token_name(tokenizer, i), "id": i}


def all_head_scores(model: GPT2, ids: list[int]) -> dict[str, list[list[float]] | None]:
    """Each kind's (n_layer, n_head) scores as lists; None for a kind the text gives no position to."""
    return {
        kind: head_scores(model, ids, kind).tolist() if score_masks(ids, kind)[1].any() else None
        for kind in HEAD_SCORES
    }


def scores_report(model: GPT2, tokenizer: Tokenizer | None, ids: list[int]) -> dict:
    """The answer of /v1/circuits/scores: every head's scores, for a map of the heads."""
    return {"tokens": [token_name(tokenizer, i) for i in ids], "ids": ids, "scores": all_head_scores(model, ids)}


def head_report(model: GPT2, tokenizer: Tokenizer | None, ids: list[int], layer: int, head: int, top_k: int) -> dict:
    """The answer of /v1/circuits/head (see the module's docstring)."""
    scores = {
        kind: None if all_heads is None else all_heads[layer][head]
        for kind, all_heads in all_head_scores(model, ids).items()
    }

    def ablate(z: torch.Tensor) -> torch.Tensor:  # (H, T, d), the pass's own copy
        z[head] = 0
        return z

    before = torch.softmax(trace(model, ids, names=()).logits[-1].float(), -1)  # (V,)
    after = torch.softmax(trace(model, ids, patch={f"h.{layer}.attn.z": ablate}, names=()).logits[-1].float(), -1)
    top = before.topk(top_k).indices.tolist()
    top += [i for i in after.topk(top_k).indices.tolist() if i not in top]  # the tokens the ablation brings up too
    next_ = [{**_token(tokenizer, i), "before": float(before[i]), "after": float(after[i])} for i in top]
    return {
        "tokens": [token_name(tokenizer, i) for i in ids],
        "ids": ids,
        "layer": layer,
        "head": head,
        "scores": scores,
        "next": next_,
    }


def patching_report(
    model: GPT2,
    tokenizer: Tokenizer | None,
    clean: list[int],
    corrupted: list[int],
    site: str,
    answer: int | None,
    other: int | None,
) -> dict:
    """The answer of /v1/circuits/patching: the grid, and the metric of the clean and corrupted runs."""
    clean_logits, corrupted_logits = (trace(model, ids, names=()).logits for ids in (clean, corrupted))
    defaulted = [
        f"{name}: the {run} run's top token"
        for name, run, given in (("answer", "clean", answer), ("other", "corrupted", other))
        if given is None
    ]
    answer = int(clean_logits[-1].argmax()) if answer is None else answer
    other = int(corrupted_logits[-1].argmax()) if other is None else other
    check_two_tokens(tokenizer, answer, other, "; ".join(defaulted))
    metric = logit_diff(answer, other)
    grid = activation_patching(model, clean, corrupted, metric, site)

    def run(ids: list[int], logits) -> dict:
        return {"tokens": [token_name(tokenizer, i) for i in ids], "ids": ids, "logit_diff": float(metric(logits))}

    return {
        "site": site,
        "axes": list(AXES[site]),
        "clean": run(clean, clean_logits),
        "corrupted": run(corrupted, corrupted_logits),
        "answer": _token(tokenizer, answer),
        "other": _token(tokenizer, other),
        "grid": grid.tolist(),
    }


def attribution_report(
    model: GPT2, tokenizer: Tokenizer | None, ids: list[int], answer: int | None, other: int | None
) -> dict:
    """The answer of /v1/circuits/attribution: `logit_attribution`'s parts at the last position."""
    if answer is None:
        answer = int(trace(model, ids, names=()).logits[-1].argmax())
        check_two_tokens(tokenizer, answer, other, "answer: the top token")
    parts = logit_attribution(model, ids, answer, other)
    return {
        "tokens": [token_name(tokenizer, i) for i in ids],
        "ids": ids,
        "answer": _token(tokenizer, answer),
        "other": None if other is None else _token(tokenizer, other),
        "heads": parts.heads.tolist(),
        "mlps": parts.mlps.tolist(),
        "embed": parts.embed,
        "biases": parts.biases.tolist(),
        "total": parts.total,
    }

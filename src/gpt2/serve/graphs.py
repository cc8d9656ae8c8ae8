"""POST /v1/circuits/graph, /v1/circuits/feature: attribution graphs over the server's transcoders
(`gpt2 serve --transcoders DIR`) and their features' top contexts in its data (`--feature-data DIR`),
for the playground's Graph view and any client.

    /v1/circuits/graph    {"prompt", "node_threshold", "edge_threshold", "max_feature_nodes"}
      -> circuit-tracer's graph file {"metadata", "qParams", "nodes", "links"} (its viewer's format),
         and "replacement", "completeness": the graph's scores
    /v1/circuits/feature  {"layer", "feature", "top_k"}
      -> {"layer", "feature", "contexts": [{"row", "position", "activation", "ids", "tokens", "activations"}]}

graph: `attribution_graph` of the next token after the prompt (<|endoftext|> put first where the
vocabulary has it), pruned at the thresholds (`AttributionGraph.to_json`); scores, of the whole graph
(`AttributionGraph.scores`). A node's id is circuit-tracer's: a feature's "{layer}_{feature}_{position}".
Its prompt is read as /v1/circuits/scores reads one (text, or ids for a model with no tokenizer), and is
at most limits.max_graph_tokens long; its feature nodes are the limits.max_graph_features most influential
at most (fewer where max_feature_nodes asks). feature: `top_contexts` over the first windows of the feature
data, read once at the start (`Server.feature_windows`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpt2.inspect.dashboards import top_contexts
from gpt2.inspect.graphs import attribution_graph, graph_input
from gpt2.inspect.transcoders import TranscoderSet
from gpt2.model.model import GPT2
from gpt2.serve.circuits import read_text, respond
from gpt2.serve.protocol import FeatureBody, GraphBody, Limits, RequestError
from gpt2.serve.server import ModelRoute, Server

router = APIRouter(prefix="/v1/circuits", route_class=ModelRoute)
SLUG = "playground"  # the graph file's slug (its name in circuit-tracer's viewer)


@router.post("/graph")
async def graph(body: GraphBody, request: Request) -> Response:
    server: Server = request.app.state.server
    transcoders = server_transcoders(server)
    read = read_text(server, body.prompt, "prompt")
    ids, _ = graph_input(server.model, read, None)  # <|endoftext|> first, as the graph runs it
    check_graph_tokens(len(ids), len(ids) > len(read), server.limits)
    prompt = body.prompt if isinstance(body.prompt, str) else None
    return await respond(server, lambda: graph_report(server.model, transcoders, ids, body, prompt, server.limits))


@router.post("/feature")
async def feature(body: FeatureBody, request: Request) -> Response:
    server: Server = request.app.state.server
    body.within(server.bounds())
    transcoders = server_transcoders(server)
    if server.feature_windows is None:
        raise RequestError(
            400,
            "the server has no feature data to find a feature's contexts in: start it with gpt2 serve "
            "--feature-data DIR (a directory gpt2 prepare wrote)",
            code="feature_data_required",
        )
    return await respond(
        server,
        lambda: {
            "layer": body.layer,
            "feature": body.feature,
            "contexts": top_contexts(
                server.model, transcoders, server.feature_windows, body.layer, body.feature, body.top_k
            ),
        },
    )


def server_transcoders(server: Server) -> TranscoderSet:
    """The server's transcoder set, or a 400 saying how to give it one."""
    if server.transcoders is None:
        raise RequestError(
            400,
            "the server has no transcoders: start it with gpt2 serve --transcoders DIR (a transcoder set, "
            "circuit-tracer's or SAELens's)",
            code="transcoders_required",
        )
    return server.transcoders


def check_graph_tokens(T: int, bos: bool, limits: Limits) -> None:
    """Refuse a graph of more than max_graph_tokens positions (`bos`: <|endoftext|> was put first), or of
    one: its first position has no features (circuit-tracer's), so a graph of one has nothing to draw."""
    if T < 2:
        raise RequestError(
            400,
            "the prompt is 1 token: an attribution graph leaves its first position out (it has no features), so "
            "it needs a token after it",
            "prompt",
        )
    limit = limits.max_graph_tokens
    if T > limit:
        raise RequestError(
            400,
            f"the prompt is {T} tokens{' with <|endoftext|> put first' if bos else ''}, over this server's "
            f"limit of {limit} for an attribution graph (max_graph_tokens): give a shorter prompt",
            "prompt",
            "graph_too_large",
        )


def graph_report(
    model: GPT2, transcoders: TranscoderSet, ids: list[int], body: GraphBody, prompt: str | None, limits: Limits
) -> dict:
    """The answer of /v1/circuits/graph: the pruned graph's file, and the whole graph's scores."""
    most = limits.max_graph_features  # the request's max_feature_nodes, or else this server's cap, at most it
    wanted = most if body.max_feature_nodes is None else min(body.max_feature_nodes, most)
    computed = attribution_graph(model, ids, transcoders, max_feature_nodes=wanted)
    scan = "gpt2" if transcoders.path is None else transcoders.path.name
    data = computed.to_json(SLUG, scan, body.node_threshold, body.edge_threshold, prompt)
    replacement, completeness = computed.scores()
    return {**data, "replacement": replacement, "completeness": completeness}

"""`gpt2 serve`: OpenAI's completions and chat completions APIs over HTTP (gpt2.serve)."""

from __future__ import annotations

import argparse
import os
import sys

from gpt2.cli.common import HelpFormatter, UsageError, whole_number
from gpt2.cli.options import (
    add_chat_template_flag,
    add_cuda_graphs_flag,
    add_draft_flags,
    add_inference_device_flags,
    add_model_flag,
    add_special_as_text_flag,
    allowed_special,
    check_cuda_graph_flags,
    draft_tokens_need_a_draft,
    draft_tokens_of,
    load_model,
    model_configs,
    read_chat_template,
)


def cmd(args: argparse.Namespace) -> int:
    from gpt2.devices import resolve_device, weight_format

    try:
        from gpt2.serve import Limits, serve
    except ModuleNotFoundError as e:
        if e.name not in ("fastapi", "pydantic", "starlette", "uvicorn", "prometheus_client"):
            raise
        raise UsageError(
            f"gpt2 serve needs the serve extra ({e.name} is not installed): pip install 'gpt2[serve]'"
        ) from None

    if args.model is None and args.runs is not None:
        return _runs_alone(args)
    if args.model is None:
        args.model = "gpt2"  # --model's default, where --runs does not stand alone
    draft_tokens_need_a_draft(args)
    from gpt2.generation.lookup import lookup_of

    lookup_of(args.speculative, args.prompt_lookup_max, args.prompt_lookup_min, args.draft)  # not with --draft-model
    chat_template = read_chat_template(args)  # a bad file fails now, before the model loads
    inspect_limits = {
        name: getattr(args, name)
        for name in ("max_inspect_cells", "max_patching_tokens", "max_graph_tokens", "max_graph_features")
        if getattr(args, name) is not None
    }
    limits = Limits(
        max_batch_size=args.max_batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_cache_mb=args.prefix_cache_mb,
        max_queue=args.max_queue,
        max_n=args.max_n,
        api_key=args.api_key,
        speculative=args.speculative,
        prompt_lookup_max=args.prompt_lookup_max,
        prompt_lookup_min=args.prompt_lookup_min,
        **inspect_limits,
        **draft_tokens_of(args),
    )  # checked as made, --draft-tokens with them
    device = resolve_device(args.device)
    form = weight_format(args.dtype, device)  # bad flags fail now, not once the server listens (--port: when it would)
    check_cuda_graph_flags(args)
    for config in model_configs(args):
        limits.check_memory(config, device, form.compute)

    def listening(url: str, how: str = "", local=None) -> None:
        page = "" if args.no_ui else f"; the playground on {url.removesuffix('/v1')}/"
        if args.runs is not None:
            page += f"; the training runs in {args.runs} on {url}/runs"
        if how:  # the replicas have loaded
            where = ""
            if local is not None:  # a cluster started here, whose token Ray's clients send
                where = (
                    f"; a Ray cluster of this machine at {local.address}, its dashboard on {local.dashboard} "
                    f"(RAY_AUTH_MODE=token serve status -a {local.dashboard})"
                )
            print(f"gpt2: serving {args.model} as {how} on {url}{page}{where}", file=sys.stderr)
            return
        print(
            f"gpt2: serving {args.model} on {url}{page} (loading the model; GET /health answers 200 once it has)",
            file=sys.stderr,
        )

    # a model that comes with no tokenizer is served too, on token ids (its tokenizer None): the requests that are
    # text are refused, each with a 400 saying so
    load_draft = None if args.draft is None else lambda: load_model(args, args.draft, needs=None)
    app_options = dict(
        allowed_special=allowed_special(args),
        ui=not args.no_ui,
        load_draft=load_draft,
        chat_template=chat_template,
        transcoders=args.transcoders,
        feature_data=args.feature_data,
        runs=args.runs,
    )
    if args.replicas is not None:
        return _replicas(args, limits, app_options, listening)
    serve(
        lambda: load_model(args, needs=None),
        args.model,
        args.host,
        args.port,
        limits,
        on_listen=listening,
        **app_options,
    )
    return 0


def _replicas(args: argparse.Namespace, limits, app_options: dict, listening) -> int:
    """gpt2 serve --replicas N: the same app, N times, as Ray Serve replicas behind Ray's HTTP proxy."""
    from gpt2._checks import positive_int
    from gpt2.serve import create_app
    from gpt2.serve.cluster import serve_replicas

    positive_int("replicas", args.replicas)  # before Ray starts

    def build():  # in each replica: its app, whose model it loads before Ray counts it as running
        return create_app(
            lambda: load_model(args, needs=None), args.model, limits, load_in_background=False, **app_options
        )

    def ready(url: str, local) -> None:
        listening(url, f"{args.replicas} Ray Serve replicas", local)

    def starting() -> None:
        print(f"gpt2: starting {args.replicas} Ray Serve replicas of {args.model} (each loads it)", file=sys.stderr)

    serve_replicas(
        build,
        args.replicas,
        args.host,
        args.port,
        threads=args.threads,
        gpus=1 if args.device.startswith("cuda") else 0,
        limits=limits,
        on_start=starting,
        on_listen=ready,
    )
    return 0


# what serves a model, and so needs --model beside --runs: (dest, flag)
MODEL_FLAGS = (
    ("draft", "--draft-model"),
    ("speculative", "--speculative"),
    ("chat_template", "--chat-template"),
    ("transcoders", "--transcoders"),
    ("feature_data", "--feature-data"),
)


def _runs_alone(args: argparse.Namespace) -> int:
    """gpt2 serve --runs DIR without --model: the runs' records (/v1/runs) and the page, which opens on its
    Training view; no model."""
    from gpt2.serve import Limits, serve

    given = [flag for dest, flag in (*MODEL_FLAGS, ("replicas", "--replicas")) if getattr(args, dest) is not None]
    if given:
        raise UsageError(f"{given[0]} serves with a model: give --model too (--runs without --model serves none)")

    def listening(url: str) -> None:
        page = "" if args.no_ui else f"; the playground's Training view on {url.removesuffix('/v1')}/"
        print(f"gpt2: serving the training runs in {args.runs} on {url}/runs{page} (no model)", file=sys.stderr)

    limits = Limits(api_key=args.api_key)
    serve(None, None, args.host, args.port, limits, on_listen=listening, ui=not args.no_ui, runs=args.runs)
    return 0


EXAMPLES = """\
examples:
  gpt2 serve                                        # gpt2 on http://127.0.0.1:8000/v1
  gpt2 serve --model out-char --port 8080 --max-batch-size 16
  GPT2_API_KEY=secret gpt2 serve --model gpt2-medium --host 0.0.0.0
  gpt2 serve --transcoders gpt2-transcoders --feature-data data/openwebtext   # the playground's Graph view
  gpt2 serve --runs out-induction-2l                # follow a training run in the playground's Training view
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
      -d '{"model": "gpt2", "prompt": "Alan Turing theorized that", "max_tokens": 20, "temperature": 0}'

OpenAI's completions API (/v1/completions, /v1/models) and, for a model with a chat template (its
own or --chat-template), its chat completions API (/v1/chat/completions), /v1/inspect (attention and the logit
lens of a prompt), /v1/circuits (head scores, patching, attribution; with --transcoders, attribution
graphs), llama.cpp's /tokenize and /detokenize, /health and Prometheus' /metrics; and the playground,
a page at / (open http://127.0.0.1:8000/ in a browser). Requests share one batch: each joins it at
the next token and leaves it when it ends. Ctrl-C or SIGTERM stops the server; requests in flight
get an error. A model that comes with no tokenizer (one trained here on a vocabulary of its own)
is served on token ids: /v1/completions takes a prompt of ids and answers with them (token_ids);
what is text (a text prompt, stop strings, chat) gets a 400. With --runs, /v1/runs serves training
runs' records as gpt2 train writes them, which the page's Training view follows; --runs without
--model serves no model, only the runs.
"""


def add_parser(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (needs the serve extra)",
        description=(
            "Serve a model over HTTP with OpenAI's completions and chat completions APIs, batching "
            "the requests in flight."
        ),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_model_flag(
        serve,
        "a released name or a local directory, as for generate; also the model's id in the API, less a trailing "
        "slash; with --runs and no --model, none is served",
    )
    serve.set_defaults(model=None)  # gpt2 (cmd sets it), unless --runs stands alone
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on; 0.0.0.0 for every interface (default: 127.0.0.1)"
    )
    serve.add_argument("--port", type=whole_number, default=8000, help="(default: 8000)")
    serve.add_argument(
        "--replicas",
        type=whole_number,
        metavar="N",
        help="serve N copies of the server, each with its model and batch, as Ray Serve replicas behind Ray's HTTP "
        "proxy on --host:--port (needs the cluster extra): on the Ray cluster at $RAY_ADDRESS, else on one started "
        "on this machine for the server; each replica takes --threads threads (default: its share of the cores)",
    )
    add_inference_device_flags(serve)
    add_cuda_graphs_flag(serve)
    add_special_as_text_flag(serve, "string prompts and /tokenize's text")
    add_draft_flags(serve)
    serve.add_argument(
        "--max-batch-size",
        type=whole_number,
        default=8,
        metavar="N",
        help="requests' rows decoded together; each holds a KV cache of the model's context (default: 8)",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=whole_number,
        default=512,
        metavar="N",
        help="tokens computed in one step, as vLLM's: prompts go in within it, a long one in chunks over "
        "several steps, so that the streams running keep flowing (default: 512)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=whole_number,
        default=512,
        metavar="MB",
        help="memory for the KV blocks of prompts kept for later prompts that begin the same way (a shared "
        "system prompt, few-shot examples, a context scored with several endings); the least recently "
        "used go first; 0 keeps none (default: 512)",
    )
    serve.add_argument(
        "--max-queue",
        type=whole_number,
        default=64,
        metavar="N",
        help="rows that may wait for a place in the batch; past it, requests get 429 (default: 64)",
    )
    serve.add_argument(
        "--max-n",
        type=whole_number,
        default=16,
        metavar="N",
        help="the largest n (choices) of a request (default: 16)",
    )
    serve.add_argument(
        "--max-inspect-cells",
        type=whole_number,
        metavar="N",
        help="the most attention probabilities (layers x heads x tokens x tokens) one /v1/inspect answer "
        "holds; about 6.5 bytes each in JSON (default: 4194304, 170 tokens of the 124M model)",
    )
    serve.add_argument(
        "--max-patching-tokens",
        type=whole_number,
        metavar="N",
        help="the most tokens one /v1/circuits/patching request runs through the model, a run of the whole "
        "text per patched activation (default: 16384: the 124M model's resid_pre grid up to 36 tokens)",
    )
    serve.add_argument(
        "--max-graph-tokens",
        type=whole_number,
        metavar="N",
        help="the longest prompt of a /v1/circuits/graph request, <|endoftext|> first included: the graph's "
        "matrix grows with the square of its active features (default: 64)",
    )
    serve.add_argument(
        "--max-graph-features",
        type=whole_number,
        metavar="N",
        help="the most feature nodes of a /v1/circuits/graph answer, its most influential (default: 4096)",
    )
    serve.add_argument(
        "--transcoders",
        metavar="DIR",
        help="a transcoder set (circuit-tracer's or SAELens's, one per block of the model), for /v1/circuits/graph "
        "and the playground's Graph view: a prompt's attribution graph",
    )
    serve.add_argument(
        "--feature-data",
        metavar="DIR",
        help="prepared data (gpt2 prepare) whose first 64 windows of 64 tokens /v1/circuits/feature searches for "
        "a transcoder feature's top contexts (with --transcoders)",
    )
    serve.add_argument(
        "--runs",
        metavar="DIR",
        help="training runs for /v1/runs and the playground's Training view, which follows them live: a run's "
        "directory (gpt2 train's --out) or a directory whose subdirectories are runs",
    )
    serve.add_argument("--no-ui", action="store_true", help="serve the API alone, without the playground page at /")
    add_chat_template_flag(serve, "/v1/chat/completions' conversations")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("GPT2_API_KEY"),
        metavar="KEY",
        help="require the header Authorization: Bearer KEY (default: $GPT2_API_KEY, else none)",
    )
    serve.set_defaults(func=cmd, engine="torch")

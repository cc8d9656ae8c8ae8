"""`gpt2 inspect`: what a model does with a text: its tokens' probabilities, the walkthrough, pictures, heads,
experiments, activation patching, SAE features and attribution graphs (gpt2.inspect); with --ids, on token ids, for a
model that comes with no tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from gpt2._checks import one_token
from gpt2.cli.common import (
    HelpFormatter,
    UsageError,
    command_line_text,
    read_stdin,
    token_ids,
    whole_number,
    without_final_newline,
)
from gpt2.cli.options import (
    add_ids_flag,
    add_inference_device_flags,
    add_model_flag,
    check_device,
    load_model,
    read_sampling,
)
from gpt2.settings import TEMPERATURE


def cmd(args: argparse.Namespace) -> int:

    from gpt2._files import writable_directory
    from gpt2.inspect import tracing, walk, walkthrough

    if args.graph is not None:
        return _cmd_inspect_graph(args)
    if args.transcoders is not None:
        raise UsageError("--transcoders is read by --graph: give --graph DIR too")
    if args.sae is not None:
        return _cmd_inspect_sae(args)
    if args.corrupted is not None:
        return _cmd_inspect_patching(args)
    if args.experiment is not None and (args.heads or args.repeat is not None):
        raise UsageError("give --heads or --experiment, not both")
    if args.experiment is not None:
        return _cmd_inspect_experiment(args)
    if args.heads or args.repeat is not None:
        return _cmd_inspect_heads(args)
    if args.text is None:
        raise UsageError(
            'no token ids: give them (e.g. gpt2 inspect --ids "464 3290 26172 262"), or - to read standard input'
            if args.ids
            else 'no text: give one (e.g. gpt2 inspect "The dog chased the"), or - to read standard input'
        )
    sampling = read_sampling(args)
    check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    text = _inspect_text(args)
    model, _ = load_model(args, needs=_needs_text(args))
    sampling.check_vocab(model.config.n_vocab)  # --top-k: here, not in next_token_report, whose k is no flag
    names = tracing.activation_names(model.config.n_layer, on_request=args.walk and not args.json)
    if args.walk and args.json:  # the walk as one JSON object: what the server's /v1/walk answers its page with
        if png is not None:
            _draw(tracing.trace(model, text, names=names, prepend_bos=args.prepend_bos), png, args.position, sampling)
        print(json.dumps(walk(model, _with_bos(model, text, args), args.top_k)))
        return 0
    trace = tracing.trace(model, text, names=names, prepend_bos=args.prepend_bos)
    if png is not None:
        _draw(trace, png, args.position, sampling)
    if args.walk:
        print("\n".join(walkthrough(trace, args.top_k)))
        return 0
    report = tracing.next_token_report(trace, args.top_k)
    if args.json:
        print(json.dumps({key: report[key] for key in ("tokens", "ids", "logprobs", "ranks", "top")}))
    else:
        color = args.color == "always" or (
            args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        )
        print("\n".join(_token_lines(report, color)))
    return 0


def _inspect_text(args: argparse.Namespace) -> str | list[int]:
    """gpt2 inspect's text: the argument, or standard input for -; never empty. With --ids, its token ids."""
    text = read_stdin() if args.text == "-" else command_line_text(args.text, "the text")
    if args.ids:
        return token_ids(text, "the text (--ids)")
    text = without_final_newline(text) if args.text == "-" else text
    if not text:
        raise UsageError("the text is empty: give at least one token's worth")
    return text


def _with_bos(model, text: str | list[int], args: argparse.Namespace) -> str | list[int]:
    """A text as ids after <|endoftext|> with --prepend-bos (ids run as given); else as it is."""
    from gpt2.inspect import tracing

    return tracing.token_ids(model, text, True)[0] if args.prepend_bos and isinstance(text, str) else text


def _text_or_ids(args: argparse.Namespace, text: str, what: str) -> str | list[int]:
    """A text given on the command line, or with --ids its token ids."""
    text = command_line_text(text, what)
    return token_ids(text, f"{what} (--ids)") if args.ids else text


def _needs_text(args: argparse.Namespace, needs: str = "the text needs one") -> str | None:
    """What of the command needs the model's tokenizer (`needs`: its text), and how to give ids instead; None with
    --ids, or where the view takes no text (--heads --repeat N, --experiment induction)."""
    if args.ids or args.text is None:
        return None
    return f'{needs}; give token ids with --ids (e.g. gpt2 inspect --ids "0 1 2"), or run --heads --repeat N'


def _given_token(args: argparse.Namespace, token: str | None, flag: str) -> str | int | None:
    """--answer or --other as given: a token's text, or with --ids its id."""
    if token is None or not args.ids:
        return token
    ids = token_ids(token, f"{flag} (--ids)")
    if len(ids) != 1:
        raise UsageError(f"{flag} is one token: with --ids, one id, got {len(ids)}: {token!r}")
    return ids[0]


def _cmd_inspect_experiment(args: argparse.Namespace) -> int:
    """gpt2 inspect --experiment NAME: a standard experiment on its built-in data, its metrics printed
    and, with --png, its patching (or head score) heat map and attribution bar chart drawn."""
    from gpt2._files import writable_directory
    from gpt2.inspect import experiments

    if args.text is not None:
        raise UsageError("--experiment runs on its own data: give no text")
    check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    model, tokenizer = load_model(args, needs=None)
    if tokenizer is None and args.experiment != "induction":
        raise UsageError(
            f"the {args.experiment} experiment's prompts are text, and the model {args.model} comes with no "
            "tokenizer to read them: on token ids, run --experiment induction or --heads --repeat N"
        )
    if args.corruption is not None and args.experiment != "ioi":
        raise UsageError(f"--corruption is the ioi experiment's, not {args.experiment}'s")
    options = {} if args.corruption is None else {"corruption": args.corruption}
    result = experiments.run_experiment(model, args.experiment, model_name=args.model, **options)
    print(
        f"{result.name}: {result.prompts} prompt{'s' * (result.prompts != 1)}; " + "; ".join(result.notes)
        if result.notes
        else f"{result.name}:"
    )
    for key, shown in result.shown().items():
        print(f"{key:<20} {shown}")
    n_head = model.config.n_head
    top = result.heads.flatten().abs().argsort(descending=True)[:5].tolist()
    print(
        f"top heads ({result.heads_title}): "
        + ", ".join(f"{i // n_head}.{i % n_head} {float(result.heads.flatten()[i]):.3f}" for i in top)
    )
    if png is not None:
        from gpt2.inspect import figures

        names = [f"{result.name}-heads.png"]
        figures.save(
            figures.head_grids({result.heads_title: result.heads}, result.name, signed=True, label=""), png / names[0]
        )
        if result.attribution is not None:
            names.append(f"{result.name}-attribution.png")
            figures.save(
                figures.attribution_bars(result.attribution, f"{result.name}: direct logit attribution"), png / names[1]
            )
        print(f"gpt2: wrote {len(names)} pictures in {png}: {', '.join(names)}", file=sys.stderr)
    return 0


def _cmd_inspect_patching(args: argparse.Namespace) -> int:
    """gpt2 inspect --corrupted TEXT CLEAN: activation patching at --site (patching.activation_patching)
    and its first-order estimate (attribution_patching), on the logit difference between --answer
    and --other after the last token: by default the clean run's next token and the corrupted run's."""
    from gpt2._checks import check_answer_and_other
    from gpt2._files import writable_directory
    from gpt2.inspect import activation_patching, attribution_patching, logit_diff, trace
    from gpt2.inspect.patching import AXES
    from gpt2.inspect.tracing import token_label
    from gpt2.tokenizer import token_text

    _alone(args, "--corrupted", "patches a clean text with a corrupted one")
    if args.text is None:
        raise UsageError('--corrupted needs the clean text too (e.g. gpt2 inspect --corrupted "... John" "... Mary")')
    check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    clean, corrupted = (
        _text_or_ids(args, t, what) for t, what in ((args.text, "the text"), (args.corrupted, "--corrupted"))
    )
    tokens_given = {
        flag: _given_token(args, token, flag) for flag, token in (("--answer", args.answer), ("--other", args.other))
    }
    model, _ = load_model(args, needs=_needs_text(args, "the texts need one"))
    clean, corrupted = (_with_bos(model, t, args) for t in (clean, corrupted))
    runs = {name: trace(model, text, names=()) for name, text in (("clean", clean), ("corrupted", corrupted))}
    answer = _one_token(model, tokens_given["--answer"], "answer", runs["clean"])
    other = _one_token(model, tokens_given["--other"], "other", runs["corrupted"])
    defaulted = [
        f"{name}: the {run} text's next token"
        for name, run, given in (("answer", "clean", args.answer), ("other", "corrupted", args.other))
        if given is None
    ]
    shown = None if model.tokenizer is None else token_text(model.tokenizer, answer)
    check_answer_and_other(answer, other, shown, "; ".join(defaulted))  # logit_diff's check, saying which were defaults
    metric = logit_diff(answer, other)
    grids = {
        how: patch(model, clean, corrupted, metric, args.site)
        for how, patch in (("activation patching", activation_patching), ("attribution patching", attribution_patching))
    }
    tokens = [
        token_label(t, i) for t, i in zip(runs["clean"].tokens or [None] * len(runs["clean"].ids), runs["clean"].ids)
    ]
    columns = tokens if AXES[args.site][1] == "position" else [str(h) for h in range(model.config.n_head)]
    diffs = {name: float(metric(run.logits)) for name, run in runs.items()}
    title = f"{args.site}: logit({_label(model, answer)}) - logit({_label(model, other)})"
    if png is not None:
        from gpt2.inspect import figures

        figures.save(figures.patching_grids(grids, columns, AXES[args.site][1], title), png / "patching.png")
        print(f"gpt2: wrote {png / 'patching.png'}", file=sys.stderr)
    _show_patching(args, grids, columns, title, diffs, {"answer": answer, "other": other}, runs["clean"])
    return 0


def _show_patching(args, grids: dict, columns: list[str], title: str, diffs: dict, tokens: dict, clean) -> None:
    """--corrupted's grids: one JSON object with --json, else a table a grid (a row a layer)."""

    from gpt2.inspect.patching import AXES

    if args.json:
        fields = {"site": args.site, **tokens, "logit_diff": diffs, "tokens": clean.tokens, "ids": clean.ids}
        print(json.dumps({**fields, **{how.split()[0]: grid.tolist() for how, grid in grids.items()}}))
        return
    print(f"{title}: clean {diffs['clean']:.3f}, corrupted {diffs['corrupted']:.3f}")
    for how, grid in grids.items():
        print(f"\n{how} (a row a layer, a column a {AXES[args.site][1]}):")
        print("      " + " ".join(f"{c[:7]:>7}" for c in columns))
        print("\n".join(f"{l:>5} " + " ".join(f"{v:7.3f}" for v in row.tolist()) for l, row in enumerate(grid)))


def _alone(args: argparse.Namespace, flag: str, does: str, *also: tuple[str, object]) -> None:
    """Refuse, naming the first, the other forms of gpt2 inspect given with `flag` (--corrupted, --sae)."""
    given = [
        other
        for other, on in (
            ("--heads", args.heads or args.repeat is not None),
            ("--experiment", args.experiment),
            ("--walk", args.walk),
            *also,
        )
        if on
    ]
    if given:
        raise UsageError(f"{flag} {does}: give it without {given[0]}")


def _one_token(model, token: str | int | None, flag: str, run) -> int:
    """--answer or --other: one token of the model's vocabulary (its text, or its id), or (none given) the run's
    next token."""
    if token is None:
        return int(run.logits[-1].argmax())
    return one_token(token, model.tokenizer, model.config.n_vocab, flag)


def _label(model, i: int) -> str:
    from gpt2.inspect.tracing import token_label

    return token_label(None if model.tokenizer is None else model.tokenizer.decode([i]), i)


def _cmd_inspect_graph(args: argparse.Namespace) -> int:
    """gpt2 inspect --graph DIR --transcoders TC TEXT: the attribution graph of the text's next token
    (graphs.attribution_graph), pruned and written into DIR as circuit-tracer's graph files; a summary."""
    from gpt2._files import writable_directory
    from gpt2.inspect import graphs, load_transcoders

    also = [("--sae", args.sae), ("--corrupted", args.corrupted), ("--json", args.json)]
    _alone(args, "--graph", "writes an attribution graph", *also)
    if args.transcoders is None:
        raise UsageError("--graph needs --transcoders DIR: the transcoder set (circuit-tracer's or SAELens's)")
    if args.text is None:
        raise UsageError('--graph needs a text (e.g. gpt2 inspect --graph out --transcoders tc "The dog chased the")')
    check_device(args)
    graphs.check_thresholds(args.node_threshold, args.edge_threshold)
    text = _inspect_text(args)
    out = writable_directory(args.graph)
    png = None if args.png is None else writable_directory(args.png)
    transcoders = load_transcoders(args.transcoders)  # a missing or broken file: one line, before the model loads
    model, _ = load_model(args, needs=_needs_text(args))
    transcoders.check_fits(model)
    graph = graphs.attribution_graph(
        model,
        text,
        transcoders,
        max_feature_nodes=args.max_feature_nodes,
        prepend_bos=args.prepend_bos or None,
        progress=sys.stderr.isatty(),
    )
    path = graph.save(
        out, args.slug, scan=args.transcoders, node_threshold=args.node_threshold, edge_threshold=args.edge_threshold
    )
    data = json.loads(path.read_text())
    if png is not None:
        from gpt2.inspect import figures

        figures.save(figures.attribution_graph(data), png / f"{args.slug}.png")
    replacement, completeness = graph.scores()
    top = graph.logit_texts[0]
    print(
        f"{path}: {len(data['nodes'])} nodes and {len(data['links'])} links kept of {len(graph.adjacency)} nodes "
        f"({graph.n_features} features, {graph.n_layer * graph.n_pos} errors, {graph.n_pos} tokens, {graph.n_logits} "
        f"logits); top logit {top!r} (p={graph.logit_probabilities[0].item():.3f}); replacement score "
        f"{replacement:.3f}, completeness {completeness:.3f}"
    )
    print(f"open it in circuit-tracer's viewer: circuit-tracer start-server --graph_file_dir {out}")
    return 0


def _cmd_inspect_sae(args: argparse.Namespace) -> int:
    """gpt2 inspect --sae DIR TEXT: each token's most active features of the SAE SAELens saved in
    DIR, at its hook (saes.sae_features); a line a token, or one JSON object."""

    from gpt2._checks import positive_int
    from gpt2.inspect import saes
    from gpt2.inspect.tracing import token_label, trace

    _alone(args, "--sae", "shows each token's SAE features", ("--png", args.png))
    if args.text is None:
        raise UsageError(
            '--sae needs a text (e.g. gpt2 inspect --sae DIR "The dog chased the"), or - to read standard input'
        )
    positive_int("top_k", args.top_k)
    check_device(args)
    text = _inspect_text(args)
    sae = saes.load_sae(args.sae)  # a missing or broken file: one line, before the model loads
    model, _ = load_model(args, needs=_needs_text(args))
    sae.check_fits(model)
    t = trace(model, text, names=sae.names(), prepend_bos=args.prepend_bos)
    top = saes.top_features(saes.sae_features(t, sae), args.top_k)
    tokens = t.tokens or [None] * len(t.ids)
    if args.json:
        print(
            json.dumps(
                {
                    "hook_name": sae.hook_name,
                    "d_sae": sae.d_sae,
                    "tokens": t.tokens,
                    "ids": t.ids,
                    "features": [[{"id": i, "value": v} for i, v in row] for row in top],
                }
            )
        )
        return 0
    width = max(12, *(len(token_label(token, i)) for token, i in zip(tokens, t.ids)))
    print(f"{'token':<{width}}  top {args.top_k} features of {sae.hook_name} (d_sae={sae.d_sae}): id value")
    for token, i, row in zip(tokens, t.ids, top):
        print(f"{token_label(token, i):<{width}}  " + ("  ".join(f"{f} {v:.3f}" for f, v in row) or "(none active)"))
    return 0


def _draw(trace, directory, position: int, sampling) -> None:
    from gpt2.inspect import figures

    pictures = {f"attention-block{i}.png": (figures.attention, i) for i in range(trace.model.config.n_layer)}
    pictures |= {"logit-lens.png": (figures.logit_lens,), "next-token.png": (figures.next_token, position, sampling)}
    for name, (draw, *how) in pictures.items():
        figures.save(draw(trace, *how), directory / name)
    print(f"gpt2: wrote {len(pictures)} pictures in {directory}: {', '.join(pictures)}", file=sys.stderr)


HEADS_SEED = 0  # --repeat's random tokens: torch.Generator().manual_seed(0), the same sequence each run


def _cmd_inspect_heads(args: argparse.Namespace) -> int:
    """gpt2 inspect --heads: every head's three scores (circuits.head_scores), on the text or on
    --repeat N random tokens written twice; a table each, or one JSON object, and a picture."""

    from gpt2._checks import positive_int
    from gpt2._files import writable_directory
    from gpt2.inspect import HEAD_SCORES, head_scores
    from gpt2.inspect.circuits import score_masks, score_tables

    if not args.heads:
        raise UsageError("--repeat is the length of --heads' random sequence: add --heads")
    if args.walk:
        raise UsageError("--walk walks through one forward pass; --heads scores every head: give one of them")
    if (args.text is None) == (args.repeat is None):
        raise UsageError(
            "give --heads a text, or --repeat N for N random tokens written twice"
            if args.text is None
            else "give --heads a text or --repeat N, not both"
        )
    if args.repeat is not None:
        positive_int("repeat", args.repeat)
    check_device(args)
    png = None if args.png is None else writable_directory(args.png)
    text = None if args.text is None else _inspect_text(args)
    model, tokenizer = load_model(args, needs=_needs_text(args))
    ids, what = _heads_input(model, tokenizer, None if text is None else _with_bos(model, text, args), args.repeat)
    scores = {kind: head_scores(model, ids, kind) if score_masks(ids, kind)[1].any() else None for kind in HEAD_SCORES}
    if png is not None:
        from gpt2.inspect import figures

        figures.save(figures.head_grids(scores, f"head scores on {what}"), png / "head-scores.png")
        print(f"gpt2: wrote {png / 'head-scores.png'}", file=sys.stderr)
    if args.json:
        print(json.dumps({kind: None if s is None else s.tolist() for kind, s in scores.items()}))
        return 0
    print("\n".join([f"head scores on {what}", ""] + score_tables(scores)))
    return 0


def _heads_input(model, tokenizer, text: str | list[int] | None, repeat: int | None) -> tuple[list[int], str]:
    """The ids --heads scores, and what they are in words: the text's tokens (or its ids), or --repeat N random
    tokens of the tokenizer's vocabulary (the model's, without one) written twice, after <|endoftext|> where it
    has one."""
    from gpt2.inspect import repeated_tokens, tracing

    if text is not None:
        ids, _ = tracing.token_ids(model, text)  # a text longer than the context: one line, naming both
        if len(ids) < 2:
            raise UsageError("the text is one token: head scores need two or more")
        return ids, f"the text's {len(ids)} tokens"
    start = None if tokenizer is None else tokenizer.eot_token
    length, n_ctx = 2 * repeat + (start is not None), model.config.n_ctx
    if length > n_ctx:
        most = (n_ctx - (start is not None)) // 2
        raise UsageError(
            f"--repeat {repeat} makes a sequence of {length} tokens "
            f"({'<|endoftext|>, then ' if start is not None else ''}"
            f"{repeat} random tokens twice), longer than the model's context of n_ctx={n_ctx}: "
            f"give --repeat {most} or less"
        )
    n_vocab = model.config.n_vocab if tokenizer is None else tokenizer.n_vocab
    ids = repeated_tokens(repeat, n_vocab, seed=HEADS_SEED, start=start)
    return ids, f"{repeat} random tokens written twice (seed {HEADS_SEED}, {length} tokens)"


# Surprise, as the terminal colours it: a probability at least this high, then its colour (256-colour ANSI).
_COLOURS = ((0.3, 34), (0.05, 178), (0.005, 208), (0.0, 196))


def _token_lines(report: dict, color: bool) -> list[str]:
    """Each token, the probability the model gave it and its rank, and what it expected instead."""
    from gpt2.inspect.tracing import alternatives
    from gpt2.inspect.tracing import token_label as shown

    tokens = report["tokens"] or [None] * len(report["ids"])
    width = max(12, *(len(shown(t, i)) for t, i in zip(tokens, report["ids"])))
    lines = [f"{'token':<{width}}  {'p':>7}  {'rank':>6}  expected instead (top {len(report['top'][0])})"]
    for t, (token, i, logprob, rank) in enumerate(zip(tokens, report["ids"], report["logprobs"], report["ranks"])):
        cell = shown(token, i)
        if logprob is None:
            lines.append(f"{cell:<{width}}  {'-':>7}  {'-':>6}")
            continue
        p = math.exp(logprob)
        if color:
            code = next(c for bound, c in _COLOURS if p >= bound)
            cell = f"\x1b[38;5;{code}m{cell}\x1b[0m" + " " * (width - len(cell))
        lines.append(f"{cell:<{width}}  {p:>7.2%}  {rank:>6}  {alternatives(report['top'][t - 1])}")
    lines.append(f"{'(next)':<{width}}  {'':>7}  {'':>6}  {alternatives(report['top'][-1])}")
    return lines


EXAMPLES = """\
examples:
  gpt2 inspect "The dog chased the cat"               # each token's probability, rank, alternatives
  gpt2 inspect --json "The dog chased the cat"
  gpt2 inspect --png pictures "The dog chased the cat" --temperature 0.7 --top-k 10
  gpt2 inspect --walk "Hello, world"                  # the forward pass, step by step
  gpt2 inspect --walk --json "Hello, world"           # the same as JSON: what the page's Walkthrough draws
  gpt2 inspect --heads --repeat 30                    # each head's scores: previous token, duplicate, induction
  gpt2 inspect --experiment ioi --png pictures        # indirect object identification: metrics, pictures
  gpt2 inspect --sae my-sae "The dog chased the cat"  # each token's top features of an SAE saved by SAELens
  gpt2 inspect --ids 3,14,15,9,3,14 --model out-ids   # token ids, for a model that comes with no tokenizer
  gpt2 inspect --graph graphs --transcoders tc "The capital of France is"  # circuit-tracer's attribution graph

--png DIR draws, for the text: attention-blockI.png (every head of block I), logit-lens.png (the
token each layer's residual stream predicts at each position) and next-token.png (the
distribution after --position before and after --temperature, --top-k and --top-p); with --heads,
head-scores.png (each head's three scores as layer x head heat maps). The Python
API, gpt2.inspect.trace, records every activation and can patch any of them.

A model that comes with no tokenizer (one trained here on a vocabulary of its own) is
inspected on token ids: --ids reads the text (and --corrupted's, --answer and --other) as
ids, and each token is shown as "id N"; --heads --repeat N and --experiment induction take no
text. The ioi and greater-than experiments are text, and need GPT-2's tokenizer.
"""


def add_parser(commands) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="look inside: each token's probability, the forward pass step by step, pictures",
        description="Run a model on a text and show what it made of each token; or walk through its forward "
        "pass (--walk), or draw its attention, logit lens and next-token distribution (--png).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    inspect.add_argument("text", nargs="?", help="the text, or - to read it from standard input")
    add_ids_flag(inspect, "the text (and --corrupted's, --answer and --other)")
    inspect.add_argument(
        "--prepend-bos",
        action="store_true",
        help="put <|endoftext|> before each text, as TransformerLens does by default (default: the text as given)",
    )
    add_model_flag(inspect)
    inspect.add_argument(
        "--top-k",
        type=whole_number,
        default=5,
        metavar="K",
        help="alternatives shown at each position; in next-token.png, the top-k filter (default: 5)",
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: tokens, ids, logprobs, ranks, top; with --heads, each kind's scores; with --walk, "
        "the walk (every step's shape, math and values, the BPE merges, the next tokens)",
    )
    inspect.add_argument(
        "--walk",
        action="store_true",
        help="print the forward pass, a line a step: shape, math, values (with --json: as one JSON object)",
    )
    inspect.add_argument(
        "--png",
        metavar="DIR",
        help="draw the pictures into DIR (needs matplotlib: the inspect extra); with --heads, head-scores.png",
    )
    inspect.add_argument(
        "--position",
        type=int,
        default=-1,
        metavar="P",
        help="next-token.png: the position whose next token is drawn, 0-based; -1 the last (default: -1)",
    )
    inspect.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help=f"next-token.png: the temperature applied (default: {TEMPERATURE})",
    )
    inspect.add_argument("--top-p", type=float, default=None, help="next-token.png: the top-p filter (default: off)")
    inspect.add_argument(
        "--heads",
        action="store_true",
        help="score every head: previous-token, duplicate-token and induction, on the text or on --repeat",
    )
    inspect.add_argument(
        "--repeat",
        type=whole_number,
        metavar="N",
        help="--heads: on N random tokens written twice (seed 0), the standard induction test",
    )
    inspect.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour tokens by surprise: auto does on a terminal without $NO_COLOR (default: auto)",
    )
    _add_inspect_experiment_flag(inspect)
    inspect.add_argument(
        "--corrupted",
        metavar="TEXT",
        help="activation and attribution patching: each activation of --site taken from the text into "
        "this corrupted one (of as many tokens), on the logit difference of --answer and --other",
    )
    inspect.add_argument(
        "--site",
        choices=["resid_pre", "resid_mid", "attn_out", "mlp_out", "head", "head_q", "head_k", "head_v", "head_pattern"],
        default="resid_pre",
        help="--corrupted: what is patched, a layer and a position at a time, or a head (its output, queries, keys, "
        "values or pattern at every position) (default: resid_pre)",
    )
    inspect.add_argument(
        "--answer",
        metavar="TOKEN",
        help="--corrupted: the token whose logit counts up (default: the text's next token)",
    )
    inspect.add_argument(
        "--other",
        metavar="TOKEN",
        help="--corrupted: the token whose logit counts down (default: the corrupted text's next token)",
    )
    inspect.add_argument(
        "--sae",
        metavar="DIR",
        help="each token's top --top-k features of the sparse autoencoder SAELens saved in DIR "
        "(cfg.json + sae_weights.safetensors), at its hook: blocks.L.hook_resid_pre and the like",
    )
    _add_inspect_graph_flags(inspect)
    add_inference_device_flags(inspect)
    inspect.set_defaults(func=cmd, engine="torch", cuda_graphs=False)


def _add_inspect_graph_flags(inspect) -> None:
    inspect.add_argument(
        "--graph",
        metavar="DIR",
        help="the attribution graph of the text's next token through --transcoders (circuit-tracer's method), "
        "pruned and written into DIR as circuit-tracer's graph files (DIR/SLUG.json, graph-metadata.json); "
        "with --png PNG_DIR, drawn as PNG_DIR/SLUG.png",
    )
    inspect.add_argument(
        "--transcoders",
        metavar="DIR",
        help="--graph: the transcoder set, one per block: circuit-tracer's (config.yaml + layer_{i}.safetensors) "
        "or SAELens's",
    )
    inspect.add_argument("--slug", default="graph", help="--graph: the graph's name, its file's (default: graph)")
    inspect.add_argument(
        "--node-threshold",
        type=float,
        default=0.8,
        help="--graph: keep the nodes holding this share of the influence on the logits (default: 0.8)",
    )
    inspect.add_argument(
        "--edge-threshold",
        type=float,
        default=0.98,
        help="--graph: then the edges holding this share (default: 0.98)",
    )
    inspect.add_argument(
        "--max-feature-nodes",
        type=whole_number,
        metavar="N",
        help="--graph: at most N feature nodes, the most influential (default: every active feature)",
    )


def _add_inspect_experiment_flag(inspect) -> None:
    inspect.add_argument(
        "--corruption",
        choices=["s2_io", "abc", "swap"],
        help="--experiment ioi: the prompts patching takes heads into: the second S made IO (s2_io, the "
        "default), three other names (abc), or IO and S exchanged (swap)",
    )
    inspect.add_argument(
        "--experiment",
        choices=["induction", "ioi", "greater-than"],
        help="run a standard experiment on its built-in data instead of a text: induction (head scores "
        "on a repeated random sequence), ioi (Wang et al. 2023's 15 templates), greater-than (Hanna et al. "
        "2023); prints its metrics, and --png draws its patching heat map and attribution bar chart",
    )

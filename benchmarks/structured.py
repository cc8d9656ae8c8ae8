"""Structured outputs and prompt-lookup speculation on the CPU (issue 39).

    .venv/bin/python benchmarks/structured.py [--quick] [--tokens 128] [--rounds 3] [--parts libraries,cost,lookup]

1. libraries: llguidance (what gpt2 compiles constraints with) against xgrammar, where it is
   installed (`pip install xgrammar`; not a dependency: it pulls in triton and transformers), on
   GPT-2's vocabulary: the time to read the vocabulary, to compile SCHEMA (cold: each library's
   cache off or new), and per token at batch 1 and 8 (the mask of allowed tokens, then the token
   accepted), along DOCUMENT's tokens; against a decode step of the 124M shape at batch 1 and 8,
   timed in the same run.
2. cost: gpt2's decoding at batch 1 and 8 on the 124M shape (random weights), sampled at
   temperature 1, without a constraint and with SCHEMA, in alternating rounds: tokens/s, and
   the ratio. A schema compiled again comes from the cache.
3. lookup: greedy decoding at batch 1, without speculation and with --speculative ngram (k 4,
   n 4 down to 2), in the same run: on the 124M shape (random weights: its greedy text falls
   into loops, which lookup drafts; and sampled text, which repeats nothing) and on the 2-layer
   model trained here to copy (tests/fixtures/induction_2l: a stretch of random tokens, then
   its beginning again, which it continues by copying). Acceptance, tokens per pass of the
   model, tokens/s, speed-up; greedy tokens are checked equal to those without speculation.

--quick: a smoke run (a 2-layer model of GPT-2's vocabulary, few tokens, one round), not a
measurement. Run the full one on a quiet machine: with 2 cores, any other process slows torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import print_table, random_124m, timed

from gpt2 import Tokenizer
from gpt2.generation.decoding import Row, run
from gpt2.generation.lookup import PromptLookup
from gpt2.generation.processors import Constraint, Processing, compile_constraint, ll_tokenizer
from gpt2.generation.sampling import Sampling
from gpt2.model.model import GPT2

ENC = Tokenizer.gpt2()
SCHEMA = {  # bounded: its documents end (json.dumps' separators, no other whitespace)
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "email", "tags", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "address": {
            "type": "object",
            "additionalProperties": False,
            "required": ["street", "city", "zip"],
            "properties": {
                "street": {"type": "string", "maxLength": 16},
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
        },
    },
}
DOCUMENT = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "email": "ada@example.org",
        "tags": ["math", "poetry", "engines"],
        "address": {"street": "12 St James's Sq", "city": "London", "zip": "10001"},
    }
)
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "induction_2l"


def decode_step_ms(model: GPT2, batch: int, repeat: int) -> float:
    """A decode step of `batch` rows (after a prompt of 16 tokens each), median milliseconds."""
    engine = model.engine(batch, 64)
    with torch.inference_mode():
        engine.extend(list(range(batch)), [0] * batch, [list(range(16))] * batch)
        tokens = torch.zeros(batch, dtype=torch.long)
        seconds, _ = timed(lambda: engine.decode(tokens), repeat)
    return seconds * 1e3


# ------------------------------------------------------------------ 1. libraries


def llguidance_times(ids: list[int], repeat: int) -> dict[str, float]:
    import llguidance

    from gpt2.generation.processors import JSON_OPTIONS, _Vocabulary

    start = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(ENC)))
    times = {"vocabulary": time.perf_counter() - start}

    def compile_schema():
        return llguidance.LLMatcher(
            tokenizer, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_OPTIONS)
        )

    times["compile"], matcher = timed(compile_schema, repeat)
    for batch in (1, 8):
        matchers = [matcher.deep_copy() for _ in range(batch)]
        start = time.perf_counter()
        for token in ids:
            for m in matchers:
                m.compute_bitmask()
                assert m.consume_token(token), m.get_error()
        times[f"token_b{batch}"] = (time.perf_counter() - start) / len(ids)
    return times


def xgrammar_times(ids: list[int], repeat: int) -> dict[str, float] | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    vocab = [ENC.decode_bytes([i]) for i in range(ENC.n_vocab)]
    start = time.perf_counter()
    info = xgr.TokenizerInfo(
        vocab, vocab_type=xgr.VocabType.RAW, vocab_size=ENC.n_vocab, stop_token_ids=[ENC.eot_token]
    )
    times = {"vocabulary": time.perf_counter() - start}

    def compile_schema():  # a new compiler each time: its cache would answer the second
        return xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": ")
        )

    times["compile"], compiled = timed(compile_schema, repeat)
    bitmask = xgr.allocate_token_bitmask(8, ENC.n_vocab)
    for batch in (1, 8):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        start = time.perf_counter()
        for token in ids:
            for b, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, b)
                assert m.accept_token(token), token
        times[f"token_b{batch}"] = (time.perf_counter() - start) / len(ids)
    return times


def libraries(model: GPT2, repeat: int) -> None:
    ids = ENC.encode(DOCUMENT) + [ENC.eot_token]
    step = {batch: decode_step_ms(model, batch, repeat) for batch in (1, 8)}
    results = {"llguidance": llguidance_times(ids, repeat), "xgrammar": xgrammar_times(ids, repeat)}
    rows = []
    for name, times in results.items():
        if times is None:
            rows.append([name, "not installed", "", "", ""])
            continue
        per_token = [
            f"{times[f'token_b{b}'] * 1e3:.3f} ms ({times[f'token_b{b}'] * 1e3 / step[b]:.1%} of a step)"
            for b in (1, 8)
        ]
        rows.append([name, f"{times['vocabulary'] * 1e3:.0f} ms", f"{times['compile'] * 1e3:.2f} ms", *per_token])
    print(
        f"DOCUMENT: {len(ids)} tokens; a decode step of the model: {step[1]:.1f} ms at batch 1, "
        f"{step[8]:.1f} ms at batch 8\n"
    )
    print_table(
        [
            "library",
            "read the vocabulary",
            "compile SCHEMA (median)",
            "per token, batch 1",
            "per token, batch 8 (all rows)",
        ],
        rows,
    )
    print()


# ------------------------------------------------------------------ 2. the cost of a constraint


def decode(
    model: GPT2, prompts: list[list[int]], new: int, sampling: Sampling, processing=None, lookup=None, seed: int = 0
):
    """Rows of `prompts` continued by `new` tokens at once: (rows, seconds, decoder stats); the engine
    allocated untimed."""
    rows = [
        Row(
            p,
            new,
            sampling,
            seed + i,
            ENC.eot_token if model.config.n_vocab == ENC.n_vocab else None,
            processing=processing,
        )
        for i, p in enumerate(prompts)
    ]
    engine = model.engine(len(rows), max(map(len, prompts)) + new)
    start = time.perf_counter()
    decoder = run(engine, rows, lookup=lookup)
    return rows, time.perf_counter() - start, decoder.stats


def cost(model: GPT2, new: int, rounds: int) -> None:
    start = time.perf_counter()
    compile_constraint(Constraint.json_schema(SCHEMA), ENC)  # the vocabulary read once, untimed as in a server
    first = time.perf_counter() - start
    start = time.perf_counter()
    processing = Processing(compiled=compile_constraint(Constraint.json_schema(SCHEMA), ENC))
    again = time.perf_counter() - start
    rows = []
    for batch in (1, 8):
        prompts = [ENC.encode(f"Person {i}:") for i in range(batch)]
        rates: dict[str, list[float]] = {"none": [], "SCHEMA": []}
        valid = 0
        for _ in range(rounds):
            for name in rates:
                done, seconds, _ = decode(model, prompts, new, Sampling(1.0), processing if name == "SCHEMA" else None)
                rates[name].append(sum(len(r.tokens) for r in done) / seconds)
                if name == "SCHEMA":
                    valid += sum(_valid(ENC.decode(r.tokens)) for r in done if r.finish_reason == "stop")
        plain, constrained = statistics.median(rates["none"]), statistics.median(rates["SCHEMA"])
        rows.append(
            [
                str(batch),
                f"{plain:.1f}",
                f"{constrained:.1f}",
                f"{constrained / plain:.1%}",
                f"{valid} of {batch * rounds}",
            ]
        )
    print(
        f"SCHEMA compiled: {first * 1e3:.0f} ms the first time (the vocabulary read with it), "
        f"{again * 1e6:.0f} us again (cached)\n"
    )
    print_table(
        [
            "batch",
            "tokens/s, no constraint",
            "tokens/s, SCHEMA",
            "constrained / unconstrained",
            "rows whose document ended (each valid)",
        ],
        rows,
    )
    print()


def _valid(text: str) -> bool:
    document = json.loads(text)  # raises if not JSON: never expected
    assert list(document) == ["name", "age", "email", "tags", "address"], document
    return True


# ------------------------------------------------------------------ 3. prompt lookup


def lookup_rows(
    model: GPT2, label: str, prompts: list[list[int]], new: int, sampling: Sampling, rounds: int
) -> list[list[str]]:
    lookup = PromptLookup()
    rates: dict[str, list[float]] = {"none": [], "ngram": []}
    for _ in range(rounds):
        results = {}
        for name in rates:
            per_prompt = [
                decode(model, [p], new, sampling, lookup=lookup if name == "ngram" else None, seed=i)
                for i, p in enumerate(prompts)
            ]
            rates[name].append(sum(len(r[0][0].tokens) for r in per_prompt) / sum(r[1] for r in per_prompt))
            results[name] = per_prompt
    stats = [r[2] for r in results["ngram"]]
    same = [r[0][0].tokens for r in results["ngram"]] == [r[0][0].tokens for r in results["none"]]
    if sampling.temperature == 0 and not same:
        raise SystemExit(f"{label}: greedy tokens with prompt lookup differ from those without")
    proposed, accepted = sum(s.proposed for s in stats), sum(s.accepted for s in stats)
    per_pass = sum(s.tokens for s in stats) / sum(s.passes for s in stats)
    plain, looked = statistics.median(rates["none"]), statistics.median(rates["ngram"])
    return [
        [
            label,
            f"{accepted / proposed:.0%}" if proposed else "(no drafts)",
            f"{per_pass:.2f}",
            f"{plain:.1f}",
            f"{looked:.1f}",
            f"{looked / plain:.2f}x",
            "yes" if same else "(other random draws)",
        ]
    ]


def echo_model(hf) -> GPT2:
    """The same weights with every block's output zeroed (attn.c_proj, mlp.c_proj): the residual
    stream is the token's embedding and its position's, and with tied embeddings each token
    predicts itself, so greedy text repeats the prompt's last token. A pass costs what the
    model's costs (the same matrices, multiplied by zeros): the case where every draft is kept."""
    import tempfile

    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".c_proj." in name:
                p.zero_()
    directory = tempfile.mkdtemp()
    hf.save_pretrained(directory)
    return GPT2.from_pretrained(directory, device="cpu")


def lookup(model: GPT2, echo: GPT2, trained: GPT2 | None, new: int, rounds: int, name: str) -> None:
    passage = (
        "The committee met on Tuesday to review the budget for the coming year. After a long discussion, the members "
        "agreed to fund the new library, to repair the bridge over the river, and to hire two more teachers."
    )
    copying = [
        ENC.encode(f"{passage}\n\nIn short: {passage[:60]}"),
        ENC.encode("def area(w, h):\n    return w * h\n\n\ndef area(w, h):"),
    ]
    rows = lookup_rows(model, f"{name}, greedy, prompts that repeat", copying, new, Sampling(0), rounds)
    rows += lookup_rows(model, f"{name}, sampled (T 1), the same prompts", copying, new, Sampling(1.0), rounds)
    rows += lookup_rows(
        echo, f"{name}, blocks zeroed (text repeats exactly), greedy", copying, new, Sampling(0), rounds
    )
    if trained is not None:
        g = torch.Generator().manual_seed(0)
        stretches = [torch.randint(1, trained.config.n_vocab, (24,), generator=g).tolist() for _ in range(4)]
        prompts = [s + s[:4] for s in stretches]  # a stretch, then its beginning again: the model copies the rest
        rows += lookup_rows(
            trained, "induction_2l (trained here), greedy, copies", prompts, min(new, 20), Sampling(0), rounds
        )
    print_table(
        [
            "model, text (batch 1)",
            "acceptance",
            "tokens per model pass",
            "tokens/s alone",
            "tokens/s ngram",
            "speed-up",
            "tokens equal",
        ],
        rows,
    )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small model, few tokens, one round")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per row (default: 128; quick: 16)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, alternating (default: 3; quick: 1)")
    parser.add_argument("--parts", default="libraries,cost,lookup", help="which parts to run, comma-separated")
    args = parser.parse_args()
    new, rounds = args.tokens or (16 if args.quick else 128), args.rounds or (1 if args.quick else 3)
    if args.quick:
        import tempfile

        from helpers import make_hf_model

        directory = tempfile.mkdtemp()
        hf = make_hf_model(vocab_size=ENC.n_vocab, n_positions=256, n_embd=64, n_layer=2, n_head=2)
        hf.save_pretrained(directory)
        shape = "a 2-layer model of GPT-2's vocabulary (quick)"
    else:
        hf, directory = random_124m()
        shape = "the 124M shape, random weights"
    model = GPT2.from_pretrained(directory, device="cpu")
    trained = GPT2.from_pretrained(FIXTURE, device="cpu") if FIXTURE.exists() else None
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"model: {shape}; {rounds} round(s), medians\n"
    )
    ll_tokenizer(ENC)  # read once
    parts = args.parts.split(",")
    if "libraries" in parts:
        libraries(model, 3 if args.quick else 20)
    if "cost" in parts:
        cost(model, new, rounds)
    if "lookup" in parts:
        lookup(model, echo_model(hf), trained, new, rounds, "2 layers (quick)" if args.quick else "124M shape")


if __name__ == "__main__":
    sys.exit(main())

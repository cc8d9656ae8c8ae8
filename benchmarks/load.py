"""`gpt2 serve` holding under load: many clients for a fixed time, a mix of what clients do,
in repeated rounds; throughput, latency, memory, and whether the server comes back to rest.

    .venv/bin/python benchmarks/load.py [--clients 64] [--seconds 20] [--rounds 3] [--shape small|tiny|124m]
    .venv/bin/python benchmarks/load.py --quick        # 16 clients, 2 rounds of 4 s, the tiny shape (CI's)

The server runs as users run it (`gpt2 serve`, its own process on 127.0.0.1, a free port), on
random weights of the chosen shape saved by transformers; nothing leaves the machine. Each round,
every client (an asyncio task with an httpx client of its own) sends requests one after another
until the round's deadline, each of a kind drawn from its own seeded stream: streamed
completions, plain ones, echo+logprobs scoring with max_tokens 0 (as lm-evaluation-harness
scores), slow readers (a stream read with pauses), clients that disconnect mid-stream (before
their first token, or after a few), and bad requests, which must get 400. Every request has a
time limit, so nothing hangs; an answer that is not what its kind expects is an error.

After each round, once its clients are done, /metrics must show no rows in flight (waiting,
filling or decoding) within a few seconds, and the server's RSS is read (/proc/PID/status);
after rounds 2..R it must stay within a tolerance of its value after round 1 (round 1 is the
warm-up: first-time allocations land there), less the bytes the prefix cache holds (from
/metrics): the cache grows by design, as prompts come, up to --prefix-cache-mb. \
The server's log must hold no traceback and no
ERROR line, and no request may get a 500. The script stops the server (SIGTERM) and exits 1
if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from _common import print_table

REPO = Path(__file__).resolve().parents[1]

# transformers' GPT2Config keys; every shape has GPT-2's vocabulary, so string prompts work
SHAPES = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 256},
    "small": {"n_layer": 4, "n_head": 4, "n_embd": 256, "n_positions": 512},
    "124m": {},
}
KINDS = ("stream", "plain", "score", "slow", "disconnect", "bad")
WEIGHTS = (30, 24, 14, 10, 14, 8)  # how often each kind is drawn
TIMED = ("stream", "plain", "score", "slow")  # the kinds whose latency means something
REQUEST_TIMEOUT = 60.0  # seconds for any one request, whole: past it, an error
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


@dataclass
class Outcome:
    """One request: its kind, whether it went as that kind expects, and its times."""

    kind: str
    error: str | None = None  # None: as expected
    latency: float | None = None  # seconds, request to the end of its answer
    ttft: float | None = None  # seconds to the first text of a stream
    tokens: int = 0  # completion tokens in the answer


# ------------------------------------------------------------------ the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_random_model(shape: str, directory: str) -> dict:
    """transformers' GPT2LMHeadModel of `shape`, random weights (seed 0), saved in `directory`; its config."""
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    config = HFConfig(**SHAPES[shape])
    GPT2LMHeadModel(config).save_pretrained(directory)
    return {"n_ctx": config.n_positions, "n_layer": config.n_layer, "n_embd": config.n_embd}


class ServerProcess:
    """`gpt2 serve` in a process of its own, its stdout and stderr in a log file."""

    def __init__(self, model: str, log: Path, batch: int, queue: int, prefix_cache_mb: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "gpt2",
            "serve",
            "--model",
            model,
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--no-ui",
            "--max-batch-size",
            str(batch),
            "--max-queue",
            str(queue),
            "--prefix-cache-mb",
            str(prefix_cache_mb),
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO / "src")}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.process.kill()
        raise SystemExit(f"the server did not become ready in 120 s:\n{log.read_text(errors='replace')[-3000:]}")

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (the peak RSS) of the server, in bytes."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return {key: int(re.search(rf"^{key}:\s+(\d+) kB", status, re.M).group(1)) * 1024 for key in ("VmRSS", "VmHWM")}

    def stop(self) -> int | None:
        """SIGTERM, then its exit status (None: it had to be killed after 30 s)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def problems(self) -> list[str]:
        """The log's lines that say something went wrong on the server."""
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return [line for line in lines if "Traceback" in line or "ERROR" in line]


def read_metrics(url: str) -> dict[str, float]:
    """/metrics' samples, by name and labels as Prometheus writes them ('gpt2_requests_total{...}')."""
    samples = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def wait_for_rest(url: str, timeout: float = 10) -> dict[str, float]:
    """The gauges of rows in flight, once all are 0 (or as they are after `timeout` seconds)."""
    names = ("gpt2_rows_in_flight", "gpt2_batch_size", "gpt2_queue_length")
    deadline = time.monotonic() + timeout
    while True:
        samples = read_metrics(url)
        gauges = {name: samples.get(name, math.nan) for name in names}
        if all(value == 0 for value in gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.1)


# ------------------------------------------------------------------ the clients


def prompt(rng: random.Random, length: int) -> str | list[int]:
    """A prompt of about `length` tokens: token ids, or words (which the server tokenizes)."""
    if rng.random() < 0.5:
        return [rng.randrange(50256) for _ in range(length)]
    return " ".join(rng.choice(WORDS) for _ in range(length))  # each of these words is one token


def completion_body(rng: random.Random, n_ctx: int, stream: bool, max_tokens: int) -> dict:
    body = {
        "prompt": prompt(rng, rng.randint(4, min(32, n_ctx // 4))),
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": rng.randrange(1 << 30),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def check_usage(choice: dict, usage: dict | None, max_tokens: int) -> str | None:
    """An error, or None: the answer ended as its request allows, with the tokens it says."""
    if choice.get("finish_reason") not in ("length", "stop"):
        return f"finish_reason {choice.get('finish_reason')!r}"
    if usage is None:
        return "no usage"
    if choice["finish_reason"] == "length" and usage["completion_tokens"] != max_tokens:
        return f"{usage['completion_tokens']} completion tokens of {max_tokens}, finish_reason length"
    return None


async def streamed(
    http: httpx.AsyncClient,
    url: str,
    body: dict,
    pause: tuple[float, float] | None,
    rng: random.Random,
    leave_after: int | None = None,
) -> Outcome:
    """A streamed completion, read with `pause` (seconds, min and max) between chunks, or left
    after `leave_after` chunks (the connection closed: a client that disconnects)."""
    kind = "disconnect" if leave_after is not None else "slow" if pause else "stream"
    outcome, started, finish, usage, done = Outcome(kind), time.perf_counter(), {}, None, False
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return Outcome(kind, f"status {response.status_code}: {(await response.aread())[:200]!r}")
        chunks = 0
        if leave_after == 0:  # gone before its first token, its row maybe still waiting
            return outcome
        async for line in response.aiter_lines():
            if leave_after is not None and chunks >= leave_after:
                return outcome  # leaving the block closes the connection mid-stream
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk, chunks = json.loads(line[6:]), chunks + 1
            if "error" in chunk:
                return Outcome(kind, f"error chunk: {chunk['error']['message'][:200]}")
            for choice in chunk["choices"]:
                outcome.ttft = outcome.ttft or time.perf_counter() - started
                finish = choice if choice["finish_reason"] else finish
            usage = chunk.get("usage") or usage
            if pause:
                await asyncio.sleep(rng.uniform(*pause))
    if leave_after is not None:
        return outcome  # it ended before the client meant to leave: as good
    outcome.latency, outcome.tokens = time.perf_counter() - started, (usage or {}).get("completion_tokens", 0)
    outcome.error = "no [DONE]" if not done else check_usage(finish, usage, body["max_tokens"])
    return outcome


async def plain(http: httpx.AsyncClient, url: str, body: dict) -> Outcome:
    started = time.perf_counter()
    response = await http.post(url + "/v1/completions", json=body)
    if response.status_code != 200:
        return Outcome("plain", f"status {response.status_code}: {response.text[:200]}")
    answer = response.json()
    error = check_usage(answer["choices"][0], answer.get("usage"), body["max_tokens"])
    return Outcome("plain", error, time.perf_counter() - started, tokens=answer["usage"]["completion_tokens"])


async def score(http: httpx.AsyncClient, url: str, rng: random.Random, n_ctx: int) -> Outcome:
    """echo, logprobs 1, max_tokens 0, as lm-evaluation-harness scores a text: one log-probability
    for each prompt token after the first."""
    ids = [rng.randrange(50256) for _ in range(rng.randint(8, n_ctx // 2))]
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    started = time.perf_counter()
    response = await http.post(url + "/v1/completions", json=body)
    if response.status_code != 200:
        return Outcome("score", f"status {response.status_code}: {response.text[:200]}")
    logprobs = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    if len(logprobs) != len(ids) or logprobs[0] is not None or not all(lp <= 0 for lp in logprobs[1:]):
        return Outcome("score", f"{len(logprobs)} log-probabilities for {len(ids)} prompt tokens")
    return Outcome("score", None, time.perf_counter() - started)


def bad_bodies(n_ctx: int) -> list[bytes]:
    """Requests a server must refuse with a 400."""
    bodies = [
        {"prompt": "hi", "max_tokens": -1},
        {"prompt": "hi", "top_p": 0},
        {"prompt": "hi", "frobnicate": 1},
        {"prompt": [50257]},
        {"prompt": [1] * n_ctx, "max_tokens": 1},
        {"prompt": "hi", "n": 0},
    ]
    return [json.dumps(body).encode() for body in bodies] + [b"{not json"]


async def bad(http: httpx.AsyncClient, url: str, rng: random.Random, n_ctx: int) -> Outcome:
    content = rng.choice(bad_bodies(n_ctx))
    response = await http.post(url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    if response.status_code != 400 or "error" not in response.json():
        return Outcome("bad", f"status {response.status_code} for {content[:60]!r}: {response.text[:200]}")
    return Outcome("bad")


async def one_request(kind: str, http: httpx.AsyncClient, url: str, rng: random.Random, n_ctx: int) -> Outcome:
    max_tokens = rng.randint(8, min(48, n_ctx // 2))
    if kind == "stream":
        return await streamed(http, url, completion_body(rng, n_ctx, True, max_tokens), None, rng)
    if kind == "slow":
        return await streamed(http, url, completion_body(rng, n_ctx, True, max_tokens // 2), (0.02, 0.2), rng)
    if kind == "disconnect":
        return await streamed(http, url, completion_body(rng, n_ctx, True, max_tokens), None, rng, rng.randint(0, 4))
    if kind == "plain":
        return await plain(http, url, completion_body(rng, n_ctx, False, max_tokens))
    if kind == "score":
        return await score(http, url, rng, n_ctx)
    return await bad(http, url, rng, n_ctx)


async def client(url: str, rng: random.Random, deadline: float, n_ctx: int) -> list[Outcome]:
    """Requests one after another until `deadline`, each of a kind drawn from `rng`."""
    outcomes = []
    timeout = httpx.Timeout(REQUEST_TIMEOUT, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=1)) as http:
        while time.monotonic() < deadline:
            kind = rng.choices(KINDS, WEIGHTS)[0]
            try:
                outcomes.append(await asyncio.wait_for(one_request(kind, http, url, rng, n_ctx), REQUEST_TIMEOUT))
            except (
                asyncio.TimeoutError,
                httpx.HTTPError,
                ValueError,
                KeyError,
                TypeError,
            ) as e:  # an answer not as asked
                outcomes.append(Outcome(kind, f"{type(e).__name__}: {str(e)[:200]}"))
    return outcomes


async def warm_up(url: str, n_ctx: int, batch: int) -> None:
    """The largest requests of the mix, a batch of each at once, before round 1: so that the
    first-time allocations (the largest logits, oneDNN's kernels for each size of prompt) come
    before the RSS that later rounds are held to."""
    rng = random.Random(0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10)) as http:
        scoring = [
            {"prompt": [rng.randrange(50256) for _ in range(n_ctx // 2)], "max_tokens": 0, "echo": True, "logprobs": 1}
            for _ in range(2 * batch)
        ]
        streams = [
            {"prompt": [rng.randrange(50256) for _ in range(length)], "max_tokens": min(48, n_ctx // 2), "stream": True}
            for length in range(4, 33, 2)
        ]
        answers = await asyncio.gather(*(http.post(url + "/v1/completions", json=body) for body in scoring + streams))
    if any(answer.status_code != 200 for answer in answers):
        raise SystemExit(f"the warm-up's requests failed: {sorted({answer.status_code for answer in answers})}")


async def round_of(url: str, clients: int, seconds: float, seed: str, n_ctx: int) -> tuple[list[Outcome], float]:
    """Every client at once until `seconds` from now; their outcomes, and the wall time until the last is done."""
    started = time.monotonic()
    rngs = [random.Random(f"{seed}-{i}") for i in range(clients)]
    done = await asyncio.gather(*(client(url, rng, started + seconds, n_ctx) for rng in rngs))
    return [o for outcomes in done for o in outcomes], time.monotonic() - started


# ------------------------------------------------------------------ the report


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (NaN of none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class Round:
    """What one round did, and the server's state once its clients were done."""

    outcomes: list[Outcome]
    wall: float
    generated: float  # tokens the server generated in the round (those of clients that left included)
    gauges: dict[str, float]  # rows in flight, once at rest
    memory: dict[str, int]  # VmRSS, VmHWM after the round
    cache: float  # bytes the prefix cache holds after the round (at most --prefix-cache-mb)

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    @property
    def at_rest(self) -> bool:
        return all(value == 0 for value in self.gauges.values())


def latency_cells(outcomes: list[Outcome]) -> list[str]:
    """p50 and p99 of the latency of completed requests, and of the time to the first token of streams."""
    latencies = [o.latency for o in outcomes if o.error is None and o.latency is not None and o.kind in TIMED]
    ttfts = [o.ttft for o in outcomes if o.error is None and o.ttft is not None and o.kind in ("stream", "slow")]
    return [
        ms(percentile(latencies, 50)),
        ms(percentile(latencies, 99)),
        ms(percentile(ttfts, 50)),
        ms(percentile(ttfts, 99)),
    ]


def summary_row(
    label: str, outcomes: list[Outcome], wall: float, generated: float, at_rest: str, rss: str, peak: str, cache: str
) -> list[str]:
    by_kind = "/".join(str(sum(o.kind == kind and o.error is None for o in outcomes)) for kind in KINDS)
    served = sum(o.tokens for o in outcomes if o.error is None)
    errors = sum(o.error is not None for o in outcomes)
    return [
        label,
        str(len(outcomes)),
        by_kind,
        str(errors),
        f"{served / wall:.1f}",
        f"{generated / wall:.1f}",
        *latency_cells(outcomes),
        at_rest,
        rss,
        peak,
        cache,
    ]


def round_rows(rounds: list[Round]) -> list[list[str]]:
    """A row for each round, then one for them all (tokens/s over the rounds' summed walls)."""
    rows = []
    for i, r in enumerate(rounds, 1):
        at_rest = ", ".join(f"{int(v) if v == v else v}" for v in r.gauges.values())
        rows.append(
            summary_row(
                str(i),
                r.outcomes,
                r.wall,
                r.generated,
                at_rest,
                mb(r.memory["VmRSS"]),
                mb(r.memory["VmHWM"]),
                mb(r.cache),
            )
        )
    every = [o for r in rounds for o in r.outcomes]
    rest = "0, 0, 0" if all(r.at_rest for r in rounds) else "not 0"
    rows.append(
        summary_row(
            "all",
            every,
            sum(r.wall for r in rounds),
            sum(r.generated for r in rounds),
            rest,
            mb(rounds[-1].memory["VmRSS"]),
            mb(max(r.memory["VmHWM"] for r in rounds)),
            mb(rounds[-1].cache),
        )
    )
    return rows


def kind_rows(outcomes: list[Outcome]) -> list[list[str]]:
    rows = []
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        cells = latency_cells(mine) if kind in TIMED else ["-"] * 4
        rows.append(
            [
                kind,
                str(len(mine)),
                str(sum(o.error is not None for o in mine)),
                *cells,
                str(sum(o.tokens for o in mine)),
            ]
        )
    return rows


def memory_verdict(rounds: list[Round], tolerance: float, tolerance_mb: float) -> tuple[bool, str]:
    """Whether the RSS after rounds 2..R stays within the tolerance of the RSS after round 1, less
    what the prefix cache holds: it grows by design, up to --prefix-cache-mb, as prompts come."""
    first = rounds[0].memory["VmRSS"] - rounds[0].cache
    allowed = max(tolerance * first, tolerance_mb * 1e6)
    growth = [r.memory["VmRSS"] - r.cache - first for r in rounds[1:]]
    if not growth:
        return True, "memory growth across rounds: not measured (one round)"
    worst = max(growth)
    ok = worst <= allowed
    steps = ", ".join(f"{g / 1e6:+.1f} MB" for g in growth)
    return ok, (
        f"memory growth across rounds: RSS less the prefix cache after rounds 2..{len(rounds)} "
        f"against round 1 ({mb(first)}): {steps}; "
        f"allowed +{allowed / 1e6:.1f} MB (max of {tolerance:.0%} and {tolerance_mb:g} MB): "
        f"{'no growth' if ok else 'GROWTH'}"
    )


def run_rounds(server: ServerProcess, args: argparse.Namespace, n_ctx: int) -> list[Round]:
    asyncio.run(warm_up(server.url, n_ctx, args.max_batch_size))
    rounds = []
    for i in range(args.rounds):
        before = read_metrics(server.url).get("gpt2_generated_tokens_total", 0)
        outcomes, wall = asyncio.run(round_of(server.url, args.clients, args.seconds, f"{args.seed}-{i}", n_ctx))
        gauges = wait_for_rest(server.url)
        metrics = read_metrics(server.url)
        generated = metrics.get("gpt2_generated_tokens_total", 0) - before
        rounds.append(
            Round(outcomes, wall, generated, gauges, server.memory(), metrics.get("gpt2_prefix_cache_bytes", 0))
        )
        print(
            f"round {i + 1}: {len(outcomes)} requests, {len(rounds[-1].errors)} errors, {wall:.1f} s", file=sys.stderr
        )
    return rounds


def report(
    rounds: list[Round], args: argparse.Namespace, shape: dict, statuses: dict[str, float]
) -> tuple[list[str], list[str]]:
    """Print the tables; return the verdicts' lines, and those of the checks that failed."""
    import torch

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"model: {args.shape} shape ({shape['n_layer']} layers, {shape['n_embd']} wide, context {shape['n_ctx']}), "
        "random weights; "
        f"gpt2 serve --max-batch-size {args.max_batch_size} --prefix-cache-mb {args.prefix_cache_mb}; "
        f"{args.clients} clients, {args.rounds} rounds of {args.seconds:g} s\n"
    )
    print_table(
        [
            "round",
            "requests",
            "as expected: " + "/".join(KINDS),
            "errors",
            "tok/s served",
            "tok/s generated",
            "latency p50",
            "latency p99",
            "TTFT p50",
            "TTFT p99",
            "rows in flight, batch, queue after",
            "RSS after",
            "peak RSS",
            "prefix cache after",
        ],
        round_rows(rounds),
    )
    print()
    print_table(
        [
            "kind (all rounds)",
            "requests",
            "errors",
            "latency p50",
            "latency p99",
            "TTFT p50",
            "TTFT p99",
            "tokens served",
        ],
        kind_rows([o for r in rounds for o in r.outcomes]),
    )
    errors = [o for r in rounds for o in r.errors]
    failures = [f"{len(errors)} requests did not go as their kind expects, e.g.:"] if errors else []
    failures += [f"  {message}" for message in sorted({f"{o.kind}: {o.error}" for o in errors})[:10]]
    if not all(r.at_rest for r in rounds):
        failures.append("rows were still in flight after a round: " + "; ".join(str(r.gauges) for r in rounds))
    if statuses:
        failures.append(f"500s: {statuses}")
    ok, memory = memory_verdict(rounds, args.tolerance, args.tolerance_mb)
    verdicts = [
        f"errors: {len(errors)}",
        "rows in flight after every round: "
        + ("0 (no rows active, filling or waiting)" if all(r.at_rest for r in rounds) else "NOT 0"),
        f"500s: {int(sum(statuses.values()))}",
        memory,
    ]
    if not ok:
        failures.append(memory)
    return verdicts, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, help="clients at once (default: 64; --quick: 16)")
    parser.add_argument("--seconds", type=float, help="length of a round (default: 20; --quick: 4)")
    parser.add_argument("--rounds", type=int, help="rounds, one after another on one server (default: 3; --quick: 2)")
    parser.add_argument("--shape", choices=SHAPES, help="the model's shape (default: small; --quick: tiny)")
    parser.add_argument("--quick", action="store_true", help="a small run, as CI's test runs it")
    parser.add_argument("--max-batch-size", type=int, default=8, help="the server's (default: 8, as gpt2 serve's)")
    parser.add_argument("--prefix-cache-mb", type=int, default=512, help="the server's (default: 512, as gpt2 serve's)")
    parser.add_argument(
        "--tolerance", type=float, default=0.05, help="RSS growth allowed, a fraction of round 1's (default: 0.05)"
    )
    parser.add_argument(
        "--tolerance-mb",
        type=float,
        help="RSS growth allowed in MB, if more (default: 32, for the allocator may "
        "keep a later round's higher peak: a scoring request's logits alone are its prompt x 50,257 x 4 bytes, "
        "which glibc's heap keeps below 32 MB; --quick: 100, for after rounds of seconds on the tiny model the "
        "RSS lands anywhere from its floor to its peak, 50 MB apart: CI's run checks the rest, not memory)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quick = {"clients": 16, "seconds": 4, "rounds": 2, "shape": "tiny", "tolerance_mb": 100}
    full = {"clients": 64, "seconds": 20, "rounds": 3, "shape": "small", "tolerance_mb": 32}
    for key, value in (quick if args.quick else full).items():
        setattr(args, key, value if getattr(args, key) is None else getattr(args, key))

    with tempfile.TemporaryDirectory() as tmp:
        shape = save_random_model(args.shape, tmp)
        # max_queue: every client's row may wait at once, so that no 429 is a busy server's fault
        server = ServerProcess(
            tmp, Path(tmp) / "server.log", args.max_batch_size, max(64, args.clients), args.prefix_cache_mb
        )
        try:
            rounds = run_rounds(server, args, shape["n_ctx"])
            statuses = {
                k: v
                for k, v in read_metrics(server.url).items()
                if k.startswith("gpt2_requests_total") and 'status="500"' in k
            }
        finally:
            status = server.stop()
        verdicts, failures = report(rounds, args, shape, statuses)
        problems = server.problems()
    if status not in (0, -signal.SIGTERM):
        failures.append(f"the server did not stop cleanly on SIGTERM: exit status {status}")
    verdicts.append(
        f"server log: {len(problems)} lines with Traceback or ERROR; stopped on SIGTERM with status {status}"
    )
    failures += [f"  log: {line}" for line in problems[:20]]
    print("\n" + "\n".join(verdicts))
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

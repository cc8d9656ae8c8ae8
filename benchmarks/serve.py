"""`gpt2 serve` under load: 8 clients at once against the same 8 one after another, and against
transformers generating the 8 requests one at a time, on the same random 124M weights.

    .venv/bin/python benchmarks/serve.py [--clients 8] [--max-tokens 128] [--rounds 3]
    .venv/bin/python benchmarks/serve.py --latency [--before DIR] [--rounds 3]

The server runs as users run it (`gpt2 serve`, its own process, torch's default threads); the
clients are threads of this process streaming with httpx, which measures the time to the first
token. Every request: a 16-token prompt of its own, greedy, max_tokens new tokens. Rounds
alternate one-after-another and at-once and report medians; the texts of both must be equal
(and equal transformers'). transformers runs after the server has stopped. Run it on a quiet
machine: with 2 cores, any other process slows torch several times.

With --latency, latencies where prompts are long or shared (issue 24), before and after.
Each scenario runs against `gpt2 serve` in its own process (the 124M shape, random weights,
fp32 on the CPU, 8 slots), as above, and against the same server from
another checkout (`--before DIR`, e.g. a worktree of the commit before the change: its `src`
is put on PYTHONPATH), alternating, in one run:

1. prefill: 8 clients at once with 16-token and with 400-token prompts (16 new tokens each):
   the time to first token, median and p90 of the 8 clients over the rounds;
2. a stream interrupted: one stream of 200 tokens is running when a 900-token prompt arrives:
   its inter-token gaps while that prompt goes in (the longest) and overall (median);
3. a shared prefix: a 900-token prefix with 20 different 20-token suffixes, one after another:
   the first request's time to first token, and the median of the 19 later ones;
4. HellaSwag-style scoring as lm-evaluation-harness's local-completions sends it (one prompt a
   request: a context of 60-100 ids and an ending of 15-30, echo, logprobs 1, max_tokens 1):
   requests per second, with the prefix cache and without (--prefix-cache-mb 0).

Every answer is checked equal between the servers (greedy texts; log-probabilities within
1e-4). Run it on a quiet machine: with 2 cores, any other process slows torch several times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import torch
from _common import print_table, random_124m

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`gpt2 serve` from the source tree `src`, in its own process, with extra flags."""

    def __init__(self, model: str, src: Path, flags: list[str], batch: int = 8):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(src)}
        command = [
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
            "--max-batch-size",
            str(batch),
            *flags,
        ]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.ConnectError:
                pass
            time.sleep(0.2)
        self.process.kill()
        raise SystemExit("the server did not become ready in 120 s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def request(url: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion: its text, tokens, and times (start, first token, end)."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, text, tokens = time.perf_counter(), None, "", 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        if response.status_code != 200:
            raise SystemExit(f"the server answered {response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                first = first or time.perf_counter()
                text += chunk["choices"][0]["text"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"text": text, "tokens": tokens, "start": start, "first": first, "end": time.perf_counter()}


def one_after_another(url: str, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    results = [request(url, p, max_tokens) for p in prompts]
    return time.perf_counter() - start, results


def at_once(url: str, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[dict]]:
    results: list[dict | None] = [None] * len(prompts)
    gate = threading.Barrier(len(prompts) + 1)

    def client(i: int) -> None:
        gate.wait()
        results[i] = request(url, prompts[i], max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results


def summary(name: str, walls: list[float], runs: list[list[dict]]) -> tuple[list[str], float]:
    wall = statistics.median(walls)
    tokens = sum(r["tokens"] for r in runs[0])
    ttft = statistics.median(r["first"] - r["start"] for run in runs for r in run)
    per_client = statistics.median(r["tokens"] / (r["end"] - r["start"]) for run in runs for r in run)
    return [
        name,
        f"{tokens / wall:.1f} tok/s",
        f"{ttft * 1000:.0f} ms",
        f"{per_client:.1f} tok/s",
        f"{wall:.1f} s",
    ], tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", action="store_true", help="the latency scenarios of issue 24")
    parser.add_argument(
        "--before", type=Path, help="with --latency: a checkout to compare with (its src on PYTHONPATH)"
    )
    args = parser.parse_args()
    if args.latency:
        return latency(args.before, args.rounds)

    from gpt2 import Tokenizer

    hf, tmp = random_124m()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50256, (16,), generator=gen).tolist() for _ in range(args.clients)]

    server = Server(tmp, REPO / "src", [], batch=args.clients)
    url = server.url
    try:
        request(url, prompts[0], 8)  # warm-up
        seq_walls, seq_runs, par_walls, par_runs = [], [], [], []
        for _ in range(args.rounds):
            wall, results = one_after_another(url, prompts, args.max_tokens)
            seq_walls.append(wall), seq_runs.append(results)
            wall, results = at_once(url, prompts, args.max_tokens)
            par_walls.append(wall), par_runs.append(results)
    finally:
        server.stop()
    texts = [r["text"] for r in seq_runs[0]]
    assert all([r["text"] for r in run] == texts for run in seq_runs + par_runs), "texts differ between runs"

    hf_walls = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            start, hf_texts, hf_tokens = time.perf_counter(), [], 0
            for p in prompts:
                idx = torch.tensor([p])
                out = hf.generate(
                    idx,
                    max_new_tokens=args.max_tokens,
                    do_sample=False,
                    attention_mask=torch.ones_like(idx),
                    pad_token_id=50256,
                )
                new = out[0, 16:].tolist()
                new = new[: new.index(50256)] if 50256 in new else new
                hf_texts.append(Tokenizer.gpt2().decode(new))
                hf_tokens += out.size(1) - 16
            hf_walls.append(time.perf_counter() - start)
    assert hf_texts == texts, "gpt2 serve's greedy texts differ from transformers'"

    sequential, seq_rate = summary(f"gpt2 serve, {args.clients} clients one after another", seq_walls, seq_runs)
    concurrent, par_rate = summary(f"gpt2 serve, {args.clients} clients at once", par_walls, par_runs)
    hf_rate = hf_tokens / statistics.median(hf_walls)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"transformers {__import__('transformers').__version__}; {args.rounds} rounds, medians\n"
    )
    print_table(
        [
            f"requests (16-token prompts, greedy, {args.max_tokens} new tokens each)",
            "total tokens/s",
            "time to first token",
            "tokens/s per client",
            "wall time",
        ],
        [
            sequential,
            concurrent,
            [
                f"transformers generate, the {args.clients} requests one at a time",
                f"{hf_rate:.1f} tok/s",
                "",
                "",
                f"{statistics.median(hf_walls):.1f} s",
            ],
        ],
    )
    print(
        f"\nat once / one after another: {par_rate / seq_rate:.2f}x total tokens/s; "
        f"at once / transformers one at a time: {par_rate / hf_rate:.2f}x; "
        f"one after another / transformers: {seq_rate / hf_rate:.2f}x. Texts equal across all runs and transformers'."
    )


# ------------------------------------------------------------------ --latency


def ids(generator: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, 50256, (n,), generator=generator).tolist()


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def prefill(url: str, length: int, seed: int) -> tuple[list[float], list[str]]:
    """Times to first token (s) of 8 clients at once with prompts of `length` tokens, and their texts."""
    g = torch.Generator().manual_seed(seed)
    results = at_once(url, [ids(g, length) for _ in range(8)], 16)[1]
    return [r["first"] - r["start"] for r in results], [r["text"] for r in results]


def interrupted(url: str, seed: int) -> tuple[float, float, str]:
    """A 200-token stream running when a 900-token prompt arrives: its longest inter-token gap
    from then until that request's first token, its median gap overall, and its text."""
    g = torch.Generator().manual_seed(seed)
    stream_prompt, long_prompt = ids(g, 16), ids(g, 900)
    arrivals: list[float] = []
    body = {"prompt": stream_prompt, "max_tokens": 200, "temperature": 0, "stream": True}
    text = ""
    sent: dict[str, float] = {}

    def long_request() -> None:
        sent["start"] = time.perf_counter()
        sent["first"] = request(url, long_prompt, 4)["first"]

    other = threading.Thread(target=long_request)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
                text += json.loads(line[6:])["choices"][0]["text"]
                if len(arrivals) == 30:
                    other.start()
    other.join()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    during = [b - a for a, b in zip(arrivals, arrivals[1:]) if sent["start"] <= b and a <= sent["first"]]
    return max(during), statistics.median(gaps), text


def shared_prefix(url: str, seed: int) -> tuple[float, float, list[str]]:
    """A 900-token prefix with 20 suffixes of 20, one after another (a new prefix each round):
    the first's time to first token, the median of the later 19, and the texts."""
    g = torch.Generator().manual_seed(seed)
    prefix = ids(g, 900)
    results = [request(url, prefix + ids(g, 20), 4) for _ in range(20)]
    firsts = [r["first"] - r["start"] for r in results]
    return firsts[0], statistics.median(firsts[1:]), [r["text"] for r in results]


def hellaswag_style(url: str, seed: int, examples: int = 10) -> tuple[float, list[float]]:
    """Requests per second scoring `examples` contexts of 4 endings each, one request at a time,
    as lm-evaluation-harness's local-completions sends them; and every returned log-probability."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(examples):
        context = ids(g, int(torch.randint(60, 101, (1,), generator=g)))
        prompts += [context + ids(g, int(torch.randint(15, 31, (1,), generator=g))) for _ in range(4)]
    logprobs, start = [], time.perf_counter()
    with httpx.Client(timeout=600) as client:
        for prompt in prompts:
            body = {"prompt": [prompt], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1, "seed": 1234}
            choice = client.post(url + "/v1/completions", json=body).json()["choices"][0]
            logprobs += choice["logprobs"]["token_logprobs"][1:]
    return len(prompts) / (time.perf_counter() - start), logprobs


def check(results: dict[str, dict[str, list]]) -> None:
    """The same answers from every server: texts equal, log-probabilities within 1e-4."""
    first = next(iter(results.values()))
    for name, out in results.items():
        for key in ("texts16", "texts400", "stream", "prefix_texts"):
            assert out[key] == first[key], f"{name}: {key} differ"
        worst = max(abs(a - b) for x, y in zip(out["logprobs"], first["logprobs"]) for a, b in zip(x, y))
        assert worst < 1e-4, f"{name}: log-probabilities differ by {worst}"


def report(results: dict[str, dict[str, list]], rounds: int) -> None:
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}; "
        f"{rounds} rounds; answers equal across servers\n"
    )
    header = ["server"] + list(results)
    rows = [
        ["8 clients at once, 16-token prompts: time to first token, median"]
        + [ms(statistics.median(o["ttft16"])) for o in results.values()],
        ["  p90"] + [ms(p90(o["ttft16"])) for o in results.values()],
        ["8 clients at once, 400-token prompts: time to first token, median"]
        + [ms(statistics.median(o["ttft400"])) for o in results.values()],
        ["  p90"] + [ms(p90(o["ttft400"])) for o in results.values()],
        ["a stream while a 900-token prompt arrives: longest gap (median of rounds)"]
        + [ms(statistics.median(o["gap"])) for o in results.values()],
        ["  its inter-token latency, median"] + [ms(statistics.median(o["itl"])) for o in results.values()],
        ["900-token shared prefix, 20 suffixes: first request's time to first token"]
        + [ms(statistics.median(o["first"])) for o in results.values()],
        ["  the later 19, median"] + [ms(statistics.median(o["later"])) for o in results.values()],
        ["HellaSwag-style scoring, requests/s"] + [f"{statistics.median(o['rps']):.1f}" for o in results.values()],
    ]
    print_table(header, rows)


def latency(before: Path | None, rounds: int) -> None:
    _, model = random_124m()
    trees = [("after", REPO / "src")] + ([("before", before / "src")] if before else [])
    setups = [(name, src, []) for name, src in trees] + [
        ("after, no prefix cache", REPO / "src", ["--prefix-cache-mb", "0"])
    ]
    results: dict[str, dict[str, list]] = {name: {} for name, _, _ in setups}
    for r in range(rounds):
        for name, src, flags in setups:
            server = Server(model, src, flags)
            try:
                request(server.url, [464, 318], 4)  # warm-up
                out = results[name]
                for length in (16, 400):
                    times, texts = prefill(server.url, length, seed=100 * r + length)
                    out.setdefault(f"ttft{length}", []).extend(times)
                    out.setdefault(f"texts{length}", []).append(texts)
                longest, median, text = interrupted(server.url, seed=r)
                out.setdefault("gap", []).append(longest), out.setdefault("itl", []).append(median)
                out.setdefault("stream", []).append(text)
                first, later, texts = shared_prefix(server.url, seed=1000 + r)
                out.setdefault("first", []).append(first), out.setdefault("later", []).append(later)
                out.setdefault("prefix_texts", []).append(texts)
                rate, logprobs = hellaswag_style(server.url, seed=2000 + r)
                out.setdefault("rps", []).append(rate), out.setdefault("logprobs", []).append(logprobs)
            finally:
                server.stop()
            print(f"round {r + 1}, {name}: done", file=sys.stderr)
    check(results)
    report(results, rounds)


if __name__ == "__main__":
    main()

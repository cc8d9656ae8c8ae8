"""`gpt2 serve --replicas 2` against `--replicas 1`: throughput with 16 concurrent clients, on the same
random 124M weights and the same cores, each replica given its share of them.

    .venv/bin/python benchmarks/serve_replicas.py [--clients 16] [--requests 3] [--max-tokens 32] [--rounds 2]
    .venv/bin/python benchmarks/serve_replicas.py --quick      # a smoke run: the tiny shape, 1 round

Each configuration is `gpt2 serve --replicas N` as users run it (its own process, a Ray cluster of this
machine that it starts), behind the same Ray HTTP proxy: 1 replica of cores threads, and N replicas of
cores / N threads each; and, for reference, plain `gpt2 serve` (no Ray, all the cores). Every client
is a thread of this process sending `--requests` greedy completions one after another, each a 16-token
prompt of its own and `--max-tokens` new tokens; the batch holds every client (--max-batch-size), so the
processes, not the batch's size, are what differ. Throughput: new tokens over the wall time of all the
clients, the median of the rounds. Every configuration's texts must be equal. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _common import print_table, random_124m

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from serve_fixtures import free_port  # noqa: E402


class Served:
    """`gpt2 serve` (with --replicas N, or none) in its own process, until stopped."""

    def __init__(self, model: str, replicas: int | None, batch: int):
        self.url = f"http://127.0.0.1:{free_port()}"
        flags = [] if replicas is None else ["--replicas", str(replicas)]
        command = [sys.executable, "-m", "gpt2", "serve", "--model", model, "--port", self.url.rsplit(":", 1)[1]]
        command += ["--device", "cpu", "--max-batch-size", str(batch), *flags]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + 300
        while not any(re.match(r"gpt2: serving .* on http", line) for line in self.err):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.process.kill()
                raise SystemExit(f"gpt2 serve did not start: {''.join(self.err)[-2000:]}")
            time.sleep(0.2)
        while httpx.get(self.url + "/health", timeout=60).status_code != 200:  # plain serve: once loaded
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.send_signal(2)  # Ctrl-C: the replicas and the cluster stop with it
        self.process.wait(timeout=120)


def complete(url: str, prompt: list[int], max_tokens: int) -> tuple[str, int, str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=600)
    if answer.status_code != 200:
        raise SystemExit(f"the server answered {answer.status_code}: {answer.text}")
    data = answer.json()
    return data["choices"][0]["text"], data["usage"]["completion_tokens"], answer.headers.get("x-gpt2-replica", "")


def load(url: str, prompts: list[list[list[int]]], max_tokens: int) -> tuple[float, list[str], int, set[str]]:
    """Every client's requests, one after another, the clients at once: seconds, texts, tokens, replicas."""

    def client(mine: list[list[int]]) -> list[tuple[str, int, str]]:
        return [complete(url, prompt, max_tokens) for prompt in mine]

    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = [a for per_client in pool.map(client, prompts) for a in per_client]
    seconds = time.perf_counter() - start
    return seconds, [a[0] for a in answers], sum(a[1] for a in answers), {a[2] for a in answers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=3, help="each client's, one after another")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tiny model, 1 round")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.quick:
        sys.path.insert(0, str(REPO / "tests"))
        import tempfile

        from helpers import hf_and_ours

        model = tempfile.mkdtemp()
        hf_and_ours(Path(model), seed=5, vocab_size=50257, n_positions=128, n_embd=48, n_layer=2, n_head=3)
        args.rounds, shape = 1, "tiny (2 layers, 48 wide)"
    else:
        _, model = random_124m()
        shape = "124M shape, random weights"
    prompts = [
        [[(97 * c + 13 * r + 7 * t) % 50000 for t in range(16)] for r in range(args.requests)]
        for c in range(args.clients)
    ]
    configurations = [
        ("gpt2 serve (no Ray)", None),
        ("--replicas 1", 1),
        (f"--replicas {args.replicas}", args.replicas),
    ]
    measured: dict[str, list[float]] = {}
    texts: dict[str, list[str]] = {}
    seen: dict[str, set[str]] = {}
    for name, replicas in configurations:
        served = Served(model, replicas, batch=args.clients)
        try:
            load(served.url, [p[:1] for p in prompts[:2]], 4)  # warm: the first requests' one-off costs
            for _ in range(args.rounds):
                seconds, texts[name], tokens, seen[name] = load(served.url, prompts, args.max_tokens)
                measured.setdefault(name, []).append(tokens / seconds)
        finally:
            served.stop()
    reference = texts[configurations[0][0]]
    for name in texts:
        if texts[name] != reference:
            raise SystemExit(f"{name} answered other texts than plain gpt2 serve")
    one = statistics.median(measured["--replicas 1"])
    rows = []
    for name, replicas in configurations:
        rate = statistics.median(measured[name])
        threads = cores if replicas is None else max(1, cores // replicas)
        answered = "" if replicas is None else f"{len(seen[name] - {''})}"
        rows.append((name, f"{threads}", answered, f"{rate:.1f}", f"{rate / one:.2f}x"))
    print(
        f"{platform.machine()}, {cores} cores; {shape}; {args.clients} clients x {args.requests} requests of "
        f"{args.max_tokens} new tokens (16-token prompts, greedy); median of {args.rounds} rounds; texts all equal"
    )
    print_table(["server", "threads a replica", "replicas answering", "new tokens/s", "vs --replicas 1"], rows)


if __name__ == "__main__":
    main()

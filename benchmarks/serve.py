"""`gpt2 serve` under load: 8 clients at once against the same 8 one after another, and against
transformers generating the 8 requests one at a time, on the same random 124M weights.

    .venv/bin/python benchmarks/serve.py [--clients 8] [--max-tokens 128] [--rounds 3]

The server runs as users run it (`gpt2 serve`, its own process, torch's default threads); the
clients are threads of this process streaming with httpx, which measures the time to the first
token. Every request: a 16-token prompt of its own, greedy, max_tokens new tokens. Rounds
alternate one-after-another and at-once and report medians; the texts of both must be equal
(and equal transformers'). transformers runs after the server has stopped. Run it on a quiet
machine: with 2 cores, any other process slows torch several times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import torch

from _common import print_table, random_124m


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, batch: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "gpt2", "serve", "--model", model, "--port", str(port), "--device", "cpu", "--max-batch-size", str(batch)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.ConnectError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not become ready in 120 s")


def request(url: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion: its text, tokens, and times (start, first token, end)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
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
    return [name, f"{tokens / wall:.1f} tok/s", f"{ttft * 1000:.0f} ms", f"{per_client:.1f} tok/s", f"{wall:.1f} s"], tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from gpt2 import Tokenizer

    hf, tmp = random_124m()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50256, (16,), generator=gen).tolist() for _ in range(args.clients)]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(tmp, port, args.clients)
    try:
        request(url, prompts[0], 8)  # warm-up
        seq_walls, seq_runs, par_walls, par_runs = [], [], [], []
        for _ in range(args.rounds):
            wall, results = one_after_another(url, prompts, args.max_tokens)
            seq_walls.append(wall), seq_runs.append(results)
            wall, results = at_once(url, prompts, args.max_tokens)
            par_walls.append(wall), par_runs.append(results)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    texts = [r["text"] for r in seq_runs[0]]
    assert all([r["text"] for r in run] == texts for run in seq_runs + par_runs), "texts differ between runs"

    hf_walls = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            start, hf_texts, hf_tokens = time.perf_counter(), [], 0
            for p in prompts:
                idx = torch.tensor([p])
                out = hf.generate(idx, max_new_tokens=args.max_tokens, do_sample=False, attention_mask=torch.ones_like(idx),
                                  pad_token_id=50256)  # fmt: skip
                new = out[0, 16:].tolist()
                new = new[: new.index(50256)] if 50256 in new else new
                hf_texts.append(Tokenizer.gpt2().decode(new))
                hf_tokens += out.size(1) - 16
            hf_walls.append(time.perf_counter() - start)
    assert hf_texts == texts, "gpt2 serve's greedy texts differ from transformers'"

    sequential, seq_rate = summary(f"gpt2 serve, {args.clients} clients one after another", seq_walls, seq_runs)
    concurrent, par_rate = summary(f"gpt2 serve, {args.clients} clients at once", par_walls, par_runs)
    hf_rate = hf_tokens / statistics.median(hf_walls)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}; "
          f"transformers {__import__('transformers').__version__}; {args.rounds} rounds, medians\n")  # fmt: skip
    print_table(["requests (16-token prompts, greedy, {} new tokens each)".format(args.max_tokens), "total tokens/s",
                 "time to first token", "tokens/s per client", "wall time"],
                [sequential, concurrent,
                 [f"transformers generate, the {args.clients} requests one at a time", f"{hf_rate:.1f} tok/s", "", "",
                  f"{statistics.median(hf_walls):.1f} s"]])  # fmt: skip
    print(f"\nat once / one after another: {par_rate / seq_rate:.2f}x total tokens/s; "
          f"at once / transformers one at a time: {par_rate / hf_rate:.2f}x; "
          f"one after another / transformers: {seq_rate / hf_rate:.2f}x. Texts equal across all runs and transformers'.")


if __name__ == "__main__":
    main()

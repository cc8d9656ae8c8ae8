"""How soon `gpt2 serve` frees the rows of a client that leaves, for a client waiting for a
whole answer (n=8) and for a streaming one (n=1), on random GPT-2 124M weights asked for 1,000
tokens a row: from the client closing its connection to its rows cancelled (each row ended: it
makes no token after the step under way), and to /metrics' gpt2_rows_in_flight at 0 (the step
under way done, the rows out of the batch).

    .venv/bin/python benchmarks/disconnect.py [--src DIR] [--repeat 5]

The server is gpt2's app under uvicorn on 127.0.0.1, in a thread of this process (as the tests'
`Running`), so that its rows can be watched; the client is a plain socket that sends its
request, waits until its rows are decoding, then closes. `--src DIR` runs another copy of the
package's sources (e.g. an older commit's `src`, from `git worktree add`) for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from _common import print_table, random_124m
from helpers import Running  # the tests' server in a thread

import gpt2
from gpt2.model.model import GPT2

REPO = Path(__file__).resolve().parents[1]


def wait(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the server did not get there in time")
        time.sleep(0.001)


def leave(running, n: int, stream: bool) -> tuple[float, float]:
    """Seconds from the client's close to its rows cancelled, and to no rows in flight."""
    scheduler = running.app.state.server.scheduler
    in_flight = running.app.state.server.metrics.in_flight
    host, port = running.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "The history of", "max_tokens": 1000, "n": n, "stream": stream}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    client = socket.create_connection((host, int(port)))
    client.sendall(head.encode() + body)
    wait(lambda: len(scheduler.decoder.active) == n and all(row.tokens for row in scheduler.decoder.active))
    rows = list(scheduler.decoder.active)
    client.close()
    closed = time.perf_counter()
    wait(lambda: all(row.done for row in rows))
    cancelled = time.perf_counter() - closed
    wait(lambda: in_flight._value.get() == 0)
    return cancelled, time.perf_counter() - closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src", type=Path, default=REPO / "src", help="the package's sources to run (default: this checkout's)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if (
        Path(gpt2.__file__).parent != args.src.resolve() / "gpt2"
    ):  # gpt2 imported already (by _common's helpers): run afresh
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONPATH": str(args.src.resolve())})

    _, directory = random_124m()
    model = GPT2.from_pretrained(directory, device="cpu")
    running = Running(lambda: (model, model.tokenizer))
    try:
        rows = []
        for n, stream in [(8, False), (1, True)]:
            times = [leave(running, n, stream) for _ in range(args.repeat)]
            cancelled, freed = ([t[i] for t in times] for i in (0, 1))
            rows.append(
                [
                    f"{'streaming' if stream else 'waiting'}, n={n}",
                    f"{statistics.median(cancelled):.3f} ({min(cancelled):.3f}-{max(cancelled):.3f})",
                    f"{statistics.median(freed):.3f} ({min(freed):.3f}-{max(freed):.3f})",
                ]
            )
        print(f"sources: {args.src}")
        print_table(
            ["client", f"s to its rows cancelled (median of {args.repeat}, range)", "s to 0 rows in flight"], rows
        )
    finally:
        running.stop()


if __name__ == "__main__":
    main()

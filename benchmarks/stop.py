"""How long `gpt2 train` takes to stop after Ctrl-C or SIGTERM, with the CLI's defaults.

    .venv/bin/python benchmarks/stop.py [--src DIR]

A 4x4x128 character model on the tests' corpus, every other setting `gpt2 train`'s default
(nanoGPT's: 40 micro-batches of 12 x 1024 a step, 200-batch evaluations): the signal comes
during the first evaluation, and during the first step's accumulation; the time is from the
signal to the process's exit, its checkpoint written. `--src DIR` runs another copy of the
package's sources (e.g. an older commit's `src`, from `git worktree add`) for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import corpus, print_table

REPO = Path(__file__).resolve().parents[1]


def stop_after(src: Path, data: Path, out: Path, sig: signal.Signals, when: str) -> float:
    """Seconds from `sig` to the exit of a run, sent 5 s into its first evaluation ("evaluation")
    or 5 s after it ("accumulation": inside iteration 0's 40 micro-batches)."""
    argv = [
        sys.executable,
        "-m",
        "gpt2",
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--n-layer",
        "4",
        "--n-head",
        "4",
        "--n-embd",
        "128",
        "--device",
        "cpu",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(src)}
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = out / "log.jsonl"
    if when == "accumulation":  # the first evaluation's record, then into the step
        while not (log.is_file() and "val_loss" in log.read_text()):
            assert process.poll() is None, "the run ended before its first evaluation"
            time.sleep(0.05)
    else:
        time.sleep(3)  # start-up: the evaluation at iteration 0 comes first
    time.sleep(5)
    process.send_signal(sig)
    sent = time.monotonic()
    process.wait()
    return time.monotonic() - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src", type=Path, default=REPO / "src", help="the package's sources to run (default: this checkout's)"
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "input.txt").write_text(corpus()[1], encoding="utf-8")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpt2",
                "prepare",
                str(tmp / "input.txt"),
                "--out",
                str(tmp / "data"),
                "--tokenizer",
                "char",
                "--no-progress",
            ],
            env={**os.environ, "PYTHONPATH": str(args.src)},
            check=True,
            capture_output=True,
        )
        for sig, when in (
            (signal.SIGINT, "evaluation"),
            (signal.SIGINT, "accumulation"),
            (signal.SIGTERM, "evaluation"),
        ):
            out = tmp / f"out-{sig.name}-{when}"
            seconds = stop_after(args.src, tmp / "data", out, sig, when)
            lines = (out / "log.jsonl").read_text().splitlines() if (out / "log.jsonl").is_file() else []
            records = [r for r in map(json.loads, lines) if "settings" not in r]  # the settings: the run's first record
            state = records[-1] if records else {}  # nothing logged: stopped in the first evaluation
            saved = "yes" if (out / "checkpoint.pt").is_file() else "no"
            rows.append(
                (
                    sig.name,
                    f"during the {'first evaluation' if when == 'evaluation' else 'first step'}",
                    f"{seconds:.1f} s",
                    saved,
                    str(state.get("iter", "-")),
                )
            )
    print(f"gpt2 train, 4x4x128 character model, CLI defaults; sources: {args.src}\n")
    print_table(("signal", "sent", "to exit", "checkpoint", "last logged iteration"), rows)


if __name__ == "__main__":
    main()

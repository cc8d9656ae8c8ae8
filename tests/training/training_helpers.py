"""What the training tests share: nanoGPT's learning rate written out, a chat template, and the settings,
environment and loss curves of the tests on several processes (distributed and elastic)."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from helpers import REPO

from gpt2.training.loggers import read_log


def nanogpt_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's get_lr (train.py), written out here as the independent reference."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# A template of GPT-2's own tokens, rendered the same by jinja2 alone and by transformers (no
# whitespace for trim_blocks or lstrip_blocks to take).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.role == 'assistant' %}<|endoftext|>{% endif %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


# grad_accum 4 splits into 2 micro-batches a process; eval_iters 3 does not split evenly.
SETTINGS = dict(
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    batch_size=4,
    grad_accum=4,
    lr=3e-3,
    min_lr=3e-4,
    warmup_iters=5,
    lr_decay_iters=20,
    eval_interval=10,
    eval_iters=3,
    device="cpu",
    compile="off",
    probe_repeat=0,  # the probes are test_training_probes.py's: here they would only cost time
)
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
TOLERANCE = 1e-4


def flags(**settings) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


FORKED_ENV = {**ENV, "PYTHONUNBUFFERED": "1"}  # a forked command's prints reach a pipe as they come, as with python -u


def curve(out: Path) -> tuple[dict[int, float], dict[int, float]]:
    """The training loss of each iteration and the validation loss of each evaluation."""
    records = read_log(out / "log.jsonl")
    return {r["iter"]: r["loss"] for r in records if "loss" in r}, {
        r["iter"]: r["val_loss"] for r in records if "val_loss" in r
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

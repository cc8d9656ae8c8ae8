"""The Hugging Face hub: its cache read first, and a network that is down said so in a second.

Nothing here reaches a network: the hub's address is a closed port on this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, make_hf_model


def closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable_hub(tmp_path: Path) -> dict[str, str]:
    """An environment with no HF_HUB_OFFLINE, an empty cache, and the hub at a closed local port."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(
        HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", PYTHONPATH=str(REPO / "src")
    )
    return env


def gpt2_cli(*argv: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gpt2", *argv], capture_output=True, text=True, env=env, timeout=120)
    return result, time.monotonic() - started


@pytest.mark.parametrize(
    "argv, message",
    [
        (("generate", "Hi", "--model", "gpt2-medium"), "could not download 'gpt2-medium' from the Hugging Face hub"),
        (("eval", "--task", "wikitext2", "--model", "MODEL"), "could not download wikitext2 from the Hugging Face hub"),
    ],
)
def test_without_a_network_a_download_fails_at_once_in_one_line(argv, message, tmp_path):
    """Without HF_HUB_OFFLINE, huggingface_hub alone retries for about 25 s; the hub is asked once."""
    make_hf_model(vocab_size=50257, n_positions=16, n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path / "model")
    argv = [str(tmp_path / "model") if a == "MODEL" else a for a in argv]
    result, seconds = gpt2_cli(*argv, env=unreachable_hub(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"gpt2: error: {message}")
    assert "cannot reach http://127.0.0.1:" in result.stderr
    assert (
        seconds < 20
    )  # 25 s and more of retries before; about 3 s of it is starting Python and torch, more on a busy machine


def test_a_released_model_in_the_cache_is_read_without_asking_the_hub(tmp_path):
    """A model downloaded once loads again with the hub out of reach, and without HF_HUB_OFFLINE."""
    env = unreachable_hub(tmp_path)
    snapshot = Path(env["HF_HOME"]) / "hub" / "models--openai-community--gpt2" / "snapshots" / ("0" * 40)
    make_hf_model(vocab_size=50257, n_positions=16, n_embd=16, n_layer=1, n_head=2).save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)  # the cache's layout, as huggingface_hub writes it
    result, seconds = gpt2_cli(
        "generate", "Hi", "--model", "gpt2", "--max-new-tokens", "3", "--temperature", "0", env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Hi") and "error" not in result.stderr

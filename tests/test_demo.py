"""`make demo` (scripts/demo.py): real weights where they can be had, else the model gpt2 ships."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import REPO, make_hf_model

from gpt2.examples import corpus_text

DEMO = REPO / "scripts" / "demo.py"


# The script run as a forked `python -c` (tests/forks.py), its own file as __main__ with its
# arguments: the same program, without a second of torch's import; the first run below starts it as `make demo` does.
FORKED = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def demo(tmp_path, *argv: str, forks=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}  # no weights to be had
    command = [sys.executable] if forks is None else [str(forks.python), "-c", FORKED]
    return subprocess.run([*command, str(DEMO), *argv], capture_output=True, text=True, timeout=300, env=env)


def test_without_the_weights_it_runs_the_shipped_model_and_says_so_in_one_line(tmp_path, forks):
    first, second = demo(tmp_path), demo(tmp_path, forks=forks)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout  # seeded: the same text on every run
    text = first.stdout.removeprefix("Alan Turing theorized that computers would one day become")
    assert len(text.removesuffix("\n")) == 120 and set(text) <= set(
        corpus_text("shakespeare")
    )  # Shakespeare's characters: shakespeare_char
    lines = [line for line in first.stderr.splitlines() if "exceed the context" not in line]  # 64 characters: it slides
    assert len(lines) == 2 and "error" not in first.stderr.lower()
    assert lines[0].startswith(
        "gpt2 demo: 'gpt2' cannot be downloaded here (offline?), so shakespeare_char, the small model"
    )
    assert lines[1].startswith("[gpt2: 120 tokens in ")
    assert "random" not in first.stderr
    page = (REPO / "docs" / "setup.md").read_text(encoding="utf-8")
    section = page.split("## `make demo`")[1].split("\n## ")[0]  # what setup.md says the demo does offline
    generated = f"{len(text.removesuffix(chr(10)))} characters"  # as the run above counted them
    assert "shakespeare_char" in section and generated in section and "random" not in section, section


def test_a_model_path_that_is_missing_or_broken_is_an_error_not_random_text(tmp_path, forks):
    missing = demo(tmp_path, "--model", str(tmp_path / "nowhere"), forks=forks)
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.startswith("gpt2: error: unknown model") and missing.stderr.count("\n") == 1
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    result = demo(tmp_path, "--model", str(broken), forks=forks)
    assert (result.returncode, result.stdout) == (
        2,
        "",
    ) and "has config.json but neither model.safetensors" in result.stderr


def test_a_local_model_runs_greedily(tmp_path, forks):
    make_hf_model(vocab_size=50257, n_positions=64, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path / "model")
    result = demo(tmp_path, "--model", str(tmp_path / "model"), "The dog", forks=forks)
    assert result.returncode == 0 and result.stdout.startswith("The dog") and "random weights" not in result.stderr

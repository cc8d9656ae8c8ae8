"""The `gpt2` program as a whole (gpt2.cli.main): bad input is one line on stderr and exit status 2, warnings one line
each, --version and the commands' help, --threads, and `python -m gpt2` run as a real process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run
from helpers import REPO, make_hf_model

from gpt2.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tokenize", "--decode", "15496", "oops"], "--decode takes integer token ids, got 'oops'"),
        (["tokenize", "--decode", "-5"], "token id -5 at position 0 is out of range"),
        (["tokenize", "--decode", "50257"], "token id 50257 at position 0 is out of range: ids are 0..50256"),
        (["tokenize"], "nothing to tokenize"),
        (["tokenize", "--frobnicate", "x"], "unrecognized arguments: --frobnicate (see 'gpt2 tokenize --help')"),
        (
            ["tokenize", "\udcff\udcfe"],
            "the text given on the command line is not UTF-8 text: byte 0xff at character 0",
        ),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("gpt2: error: ")
    assert message in err
    assert "Traceback" not in err


def test_console_script_runs_as_a_process():
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "tokenize", "--count", "-"],
        input=b"Hello world",
        capture_output=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"2\n", b"")
    result = subprocess.run(
        [sys.executable, "-m", "gpt2", "tokenize", "--decode", "x"], capture_output=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.decode().strip() == "gpt2: error: --decode takes integer token ids, got 'x'"


def test_importing_gpt2_and_tokenizing_does_not_import_torch():
    code = "import sys, gpt2.cli; gpt2.cli.main(['tokenize', '--count', 'hi']); assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


def test_version_and_help_texts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"gpt2 {__import__('gpt2').__version__}\n"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    text = " ".join(out.split())  # argparse wraps help lines at the terminal's width
    for default in [
        "(default: float32)",
        "(default: off)",
        "(default: random)",
        "(default: 200, or the vocabulary size if smaller)",
        "(default: 0.8)",
        "(default: gpt2)",
        "(default: torch)",
    ]:
        assert default in text, default
    assert (
        '\nexamples:\n  gpt2 generate "Alan Turing' in out
        and '\n  echo "The meaning of life is" | gpt2 generate -' in out
    )
    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    assert '\nexamples:\n  gpt2 tokenize "Hello world"\n  gpt2 tokenize --decode 15496 995\n' in capsys.readouterr().out


def test_prepare_and_train_into_an_unwritable_out_say_so_in_one_line(tmp_path, forks):
    """One case each (a process costs seconds): tests/test_files.py, test_data_text.py and
    test_training_train.py hold the others."""
    from gpt2.data.text import prepare

    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    prepare([tmp_path / "in.txt"], tmp_path / "data", "char", progress=False)
    (tmp_path / "a-file").write_text("x")
    on_linux = Path("/proc/self").is_dir()
    train_out = Path("/proc/gpt2-out") if on_linux else tmp_path / "a-file" / "out"
    train_reason = (
        "/proc takes no new files or directories (no such file or directory)"
        if on_linux
        else f"{tmp_path / 'a-file'} is a file, not a directory"
    )
    tiny = [
        "--n-layer",
        "1",
        "--n-head",
        "1",
        "--n-embd",
        "8",
        "--block-size",
        "8",
        "--max-iters",
        "1",
        "--device",
        "cpu",
    ]
    cases = [
        (
            ["prepare", str(tmp_path / "in.txt"), "--no-progress", "--out", str(tmp_path / "a-file")],
            f"cannot write into {tmp_path / 'a-file'}: {tmp_path / 'a-file'} is a file, not a directory",
        ),
        (
            ["train", "--data", str(tmp_path / "data"), *tiny, "--out", str(train_out)],
            f"cannot write into {train_out}: {train_reason}",
        ),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for command, message in cases:
        result = subprocess.run([forks.command, *command], env=env, capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr) == (2, f"gpt2: error: {message}\n")


def test_warnings_are_one_line_each(tmp_path, forks):
    """The BPE trainer runs out of pairs on a small corpus: one line, no Python warning with a source path."""
    (tmp_path / "in.txt").write_text("to be or not to be, that is the question\n" * 30, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [
        forks.command,
        "prepare",
        str(tmp_path / "in.txt"),
        "--out",
        str(tmp_path / "d"),
        "--tokenizer",
        "bpe:30000",
        "--no-progress",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert (
        result.returncode == 0 and len(lines) == 2 and lines[1].startswith("gpt2: ") and "validation tokens" in lines[1]
    )
    assert re.fullmatch(
        r"gpt2: warning: the corpus ran out of pairs to merge after \d+ merges: the vocabulary has \d+ ids, "
        r"not 30000",
        lines[0],
    )


def test_a_warning_of_generate_is_one_line(capsys, model_dir):
    code, out, err = run(capsys, "generate", "", "--model", model_dir, "--max-new-tokens", "2", "--seed", "0")
    assert code == 0 and out
    warning, summary = err.splitlines()
    assert warning == "gpt2: warning: empty prompt: generating from <|endoftext|>, as GPT-2's unconditional samples do"
    assert summary.startswith("[gpt2: 2 tokens in ")


@pytest.mark.parametrize(
    "command", [["generate", "Hi", "--max-new-tokens", "2"], ["eval", "FILE"], ["train", "--out", "OUT"]]
)
def test_threads_sets_torchs_thread_count(command, capsys, tmp_path, monkeypatch):
    """--threads N: on a busy machine, fewer threads than cores (torch's threads wait for each other)."""
    import torch

    make_hf_model(vocab_size=50257, n_positions=16, n_embd=16, n_layer=1, n_head=2).save_pretrained(tmp_path / "m")
    (tmp_path / "text.txt").write_text("Some text to score, long enough to have a few windows of ids.")
    argv = [{"FILE": str(tmp_path / "text.txt"), "OUT": str(tmp_path / "out")}.get(a, a) for a in command]
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)  # the test's own threads stay as they are
    code = main([*argv, "--threads", "1"] + (["--model", str(tmp_path / "m")] if command[0] != "train" else []))
    assert chosen == [1]
    assert code == (2 if command[0] == "train" else 0)  # train: no --data, but the threads were set first
    assert main([*argv, "--threads", "0"]) == 2
    assert "gpt2: error: --threads must be a positive integer, got 0" in capsys.readouterr().err

"""The library's messages said with the commands' flags (gpt2.cli.flags): a wrong flag of any command is refused before
the model loads, in one line that names the flag, never the library's parameter."""

from __future__ import annotations

import re

import pytest
from cli_helpers import run
from helpers import REPO, make_hf_model


def test_the_cli_adds_the_flags_of_the_parameters_a_message_names(capsys, tmp_path):
    """The library's messages name its parameters (resume, max_iters); the command line adds the flag of each."""
    from gpt2.data.text import prepare

    (tmp_path / "in.txt").write_text(
        "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8"
    )
    prepare([tmp_path / "in.txt"], tmp_path / "data", "char", progress=False)
    out = str(tmp_path / "out")
    code, _, err = run(capsys, "train", "--out", out, "--resume", "--overwrite")
    assert (code, err) == (2, "gpt2: error: --resume and --overwrite contradict each other: pick one\n")
    code, _, err = run(capsys, "train", "--out", out, "--resume")
    assert code == 2 and err.endswith("(start a run without --resume)\n")
    tiny = ["--n-layer", "1", "--n-head", "1", "--n-embd", "8", "--block-size", "8", "--device", "cpu", "--no-progress"]
    code, _, err = run(capsys, "train", "--data", str(tmp_path / "data"), "--out", out, "--max-iters", "1", *tiny)
    assert code == 0  # the warning of a warm-up as long as the run: a GPT2Warning with its parameters
    assert err.startswith("gpt2: warning: --warmup-iters 2000 is not below --max-iters 1: ")
    assert " of lr (--lr) 0.0006), and never decays; pass a smaller --warmup-iters\n" in err
    code, _, err = run(capsys, "train", "--data", str(tmp_path / "data"), "--out", out, "--max-iters", "1", *tiny)
    assert code == 2 and err.endswith(": pass --resume to continue it, or --overwrite to start over\n")
    code, _, err = run(capsys, "train", "--out", out, "--resume", "--block-size", "16")
    assert code == 2 and err.startswith("gpt2: error: --block-size is 16, but the run was started with 8: ")
    assert err.endswith("; start a new run with --overwrite instead\n")


# (argv, the flag its one line names): a wrong value of each command's flags, refused before any model loads
WRONG_FLAGS = [
    (["generate", "Hi", "--temperature", "-1"], "--temperature"),
    (["generate", "Hi", "--top-k", "0"], "--top-k"),
    (["generate", "Hi", "--top-p", "0"], "--top-p"),
    (["generate", "Hi", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "Hi", "--num-samples", "0"], "--num-samples"),
    (["generate", "Hi", "--seed", "-1"], "--seed"),
    (["generate", "Hi", "--stop", ""], "--stop"),
    (["generate", "Hi", "--device", "tpu"], "--device"),
    (["generate", "Hi", "--draft-model", "MODEL", "--draft-tokens", "0"], "--draft-tokens"),
    (["generate", "Hi", "--draft-model", "CHARS"], "--draft-model"),  # another vocabulary: its config.json says so
    (["chat", "--temperature", "-1"], "--temperature"),
    (["chat", "--top-k", "0"], "--top-k"),
    (["chat", "--top-p", "2"], "--top-p"),
    (["chat", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["chat", "--seed", "-1"], "--seed"),
    (["chat", "--device", "tpu"], "--device"),
    (["inspect", "a", "--temperature", "-1"], "--temperature"),  # drawn with --png only, and checked always
    (["inspect", "a", "--top-p", "2"], "--top-p"),
    (["inspect", "a", "--top-k", "0"], "--top-k"),
    (["inspect", "a", "--device", "tpu"], "--device"),
    (["eval", "TEXT", "--context", "1"], "--context"),
    (["eval", "TEXT", "--stride", "0"], "--stride"),
    (["eval", "TEXT", "--context", "16", "--stride", "17"], "--stride"),
    (["eval", "TEXT", "--batch-size", "0"], "--batch-size"),
    (["eval", "--task", "lambada", "--limit", "0"], "--limit"),
    (["eval", "--data", "NOWHERE"], "--data"),
    (["eval", "TEXT", "--device", "tpu"], "--device"),
    (["serve", "--max-batch-size", "0"], "--max-batch-size"),
    (["serve", "--max-num-batched-tokens", "4"], "--max-batch-size"),
    (["serve", "--max-n", "0"], "--max-n"),
    (["serve", "--max-queue", "0"], "--max-queue"),
    (["serve", "--max-inspect-cells", "0"], "--max-inspect-cells"),
    (["serve", "--max-patching-tokens", "0"], "--max-patching-tokens"),
    (["serve", "--prefix-cache-mb", "-1"], "--prefix-cache-mb"),
    (["serve", "--port", "99999"], "--port"),
    (["serve", "--device", "tpu"], "--device"),
    (["serve", "--draft-model", "CHARS"], "--draft-model"),
    (["prepare", "TEXT", "--out", "OUT", "--val-fraction", "2"], "--val-fraction"),
    (["prepare", "TEXT", "--out", "OUT", "--tokenizer", "bpe:12"], "--tokenizer"),
    (["prepare", "TEXT", "--out", "OUT", "--shard-tokens", "0"], "--shard-tokens"),
    (["prepare", "TEXT", "--out", "OUT", "--workers", "0"], "--workers"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--lr", "-1"], "--lr"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--batch-size", "0"], "--batch-size"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--resume", "--overwrite"], "--overwrite"),
    (["train", "--out", "OUT", "--data", "NOWHERE", "--init", "gpt2", "--n-layer", "2"], "--n-layer"),
    (
        ["train", "--out", "OUT", "--data", "NOWHERE", "--muon-lr", "0.02"],
        "--optimizer muon",
    ),  # was "pass optimizer='muon'"
    (["train", "--out", "OUT", "--data", "NOWHERE", "--warmup-iters", "-1"], "--warmup-iters"),
]


@pytest.fixture(scope="module")
def chars_dir(tmp_path_factory):
    """A character model (65 ids), as a draft of another vocabulary than GPT-2's."""
    from gpt2.tokenizer import CharTokenizer

    directory = tmp_path_factory.mktemp("chars")
    make_hf_model(vocab_size=65, n_positions=32, n_embd=32, n_layer=1, n_head=2).save_pretrained(directory)
    CharTokenizer([chr(c) for c in range(32, 97)]).save(directory)
    return str(directory)


@pytest.mark.parametrize("argv, flag", WRONG_FLAGS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in WRONG_FLAGS])
def test_a_wrong_flag_is_refused_before_the_model_loads_in_one_line_that_names_it(
    argv, flag, capsys, monkeypatch, model_dir, chars_dir, tmp_path, text_file
):
    """No model loads (a load fails the test), so a wrong value is said at once, not after a minute of
    loading; the line names the flag, never the library's parameter (top_k, resume=True)."""
    from gpt2.model.model import GPT2
    from gpt2.reference import ReferenceModel

    def loaded(*args, **kwargs):
        pytest.fail("the model loaded before the flags were checked")

    monkeypatch.setattr(GPT2, "from_pretrained", loaded)
    monkeypatch.setattr(ReferenceModel, "load", loaded)
    paths = {
        "MODEL": model_dir,
        "CHARS": chars_dir,
        "TEXT": str(text_file),
        "OUT": str(tmp_path / "out"),
        "NOWHERE": str(tmp_path / "no"),
    }
    argv = [paths.get(a, a) for a in argv]
    model = ["--model", model_dir] if argv[0] in ("generate", "chat", "inspect", "eval", "serve") else []
    code, out, err = run(capsys, *argv, *model, stdin=b"", monkeypatch=monkeypatch)
    line = err.replace(str(tmp_path), "DIR").replace(model_dir, "MODEL").replace(chars_dir, "CHARS")
    assert (code, out) == (2, "") and line.startswith("gpt2: error: ") and line.count("\n") == 1, err
    assert flag in line and "=True" not in line and not re.search(r"\b[a-z]+(?:_[a-z0-9]+)+\b", line), (
        line
    )  # no snake_case name


def test_a_bound_that_needs_the_model_names_the_flag_once_it_has_loaded(capsys, model_dir):
    """--top-k's bound is the vocabulary; inspect's library check calls it k, the command --top-k."""
    for argv in (["inspect", "a"], ["generate", "Hi"]):
        code, out, err = run(capsys, *argv, "--top-k", "50258", "--model", model_dir)
        assert (code, out, err) == (
            2,
            "",
            "gpt2: error: --top-k must be an integer from 1 to 50257, the model's vocabulary size, got 50258\n",
        )


def test_no_library_message_names_a_flag_of_the_cli():
    """Only gpt2.cli speaks of gpt2's flags: the library names its parameters, and the CLI names their flags."""
    import argparse
    import ast

    from gpt2.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices.values()
    flags = {
        flag
        for p in (parser, *commands)
        for action in p._actions
        for flag in action.option_strings
        if flag.startswith("--")
    }
    assert {"--max-iters", "--overwrite", "--max-batch-size", "--version"} <= flags
    # the C compiler's flag, asked of the compiler; the server's flag, in the 400 of chat without a template
    # (no CLI between)
    not_messages = {("kernels.py", "--version"), ("server.py", "--chat-template")}
    not_messages |= {("graphs.py", "--transcoders"), ("graphs.py", "--feature-data")}  # the server's, in its 400s
    found = []
    for path in sorted((REPO / "src" / "gpt2").rglob("*.py")):
        if path.parent.name == "cli":  # the command line's own package
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        documented = [
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        docstrings = {id(n.body[0].value) for n in documented if n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                named = set(re.findall(r"--[a-z][a-z0-9-]*", node.value)) & flags
                found += [
                    f"{path.name}:{node.lineno}: {flag}" for flag in named if (path.name, flag) not in not_messages
                ]
    assert not found, f"library strings name gpt2's flags (name the parameter; the CLI names its flag): {found}"

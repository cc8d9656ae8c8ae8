"""`gpt2 eval` (gpt2.cli.eval): perplexity of a text or prepared data, and tasks, equal to the Python API's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_helpers import run
from helpers import REPO
from transformers import GPT2LMHeadModel

from gpt2.cli import main
from gpt2.data.files import FORMAT


def test_eval_json_is_one_object_equal_to_the_api(capsys, model_dir, text_file):
    import json

    from gpt2 import GPT2
    from gpt2.evaluation.evaluate import evaluate_file

    code, out, err = run(
        capsys, "eval", str(text_file), "--model", model_dir, "--context", "32", "--stride", "8", "--json"
    )
    assert code == 0 and out.count("\n") == 1
    expected = evaluate_file(GPT2.from_pretrained(model_dir, device="cpu"), text_file, context=32, stride=8).to_dict()
    assert json.loads(out) == expected and list(json.loads(out)) == ["tokens", "loss", "perplexity", "bits_per_byte"]
    assert "perplexity: 100%" in err  # the progress bar


def test_eval_prints_a_line_per_measure(capsys, model_dir, text_file):
    code, out, err = run(capsys, "eval", str(text_file), "--model", model_dir, "--no-progress")
    assert code == 0 and err == ""
    assert [line.split()[0] for line in out.splitlines()] == ["tokens", "loss", "perplexity", "bits_per_byte"]


def test_eval_prepared_data_and_tasks(capsys, model_dir, tmp_path, text_file, monkeypatch):
    import json

    import gpt2.data.files
    import gpt2.evaluation.evaluate

    assert main(["prepare", str(text_file), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    opened = []  # open_data reads every id to check it: the directory is opened once, before the model loads
    counted = lambda path: opened.append(path) or open_data(path)  # noqa: E731
    open_data = gpt2.data.files.open_data
    monkeypatch.setattr(gpt2.data.files, "open_data", counted)
    monkeypatch.setattr(gpt2.evaluation.evaluate, "open_data", counted)
    code, out, _ = run(capsys, "eval", "--data", str(tmp_path / "d"), "--model", model_dir, "--json")
    assert code == 0 and json.loads(out)["tokens"] > 0 and opened == [str(tmp_path / "d")]
    lambada = tmp_path / "lambada_test.jsonl"
    lambada.write_text(
        "".join(json.dumps({"text": f"example number {i} ends here"}) + "\n" for i in range(5)), encoding="utf-8"
    )
    code, out, _ = run(
        capsys, "eval", "--task", "lambada", "--data", str(lambada), "--limit", "3", "--model", model_dir, "--json"
    )
    assert (
        code == 0
        and list(json.loads(out)) == ["task", "examples", "acc", "perplexity"]
        and json.loads(out)["examples"] == 3
    )
    hellaswag = tmp_path / "hellaswag_val.jsonl"
    hellaswag.write_text(
        json.dumps({"ctx": "A man", "endings": ["runs.", "sits.", "eats.", "sleeps."], "label": 1}) + "\n",
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "eval", "--task", "hellaswag", "--data", str(hellaswag), "--model", model_dir, "--json")
    assert code == 0 and list(json.loads(out)) == ["task", "examples", "acc", "acc_norm"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["EMPTY"], "empty.txt is empty: there is nothing to evaluate"),
        (["LATIN1"], "latin1.txt is not UTF-8 text: byte 0xe9 at offset 3"),
        (["ONE"], "one.txt is 1 id long: perplexity needs at least 2"),
        (["nowhere.txt"], "nowhere.txt does not exist"),
        (
            ["TEXT", "--context", "65"],
            "--context must be a number of ids up to the model's n_ctx=64, i.e. from 2 to 64, got 65",
        ),
        (["TEXT", "--context", "1"], "--context must be a number of ids from 2 up, got 1"),
        (["TEXT", "--stride", "0"], "--stride must be a number of ids from 1 up, got 0"),
        (
            ["TEXT", "--context", "16", "--stride", "17"],
            "--stride must be a number of ids up to the context (16), i.e. from 1 to 16, got 17",
        ),
        (["TEXT", "--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
        (["--task", "mmlu"], "argument --task: invalid choice: 'mmlu' (choose from "),
        (["--task", "lambada", "--data", "BADLINE"], "bad.jsonl, line 2: not JSON"),
        (["--task", "hellaswag", "--data", "BADLINE"], 'bad.jsonl, line 1: expected {"ctx": text'),
        (["--task", "lambada", "--limit", "0"], "--limit must be a positive integer, got 0"),
        (["--task", "lambada"], "lambada is not in the cache"),
        ([], "give one thing to evaluate: a text FILE, --data DIR (a prepared directory's val.bin), or --task NAME"),
        (["TEXT", "--data", "somewhere"], "give one thing to evaluate"),
        (["TEXT", "--task", "lambada"], "give a FILE or --task, not both"),
        (["TEXT", "--limit", "3"], "--limit counts the examples of a --task"),
        (["--data", "nowhere"], "--data 'nowhere' does not exist"),
    ],
)
def test_eval_bad_input_is_one_line_and_exit_2(capsys, model_dir, tmp_path, text_file, args, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9".encode("latin-1"))
    (tmp_path / "one.txt").write_text("a", encoding="utf-8")
    (tmp_path / "bad.jsonl").write_text('{"text": "two words"}\n{"text": \n', encoding="utf-8")
    names = {"EMPTY": "empty.txt", "LATIN1": "latin1.txt", "ONE": "one.txt", "BADLINE": "bad.jsonl"}
    args = [str(text_file) if a == "TEXT" else str(tmp_path / names[a]) if a in names else a for a in args]
    code, out, err = run(capsys, "eval", *args, "--model", model_dir, "--no-progress")
    assert (code, out) == (2, "")
    assert err.startswith("gpt2: error: ") and err.count("\n") == 1 and message in err


INDUCTION_2L = str(REPO / "tests" / "fixtures" / "induction_2l")  # trained here: 64 ids, no tokenizer


@pytest.fixture
def ids_data(tmp_path):
    """A prepared directory of 64 ids of a 64-id vocabulary, and no tokenizer (as meta.json says), written by hand."""
    half = np.random.default_rng(0).integers(0, 64, 32)
    ids = np.concatenate([half, half]).astype("<u2")
    for split in ("train", "val"):
        ids.tofile(tmp_path / f"{split}.bin")
    meta = {"format": FORMAT, "version": 1, "dtype": "uint16", "vocab_size": 64, "train_tokens": 64, "val_tokens": 64}
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "tokenizer": None}))
    return tmp_path, ids.tolist()


def test_eval_scores_the_ids_of_a_model_with_no_tokenizer_as_transformers(capsys, ids_data):
    directory, ids = ids_data
    code, out, err = run(capsys, "eval", "--data", str(directory), "--model", INDUCTION_2L, "--json", "--no-progress")
    assert code == 0, err
    hf = GPT2LMHeadModel.from_pretrained(INDUCTION_2L).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()  # one window: the whole context
    assert abs(json.loads(out)["loss"] - expected) < 1e-4


def test_eval_of_a_text_by_a_model_with_no_tokenizer_is_one_line(capsys, text_file):
    code, out, err = run(capsys, "eval", str(text_file), "--model", INDUCTION_2L)
    assert (code, out) == (2, "") and err == (
        f"gpt2: error: the model {INDUCTION_2L} comes with no tokenizer (encoder.json + vocab.bpe, or chars.json), "
        "and its vocabulary of 64 ids is not GPT-2's: a text FILE needs one; give its ids instead, a directory "
        "prepared with the model's vocabulary (--data DIR)\n"
    )

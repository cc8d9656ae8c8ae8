"""What gpt2 ships (gpt2.examples): tinyshakespeare, and shakespeare_char trained on it, offline."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import numpy as np
import pytest
import torch
from helpers import REPO
from transformers import GPT2LMHeadModel

from gpt2 import GPT2
from gpt2.cli import main
from gpt2.data.text import prepare
from gpt2.errors import DataError, UnknownModelError
from gpt2.examples import MODELS, corpus_text, model_directory

SHIPPED = REPO / "src" / "gpt2" / "embedded" / "shakespeare_char"


def test_the_corpus_is_tinyshakespeare():
    text = corpus_text("shakespeare")
    # Karpathy's char-rnn input.txt, as nanoGPT's shakespeare_char/prepare.py downloads it
    assert len(text) == 1_115_394 and hashlib.md5(text.encode()).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    with pytest.raises(DataError, match="unknown corpus 'sonnets': gpt2 ships shakespeare"):
        corpus_text("sonnets")


def test_gpt2_prepare_shakespeare_is_nanogpts_shakespeare_char(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "shakespeare", "--out", "data", "--tokenizer", "char", "--no-progress"]) == 0
    assert "1,003,854 training and 111,540 validation tokens" in capsys.readouterr().err
    text = corpus_text("shakespeare")  # nanoGPT's prepare.py: sorted characters, the first 90% to train
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}
    cut = int(len(text) * 0.9)
    assert np.array_equal(np.fromfile("data/train.bin", dtype="<u2"), [stoi[c] for c in text[:cut]])
    assert np.array_equal(np.fromfile("data/val.bin", dtype="<u2"), [stoi[c] for c in text[cut:]])


def test_a_file_of_that_name_is_read_as_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shakespeare").write_text("To be, or not to be: that is the question.\n" * 50, encoding="utf-8")
    meta = prepare(["shakespeare"], tmp_path / "data", "char", progress=False)
    assert meta["train_tokens"] + meta["val_tokens"] == 43 * 50
    with pytest.raises(DataError, match=r"input 'shakespear' does not exist: .* a corpus gpt2 ships \(shakespeare\)"):
        prepare(["shakespear"], tmp_path / "other", "char", progress=False)


def hf_sliding_window_loss(model: GPT2LMHeadModel, ids: np.ndarray, context: int, stride: int) -> float:
    """Hugging Face's recipe ("Perplexity of fixed-length models"): windows moved by `stride`, each
    scoring the ids no earlier window scored, so every id but the first once; windows of one
    length run 512 at a time."""
    windows, previous_end = [], 0  # (begin, end, the first of its targets that no earlier window scored)
    for begin in range(0, len(ids), stride):
        end = min(begin + context, len(ids))
        windows.append((begin, end, max(previous_end, begin + 1) - begin - 1))
        previous_end = end
        if end == len(ids):
            break
    nll, scored = 0.0, 0
    for length in {end - begin for begin, end, _ in windows}:
        same = [w for w in windows if w[1] - w[0] == length]
        for first in range(0, len(same), 512):
            batch = same[first : first + 512]
            x = torch.tensor(np.stack([ids[begin:end] for begin, end, _ in batch]), dtype=torch.long)  # (B, T)
            with torch.no_grad():
                logprobs = model(x).logits[:, :-1].double().log_softmax(-1)  # (B, T - 1, V)
            picked = logprobs.gather(2, x[:, 1:, None])[..., 0]  # (B, T - 1): each target's log-probability
            for row, (_, _, new) in enumerate(batch):
                nll -= picked[row, new:].sum().item()
                scored += length - 1 - new
    assert scored == len(ids) - 1
    return nll / scored


def test_the_shipped_model_scores_its_recorded_validation_loss_in_transformers():
    """The model card's validation loss, recomputed by transformers on nanoGPT's validation split."""
    card = (SHIPPED / "README.md").read_text(encoding="utf-8")
    recorded = float(re.search(r"validation loss \*\*(\d\.\d{4})\*\*", card).group(1))
    text = corpus_text("shakespeare")
    chars = json.loads((SHIPPED / "chars.json").read_text(encoding="utf-8"))["chars"]
    assert chars == sorted(set(text))  # nanoGPT's vocabulary: the corpus's characters, sorted
    stoi = {c: i for i, c in enumerate(chars)}
    val = np.array([stoi[c] for c in text[int(len(text) * 0.9) :]])
    reference = GPT2LMHeadModel.from_pretrained(SHIPPED).eval()
    assert reference.config.n_positions == 64
    loss = hf_sliding_window_loss(reference, val, context=64, stride=32)
    assert abs(loss - recorded) < 1e-3, (loss, recorded)
    assert loss < 1.9  # it has learnt: a uniform guess over 65 characters scores 4.17
    assert sum(f.stat().st_size for f in SHIPPED.iterdir()) < 4_000_000  # a few MB at most


def test_the_shipped_model_loads_by_name_and_writes_shakespeare(capsys):
    assert (
        MODELS == {"shakespeare_char": "shakespeare_char"} and model_directory("shakespeare_char") == SHIPPED.resolve()
    )
    model = GPT2.from_pretrained("shakespeare_char")
    reference = GPT2LMHeadModel.from_pretrained(SHIPPED).eval()
    ids = torch.tensor([model.tokenizer.encode("ROMEO:\nBut soft")])
    with torch.no_grad():
        assert torch.allclose(model(ids), reference(ids).logits, atol=1e-4)
    assert main(["generate", "ROMEO:", "--model", "shakespeare_char", "--max-new-tokens", "200", "--seed", "1"]) == 0
    words = re.findall(r"[a-z]+", capsys.readouterr().out.lower())
    assert (
        sum(w in {"the", "and", "to", "of", "my", "you", "that", "i", "not", "is"} for w in words) >= 5
    )  # words, not noise
    with pytest.raises(UnknownModelError, match="not one gpt2 ships \\(shakespeare_char\\)"):
        GPT2.from_pretrained("shakespeare-char")


def test_the_script_rebuilds_it(tmp_path, forks):
    """scripts/make_shakespeare_char.sh, two iterations: the shipped model's files, loadable. Its
    gpt2 commands are forked (tests/forks.py), through the script's GPT2 variable."""
    env = {**os.environ, "GPT2": str(forks.command), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "make_shakespeare_char.sh"),
            str(tmp_path / "out"),
            "--max-iters",
            "2",
            "--eval-iters",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        p.name for p in SHIPPED.iterdir() if p.name != "README.md"
    )
    assert re.search(r"loss\s+[34]\.\d{4}", done.stdout)  # two iterations: barely below 4.17, the uniform guess
    model = GPT2.from_pretrained(tmp_path / "out")
    assert model.config == GPT2.from_pretrained("shakespeare_char").config

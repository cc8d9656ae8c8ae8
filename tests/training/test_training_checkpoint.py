"""A training run's checkpoint.pt: written atomically, read back, refused when it is not one.
(Resuming from it, bit for bit, is tested in test_training_train.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt2 import CheckpointError, InvalidArgumentError
from gpt2.checkpoints.config import GPT2Config
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.training.checkpoint import (
    CHECKPOINT,
    checkpoint_state,
    load_checkpoint,
    model_from_checkpoint,
    process_rng,
    rng_state,
    write_checkpoint,
)

CPU = torch.device("cpu")


def a_checkpoint(model: GPT2) -> dict:
    return checkpoint_state(
        settings=TrainSettings(data="d").to_dict(),
        config=model.config,
        iteration=3,
        evaluated=2,
        best_val_loss=1.5,
        model=model.state_dict(),
        optimizer={},
        scaler={},
        rng=[rng_state(CPU)],
    )


def test_a_checkpoint_reads_back_with_its_model(tmp_path):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_vocab=50, n_ctx=8, n_embd=16, n_head=2, n_layer=1))
    write_checkpoint(tmp_path, a_checkpoint(model))
    state = load_checkpoint(tmp_path)
    assert (state["iteration"], state["evaluated"], state["best_val_loss"]) == (3, 2, 1.5)
    x = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model_from_checkpoint(state).eval()(x)[0], model.eval()(x)[0], rtol=0, atol=0)


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = GPT2(GPT2Config(n_vocab=50, n_ctx=8, n_embd=16, n_head=2, n_layer=1))
    write_checkpoint(tmp_path, a_checkpoint(model))
    before = (tmp_path / CHECKPOINT).read_bytes()

    def disk_full(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint is intact"):
        write_checkpoint(tmp_path, a_checkpoint(model))
    assert (tmp_path / CHECKPOINT).read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_what_is_not_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(
        InvalidArgumentError,
        match=f"nothing to resume in {tmp_path}: it holds no checkpoint.pt .start a run without resume=True.",
    ) as e:
        load_checkpoint(tmp_path)
    assert e.value.param == "resume"
    (tmp_path / CHECKPOINT).write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="checkpoint.pt cannot be read .*; start again with overwrite=True") as e:
        load_checkpoint(tmp_path)
    assert e.value.param == "overwrite"
    torch.save({"format": "something else"}, tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError, match="checkpoint.pt is not a checkpoint of gpt2 train"):
        load_checkpoint(tmp_path)


def test_each_process_resumes_its_own_random_state():
    states = [{"cpu": torch.full((4,), rank, dtype=torch.uint8), "cuda": None} for rank in range(2)]
    version2 = {"version": 2, "rng": states}
    assert process_rng(version2, 1, CPU) is states[1]
    assert process_rng(version2, 2, CPU) is None  # a process added on resume keeps the seed it started from
    version1 = {"version": 1, "rng_cpu": states[0]["cpu"], "rng_cuda": []}  # one process's, before distributed training
    assert process_rng(version1, 0, CPU) == {"cpu": states[0]["cpu"], "cuda": None}
    assert process_rng(version1, 1, CPU) is None

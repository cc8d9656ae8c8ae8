"""The optimisers and their schedule (gpt2.training.optim): nanoGPT's learning rate, and Muon beside AdamW."""

from __future__ import annotations

import pytest
import torch
from training_helpers import nanogpt_lr

from gpt2.checkpoints.config import GPT2Config
from gpt2.model.model import GPT2
from gpt2.settings import TrainSettings
from gpt2.training.optim import learning_rate, make_optimizers


@pytest.mark.parametrize("warmup, decay", [(100, 2000), (0, 50), (2000, 600_000), (10, 11)])
def test_learning_rate_schedule_equals_nanogpt(warmup, decay):
    s = TrainSettings(data="unused", lr=1e-3, min_lr=1e-4, warmup_iters=warmup, lr_decay_iters=decay, max_iters=decay)
    for it in sorted(
        {0, 1, warmup - 1, warmup, warmup + 1, (warmup + decay) // 2, decay - 1, decay, decay + 1, 3 * decay}
    ):
        if it >= 0:
            assert learning_rate(it, s) == pytest.approx(
                nanogpt_lr(it, 1e-3, warmup, decay, 1e-4), rel=1e-12, abs=1e-15
            )
    assert learning_rate(warmup, s) == pytest.approx(1e-3)  # the peak, once warm-up is over
    assert learning_rate(decay + 5, s) == 1e-4


def test_muon_updates_the_blocks_matrices_and_adamw_the_rest():
    model = GPT2(GPT2Config(n_vocab=65, n_ctx=16, n_layer=2, n_head=2, n_embd=32, bias=True))
    adamw, muon = make_optimizers(model, TrainSettings(data="unused", optimizer="muon"), torch.device("cpu"))
    names = {p: name for name, p in model.named_parameters()}
    matrices = [
        f"transformer.h.{i}.{m}.weight"
        for i in (0, 1)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]
    assert isinstance(muon, torch.optim.Muon) and sorted(names[p] for p in muon.param_groups[0]["params"]) == sorted(
        matrices
    )
    decayed, not_decayed = ([names[p] for p in g["params"]] for g in adamw.param_groups)
    assert decayed == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert len(not_decayed) == 2 * 8 + 2 and all(
        name.endswith(("bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")) for name in not_decayed
    )
    (alone,) = make_optimizers(model, TrainSettings(data="unused"), torch.device("cpu"))  # adamw: every weight
    assert sum(len(g["params"]) for g in alone.param_groups) == len(names)


def test_muon_lr_scales_the_schedule():
    s = TrainSettings(
        data="unused", lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=100, optimizer="muon", muon_lr=5e-3
    )
    for it in (0, 5, 10, 50, 99, 150):
        assert learning_rate(it, s, 5e-3) == pytest.approx(5 * nanogpt_lr(it, 1e-3, 10, 100, 1e-4), rel=1e-12)
    assert (
        learning_rate(150, s, s.lr) == learning_rate(150, s) == 1e-4
    )  # the peak lr itself: the same numbers, bit for bit

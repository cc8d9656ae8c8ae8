"""The optimizers and the learning rate's schedule: AdamW (fused where it can be) and Muon for the blocks' matrices,
nanoGPT's warm-up and cosine decay.
"""

from __future__ import annotations

import math
import warnings

import torch

from gpt2.devices import fused_adamw_available
from gpt2.errors import GPT2Warning
from gpt2.model.model import GPT2
from gpt2.settings import MUON_LR, TrainSettings


class WarmupWarning(GPT2Warning):
    """The learning rate's warm-up lasts the whole run (warmup_iters >= max_iters): it never reaches
    lr, and never decays."""


def learning_rate(it: int, s: TrainSettings, peak: float | None = None) -> float:
    """nanoGPT's schedule: linear warm-up over warmup_iters, then cosine decay to min_lr at lr_decay_iters.
    `peak`: the schedule of a learning rate that tops at `peak` instead of lr (Muon's, muon_lr), the
    same curve scaled (down to min_lr * peak / lr)."""
    lr, min_lr = (s.lr, s.min_lr) if peak is None else (peak, s.min_lr * (peak / s.lr))
    if it < s.warmup_iters:
        return lr * (it + 1) / (s.warmup_iters + 1)
    if it >= s.lr_decay_iters:
        return min_lr
    decay_ratio = (it - s.warmup_iters) / (s.lr_decay_iters - s.warmup_iters)  # 0 .. 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (lr - min_lr)


def warn_about_warmup(s: TrainSettings) -> None:
    """A WarmupWarning where the warm-up is as long as the run: nanoGPT's default 2000 iterations
    suit its 600,000, not a short run (a warning, not an error: a short run may be resumed longer)."""
    if s.warmup_iters >= s.max_iters:
        last = learning_rate(s.max_iters - 1, s)
        share = 100 * last / s.lr
        percent = f"{share:.0f}%" if share >= 1 else f"{share:.1g}%"
        warnings.warn(
            WarmupWarning(
                f"warmup_iters {s.warmup_iters} is not below max_iters {s.max_iters}: the learning rate "
                f"warms up for the whole run, from {learning_rate(0, s):.2g} to {last:.2g} at its last "
                f"iteration ({percent} of lr {s.lr:g}), and never decays; pass a smaller warmup_iters",
                "warmup_iters",
                ("max_iters", "lr"),
            ),
            stacklevel=2,
        )


def make_optimizers(model: GPT2, s: TrainSettings, device: torch.device) -> list[torch.optim.Optimizer]:
    """The run's optimizers, stepped together. adamw: AdamW alone, with weight decay on the 2-D
    parameters only (matrices and embeddings, not biases or LayerNorms): nanoGPT's
    configure_optimizers, with the fused update on CPUs too (one pass over each tensor instead of
    several). muon: torch's Muon for the blocks' matrices (c_attn, c_proj, c_fc: the hidden layers
    it is made for) and AdamW as above for the rest: embeddings, biases, LayerNorms. Muon's update
    is scaled to the size of AdamW's (Moonshot's match_rms_adamw, the same whichever way round a
    matrix is stored), at its own learning rate (muon_lr) on the same schedule (docs/train.md)."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    muon = [p for name, p in params if s.optimizer == "muon" and name.startswith("transformer.h.") and p.dim() == 2]
    rest = [p for _, p in params if not any(p is q for q in muon)]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": s.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = {"fused": True} if fused_adamw_available(device) else {}
    optimizers: list[torch.optim.Optimizer] = [torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), **fused)]
    if muon:
        optimizers.append(
            torch.optim.Muon(
                muon,
                lr=peak_lr(s, muon=True),
                weight_decay=s.weight_decay,
                momentum=0.95,
                nesterov=True,
                adjust_lr_fn="match_rms_adamw",
            )
        )
    return optimizers


def peak_lr(s: TrainSettings, muon: bool) -> float:
    """The top of the learning rate's schedule: lr, or muon_lr (default MUON_LR) for Muon's matrices."""
    return (MUON_LR if s.muon_lr is None else s.muon_lr) if muon else s.lr

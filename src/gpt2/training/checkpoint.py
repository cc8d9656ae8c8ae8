"""A training run's checkpoint, OUT/checkpoint.pt: all a resume needs, in one file.

Version 2, the same file for one process, DDP and FSDP: the settings, the model's config and
whole weights, the optimizer's state by parameter name, the gradient scaler's, the iteration
reached, the last evaluation done, the best validation loss, each process's random state
(dropout's), the chat template the model carries (None, or absent in older files: none), and
the torchrun job that wrote it (its --rdzv-id, whose restarts continue the run: None, or absent
in older files, for none).
Version 1 (one process, before distributed training) kept the optimizer's state by parameter
index and one random state; it still resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpt2._files import atomic_path
from gpt2.checkpoints.config import GPT2Config
from gpt2.errors import CheckpointError, InvalidArgumentError, UnwritablePathError
from gpt2.model.model import GPT2
from gpt2.training.distributed import Processes

CHECKPOINT = "checkpoint.pt"
FORMAT = "gpt2-train-checkpoint"
VERSION = 2

RngState = dict[str, torch.Tensor | None]  # {"cpu": torch's CPU generator, "cuda": the device's, or None}


def checkpoint_state(
    *,
    settings: dict[str, Any],
    config: GPT2Config,
    iteration: int,
    evaluated: int,
    best_val_loss: float,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    scaler: dict[str, Any],
    rng: list[RngState],
    chat_template: str | None = None,
    job: str | None = None,
) -> dict[str, Any]:
    """The checkpoint of a run: `model` and `optimizer` whole (gathered from every process), `rng`
    each process's random state, by rank, `chat_template` the template the model carries (the
    data's or the init model's: a resume keeps it, whether or not the init model is still there),
    `job` the torchrun job writing it (`distributed.job_id`), whose restarted workers continue it."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "settings": settings,
        "model_config": config.to_hf_dict(),
        "iteration": iteration,
        "evaluated": evaluated,
        "best_val_loss": best_val_loss,
        "model": model,
        "optimizer": optimizer,
        "scaler": scaler,
        "rng": rng,
        "chat_template": chat_template,
        "job": job,
    }


def write_checkpoint(out: Path, state: dict[str, Any]) -> None:
    """Write OUT/checkpoint.pt atomically: a failed write keeps the last one."""
    path = out / CHECKPOINT
    try:
        with atomic_path(path) as tmp:
            torch.save(state, tmp)
    except OSError as e:  # an UnwritablePathError names the path already
        said = str(e) if isinstance(e, UnwritablePathError) else f"could not write {path}: {e.strerror or e}"
        raise CheckpointError(f"{said}; the previous checkpoint is intact") from None


def load_checkpoint(out: Path) -> dict[str, Any]:
    """The checkpoint in OUT, checked to be one of ours (either version)."""
    path = out / CHECKPOINT
    if not path.is_file():
        raise InvalidArgumentError(
            f"nothing to resume in {out}: it holds no {CHECKPOINT} (start a run without resume=True)", "resume"
        )
    try:
        # never runs code from the file; mapped, not read: the processes of a node share one copy
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise CheckpointError(
            f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"start again with overwrite=True",
            "overwrite",
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") not in (1, 2):
        raise CheckpointError(f"{path} is not a checkpoint of gpt2 train")
    return state


def checkpoint_job(state: dict[str, Any]) -> str | None:
    """The torchrun job that wrote the checkpoint (None: none, or a file from before jobs were recorded)."""
    return state.get("job")


def checkpoint_config(state: dict[str, Any]) -> GPT2Config:
    """The architecture of the checkpoint's model."""
    return GPT2Config.from_hf_dict(state["model_config"], CHECKPOINT)


def model_from_checkpoint(state: dict[str, Any]) -> GPT2:
    """The checkpoint's model, on the CPU."""
    model = GPT2(checkpoint_config(state))
    model.load_state_dict(state["model"])
    return model


def load_optimizer(
    state: dict[str, Any], procs: Processes, model: GPT2, optimizers: list[torch.optim.Optimizer]
) -> None:
    """Give `optimizers` the checkpoint's state: version 1's (AdamW's alone) by parameter index,
    version 2's by parameter name (through `procs`, which shares it out over the processes under FSDP)."""
    if state["version"] == 1:
        optimizers[0].load_state_dict(state["optimizer"])
    else:
        procs.load_optimizer_state(model, optimizers, state["optimizer"])


def process_rng(state: dict[str, Any], rank: int, device: torch.device) -> RngState | None:
    """The random state process `rank` saved; None for a process added on resume (it keeps the
    seed it started from)."""
    if state["version"] == 1:  # one process's, with the CUDA generator of each device
        cuda = state["rng_cuda"][device.index or 0] if state["rng_cuda"] else None
        rng = [{"cpu": state["rng_cpu"], "cuda": cuda}]
    else:
        rng = state["rng"]
    return rng[rank] if rank < len(rng) else None


def rng_state(device: torch.device) -> RngState:
    """This process's random state (dropout's): a few kB copied on the CPU, no GPU sync."""
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(rng: RngState, device: torch.device) -> None:
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and rng["cuda"] is not None:
        torch.cuda.set_rng_state(rng["cuda"], device)

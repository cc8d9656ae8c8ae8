"""Training on several processes, as torchrun starts them: the process group, the model's
wrapper (DistributedDataParallel, or FSDP2's `fully_shard` with --fsdp) and the few
collectives the trainer needs.

    torchrun --standalone --nproc_per_node 4 -m gpt2 train --data DIR --out OUT [--fsdp]

torchrun starts one process per device and tells each its place in the environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Every process runs the same loop over its
share of each step's micro-batches, and the gradients are averaged over the processes on the
last micro-batch of a step only (DDP's no_sync, FSDP2's set_requires_gradient_sync), so each
step makes the update one process would. The backend is NCCL on CUDA and gloo on the CPU.

A process that dies or hangs makes the others' collectives fail: gloo's at once or after
`timeout` seconds, NCCL's through its watchdog after the same timeout. The survivors then ask
the rendezvous store which ranks still answer, and stop with an error naming those that do not.
Under elastic torchrun (--nnodes MIN:MAX --max-restarts K) that error ends the workers, torchrun
restarts them on the nodes left, and `gpt2 train` continues its job's run (`job_id`) from the
checkpoint in OUT (train.py's auto_resume).
"""

from __future__ import annotations

import gc
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from gpt2.devices import process_device, resolve_device
from gpt2.errors import DistributedError, GPT2Error
from gpt2.model.model import GPT2
from gpt2.settings import DIST_TIMEOUT

ANSWER_WAIT = 10.0  # seconds the survivors of a failure wait to hear from each other
_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only


def launched() -> bool:
    """Started by torchrun, or by a launcher that sets the same variables (as SLURM scripts do)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_rank() -> int:
    """This process's rank as its launch says (RANK), before any process group: 0 outside a launch, -1
    for a RANK that is no number (never rank 0's to write; `start` refuses it, naming it)."""
    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.strip().isdigit() else -1


def job_id() -> str | None:
    """The id of the torchrun job this process is a worker of (its --rdzv-id, TORCHELASTIC_RUN_ID: the
    same in every restart of the job's workers; --standalone makes a new one each launch). None
    outside torchrun, and where the launch named none: torchrun's default id, "none", is every
    such job's, so it tells no run from another."""
    job = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return job if launched() and job not in ("", "none") else None


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0: the first start)."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(count) if count.isdigit() else 0


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip().isdigit():
        raise DistributedError(
            f"environment variable {name} must be a whole number for a distributed launch, got {value!r}"
            " (start with torchrun, which sets it)"
        )
    return int(value)


@dataclass
class Processes:
    """This process's place among the processes that train one model (one process: rank 0 of 1)."""

    device: torch.device
    rank: int = 0
    world: int = 1
    timeout: float = DIST_TIMEOUT
    store: dist.Store | None = None  # the rendezvous store, where a group was started here
    control: dist.ProcessGroup | None = None  # gloo beside NCCL, for flags and objects: no GPU sync
    ddp: DistributedDataParallel | None = field(default=None, repr=False)
    sharded: FSDPModule | None = field(default=None, repr=False)  # the model, under --fsdp

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    @property
    def sharing_memory(self) -> int:
        """The processes whose memory comes from the same place as this one's: on the CPU, those of
        this machine (torchrun's LOCAL_WORLD_SIZE); a GPU is each process's own."""
        if self.device.type != "cpu" or not launched():
            return 1
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    @property
    def grouped(self) -> bool:
        """Part of a process group (launched by torchrun, even as its only process)."""
        return dist.is_available() and dist.is_initialized()

    # ------------------------------------------------------------ the model

    def wrap(self, model: GPT2, *, fsdp: bool, compiled: bool) -> nn.Module:
        """The module a training step calls. One process: the model (compiled or not). In a
        group: DDP over it, or with `fsdp` the model sharded in place by FSDP2, each block
        and then the root (whose weights, wte, wpe and ln_f, are gathered whenever `forward`
        or `trunk` runs, so that evaluation and sampling, which call `trunk`, work as well)."""
        if fsdp:
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            register_fsdp_forward_method(model, "trunk")
            self.sharded = model
            return torch.compile(model) if compiled else model
        forward = torch.compile(model) if compiled else model
        if not self.grouped:
            return forward
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(forward, device_ids=device_ids)
        return self.ddp

    @contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """Average the gradients over the processes in this backward pass only if `sync` (the
        last micro-batch of a step); before it, each process accumulates its own."""
        if self.ddp is not None and not sync:
            with self.ddp.no_sync():
                yield
            return
        if self.sharded is not None:
            self.sharded.set_requires_gradient_sync(sync)
        yield

    # ------------------------------------------------------------ collectives

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `values` over the processes, the same on every one (rank 0's
        result, broadcast: a decision taken on it must be taken everywhere)."""
        if self.grouped:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            dist.broadcast(values, src=0)
        return values

    def any(self, flag: bool) -> bool:
        """Whether `flag` is true in any process (every process must ask; on the CPU, so that
        asking at each iteration does not wait for the GPU)."""
        if not self.grouped:
            return flag
        flags = torch.tensor([int(flag)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.control)
        return bool(flags.item())

    def all_finite(self, model: nn.Module) -> bool:
        """Whether every weight of `model` is a number, in every process (each checks what it holds:
        under FSDP its shards). Every process must ask."""
        held = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
        finite = bool(torch.stack([torch.isfinite(p).all() for p in held]).all()) if held else True
        return not self.any(not finite)

    def barrier(self) -> None:
        """Wait until every process gets here (the end of a run: none leaves while rank 0 writes)."""
        if self.grouped:
            dist.barrier(group=self.control)

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order."""
        if not self.grouped:
            return [obj]
        objects = [None] * self.world
        dist.all_gather_object(objects, obj, group=self.control)
        return objects

    # ------------------------------------------------------------ state for checkpoints

    def _resharded(self) -> None:
        """Put FSDP's shards back as the parameters: after a forward pass that no backward
        follows (evaluation, sampling) the root's weights stay gathered, and the state-dict
        functions, which match parameters to the optimizer's, need the shards."""
        if self.sharded is not None:
            self.sharded.reshard()

    def model_state(self, model: GPT2) -> dict[str, torch.Tensor]:
        """The model's whole weights on the CPU, on rank 0 ({} elsewhere): copies, which training
        does not change while they are written. Under FSDP every process must call it: the
        shards are gathered."""
        if self.sharded is not None:
            self._resharded()
            return _copied(get_model_state_dict(model, options=_FULL_ON_RANK0), self.device)
        return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()} if self.is_main else {}

    def optimizer_state(self, model: GPT2, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
        """The optimizers' whole state, keyed by parameter names (AdamW's and Muon's in one dict,
        each parameter's under its name), on rank 0 ({} elsewhere): the same file for one process,
        DDP and FSDP; copies, as `model_state`'s. Under FSDP every process must call it. Before the
        first step it is {}: torch would make one (at lr 0, but counting) to fill it."""
        if not any(optimizer.state for optimizer in optimizers) or (self.sharded is None and not self.is_main):
            return {}
        self._resharded()
        return _copied(get_optimizer_state_dict(model, optimizers, options=_FULL_ON_RANK0), self.device)

    def load_optimizer_state(self, model: GPT2, optimizers: list[torch.optim.Optimizer], state: dict[str, Any]) -> None:
        """Load a state of `optimizer_state` (each process holds all of it; FSDP keeps its shard)."""
        if not state:
            return  # saved before the first step: the new optimizers are that state
        set_optimizer_state_dict(model, optimizers, state, options=StateDictOptions(full_state_dict=True))

    # ------------------------------------------------------------ failures

    def failure(self, error: BaseException) -> DistributedError | None:
        """The error to stop with when `error` is a collective that failed because another
        process died or hangs (None for any other error): it names the ranks that do not answer."""
        if self.store is None or not self.grouped or isinstance(error, GPT2Error) or not _is_collective_error(error):
            return None  # (without our store, as in a group the caller started, nobody to ask)
        silent = self._silent_ranks()
        if silent is None:
            who = "the rendezvous store does not answer (its host, rank 0 or torchrun's agent, is gone)"
        elif silent:
            ranks = f"rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))}"
            who = f"{ranks} of {self.world} stopped answering (died, or hangs)"
        else:
            return None  # everyone answers: not a lost process
        cause = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip().splitlines()[0])[
            :120
        ]  # without gloo's source location
        return DistributedError(
            f"{who}, so rank {self.rank} stops too (a collective waits at most timeout {self.timeout:g} s; "
            f"the backend said: {cause})",
            "timeout",
        )

    def _silent_ranks(self) -> list[int] | None:
        """The ranks that do not check in with the store within ANSWER_WAIT seconds (None: the store is gone)."""
        try:
            self.store.set(f"gpt2/answering/{self.rank}", "1")
            deadline = time.monotonic() + min(self.timeout, ANSWER_WAIT)
            while True:
                silent = [r for r in range(self.world) if not self.store.check([f"gpt2/answering/{r}"])]
                if not silent or time.monotonic() > deadline:
                    return silent
                time.sleep(0.2)
        except RuntimeError:
            return None

    def close(self) -> None:
        """Leave the group this process started (which also stops a hung collective's threads).
        Whatever else holds the group (DDP's reducer, FSDP's sharded weights) must be gone by
        then: a group freed after it was destroyed hangs, or aborts the process at exit."""
        self.ddp = self.sharded = None
        if self.store is not None and self.grouped:
            gc.collect()  # modules and their hooks hold each other
            dist.destroy_process_group()
        self.store = None


def _copied(state: Any, device: torch.device) -> Any:
    """A state dict of torch's (tensors in dicts and lists) whose tensors training does not change:
    as it is from a GPU (cpu_offload made CPU copies), its tensors copied on the CPU (where they
    are the model's and the optimizer's own)."""
    if device.type != "cpu":
        return state
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: _copied(value, device) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copied(value, device) for value in state)
    return state


def _is_collective_error(error: BaseException) -> bool:
    message = str(error)
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and ("gloo" in message or "NCCL" in message)
    )


def start(device: str, timeout: float = DIST_TIMEOUT) -> Processes:
    """Join the processes of a distributed launch (a process group over the rendezvous
    torchrun set up), or, when not launched, one process on `device`."""
    if not launched():
        return Processes(resolve_device(device), timeout=timeout)
    rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if not 0 <= rank < world:
        raise DistributedError(f"RANK {rank} is not below WORLD_SIZE {world}")
    resolved = process_device(device, local_rank)
    if dist.is_initialized():  # the caller's own group (a script that called init_process_group)
        return Processes(resolved, dist.get_rank(), dist.get_world_size(), timeout)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    try:
        store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=timedelta(seconds=timeout)))
    except (RuntimeError, ValueError) as e:
        raise DistributedError(
            f"rank {rank}: could not reach the other processes at {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')} ({str(e).splitlines()[0][:200]})"
        ) from None
    backend = "nccl" if resolved.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
        device_id=resolved if backend == "nccl" else None,
    )
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout)) if backend == "nccl" else None
    return Processes(resolved, rank, world, timeout, store, control)

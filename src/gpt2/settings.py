"""The settings a user gives by name, torch-free, so that the command line can offer them
without starting torch: the precisions of weights and of training (`devices` maps the names
to torch's dtypes), speculative decoding's default draft tokens, and `TrainSettings`,
everything a training run is started with.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from gpt2._checks import boolean, int_between, positive_int, positive_real, real_between
from gpt2.config import ACTIVATIONS, POSITIONS, PRESETS, GPT2Config
from gpt2.errors import ConfigError, InvalidArgumentError

# The dtypes a model's weights may be stored in (the names of torch's dtypes).
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
# For inference, int8 too: weight-only, on the CPU (devices.weight_format).
INFERENCE_DTYPES = (*WEIGHT_DTYPES, "int8")
# The tokens a draft model proposes per step, by default, in speculative decoding (decoding.Decoder).
DRAFT_TOKENS = 4
# A training run's compute dtype; auto: devices.training_precision picks one for the device.
TRAINING_DTYPES = ("auto", *WEIGHT_DTYPES)
# torch.compile of a training step: auto compiles on CUDA only (devices.should_compile).
COMPILE_MODES = ("auto", "on", "off")
# The optimizers of a training run: AdamW for every weight, or Muon for the blocks' matrices (train.make_optimizers).
OPTIMIZERS = ("adamw", "muon")
# Muon's peak learning rate by default: the best of 0.001, 0.003, 0.01 and 0.03 on nanoGPT's shakespeare_char
# recipe (docs/train.md), about what Keller Jordan's 0.02 gives these shapes; AdamW's lr would be 10x too small.
MUON_LR = 0.01

DIST_TIMEOUT = 600.0  # seconds a collective waits for the other processes (NCCL's default)


@dataclass
class TrainSettings:
    """Everything a run is started with; defaults are nanoGPT's (train.py) where it has one.

    The architecture comes from `config` (a released size), the n_* fields, or `init` (a
    model to fine-tune); the vocabulary size comes from the data. None means "the default":
    12 layers, 12 heads, 768 wide, block 1024 from scratch; the model's own with `init`.
    bias and activation default to GPT-2's (biases, the tanh GELU) with `config`, and to
    nanoGPT's (no biases, the exact GELU, which is also 3x faster on CPUs) otherwise.
    """

    data: str
    config: str | None = None
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None
    dropout: float = 0.0
    bias: bool | None = None
    positions: str = "learned"
    activation: str | None = None
    init: str | None = None
    batch_size: int = 12
    grad_accum: int = 40
    max_iters: int = 600_000
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_iters: int = 2000
    lr_decay_iters: int | None = None  # None: max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    optimizer: str = "adamw"
    muon_lr: float | None = None  # None: MUON_LR, with optimizer muon
    seed: int = 1337
    eval_interval: int = 2000
    eval_iters: int = 200
    log_interval: int = 1
    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"
    sample_prompt: str | None = None
    checkpoint_activations: bool = False
    fsdp: bool = False  # shard weights, gradients and optimizer state over the processes (FSDP2)
    timeout: float = DIST_TIMEOUT

    def __post_init__(self) -> None:
        self.data = os.fspath(self.data) if isinstance(self.data, os.PathLike) else self.data
        if self.init is not None and isinstance(self.init, os.PathLike):
            self.init = os.fspath(self.init)
        self._check_model()
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval"):
            setattr(self, name, positive_int(name, getattr(self, name)))
        self.lr = positive_real("lr", self.lr)
        self.min_lr = real_between("min_lr", self.min_lr, 0, self.lr)
        self.warmup_iters = int_between("warmup_iters", self.warmup_iters, 0, 2**62)
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters  # fixed when the run starts: a resume that extends max_iters keeps it
        self.lr_decay_iters = positive_int("lr_decay_iters", self.lr_decay_iters)
        self.weight_decay = real_between("weight_decay", self.weight_decay, 0, math.inf)
        self.beta1 = real_between("beta1", self.beta1, 0, 1, open_high=True)
        self.beta2 = real_between("beta2", self.beta2, 0, 1, open_high=True)
        self.grad_clip = real_between("grad_clip", self.grad_clip, 0, math.inf)
        self._check_optimizer()
        self.seed = int_between("seed", self.seed, 0, 2**63 - 1, "a whole number")
        _choice("compile", self.compile, COMPILE_MODES)
        _choice("dtype", self.dtype, TRAINING_DTYPES)
        self.timeout = positive_real("timeout", self.timeout)
        boolean("checkpoint_activations", self.checkpoint_activations)
        boolean("fsdp", self.fsdp)
        if self.sample_prompt is not None and not isinstance(self.sample_prompt, str):
            raise InvalidArgumentError(f"sample_prompt must be text, got {self.sample_prompt!r}")

    def _check_optimizer(self) -> None:
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.muon_lr is not None:
            self.muon_lr = positive_real("muon_lr", self.muon_lr)
            if self.optimizer != "muon":
                raise InvalidArgumentError(f"muon_lr is the learning rate of optimizer muon, but optimizer is {self.optimizer!r}: "
                                           "drop muon_lr or pass optimizer='muon'", "muon_lr", ("optimizer",))  # fmt: skip
        if self.optimizer == "muon" and self.fsdp:
            raise InvalidArgumentError("optimizer muon cannot run with fsdp: Muon orthogonalises each matrix whole (Newton-Schulz), "
                                       "and FSDP2 shards every matrix over the processes; train with DDP (without fsdp) "
                                       "or with optimizer adamw", "optimizer", ("fsdp",))  # fmt: skip

    def _check_model(self) -> None:
        shape = {k: getattr(self, k) for k in ("n_layer", "n_head", "n_embd") if getattr(self, k) is not None}
        given = ["config"] * (self.config is not None) + list(shape) + ["positions"] * (self.positions != "learned")
        given += [name for name in ("bias", "activation") if getattr(self, name) is not None]
        if self.init is not None and given:
            raise InvalidArgumentError(f"init: the architecture comes from the model being fine-tuned; drop {', '.join(given)}")
        if self.config is not None and self.config not in PRESETS:
            raise InvalidArgumentError(f"config must be one of {', '.join(PRESETS)}, got {self.config!r}")
        for name, value in shape.items():
            positive_int(name, value)
        if self.block_size is not None:
            positive_int("block_size", self.block_size)
        self.dropout = real_between("dropout", self.dropout, 0, 1, open_high=True)
        _choice("positions", self.positions, POSITIONS)
        if self.activation is not None:
            _choice("activation", self.activation, ACTIVATIONS)
        if self.bias is not None:
            boolean("bias", self.bias)

    def model_config(self, n_vocab: int) -> GPT2Config:
        """The architecture of a model trained from scratch on a vocabulary of n_vocab ids."""
        n_layer, n_head, n_embd = PRESETS[self.config] if self.config else (12, 12, 768)
        gpt2 = self.config is not None  # a released shape: GPT-2's choices, else nanoGPT's
        bias = self.bias if self.bias is not None else gpt2
        activation = self.activation or ("gelu_tanh" if gpt2 else "gelu")
        try:
            return GPT2Config(
                n_vocab=n_vocab, n_ctx=self.block_size or 1024, n_layer=self.n_layer or n_layer, n_head=self.n_head or n_head,
                n_embd=self.n_embd or n_embd, dropout=self.dropout, bias=bias, positions=self.positions, activation=activation,
            )  # fmt: skip
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Settings a resumed run may change: they leave the losses of the iterations alone.
RESUME_OVERRIDES = ("max_iters", "eval_interval", "eval_iters", "log_interval", "device", "compile", "sample_prompt",
                    "checkpoint_activations", "fsdp", "timeout")  # fmt: skip


def resumed_settings(stored: dict[str, Any], changes: dict[str, Any]) -> TrainSettings:
    """The stored settings of a run, with the changes a resume may make; any other change is an error."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainSettings)}
    stored = {**defaults, **stored}  # a setting added since the run started has its default
    for name, value in changes.items():
        if name not in defaults:
            raise InvalidArgumentError(f"unknown setting {name!r}")
        if value != stored[name] and name not in RESUME_OVERRIDES:
            raise InvalidArgumentError(
                f"{name} is {value!r}, but the run was started with {stored[name]!r}: a resumed run keeps its settings "
                f"(only {', '.join(RESUME_OVERRIDES)} may change); start a new run with overwrite=True instead",
                name,
                ("overwrite",),
            )
    return TrainSettings(**{**stored, **changes})


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(choices)}, got {value!r}", name)

"""The settings a user gives by name, torch-free, so that the command line can offer them
without starting torch: the precisions of weights and of training (`devices` maps the names
to torch's dtypes), the default lengths of continuations and chat replies, speculative
decoding's default draft tokens, and `TrainSettings`, everything a training run is started with.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's original, the tomli package
    import tomli as tomllib

from gpt2._checks import boolean, int_between, positive_int, positive_real, real_between
from gpt2.checkpoints.config import ACTIVATIONS, POSITIONS, PRESETS, GPT2Config
from gpt2.errors import ConfigError, InvalidArgumentError, RecipeError, RecipeNotFoundError

# The dtypes a model's weights may be stored in (the names of torch's dtypes).
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
# For inference, int8 too: weight-only, on the CPU (devices.weight_format).
INFERENCE_DTYPES = (*WEIGHT_DTYPES, "int8")
# The tokens a draft model proposes per step, by default, in speculative decoding (decoding.Decoder).
DRAFT_TOKENS = 4
# Prompt-lookup speculation (lookup.PromptLookup): the longest and the shortest n-grams matched, by default
# (vLLM's prompt_lookup_max/min).
LOOKUP_MAX = 4
LOOKUP_MIN = 2
# How gpt2 generate, gpt2 chat (and inspect's picture) and a training run's samples sample, by default: the
# temperature, and the k most likely tokens, clamped to the model's vocabulary (a character model has fewer tokens).
TEMPERATURE = 0.8
TOP_K = 200
# The new tokens of a continuation, by default (generate.TextGeneration, gpt2 generate).
MAX_NEW_TOKENS = 50
# A chat reply's longest length, by default, where the model's context has room for it (generate.Chat).
CHAT_MAX_NEW_TOKENS = 256
# A training run's compute dtype; auto: devices.training_precision picks one for the device.
TRAINING_DTYPES = ("auto", *WEIGHT_DTYPES)
# torch.compile of a training step: auto compiles on CUDA only (devices.should_compile).
COMPILE_MODES = ("auto", "on", "off")
# The optimizers of a training run: AdamW for every weight, or Muon for the blocks' matrices (train.make_optimizers).
OPTIMIZERS = ("adamw", "muon")
# Muon's peak learning rate by default: the best of 0.001, 0.003, 0.01 and 0.03 on nanoGPT's shakespeare_char
# recipe (docs/train.md), about what Keller Jordan's 0.02 gives these shapes; AdamW's lr would be 10x too small.
MUON_LR = 0.01

# The benchmarks a run can score at each of its evaluations (gpt2/evaluation/tasks.py reads them).
EVAL_TASKS = ("hellaswag",)

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
    probe: str | None = None  # a text the model reads at each probe (gpt2/training/probes.py); None: probe_repeat's
    probe_repeat: int = 16  # else N random tokens written twice (the induction test); 0 with no probe: no probes
    probe_interval: int | None = None  # iterations between probes; None: at each evaluation
    eval_task: str | None = None  # a benchmark scored at each evaluation (EVAL_TASKS)
    eval_task_limit: int | None = None  # its first N examples; None: all
    eval_task_data: str | None = None  # its file; None: gpt2 eval's download, cached
    checkpoint_activations: bool = False
    fsdp: bool = False  # shard weights, gradients and optimizer state over the processes (FSDP2)
    timeout: float = DIST_TIMEOUT
    wandb: str | None = None  # a Weights & Biases project to log to
    wandb_run_name: str | None = None  # the run's name there (default: one W&B makes up)
    tensorboard: str | None = None  # a directory to write TensorBoard's event files to

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
        for name in ("sample_prompt", "probe"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(f"{name} must be text, got {getattr(self, name)!r}", name)
        self.probe_repeat = int_between("probe_repeat", self.probe_repeat, 0, 2**31, "a whole number")
        if self.probe_interval is not None:
            self.probe_interval = positive_int("probe_interval", self.probe_interval)
        self._check_loggers()
        self._check_eval_task()

    def _check_loggers(self) -> None:
        if isinstance(self.tensorboard, os.PathLike):
            self.tensorboard = os.fspath(self.tensorboard)
        for name in ("wandb", "wandb_run_name", "tensorboard"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise InvalidArgumentError(f"{name} must be a name (a directory for tensorboard), got {value!r}", name)
        if self.wandb_run_name is not None and self.wandb is None:
            raise InvalidArgumentError(
                "wandb_run_name names a run of the Weights & Biases project given as wandb: give wandb too",
                "wandb_run_name",
                ("wandb",),
            )

    def _check_optimizer(self) -> None:
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.muon_lr is not None:
            self.muon_lr = positive_real("muon_lr", self.muon_lr)
            if self.optimizer != "muon":
                raise InvalidArgumentError(
                    f"muon_lr is the learning rate of optimizer muon, but optimizer is {self.optimizer!r}: "
                    "drop muon_lr or pass optimizer='muon'",
                    "muon_lr",
                    ("optimizer",),
                )
        if self.optimizer == "muon" and self.fsdp:
            raise InvalidArgumentError(
                "optimizer muon cannot run with fsdp: Muon orthogonalises each matrix whole (Newton-Schulz), "
                "and FSDP2 shards every matrix over the processes; train with DDP (without fsdp) "
                "or with optimizer adamw",
                "optimizer",
                ("fsdp",),
            )

    def _check_model(self) -> None:
        shape = {k: getattr(self, k) for k in ("n_layer", "n_head", "n_embd") if getattr(self, k) is not None}
        given = ["config"] * (self.config is not None) + list(shape) + ["positions"] * (self.positions != "learned")
        given += [name for name in ("bias", "activation") if getattr(self, name) is not None]
        if self.init is not None and given:
            raise InvalidArgumentError(
                f"init: the architecture comes from the model being fine-tuned; drop {', '.join(given)}",
                "init",
                tuple(given),
            )
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

    def _check_eval_task(self) -> None:
        if self.eval_task is not None:
            _choice("eval_task", self.eval_task, EVAL_TASKS)
        if self.eval_task_limit is not None:
            self.eval_task_limit = positive_int("eval_task_limit", self.eval_task_limit)
        if isinstance(self.eval_task_data, os.PathLike):
            self.eval_task_data = os.fspath(self.eval_task_data)
        if self.eval_task_data is not None and not isinstance(self.eval_task_data, str):
            raise InvalidArgumentError(f"eval_task_data must be a path, got {self.eval_task_data!r}", "eval_task_data")
        given = [name for name in ("eval_task_limit", "eval_task_data") if getattr(self, name) is not None]
        if self.eval_task is None and given:
            raise InvalidArgumentError(
                f"{given[0]} is a setting of eval_task, which is not set: give eval_task too (or drop "
                f"{' and '.join(given)})",
                given[0],
                ("eval_task", *given[1:]),
            )

    def model_config(self, n_vocab: int) -> GPT2Config:
        """The architecture of a model trained from scratch on a vocabulary of n_vocab ids."""
        n_layer, n_head, n_embd = PRESETS[self.config] if self.config else (12, 12, 768)
        gpt2 = self.config is not None  # a released shape: GPT-2's choices, else nanoGPT's
        bias = self.bias if self.bias is not None else gpt2
        activation = self.activation or ("gelu_tanh" if gpt2 else "gelu")
        try:
            return GPT2Config(
                n_vocab=n_vocab,
                n_ctx=self.block_size or 1024,
                n_layer=self.n_layer or n_layer,
                n_head=self.n_head or n_head,
                n_embd=self.n_embd or n_embd,
                dropout=self.dropout,
                bias=bias,
                positions=self.positions,
                activation=activation,
            )
        except ConfigError as e:
            raise InvalidArgumentError(str(e), e.param, e.also) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Settings a resumed run may change: they leave the losses of the iterations alone.
RESUME_OVERRIDES = (
    "max_iters",
    "eval_interval",
    "eval_iters",
    "log_interval",
    "device",
    "compile",
    "sample_prompt",
    "probe",
    "probe_repeat",
    "probe_interval",
    "eval_task",
    "eval_task_limit",
    "eval_task_data",
    "checkpoint_activations",
    "fsdp",
    "timeout",
    "wandb",
    "wandb_run_name",
    "tensorboard",
)


def check_setting_names(names: Iterable[str]) -> None:
    """Raise unless each name is a setting's (a field of TrainSettings): the names a run is given,
    checked once as they come in (`gpt2.training.train.train`)."""
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(TrainSettings)})
    if unknown:
        raise InvalidArgumentError(f"unknown training setting(s): {', '.join(unknown)}")


def resumed_settings(stored: dict[str, Any], changes: dict[str, Any]) -> TrainSettings:
    """The stored settings of a run, with the changes a resume may make (by settings' names, checked:
    `check_setting_names`); any other change is an error."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainSettings)}
    stored = {**defaults, **stored}  # a setting added since the run started has its default
    for name, value in changes.items():
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


# ------------------------------------------------------------------ recipes: a run's settings in a TOML file

RECIPES = Path(__file__).parent / "recipes"  # the recipes shipped with gpt2, by name: shakespeare_char.toml, ...
RECIPE_EXTRAS = {"out": str}  # a recipe's keys beside TrainSettings' fields (the run's directory)


def recipe_names() -> list[str]:
    """The names of the recipes shipped with gpt2 (`read_recipe` takes a name or a file)."""
    return sorted(path.stem for path in RECIPES.glob("*.toml"))


def recipe_keys() -> dict[str, type]:
    """What a recipe may set, and the type of each: TrainSettings' fields (int, float, bool or str)
    and RECIPE_EXTRAS. Read from the dataclass: a setting added to TrainSettings is a key at once."""
    hints = typing.get_type_hints(TrainSettings)
    keys = {}
    for field in dataclasses.fields(TrainSettings):
        kinds = [kind for kind in typing.get_args(hints[field.name]) or (hints[field.name],) if kind is not type(None)]
        keys[field.name] = kinds[0]
    return {**keys, **RECIPE_EXTRAS}


def read_recipe(recipe: str | os.PathLike) -> dict[str, Any]:
    """The settings a recipe file holds, as keyword arguments of `gpt2.training.train.train` (`out` too, if
    it has one). `recipe`: a TOML file, or the name of a recipe shipped with gpt2 (recipe_names()).
    Keys are the settings' names, with - or _ (`max_iters = 2000`, `max-iters = 2000`); an unknown
    key or a value of the wrong type is a RecipeError naming it."""
    path = Path(recipe)
    if not path.is_file() and str(recipe) in recipe_names():
        path = RECIPES / f"{recipe}.toml"
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError:
        shipped = ", ".join(recipe_names())
        raise RecipeNotFoundError(
            f"no recipe {str(recipe)!r}: give a TOML file, or one of gpt2's recipes: {shipped}", "recipe"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f"cannot read the recipe {path}: {e}", "recipe") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"the recipe {path} is not valid TOML: {e}", "recipe") from None
    return _recipe_settings(table, path)


def _recipe_settings(table: dict[str, Any], path: Path) -> dict[str, Any]:
    """The recipe's keys as settings' names, each value checked against its setting's type."""
    keys, settings = recipe_keys(), {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in keys:
            close = difflib.get_close_matches(name, keys, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RecipeError(
                f"the recipe {path} has an unknown key {key!r}{hint}; the keys are the settings' names: "
                f"{', '.join(sorted(keys))}",
                "recipe",
            )
        if name in settings:
            raise RecipeError(f"the recipe {path} sets {name} twice", name)
        settings[name] = _recipe_value(name, value, keys[name], path)
    return settings


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _recipe_value(name: str, value: Any, kind: type, path: Path) -> Any:
    """The value, if TOML gave it the type of its setting: a float setting takes an integer too (lr = 1)."""
    fits = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not fits:
        raise RecipeError(
            f"the recipe {path} sets {name} to {value!r}, a {type(value).__name__}: {name} must be "
            f"{_TYPE_NAMES.get(kind, kind.__name__)}",
            name,
        )
    return value

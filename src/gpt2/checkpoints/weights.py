"""Finding and reading GPT-2 weights, in every format OpenAI's weights are published in.

Every reader yields tensors under one canonical naming, Hugging Face's GPT2LMHeadModel keys
(`transformer.h.0.attn.c_attn.weight`, ...), in the layout OpenAI's code and Hugging Face
store: a linear layer's weight is (in_features, out_features), so y = x @ w + b. The torch
model and the NumPy reference engine both use that layout, so nothing is transposed.

Formats:
- a Hugging Face directory: `config.json` + `model.safetensors` (or `pytorch_model.bin`);
- OpenAI's TensorFlow release: `hparams.json` + `model.ckpt.index` + `model.ckpt.data-*`;
- a released name (gpt2, gpt2-medium, gpt2-large, gpt2-xl): downloaded from the Hugging Face
  hub once, into its standard cache, then read as the first format;
- a model gpt2 ships (shakespeare_char, see `gpt2.examples`): the first format, in the package;
- a GGUF file of llama.cpp's `gpt2` architecture (`model.gguf`: f32, f16 or q8_0, dequantized to
  float32), its config in its metadata and its tokenizer inside (`gpt2.checkpoints.gguf`).

This module does not import torch unless it must read a `pytorch_model.bin` (or give torch tensors).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from gpt2._files import read_json_object
from gpt2._hub import download_error, hub_file
from gpt2.checkpoints.config import PRESETS, GPT2Config, sinusoidal_positions
from gpt2.checkpoints.gguf import SUFFIX, GGUFFile, is_gguf, open_gguf
from gpt2.checkpoints.tf_checkpoint import bfloat16_to_float32, iter_tf_checkpoint
from gpt2.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    GPT2Warning,
    InputTypeError,
    UnknownModelError,
)
from gpt2.examples import MODELS, model_directory
from gpt2.tokenizer import CharTokenizer, Tokenizer, assumed_tokenizer, load_tokenizer, read_chat_template

HUB_REPOS = {name: f"openai-community/{name}" for name in PRESETS}

# Tensors some checkpoints carry that are not weights: the causal mask buffers of old
# transformers versions, and lm_head.weight, which GPT-2 ties to wte.
_NOT_WEIGHTS = re.compile(r"(.*\.attn\.(bias|masked_bias)|lm_head\.weight)$")

Format = Literal["safetensors", "pytorch", "tensorflow", "gguf"]

# What `gpt2 train` records in the header of the model.safetensors it saves (safetensors' metadata,
# strings): the iteration its weights are of, and whether its run started from random weights
# ("scratch") or from a model (--init: "init").
TRAINED_ITERATIONS = "gpt2_train_iteration"
TRAINED_FROM = "gpt2_train_from"


class InitialisationWarning(GPT2Warning):
    """The model loaded is the random weights a `gpt2 train` run started from (the model its
    evaluation of iteration 0 saved, before any step): it writes noise."""


@dataclass
class Checkpoint:
    """A located checkpoint: where it is, in which format, and the model configuration it holds
    (for a GGUF file: the directory it is in, and the file, opened)."""

    directory: Path
    format: Format
    config: GPT2Config
    file: GGUFFile | None = field(default=None, repr=False)

    def load_tokenizer(self) -> Tokenizer | CharTokenizer | None:
        """The tokenizer saved beside the weights (as `gpt2 train` saves it, or a Hugging Face
        directory's); GPT-2's for a model of GPT-2's vocabulary that has none, with the chat
        template the directory holds (as transformers reads it once GPT-2's files are added); else None.
        A GGUF file's is the one inside it."""
        if self.file is not None:
            inside = self.file.tokenizer()
            return assumed_tokenizer(self.config.n_vocab) if inside is None else inside
        tokenizer = load_tokenizer(self.directory)
        if tokenizer is None:
            assumed = assumed_tokenizer(self.config.n_vocab)
            template = None if assumed is None else read_chat_template(self.directory)
            return assumed if template is None else assumed.with_chat_template(template)
        if tokenizer.n_vocab > self.config.n_vocab:
            raise CheckpointError(
                f"{self.directory}: the tokenizer has {tokenizer.n_vocab} ids, more than the model's "
                f"vocabulary of {self.config.n_vocab}"
            )
        return tokenizer

    @property
    def weights_path(self) -> Path:
        if self.file is not None:
            return self.file.path
        if self.format == "safetensors":
            return self.directory / "model.safetensors"
        if self.format == "pytorch":
            return self.directory / "pytorch_model.bin"
        return self.directory


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape ((in, out) for linear weights) of every weight a model of `config` has."""
    C, V = config.n_embd, config.n_vocab
    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (V, C)}
    if config.positions == "learned":
        shapes["transformer.wpe.weight"] = (config.n_ctx, C)
    layer = {
        "ln_1.weight": (C,),
        "ln_1.bias": (C,),
        "attn.c_attn.weight": (C, 3 * C),
        "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C),
        "attn.c_proj.bias": (C,),
        "ln_2.weight": (C,),
        "ln_2.bias": (C,),
        "mlp.c_fc.weight": (C, 4 * C),
        "mlp.c_fc.bias": (4 * C,),
        "mlp.c_proj.weight": (4 * C, C),
        "mlp.c_proj.bias": (C,),
    }
    for i in range(config.n_layer):
        for name, shape in layer.items():
            if config.bias or not name.endswith(".bias"):
                shapes[f"transformer.h.{i}.{name}"] = shape
    shapes["transformer.ln_f.weight"] = (C,)
    if config.bias:
        shapes["transformer.ln_f.bias"] = (C,)
    return shapes


def transformers_only_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the tensors transformers' GPT2LMHeadModel has and a model of `config` lacks:
    every bias of a model without biases, and wpe of one with sinusoidal positions.

    `GPT2.save_pretrained` writes them, as zeros and as the fixed position table, which makes
    transformers compute what the model computes (it has only biases and a learned wpe) and load
    it with nothing newly initialised. Readers check they hold just that (`iter_tensors`).
    """
    own = expected_shapes(config)
    everything = expected_shapes(config.replace(bias=True, positions="learned"))
    return {name: shape for name, shape in everything.items() if name not in own}


# --------------------------------------------------------------------- locating


def locate(name_or_path: str | os.PathLike) -> Checkpoint:
    """Find a checkpoint: a local directory, a GGUF file, a released name (downloaded once), or a model gpt2 ships."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InputTypeError(
            f"a model is a released name ({', '.join(HUB_REPOS)}), one gpt2 ships ({', '.join(MODELS)}) "
            f"or a directory path, "
            f"got {type(name_or_path).__name__}"
        )
    if str(name_or_path) == "":
        raise UnknownModelError(
            f"the model name is empty: give a released name ({', '.join(HUB_REPOS)}) or a directory"
        )
    path = Path(name_or_path)
    if path.is_dir():
        return open_checkpoint(path)
    if path.exists() and is_gguf(path):
        file = open_gguf(path)
        return Checkpoint(path.parent, "gguf", file.config, file)
    if path.exists():
        raise CheckpointError(
            f"{path} is a file; pass the directory that holds it (with config.json or hparams.json), or a .gguf file"
        )
    if path.suffix.lower() == SUFFIX:
        raise CheckpointNotFoundError(f"{path} does not exist")
    name = str(name_or_path)
    if name in HUB_REPOS:
        return open_checkpoint(download(name))
    if name in MODELS:
        return open_checkpoint(model_directory(name))
    raise UnknownModelError(
        f"unknown model {name!r}: not a directory, not a released GPT-2 ({', '.join(HUB_REPOS)}), "
        f"and not one gpt2 ships ({', '.join(MODELS)})"
    )


def read_config(name_or_path: str | os.PathLike) -> GPT2Config:
    """The configuration of a model as `locate` would find it, without reading or downloading
    its weights: a directory's config.json or hparams.json, a released size's own."""
    if isinstance(name_or_path, str) and name_or_path in PRESETS and not Path(name_or_path).is_dir():
        return GPT2Config.from_name(name_or_path)
    return locate(name_or_path).config


def download(name: str) -> Path:
    """A released model's directory (config.json and model.safetensors), from the Hugging Face
    hub's cache (HF_HOME), downloaded there once."""
    repo = HUB_REPOS[name]
    try:
        hub_file(repo, "config.json")
        return hub_file(repo, "model.safetensors").parent  # the two files of one snapshot directory
    except OSError as e:  # offline, unreachable, not found: all end the same way
        raise CheckpointNotFoundError(
            f"{download_error(repr(name), repo, e)}. Without a network, pass a local directory instead "
            f"(a Hugging Face one, config.json + model.safetensors, or OpenAI's release, hparams.json + model.ckpt.*), "
            f"or {', '.join(MODELS)}, the small model gpt2 ships"
        ) from None


def open_checkpoint(directory: Path) -> Checkpoint:
    """Recognise the format of a checkpoint directory and read its configuration."""
    if (directory / "config.json").is_file():
        for filename, fmt in (("model.safetensors", "safetensors"), ("pytorch_model.bin", "pytorch")):
            if (directory / filename).is_file():
                config = GPT2Config.from_hf_dict(_read_json(directory / "config.json"), str(directory / "config.json"))
                if fmt == "safetensors":
                    warn_if_initialisation(directory)
                return Checkpoint(directory, fmt, config)
        raise CheckpointNotFoundError(
            f"{directory} has config.json but neither model.safetensors nor pytorch_model.bin"
        )
    if (directory / "hparams.json").is_file():
        if not any(directory.glob("*.index")):
            raise CheckpointNotFoundError(
                f"{directory} has hparams.json but no TensorFlow checkpoint (model.ckpt.index)"
            )
        config = GPT2Config.from_openai_hparams(_read_json(directory / "hparams.json"), str(directory / "hparams.json"))
        return Checkpoint(directory, "tensorflow", config)
    raise CheckpointNotFoundError(
        f"{directory} holds no GPT-2 checkpoint: expected config.json + model.safetensors "
        f"(Hugging Face) or hparams.json + model.ckpt.* (OpenAI's TensorFlow release)"
    )


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, ConfigError)


def warn_if_initialisation(directory: Path) -> None:
    """An InitialisationWarning where the directory's model.safetensors says `gpt2 train` saved it at
    iteration 0 of a run from random weights: a run stopped (or diverged) before any later
    evaluation saved a better model. Every command's model is located here, so each says it."""
    metadata = safetensors_metadata(directory / "model.safetensors")
    if metadata.get(TRAINED_ITERATIONS) == "0" and metadata.get(TRAINED_FROM) == "scratch":
        # plain words, not train's parameters: every command and from_pretrained loads it, and none of them trains
        warnings.warn(
            InitialisationWarning(
                f"this model is its initialisation: {directory} holds the random weights its training "
                f"run started from (saved at iteration 0, before any step), which write noise; train "
                f"until an evaluation saves a better one: resume its run with more iterations or more "
                f"frequent evaluations, or, if its loss diverged, start again with a lower learning "
                f"rate"
            ),
            stacklevel=3,
        )


# --------------------------------------------------------------------- reading


def iter_tensors(checkpoint: Checkpoint, framework: Literal["np", "pt"] = "np") -> Iterator[tuple[str, Any]]:
    """Yield (canonical name, tensor) one at a time, each checked against the config's shape.

    One tensor at a time keeps peak memory near the model's own size. `framework` picks
    numpy arrays or torch tensors. Raises CheckpointError for an unknown tensor or a wrong
    shape while iterating, and for missing tensors at the end. The tensors saved for transformers
    only (`transformers_only_shapes`) are checked and left out.
    """
    shapes, extras = expected_shapes(checkpoint.config), transformers_only_shapes(checkpoint.config)
    seen = set()
    for raw_name, tensor in _read_raw(checkpoint, framework):
        name = _canonical_name(raw_name, checkpoint.format)
        if name is None:
            continue
        expected = shapes.get(name) or extras.get(name)
        if expected is None:
            raise CheckpointError(
                f"{checkpoint.weights_path}: unexpected tensor {raw_name!r}; is this a GPT-2 checkpoint?"
            )
        shape = tuple(tensor.shape)
        if checkpoint.format == "tensorflow" and len(shape) == 3 and shape[0] == 1:
            tensor, shape = tensor[0], shape[1:]  # OpenAI stored linear weights as 1x1 convolutions
        if shape != expected:
            raise CheckpointError(
                f"{checkpoint.weights_path}: tensor {raw_name!r} has shape {list(shape)}, "
                f"but the config ({_describe(checkpoint.config)}) needs {list(expected)}"
            )
        if name in extras:  # written for transformers only: the model computes it without the tensor
            _check_transformers_only(checkpoint, raw_name, name, tensor)
            continue
        seen.add(name)
        yield name, tensor
    missing = [name for name in shapes if name not in seen]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{checkpoint.weights_path} lacks tensor(s) {', '.join(missing[:3])}{more}")


# How far a stored position table may be from the sinusoidal one: a bfloat16 copy is within half a step
# at 1.0 (0.004); any other table (learned, or of another formula) is off by far more somewhere.
_TABLE_TOLERANCE = 1e-2


def _check_transformers_only(checkpoint: Checkpoint, raw_name: str, name: str, tensor: Any) -> None:
    """Raise unless a tensor the config's model lacks holds what `save_pretrained` writes there for
    transformers: zeros for a bias, the sinusoidal table for wpe. Anything else was trained (e.g. by
    fine-tuning in transformers) and would be dropped: config.json must then say the model has it."""
    values = tensor if isinstance(tensor, np.ndarray) else tensor.float().numpy()  # a torch tensor, bfloat16 included
    config = checkpoint.config
    if name == "transformer.wpe.weight":
        if not (
            np.abs(values - sinusoidal_positions(config.n_ctx, config.n_embd)) <= _TABLE_TOLERANCE
        ).all():  # NaN fails too
            raise CheckpointError(
                f"{checkpoint.weights_path}: tensor {raw_name!r} is not the sinusoidal position table that "
                f'config.json\'s "gpt2_positions": "sinusoidal" calls for; if the model learned its '
                f'positions (e.g. fine-tuned in transformers), set "gpt2_positions": "learned"'
            )
    elif np.any(values):
        raise CheckpointError(
            f'{checkpoint.weights_path}: tensor {raw_name!r} is not zero, but config.json\'s "gpt2_bias": '
            f"false says the model has no biases; if it has (e.g. fine-tuned in transformers), set "
            f'"gpt2_bias": true'
        )


def read_tensors(name_or_path: str | os.PathLike) -> tuple[GPT2Config, dict[str, np.ndarray]]:
    """All weights of a checkpoint as numpy arrays (float32), under canonical names."""
    checkpoint = locate(name_or_path)
    tensors = {name: np.asarray(t, dtype=np.float32) for name, t in iter_tensors(checkpoint, "np")}
    return checkpoint.config, tensors


def _describe(config: GPT2Config) -> str:
    return ", ".join(f"{name}={getattr(config, name)}" for name in ("n_layer", "n_head", "n_embd", "n_vocab", "n_ctx"))


def _canonical_name(raw: str, fmt: Format) -> str | None:
    if fmt == "tensorflow":
        # model/h3/attn/c_attn/w -> transformer.h.3.attn.c_attn.weight; model/wte -> transformer.wte.weight
        name = re.sub(r"^model/", "", raw)
        name = re.sub(r"^h(\d+)/", r"h.\1/", name).replace("/", ".")
        name = re.sub(r"\.(g|w)$", ".weight", name)
        name = re.sub(r"\.b$", ".bias", name)
        if name in ("wte", "wpe"):
            name += ".weight"
        return "transformer." + name
    if _NOT_WEIGHTS.match(raw):
        return None
    return raw if raw.startswith("transformer.") else "transformer." + raw


def _read_raw(checkpoint: Checkpoint, framework: str) -> Iterator[tuple[str, Any]]:
    path = checkpoint.weights_path
    if checkpoint.format == "safetensors":
        yield from read_safetensors(path, framework)
    elif checkpoint.format == "pytorch":
        import torch

        try:
            try:
                state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)  # legacy, non-zip file
        except Exception as e:
            raise CheckpointError(
                f"{path} is truncated or corrupt ({str(e).splitlines()[0]}); download or save it again"
            ) from None
        for name, tensor in state.items():
            yield name, tensor.numpy() if framework == "np" else tensor
    elif checkpoint.file is not None:
        for name, array in checkpoint.file.tensors():  # already under our names, in our layout
            if framework == "pt":
                import torch

                array = torch.from_numpy(array)
            yield name, array
    else:
        for name, array in iter_tf_checkpoint(checkpoint.directory):
            if framework == "pt":
                import torch

                array = torch.from_numpy(array)  # shares the array's memory
            yield name, array


# safetensors dtype -> (numpy dtype, torch dtype name); numpy has no bfloat16 (see below).
_SAFETENSORS_DTYPES = {
    "F64": (np.float64, "float64"),
    "F32": (np.float32, "float32"),
    "F16": (np.float16, "float16"),
    "BF16": (None, "bfloat16"),
    "I64": (np.int64, "int64"),
    "I32": (np.int32, "int32"),
    "I16": (np.int16, "int16"),
    "I8": (np.int8, "int8"),
    "U8": (np.uint8, "uint8"),
    "BOOL": (np.bool_, "bool"),
}


def _corrupt(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{path} is truncated or corrupt ({why}); download or save it again")


def _safetensors_header(f: BinaryIO, path: Path) -> dict[str, Any]:
    """The JSON header of the .safetensors file `f`, read from its start (the file is left at its first tensor)."""
    file_size = os.fstat(f.fileno()).st_size
    prefix = f.read(8)
    if len(prefix) < 8:
        raise _corrupt(path, "shorter than its 8-byte header length")
    header_size = int.from_bytes(prefix, "little")
    if header_size > file_size - 8:
        raise _corrupt(path, f"header of {header_size} bytes in a file of {file_size}")
    try:
        header = json.loads(f.read(header_size))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _corrupt(path, f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    return header


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The metadata in a .safetensors file's header ({} where it has none, or the file cannot be
    read: reading its tensors says what is wrong)."""
    try:
        with open(path, "rb") as f:
            metadata = _safetensors_header(f, path).get("__metadata__")
    except (OSError, CheckpointError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def read_safetensors(path: Path, framework: Literal["np", "pt"] = "np") -> Iterator[tuple[str, Any]]:
    """Yield (name, tensor) from a .safetensors file, reading one tensor at a time.

    The format: 8 bytes (little-endian u64) giving the header's length N, N bytes of JSON
    ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
    raw little-endian tensor bytes, offsets counted from the end of the header. Each tensor is
    read straight into memory of its own, which the model then keeps as the parameter: no
    second copy, and no mapping of the whole file whose pages would stay resident.
    """

    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        header = _safetensors_header(f, path)
        header.pop("__metadata__", None)
        data_start = f.tell()
        for name, info in sorted(header.items(), key=lambda item: item[1].get("data_offsets", [0])[0]):
            try:
                np_dtype, torch_dtype = _SAFETENSORS_DTYPES[info["dtype"]]
                shape = [int(n) for n in info["shape"]]
                begin, end = (int(n) for n in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise _corrupt(path, f"bad header entry for {name!r}: {info!r}") from None
            if data_start + end > file_size:
                raise _corrupt(
                    path, f"tensor {name!r} ends at byte {data_start + end}, past the end of the file ({file_size})"
                )
            itemsize = 2 if np_dtype is None else np.dtype(np_dtype).itemsize
            if end - begin != int(np.prod(shape)) * itemsize:
                raise _corrupt(
                    path,
                    f"tensor {name!r} has {end - begin} bytes, which does not fit shape {shape} of {info['dtype']}",
                )
            f.seek(data_start + begin)
            if framework == "pt":
                import torch

                tensor = torch.empty(shape, dtype=getattr(torch, torch_dtype))
                raw = tensor.view(-1).view(torch.uint8).numpy() if tensor.numel() else bytearray()
            else:
                tensor = np.empty(shape, dtype="<u2" if np_dtype is None else np.dtype(np_dtype).newbyteorder("<"))
                raw = tensor.reshape(-1).view(np.uint8)
            f.readinto(raw)  # straight into the tensor's memory: no second copy
            if framework == "np" and np_dtype is None:  # numpy has no bfloat16: widened to float32, exactly
                tensor = bfloat16_to_float32(tensor)
            yield name, tensor

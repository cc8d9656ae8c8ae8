"""A model's files: a checkpoint's tensors loaded as the model keeps them, and a model's weights
saved in Hugging Face's GPT-2 layout (config.json + model.safetensors + the tokenizer's files).

    pretrained = open_pretrained("gpt2", device="cpu", dtype="bfloat16")   # its config, then
    for name, tensor, scale in pretrained.tensors(): ...                   # each tensor, placed
    save_pretrained(directory, config, hf_state_dict(model), tokenizer)

`GPT2.from_pretrained` builds the model from `pretrained.config` and makes each tensor its
parameter; `GPT2.save_pretrained` hands its weights here. This module knows no model class, only
the tensors' names and layout, which the model shares with OpenAI's and Hugging Face's
checkpoints; reading those formats is `gpt2.checkpoints.weights`'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from gpt2._files import atomic_path, atomic_write_text, writable_directory
from gpt2.checkpoints.config import GPT2Config, sinusoidal_positions
from gpt2.checkpoints.weights import Checkpoint, iter_tensors, locate, transformers_only_shapes
from gpt2.devices import WeightFormat, resolve_device, weight_format
from gpt2.errors import InvalidArgumentError
from gpt2.generation.kernels import stored_matrix
from gpt2.tokenizer import CharTokenizer, Tokenizer, assumed_tokenizer

DENSE = ("c_attn", "c_proj", "c_fc")  # the linear layers (`gpt2.model.model.Dense`), whose weights are (in, out)


# ------------------------------------------------------------------ loading


@dataclass
class Pretrained:
    """A checkpoint opened to load: its config (with the dropout asked for), and where and in
    which format its tensors go (`gpt2.devices.weight_format`)."""

    checkpoint: Checkpoint
    config: GPT2Config
    device: torch.device
    form: WeightFormat

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype, which every tensor but the matrices is kept in."""
        return self.form.compute

    def tensors(self) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
        """(name, tensor, its int8 scale or None) for each of the checkpoint's tensors, one at a
        time (so loading needs little more memory than the model), on the device as the model
        keeps it: a matrix (each Dense's weight, and wte) maybe narrow (`gpt2.generation.kernels.stored_matrix`),
        the rest in `dtype`, copied only when the device or dtype must change."""
        for name, tensor in iter_tensors(self.checkpoint, framework="pt"):
            module, _, attr = name.rpartition(".")
            dense = module.rpartition(".")[2] in DENSE
            scale = None
            if attr == "weight" and (dense or name == "transformer.wte.weight"):  # a matrix: maybe narrow
                tensor, scale = stored_matrix(tensor, self.form.storage, self.device, dense, self.form.weight_only)
            else:
                tensor = tensor.to(device=self.device, dtype=self.form.compute).contiguous()
            yield name, tensor, scale

    def tokenizer(self) -> Tokenizer | CharTokenizer | None:
        """The tokenizer saved with the weights (GPT-2's where none is and the vocabulary is GPT-2's, else None)."""
        return self.checkpoint.load_tokenizer()


def open_pretrained(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    dropout: float | None = None,
) -> Pretrained:
    """A released name (gpt2, gpt2-medium, gpt2-large, gpt2-xl), a Hugging Face directory, or a
    directory of OpenAI's TensorFlow release, opened to load on `device` in `dtype`
    (`GPT2.from_pretrained`); `dropout` replaces the checkpoint's."""
    device = resolve_device(device)
    form = weight_format(dtype, device)
    checkpoint = locate(name_or_path)
    config = checkpoint.config if dropout is None else checkpoint.config.replace(dropout=dropout)
    return Pretrained(checkpoint, config, device, form)


# ------------------------------------------------------------------ saving


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's weights under Hugging Face's names, which are ours, and in its layout, which is ours."""
    return {name: p.detach() for name, p in model.named_parameters()}


def save_pretrained(
    directory: str | os.PathLike,
    config: GPT2Config,
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer | CharTokenizer | None,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write the weights `tensors` (`hf_state_dict`) of a model of `config` as `config.json` +
    `model.safetensors` in Hugging Face's GPT-2 layout, and the tokenizer (`GPT2.save_pretrained`).

    Each file is written to a temporary name and renamed into place. The tensors transformers'
    GPT-2 has and the model lacks are added (`weights.transformers_only_shapes`): zero biases, the
    fixed position table as wpe. `tokenizer` None is GPT-2's for a model of GPT-2's vocabulary;
    its <|endoftext|> is config.json's eos id (none for a character vocabulary). `metadata` goes
    into the safetensors header beside its "format".
    """
    if tensors["transformer.wte.weight"].dtype == torch.int8:
        raise InvalidArgumentError(
            "an int8 model is not saved: its weights were quantised when it was loaded; load the "
            "checkpoint with dtype float32 (or bfloat16) to save it"
        )
    directory = writable_directory(directory)
    tensors = {name: t.contiguous().cpu() for name, t in tensors.items()}
    dtype = tensors["transformer.ln_f.weight"].dtype  # of the vectors (a narrow CPU model keeps them in float32)
    for name, shape in transformers_only_shapes(config).items():
        positions = name == "transformer.wpe.weight"
        tensors[name] = (
            torch.from_numpy(sinusoidal_positions(*shape)).to(dtype) if positions else torch.zeros(shape, dtype=dtype)
        )
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={**(metadata or {}), "format": "pt"})
    save_config_and_tokenizer(directory, config, tokenizer)


def save_config_and_tokenizer(directory: Path, config: GPT2Config, tokenizer: Tokenizer | CharTokenizer | None) -> None:
    """config.json (Hugging Face's GPT-2 keys) and the tokenizer's files, as `save_pretrained` writes
    them beside the weights (an export writes them beside its own). `tokenizer` None: GPT-2's for a
    model of GPT-2's vocabulary; its <|endoftext|> is config.json's eos id."""
    tokenizer = tokenizer if tokenizer is not None else assumed_tokenizer(config.n_vocab)
    eot_token = None if tokenizer is None else tokenizer.eot_token
    atomic_write_text(directory / "config.json", json.dumps(config.to_hf_dict(eot_token), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(directory, model_max_length=config.n_ctx)

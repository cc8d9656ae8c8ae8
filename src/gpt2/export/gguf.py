"""Export to GGUF, as llama.cpp loads GPT-2: a loaded model written as one file of its `gpt2` architecture.

    export_gguf(GPT2.from_pretrained("gpt2"), "gpt2.gguf", dtype="q8_0")
    GPT2.from_pretrained("gpt2.gguf")   # and back, dequantized

The file's layout, what llama.cpp asks of it and what it cannot hold are `gpt2.checkpoints.gguf`'s
(`write_gguf`); this module hands it a model's config, its weights as float32 arrays under Hugging
Face's names, and its tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gpt2.checkpoints.gguf import check_dtype, write_gguf
from gpt2.errors import InvalidArgumentError
from gpt2.model.model import GPT2
from gpt2.model.pretrained import hf_state_dict


def export_gguf(model: GPT2, path: str | os.PathLike, dtype: str = "f32") -> Path:
    """Write `model` (its config, weights and tokenizer) to the GGUF file `path` with its 2-D weights
    in `dtype` (f32, f16 or q8_0), atomically, and return the path."""
    dtype = check_dtype(dtype)
    tensors = hf_state_dict(model)
    if tensors["transformer.wte.weight"].dtype == torch.int8:
        raise InvalidArgumentError(
            "an int8 model is not exported: its weights were quantised when it was loaded; load the "
            "checkpoint with dtype float32 (or bfloat16) and export it with dtype q8_0",
            "model",
        )
    arrays = {name: tensor.float().cpu().numpy() for name, tensor in tensors.items()}  # a narrow model's too
    return write_gguf(model.config, arrays, model.tokenizer, path, dtype)

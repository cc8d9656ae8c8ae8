"""Export to ONNX with the KV cache, as optimum exports GPT-2 for ONNX Runtime and transformers.js.

    inputs                                          outputs
    input_ids                (B, T)   int64         logits              (B, T, V)
    attention_mask           (B, P+T) int64         present.{i}.key     (B, H, P+T, C/H)
    position_ids             (B, T)   int64         present.{i}.value   (B, H, P+T, C/H)
    past_key_values.{i}.key  (B, H, P, C/H)
    past_key_values.{i}.value (B, H, P, C/H)        P = 0 for the prompt: past tensors of length 0

The names and layout are optimum's for GPT-2 (`model.onnx` of its "text-generation-with-past"
export), so loaders written for it find them. A query sees the keys up to its own position
whose attention_mask is 1 (left padding: the pads are 0); position_ids are the cumulative
attention_mask less one, as transformers computes them. The graph is the model's own forward
pass (its LayerNorms, linear layers and MLP), traced while the model takes plain torch ops
(`gpt2.generation.kernels.tracing`), with the attention and the cache written out here.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from gpt2._checks import require_package
from gpt2._files import atomic_directory
from gpt2.errors import InvalidArgumentError
from gpt2.model.model import GPT2, merge_heads
from gpt2.model.pretrained import save_config_and_tokenizer

OPSET = 18
QUANTIZE = ("int8",)  # int8 weights in blocks (ONNX Runtime's MatMulNBits), int8 products
INT8_BLOCK = 32  # weights sharing one scale
PROTOBUF_LIMIT = 2**31 - 2**24  # an ONNX file is one protobuf message: under 2 GiB, with room for the graph


class DecoderWithPast(nn.Module):
    """The model's forward pass over new tokens given the keys and values of those before them."""

    def __init__(self, model: GPT2):
        super().__init__()
        self.model = model
        self.scale = 1.0 / math.sqrt(
            model.config.n_embd // model.config.n_head
        )  # a constant of the graph, not a traced size

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        transformer = self.model.transformer
        T, P = input_ids.size(1), past[0].size(2)
        x = self.model.embed(input_ids) + transformer.wpe(position_ids)  # (B, T, C)
        causal = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(P)  # query i sees keys up to P + i
        visible = causal[None, None] & attention_mask[:, None, None, :].bool()  # (B, 1, T, P+T)
        presents = []
        for layer, block in enumerate(transformer.h):
            q, k, v = block.attn.heads(block.attn.c_attn(block.ln_1(x)))  # 3 x (B, H, T, C/H)
            k = torch.cat([past[2 * layer], k], dim=2)  # (B, H, P+T, C/H)
            v = torch.cat([past[2 * layer + 1], v], dim=2)
            presents += [k, v]
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, P+T)
            # the lowest float, not -inf: a pad's row sees no key, and must give numbers, not NaN
            weights = torch.softmax(scores.masked_fill(~visible, torch.finfo(scores.dtype).min), dim=-1)
            x = x + block.attn.c_proj(merge_heads(weights @ v))
            x = x + block.mlp(block.ln_2(x))
        return (self.model.unembed(transformer.ln_f(x)), *presents)


def names(n_layer: int) -> tuple[list[str], list[str]]:
    """The graph's input and output names, optimum's."""
    past = [f"past_key_values.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(n_layer) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def export_onnx(model: GPT2, out: str | os.PathLike, quantize: str | None = None) -> Path:
    """Write `model` to the directory `out` as ONNX (`model.onnx`, its weights inside), with its
    config.json and tokenizer files beside it; `quantize` "int8" stores the matrices' weights as
    int8 in blocks of 32 (ONNX Runtime's MatMulNBits, at its accuracy level 4: `_quantize`). The
    directory appears whole or not at all. Returns it."""
    if quantize is not None and quantize not in QUANTIZE:
        raise InvalidArgumentError(
            f"quantize must be one of {', '.join(QUANTIZE)} (or none), got {quantize!r}", "quantize"
        )
    if model.dtype != torch.float32:
        raise InvalidArgumentError(
            f"ONNX export takes a float32 model; this one's weights are {str(model.dtype).removeprefix('torch.')}: "
            "load it with dtype='float32'",
            "dtype",
        )
    size = model.num_parameters() * 4
    if size >= PROTOBUF_LIMIT:
        raise InvalidArgumentError(
            f"this model's float32 weights are {size / 2**30:.1f} GiB, and an ONNX file holds at most 2 GiB "
            f"(protobuf's limit; weights in files beside it are not written here): export it as GGUF "
            f"(format='gguf'), or a model of up to {PROTOBUF_LIMIT // 4 / 1e6:.0f}M parameters",
            "format",
        )
    _packages(quantize)
    with atomic_directory(Path(out)) as directory:
        _write_graph(model, directory / "model.onnx")
        if quantize == "int8":
            _quantize(directory / "model.onnx")
        save_config_and_tokenizer(directory, model.config, model.tokenizer)
    return Path(out)


def _write_graph(model: GPT2, path: Path) -> None:
    """Trace DecoderWithPast on a batch of 2, 3 new tokens after 2 past ones, every size dynamic."""
    config = model.config
    B, T, P, H, d = 2, 3, 2, config.n_head, config.n_embd // config.n_head
    inputs = (
        torch.zeros(B, T, dtype=torch.long),
        torch.ones(B, P + T, dtype=torch.long),
        torch.arange(P, P + T).repeat(B, 1),
        *[torch.zeros(B, H, P, d) for _ in range(2 * config.n_layer)],
    )
    input_names, output_names = names(config.n_layer)
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total_sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    axes.update({name: {0: "batch", 2: "past_sequence"} for name in input_names[3:]})
    axes.update({name: {0: "batch", 2: "total_sequence"} for name in output_names[1:]})
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter (torch.export's wants every dynamic size a dimension object, and
            # specialises a past of length 0 or 1): it is deprecated, and its tracer warns of sizes read
            # as numbers, which here are the model's own (channels, heads), never the inputs'
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                DecoderWithPast(model),
                inputs,
                str(path),
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
    finally:
        model.train(was_training)


def _quantize(path: Path) -> None:
    """The matrices' weights to int8 in blocks of 32 along the input, symmetric, one scale each
    (ONNX Runtime's MatMulNBits), computed at its accuracy level 4: the activations rounded to
    int8 per block, then integer products, its fast kernel (levels below it widen the weights at
    every call: 6 tokens/s on the 124M shape, 10x slower). On shakespeare_char its next character is float32
    gpt2's at 99.3% of positions; ONNX Runtime's dynamic quantization (quantize_dynamic, one
    scale per matrix) agreed at 98.4% (docs/export.md, benchmarks/RESULTS.md)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(path)), bits=8, block_size=INT8_BLOCK, is_symmetric=True, accuracy_level=4
    )
    chatter = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")  # a line per node at INFO
    level = chatter.level
    chatter.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        chatter.setLevel(level)
    quantizer.model.save_model_to_file(str(path), use_external_data_format=False)


def _packages(quantize: str | None) -> None:
    """Raise MissingPackageError where the exporter's packages are not installed."""
    for name in ["onnx"] + (["onnxruntime"] if quantize else []):
        require_package(name, "export", "ONNX export needs", "format")

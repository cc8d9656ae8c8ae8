"""GPT-2 in plain NumPy: the reference engine.

One function per piece of the math, to read beside the seeds (seed 003 builds GPT-2 the same
way). It shares no code with the torch model, so each checks the other, and it runs where
torch is not installed. It computes one sequence at a time and keeps no cache: slow, simple.

Shapes: T the sequence length, C = n_embd, V = n_vocab, H = n_head. Weights are the
canonical tensors of `gpt2.checkpoints.weights` (linear weights stored (in, out): y = x @ w + b).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpt2.checkpoints.config import GPT2Config
from gpt2.checkpoints.weights import read_tensors, sinusoidal_positions
from gpt2.errors import InvalidArgumentError

Params = dict[str, Any]
Tap = Callable[[str, np.ndarray], np.ndarray]


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, the tanh approximation GPT-2 uses."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """GELU as defined: x * Phi(x), with Phi the standard normal CDF."""
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax; subtracting the row max first keeps exp from overflowing."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalise each row to mean 0 and variance 1, then scale by g and shift by b. (T, C) -> (T, C)."""
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(T, in) @ (in, out) + (out,) -> (T, out)."""
    return x @ w + b


def untapped(name: str, x: np.ndarray) -> np.ndarray:
    """The tap of an ordinary forward pass: each step's value goes on unchanged."""
    return x


def ffn(
    x: np.ndarray, c_fc: Params, c_proj: Params, activation=gelu, tap: Tap = untapped, name: str = "mlp"
) -> np.ndarray:
    """Position-wise feed-forward: (T, C) -> (T, 4C) -> activation -> (T, C)."""
    h = tap(f"{name}.c_fc", linear(x, **c_fc))  # (T, 4C)
    return tap(f"{name}.c_proj", linear(tap(f"{name}.gelu", activation(h)), **c_proj))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, tap: Tap = untapped, name: str = "attn") -> np.ndarray:
    """Causal scaled dot-product attention, every head at once: (H, T, d) x3 -> (H, T, d)."""
    T, d = q.shape[-2:]
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(d)  # (H, T, T): how much position i attends to position j
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # j > i: not visible from i
    scores = tap(f"{name}.scores", np.where(future, -np.inf, scores))
    return tap(f"{name}.z", tap(f"{name}.pattern", softmax(scores)) @ v)


def mha(
    x: np.ndarray, c_attn: Params, c_proj: Params, n_head: int, tap: Tap = untapped, name: str = "attn"
) -> np.ndarray:
    """Multi-head causal self-attention: (T, C) -> (T, C)."""
    qkv = tap(f"{name}.c_attn", linear(x, **c_attn))  # (T, 3C)
    # (T, C) -> (H, T, C/H): each head attends over its own slice of the channels
    q, k, v = (
        tap(f"{name}.{part}", np.stack(np.split(z, n_head, axis=-1)))
        for part, z in zip("qkv", np.split(qkv, 3, axis=-1))
    )
    heads = attention(q, k, v, tap, name)  # (H, T, C/H)
    return tap(f"{name}.c_proj", linear(np.concatenate(heads, axis=-1), **c_proj))  # (T, C)


def transformer_block(
    x: np.ndarray,
    ln_1: Params,
    attn: Params,
    ln_2: Params,
    mlp: Params,
    n_head: int,
    activation=gelu,
    eps: float = 1e-5,
    tap: Tap = untapped,
    name: str = "h.0",
) -> np.ndarray:
    """Pre-LayerNorm block with residual connections: (T, C) -> (T, C)."""
    x = x + mha(
        tap(f"{name}.ln_1", layer_norm(x, **ln_1, eps=eps)), **attn, n_head=n_head, tap=tap, name=f"{name}.attn"
    )
    x = x + ffn(
        tap(f"{name}.ln_2", layer_norm(x, **ln_2, eps=eps)), **mlp, activation=activation, tap=tap, name=f"{name}.mlp"
    )
    return tap(name, x)


def gpt2(
    inputs: Sequence[int],
    wte: np.ndarray,
    wpe: np.ndarray,
    blocks: list[Params],
    ln_f: Params,
    n_head: int,
    activation=gelu,
    eps: float = 1e-5,
    tap: Tap = untapped,
) -> np.ndarray:
    """Logits (T, V) for a sequence of T token ids. `tap(name, value)` sees each step's value
    (named as `gpt2.inspect` names them) and returns the value the pass goes on with."""
    inputs = np.asarray(inputs)
    x = tap("wte", wte[inputs]) + tap("wpe", wpe[np.arange(len(inputs))])  # (T, C)
    for i, block in enumerate(blocks):
        x = transformer_block(x, **block, n_head=n_head, activation=activation, eps=eps, tap=tap, name=f"h.{i}")
    x = tap("ln_f", layer_norm(x, **ln_f, eps=eps))
    return x @ wte.T  # (T, V): the unembedding is wte itself


# ---------------------------------------------------------------------- weights


def params_from_tensors(config: GPT2Config, tensors: dict[str, np.ndarray]) -> Params:
    """Nest canonical tensors as `gpt2()` takes them; missing biases (bias=False) become zeros."""

    def get(name: str, width: int) -> np.ndarray:
        if name in tensors:
            return np.asarray(tensors[name], dtype=np.float32)
        return np.zeros(width, dtype=np.float32)  # a bias the config leaves out

    C = config.n_embd

    def norm(prefix: str) -> Params:
        return {"g": get(f"{prefix}.weight", C), "b": get(f"{prefix}.bias", C)}

    def lin(prefix: str, width: int) -> Params:
        return {"w": get(f"{prefix}.weight", 0), "b": get(f"{prefix}.bias", width)}

    blocks = []
    for i in range(config.n_layer):
        p = f"transformer.h.{i}"
        blocks.append(
            {
                "ln_1": norm(f"{p}.ln_1"),
                "attn": {"c_attn": lin(f"{p}.attn.c_attn", 3 * C), "c_proj": lin(f"{p}.attn.c_proj", C)},
                "ln_2": norm(f"{p}.ln_2"),
                "mlp": {"c_fc": lin(f"{p}.mlp.c_fc", 4 * C), "c_proj": lin(f"{p}.mlp.c_proj", C)},
            }
        )
    wpe = (
        get("transformer.wpe.weight", 0)
        if config.positions == "learned"
        else sinusoidal_positions(config.n_ctx, config.n_embd)
    )
    return {"wte": get("transformer.wte.weight", 0), "wpe": wpe, "blocks": blocks, "ln_f": norm("transformer.ln_f")}


class ReferenceModel:
    """The NumPy engine with its weights and settings bound: `ReferenceModel.load(path)(ids)`."""

    def __init__(self, config: GPT2Config, tensors: dict[str, np.ndarray]):
        self.config = config
        self.params = params_from_tensors(config, tensors)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike) -> ReferenceModel:
        """Read a checkpoint (any format `gpt2.checkpoints.weights` reads) without torch."""
        return cls(*read_tensors(name_or_path))

    def __call__(self, inputs: Sequence[int], tap: Tap = untapped) -> np.ndarray:
        """Logits (T, V) of one sequence of token ids; `tap`, as `gpt2()` takes it."""
        inputs = np.asarray(inputs)
        if inputs.ndim != 1 or inputs.size == 0 or inputs.dtype.kind not in "iu":
            raise InvalidArgumentError(
                "inputs must be a non-empty sequence of integer token ids, "
                f"got shape {list(inputs.shape)} of {inputs.dtype}"
            )
        self.config.check_sequence(len(inputs), int(inputs.min()), int(inputs.max()))
        activation = gelu if self.config.activation == "gelu_tanh" else gelu_exact
        with np.errstate(invalid="ignore", over="ignore"):  # NaN or inf out is for the caller to report
            return gpt2(
                inputs,
                **self.params,
                n_head=self.config.n_head,
                activation=activation,
                eps=self.config.layer_norm_epsilon,
                tap=tap,
            )

    def trace(self, inputs: Sequence[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits (T, V) and every step's value on the way, by name (as `gpt2.inspect.trace`)."""
        activations: dict[str, np.ndarray] = {}

        def record(name: str, x: np.ndarray) -> np.ndarray:
            activations[name] = x
            return x

        return self(inputs, tap=record), activations

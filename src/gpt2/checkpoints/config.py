"""GPT2Config: the hyperparameters of a GPT-2 model, the four sizes OpenAI released, and the fixed
position table that `positions="sinusoidal"` stands for (which the files written for other programs hold).

Torch-free, so the NumPy reference engine and the weight readers can use it too (a training
run's settings are in `settings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpt2._checks import boolean, check_token_ids, positive_int
from gpt2.errors import ConfigError, ContextLengthError, UnknownModelError

# name -> (n_layer, n_head, n_embd); all have n_ctx 1024 and n_vocab 50257.
PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 12, 768),  # 124M
    "gpt2-medium": (24, 16, 1024),  # 355M
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),  # 1558M
}

POSITIONS = ("learned", "sinusoidal")
ACTIVATIONS = ("gelu_tanh", "gelu")
# Hugging Face's names for our activations (several spell the tanh approximation).
_HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu": "gelu"}


@dataclass
class GPT2Config:
    """Hyperparameters; the defaults are GPT-2 124M's.

    positions: "learned" (GPT-2's wpe table) or "sinusoidal" (fixed sin/cos, as in the seeds).
    activation: "gelu_tanh" (GPT-2's tanh approximation) or "gelu" (exact, erf-based).
    bias: whether the linear layers and LayerNorms have bias terms (GPT-2: True).
    """

    n_vocab: int = 50257
    n_ctx: int = 1024
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    dropout: float = 0.1
    layer_norm_epsilon: float = 1e-5
    positions: str = "learned"
    activation: str = "gelu_tanh"
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"):
            setattr(self, name, positive_int(name, getattr(self, name), ConfigError))  # a NumPy int becomes an int
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                "each head gets n_embd / n_head dimensions",
                "n_head",
                ("n_embd",),
            )
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.layer_norm_epsilon, (int, float)) or not self.layer_norm_epsilon > 0:
            raise ConfigError(f"layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}")
        if self.positions not in POSITIONS:
            raise ConfigError(f"positions must be one of {', '.join(POSITIONS)}; got {self.positions!r}")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {', '.join(ACTIVATIONS)}; got {self.activation!r}")
        boolean("bias", self.bias, ConfigError)

    def check_length(self, length: int) -> None:
        """Raise unless a sequence of `length` tokens fits this model's context."""
        if length > self.n_ctx:
            raise ContextLengthError(
                f"sequence of {length} tokens is longer than the model's context of n_ctx={self.n_ctx} tokens"
            )

    def check_sequence(self, length: int, low: int, high: int) -> None:
        """Raise unless a sequence of `length` token ids, ranging over low..high, fits this model."""
        self.check_length(length)
        check_token_ids(low, high, self.n_vocab, whose="this model's ")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> GPT2Config:
        """The configuration of a released size: gpt2, gpt2-medium, gpt2-large or gpt2-xl."""
        if name not in PRESETS:
            raise UnknownModelError(f"unknown model {name!r}: the released sizes are {', '.join(PRESETS)}")
        n_layer, n_head, n_embd = PRESETS[name]
        return cls(**{"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, **overrides})

    def replace(self, **changes: Any) -> GPT2Config:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------- Hugging Face's config.json

    def to_hf_dict(self, eot_token: int | None = None) -> dict[str, Any]:
        """A `config.json` that `transformers.GPT2LMHeadModel` loads.

        `eot_token` is the id of the tokenizer's <|endoftext|> (50256 for GPT-2's), which transformers
        takes as the bos and eos ids (generation stops at eos); None where the vocabulary has none (a
        character vocabulary) or is unknown: a config does not know its tokenizer.
        Settings Hugging Face's GPT-2 cannot express (sinusoidal positions, no bias) are kept
        under `gpt2_*` keys, which it ignores and `from_hf_dict` reads back.
        """
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": self.n_vocab,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "n_layer": self.n_layer,
            "n_inner": None,
            "activation_function": "gelu_new" if self.activation == "gelu_tanh" else "gelu",
            "resid_pdrop": self.dropout,
            "embd_pdrop": self.dropout,
            "attn_pdrop": self.dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "initializer_range": 0.02,
            "bos_token_id": eot_token,
            "eos_token_id": eot_token,
            "tie_word_embeddings": True,
            "scale_attn_weights": True,
            "gpt2_positions": self.positions,
            "gpt2_bias": self.bias,
        }

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> GPT2Config:
        """Read Hugging Face's GPT-2 `config.json` (as a dict); `source` names it in errors."""
        if hf.get("model_type", "gpt2") != "gpt2":
            raise ConfigError(f"{source}: model_type is {hf['model_type']!r}, not 'gpt2'")
        activation = hf.get("activation_function", "gelu_new")
        if activation not in _HF_ACTIVATIONS:
            raise ConfigError(
                f"{source}: activation_function {activation!r} is not supported "
                f"(use one of {', '.join(_HF_ACTIVATIONS)})"
            )
        n_embd = hf.get("n_embd", 768)
        if hf.get("n_inner") not in (None, 4 * n_embd):
            raise ConfigError(f"{source}: n_inner is {hf['n_inner']}, but GPT-2's MLP is 4 * n_embd = {4 * n_embd}")
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
            raise ConfigError(f"{source}: only GPT-2's 1/sqrt(head size) attention scaling is supported")
        # our field: (the key that holds it in this file, its value); an error names the file's key
        fields = {
            "n_vocab": ("vocab_size", hf.get("vocab_size", 50257)),
            "n_ctx": ("n_positions", hf["n_positions"]) if "n_positions" in hf else ("n_ctx", hf.get("n_ctx", 1024)),
            "n_embd": ("n_embd", n_embd),
            "n_head": ("n_head", hf.get("n_head", 12)),
            "n_layer": ("n_layer", hf.get("n_layer", 12)),
            "dropout": ("resid_pdrop", hf.get("resid_pdrop", 0.1)),
            "layer_norm_epsilon": ("layer_norm_epsilon", hf.get("layer_norm_epsilon", 1e-5)),
            "positions": ("gpt2_positions", hf.get("gpt2_positions", "learned")),
            "bias": ("gpt2_bias", hf.get("gpt2_bias", True)),
        }
        try:
            config = cls(activation=_HF_ACTIVATIONS[activation], **{name: value for name, (_, value) in fields.items()})
        except ConfigError as e:
            message = str(e)
            for name, (key, _) in fields.items():  # GPT2Config's checks begin "n_ctx must ...": name the file's key
                if message.startswith(f"{name} must"):
                    message = key + message[len(name) :]
            raise ConfigError(f"{source}: {message}") from None
        return config

    @classmethod
    def from_openai_hparams(cls, hparams: dict[str, Any], source: str = "hparams.json") -> GPT2Config:
        """Read `hparams.json` of OpenAI's TensorFlow release."""
        missing = [k for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer") if k not in hparams]
        if missing:
            raise ConfigError(f"{source} lacks {', '.join(missing)}")
        try:
            return cls(**{k: hparams[k] for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")})
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None


def sinusoidal_positions(n_ctx: int, n_embd: int) -> np.ndarray:
    """(n_ctx, C): PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C)), wavelengths from
    2 pi to 10000 * 2 pi: the table a model of sinusoidal positions adds (its fixed positions), and which its
    files hold as wpe for transformers and llama.cpp. Computed in float64, returned as float32."""
    angle = np.arange(n_ctx)[:, None] / 10000.0 ** (np.arange(0, n_embd, 2) / n_embd)  # (n_ctx, ceil(C / 2))
    table = np.zeros((n_ctx, n_embd))
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : n_embd // 2])
    return table.astype(np.float32)

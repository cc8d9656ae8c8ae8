"""Dictionaries trained here: an SAE (a site's vectors as sparse features of themselves) or a
transcoder (a block's MLP input as sparse features of its output), with SAELens's losses, saved in
SAELens's format and, for transcoders, circuit-tracer's.

    d = Dictionary(DictionaryConfig("topk", d_in=768, d_dict=6144, k=32))
    losses = d.losses(x, x, dead)     # {"mse_loss", "auxiliary_reconstruction_loss"}: an SAE's
    losses = d.losses(x, y, dead)     # a transcoder's: x the MLP's input, y its output

The architectures and losses are SAELens's (sae_lens/saes/standard_sae.py, jumprelu_sae.py,
topk_sae.py, training/sae_trainer.py):

    pre = (x - b_dec if apply_b_dec_to_input) @ W_enc + b_enc
    f = relu(pre)                                  standard
    f = pre * (pre > threshold)                    jumprelu (threshold >= 0, learnt)
    f = relu(pre), all but its k largest zeroed    topk
    out = f @ W_dec + b_dec (+ x @ W_skip.T)       W_skip: a skip transcoder's
    mse_loss = sum over the output's channels of (out - y)^2, mean over the batch
    standard: l1_loss = l1_coefficient * mean(sum_i f_i |W_dec[i]|)
    jumprelu: l0_loss = l0_coefficient * mean(sum_i H(pre_i - threshold_i)), H the step whose
        gradient to the threshold is the straight-through estimate -(1/bandwidth) rect((pre -
        threshold) / bandwidth); f's gradient to the threshold: -(threshold/bandwidth) rect(...)
    topk: auxiliary_reconstruction_loss = aux_loss_coefficient * scale * mean |e_hat - e|^2: the
        dead features' k_aux = d_out / 2 largest pre-activations (no relu) decoding (no b_dec) the residual
        e = y - out, scale = min(n_dead / k_aux, 1); a feature is dead after dead_feature_window
        steps without firing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpt2._checks import positive_int, positive_real
from gpt2._files import atomic_directory
from gpt2.errors import InvalidArgumentError

ARCHITECTURES = ("standard", "jumprelu", "topk")
SAELENS_VERSION = "6.54.12"  # the SAELens whose format the saves follow (its cfg.json's metadata)


@dataclass
class DictionaryConfig:
    """What a dictionary is: its architecture, sizes, and the coefficients of its losses (SAELens's
    names and defaults but l1_coefficient's, SAELens's 1.0 being far too weak for GPT-2's scales)."""

    architecture: str = "standard"
    d_in: int = 768
    d_dict: int = 6144
    d_out: int | None = None  # a transcoder's output width (None: an SAE, d_out = d_in)
    k: int = 32  # topk: features kept a position
    l1_coefficient: float = 5.0  # standard
    l0_coefficient: float = 1.0  # jumprelu
    jumprelu_init_threshold: float = 0.01
    jumprelu_bandwidth: float = 0.05
    aux_loss_coefficient: float = 1.0  # topk
    apply_b_dec_to_input: bool = True  # SAEs, as SAELens's default; transcoders never
    skip: bool = False  # a skip transcoder: out += x @ W_skip.T
    decoder_init_norm: float | None = 0.1

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise InvalidArgumentError(
                f"architecture must be one of {', '.join(ARCHITECTURES)}, got {self.architecture!r}", "architecture"
            )
        for name in ("d_in", "d_dict", "k"):
            positive_int(name, getattr(self, name))
        if self.d_out is not None:
            positive_int("d_out", self.d_out)
            self.apply_b_dec_to_input = False  # SAELens refuses it for transcoders
        if self.architecture == "topk" and self.k > self.d_dict:
            raise InvalidArgumentError(f"k={self.k} is more than the dictionary's {self.d_dict} features", "k")
        for name in ("l1_coefficient", "l0_coefficient", "aux_loss_coefficient"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be 0 or more, got {getattr(self, name)}", name)
        positive_real("jumprelu_bandwidth", self.jumprelu_bandwidth)

    @property
    def transcoder(self) -> bool:
        return self.d_out is not None

    @property
    def width_out(self) -> int:
        return self.d_in if self.d_out is None else self.d_out


class Dictionary(nn.Module):
    """An SAE or a transcoder being trained (the module's docstring)."""

    def __init__(self, config: DictionaryConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = c = config
        if c.skip and not c.transcoder:
            raise InvalidArgumentError("skip: only a transcoder has a skip connection (give d_out)", "skip")
        W_dec = torch.empty(c.d_dict, c.width_out)
        bound = (6 / c.width_out) ** 0.5  # kaiming_uniform_'s bound for a (d_dict, d_out) matrix, SAELens's
        W_dec.uniform_(-bound, bound, generator=generator)
        if c.decoder_init_norm is not None:
            W_dec *= c.decoder_init_norm / W_dec.norm(dim=1, keepdim=True)
        if c.d_in == c.width_out:  # SAELens's: the encoder starts as the decoder's transpose
            W_enc = W_dec.T.clone()
        else:
            W_enc = torch.empty(c.d_in, c.d_dict).uniform_(-bound, bound, generator=generator)
        self.W_enc = nn.Parameter(W_enc.contiguous())  # (d_in, d_dict)
        self.b_enc = nn.Parameter(torch.zeros(c.d_dict))
        self.W_dec = nn.Parameter(W_dec)  # (d_dict, d_out)
        self.b_dec = nn.Parameter(torch.zeros(c.width_out))
        if c.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.full((c.d_dict,), c.jumprelu_init_threshold))
        if c.skip:
            self.W_skip = nn.Parameter(torch.zeros(c.width_out, c.d_in))  # (d_out, d_in)

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """(N, d_in) -> (N, d_dict)."""
        if self.config.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The features of pre-activations (N, d_dict)."""
        c = self.config
        if c.architecture == "standard":
            return torch.relu(pre)
        if c.architecture == "jumprelu":
            return _JumpReLU.apply(pre, self.threshold, c.jumprelu_bandwidth)
        values, indices = torch.topk(pre, c.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.pre_activations(x))

    def decode(self, f: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """(N, d_dict) features -> (N, d_out); a skip transcoder adds x @ W_skip.T."""
        out = f @ self.W_dec + self.b_dec
        return out + x @ self.W_skip.T if self.config.skip else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x), x)

    def losses(self, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """SAELens's losses on a batch: x (N, d_in) the input, y (N, d_out) the target (x for an
        SAE), dead (d_dict,) the features dead so far (topk's auxiliary loss); "loss" their sum,
        "fired" (d_dict,) whether each feature fired on the batch (no gradient).

        A topk dictionary decodes its k features a position by gathering their decoder rows
        (embedding_bag): k x d_out multiply-adds a position where a dense f @ W_dec takes d_dict x d_out."""
        c = self.config
        pre = self.pre_activations(x)
        if c.architecture == "topk":
            values, indices = torch.topk(pre, c.k, dim=-1, sorted=False)
            values = values.relu()
            out = F.embedding_bag(indices, self.W_dec, per_sample_weights=values, mode="sum") + self.b_dec
            out = out + x @ self.W_skip.T if c.skip else out
            fired = torch.zeros(c.d_dict, dtype=torch.bool, device=x.device)
            fired[indices[values.detach() > 0]] = True
        else:
            f = self.activate(pre)
            out = self.decode(f, x)
            fired = (f.detach() != 0).any(0)
        losses = {"mse_loss": (out - y).pow(2).sum(-1).mean()}
        if c.architecture == "standard":
            losses["l1_loss"] = c.l1_coefficient * (f * self.W_dec.norm(dim=1)).sum(-1).mean()
        elif c.architecture == "jumprelu":
            losses["l0_loss"] = c.l0_coefficient * _Step.apply(pre, self.threshold, c.jumprelu_bandwidth).sum(-1).mean()
        else:
            losses["auxiliary_reconstruction_loss"] = self._aux_loss(pre, y - out, dead)
        losses["loss"] = sum(losses.values())
        losses["fired"] = fired
        return losses

    def _aux_loss(self, pre: torch.Tensor, residual: torch.Tensor, dead: torch.Tensor | None) -> torch.Tensor:
        """topk's: the dead features' largest pre-activations decode the residual (SAELens's, after EleutherAI's)."""
        n_dead = 0 if dead is None else int(dead.sum())
        if n_dead == 0:
            return pre.new_tensor(0.0)
        k_aux = residual.size(-1) // 2
        scale = min(n_dead / k_aux, 1.0)
        k_aux = min(k_aux, n_dead)
        masked = torch.where(dead[None], pre, torch.full_like(pre, -torch.inf))
        values, indices = masked.topk(k_aux, dim=-1, sorted=False)  # no relu: SAELens's
        recons = F.embedding_bag(indices, self.W_dec, per_sample_weights=values, mode="sum")
        return self.config.aux_loss_coefficient * scale * (recons - residual.detach()).pow(2).sum(-1).mean()

    @torch.no_grad()
    def project(self) -> None:
        """After each optimizer step: a JumpReLU's thresholds kept at 0 or more (SAELens's projection)."""
        if self.config.architecture == "jumprelu":
            self.threshold.clamp_(min=0.0)


class _JumpReLU(torch.autograd.Function):
    """pre * (pre > threshold); to the threshold, the straight-through estimate (SAELens's)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        h = ctx.bandwidth
        ste = (threshold / h) * ((pre - threshold).abs() < h / 2) * grad
        return (pre > threshold) * grad, -ste.sum(0), None


class _Step(torch.autograd.Function):
    """H(pre - threshold), the number of features firing; to the threshold, the straight-through estimate."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        h = ctx.bandwidth
        ste = (1.0 / h) * ((pre - threshold).abs() < h / 2) * grad
        return None, -ste.sum(0), None


# ------------------------------------------------------------------ saving


def saelens_tensors(d: Dictionary) -> dict[str, torch.Tensor]:
    """sae_weights.safetensors's tensors, SAELens's orientation."""
    tensors = {
        name: getattr(d, name).detach().float().cpu().contiguous() for name in ("W_enc", "b_enc", "W_dec", "b_dec")
    }
    if d.config.architecture == "jumprelu":
        tensors["threshold"] = d.threshold.detach().float().cpu().contiguous()
    if d.config.skip:
        tensors["W_skip"] = d.W_skip.detach().float().cpu().contiguous()
    return tensors


def saelens_cfg(d: Dictionary, hook_name: str, hook_name_out: str | None, metadata: dict[str, Any]) -> dict:
    """cfg.json as SAELens 6 writes it for the dictionary's architecture."""
    c = d.config
    architecture = c.architecture
    if c.transcoder:
        architecture = {"standard": "transcoder", "jumprelu": "jumprelu_transcoder"}[c.architecture]
        architecture = architecture.replace("transcoder", "skip_transcoder") if c.skip else architecture
    cfg = {
        "d_in": c.d_in,
        "d_sae": c.d_dict,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": c.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"sae_lens_version": SAELENS_VERSION, "sae_lens_training_version": SAELENS_VERSION}
        | {"hook_name": hook_name}
        | ({"hook_name_out": hook_name_out} if hook_name_out else {})
        | metadata,
    }
    if c.transcoder:
        cfg["d_out"] = c.width_out
    if c.architecture == "topk":
        cfg |= {"k": c.k, "rescale_acts_by_decoder_norm": False}
    cfg["architecture"] = architecture
    return cfg


def save_saelens(
    d: Dictionary,
    directory: str | Path,
    hook_name: str,
    hook_name_out: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write `directory` as SAELens's `save_model` does (cfg.json + sae_weights.safetensors), atomically."""
    from safetensors.torch import save_file

    with atomic_directory(directory) as scratch:
        save_file(saelens_tensors(d), str(scratch / "sae_weights.safetensors"))
        cfg = saelens_cfg(d, hook_name, hook_name_out, metadata or {})
        (scratch / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")
    return Path(directory)


def save_circuit_tracer(dictionaries: list[Dictionary], directory: str | Path, scan: str) -> Path:
    """Write a transcoder set in circuit-tracer's layout: config.yaml (transcoder_set, mlp.hook_in ->
    mlp.hook_out) and layer_{i}.safetensors (W_enc and W_dec (d_transcoder, d_model), b_enc, b_dec,
    activation_function.threshold for JumpReLU, W_skip), atomically."""
    import yaml
    from safetensors.torch import save_file

    for d in dictionaries:
        if not d.config.transcoder or d.config.architecture == "topk":
            raise InvalidArgumentError(
                "circuit-tracer reads transcoders of relu or JumpReLU features: a topk dictionary or an SAE cannot "
                "be saved in its layout",
                "dictionaries",
            )
    with atomic_directory(directory) as scratch:
        for i, d in enumerate(dictionaries):
            t = saelens_tensors(d)
            tensors = {
                "W_enc": t["W_enc"].T.contiguous(),
                "W_dec": t["W_dec"],
                "b_enc": t["b_enc"],
                "b_dec": t["b_dec"],
            }
            if "threshold" in t:
                tensors["activation_function.threshold"] = t["threshold"]
            if "W_skip" in t:
                tensors["W_skip"] = t["W_skip"]
            save_file(tensors, str(scratch / f"layer_{i}.safetensors"))
        config = {
            "model_kind": "transcoder_set",
            "feature_input_hook": "mlp.hook_in",
            "feature_output_hook": "mlp.hook_out",
            "scan": scan,
            "transcoders": [f"layer_{i}.safetensors" for i in range(len(dictionaries))],
        }
        (scratch / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return Path(directory)
